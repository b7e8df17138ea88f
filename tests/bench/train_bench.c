/* train_bench.c: `make bench`'s CPU training numbers, through the public
 * API: ms per step and tokens/s of a plan, printed next to the GEMM-only
 * limit measured in the same run (the step's model FLOPs, 6 x parameters x
 * tokens, divided by this machine's cblas_sgemm rate on the model's own
 * largest matmul shape), so the ratio to the limit is visible.
 *
 *   train_bench FILE.plan STEPS
 *
 * A plan of several ranks runs them as threads (mesh_run_ranks), each on
 * its slice of the global batch: the line gives the ranks, ms per step and
 * the global batch's tokens/s, then ms per step with the gradient sync
 * after backward instead of during it (mesh_set_overlap(0)) and the ratio
 * of the two (below 1: overlap is faster).
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <mesh.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h> /* sysconf */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GFLOP/s of cblas_sgemm for [M,K] @ [K,N], best of a few, on every core
 * (OpenBLAS's own threads: libmesh runs it on one and shares a product's
 * blocks among threads of its own, kernels/cpu/gemm.c; the process ends
 * after this). */
static double sgemm_rate(int M, int K, int N)
{
    openblas_set_num_threads((int)sysconf(_SC_NPROCESSORS_ONLN));
    float *a = calloc((size_t)M * K, 4), *b = calloc((size_t)K * N, 4), *c = calloc((size_t)M * N, 4);
    double best = 0;
    for (int r = 0; a && b && c && r < 20; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
        double rate = 2.0 * M * K * N / (now() - t0) / 1e9;
        if (rate > best) best = rate;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* A multi-rank run: every rank trains `steps` steps; rank 0 times them. */
typedef struct ranks_run {
    const mesh_plan *plan;
    int steps;
    double ms;
} ranks_run;

static mesh_status rank_steps(mesh_context *ctx, int rank, void *ud)
{
    ranks_run *r = ud;
    int mb, m, seq, vocab;
    mesh_plan_batch(r->plan, &mb, &m, &seq, &vocab);
    size_t n = (size_t)m * mb * seq;
    int *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    if (!in || !tg) return MESH_ERR_NOMEM;
    for (size_t k = 0; k < n; k++) in[k] = (int)(k * 7 % (size_t)vocab), tg[k] = (int)(k * 11 % (size_t)vocab);
    mesh_step_stats st;
    mesh_status s = mesh_train_step(ctx, in, tg, &st); /* warm up */
    double t0 = now();
    for (int k = 0; s == MESH_OK && k < r->steps; k++) s = mesh_train_step(ctx, in, tg, &st);
    if (rank == 0) r->ms = 1e3 * (now() - t0) / r->steps;
    free(in);
    free(tg);
    return s;
}

/* The plan on its ranks, with the gradient sync during backward and after
 * it (mesh_set_overlap), alternating twice: the best of each. */
static int run_ranks(mesh_plan *plan, const char *path, int steps)
{
    mesh_plan_info pi;
    mesh_plan_get_info(plan, sizeof pi, &pi);
    double best[2] = {0, 0};
    for (int k = 0; k < 4; k++) {
        ranks_run r = {plan, steps, 0};
        mesh_set_overlap(k % 2 == 0);
        if (mesh_run_ranks(plan, rank_steps, &r) != MESH_OK) {
            fprintf(stderr, "train_bench: %s\n", mesh_last_error());
            return 1;
        }
        if (best[k % 2] == 0 || r.ms < best[k % 2]) best[k % 2] = r.ms;
    }
    mesh_set_overlap(1);
    double tokens = (double)pi.global_batch * pi.seq_len;
    printf("%-28s %5d %4d %4d %9.1f %10.0f %11.1f %6.2f\n", path, pi.world, pi.dp, pi.tp, best[0],
           1e3 * tokens / best[0], best[1], best[0] / best[1]);
    return 0;
}

int main(int argc, char **argv)
{
    mesh_plan *plan;
    mesh_context *ctx;
    int mb, m, seq, vocab;
    mesh_plan_info pi;
    if (argc >= 3 && mesh_plan_load(argv[1], &plan) == MESH_OK && mesh_plan_get_info(plan, sizeof pi, &pi) == MESH_OK &&
        pi.world > 1) {
        int rc = run_ranks(plan, argv[1], atoi(argv[2]));
        mesh_plan_free(plan);
        return rc;
    }
    if (argc >= 3) mesh_plan_free(plan);
    if (argc < 3 || mesh_plan_load(argv[1], &plan) != MESH_OK ||
        mesh_context_create(plan, 0, &ctx) != MESH_OK) {
        fprintf(stderr, "train_bench: %s\n", argc < 3 ? "usage: train_bench FILE.plan STEPS" : mesh_last_error());
        return 1;
    }
    mesh_plan_batch(plan, &mb, &m, &seq, &vocab);
    size_t n = (size_t)m * mb * seq, params = 0, biggest = 0, count;
    const char *name;
    for (int k = 0; mesh_param_info(ctx, k, &name, &count) == MESH_OK; k++) {
        params += count;
        if (count > biggest && k > 1) biggest = count;   /* a layer's largest weight */
    }
    int *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    for (size_t k = 0; k < n; k++) in[k] = (int)(k * 7 % (size_t)vocab), tg[k] = (int)(k * 11 % (size_t)vocab);
    int steps = atoi(argv[2]);
    mesh_step_stats st;
    mesh_train_step(ctx, in, tg, &st);   /* warm up */
    double t0 = now();
    for (int s = 0; s < steps; s++) mesh_train_step(ctx, in, tg, &st);
    double ms = 1e3 * (now() - t0) / steps;
    /* the layer's widest matmul: tokens x C @ C x 4C, with C = sqrt(biggest / 4) */
    int C = 1;
    while ((size_t)(C + 1) * (size_t)(C + 1) * 4 <= biggest) C++;
    double rate = sgemm_rate((int)n, C, 4 * C), flops = 6.0 * (double)params * (double)n;
    double limit_ms = flops / (rate * 1e9) * 1e3;
    printf("%-28s %11zu %6zu %9.1f %10.0f %9.1f %8.1f %6.2f\n", argv[1], params, n, ms, 1e3 * (double)n / ms,
           rate, limit_ms, ms / limit_ms);
    free(in);
    free(tg);
    mesh_context_free(ctx);
    mesh_plan_free(plan);
    return 0;
}
