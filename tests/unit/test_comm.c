/*
 * test_comm.c: the threads communicator (runtime/comm_threads.c): every
 * collective against a serial reference (sums in rank order, so equal to
 * the bit), sub-groups from split, point-to-point in both orders (the
 * cases of comm_cases.c, which the MPI backend passes too), and
 * failure: an aborting rank and a missing rank stop the others with a
 * message naming the rank. Checks run on the main thread; rank threads
 * only record.
 */
#include <pthread.h> /* pthread_create */
#include <stdint.h>  /* uint16_t, uintptr_t */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* calloc */
#include <string.h>  /* strstr */
#include <time.h>    /* clock_gettime */

#include "comm.h"       /* defines: comm_* */
#include "comm_cases.h" /* defines: comm_case_* */
#include "device.h"     /* defines: dev_open: the staging copies */
#include "kcpu.h"       /* defines: kcpu_pack16, kcpu_unpack16 */
#include "unit.h"       /* defines: TEST_IMPL, ASSERT_* */

enum { P = 4 };

typedef struct rank_job {
    comm_threads_world *w;
    int rank;
    int (*body)(struct rank_job *j, comm *c);
    int rc;                 /* the body's result: 0 if every check passed */
    char error[1100];        /* the first failing call's message */
    char note[1100];         /* what the body noted */
    double seconds;         /* time in the body */
} rank_job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *run_rank(void *arg)
{
    rank_job *j = arg;
    comm *c = comm_threads_rank(j->w, j->rank);
    double t0 = now();
    j->rc = c ? j->body(j, c) : -1;
    j->seconds = now() - t0;
    if (c && j->rc != 0 && !j->error[0]) snprintf(j->error, sizeof j->error, "%s", c->error);
    comm_free(c);
    return NULL;
}

/* Runs body on n rank threads of a new world; jobs[] receives the results. */
static void run_world(int n, double timeout, int (*body)(rank_job *, comm *), rank_job *jobs)
{
    comm_threads_world *w = comm_threads_world_new(n, timeout);
    ASSERT_NOT_NULL(w);
    pthread_t th[8];
    for (int r = 0; r < n; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].w = w;
        jobs[r].rank = r;
        jobs[r].body = body;
        ASSERT_INT_EQ(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

/* Fails unless every one of the n ranks returned 0 (each failure said first). */
static void expect_ranks_ok(const rank_job *jobs, int n)
{
    for (int r = 0; r < n; r++) {
        if (jobs[r].rc != 0) fprintf(stderr, "# rank %d: %d %s\n", r, jobs[r].rc, jobs[r].error);
        ASSERT_INT_EQ(jobs[r].rc, 0);
    }
}

static int collectives(rank_job *j, comm *c)
{
    if (c->size != P || c->world_rank != c->rank) return 1;
    return comm_case_collectives(c, j->note, j->error, sizeof j->error);
}

TEST_IMPL(comm_threads_collectives_match_serial)
{
    rank_job jobs[P];
    run_world(P, 30, collectives, jobs);
    expect_ranks_ok(jobs, P);
    for (int r = 0; r < P; r++) ASSERT_NOT_NULL(strstr(jobs[r].note, "4 bytes sent, 8 expected"));
}

static int groups(rank_job *j, comm *c) { return comm_case_groups(c, j->error, sizeof j->error); }

TEST_IMPL(comm_threads_split_groups)
{
    rank_job jobs[P];
    run_world(P, 30, groups, jobs);
    expect_ranks_ok(jobs, P);
}

/* Rank 1 fails before the collective; the others' all-reduce fails at
 * once, naming it. */
static int one_aborts(rank_job *j, comm *c) { return comm_case_one_aborts(c, j->error, sizeof j->error); }

TEST_IMPL(comm_threads_abort_stops_everyone)
{
    rank_job jobs[3];
    run_world(3, 30, one_aborts, jobs);
    for (int r = 0; r < 3; r++) ASSERT_INT_EQ(jobs[r].rc, 0);
    for (int r = 0; r < 3; r += 2) {
        ASSERT_NOT_NULL(strstr(jobs[r].error, "all-reduce over 3 ranks"));
        ASSERT_NOT_NULL(strstr(jobs[r].error, "rank 1 failed: the loss is not finite at step 3"));
        ASSERT_INT_LT((long)(jobs[r].seconds * 10), 20); /* well within the 30 s timeout */
        ASSERT_INT_EQ(comm_names_other(jobs[r].error, r), 1); /* passed on: not the cause */
    }
}

/* What mesh_run_ranks reads to name the cause first: a failure passed on
 * from another rank, in any backend's words, not the rank's own. */
TEST_IMPL(comm_names_other_reads_the_backends_words)
{
    char words[128];
    comm_rank_failed(words, sizeof words, 11, "a kernel faulted");
    ASSERT_STR_EQ(words, "rank 11 failed: a kernel faulted");
    ASSERT_INT_EQ(comm_names_other(words, 1), 1);
    ASSERT_INT_EQ(comm_names_other(words, 0), 1);
    ASSERT_INT_EQ(comm_names_other(words, 11), 0);
    comm_rank_failed(words, sizeof words, 2, NULL);
    ASSERT_STR_EQ(words, "rank 2 failed: aborted");
    ASSERT_INT_EQ(comm_names_other("step 3: rank 0: all-reduce over 2 ranks (this is rank 0): " COMM_ANOTHER_FAILED
                                   " (rank 1: a network failure)", 0), 1);
    ASSERT_INT_EQ(comm_names_other("step 3: rank 1: matmul_forward: cuda:1: a kernel faulted on this GPU", 1), 0);
    ASSERT_INT_EQ(comm_names_other("rank 0 expected 3 floats from rank 1, which sends 2", 0), 0);
}

/* A hold on a threads world (what an NCCL world bootstrapped over it
 * polls): it sees the abort, with why, and keeps the world readable after
 * every handle is freed; other communicators have none. */
TEST_IMPL(comm_threads_hold_sees_the_abort)
{
    char why[128] = "";
    comm_threads_world *tw = comm_threads_world_new(2, 30);
    ASSERT_NOT_NULL(tw);
    comm *a = comm_threads_rank(tw, 0), *b = comm_threads_rank(tw, 1);
    ASSERT_NOT_NULL(a);
    ASSERT_NOT_NULL(b);
    comm *checked = comm_checked_new(a, 0, NULL, NULL);
    ASSERT_NOT_NULL(checked);
    ASSERT_PTR_EQ(comm_threads_world_of(a), tw);
    ASSERT_PTR_EQ(comm_threads_world_of(checked), tw); /* through the checked one */
    ASSERT_NULL(comm_threads_world_of(NULL));
    comm_threads_world_hold(tw);
    ASSERT_INT_EQ(comm_threads_aborted(tw, why, sizeof why), 0);
    ASSERT_STR_EQ(why, "");
    comm_abort(b, "its GPU failed");
    ASSERT_INT_EQ(comm_threads_aborted(tw, why, sizeof why), 1);
    ASSERT_STR_EQ(why, "rank 1 failed: its GPU failed");
    comm_free(checked);
    comm_free(b);
    comm_free(a);
    ASSERT_INT_EQ(comm_threads_aborted(tw, NULL, 0), 1); /* still readable: held */
    comm_threads_release(tw);
    ASSERT_INT_EQ(comm_threads_aborted(NULL, why, sizeof why), 0);
}

/* Rank 1 never comes: rank 0 gives up after the timeout, saying so. */
static int one_missing(rank_job *j, comm *c) { return comm_case_one_missing(c, 0, j->error, sizeof j->error); }

/* Rank 1 comes after rank 0 gave up: its call fails too, with rank 0's
 * reason (it neither completes the barrier rank 0 left nor waits in it). */
static int one_late(rank_job *j, comm *c)
{
    float x[4] = {0};
    if (c->rank == 1) comm_sleep(0.5);
    int rc = comm_all_reduce(c, x, 4);
    snprintf(j->error, sizeof j->error, "%s", c->error);
    return rc == 0; /* (0: failed, as it must) */
}

TEST_IMPL(comm_threads_timeout_names_the_wait)
{
    rank_job jobs[2];
    run_world(2, 0.2, one_missing, jobs);
    ASSERT_INT_EQ(jobs[0].rc, 0);
    ASSERT_NOT_NULL(strstr(jobs[0].error, "all-reduce over 2 ranks (this is rank 0): rank 0 waited in all-reduce "
                                          "for more than 0.2 s"));
    ASSERT_INT_LT((long)(jobs[0].seconds * 10), 20);
    run_world(2, 0.2, one_late, jobs);
    for (int r = 0; r < 2; r++) {
        ASSERT_INT_EQ(jobs[r].rc, 0);
        ASSERT_NOT_NULL(strstr(jobs[r].error, "rank 0 waited in all-reduce for more than 0.2 s"));
    }
}

/* A communication queue (comm_async.h) beside the rank's own calls: the
 * blocking calls' bits; an abort fails the queued call, naming the rank. */
static int async_calls(rank_job *j, comm *c) { return comm_case_async(c, j->error, sizeof j->error); }
static int async_abort(rank_job *j, comm *c) { return comm_case_async_abort(c, j->error, sizeof j->error); }
static int async_hooks(rank_job *j, comm *c) { return comm_case_async_hooks(c, j->error, sizeof j->error); }

TEST_IMPL(comm_threads_async_hooks)
{
    rank_job jobs[3];
    run_world(3, 30, async_hooks, jobs);
    expect_ranks_ok(jobs, 3);
}

TEST_IMPL(comm_threads_async_queue)
{
    rank_job jobs[P];
    run_world(P, 30, async_calls, jobs);
    expect_ranks_ok(jobs, P);
    run_world(3, 30, async_abort, jobs);
    for (int r = 0; r < 3; r++) ASSERT_INT_EQ(jobs[r].rc, 0);
    for (int r = 0; r < 3; r += 2) {
        ASSERT_NOT_NULL(strstr(jobs[r].error, "over 3 ranks"));
        ASSERT_NOT_NULL(strstr(jobs[r].error, "rank 1 failed: rank 1 ran out of memory"));
        ASSERT_INT_LT((long)(jobs[r].seconds * 10), 20); /* well within the 30 s timeout */
    }
}

/* ---- the checked communicator (comm_checked.c) ---- */

/* Its "device memory": the job's own arrays. */
typedef struct dev_mem {
    uint16_t h[64];  /* bf16 elements */
    float f[64];
} dev_mem;

static int in_dev(void *ud, const void *p, size_t bytes)
{
    uintptr_t b = (uintptr_t)ud, q = (uintptr_t)p;
    return q >= b && bytes <= sizeof(dev_mem) && q - b <= sizeof(dev_mem) - bytes;
}

static uint16_t bf16_of(float x)
{
    uint16_t h;
    kcpu_pack16(&h, &x, 1, KCPU_BF16);
    return h;
}

static float float_of(uint16_t h)
{
    float x;
    kcpu_unpack16(&x, &h, 1, KCPU_BF16);
    return x;
}

/* A host buffer fails the call, naming it; device buffers go through: fp32
 * sums, then bf16 elements: a sum rounded once, a gather of bytes, a
 * reduce-scatter in place, an all-to-all; splits inherit both. Once with
 * the wrapped communicator on the buffers themselves, once staged through
 * host memory (comm_checked_stage, the CPU device's copies), the split
 * then moved to another device handle (comm_checked_restage, as a
 * communication queue's thread takes its own), whose copies it makes. */
static int checked_once(rank_job *j, comm *c, dev *stage, dev *other)
{
    dev_mem *d = calloc(1, sizeof *d);
    float host[4] = {1, 2, 3, 4};
    comm *k = d ? comm_checked_new(c, 0, in_dev, d) : NULL;
    int bad = !k;
    if (!bad && stage && comm_checked_stage(k, stage) != 0) bad = 11;
    if (!bad && comm_all_reduce(k, host, 4) == 0) bad = 1; /* host memory: refused on every rank, before any sum */
    if (!bad && !strstr(k->error, "host buffer")) bad = 2;
    for (int i = 0; i < 4; i++) d->f[i] = (float)(c->rank + i);
    if (!bad && (comm_all_reduce(k, d->f, 4) != 0 || d->f[1] != (float)(P * (P - 1) / 2 + P))) bad = 3;
    /* bf16: x_r = 1 + r / 128 (exact in bf16); their fp32 sum 4 + 6 / 128 lies
     * halfway between the bf16 numbers 4 + 1 / 32 and 4 + 2 / 32 (steps of
     * 1 / 32 above 4): rounded once, to the even one, 4.0625 */
    comm_checked_set_elements(k, COMM_BF16);
    for (int i = 0; i < 8; i++) d->h[i] = bf16_of(1.0f + (float)c->rank / 128.0f);
    if (!bad && comm_all_reduce(k, (float *)(void *)d->h, 8) != 0) bad = 4;
    if (!bad && float_of(d->h[7]) != 4.0625f) bad = 5;
    /* all-gather of 3 (odd) bf16 elements: the bytes */
    for (int i = 0; i < 3; i++) d->h[i] = (uint16_t)(0x3f80 + c->rank * 3 + i);
    if (!bad && comm_all_gather(k, (float *)(void *)d->h, (float *)(void *)(d->h + 8), 3) != 0) bad = 6;
    for (int q = 0; !bad && q < P; q++)
        for (int i = 0; i < 3; i++)
            if (d->h[8 + 3 * q + i] != (uint16_t)(0x3f80 + q * 3 + i)) bad = 7;
    comm *sub = NULL;
    if (!bad && (comm_split(k, c->rank % 2, c->rank, &sub) != 0 || !sub)) bad = 8;
    if (!bad && comm_checked_restage(sub, other) != 0) bad = 13;
    long long mine = stage ? stage->to_host : 0, theirs = other->to_host;
    for (int i = 0; i < 2; i++) d->h[i] = bf16_of(1.0f);
    if (!bad && (comm_all_reduce(sub, (float *)(void *)d->h, 2) != 0 || float_of(d->h[1]) != 2.0f)) bad = 9;
    if (!bad && stage && (stage->to_host != mine || other->to_host == theirs)) bad = 14;
    if (!bad && !stage && other->to_host != theirs) bad = 15; /* not staged: nothing moved */
    if (!bad && comm_all_reduce(sub, host, 1) == 0) bad = 10;
    comm_free(sub);
    comm_free(k);
    free(d);
    if (bad) snprintf(j->error, sizeof j->error, "check %d failed%s", bad, stage ? " (staged)" : "");
    return bad;
}

static int checked(rank_job *j, comm *c)
{
    dev *cpu = NULL, *other = NULL;
    char why[256];
    if (dev_open(MESH_DEVICE_CPU, 0, &cpu, why, sizeof why) != MESH_OK ||
        dev_open(MESH_DEVICE_CPU, 0, &other, why, sizeof why) != MESH_OK) {
        dev_close(cpu);
        return snprintf(j->error, sizeof j->error, "%s", why), 12;
    }
    int bad = checked_once(j, c, NULL, other);
    if (!bad) bad = checked_once(j, c, cpu, other);
    dev_close(cpu);
    dev_close(other);
    return bad;
}

TEST_IMPL(comm_checked_refuses_host_buffers_and_moves_bf16)
{
    rank_job jobs[P];
    run_world(P, 30, checked, jobs);
    expect_ranks_ok(jobs, P);
}
