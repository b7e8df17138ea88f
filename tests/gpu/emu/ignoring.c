/* ignoring.c — a program embedding libmesh whose ranks' function ignores
 * a failed training step and returns MESH_OK, as careless embedders do.
 * tests/gpu/emu/meshrun.sh runs it on 2 emulated GPUs with a kernel that
 * faults (EMU_FAIL): mesh_run_ranks must still fail, naming the fault, and
 * the rank that waits for the failed one must stop at once, not at the
 * collectives' timeout.
 *
 *   ignoring PLAN STEPS
 *
 * Trains STEPS steps on the GPUs (mesh_set_device(MESH_DEVICE_CUDA)) on
 * made-up tokens, printing each failed step's error (and going on); then
 * prints mesh_run_ranks' status and message. Exits 1 if it failed. */
#include "mesh.h"

#include <stdio.h>  /* printf, fprintf */
#include <stdlib.h> /* malloc, free, atoi */

typedef struct job {
    const mesh_plan *plan;
    int steps;
} job;

static mesh_status each(mesh_context *ctx, int rank, void *ud)
{
    const job *j = ud;
    int mb = 0, m = 0, seq = 0, vocab = 0;
    mesh_plan_batch(j->plan, &mb, &m, &seq, &vocab);
    size_t n = (size_t)mb * (size_t)m * (size_t)seq;
    int *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    if (!in || !tg) {
        free(in);
        free(tg);
        return MESH_ERR_NOMEM;
    }
    for (size_t k = 0; k < n; k++) { /* the same on every rank */
        in[k] = (int)(k * 7 % (size_t)vocab);
        tg[k] = (int)((k * 7 + 1) % (size_t)vocab);
    }
    for (int s = 1; s <= j->steps; s++) {
        mesh_status st = mesh_train_step(ctx, in, tg, NULL);
        if (st != MESH_OK)
            fprintf(stderr, "ignoring: rank %d: step %d: %s: %s (ignored)\n", rank, s, mesh_status_str(st),
                    mesh_last_error());
    }
    free(in);
    free(tg);
    return MESH_OK; /* whatever happened */
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: ignoring PLAN STEPS\n");
        return 2;
    }
    mesh_plan *plan = NULL;
    mesh_status st = mesh_set_device(MESH_DEVICE_CUDA);
    if (st == MESH_OK) st = mesh_plan_load(argv[1], &plan);
    job j = {plan, atoi(argv[2])};
    if (st == MESH_OK) st = mesh_run_ranks(plan, each, &j);
    printf("ignoring: mesh_run_ranks: %s%s%s\n", mesh_status_str(st), st == MESH_OK ? "" : ": ",
           st == MESH_OK ? "" : mesh_last_error());
    mesh_plan_free(plan);
    return st == MESH_OK ? 0 : 1;
}
