/* compile_api.c — mesh_compile: the compiler through the public API.
 *
 * Runs the front end, the compiler and the plan writer exactly as meshc
 * does, with the source and the plan in memory. libmesh carries the front
 * end and the compiler inside it, with every symbol but mesh_* made local
 * (Makefile, libmesh.a and libmesh.so), so embedding programs see only the
 * public API.
 */
#include <stdio.h>  /* open_memstream */
#include <stdlib.h> /* free */
#include <string.h> /* memcpy */

#include "compile.h"
#include "mesh.h"

#ifndef MESH_STD_DIR
#define MESH_STD_DIR "lang"
#endif

typedef struct sink {
    mesh_diag_fn fn;
    void *ud;
} sink;

static void forward(void *ud, diag_level level, const char *text) {
    const sink *s = ud;
    if (s->fn) s->fn(s->ud, level == DIAG_ERROR ? 0 : level == DIAG_WARNING ? 1 : 2, text);
}

mesh_status mesh_compile(const char *name, const char *source, size_t len, const mesh_compile_options *opt,
                         char **plan, size_t *plan_len) {
    if (plan) *plan = NULL;
    if (plan_len) *plan_len = 0;
    if (!name || (!source && len) || !plan || !plan_len) return MESH_ERR_INVALID_ARG;
    mesh_compile_options o = MESH_COMPILE_OPTIONS_INIT;
    if (opt) {
        if (opt->size < sizeof o) return MESH_ERR_INVALID_ARG; /* older layouts: none yet */
        o = *opt;
    }
    sink s = {o.diag, o.diag_ud};
    fe_options fo = {o.include_dirs, o.n_include, o.std_dir ? o.std_dir : MESH_STD_DIR, forward, &s};
    fe *f = fe_new(&fo);
    if (!f) return MESH_ERR_NOMEM;
    fe_status st = FE_OK;
    for (int i = 0; i < o.n_sets && st == FE_OK; i++) st = fe_add_set(f, o.sets[i]);
    if (st == FE_OK) st = fe_load_buffer(f, name, source ? source : "", len);
    if (st == FE_OK) st = fe_check(f);
    if (st == FE_OK && fe_graph(f)->loss < 0) {
        fe_error_at(f, LOC_NONE, "the source has no model to compile");
        st = FE_ERRORS;
    }
    compiled c;
    memset(&c, 0, sizeof c);
    char *text = NULL;
    size_t n = 0;
    if (st == FE_OK) st = compile_run(f, &c, 1);
    if (st == FE_OK) st = compile_cost(f, &c, NULL, 0);
    if (st == FE_OK) {
        FILE *mem = open_memstream(&text, &n);
        if (!mem) st = FE_NOMEM;
        else {
            st = compile_write_plan(f, &c, name, NULL, mem, NULL, 0);
            if (fclose(mem) != 0 && st == FE_OK) st = FE_NOMEM;
        }
    }
    compile_free(&c);
    fe_free(f);
    if (st != FE_OK) {
        free(text);
        return st == FE_NOMEM ? MESH_ERR_NOMEM : st == FE_USAGE ? MESH_ERR_INVALID_ARG : MESH_ERR_CHECK;
    }
    *plan = text;
    *plan_len = n;
    return MESH_OK;
}

void mesh_free(void *p) { free(p); }
