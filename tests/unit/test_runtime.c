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
    ASSERT_STR_EQ(mesh_status_str((mesh_status)(MESH_ERR_RANK + 1)),
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

/* ---- mesh_compile: the compiler through the public API ---- */

static char diag_text[2048];
static int diag_errors;

static void collect(void *ud, int level, const char *text)
{
    (void)ud;
    if (level == 0) diag_errors++;
    size_t used = strlen(diag_text);
    snprintf(diag_text + used, sizeof diag_text - used, "%s", text);
}

static const char tiny_model[] =
    "model m {\n"
    "  input tokens : int[batch, seq]\n"
    "  param wte : [256, 64]\n"
    "  loss = cross_entropy(embed(tokens, wte) @ transpose(wte), tokens)\n"
    "}\n"
    "mesh { tp = 2 }\n"
    "train { global_batch = 4  seq_len = 16  steps = 1  optimizer = adamw(lr: 1e-3) }\n";

/* Source text in, plan text out, with --set style overrides. */
TEST_IMPL(compile_api_source_to_plan)
{
    const char *sets[] = {"mesh.dp=2"};
    mesh_compile_options o = MESH_COMPILE_OPTIONS_INIT;
    o.sets = sets;
    o.n_sets = 1;
    char *plan = NULL;
    size_t n = 0;
    ASSERT_INT_EQ(mesh_compile("m.mesh", tiny_model, strlen(tiny_model), &o, &plan, &n), MESH_OK);
    ASSERT_NOT_NULL(plan);
    ASSERT_UINT_EQ(strlen(plan), n);
    ASSERT_NOT_NULL(strstr(plan, "magic: mesh-plan"));
    ASSERT_NOT_NULL(strstr(plan, "  dp: 2\n  tp: 2\n"));
    ASSERT_NOT_NULL(strstr(plan, "end: mesh-plan"));
    mesh_free(plan);
    mesh_free(NULL);
}

/* Errors go to the callback as meshc prints them; no plan comes back. */
TEST_IMPL(compile_api_reports_diagnostics)
{
    mesh_compile_options o = MESH_COMPILE_OPTIONS_INIT;
    o.diag = collect;
    diag_text[0] = '\0';
    diag_errors = 0;
    const char bad[] = "model m {\n  loss = nosuch\n}\n";
    char *plan = (char *)1;
    size_t n = 7;
    ASSERT_INT_EQ(mesh_compile("bad.mesh", bad, strlen(bad), &o, &plan, &n), MESH_ERR_CHECK);
    ASSERT_NULL(plan);
    ASSERT_UINT_EQ(n, 0);
    ASSERT_INT_GE(diag_errors, 1);
    ASSERT_NOT_NULL(strstr(diag_text, "bad.mesh:2:10: error: unknown name 'nosuch'"));
    ASSERT_INT_EQ(mesh_compile(NULL, bad, 1, &o, &plan, &n), MESH_ERR_INVALID_ARG);
    ASSERT_INT_EQ(mesh_compile("x", bad, 1, &o, NULL, &n), MESH_ERR_INVALID_ARG);
    o.size = 4; /* a layout this libmesh does not know */
    ASSERT_INT_EQ(mesh_compile("x", bad, 1, &o, &plan, &n), MESH_ERR_INVALID_ARG);
}
