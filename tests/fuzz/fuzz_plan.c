/* fuzz_plan.c — libFuzzer harness for meshrun's side of a plan: the plan
 * reader (compiler/plan_read.c, with its checks of each tensor against its
 * op) and, for a plan it accepts, the runtime on the CPU: every rank's
 * context (the memory plan laid out and checked against the plan's), one
 * training step on token ids 0, 1, 2, ... and a forward pass.
 *
 * The input is plan text (a file meshc writes, mutated). Whatever the
 * bytes, nothing may crash, read or write out of bounds (ASan, UBSan) or
 * hang: a plan is refused with a message, or it trains. Plans too big to
 * step in a few milliseconds (more than 64 MiB a rank, 8192 tokens a step
 * or 8 ranks) are only read.
 *
 *   make fuzz-plan      (FUZZ_SECONDS=600; seeds: examples compiled by meshc)
 */
#include <stdint.h> /* uint8_t */
#include <stdlib.h> /* malloc, setenv */

#include "api_impl.h" /* struct mesh_plan: the plan's memory, for the bound above */
#include "mesh.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_TOKENS = 8192, MAX_RANKS = 8 };
#define MAX_BYTES (64ll << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mesh_set_threads(1);
    mesh_set_device(MESH_DEVICE_CPU);
    setenv("MESH_COLLECTIVE_TIMEOUT_S", "5", 1); /* a rank that fails stops the others soon */
    return 0;
}

typedef struct job {
    int *ids;
    int batch, seq; /* micro_batch x seq_len ids of one micro-batch */
} job;

/* One rank: a step, a forward pass. Their statuses are not the point
 * (a plan may be refused here: its layout, a rank that fails); the
 * sanitizers are. */
static mesh_status rank_fn(mesh_context *ctx, int rank, void *ud)
{
    (void)rank;
    const job *j = ud;
    mesh_step_stats st;
    mesh_status s = mesh_train_step(ctx, j->ids, j->ids + 1, &st);
    double loss;
    if (s == MESH_OK) s = mesh_forward(ctx, j->ids, j->ids + 1, &loss, NULL, 0);
    return s;
}

static int small_enough(const mesh_plan *mp, const mesh_plan_info *in)
{
    const plan *p = &mp->p;
    if (in->world < 1 || in->world > MAX_RANKS || !p->memory) return 0;
    for (int s = 0; s < p->pp; s++)
        if (p->memory[s].total > MAX_BYTES) return 0;
    long long tokens = (long long)in->micro_batch * in->micro_batches * in->seq_len;
    return in->micro_batch > 0 && in->micro_batches > 0 && in->seq_len > 0 && tokens <= MAX_TOKENS && in->vocab > 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mesh_plan *mp;
    if (mesh_plan_from_memory((const char *)data, size, &mp) != MESH_OK) return 0;
    mesh_plan_info in;
    if (mesh_plan_get_info(mp, sizeof in, &in) == MESH_OK && small_enough(mp, &in)) {
        size_t n = (size_t)in.micro_batch * (size_t)in.micro_batches * (size_t)in.seq_len + 1;
        job j = {malloc(n * sizeof(int)), in.micro_batch, in.seq_len};
        if (j.ids) {
            for (size_t i = 0; i < n; i++) j.ids[i] = (int)(i % (size_t)in.vocab);
            (void)mesh_run_ranks(mp, rank_fn, &j);
            free(j.ids);
        }
    }
    mesh_plan_free(mp);
    return 0;
}
