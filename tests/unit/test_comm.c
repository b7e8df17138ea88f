/*
 * test_comm.c: the threads communicator (runtime/comm_threads.c): every
 * collective against a serial reference (sums in rank order, so equal to
 * the bit), sub-groups from split, point-to-point in both orders, and
 * failure: an aborting rank and a missing rank stop the others with a
 * message naming the rank. Checks run on the main thread; rank threads
 * only record.
 */
#include <pthread.h> /* pthread_create */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* calloc */
#include <string.h>  /* strstr */
#include <time.h>    /* clock_gettime */

#include "comm.h" /* defines: comm_* */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

enum { P = 4, N = 1001, RS = 257, MAXC = 3 };

typedef struct rank_job {
    comm_threads_world *w;
    int rank;
    int (*body)(struct rank_job *j, comm *c);
    int rc;                 /* the body's result: 0 if every check passed */
    char error[320];        /* the first failing call's message */
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

static float value(int rank, size_t i) { return (float)rank * 0.75f + (float)(i % 97) * 0.013f - 0.5f; }

/* 1 when a[i] == b[i] for all i, bit for bit. */
static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static size_t a2a_count(int from, int to) { return (size_t)((from + 2 * to) % MAXC + 1); }

static int collectives(rank_job *j, comm *c)
{
    int r = c->rank, bad = 0;
    if (c->size != P || c->world_rank != r) return 1;
    /* all-reduce: the sum in rank order */
    float buf[N], want[N];
    for (size_t i = 0; i < N; i++) {
        buf[i] = value(r, i);
        want[i] = value(0, i);
        for (int q = 1; q < P; q++) want[i] += value(q, i);
    }
    if (comm_all_reduce(c, buf, N) != 0) return -1;
    bad |= !same(buf, want, N) << 1;
    /* reduce-scatter: this rank's RS of the sum of P x RS */
    float in[P * RS], out[RS], wrs[RS];
    for (size_t i = 0; i < P * RS; i++) in[i] = value(r, i * 3);
    for (size_t i = 0; i < RS; i++) {
        size_t k = (size_t)r * RS + i;
        wrs[i] = value(0, k * 3);
        for (int q = 1; q < P; q++) wrs[i] += value(q, k * 3);
    }
    if (comm_reduce_scatter(c, in, out, RS) != 0) return -1;
    bad |= !same(out, wrs, RS) << 2;
    /* all-gather */
    float mine[RS], all[P * RS];
    for (size_t i = 0; i < RS; i++) mine[i] = value(r, i + 5);
    if (comm_all_gather(c, mine, all, RS) != 0) return -1;
    for (int q = 0; q < P; q++)
        for (size_t i = 0; i < RS; i++) bad |= (all[(size_t)q * RS + i] != value(q, i + 5)) << 3;
    /* broadcast from rank 2 */
    float b[7];
    for (int i = 0; i < 7; i++) b[i] = r == 2 ? (float)i * 1.5f : -1.0f;
    if (comm_broadcast(c, b, sizeof b, 2) != 0) return -1;
    for (int i = 0; i < 7; i++) bad |= (b[i] != (float)i * 1.5f) << 4;
    /* all-to-all with uneven counts: element e of the part for peer q is r*100 + q*10 + e */
    size_t send[P], recv[P], ns = 0, nr = 0;
    for (int q = 0; q < P; q++) {
        send[q] = a2a_count(r, q);
        recv[q] = a2a_count(q, r);
        ns += send[q];
        nr += recv[q];
    }
    float sbuf[P * MAXC], rbuf[P * MAXC];
    for (int q = 0, k = 0; q < P; q++)
        for (size_t e = 0; e < send[q]; e++) sbuf[k++] = (float)(r * 100 + q * 10) + (float)e;
    if (comm_all_to_all(c, sbuf, send, rbuf, recv) != 0) return -1;
    for (int q = 0, k = 0; q < P; q++)
        for (size_t e = 0; e < recv[q]; e++) bad |= (rbuf[k++] != (float)(q * 100 + r * 10) + (float)e) << 5;
    (void)ns;
    (void)nr;
    /* point to point, around the ring, sends first (eager: no deadlock) */
    int next = (r + 1) % P, prev = (r + P - 1) % P, got = -1, msg = 1000 + r;
    if (comm_send(c, &msg, sizeof msg, next) != 0 || comm_recv(c, &got, sizeof got, prev) != 0) return -1;
    bad |= (got != 1000 + prev) << 6;
    /* a receive of the wrong size is an error */
    if (comm_send(c, &msg, sizeof msg, next) != 0) return -1;
    double wrong;
    if (comm_recv(c, &wrong, sizeof wrong, prev) == 0) bad |= 1 << 7;
    else snprintf(j->error, sizeof j->error, "%s", c->error);
    if (comm_barrier(c) != 0) return -1;
    return bad;
}

TEST_IMPL(comm_threads_collectives_match_serial)
{
    rank_job jobs[P];
    run_world(P, 30, collectives, jobs);
    for (int r = 0; r < P; r++) {
        if (jobs[r].rc != 0) fprintf(stderr, "# rank %d: %d %s\n", r, jobs[r].rc, jobs[r].error);
        ASSERT_INT_EQ(jobs[r].rc, 0);
        ASSERT_NOT_NULL(strstr(jobs[r].error, "4 bytes sent, 8 expected"));
    }
}

/* 2 x 2: "tp" groups of adjacent ranks {0,1} {2,3}, "dp" groups {0,2} {1,3}
 * (keys reversed: rank order within a group follows the key); rank 3 opts
 * out of a third split. */
static int groups(rank_job *j, comm *c)
{
    int r = c->rank, bad = 0;
    comm *tp = NULL, *dp = NULL, *none = NULL;
    if (comm_split(c, r / 2, r, &tp) != 0 || comm_split(c, r % 2, -r, &dp) != 0) return -1;
    bad |= (tp->size != 2 || tp->rank != r % 2) << 1;
    bad |= (dp->size != 2 || dp->rank != (r < 2 ? 1 : 0)) << 2;
    float x = (float)(r + 1);
    if (comm_all_reduce(tp, &x, 1) != 0) {
        snprintf(j->error, sizeof j->error, "%s", tp->error);
        return -1;
    }
    bad |= (x != (r < 2 ? 3.0f : 7.0f)) << 3;
    float y = (float)(r + 1);
    if (comm_all_reduce(dp, &y, 1) != 0) {
        snprintf(j->error, sizeof j->error, "%s", dp->error);
        return -1;
    }
    bad |= (y != (r % 2 == 0 ? 4.0f : 6.0f)) << 4;
    /* point to point inside a group uses the group's ranks */
    int v = r, got = -1;
    if (comm_send(dp, &v, sizeof v, 1 - dp->rank) != 0 || comm_recv(dp, &got, sizeof got, 1 - dp->rank) != 0) {
        snprintf(j->error, sizeof j->error, "%s", dp->error);
        return -1;
    }
    bad |= (got != (r + 2) % 4) << 5;
    if (comm_split(c, r == 3 ? -1 : 0, 0, &none) != 0) return -1;
    bad |= (r == 3 ? none != NULL : none == NULL || none->size != 3) << 6;
    comm_free(none);
    comm_free(tp);
    comm_free(dp);
    return bad;
}

TEST_IMPL(comm_threads_split_groups)
{
    rank_job jobs[P];
    run_world(P, 30, groups, jobs);
    for (int r = 0; r < P; r++) {
        if (jobs[r].rc != 0) fprintf(stderr, "# rank %d: %d %s\n", r, jobs[r].rc, jobs[r].error);
        ASSERT_INT_EQ(jobs[r].rc, 0);
    }
}

/* Rank 1 fails before the collective; the others' all-reduce fails at
 * once, naming it. */
static int one_aborts(rank_job *j, comm *c)
{
    if (c->rank == 1) {
        comm_abort(c, "the loss is not finite at step 3");
        return 0;
    }
    float x[16] = {0};
    int rc = comm_all_reduce(c, x, 16);
    snprintf(j->error, sizeof j->error, "%s", c->error);
    return rc == 0;
}

TEST_IMPL(comm_threads_abort_stops_everyone)
{
    rank_job jobs[3];
    run_world(3, 30, one_aborts, jobs);
    for (int r = 0; r < 3; r++) ASSERT_INT_EQ(jobs[r].rc, 0);
    for (int r = 0; r < 3; r += 2) {
        ASSERT_NOT_NULL(strstr(jobs[r].error, "all-reduce over 3 ranks"));
        ASSERT_NOT_NULL(strstr(jobs[r].error, "rank 1 failed: the loss is not finite at step 3"));
        ASSERT_INT_LT((long)(jobs[r].seconds * 10), 20); /* well within the 30 s timeout */
    }
}

/* Rank 1 never comes: rank 0 gives up after the timeout, saying so. */
static int one_missing(rank_job *j, comm *c)
{
    if (c->rank == 1) return 0;
    float x[4] = {0};
    int rc = comm_all_reduce(c, x, 4);
    snprintf(j->error, sizeof j->error, "%s", c->error);
    return rc == 0;
}

TEST_IMPL(comm_threads_timeout_names_the_wait)
{
    rank_job jobs[2];
    run_world(2, 0.2, one_missing, jobs);
    ASSERT_INT_EQ(jobs[0].rc, 0);
    ASSERT_NOT_NULL(strstr(jobs[0].error, "all-reduce over 2 ranks (this is rank 0): rank 0 waited in all-reduce "
                                          "for more than 0.2 s"));
    ASSERT_INT_LT((long)(jobs[0].seconds * 10), 20);
}
