/* compile.h — the compiler as a library: from a checked front end to the
 * placements and programs, the pipeline schedule, the static check of
 * every rank and the cost summary. meshc is a thin program over this, and
 * so is the fuzz harness. */
#ifndef MESH_COMPILE_H
#define MESH_COMPILE_H

#include <stdio.h> /* FILE */

#include "frontend.h"
#include "ranks.h"
#include "sched.h"
#include "shard.h"

enum { COMPILE_MAX_MICRO_BATCHES = 1 << 16, COMPILE_MAX_CHUNKS = 1 << 12 };

/* What a compile derives after the checks. */
typedef struct compiled {
    fe_setup setup;
    shard_prog prog;
    sched sc;
    rank_progs ranks;
    int have_prog, have_sched, have_ranks;
    long long ops, colls, p2p;
    char skipped[512];       /* why the static check did not run, or "" */
} compiled;

/* After fe_check == FE_OK on a file with a model: placements, programs,
 * the schedule and (run_check) every rank's program with the static check.
 * Problems are diagnostics through f. Free with compile_free either way. */
fe_status compile_run(fe *f, compiled *c, int run_check);
/* The cost summary, printed to `print` (NULL: not printed), and the memory
 * limit (0: train.memory_limit if set). */
fe_status compile_cost(fe *f, compiled *c, FILE *print, long long limit);
void compile_print_check(const compiled *c, FILE *out);
/* Writes the plan (compiler/plan.h) to `to`, or else to `path`, or else
 * next to the source (FILE.mesh -> FILE.plan), through a temporary file
 * renamed into place. `written` gets "PATH (N bytes)". */
fe_status compile_write_plan(fe *f, const compiled *c, const char *source, const char *path, FILE *to,
                             char *written, size_t written_len);
/* --dump=memory: every buffer's place, laid out from the plan. */
fe_status compile_dump_memory(fe *f, const compiled *c, FILE *out);
void compile_free(compiled *c);

#endif
