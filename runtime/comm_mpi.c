/* comm_mpi.c — the MPI communicator (comm.h): one rank per process, the
 * processes of a job that mpirun or srun --mpi=pmix started (Open MPI 4.1).
 *
 * Sums are never MPI's (its reduction order is its own): they are taken
 * as the threads backend takes them, element by element in rank order, so
 * both backends give the same bits. All-reduce: rank r owns the chunk
 * [n r / size, n (r + 1) / size) of the buffer, receives every rank's copy
 * of it (MPI_Alltoallv), adds them up in rank order, and the summed chunks
 * are gathered back (MPI_Allgatherv): 2 n (size - 1) / size floats each
 * way per rank, as a ring all-reduce moves. Reduce-scatter is its first
 * half. Sends are eager: the data is copied and sent with MPI_Isend, and
 * the copy freed once sent, so transfers in any order cannot deadlock.
 *
 * Failure: every communicator returns MPI's errors (MPI_ERRORS_RETURN),
 * and a failing call says which call, on which rank, and MPI's message.
 * comm_abort prints why and calls MPI_Abort(MPI_COMM_WORLD, 3): the
 * launcher then stops every process of the job. MPI has no timeout of its
 * own: each call that waits for another rank (collectives, receives, the
 * end of a send) notes when it started, and a watchdog thread per process
 * looks every 50 ms; a call that has waited longer than the timeout
 * (MESH_COLLECTIVE_TIMEOUT_S, default 600 s) stops the job, naming the
 * rank and the call. So no rank waits forever for one that is stuck or
 * gone, whether or not the launcher noticed. A communicator bootstrapped
 * over the world (NCCL's) that fails says so (comm_mpi_stop, through its
 * comm_watch): its waits on the GPU then end at once, on every thread of
 * the process, and a wait in MPI that lasts STOP_GRACE_S longer stops the
 * job, since the rank it waits in may be the only one that knows.
 *
 * A call moves at most 2^31 - 1 elements (MPI's int counts).
 *
 * The whole backend needs MPI=1 (MESH_MPI); without it, comm_mpi_world
 * says so.
 */
#include "comm.h"

#include <stdio.h> /* snprintf, fprintf */

#if MESH_MPI

#include <limits.h>    /* INT_MAX */
#include <mpi.h>       /* MPI_* */
#include <pthread.h>   /* pthread_create, pthread_mutex_t */
#include <stdatomic.h> /* atomic_int */
#include <stdlib.h>    /* malloc, calloc, free, atexit */
#include <string.h>    /* memcpy */
#include <unistd.h>    /* _exit */

enum { TAG = 17 }; /* point-to-point messages */
/* After comm_mpi_stop, how long a wait in MPI may last before the
 * watchdog stops the job: one that ends by then had its peers (the
 * failure did not reach them), one that does not may never end. */
#define STOP_GRACE_S 1.0

typedef struct msend { /* an eager send in flight */
    struct msend *next;
    MPI_Request req;
    unsigned char data[];
} msend;

typedef struct mcomm {
    comm c;
    MPI_Comm mc;
    MPI_Comm end;      /* a world's: comm_mpi_finish's exchange (else MPI_COMM_NULL) */
    msend *sends;      /* in flight, newest first */
    float *scratch;
    size_t scratch_n;
    int *cnt;          /* 4 x size: send counts, displacements, receive counts, displacements */
    unsigned long long *a2a; /* 2 x size: all-to-all counts sent and received */
} mcomm;

static const comm_vtbl mpi_vtbl;

/* The process's MPI state; the wait in progress is read by the watchdog. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int started;          /* MPI is initialised (by us or by the program) */
static int multiple;         /* MPI_THREAD_MULTIPLE: the watchdog may call MPI_Abort */
static pthread_t dog;
static int dog_on;
static atomic_int dog_stop;
static double timeout = 600; /* the latest world's */
/* The calls this rank waits in, one per thread that calls MPI (the
 * rank's own and its communication queue's, comm_async.h): a slot each,
 * taken by a thread on its first call. */
enum { WAIT_SLOTS = 8 };
static struct {
    const char *op; /* NULL: not waiting */
    int rank;
    double since;
} waits[WAIT_SLOTS];
static int wait_slots;                      /* slots taken */
static _Thread_local int wait_slot = -1;    /* this thread's */
static int live_rank = -1;   /* from comm_mpi_world to comm_mpi_finish: this process's rank */
/* comm_mpi_stop's reason ("" until then): this process's rank failed in a
 * communicator bootstrapped over the world (NCCL's), maybe on another
 * thread than the one that waits in MPI. */
static char stop_why[640];


/* Prints why the job stops and stops it: MPI_Abort, whose status (3) the
 * launcher returns; a watchdog without MPI_THREAD_MULTIPLE ends this
 * process instead, which makes the launcher stop the others. */
static _Noreturn void stop_job(const char *why, int may_call_mpi)
{
    fprintf(stderr, "mesh: %s; stopping the job (MPI_Abort)\n", why);
    fflush(stderr);
    if (may_call_mpi) MPI_Abort(MPI_COMM_WORLD, 3);
    _exit(3);
}

/* The watchdog's bookkeeping: this rank starts or ends a wait. */
static void watch(const comm *c, const char *op)
{
    pthread_mutex_lock(&mu);
    if (wait_slot < 0 && wait_slots < WAIT_SLOTS) wait_slot = wait_slots++;
    if (wait_slot >= 0) /* (a ninth thread's waits go unwatched) */
        waits[wait_slot].op = op, waits[wait_slot].rank = c->world_rank, waits[wait_slot].since = comm_now();
    pthread_mutex_unlock(&mu);
}

static void unwatch(void)
{
    pthread_mutex_lock(&mu);
    if (wait_slot >= 0) waits[wait_slot].op = NULL;
    pthread_mutex_unlock(&mu);
}

static void *watchdog(void *arg)
{
    (void)arg;
    while (!atomic_load(&dog_stop)) {
        comm_sleep(0.05);
        char why[sizeof stop_why + 200] = "";
        pthread_mutex_lock(&mu);
        for (int k = 0; k < wait_slots && !why[0]; k++) {
            double waited = waits[k].op ? comm_now() - waits[k].since : 0;
            if (waits[k].op && waited > timeout)
                snprintf(why, sizeof why, "rank %d waited in %s for more than %g s (MESH_COLLECTIVE_TIMEOUT_S): "
                         "another rank is stuck or gone", waits[k].rank, waits[k].op, timeout);
            else if (waits[k].op && stop_why[0] && waited > STOP_GRACE_S)
                snprintf(why, sizeof why, "rank %d waits in %s, but it failed (%s)", waits[k].rank, waits[k].op,
                         stop_why);
        }
        pthread_mutex_unlock(&mu);
        if (why[0]) stop_job(why, multiple);
    }
    return NULL;
}

static void at_exit(void)
{
    int done = 0;
    char why[120];
    if (live_rank >= 0) { /* exit() in the middle of a run: the others would wait for it */
        comm_rank_failed(why, sizeof why, live_rank, "its process exits in the middle of the run");
        stop_job(why, 1);
    }
    atomic_store(&dog_stop, 1);
    if (dog_on) pthread_join(dog, NULL);
    dog_on = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

/* MPI_Init once, finalised at exit (unless the program initialised MPI:
 * then it finalises it too), and the watchdog. */
static int start(double seconds, char *err, size_t n)
{
    int rc = 0, init = 0, provided = MPI_THREAD_SINGLE;
    pthread_mutex_lock(&mu);
    timeout = seconds;
    if (!started) {
        MPI_Initialized(&init);
        if (init) {
            MPI_Query_thread(&provided);
        } else if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS) {
            atexit(at_exit);
        } else {
            snprintf(err, n, "MPI_Init_thread failed");
            rc = -1;
        }
    }
    if (rc == 0 && !started) {
        started = 1;
        multiple = provided == MPI_THREAD_MULTIPLE;
        dog_on = pthread_create(&dog, NULL, watchdog, NULL) == 0;
        if (!dog_on) fprintf(stderr, "mesh: warning: no watchdog thread: collectives have no timeout\n");
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

/* Records an MPI error of op: "OP over N ranks (this is rank R): MPI's
 * message (file:line)"; returns -1. */
static int mpi_fail(mcomm *m, const char *op, int rc, const char *file, int line)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    return comm_fail(&m->c, op, "%s (%s:%d)", s, file, line);
}

/* One MPI call that may wait for other ranks, under the watchdog; returns
 * -1 from the calling function if it fails. */
#define MPI_CHECK(m, op, call)                                                           \
    do {                                                                                 \
        watch(&(m)->c, op);                                                              \
        int mpi_rc_ = (call);                                                            \
        unwatch();                                                                       \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(m, op, mpi_rc_, __FILE__, __LINE__); \
    } while (0)

/* -1 (with the reason) when n elements do not fit MPI's int counts. */
static int too_big(mcomm *m, const char *op, size_t n)
{
    if (n <= (size_t)INT_MAX) return 0;
    return comm_fail(&m->c, op, "%zu elements in one call; MPI's counts stop at %d", n, INT_MAX);
}

static float *scratch(mcomm *m, size_t n) { return comm_scratch(&m->scratch, &m->scratch_n, n); }

/* out[i] = rows[0][i] + rows[1][i] + ... (p rows of n), in rank order */
static void sum_rows(const float *rows, int p, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) {
        float s = rows[i];
        for (int q = 1; q < p; q++) s += rows[(size_t)q * n + i];
        out[i] = s;
    }
}

/* The first element of rank q's chunk of n, of p chunks. */
static size_t chunk_at(size_t n, int q, int p) { return n * (size_t)q / (size_t)p; }

static int m_all_reduce(comm *c, float *buf, size_t n)
{
    mcomm *m = (mcomm *)c;
    int p = c->size;
    size_t lo = chunk_at(n, c->rank, p), mine = chunk_at(n, c->rank + 1, p) - lo;
    if (too_big(m, "all-reduce", n)) return -1;
    float *rows = scratch(m, mine * (size_t)(p + 1));
    if (!rows) return comm_fail(c, "all-reduce", "out of memory");
    int *chunk = m->cnt, *at = chunk + p, *rcnt = at + p, *rat = rcnt + p;
    for (int q = 0; q < p; q++) {
        at[q] = (int)chunk_at(n, q, p);
        chunk[q] = (int)(chunk_at(n, q + 1, p) - (size_t)at[q]);
        rcnt[q] = (int)mine;
        rat[q] = q * (int)mine;
    }
    /* every rank's copy of my chunk, then the chunks' sums to everyone */
    MPI_CHECK(m, "all-reduce", MPI_Alltoallv(buf, chunk, at, MPI_FLOAT, rows, rcnt, rat, MPI_FLOAT, m->mc));
    float *sum = rows + mine * (size_t)p;
    sum_rows(rows, p, mine, sum);
    MPI_CHECK(m, "all-reduce", MPI_Allgatherv(sum, (int)mine, MPI_FLOAT, buf, chunk, at, MPI_FLOAT, m->mc));
    return 0;
}

static int m_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    mcomm *m = (mcomm *)c;
    size_t all = n * (size_t)c->size;
    if (too_big(m, "reduce-scatter", all)) return -1;
    float *rows = scratch(m, all);
    if (!rows) return comm_fail(c, "reduce-scatter", "out of memory");
    MPI_CHECK(m, "reduce-scatter", MPI_Alltoall(in, (int)n, MPI_FLOAT, rows, (int)n, MPI_FLOAT, m->mc));
    sum_rows(rows, c->size, n, out); /* out may be this rank's own input: that was sent */
    return 0;
}

static int m_all_gather(comm *c, const float *in, float *out, size_t n)
{
    mcomm *m = (mcomm *)c;
    if (too_big(m, "all-gather", n * (size_t)c->size)) return -1;
    const void *send = in == out + (size_t)c->rank * n ? MPI_IN_PLACE : in;
    MPI_CHECK(m, "all-gather", MPI_Allgather(send, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, m->mc));
    return 0;
}

/* Every rank learns what each peer sends it; -1 on every rank when one
 * expected other counts (the lowest such rank says which). */
static int a2a_counts(mcomm *m, const size_t *send, const size_t *recv)
{
    comm *c = &m->c;
    int p = c->size, bad = -1, lowest = INT_MAX;
    unsigned long long *mine = m->a2a, *theirs = m->a2a + p;
    for (int q = 0; q < p; q++) mine[q] = send[q];
    MPI_CHECK(m, "all-to-all", MPI_Alltoall(mine, 1, MPI_UNSIGNED_LONG_LONG, theirs, 1, MPI_UNSIGNED_LONG_LONG,
                                            m->mc));
    for (int q = p - 1; q >= 0; q--)
        if (theirs[q] != recv[q]) bad = q;
    int me = bad >= 0 ? c->rank : INT_MAX;
    MPI_CHECK(m, "all-to-all", MPI_Allreduce(&me, &lowest, 1, MPI_INT, MPI_MIN, m->mc)); /* exact: ints */
    if (bad >= 0)
        return comm_fail(c, "all-to-all", "rank %d expected %zu floats from rank %d, which sends %llu", c->rank,
                         recv[bad], bad, theirs[bad]);
    if (lowest != INT_MAX) return comm_fail(c, "all-to-all", "rank %d expected other counts", lowest);
    return 0;
}

static int m_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    mcomm *m = (mcomm *)c;
    int p = c->size, *scnt = m->cnt, *sat = scnt + p, *rcnt = sat + p, *rat = rcnt + p;
    if (a2a_counts(m, send, recv) != 0) return -1;
    size_t ns = 0, nr = 0;
    for (int q = 0; q < p; q++) {
        sat[q] = (int)ns;
        rat[q] = (int)nr;
        scnt[q] = (int)send[q];
        rcnt[q] = (int)recv[q];
        ns += send[q];
        nr += recv[q];
        if (too_big(m, "all-to-all", ns > nr ? ns : nr)) return -1;
    }
    MPI_CHECK(m, "all-to-all", MPI_Alltoallv(in, scnt, sat, MPI_FLOAT, out, rcnt, rat, MPI_FLOAT, m->mc));
    return 0;
}

static int m_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    mcomm *m = (mcomm *)c;
    if (too_big(m, "broadcast", bytes)) return -1;
    MPI_CHECK(m, "broadcast", MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, m->mc));
    return 0;
}

static int m_barrier(comm *c)
{
    mcomm *m = (mcomm *)c;
    MPI_CHECK(m, "barrier", MPI_Barrier(m->mc));
    return 0;
}

/* Frees the sends that are done (all: waits for them). */
static int reap_sends(mcomm *m, int all)
{
    for (msend **at = &m->sends; *at;) {
        msend *s = *at;
        int done = 0;
        if (all) MPI_CHECK(m, "the end of a send", MPI_Wait(&s->req, MPI_STATUS_IGNORE));
        else MPI_CHECK(m, "send", MPI_Test(&s->req, &done, MPI_STATUS_IGNORE));
        if (!all && !done) {
            at = &s->next;
            continue;
        }
        *at = s->next;
        free(s);
    }
    return 0;
}

static int peer_ok(comm *c, int peer, const char *what)
{
    if (peer >= 0 && peer < c->size) return 1;
    snprintf(c->error, sizeof c->error, "%s rank %d of a group of %d", what, peer, c->size);
    return 0;
}

static int m_send(comm *c, const void *buf, size_t bytes, int peer)
{
    mcomm *m = (mcomm *)c;
    if (!peer_ok(c, peer, "send to") || too_big(m, "send", bytes) || reap_sends(m, 0) != 0) return -1;
    msend *s = malloc(sizeof *s + bytes);
    if (!s) return comm_fail(c, "send", "out of memory");
    memcpy(s->data, buf, bytes);
    int rc = MPI_Isend(s->data, (int)bytes, MPI_BYTE, peer, TAG, m->mc, &s->req);
    if (rc != MPI_SUCCESS) {
        free(s);
        return mpi_fail(m, "send", rc, __FILE__, __LINE__);
    }
    s->next = m->sends;
    m->sends = s;
    return 0;
}

static int m_recv(comm *c, void *buf, size_t bytes, int peer)
{
    mcomm *m = (mcomm *)c;
    MPI_Status st;
    int got = 0;
    if (!peer_ok(c, peer, "receive from")) return -1;
    MPI_CHECK(m, "receive", MPI_Probe(peer, TAG, m->mc, &st));
    MPI_Get_count(&st, MPI_BYTE, &got);
    void *into = (size_t)got == bytes ? buf : malloc(got > 0 ? (size_t)got : 1);
    if (!into) return comm_fail(c, "receive", "out of memory");
    MPI_CHECK(m, "receive", MPI_Recv(into, got, MPI_BYTE, peer, TAG, m->mc, MPI_STATUS_IGNORE));
    if (into == buf) return 0;
    free(into); /* the message is taken, as the threads backend takes it */
    snprintf(c->error, sizeof c->error, "receive from rank %d: %d bytes sent, %zu expected", peer, got, bytes);
    return -1;
}

static int m_group_noop(comm *c)
{
    (void)c;
    return 0;
}

static _Noreturn void m_abort(comm *c, const char *why)
{
    char msg[sizeof c->error + 64];
    comm_rank_failed(msg, sizeof msg, c->world_rank, why);
    stop_job(msg, 1);
}

/* A handle on mc (owned from now on); NULL if out of memory. */
static comm *wrap(MPI_Comm mc, int world_rank)
{
    mcomm *m = calloc(1, sizeof *m);
    int rank = 0, size = 1;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    if (m) m->cnt = calloc(4 * (size_t)size, sizeof *m->cnt);
    if (m) m->a2a = calloc(2 * (size_t)size, sizeof *m->a2a);
    if (!m || !m->cnt || !m->a2a) {
        if (m) free(m->cnt);
        free(m);
        return NULL;
    }
    m->c.v = &mpi_vtbl;
    m->c.rank = rank;
    m->c.size = size;
    m->c.world_rank = world_rank;
    m->mc = mc;
    m->end = MPI_COMM_NULL;
    return &m->c;
}

static int m_split(comm *c, int color, int key, comm **out)
{
    mcomm *m = (mcomm *)c;
    MPI_Comm nc = MPI_COMM_NULL;
    *out = NULL;
    MPI_CHECK(m, "split", MPI_Comm_split(m->mc, color < 0 ? MPI_UNDEFINED : color, key, &nc));
    if (nc == MPI_COMM_NULL) return 0;
    if (!(*out = wrap(nc, c->world_rank))) {
        MPI_Comm_free(&nc);
        return comm_fail(c, "split", "out of memory");
    }
    return 0;
}

static void m_free(comm *c)
{
    mcomm *m = (mcomm *)c;
    if (reap_sends(m, 1) != 0) fprintf(stderr, "mesh: %s\n", c->error);
    MPI_Comm_free(&m->mc);
    if (m->end != MPI_COMM_NULL) { /* a world's: its run is over */
        MPI_Comm_free(&m->end);
        live_rank = -1;
    }
    free(m->scratch);
    free(m->cnt);
    free(m->a2a);
    free(m);
}

static const comm_vtbl mpi_vtbl = {
    "mpi", m_all_reduce, m_reduce_scatter, m_all_gather, m_all_to_all, m_broadcast, m_send, m_recv,
    m_barrier, m_split, m_group_noop, m_group_noop, m_abort, m_free, NULL, NULL, NULL, /* _v: packed by comm.c */
};

comm *comm_mpi_world(double timeout_s, char *err, size_t n)
{
    if (start(timeout_s > 0 ? timeout_s : comm_timeout_from_env(), err, n) != 0) return NULL;
    MPI_Comm mc = MPI_COMM_NULL, end = MPI_COMM_NULL;
    int rank = 0, rc;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    comm probe = {NULL, rank, 0, rank, "", NULL, 0};
    watch(&probe, "making the world's communicator");
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &mc);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &end);
    unwatch();
    comm *c = rc == MPI_SUCCESS ? wrap(mc, rank) : NULL;
    if (!c) {
        snprintf(err, n, rc == MPI_SUCCESS ? "out of memory" : "MPI_Comm_dup of MPI_COMM_WORLD failed");
        if (mc != MPI_COMM_NULL) MPI_Comm_free(&mc);
        if (end != MPI_COMM_NULL) MPI_Comm_free(&end);
        return NULL;
    }
    MPI_Comm_set_errhandler(end, MPI_ERRORS_RETURN);
    ((mcomm *)c)->end = end;
    pthread_mutex_lock(&mu);
    live_rank = rank;
    stop_why[0] = 0; /* (a new run) */
    pthread_mutex_unlock(&mu);
    return c;
}

int comm_mpi_of(const comm *c)
{
    c = c ? comm_checked_inner(c) : NULL;
    return c && c->v == &mpi_vtbl;
}

void comm_mpi_stop(const char *why)
{
    pthread_mutex_lock(&mu);
    if (!stop_why[0]) snprintf(stop_why, sizeof stop_why, "%s", why && why[0] ? why : "stopped");
    pthread_mutex_unlock(&mu);
}

int comm_mpi_stopped(char *why, size_t n)
{
    pthread_mutex_lock(&mu);
    int stopped = stop_why[0] != 0;
    if (stopped && why && n) snprintf(why, n, "%s", stop_why);
    pthread_mutex_unlock(&mu);
    return stopped;
}

int comm_mpi_finish(comm *c, int failed, const char *why)
{
    mcomm *m = (mcomm *)c;
    int *all = calloc((size_t)c->size, sizeof *all), done = 0, first = -1;
    MPI_Request req;
    /* a failed rank waits less than the others' timeout, so that the job
     * stops naming it rather than one that waits for it */
    double grace = timeout / 2 < 5 ? timeout / 2 : 5, until = comm_now() + grace;
    int rc = all && m->end != MPI_COMM_NULL ? MPI_Iallgather(&failed, 1, MPI_INT, all, 1, MPI_INT, m->end, &req)
                                            : MPI_ERR_OTHER;
    while (rc == MPI_SUCCESS && !done && (!failed || comm_now() < until)) {
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) comm_sleep(0.001);
    }
    if (!done) {
        free(all);
        m_abort(c, failed ? why : "the exchange that ends the run failed");
    }
    for (int q = c->size - 1; q >= 0; q--)
        if (all[q]) first = q;
    free(all);
    live_rank = -1;
    return first;
}

int comm_mpi_thread_multiple(void)
{
    pthread_mutex_lock(&mu);
    int m = multiple;
    pthread_mutex_unlock(&mu);
    return m;
}

#else /* no MPI in this build */

int comm_mpi_thread_multiple(void) { return 0; }

int comm_mpi_of(const comm *c)
{
    (void)c;
    return 0;
}

void comm_mpi_stop(const char *why) { (void)why; }

int comm_mpi_stopped(char *why, size_t n)
{
    (void)why;
    (void)n;
    return 0;
}

comm *comm_mpi_world(double timeout_s, char *err, size_t n)
{
    (void)timeout_s;
    snprintf(err, n, "this libmesh was built without MPI (MPI=0): rebuild it with MPI=1 to run one rank per "
             "process");
    return NULL;
}

int comm_mpi_finish(comm *c, int failed, const char *why)
{
    (void)c;
    (void)why;
    return failed ? 0 : -1;
}

#endif
