/* fuzz_lang.c — libFuzzer harness for meshc: lexer, parser, imports,
 * checker, the printers, and for inputs that check, the compiler (placements,
 * backward, schedule, the static check of every rank, the cost summary).
 *
 * The input is a .mesh file. If it contains a NUL byte, the text after the
 * first NUL is taken as one `--set KEY=VALUE` argument, so overrides are
 * fuzzed too. Imports resolve against the source tree's standard library.
 * Diagnostics are rendered (that code is fuzzed) and dropped.
 *
 *   make fuzz          (FUZZ_SECONDS=600)     make fuzz-ci   (60 s)
 */
#include <stdint.h> /* uint8_t */
#include <stdio.h>  /* fopen */
#include <string.h> /* memchr */

#include "compile.h"
#include "frontend.h"

#ifndef MESH_STD_DIR
#define MESH_STD_DIR "lang"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void drop(void *ud, diag_level level, const char *text) {
    (void)ud;
    (void)level;
    (void)text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
    fe_options o = {NULL, 0, MESH_STD_DIR, drop, NULL};
    fe *f = fe_new(&o);
    if (!f) return 0;
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t len = nul ? (size_t)(nul - text) : size;
    if (nul) {
        char set[512];
        size_t n = size - len - 1;
        if (n >= sizeof set) n = sizeof set - 1;
        memcpy(set, nul + 1, n);
        set[n] = '\0';
        fe_add_set(f, set);
    }
    if (fe_load_buffer(f, "fuzz.mesh", text, len) == FE_OK) {
        if (devnull) fe_dump_ast(f, devnull);
        if (fe_check(f) == FE_OK && devnull) {
            fe_dump_params(f, devnull);
            fe_summary(f, devnull);
            graph_dump(fe_graph(f), devnull);
            if (fe_graph(f)->loss >= 0) {
                compiled c;
                if (compile_run(f, &c, 1) == FE_OK) {
                    shard_dump(&c.prog, devnull);
                    compile_cost(f, &c, devnull, 0);
                }
                compile_free(&c);
            }
        }
    }
    fe_free(f);
    return 0;
}
