/*
 * comm_bench.c: collective bandwidth of the threads communicator
 * (runtime/comm_threads.c), nccl-tests style, next to this machine's
 * memory-copy bandwidth measured in the same run.
 *
 *   comm_bench [MAX_MB]     all-reduce, reduce-scatter, all-gather on 2 and
 *                           4 ranks, 1 KB .. MAX_MB (default 64) MB
 *
 * For a collective of S bytes taking t seconds: algbw = S / t; busbw =
 * algbw x 2 (n - 1) / n for all-reduce and x (n - 1) / n for the others,
 * the bandwidth each rank's link would need (nccl-tests' definition), to
 * compare with the memcpy rate. Best of several runs; not a test.
 */
#include <pthread.h> /* pthread_create */
#include <stdio.h>   /* printf */
#include <stdlib.h>  /* malloc, atoi */
#include <string.h>  /* memcpy */
#include <time.h>    /* clock_gettime */

#include "comm.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER };

typedef struct job {
    comm_threads_world *w;
    int rank, op, iters;
    size_t n; /* floats of the whole tensor */
    double seconds;
} job;

static void *rank_main(void *arg)
{
    job *j = arg;
    comm *c = comm_threads_rank(j->w, j->rank);
    float *a = malloc(j->n * sizeof *a), *b = malloc(j->n * sizeof *b);
    size_t part = j->n / (size_t)c->size;
    for (size_t i = 0; i < j->n; i++) a[i] = (float)(i % 7);
    double best = 1e30;
    for (int it = 0; it < j->iters; it++) {
        comm_barrier(c);
        double t0 = now();
        if (j->op == OP_ALL_REDUCE) comm_all_reduce(c, a, j->n);
        else if (j->op == OP_REDUCE_SCATTER) comm_reduce_scatter(c, a, b, part);
        else comm_all_gather(c, a, b, part);
        comm_barrier(c);
        double t = now() - t0;
        if (t < best) best = t;
    }
    j->seconds = best;
    free(a);
    free(b);
    comm_free(c);
    return NULL;
}

/* The best time of one collective on n ranks. */
static double measure(int ranks, int op, size_t n, int iters)
{
    comm_threads_world *w = comm_threads_world_new(ranks, 60);
    job jobs[8];
    pthread_t th[8];
    for (int r = 0; r < ranks; r++) {
        jobs[r] = (job){w, r, op, iters, n, 0};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < ranks; r++) pthread_join(th[r], NULL);
    return jobs[0].seconds;
}

static double memcpy_gbs(size_t bytes)
{
    char *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 0, bytes);
    double best = 1e30;
    for (int it = 0; it < 5; it++) {
        double t0 = now();
        memcpy(b, a, bytes);
        double t = now() - t0;
        if (t < best) best = t;
    }
    volatile char sink = b[bytes / 2];
    (void)sink;
    free(a);
    free(b);
    return (double)bytes / best / 1e9;
}

int main(int argc, char **argv)
{
    int max_mb = argc > 1 ? atoi(argv[1]) : 64;
    if (max_mb < 1) max_mb = 1;
    printf("memcpy of %d MB: %.2f GB/s (one thread; the reference for busbw)\n", max_mb,
           memcpy_gbs((size_t)max_mb << 20));
    static const char *const names[] = {"all-reduce", "reduce-scatter", "all-gather"};
    printf("%-15s %5s %10s %10s %10s %10s\n", "collective", "ranks", "bytes", "time us", "algbw GB/s",
           "busbw GB/s");
    for (int op = 0; op < 3; op++)
        for (int ranks = 2; ranks <= 4; ranks += 2)
            for (size_t bytes = 1024; bytes <= ((size_t)max_mb << 20); bytes *= 16) {
                size_t n = bytes / sizeof(float);
                int iters = bytes < (1u << 20) ? 50 : 5;
                double t = measure(ranks, op, n, iters);
                double alg = (double)bytes / t / 1e9;
                double factor = op == OP_ALL_REDUCE ? 2.0 * (ranks - 1) / ranks : (double)(ranks - 1) / ranks;
                printf("%-15s %5d %10zu %10.1f %10.2f %10.2f\n", names[op], ranks, bytes, t * 1e6, alg, alg * factor);
            }
    return 0;
}
