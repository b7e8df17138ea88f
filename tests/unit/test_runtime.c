/*
 * test_runtime.c: unit tests for libmesh's version, status and allocator
 * functions (runtime/version.c, status.c, alloc.c).
 */
#include "mesh.h" /* the API under test; included first to prove it stands alone */

#include <limits.h> /* defines: INT_MAX */
#include <stdio.h>  /* defines: snprintf */

#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

/* The linked library reports the version of the header it was built with. */
TEST_IMPL(version_matches_header)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", MESH_VERSION_MAJOR,
             MESH_VERSION_MINOR, MESH_VERSION_PATCH);
    ASSERT_STR_EQ(mesh_version(), want);
    ASSERT_INT_EQ(mesh_version_num(), MESH_VERSION_NUM);
    ASSERT_INT_EQ(MESH_VERSION_NUM, MESH_VERSION_MAJOR * 10000 +
                                        MESH_VERSION_MINOR * 100 +
                                        MESH_VERSION_PATCH);
}

/* Status values are ABI: pin them so a reordered list fails here. */
TEST_IMPL(status_codes_are_stable)
{
    ASSERT_INT_EQ(MESH_OK, 0);
    ASSERT_INT_EQ(MESH_ERR_INVALID_ARG, 1);
    ASSERT_INT_EQ(MESH_ERR_NOMEM, 2);
    ASSERT_INT_EQ(MESH_ERR_IO, 3);
    ASSERT_INT_EQ(MESH_ERR_PARSE, 4);
    ASSERT_INT_EQ(MESH_ERR_CHECK, 5);
    ASSERT_INT_EQ(MESH_ERR_UNSUPPORTED, 6);
    ASSERT_INT_EQ(MESH_ERR_INTERNAL, 7);
}

/* Every listed code has its own message, the one the list gives it. */
TEST_IMPL(status_str_names_each_code)
{
    static const struct {
        mesh_status code;
        const char *message;
    } list[] = {
#define ROW(name, message) {MESH_##name, message},
        MESH_STATUS_LIST(ROW)
#undef ROW
    };
    enum { N = sizeof list / sizeof list[0] };

    ASSERT_STR_EQ(mesh_status_str(MESH_OK), "ok");
    ASSERT_STR_EQ(mesh_status_str(MESH_ERR_NOMEM), "out of memory");
    for (int i = 0; i < N; i++) {
        ASSERT_STR_EQ(mesh_status_str(list[i].code), list[i].message);
        ASSERT_STR_NE(mesh_status_str(list[i].code), "unknown status");
        for (int j = 0; j < i; j++)
            ASSERT_STR_NE(mesh_status_str(list[i].code),
                          mesh_status_str(list[j].code));
    }
}

/* Values outside the list get "unknown status", not NULL or a crash. */
TEST_IMPL(status_str_unknown_code)
{
    ASSERT_STR_EQ(mesh_status_str((mesh_status)-1), "unknown status");
    ASSERT_STR_EQ(mesh_status_str((mesh_status)(MESH_ERR_INTERNAL + 1)),
                  "unknown status");
    ASSERT_STR_EQ(mesh_status_str((mesh_status)INT_MAX), "unknown status");
}

/* The default allocator allocates, grows with contents kept, and frees. */
TEST_IMPL(alloc_default_roundtrip)
{
    mesh_alloc_fn alloc = mesh_alloc_default;
    unsigned char *p = alloc(NULL, NULL, 0, 16);

    ASSERT_NOT_NULL(p);
    for (int i = 0; i < 16; i++)
        p[i] = (unsigned char)(i * 7 + 1);
    p = alloc(NULL, p, 16, (size_t)1 << 20);
    ASSERT_NOT_NULL(p);
    for (int i = 0; i < 16; i++)
        ASSERT_INT_EQ(p[i], i * 7 + 1);
    p[((size_t)1 << 20) - 1] = 0xab; /* the whole new size is usable */
    p = alloc(NULL, p, (size_t)1 << 20, 4);
    ASSERT_NOT_NULL(p);
    ASSERT_INT_EQ(p[3], 3 * 7 + 1);
    ASSERT_NULL(alloc(NULL, p, 4, 0));       /* frees: LSan checks it */
    ASSERT_NULL(alloc(NULL, NULL, 0, 0));    /* freeing NULL is a no-op */
}
