/*
 * test_comm_nccl.c: the NCCL communicator (runtime/comm_nccl*.c).
 *
 * Without a GPU (this build without CUDA, or no driver or device), the
 * backend says why, the constructors fail cleanly with that reason, and
 * the first test prints one line `SKIP nccl: no GPU (<reason>)`. With one,
 * worlds of one rank (bootstrapped over the TCP rendezvous on 127.0.0.1 at
 * a free port, and over a threads communicator) run every call on device
 * buffers against the values computed on the host, a failing call aborts
 * the world, a world whose other rank never comes times out, and one whose
 * rank names a GPU that is not there fails on every rank, naming it.
 */
#include <arpa/inet.h>  /* htonl */
#include <netinet/in.h> /* struct sockaddr_in */
#include <pthread.h>    /* pthread_create: a queue's thread */
#include <stdio.h>      /* printf, snprintf */
#include <stdlib.h>     /* setenv, unsetenv */
#include <stdint.h>     /* uint16_t: bf16 elements */
#include <string.h>     /* strstr, memcmp, strncmp, strlen */
#include <sys/socket.h> /* socket, bind, getsockname */
#include <unistd.h>     /* close */

#include "comm.h" /* defines: comm_nccl_*, comm_threads_* */
#include "comm_async.h" /* defines: comm_async_* */
#include "device.h"     /* defines: dev_open, dev_set_watch: a watched wait for a stream */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

#if MESH_CUDA
#include <cuda_runtime.h> /* cudaMalloc, cudaMemcpy: the device buffers */
#endif

#define NO_CUDA "this libmesh was built without CUDA (make CUDA=1)"

/* A TCP port on 127.0.0.1 that was free a moment ago. */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* The rendezvous of a one-rank world: 127.0.0.1 at a free port. */
static void rendezvous_here(void)
{
    char port[16];
    int p = free_port();
    ASSERT_INT_GE(p, 1);
    snprintf(port, sizeof port, "%d", p);
    ASSERT_INT_EQ(setenv("MESH_MASTER_ADDR", "127.0.0.1", 1), 0);
    ASSERT_INT_EQ(setenv("MESH_PORT", port, 1), 0);
    ASSERT_INT_EQ(unsetenv("NCCL_COMM_ID"), 0);
}

TEST_IMPL(comm_nccl_available_says_why)
{
    char why[256] = "x";
    int ok = comm_nccl_available(why, sizeof why);
    ASSERT_INT_EQ(comm_nccl_available(NULL, 0), ok);
    if (ok) {
        ASSERT_STR_EQ(why, "");
        return;
    }
    ASSERT_STR_NE(why, "");
#if !MESH_CUDA
    ASSERT_STR_EQ(why, NO_CUDA);
#endif
    printf("SKIP nccl: no GPU (%s)\n", why);
}

/* Without a GPU, both constructors fail with the reason, after the
 * bootstrap (the rank still comes, so that the others would fail naming
 * it): no crash, no hang. */
TEST_IMPL(comm_nccl_world_fails_cleanly_without_gpu)
{
    char why[256], err[320] = "", want[400];
    if (comm_nccl_available(why, sizeof why)) return; /* the GPU tests make worlds */
#if MESH_CUDA
    snprintf(want, sizeof want, "rank 0 cannot use GPU 0: %s", why);
#else
    snprintf(want, sizeof want, "%s", NO_CUDA);
#endif
    rendezvous_here();
    ASSERT_NULL(comm_nccl_world(0, 1, 0, 10, err, sizeof err));
    ASSERT_STR_EQ(err, want);
#if MESH_CUDA
    ASSERT_NULL(comm_nccl_world(1, 1, 0, 10, err, sizeof err));
    ASSERT_STR_EQ(err, "rank 1 of a world of 1");
#endif
    /* over another communicator (here a threads world of one rank) */
    comm_threads_world *tw = comm_threads_world_new(1, 10);
    ASSERT_NOT_NULL(tw);
    comm *boot = comm_threads_rank(tw, 0);
    ASSERT_NOT_NULL(boot);
    err[0] = '\0';
    ASSERT_NULL(comm_nccl_world_mpi(boot, 0, 10, err, sizeof err));
    ASSERT_STR_EQ(err, want);
    comm_free(boot);
}

#if MESH_CUDA

enum { N = 1000, A2A = 37 };

static float *dev_from(const float *host, size_t n)
{
    void *d = NULL;
    ASSERT_INT_EQ(cudaMalloc(&d, n * sizeof *host), cudaSuccess);
    ASSERT_INT_EQ(cudaMemcpy(d, host, n * sizeof *host, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* 1 when the device buffer d holds want[n], bit for bit. */
static int dev_equals(const float *d, const float *want, size_t n)
{
    static float got[2 * N];
    ASSERT_INT_EQ(n <= 2 * N, 1);
    ASSERT_INT_EQ(cudaMemcpy(got, d, n * sizeof *got, cudaMemcpyDeviceToHost), cudaSuccess);
    return memcmp(got, want, n * sizeof *got) == 0;
}

static void fill(float *x, size_t n, float base)
{
    for (size_t i = 0; i < n; i++) x[i] = base + (float)(i % 97) * 0.013f - 0.5f;
}

static comm *one_rank_world(double timeout_s)
{
    char err[320] = "";
    rendezvous_here();
    comm *c = comm_nccl_world(0, 1, 0, timeout_s, err, sizeof err);
    if (!c) fprintf(stderr, "# comm_nccl_world: %s\n", err);
    ASSERT_NOT_NULL(c);
    ASSERT_STR_EQ(c->v->name, "nccl");
    ASSERT_INT_EQ(c->rank, 0);
    ASSERT_INT_EQ(c->size, 1);
    return c;
}

#define CALL_OK(c, call)                                                      \
    do {                                                                      \
        int rc_ = (call);                                                     \
        if (rc_ != 0) fprintf(stderr, "# %s: %s\n", #call, (c)->error);       \
        ASSERT_INT_EQ(rc_, 0);                                                \
    } while (0)

/* Every call on a world of one rank (sums over one rank are the values;
 * comm_all_reduce skips a group of one, so the table is called). Ordered,
 * all-to-all's counts that disagree are left to ordered_all_to_all. */
static void every_call(comm *c, int ordered)
{
    static float h[N], h2[N];
    fill(h, N, 1.0f);
    fill(h2, N, -2.0f);
    float *a = dev_from(h, N), *b = dev_from(h2, N);
    CALL_OK(c, c->v->all_reduce(c, a, N));
    ASSERT_INT_EQ(dev_equals(a, h, N), 1);
    CALL_OK(c, comm_reduce_scatter(c, a, b, N));
    ASSERT_INT_EQ(dev_equals(b, h, N), 1);
    CALL_OK(c, comm_reduce_scatter(c, a, a, N)); /* in place */
    ASSERT_INT_EQ(dev_equals(a, h, N), 1);
    CALL_OK(c, comm_all_gather(c, a, b, N));
    ASSERT_INT_EQ(dev_equals(b, h, N), 1);
    /* buckets: one NCCL group each */
    {
        float *bv[2] = {a, b};
        size_t nv[2] = {N, N / 2};
        CALL_OK(c, c->v->all_reduce_v(c, bv, nv, 2));
        CALL_OK(c, c->v->reduce_scatter_v(c, bv, nv, 2));
        CALL_OK(c, c->v->all_gather_v(c, bv, nv, 2));
        ASSERT_INT_EQ(dev_equals(a, h, N), 1);
        ASSERT_INT_EQ(dev_equals(b, h, N), 1);
    }
    /* all-to-all: A2A floats to itself; counts that disagree fail */
    size_t send = A2A, recv = A2A, wrong = A2A - 1;
    fill(h2, N, 3.0f);
    ASSERT_INT_EQ(cudaMemcpy(b, h2, N * sizeof *h2, cudaMemcpyHostToDevice), cudaSuccess);
    CALL_OK(c, comm_all_to_all(c, a, &send, b, &recv));
    memcpy(h2, h, A2A * sizeof *h);
    ASSERT_INT_EQ(dev_equals(b, h2, N), 1);
    if (!ordered) {
        ASSERT_INT_EQ(comm_all_to_all(c, a, &send, b, &wrong), -1);
        ASSERT_NOT_NULL(strstr(c->error, "rank 0 expected 36 floats from rank 0, which sends 37"));
    }
    /* broadcast of bytes */
    CALL_OK(c, comm_broadcast(c, a, 10 * sizeof *a, 0));
    ASSERT_INT_EQ(dev_equals(a, h, N), 1);
    ASSERT_INT_EQ(comm_broadcast(c, a, 4, 1), -1);
    ASSERT_NOT_NULL(strstr(c->error, "root 1 of a group of 1"));
    /* sends are eager: two to itself (the data copied at once), then both
     * received, in order; a receive of the wrong size fails */
    static float w1[N], w2[N];
    fill(h2, N, 5.0f);
    float *s1 = dev_from(h, N), *s2 = dev_from(h2, N), *r1 = dev_from(h2, N), *r2 = dev_from(h, N);
    CALL_OK(c, comm_send(c, s1, 64 * sizeof *h, 0));
    CALL_OK(c, comm_send(c, s2, 32 * sizeof *h, 0));
    ASSERT_INT_EQ(cudaMemset(s1, 0, N * sizeof *h), cudaSuccess);
    ASSERT_INT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    CALL_OK(c, comm_recv(c, r1, 64 * sizeof *h, 0));
    CALL_OK(c, comm_recv(c, r2, 32 * sizeof *h, 0));
    memcpy(w1, h2, sizeof w1); /* r1: h's first 64, then its own (h2) */
    memcpy(w1, h, 64 * sizeof *h);
    memcpy(w2, h, sizeof w2); /* r2: h2's first 32, then its own (h) */
    memcpy(w2, h2, 32 * sizeof *h);
    ASSERT_INT_EQ(dev_equals(r1, w1, N), 1);
    ASSERT_INT_EQ(dev_equals(r2, w2, N), 1);
    CALL_OK(c, comm_send(c, s2, 4, 0));
    ASSERT_INT_EQ(comm_recv(c, r1, 8, 0), -1);
    ASSERT_STR_EQ(c->error, "receive from rank 0: 4 bytes sent, 8 expected");
    ASSERT_INT_EQ(comm_recv(c, r1, 8, 0), -1);
    ASSERT_NOT_NULL(strstr(c->error, "from itself (rank 0), which sent it nothing"));
    /* a peer outside the group is refused, and the world goes on */
    ASSERT_INT_EQ(comm_send(c, s1, 4, 1), -1);
    ASSERT_STR_EQ(c->error, "send to rank 1 of a group of 1");
    ASSERT_INT_EQ(comm_recv(c, r1, 4, -1), -1);
    ASSERT_STR_EQ(c->error, "receive from rank -1 of a group of 1");
    /* a queue's own calls on a world that is not a queue's are refused;
     * and a handle with a send deferred cannot become one */
    ASSERT_INT_EQ(comm_nccl_defer(c), -1);
    ASSERT_NOT_NULL(
        strstr(c->error, "defer over 1 rank (this is rank 0): not a queue's own world (comm_nccl_own_thread)"));
    ASSERT_INT_EQ(comm_nccl_record_event(c, NULL), -1);
    ASSERT_NOT_NULL(strstr(c->error, "record an event over 1 rank (this is rank 0): not a queue's own world"));
    CALL_OK(c, comm_send(c, s2, 4, 0));
    ASSERT_INT_EQ(comm_nccl_own_thread(c), -1);
    ASSERT_NOT_NULL(strstr(c->error, "the handle has work in flight (a group open, sends deferred)"));
    CALL_OK(c, comm_recv(c, r1, 4, 0));
    /* a group: transfers in any order */
    CALL_OK(c, comm_group_begin(c));
    CALL_OK(c, comm_recv(c, r1, N * sizeof *a, 0));
    CALL_OK(c, comm_send(c, s2, N * sizeof *a, 0));
    CALL_OK(c, comm_group_end(c));
    ASSERT_INT_EQ(dev_equals(r1, h2, N), 1);
    ASSERT_INT_EQ(comm_group_end(c), -1);
    ASSERT_NOT_NULL(strstr(c->error, "group_end without group_begin"));
    CALL_OK(c, comm_barrier(c));
    /* a host buffer is refused, and the world goes on */
    ASSERT_INT_EQ(c->v->all_reduce(c, h, N), -1);
    ASSERT_NOT_NULL(strstr(c->error, "is not device memory"));
    CALL_OK(c, comm_barrier(c));
    /* so is another GPU's memory, where there is another GPU (the world is
     * on GPU 0) */
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 1) {
        void *other = NULL;
        ASSERT_INT_EQ(cudaSetDevice(1), cudaSuccess);
        ASSERT_INT_EQ(cudaMalloc(&other, N * sizeof *h), cudaSuccess);
        ASSERT_INT_EQ(cudaSetDevice(0), cudaSuccess);
        ASSERT_INT_EQ(c->v->all_reduce(c, other, N), -1);
        ASSERT_NOT_NULL(strstr(c->error, "is memory of CUDA device 1, not of this communicator's GPU (0)"));
        ASSERT_INT_EQ(cudaFree(other), cudaSuccess);
        CALL_OK(c, comm_barrier(c));
    }
    /* split: a group of one, and none */
    comm *sub = NULL, *none = c;
    CALL_OK(c, comm_split(c, 3, 0, &sub));
    ASSERT_NOT_NULL(sub);
    ASSERT_INT_EQ(sub->size, 1);
    CALL_OK(sub, sub->v->all_reduce(sub, a, N));
    CALL_OK(c, comm_split(c, -1, 0, &none));
    ASSERT_NULL(none);
    comm_free(sub);
    cudaFree(a);
    cudaFree(b);
    cudaFree(s1);
    cudaFree(s2);
    cudaFree(r1);
    cudaFree(r2);
}

/* An ordered world's all-to-all: it returns while the stream's work
 * before it still runs (its counts are checked once back, not waited
 * for: 2 GB set on the stream first); with counts that disagree the
 * call may return before they are back, and then the watched wait for
 * the stream fails, naming them, and the world is aborted. */
static void ordered_all_to_all(comm *c, dev *d)
{
    static float h[N], h2[N];
    fill(h, N, 1.0f);
    fill(h2, N, 4.0f);
    float *a = dev_from(h, N), *b = dev_from(h2, N);
    size_t send = A2A, wrong = A2A - 1, big = (size_t)1 << 29;
    void *x = NULL;
    ASSERT_INT_EQ(cudaMalloc(&x, big), cudaSuccess);
    CALL_OK(c, comm_all_to_all(c, a, &send, b, &send)); /* (the first makes the handle's checks) */
    ASSERT_INT_EQ(dev_stream_sync(d, NULL), MESH_OK);
    for (int k = 0; k < 4; k++) /* 2 GB set: about 0.6 ms on an H200, far longer than the call's host side */
        ASSERT_INT_EQ(cudaMemsetAsync(x, k, big, NULL), cudaSuccess);
    CALL_OK(c, comm_all_to_all(c, a, &send, b, &send));
    ASSERT_INT_EQ(cudaStreamQuery(NULL), cudaErrorNotReady);
    ASSERT_INT_EQ(dev_stream_sync(d, NULL), MESH_OK);
    memcpy(h2, h, A2A * sizeof *h);
    ASSERT_INT_EQ(dev_equals(b, h2, N), 1);
    /* more all-to-alls in flight than a handle keeps checks for (32): the
     * 33rd waits for the first's counts. Back and forth between a and b,
     * each destination cleared on the stream just before: every call must
     * still run in its turn */
    ASSERT_INT_EQ(cudaMemsetAsync(x, 2, big, NULL), cudaSuccess);
    for (int k = 0; k < 40; k++) {
        ASSERT_INT_EQ(cudaMemsetAsync(k % 2 ? a : b, 0, A2A * sizeof *a, NULL), cudaSuccess);
        CALL_OK(c, comm_all_to_all(c, k % 2 ? b : a, &send, k % 2 ? a : b, &send));
    }
    ASSERT_INT_EQ(dev_stream_sync(d, NULL), MESH_OK);
    ASSERT_INT_EQ(dev_equals(a, h, N), 1);
    ASSERT_INT_EQ(dev_equals(b, h2, N), 1);
    cudaFree(x);
    const char *why = "";
    if (comm_all_to_all(c, a, &send, b, &wrong) != 0) why = c->error;
    else if (dev_stream_sync(d, NULL) == MESH_ERR_RANK) why = dev_last_error(d);
    if (!strstr(why, "rank 0 expected 36 floats from rank 0, which sends 37"))
        unit_fail(__FILE__, __LINE__, "all-to-all counts that disagree: '%s'", why);
    ASSERT_INT_EQ(comm_barrier(c), -1); /* aborted */
    ASSERT_NOT_NULL(strstr(c->error, "aborted"));
    cudaFree(a);
    cudaFree(b);
}

/* Every call, and again with the world ordered on the legacy stream (the
 * checks' copies are on it; the GPU's waits through a device watching the
 * world), which a GPU machine of one GPU runs for real. */
TEST_IMPL(comm_nccl_one_rank_calls)
{
    if (!comm_nccl_available(NULL, 0)) return; /* comm_nccl_available_says_why said SKIP */
    comm *c = one_rank_world(60);
    every_call(c, 0);
    comm_free(c);
    c = one_rank_world(60);
    CALL_OK(c, comm_nccl_order(c, NULL));
    dev *d = NULL;
    char err[200];
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_CUDA, 0, &d, err, sizeof err), MESH_OK);
    dev_set_watch(d, comm_nccl_watch, c);
    every_call(c, 1);
    ASSERT_INT_EQ(dev_stream_sync(d, NULL), MESH_OK);
    ordered_all_to_all(c, d);
    dev_set_watch(d, NULL, NULL);
    dev_close(d);
    comm_free(c);
}

TEST_IMPL(comm_nccl_world_over_threads)
{
    char err[320] = "";
    if (!comm_nccl_available(NULL, 0)) return;
    comm_threads_world *tw = comm_threads_world_new(1, 30);
    ASSERT_NOT_NULL(tw);
    comm *boot = comm_threads_rank(tw, 0);
    ASSERT_NOT_NULL(boot);
    comm *c = comm_nccl_world_mpi(boot, 0, 60, err, sizeof err);
    if (!c) fprintf(stderr, "# comm_nccl_world_mpi: %s\n", err);
    ASSERT_NOT_NULL(c);
    static float h[N];
    fill(h, N, 2.0f);
    float *a = dev_from(h, N);
    CALL_OK(c, c->v->all_reduce(c, a, N));
    ASSERT_INT_EQ(dev_equals(a, h, N), 1);
    cudaFree(a);
    comm_free(c);
    comm_free(boot);
}

/* A receive that no one sends fails: outside a group at once (a receive
 * from itself), in a group through NCCL (which refuses a receive from
 * itself without a send, or waits until the timeout), and that aborts the
 * world: the call and every later one fail, naming it; comm_abort, too. */
TEST_IMPL(comm_nccl_failure_aborts_the_world)
{
    if (!comm_nccl_available(NULL, 0)) return;
    comm *c = one_rank_world(5);
    static float h[N];
    fill(h, N, 0.0f);
    float *a = dev_from(h, N);
    ASSERT_INT_EQ(comm_recv(c, a, 16, 0), -1);
    ASSERT_NOT_NULL(strstr(c->error, "from itself (rank 0), which sent it nothing"));
    CALL_OK(c, comm_group_begin(c));
    CALL_OK(c, comm_recv(c, a, 16, 0));
    ASSERT_INT_EQ(comm_group_end(c), -1);
    fprintf(stderr, "# %s\n", c->error);
    ASSERT_NOT_NULL(strstr(c->error, "group over 1 rank (this is rank 0): "));
    ASSERT_NOT_NULL(strstr(c->error, "; the world's NCCL communicators are aborted"));
    ASSERT_INT_EQ(comm_barrier(c), -1);
    ASSERT_NOT_NULL(strstr(c->error, "barrier over 1 rank (this is rank 0): the world's NCCL communicators were "
                                     "aborted (rank 0 failed: group: "));
    comm_free(c);
    /* a bucket with a host buffer: refused half enqueued, so the world is aborted */
    c = one_rank_world(30);
    {
        float *bv[2] = {a, h};
        size_t nv[2] = {N, N};
        ASSERT_INT_EQ(c->v->all_reduce_v(c, bv, nv, 2), -1);
        ASSERT_NOT_NULL(strstr(c->error, "is not device memory"));
        ASSERT_NOT_NULL(strstr(c->error, "; the world's NCCL communicators are aborted"));
        ASSERT_INT_EQ(comm_barrier(c), -1);
    }
    comm_free(c);
    /* comm_abort */
    c = one_rank_world(30);
    comm_abort(c, "a test stops the world");
    ASSERT_INT_EQ(comm_barrier(c), -1);
    ASSERT_NOT_NULL(strstr(c->error, "(rank 0 failed: a test stops the world)"));
    comm_free(c);
    cudaFree(a);
}

/* A deferred communication queue's hooks, as the executor's
 * (exec_overlap.c): a mark on the legacy stream as a call is queued, which
 * the queue's stream waits for; a done event after each call, which the
 * legacy stream waits for at the end of the wait for its ticket. */
enum { Q_CALLS = 32, Q_SLOTS = 8 };
typedef struct q_events {
    cudaEvent_t mark[Q_SLOTS], done[Q_SLOTS];
} q_events;

static int q_mark(void *ud, long t, char *err, size_t n)
{
    q_events *e = ud;
    cudaError_t ce = cudaEventRecord(e->mark[t % Q_SLOTS], NULL);
    if (ce != cudaSuccess) snprintf(err, n, "cudaEventRecord: %s", cudaGetErrorString(ce));
    return ce == cudaSuccess ? 0 : -1;
}

static int q_wait(void *ud, long t, comm *c, char *err, size_t n)
{
    q_events *e = ud;
    if (comm_nccl_wait_event(c, e->mark[t % Q_SLOTS]) == 0) return 0;
    snprintf(err, n, "%s", c->error);
    return -1;
}

static int q_ran(void *ud, long t, comm *c, char *err, size_t n)
{
    q_events *e = ud;
    if (comm_nccl_record_event(c, e->done[t % Q_SLOTS]) == 0) return 0;
    snprintf(err, n, "%s", c->error);
    return -1;
}

static int q_joined(void *ud, long t, char *err, size_t n)
{
    q_events *e = ud;
    cudaError_t ce = cudaStreamWaitEvent(NULL, e->done[t % Q_SLOTS], 0);
    if (ce != cudaSuccess) snprintf(err, n, "cudaStreamWaitEvent: %s", cudaGetErrorString(ce));
    return ce == cudaSuccess ? 0 : -1;
}

/* A queue's communicator (comm_nccl_own_thread): a split with a world of
 * its own, which another thread uses while the rank's world has a group
 * open (in one shared world, that thread's call would join the group and
 * return before its sum ran); its comm_abort, from the rank's thread,
 * is done by the thread using it at its next call. Over comm_async too,
 * and a deferred comm_async (comm_async_hooks.deferred) ordered on the
 * legacy stream. */
typedef struct own_job {
    comm *s;
    float *a;
    int rc_sum, rc_after_abort;
    char error[1100];
} own_job;

static void *own_sum(void *arg)
{
    own_job *j = arg;
    j->rc_sum = j->s->v->all_reduce(j->s, j->a, N);
    return NULL;
}

static void *own_barrier(void *arg)
{
    own_job *j = arg;
    j->rc_after_abort = comm_barrier(j->s);
    snprintf(j->error, sizeof j->error, "%s", j->s->error);
    return NULL;
}

TEST_IMPL(comm_nccl_queue_on_its_own_world)
{
    if (!comm_nccl_available(NULL, 0)) return;
    comm *c = one_rank_world(30);
    ASSERT_INT_EQ(comm_async_supported(c), 1);
    own_job j = {0};
    CALL_OK(c, comm_split(c, 0, 0, &j.s));
    ASSERT_NOT_NULL(j.s);
    CALL_OK(j.s, comm_nccl_own_thread(j.s));
    static float h[N];
    fill(h, N, 1.0f);
    j.a = dev_from(h, N);
    float *b = dev_from(h, N);
    CALL_OK(c, comm_group_begin(c));
    CALL_OK(c, c->v->all_reduce(c, b, N)); /* enqueued in the rank's group */
    pthread_t t;
    ASSERT_INT_EQ(pthread_create(&t, NULL, own_sum, &j), 0);
    pthread_join(t, NULL);
    ASSERT_INT_EQ(j.rc_sum, 0);
    ASSERT_INT_EQ(dev_equals(j.a, h, N), 1); /* done when the call returned */
    CALL_OK(c, comm_group_end(c));
    ASSERT_INT_EQ(dev_equals(b, h, N), 1);
    comm_abort(j.s, "the rank failed"); /* asked from this thread, done by the other */
    ASSERT_INT_EQ(pthread_create(&t, NULL, own_barrier, &j), 0);
    pthread_join(t, NULL);
    ASSERT_INT_EQ(j.rc_after_abort, -1);
    ASSERT_NOT_NULL(strstr(j.error, "(rank 0 failed: the rank failed)"));
    CALL_OK(c, comm_barrier(c)); /* the rank's world goes on */
    comm_free(j.s);
    /* a queue over it: its calls on the queue's thread, the sums right */
    comm_async *q = NULL;
    CALL_OK(c, comm_async_new(c, NULL, &q));
    float *g = dev_from(h, N);
    long tk = comm_async_all_gather(q, j.a, g, N); /* one rank: a copy, through NCCL */
    ASSERT_INT_EQ(tk, 1);
    ASSERT_INT_EQ(comm_async_wait_all(q), 0);
    ASSERT_INT_EQ(dev_equals(g, h, N), 1);
    comm_async_free(q);
    /* a deferred queue: each gather's input written on the legacy stream
     * just before it is queued, its output read there after the wait (so
     * a GPU with one rank runs the executor's ordering of its queue) */
    q_events e;
    memset(&e, 0, sizeof e);
    for (int i = 0; i < Q_SLOTS; i++) {
        ASSERT_INT_EQ(cudaEventCreateWithFlags(&e.mark[i], cudaEventDisableTiming), cudaSuccess);
        ASSERT_INT_EQ(cudaEventCreateWithFlags(&e.done[i], cudaEventDisableTiming), cudaSuccess);
    }
    comm_async_hooks hooks = {q_mark, q_wait, q_ran, q_joined, &e, Q_SLOTS, 1};
    CALL_OK(c, comm_async_new(c, &hooks, &q));
    static float got[N];
    size_t busy_n = (size_t)1 << 24; /* 64 MB set before each write: the stream is still busy as the call queues */
    float *busy = NULL;
    ASSERT_INT_EQ(cudaMalloc((void **)&busy, busy_n * sizeof *busy), cudaSuccess);
    for (int k = 0; k < 12; k++) {
        fill(h, N, (float)k);
        ASSERT_INT_EQ(cudaMemsetAsync(busy, k, busy_n * sizeof *busy, NULL), cudaSuccess);
        ASSERT_INT_EQ(cudaMemsetAsync(j.a, 0xff, N * sizeof *j.a, NULL), cudaSuccess);
        ASSERT_INT_EQ(cudaMemcpyAsync(j.a, h, N * sizeof *j.a, cudaMemcpyHostToDevice, NULL), cudaSuccess);
        long tick = comm_async_all_gather(q, j.a, g, N);
        ASSERT_INT_EQ(tick, k + 1);
        ASSERT_INT_EQ(comm_async_wait(q, tick), 0);
        ASSERT_INT_EQ(cudaMemcpyAsync(got, g, N * sizeof *g, cudaMemcpyDeviceToHost, NULL), cudaSuccess);
        ASSERT_INT_EQ(cudaMemsetAsync(g, 0, N * sizeof *g, NULL), cudaSuccess); /* (after the read, on the stream) */
        ASSERT_INT_EQ(cudaStreamSynchronize(NULL), cudaSuccess);
        ASSERT_INT_EQ(memcmp(got, h, sizeof got), 0);
    }
    ASSERT_INT_EQ(comm_async_wait_all(q), 0);
    comm_async_free(q);
    for (int i = 0; i < Q_SLOTS; i++) {
        cudaEventDestroy(e.mark[i]);
        cudaEventDestroy(e.done[i]);
    }
    cudaFree(busy);
    cudaFree(g);
    cudaFree(b);
    cudaFree(j.a);
    comm_free(c);
}

/* A world of 2 whose rank 1 never comes (NCCL_COMM_ID: no rendezvous,
 * NCCL's own bootstrap waits) fails after the timeout, not later. */
TEST_IMPL(comm_nccl_world_times_out_without_its_ranks)
{
    char err[320] = "", id[64];
    if (!comm_nccl_available(NULL, 0)) return;
    snprintf(id, sizeof id, "127.0.0.1:%d", free_port());
    ASSERT_INT_EQ(setenv("NCCL_COMM_ID", id, 1), 0);
    ASSERT_NULL(comm_nccl_world(0, 2, 0, 3, err, sizeof err));
    ASSERT_STR_EQ(err, "ncclCommInitRankConfig (rank 0 of 2): the other ranks did not come within 3 s "
                       "(MESH_COLLECTIVE_TIMEOUT_S)");
}

/* A rank of a world of 2 being made (comm_nccl_world_names_a_rank_without_its_gpu):
 * over the TCP rendezvous, or (tw) over a threads world. */
typedef struct boot_job {
    comm_threads_world *tw;
    int rank, device;
    comm *c;
    char err[400];
} boot_job;

static void *boot_rank(void *arg)
{
    boot_job *j = arg;
    if (!j->tw) {
        j->c = comm_nccl_world(j->rank, 2, j->device, 10, j->err, sizeof j->err);
        return NULL;
    }
    comm *boot = comm_threads_rank(j->tw, j->rank);
    if (!boot) {
        snprintf(j->err, sizeof j->err, "comm_threads_rank failed");
        return NULL;
    }
    j->c = comm_nccl_world_mpi(boot, j->device, 10, j->err, sizeof j->err);
    comm_free(boot);
    return NULL;
}

/* A world of 2 (ranks as threads of this process) whose rank 1 names a
 * GPU that is not there (a LOCAL_RANK past the machine's GPUs, say):
 * both ranks fail at once (well within the worlds' 10 s timeout), before
 * NCCL is asked for anything, rank 1 saying why and rank 0 naming rank 1;
 * over the TCP rendezvous, then over a threads world. One GPU is enough. */
TEST_IMPL(comm_nccl_world_names_a_rank_without_its_gpu)
{
    int gpus = 0;
    char want[200];
    if (!comm_nccl_available(NULL, 0)) return;
    ASSERT_INT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
    snprintf(want, sizeof want, "rank 1 cannot use GPU %d: cudaSetDevice(%d): ", gpus, gpus);
    for (int over_threads = 0; over_threads < 2; over_threads++) {
        boot_job j[2];
        pthread_t t[2];
        memset(j, 0, sizeof j);
        if (!over_threads) rendezvous_here();
        comm_threads_world *tw = over_threads ? comm_threads_world_new(2, 10) : NULL;
        ASSERT_INT_EQ(!over_threads || tw, 1);
        double t0 = comm_now();
        for (int r = 0; r < 2; r++) {
            j[r].tw = tw;
            j[r].rank = r;
            j[r].device = r == 0 ? 0 : gpus; /* one past the last */
            ASSERT_INT_EQ(pthread_create(&t[r], NULL, boot_rank, &j[r]), 0);
        }
        for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
        double took = comm_now() - t0;
        printf("# %s, %.2f s: rank 0: %s; rank 1: %s\n", over_threads ? "threads" : "tcp", took, j[0].err,
               j[1].err);
        ASSERT_INT_LT(took, 5);
        ASSERT_NULL(j[0].c);
        ASSERT_NULL(j[1].c);
        ASSERT_STR_EQ(j[0].err, "rank 1 cannot use its GPU (or make the NCCL id): see its error");
        ASSERT_INT_EQ(strncmp(j[1].err, want, strlen(want)), 0);
    }
}

/* ---- worlds of several ranks: threads of this process, a GPU each ---- */

enum { RANKS_MAX = 4, M = 96 };

typedef struct rank_job {
    comm_threads_world *tw;
    int rank, size;
    double timeout_s;
    int abort_host; /* rank_fails: rank 1 aborts the threads world (else its NCCL world); rank_queue: -1, no
                       rank fails */
    int ordered;    /* the world's calls ordered on the legacy stream (comm_nccl_order) */
    int pending;    /* rank_calls, ordered: calls after which the stream still had work */
    int failed_at; /* 0, or the line of the first failed check */
    char error[1400];
} rank_job;

/* A check inside a rank's thread: records the first failure and returns
 * (the threads must not stop the process as ASSERT does). */
#define RCHECK(j, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (!(j)->failed_at) {                                                                 \
                (j)->failed_at = __LINE__;                                                         \
                snprintf((j)->error, sizeof (j)->error, __VA_ARGS__);                              \
            }                                                                                      \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define RCALL(j, c, call) RCHECK(j, (call) == 0, "%s: %s", #call, (c)->error)

static float *gpu_alloc(size_t n)
{
    void *d = NULL;
    return cudaMalloc(&d, n * sizeof(float)) == cudaSuccess ? d : NULL;
}

/* An ordered world's rank: its device, whose waits watch the world (a
 * rank whose checks fail leaves, and the others' waits then end). */
static _Thread_local dev *t_watched;

static int dev_get(float *host, const float *d, size_t n)
{
    if (t_watched && dev_stream_sync(t_watched, NULL) != MESH_OK) return -1;
    return cudaMemcpy(host, d, n * sizeof *host, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

static int dev_put(float *d, const float *host, size_t n)
{
    return cudaMemcpy(d, host, n * sizeof *host, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}

/* The first i where got and want differ, or -1. */
static long differs(const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) return (long)i;
    return -1;
}

/* Every call of a world of size ranks, against values worked out here (small
 * integers: every order of summing gives the same floats). */
static void *rank_calls(void *arg)
{
    rank_job *j = arg;
    int r = j->rank, p = j->size;
    char err[320] = "";
    float h[RANKS_MAX * M], want[RANKS_MAX * M], got[RANKS_MAX * M];
    /* (the buffers on the rank's GPU, its world's: NCCL takes no other GPU's) */
    float *a = cudaSetDevice(r) == cudaSuccess ? gpu_alloc(RANKS_MAX * M) : NULL, *b = gpu_alloc(RANKS_MAX * M);
    comm *boot = comm_threads_rank(j->tw, r), *c = NULL, *sub = NULL;
    long bad;
    RCHECK(j, a && b && boot, "cudaSetDevice, cudaMalloc or comm_threads_rank failed");
    c = comm_nccl_world_mpi(boot, r, j->timeout_s, err, sizeof err);
    RCHECK(j, c, "comm_nccl_world_mpi: %s", err);
    RCHECK(j, c->rank == r && c->size == p, "rank %d of %d, not %d of %d", c->rank, c->size, r, p);
    /* ordered: every call below runs between the legacy stream's copies
     * (cudaMemcpy, cudaMemset), with no wait of the host's between them */
    RCHECK(j, !j->ordered || comm_nccl_order(c, NULL) == 0, "comm_nccl_order: %s", c->error);
    if (j->ordered) {
        RCHECK(j, dev_open(MESH_DEVICE_CUDA, r, &t_watched, err, sizeof err) == MESH_OK, "dev_open: %s", err);
        dev_set_watch(t_watched, comm_nccl_watch, c);
    }

    /* all-reduce, a few times: a blocking call leaves nothing on the
     * stream; an ordered one returns before its peers have come (on some
     * rank, some time: the test asks for one of the ranks' 8 each). Every
     * other time the buffer is
     * cleared on the stream just before: an ordered call starts after
     * that, a blocking one after the host's wait for it. */
    for (int i = 0; i < M; i++) h[i] = (float)(r + i % 7);
    for (int k = 0; k < 8; k++) {
        for (int i = 0; i < M; i++) want[i] = k % 2 ? 0.0f : (float)(p * (p - 1) / 2 + p * (i % 7));
        RCHECK(j, dev_put(a, h, M) == 0, "copy");
        if (k % 2)
            RCHECK(j, cudaMemsetAsync(a, 0, M * sizeof *a, NULL) == cudaSuccess &&
                          (j->ordered || cudaStreamSynchronize(NULL) == cudaSuccess), "clearing");
        RCALL(j, c, comm_all_reduce(c, a, M));
        cudaError_t q = cudaStreamQuery(NULL);
        RCHECK(j, q == cudaSuccess || (j->ordered && q == cudaErrorNotReady), "after the all-reduce: %s",
               cudaGetErrorString(q));
        j->pending += q == cudaErrorNotReady;
        RCHECK(j, dev_get(got, a, M) == 0, "copy");
        RCHECK(j, (bad = differs(got, want, M)) < 0, "all-reduce: [%ld] = %g, not %g", bad, got[bad], want[bad]);
    }

    /* reduce-scatter, apart and in place (out = in + rank x M) */
    for (int i = 0; i < p * M; i++) h[i] = (float)(r * 10 + i % 11);
    for (int i = 0; i < M; i++) want[i] = (float)(10 * p * (p - 1) / 2 + p * ((r * M + i) % 11));
    RCHECK(j, dev_put(a, h, (size_t)p * M) == 0, "copy");
    RCALL(j, c, comm_reduce_scatter(c, a, b, M));
    RCHECK(j, dev_get(got, b, M) == 0, "copy");
    RCHECK(j, (bad = differs(got, want, M)) < 0, "reduce-scatter: [%ld] = %g, not %g", bad, got[bad], want[bad]);
    RCALL(j, c, comm_reduce_scatter(c, a, a + (size_t)r * M, M));
    RCHECK(j, dev_get(got, a + (size_t)r * M, M) == 0, "copy");
    RCHECK(j, (bad = differs(got, want, M)) < 0, "reduce-scatter in place: [%ld] = %g", bad, got[bad]);

    /* all-gather, apart and in place (in = out + rank x M) */
    for (int i = 0; i < M; i++) h[i] = (float)(r * 100 + i);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < M; i++) want[q * M + i] = (float)(q * 100 + i);
    RCHECK(j, dev_put(a, h, M) == 0, "copy");
    RCALL(j, c, comm_all_gather(c, a, b, M));
    RCHECK(j, dev_get(got, b, (size_t)p * M) == 0, "copy");
    RCHECK(j, (bad = differs(got, want, (size_t)p * M)) < 0, "all-gather: [%ld] = %g", bad, got[bad]);
    RCHECK(j, dev_put(b + (size_t)r * M, h, M) == 0, "copy");
    RCALL(j, c, comm_all_gather(c, b + (size_t)r * M, b, M));
    RCHECK(j, dev_get(got, b, (size_t)p * M) == 0, "copy");
    RCHECK(j, (bad = differs(got, want, (size_t)p * M)) < 0, "all-gather in place: [%ld] = %g", bad, got[bad]);

    /* buckets: two buffers in one NCCL group each time */
    {
        size_t nv[2] = {(size_t)p * 8, (size_t)p * 4};
        float *bv[2] = {a, b};
        for (int i = 0; i < p * 8; i++) h[i] = (float)(r + 1);
        RCHECK(j, dev_put(a, h, nv[0]) == 0 && dev_put(b, h, nv[1]) == 0, "copy");
        RCALL(j, c, comm_all_reduce_v(c, bv, nv, 2)); /* every element: p (p + 1) / 2 */
        RCALL(j, c, comm_reduce_scatter_v(c, bv, nv, 2)); /* own part: p x that */
        RCALL(j, c, comm_all_gather_v(c, bv, nv, 2));     /* every part */
        RCHECK(j, dev_get(got, a, nv[0]) == 0 && dev_get(got + nv[0], b, nv[1]) == 0, "copy");
        for (size_t i = 0; i < nv[0] + nv[1]; i++) want[i] = (float)(p * p * (p + 1) / 2);
        RCHECK(j, (bad = differs(got, want, nv[0] + nv[1])) < 0, "buckets: [%ld] = %g, not %g", bad, got[bad],
               want[bad]);
    }

    /* broadcast of bytes from the last rank */
    for (int i = 0; i < M; i++) h[i] = (float)(r == p - 1 ? 7 * i : -1);
    for (int i = 0; i < M; i++) want[i] = (float)(7 * i);
    RCHECK(j, dev_put(a, h, M) == 0, "copy");
    RCALL(j, c, comm_broadcast(c, a, M * sizeof *a, p - 1));
    RCHECK(j, dev_get(got, a, M) == 0, "copy");
    RCHECK(j, (bad = differs(got, want, M)) < 0, "broadcast: [%ld] = %g", bad, got[bad]);

    /* all-to-all with counts that differ per pair: q gets (r + q) % 3 + 1
     * floats r x 100 + q x 10 + k from r */
    {
        size_t send[RANKS_MAX], recv[RANKS_MAX], at = 0;
        for (int q = 0; q < p; q++) {
            send[q] = (size_t)((r + q) % 3 + 1);
            recv[q] = (size_t)((q + r) % 3 + 1);
            for (size_t k = 0; k < send[q]; k++) h[at++] = (float)(r * 100 + q * 10 + (int)k);
        }
        RCHECK(j, dev_put(a, h, at) == 0, "copy");
        RCALL(j, c, comm_all_to_all(c, a, send, b, recv));
        at = 0;
        for (int q = 0; q < p; q++)
            for (size_t k = 0; k < recv[q]; k++) want[at++] = (float)(q * 100 + r * 10 + (int)k);
        RCHECK(j, dev_get(got, b, at) == 0, "copy");
        RCHECK(j, (bad = differs(got, want, at)) < 0, "all-to-all: [%ld] = %g, not %g", bad, got[bad], want[bad]);
        /* rank 0 expects one float too many from rank 1: every rank fails, the world goes on
         * (ordered, the counts are checked after the fact: rank_counts_ordered) */
        if (r == 0) recv[1]++;
        RCHECK(j, j->ordered || comm_all_to_all(c, a, send, b, recv) == -1, "all-to-all with wrong counts passed");
        RCHECK(j, j->ordered || strstr(c->error, r == 0 ? "rank 0 expected 3 floats from rank 1, which sends 2"
                                                        : "rank 0 expected other counts"),
               "all-to-all with wrong counts: %s", c->error);
    }

    /* eager sends around the ring, then a pipeline's exchange in a group */
    {
        int next = (r + 1) % p, prev = (r + p - 1) % p;
        for (int i = 0; i < M; i++) h[i] = (float)(r * 1000 + i);
        for (int i = 0; i < M; i++) want[i] = (float)(prev * 1000 + i);
        for (int k = 0; k < 8; k++) { /* (ordered: the memset must come after the send's copy, on the GPU) */
            RCHECK(j, dev_put(a, h, M) == 0, "copy");
            RCALL(j, c, comm_send(c, a, M * sizeof *a, next));
            RCHECK(j, cudaMemset(a, 0, M * sizeof *a) == cudaSuccess, "memset"); /* the send copied it */
            RCALL(j, c, comm_recv(c, b, M * sizeof *b, prev));
            RCHECK(j, dev_get(got, b, M) == 0, "copy");
            RCHECK(j, (bad = differs(got, want, M)) < 0, "ring: [%ld] = %g", bad, got[bad]);
        }
        RCHECK(j, dev_put(a, h, M) == 0, "copy");
        RCALL(j, c, comm_group_begin(c));
        RCALL(j, c, comm_recv(c, b, M * sizeof *b, prev));
        RCALL(j, c, comm_send(c, a, M * sizeof *a, next));
        RCALL(j, c, comm_group_end(c));
        RCHECK(j, dev_get(got, b, M) == 0, "copy");
        RCHECK(j, (bad = differs(got, want, M)) < 0, "group exchange: [%ld] = %g", bad, got[bad]);
    }
    RCALL(j, c, comm_barrier(c));

    /* split by parity, keys reversing the order: sums within each part */
    RCALL(j, c, comm_split(c, r % 2, -r, &sub));
    RCHECK(j, sub != NULL, "no split");
    {
        int n = 0, mine = 0, sum = 0;
        for (int q = r % 2; q < p; q += 2) {
            n++;
            sum += q;
            if (q > r) mine++; /* higher ranks come first */
        }
        RCHECK(j, sub->size == n && sub->rank == mine, "split: rank %d of %d, not %d of %d", sub->rank, sub->size,
               mine, n);
        h[0] = (float)r;
        RCHECK(j, dev_put(a, h, 1) == 0, "copy");
        RCALL(j, sub, comm_all_reduce(sub, a, 1));
        RCHECK(j, dev_get(got, a, 1) == 0 && got[0] == (float)sum, "split's all-reduce: %g, not %d", got[0], sum);
    }

    /* bf16 elements: the all-reduce sums 2-byte floats */
    {
        uint16_t hb[M], gb[M];
        float *x = gpu_alloc(M);
        RCHECK(j, x != NULL, "cudaMalloc");
        for (int i = 0; i < M; i++) hb[i] = (uint16_t)(0x3f80 + 0x80 * (i % 3)); /* 1, 2, 4 */
        RCHECK(j, comm_nccl_set_elements(c, COMM_BF16) == 0, "comm_nccl_set_elements");
        RCHECK(j, cudaMemcpy(x, hb, sizeof hb, cudaMemcpyHostToDevice) == cudaSuccess, "copy");
        RCALL(j, c, comm_all_reduce(c, x, M));
        RCHECK(j, cudaMemcpy(gb, x, sizeof gb, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
        cudaFree(x);
        for (int i = 0; i < M; i++) {
            float g, w = (float)(p << (i % 3));
            uint32_t bits = (uint32_t)gb[i] << 16;
            memcpy(&g, &bits, sizeof g);
            RCHECK(j, g == w, "bf16 all-reduce: [%d] = %g, not %g", i, g, w);
        }
        RCHECK(j, comm_nccl_set_elements(c, COMM_F32) == 0, "comm_nccl_set_elements");
    }
out:
    if (t_watched) dev_set_watch(t_watched, NULL, NULL);
    dev_close(t_watched);
    t_watched = NULL;
    if (sub) comm_free(sub);
    if (c) comm_free(c);
    if (boot) comm_free(boot);
    cudaFree(a);
    cudaFree(b);
    return NULL;
}

/* A rank that fails: with abort_host 0 it aborts its NCCL world only, and
 * the others' next call fails at their timeout (which stops the threads
 * world too, naming the timeout); with abort_host 1 it
 * aborts the threads world the NCCL one was bootstrapped over (as a
 * failing rank of meshrun's does), and the others' waits end at once,
 * naming it. Neither hangs. */
static void *rank_fails(void *arg)
{
    rank_job *j = arg;
    char err[320] = "";
    comm *boot = comm_threads_rank(j->tw, j->rank), *c = NULL;
    RCHECK(j, boot, "comm_threads_rank");
    c = comm_nccl_world_mpi(boot, j->rank, j->timeout_s, err, sizeof err);
    RCHECK(j, c, "comm_nccl_world_mpi: %s", err);
    RCALL(j, c, comm_barrier(c));
    /* every rank is through that barrier before rank 1 stops (else a rank
     * still waiting in it may see the abort first, and rightly fail it) */
    RCALL(j, boot, comm_barrier(boot));
    if (j->rank == 1) {
        comm_abort(j->abort_host ? boot : c, "rank 1 stops");
        if (j->abort_host) goto out; /* its thread ends, as a failed rank's does (its barrier would meet theirs) */
    } else {
        double t0 = comm_now();
        RCHECK(j, comm_barrier(c) == -1, "a barrier without rank 1 passed");
        const char *want = j->abort_host ? "another rank failed (rank 1 failed: rank 1 stops)" : "waited more than";
        RCHECK(j, strstr(c->error, want), "%s", c->error);
        RCHECK(j, comm_now() - t0 < (j->abort_host ? 5 : j->timeout_s + 5), "the barrier failed after %g s",
               comm_now() - t0);
        /* an NCCL call that fails stops the world it was bootstrapped over
         * too, before its own abort (which may wait for the others') */
        char why[256] = "";
        RCHECK(j, comm_threads_aborted(j->tw, why, sizeof why) && strstr(why, j->abort_host ? "rank 1 stops" :
                                                                                               "waited more than"),
               "the threads world: %s", why[0] ? why : "not stopped");
    }
    RCHECK(j, comm_barrier(c) == -1, "a call after the abort passed");
    RCHECK(j, strstr(c->error, "aborted"), "%s", c->error);
out:
    if (c) comm_free(c);
    if (boot) comm_free(boot);
    return NULL;
}

/* The end of an ordered world's rank: its watched device, world and
 * threads handle (each may be NULL) go. */
static void ordered_rank_end(dev *d, comm *c, comm *boot)
{
    if (d) dev_set_watch(d, NULL, NULL);
    dev_close(d);
    if (c) comm_free(c);
    if (boot) comm_free(boot);
}

/* An ordered world's rank that fails while the others' host waits for
 * their stream, on which an all-reduce waits for it: their watched wait
 * (dev_set_watch, comm_nccl_watch) ends, at once when it aborted the
 * threads world (abort_host), else at the timeout, naming the call; the
 * world is aborted. */
static void *rank_fails_ordered(void *arg)
{
    rank_job *j = arg;
    char err[320] = "";
    comm *boot = comm_threads_rank(j->tw, j->rank), *c = NULL;
    dev *d = NULL;
    float *a = cudaSetDevice(j->rank) == cudaSuccess ? gpu_alloc(M) : NULL;
    RCHECK(j, boot && a, "comm_threads_rank, cudaSetDevice or cudaMalloc");
    c = comm_nccl_world_mpi(boot, j->rank, j->timeout_s, err, sizeof err);
    RCHECK(j, c, "comm_nccl_world_mpi: %s", err);
    RCHECK(j, dev_open(MESH_DEVICE_CUDA, j->rank, &d, err, sizeof err) == MESH_OK, "dev_open: %s", err);
    RCALL(j, c, comm_nccl_order(c, NULL));
    dev_set_watch(d, comm_nccl_watch, c);
    RCALL(j, c, comm_barrier(c));
    if (j->rank != 1) RCALL(j, c, comm_all_reduce(c, a, M)); /* enqueued: it waits for rank 1 on the GPU */
    RCALL(j, boot, comm_barrier(boot));
    if (j->rank == 1) {
        comm_abort(j->abort_host ? boot : c, "rank 1 stops");
        goto out;
    }
    double t0 = comm_now();
    RCHECK(j, dev_stream_sync(d, NULL) == MESH_ERR_RANK, "the wait for the stream passed without rank 1");
    const char *want = j->abort_host ? "another rank failed (rank 1 failed: rank 1 stops)" : "waited more than";
    RCHECK(j, strstr(dev_last_error(d), want) && strstr(dev_last_error(d), "all-reduce"), "%s", dev_last_error(d));
    RCHECK(j, comm_now() - t0 < (j->abort_host ? 5 : j->timeout_s + 5), "the wait failed after %g s",
           comm_now() - t0);
    RCHECK(j, comm_all_reduce(c, a, M) == -1 && strstr(c->error, "aborted"), "a call after the abort: %s", c->error);
    RCHECK(j, dev_stream_sync(d, NULL) == MESH_OK, "the stream after the abort: %s", dev_last_error(d)); /* ended */
out:
    ordered_rank_end(d, c, boot);
    cudaFree(a);
    return NULL;
}

/* A deferred queue over a world of ranks. Q_CALLS all-reduces, each of a
 * buffer cleared, then written, on the legacy stream just before it is
 * queued (the queue's stream must wait for those), read back on that
 * stream after the wait for its ticket (which must wait for the sum):
 * neither host waits for the GPU, and some waits return before their
 * sum is done (pending). Then (abort_host >= 0) rank 1 fails with a sum in
 * flight on the others' queues: their threads notice it on their own
 * (abort_host 1: the threads world stopped, at once; 0: the timeout),
 * fail the queue naming the call, and abort its world, which ends the sum
 * the legacy stream waits for. */
static void *rank_queue(void *arg)
{
    rank_job *j = arg;
    int r = j->rank, p = j->size;
    char err[320] = "";
    q_events e;
    memset(&e, 0, sizeof e);
    comm *boot = comm_threads_rank(j->tw, r), *c = NULL;
    comm_async *q = NULL;
    float *a = cudaSetDevice(r) == cudaSuccess ? gpu_alloc((size_t)Q_CALLS * M) : NULL, h[M], want[M], got[M];
    long bad;
    RCHECK(j, boot && a, "comm_threads_rank, cudaSetDevice or cudaMalloc");
    for (int i = 0; i < Q_SLOTS; i++)
        RCHECK(j, cudaEventCreateWithFlags(&e.mark[i], cudaEventDisableTiming) == cudaSuccess &&
                      cudaEventCreateWithFlags(&e.done[i], cudaEventDisableTiming) == cudaSuccess, "events");
    c = comm_nccl_world_mpi(boot, r, j->timeout_s, err, sizeof err);
    RCHECK(j, c, "comm_nccl_world_mpi: %s", err);
    comm_async_hooks hooks = {q_mark, q_wait, q_ran, q_joined, &e, Q_SLOTS, 1};
    RCALL(j, c, comm_async_new(c, &hooks, &q));
    for (int k = 0; k < Q_CALLS; k++) {
        float *x = a + (size_t)k * M;
        for (int i = 0; i < M; i++) h[i] = (float)(r + k + i % 5);
        RCHECK(j, cudaMemsetAsync(x, 0xff, M * sizeof *x, NULL) == cudaSuccess &&
                      cudaMemcpyAsync(x, h, M * sizeof *x, cudaMemcpyHostToDevice, NULL) == cudaSuccess, "writing");
        long t = comm_async_all_reduce(q, x, M);
        RCHECK(j, t == k + 1, "ticket %ld, not %d: %s", t, k + 1, comm_async_error(q));
        RCHECK(j, comm_async_wait(q, t) == 0, "wait: %s", comm_async_error(q));
        j->pending += cudaEventQuery(e.done[t % Q_SLOTS]) == cudaErrorNotReady;
        RCHECK(j, cudaMemcpyAsync(got, x, M * sizeof *x, cudaMemcpyDeviceToHost, NULL) == cudaSuccess &&
                      cudaStreamSynchronize(NULL) == cudaSuccess, "reading");
        for (int i = 0; i < M; i++) want[i] = (float)(p * (p - 1) / 2 + p * (k + i % 5));
        RCHECK(j, (bad = differs(got, want, M)) < 0, "sum %d: [%ld] = %g, not %g", k, bad, got[bad], want[bad]);
    }
    RCHECK(j, comm_async_wait_all(q) == 0, "%s", comm_async_error(q));
    if (j->abort_host < 0) goto out;
    RCALL(j, boot, comm_barrier(boot)); /* (every rank's sums done) */
    if (r != 1) /* enqueued: it waits for rank 1 on the GPU */
        RCHECK(j, comm_async_all_reduce(q, a, M) > 0 && comm_async_wait(q, Q_CALLS + 1) == 0, "queued: %s",
               comm_async_error(q));
    RCALL(j, boot, comm_barrier(boot));
    if (r == 1) {
        if (j->abort_host) comm_abort(boot, "rank 1 stops");
        goto out;
    }
    double t0 = comm_now();
    while (comm_async_pending(q) > 0 && comm_now() - t0 < j->timeout_s + 10) comm_sleep(1e-3);
    const char *why = j->abort_host ? "another rank failed (rank 1 failed: rank 1 stops)" : "waited more than";
    RCHECK(j, strstr(comm_async_error(q), why) && strstr(comm_async_error(q), "all-reduce"), "the queue: '%s'",
           comm_async_error(q));
    RCHECK(j, comm_now() - t0 < (j->abort_host ? 5 : j->timeout_s + 5), "failed after %g s", comm_now() - t0);
    RCHECK(j, comm_async_all_reduce(q, a, M) == -1, "a call after the failure was queued");
    RCHECK(j, cudaStreamSynchronize(NULL) == cudaSuccess, "the legacy stream after the abort"); /* its wait ended */
out:
    comm_async_free(q);
    if (c) comm_free(c);
    if (boot) comm_free(boot);
    for (int i = 0; i < Q_SLOTS; i++) {
        if (e.mark[i]) cudaEventDestroy(e.mark[i]);
        if (e.done[i]) cudaEventDestroy(e.done[i]);
    }
    cudaFree(a);
    return NULL;
}

/* An ordered world's all-to-all whose counts disagree (rank 0 expects one
 * float too many from rank 1): rank 0's call, or its watched wait for the
 * stream after it, fails naming them (the counts are checked once back)
 * and aborts its world; it then stops the threads world, as a failing
 * rank of meshrun does, and every other rank's next wait or call fails. */
static void *rank_counts_ordered(void *arg)
{
    rank_job *j = arg;
    char err[320] = "";
    comm *boot = comm_threads_rank(j->tw, j->rank), *c = NULL;
    dev *d = NULL;
    float *a = cudaSetDevice(j->rank) == cudaSuccess ? gpu_alloc(4 * RANKS_MAX) : NULL, *b = gpu_alloc(4 * RANKS_MAX);
    size_t send[RANKS_MAX], recv[RANKS_MAX];
    RCHECK(j, boot && a && b, "comm_threads_rank, cudaSetDevice or cudaMalloc");
    c = comm_nccl_world_mpi(boot, j->rank, j->timeout_s, err, sizeof err);
    RCHECK(j, c, "comm_nccl_world_mpi: %s", err);
    RCHECK(j, dev_open(MESH_DEVICE_CUDA, j->rank, &d, err, sizeof err) == MESH_OK, "dev_open: %s", err);
    RCALL(j, c, comm_nccl_order(c, NULL));
    dev_set_watch(d, comm_nccl_watch, c);
    for (int q = 0; q < j->size; q++) send[q] = recv[q] = 2;
    if (j->rank == 0) {
        recv[1]++;
        const char *why = "";
        if (comm_all_to_all(c, a, send, b, recv) != 0) why = c->error;
        else if (dev_stream_sync(d, NULL) == MESH_ERR_RANK) why = dev_last_error(d);
        RCHECK(j, strstr(why, "rank 0 expected 3 floats from rank 1, which sends 2"), "rank 0: '%s'", why);
        comm_abort(boot, "its all-to-all's counts disagree");
        goto out;
    }
    int st = comm_all_to_all(c, a, send, b, recv);
    if (st == 0) st = dev_stream_sync(d, NULL) != MESH_OK; /* (rank 1's transfer from rank 0 may fail in NCCL) */
    if (st == 0) st = comm_barrier(c);                     /* with rank 0: it stopped the threads world */
    RCHECK(j, st != 0, "rank %d went on after rank 0's counts disagreed", j->rank);
out:
    ordered_rank_end(d, c, boot);
    cudaFree(a);
    cudaFree(b);
    return NULL;
}

/* Sends on the ring's channels (comm_nccl_channels): each rank sends K
 * messages to its next rank and K to its previous one before it receives
 * any, each buffer rewritten at once (the send copied it), then receives
 * them in the order they were sent. Without channels this waits for ever:
 * the deferred sends go out in one NCCL group with the first receive,
 * which ends only once the peers have received them all. A send to a
 * rank two away (no channel) stays deferred; a channel's call is refused
 * in a group; the flush waits for the channels' sends. With abort_host 0
 * and a short timeout, rank 0's send that rank 1 never receives ends in
 * the flush's timeout naming the send, and the others' next call fails. */
enum { CH_K = 3 };

static void *rank_channels(void *arg)
{
    rank_job *j = arg;
    int r = j->rank, p = j->size, next = (r + 1) % p, prev = (r + p - 1) % p;
    char err[320] = "";
    float h[M], want[M], got[M];
    float *a = cudaSetDevice(r) == cudaSuccess ? gpu_alloc(M) : NULL, *b = gpu_alloc((size_t)2 * CH_K * M);
    comm *boot = comm_threads_rank(j->tw, r), *c = NULL;
    long bad;
    RCHECK(j, a && b && boot, "cudaSetDevice, cudaMalloc or comm_threads_rank failed");
    c = comm_nccl_world_mpi(boot, r, j->timeout_s, err, sizeof err);
    RCHECK(j, c, "comm_nccl_world_mpi: %s", err);
    RCHECK(j, !j->ordered || comm_nccl_order(c, NULL) == 0, "comm_nccl_order: %s", c->error);
    if (j->ordered) {
        RCHECK(j, dev_open(MESH_DEVICE_CUDA, r, &t_watched, err, sizeof err) == MESH_OK, "dev_open: %s", err);
        dev_set_watch(t_watched, comm_nccl_watch, c);
    }
    RCALL(j, c, comm_nccl_channels(c, 1));
    RCALL(j, c, comm_nccl_channels(c, 1)); /* (again: nothing) */
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 2 * CH_K; k++) { /* message k: to next (k < K), else to prev */
            for (int i = 0; i < M; i++) h[i] = (float)(r * 1000 + k * 100 + i + round);
            RCHECK(j, dev_put(a, h, M) == 0, "copy");
            RCALL(j, c, comm_send(c, a, M * sizeof *a, k < CH_K ? next : prev));
            RCHECK(j, cudaMemset(a, 0, M * sizeof *a) == cudaSuccess, "memset"); /* the send copied it */
        }
        /* from prev, its messages to its next (k < K); from next, its to its prev (k >= K); p = 2: one peer,
         * whose 2K messages come in the order it sent them */
        for (int k = 0; k < 2 * CH_K; k++) {
            int from = p == 2 ? next : k < CH_K ? prev : next;
            RCALL(j, c, comm_recv(c, b + (size_t)k * M, M * sizeof *b, from));
        }
        for (int k = 0; k < 2 * CH_K; k++) {
            int from = p == 2 ? next : k < CH_K ? prev : next;
            for (int i = 0; i < M; i++) want[i] = (float)(from * 1000 + k * 100 + i + round);
            RCHECK(j, dev_get(got, b + (size_t)k * M, M) == 0, "copy");
            RCHECK(j, (bad = differs(got, want, M)) < 0, "round %d, message %d from rank %d: [%ld] = %g, not %g",
                   round, k, from, bad, got[bad], want[bad]);
        }
        RCALL(j, c, comm_nccl_flush(c));
    }
    if (p > 2) { /* two away: no channel; deferred, and in one group with the receive */
        int far = (r + 2) % p, back = (r + p - 2) % p;
        for (int i = 0; i < M; i++) h[i] = (float)(r * 7 + i);
        for (int i = 0; i < M; i++) want[i] = (float)(back * 7 + i);
        RCHECK(j, dev_put(a, h, M) == 0, "copy");
        RCALL(j, c, comm_send(c, a, M * sizeof *a, far));
        RCALL(j, c, comm_recv(c, b, M * sizeof *b, back));
        RCHECK(j, dev_get(got, b, M) == 0, "copy");
        RCHECK(j, (bad = differs(got, want, M)) < 0, "two away: [%ld] = %g, not %g", bad, got[bad], want[bad]);
    }
    RCALL(j, c, comm_group_begin(c));
    RCHECK(j, comm_send(c, a, M * sizeof *a, next) == -1 && strstr(c->error, "takes no call between group_begin"),
           "a channel's send in a group: %s", c->error);
    RCALL(j, c, comm_group_end(c));
    RCALL(j, c, comm_barrier(c));
    if (!j->abort_host) { /* rank 0's send never received: its flush times out naming it */
        if (r == 0) {
            RCALL(j, c, comm_send(c, a, M * sizeof *a, 1));
            RCHECK(j, comm_nccl_flush(c) == -1 && strstr(c->error, "send to rank 1 over") &&
                          strstr(c->error, "waited more than 2 s"),
                   "an unreceived send's flush: %s", c->error);
        } else {
            RCHECK(j, comm_barrier(c) == -1, "the barrier after rank 0's failure passed");
        }
    }
out:
    if (t_watched) dev_set_watch(t_watched, NULL, NULL);
    dev_close(t_watched);
    t_watched = NULL;
    if (c) comm_free(c);
    if (boot) comm_free(boot);
    cudaFree(a);
    cudaFree(b);
    return NULL;
}

/* size ranks, each a thread running fn on its own GPU (with ordered set,
 * in ordered worlds); the sum of their jobs' pending counts. */
static int run_ranks_ordered(int size, double timeout_s, int abort_host, int ordered, void *(*fn)(void *))
{
    pthread_t t[RANKS_MAX];
    rank_job job[RANKS_MAX];
    comm_threads_world *tw = comm_threads_world_new(size, 60);
    ASSERT_NOT_NULL(tw);
    for (int r = 0; r < size; r++) {
        memset(&job[r], 0, sizeof job[r]);
        job[r].tw = tw;
        job[r].rank = r;
        job[r].size = size;
        job[r].timeout_s = timeout_s;
        job[r].abort_host = abort_host;
        job[r].ordered = ordered;
        ASSERT_INT_EQ(pthread_create(&t[r], NULL, fn, &job[r]), 0);
    }
    int pending = 0;
    for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < size; r++)
        if (job[r].failed_at) fprintf(stderr, "# rank %d, line %d: %s\n", r, job[r].failed_at, job[r].error);
    for (int r = 0; r < size; r++) {
        ASSERT_INT_EQ(job[r].failed_at, 0);
        pending += job[r].pending;
    }
    return pending;
}

static void run_ranks(int size, double timeout_s, int abort_host, void *(*fn)(void *))
{
    (void)run_ranks_ordered(size, timeout_s, abort_host, 0, fn);
}

/* The GPUs a world of ranks can have here, or 0 (with a SKIP line). */
static int gpus_for_ranks(void)
{
    int n = 0;
    if (!comm_nccl_available(NULL, 0)) return 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        (void)cudaGetLastError();
        printf("SKIP nccl ranks: %d GPU here, a world of ranks needs 2 or more\n", n);
        return 0;
    }
    return n < RANKS_MAX ? n : RANKS_MAX;
}

TEST_IMPL(comm_nccl_ranks_over_threads)
{
    int n = gpus_for_ranks();
    if (n < 2) return;
    run_ranks(n, 60, 0, rank_calls);
    if (n > 2) run_ranks(2, 60, 0, rank_calls);
}

TEST_IMPL(comm_nccl_failed_rank_stops_the_others)
{
    int n = gpus_for_ranks();
    if (n < 2) return;
    run_ranks(n, 2, 0, rank_fails);
    run_ranks(n, 60, 1, rank_fails);
}

/* Every call again with the world ordered on the stream (the results the
 * same, read after the legacy stream's copies alone), and the watched
 * wait for a stream stopped by a failed rank. */
TEST_IMPL(comm_nccl_ordered_calls_follow_the_stream)
{
    int n = gpus_for_ranks();
    if (n < 2) return;
    int pending = run_ranks_ordered(n, 60, 0, 1, rank_calls);
    printf("# %d of %d ordered all-reduces left work on the stream as they returned\n", pending, 8 * n);
    if (pending == 0) unit_fail(__FILE__, __LINE__, "every ordered all-reduce was done as it returned");
    run_ranks_ordered(n, 2, 0, 1, rank_fails_ordered);
    run_ranks_ordered(n, 60, 1, 1, rank_fails_ordered);
    run_ranks_ordered(n, 60, 0, 1, rank_counts_ordered);
}

/* The ring's channels: eager sends in an order the deferred ones cannot
 * take, waited for and ordered; and a send never received, which times
 * out (waited for: the flush waits on the host). */
TEST_IMPL(comm_nccl_ring_channels)
{
    int n = gpus_for_ranks();
    if (n < 2) return;
    run_ranks_ordered(n, 60, 1, 0, rank_channels);
    run_ranks_ordered(n, 60, 1, 1, rank_channels);
    if (n > 2) run_ranks_ordered(2, 60, 1, 1, rank_channels);
    if (n > 3) run_ranks_ordered(3, 60, 1, 0, rank_channels);
    run_ranks_ordered(n, 2, 0, 0, rank_channels);
}

/* A communication queue ordered on the GPU (comm_async_hooks.deferred):
 * the sums right with no host waiting for the GPU, and a failed rank
 * noticed by the queue's own thread. */
TEST_IMPL(comm_nccl_queue_ordered_on_the_gpu)
{
    int n = gpus_for_ranks();
    if (n < 2) return;
    int pending = run_ranks_ordered(n, 60, -1, 0, rank_queue);
    printf("# %d of %d waits for a deferred queue's ticket returned before its sum was done\n", pending, Q_CALLS * n);
    if (pending == 0) unit_fail(__FILE__, __LINE__, "every deferred sum was done when its wait returned");
    run_ranks_ordered(n, 2, 0, 0, rank_queue);
    run_ranks_ordered(n, 60, 1, 0, rank_queue);
}

#else /* no CUDA in this build: comm_nccl_available_says_why said SKIP */

TEST_IMPL(comm_nccl_one_rank_calls) {}
TEST_IMPL(comm_nccl_world_over_threads) {}
TEST_IMPL(comm_nccl_failure_aborts_the_world) {}
TEST_IMPL(comm_nccl_world_times_out_without_its_ranks) {}
TEST_IMPL(comm_nccl_world_names_a_rank_without_its_gpu) {}
TEST_IMPL(comm_nccl_queue_on_its_own_world) {}
TEST_IMPL(comm_nccl_ranks_over_threads) {}
TEST_IMPL(comm_nccl_failed_rank_stops_the_others) {}
TEST_IMPL(comm_nccl_ordered_calls_follow_the_stream) {}
TEST_IMPL(comm_nccl_queue_ordered_on_the_gpu) {}
TEST_IMPL(comm_nccl_ring_channels) {}

#endif
