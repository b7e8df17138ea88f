/*
 * comm_bench.c: collective bandwidth of the communicators, nccl-tests
 * style, next to this machine's memory-copy bandwidth measured in the same
 * run.
 *
 *   comm_bench [MAX_MB]          the threads communicator (comm_threads.c):
 *                                all-reduce, reduce-scatter, all-gather on 2
 *                                and 4 ranks, 1 KB .. MAX_MB (default 64) MB
 *   comm_bench --world [MAX_MB]  this process is one rank of a job: under
 *                                mpirun the MPI communicator (comm_mpi.c),
 *                                with torchrun's variables the TCP one
 *                                (comm_tcp.c); rank 0 prints
 *
 * For a collective of S bytes taking t seconds: algbw = S / t; busbw =
 * algbw x 2 (n - 1) / n for all-reduce and x (n - 1) / n for the others,
 * the bandwidth each rank's link would need (nccl-tests' definition), to
 * compare with the memcpy rate. Best of several runs; not a test.
 */
#include <pthread.h> /* pthread_create */
#include <stdio.h>   /* printf */
#include <stdlib.h>  /* malloc, atoi, getenv */
#include <string.h>  /* memcpy, strcmp */

#include "comm.h" /* comm_*, comm_now */

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER };

typedef struct job {
    comm_threads_world *w;
    int rank, op, iters;
    size_t n; /* floats of the whole tensor */
    double seconds;
} job;

/* The best of `iters` runs of one collective of n floats on c. */
static double time_op(comm *c, int op, size_t n, int iters)
{
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    size_t part = n / (size_t)c->size;
    for (size_t i = 0; i < n; i++) a[i] = (float)(i % 7);
    double best = 1e30;
    for (int it = 0; it < iters; it++) {
        comm_barrier(c);
        double t0 = comm_now();
        if (op == OP_ALL_REDUCE) comm_all_reduce(c, a, n);
        else if (op == OP_REDUCE_SCATTER) comm_reduce_scatter(c, a, b, part);
        else comm_all_gather(c, a, b, part);
        comm_barrier(c);
        double t = comm_now() - t0;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    return best;
}

static void *rank_main(void *arg)
{
    job *j = arg;
    comm *c = comm_threads_rank(j->w, j->rank);
    j->seconds = time_op(c, j->op, j->n, j->iters);
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
        double t0 = comm_now();
        memcpy(b, a, bytes);
        double t = comm_now() - t0;
        if (t < best) best = t;
    }
    volatile char sink = b[bytes / 2];
    (void)sink;
    free(a);
    free(b);
    return (double)bytes / best / 1e9;
}

static const char *const names[] = {"all-reduce", "reduce-scatter", "all-gather"};

static void row(const char *backend, int op, int ranks, size_t bytes, double t)
{
    double alg = (double)bytes / t / 1e9;
    double factor = op == OP_ALL_REDUCE ? 2.0 * (ranks - 1) / ranks : (double)(ranks - 1) / ranks;
    printf("%-8s %-15s %5d %10zu %10.1f %10.2f %10.2f\n", backend, names[op], ranks, bytes, t * 1e6, alg,
           alg * factor);
}

static void header(void)
{
    printf("%-8s %-15s %5s %10s %10s %10s %10s\n", "backend", "collective", "ranks", "bytes", "time us",
           "algbw GB/s", "busbw GB/s");
}

/* This process as one rank of a job (MPI, or TCP with torchrun's variables). */
static int world(int max_mb)
{
    char err[512];
    int tcp = !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK") && !getenv("PMI_RANK");
    const char *backend = tcp ? "tcp" : "mpi";
    comm *c = tcp ? comm_tcp_world(60, err, sizeof err) : comm_mpi_world(60, err, sizeof err);
    if (!c) {
        fprintf(stderr, "comm_bench: %s\n", err);
        return 1;
    }
    if (c->rank == 0) {
        printf("memcpy of %d MB: %.2f GB/s (one thread; the reference for busbw)\n", max_mb,
               memcpy_gbs((size_t)max_mb << 20));
        header();
    }
    for (int op = 0; op < 3; op++)
        for (size_t bytes = 1024; bytes <= ((size_t)max_mb << 20); bytes *= 16) {
            double t = time_op(c, op, bytes / sizeof(float), bytes < (1u << 20) ? 50 : 5);
            if (c->rank == 0) row(backend, op, c->size, bytes, t);
        }
    fflush(stdout);
    int first = tcp ? comm_tcp_finish(c, 0, "") : comm_mpi_finish(c, 0, "");
    comm_free(c);
    return first >= 0;
}

int main(int argc, char **argv)
{
    int w = argc > 1 && strcmp(argv[1], "--world") == 0;
    int max_mb = argc > 1 + w ? atoi(argv[1 + w]) : 64;
    if (max_mb < 1) max_mb = 1;
    if (w) return world(max_mb);
    printf("memcpy of %d MB: %.2f GB/s (one thread; the reference for busbw)\n", max_mb,
           memcpy_gbs((size_t)max_mb << 20));
    header();
    for (int op = 0; op < 3; op++)
        for (int ranks = 2; ranks <= 4; ranks += 2)
            for (size_t bytes = 1024; bytes <= ((size_t)max_mb << 20); bytes *= 16) {
                size_t n = bytes / sizeof(float);
                int iters = bytes < (1u << 20) ? 50 : 5;
                row("threads", op, ranks, bytes, measure(ranks, op, n, iters));
            }
    return 0;
}
