/*
 * fixture.c: the checked front end the compiler's unit tests start from
 * (see fixture.h).
 */
#include <stdio.h>  /* fputs, stderr */
#include <string.h> /* strlen */

#include "fixture.h"
#include "unit.h" /* defines: ASSERT_* */

static void to_stderr(void *ud, diag_level level, const char *text) {
    (void)ud;
    (void)level;
    fputs(text, stderr);
}

fe *fixture_checked(const char *src, const char *path, const char *const *sets, int n_sets) {
    fe_options o = {NULL, 0, MESH_STD_DIR, to_stderr, NULL};
    fe *f = fe_new(&o);
    ASSERT_NOT_NULL(f);
    for (int i = 0; i < n_sets; i++) ASSERT_INT_EQ(fe_add_set(f, sets[i]), FE_OK);
    if (path) ASSERT_INT_EQ(fe_load_file(f, path), FE_OK);
    else ASSERT_INT_EQ(fe_load_buffer(f, "m.mesh", src, strlen(src)), FE_OK);
    ASSERT_INT_EQ(fe_check(f), FE_OK);
    return f;
}
