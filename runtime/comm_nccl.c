/* comm_nccl.c — the NCCL communicator (comm.h): one rank per process and
 * per GPU, collectives and transfers between device buffers over NCCL
 * 2.18+ (built against 2.28).
 *
 * Buffers are device pointers (the CUDA executor's); the caller's work that
 * writes a buffer is finished before the call (its stream synchronised), and
 * the call returns once the result is in place. Each handle has its own
 * non-blocking CUDA stream: a call enqueues its NCCL operation there and
 * waits for it, polling cudaStreamQuery and ncclCommGetAsyncError, so that a
 * failed or stuck operation is noticed: an NCCL error, a CUDA error or a
 * wait longer than the world's timeout (MESH_COLLECTIVE_TIMEOUT_S, default
 * 600 s) aborts every NCCL communicator of the world (ncclCommAbort), and
 * the call, and every later one, returns -1 with a message naming the
 * operation, the rank and NCCL's error (ncclGetErrorString, and
 * ncclGetLastError's detail).
 *
 * Ordered worlds (comm_nccl_order: the CUDA executor's, unless
 * MESH_NCCL_BLOCKING=1). The host waits for neither the caller's kernels
 * nor the call: an event recorded on the caller's stream at the call makes
 * the handle's stream wait for the work before it (after_caller), and once
 * NCCL has enqueued the operation (a non-blocking communicator's
 * ncclInProgress ends) an event recorded after it on the handle's stream
 * makes the caller's stream wait for it (settle), as PyTorch's process
 * groups order their NCCL streams. The GPU then runs the calls between the
 * kernels as the host-synchronous calls did, and the host goes on
 * launching. A send's staging copy is ordered the same way, so the caller
 * may rewrite the buffer on its stream at once. What is not waited for is
 * watched: the next call checks the world, and the host's waits for the
 * caller's stream poll comm_nccl_watch (device.h's dev_set_watch), which
 * aborts the world on an NCCL or CUDA error, a failed rank of the host
 * world, or a wait longer than the timeout with NCCL work in flight
 * (naming its last call); the abort ends that work on the GPU. A barrier
 * is still waited for. An all-to-all's counts go to the peers on the
 * handle's stream ahead of the data, and come back to the host
 * asynchronously; the world's next call, or a watched wait (which looks
 * once more when the stream is done), checks them: counts that disagree
 * then fail the all-to-all after the fact, naming them, and abort the
 * world (its transfers may wait for bytes that never come). Unordered, the
 * counts are checked before the data moves, and a mismatch fails every
 * rank's call with the world intact.
 *
 * A world holds a watch (comm_watch_of) on the world it was bootstrapped
 * over (comm_nccl_world_mpi): a threads world (ranks as threads of one
 * process, a GPU each), a TCP one (one rank per process, as torchrun
 * starts them) or an MPI one (mpirun, srun); its waits poll it too. When a
 * rank fails and aborts that world, as a failing rank does, or (TCP) its
 * process ends, the others' NCCL waits end at once ("another rank failed
 * (rank 1 failed: ...)") and abort the NCCL world, instead of lasting
 * until the timeout. An MPI world's watch sees only its own process: a
 * communication queue's failure ends the rank's waits; the launcher ends
 * the job when a process fails. The other way round, the world's watchdog
 * thread asks its communicators for NCCL's asynchronous errors every
 * DOG_MS and stops the host world on one, so that ranks waiting in a host
 * collective while this rank's NCCL world has failed (an operation that
 * will never end) stop at once too; over MPI, the job stops if this
 * rank's wait in MPI does not end within a second (comm_mpi_stop).
 *
 * Communicators are non-blocking (config.blocking = 0): any NCCL call may
 * return ncclInProgress, and the wait polls ncclCommGetAsyncError until the
 * operation is enqueued (then the stream until it is done), with the same
 * timeout; so is the world's creation and a split.
 *
 * Sums are NCCL's (ncclSum): the same on every member, but not taken in
 * rank order, so not bit-equal to the threads and MPI backends'.
 *
 * Sends. comm.h promises eager sends; an ncclSend waits on the GPU until the
 * peer posts its ncclRecv. So a send copies the data to a staging buffer on
 * the device (the caller may reuse its buffer at once) and is deferred: it
 * is issued at this process's next call, in one NCCL group with it when
 * that call is a receive, otherwise just before it (then the call waits for
 * the receiver), or at group_end, or when the handle is freed. Pending
 * sends of every handle of the world go out together, in the order they
 * were made. Hence the executor's patterns work: a pipeline stage's send of
 * activations and its receive of gradients form one group, which matches
 * the peer's send of gradients and receive of activations (Megatron's
 * send_forward_recv_backward); a send before a collective reaches a peer
 * already waiting to receive it. What NCCL cannot do is a send that is
 * received only after the receiver has waited for the sender in something
 * else (a rank that sends, then enters an all-reduce that the receiver
 * enters before receiving): that deadlocks until the timeout, where the
 * threads and MPI backends go on. A receive must name the size sent (the
 * plan's static check makes sure of it); NCCL does not check it. Outside a
 * group, a send to oneself never reaches NCCL: the next receive from
 * oneself copies it.
 *
 * Groups: between group_begin and group_end, calls only enqueue (no count
 * check in all_to_all, no split); group_end issues the group, with the
 * deferred sends (to oneself too: received in the same group), and waits.
 *
 * One thread uses a world at a time (NCCL's groups are per thread). A
 * communication queue's split (comm_async.h) is made a world of its own
 * (comm_nccl_own_thread), which the queue's thread uses while the rank's
 * goes on with the rest: its collectives run on its handle's stream beside
 * the rank's kernels (the executor's overlap). Its comm_abort may come from
 * the rank's thread: it is asked for (an atomic flag) and done by the
 * queue's thread at its next poll, or by comm_free. A deferred own world
 * (comm_nccl_defer) returns from a call once NCCL has enqueued it; its
 * stream waits for the caller's events (comm_nccl_wait_event), an event
 * recorded after a call orders the caller's stream after it
 * (comm_nccl_record_event), and the queue's thread watches the work in
 * flight (comm_nccl_progress) with the checks a wait makes. Two communicators
 * working at once on one GPU rely on both NCCL kernels fitting on the GPU
 * together, as PyTorch's and Megatron-LM's overlapped gradient reductions
 * do (NCCL's documentation does not promise it).
 *
 * The whole backend needs CUDA=1 (MESH_CUDA); without it, the
 * constructors say so.
 */
#include "comm.h"
#include "device.h" /* dev_cuda_probe: whether a GPU is usable */

#include <stdio.h> /* snprintf, fprintf */

#if MESH_CUDA

#include <cuda_runtime.h> /* cudaStream_t, cudaMalloc, cudaMemcpyAsync, cudaStreamQuery */
#include <limits.h>       /* INT_MAX */
#include <nccl.h>         /* ncclComm_t, ncclAllReduce, ... */
#include <pthread.h>      /* pthread_mutex_t: the launch lock */
#include <stdatomic.h>    /* atomic_int: an own world's abort asked from another thread */
#include <stdint.h>       /* int32_t, uint64_t */
#include <stdlib.h>       /* calloc, realloc, free, getenv */
#include <ctype.h>        /* isdigit */
#include <string.h>       /* memcpy, memset, strncmp */
#include <time.h>         /* nanosleep */

#include "kcuda.h"      /* kcuda_fault_hint */
#include "rendezvous.h" /* rdv_open, rdv_all_gather: the unique id over TCP */

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the NCCL communicator needs NCCL >= 2.18 (ncclCommSplit, non-blocking communicators)"
#endif

typedef struct nslot { /* a staged send; kept (with its buffer) for reuse once issued */
    void *data;
    size_t cap, bytes;
    int peer;
} nslot;

typedef struct nworld nworld;

/* Ordered world: an all-to-all's counts, exchanged on the handle's stream
 * and checked once they are back (check_counts), not waited for. */
enum { A2A_CHECKS = 32 }; /* all-to-alls whose counts a handle may have on their way back at once (the
                             host waits for the oldest past that: moe runs 4 a layer a micro-batch) */
typedef struct a2a_check { /* (made all at once, at the handle's first ordered all-to-all: check_alloc) */
    uint64_t *host;   /* pinned: [p] this rank's send counts, then [p] each peer's to it (copied back) */
    size_t *want;     /* [p] the counts the caller expects from each peer */
    cudaEvent_t back; /* recorded after the copy back */
    int pending;      /* sent, not yet checked */
} a2a_check;

typedef struct ncomm {
    comm c;
    nworld *w;
    struct ncomm *next; /* the world's handles */
    ncclComm_t nc;      /* NULL once aborted */
    cudaStream_t stream;
    int touched;        /* work enqueued that the next wait waits for */
    int fresh;          /* ordered world: work enqueued that the caller's stream does not wait for yet */
    const char *last;   /* the last call that enqueued work (a timeout's message names it) */
    cudaEvent_t done;   /* ordered world: recorded after a launch, the caller's stream waits for it */
    nslot *slot;        /* [0, pending): deferred sends, oldest first */
    int pending, slots;
    uint64_t *dev;      /* device: 2 x size all-to-all counts, then one int32 */
    uint64_t *host;     /* pinned host mirror of dev */
    int half;           /* its float elements (COMM_F32, COMM_BF16, COMM_F16: comm_nccl_set_elements),
                           inherited by splits */
    a2a_check chk[A2A_CHECKS]; /* ordered world: all-to-all counts to check, a ring */
    int chk_next;
} ncomm;

struct nworld {
    ncomm *comms;       /* alive handles */
    int device;
    double timeout;
    int group;          /* group_begin depth */
    int aborted;
    char why[800];
    int own;            /* a queue's world (comm_nccl_own_thread): comm_abort only asks */
    int deferred;       /* own: calls return once enqueued, watched by comm_nccl_progress (comm_nccl_defer) */
    int polls;          /* deferred: comm_nccl_progress's looks so far */
    atomic_int claimed; /* own: the first comm_abort writes asked_why, */
    atomic_int asked;   /* then sets this; the world's thread aborts it */
    char asked_why[800];
    comm_watch *host; /* held: a watch on the world it was bootstrapped over, or NULL */
    int ordered;          /* comm_nccl_order: calls ordered on the caller's stream, not waited for */
    cudaStream_t caller;  /* ordered: the caller's stream (NULL: the legacy default stream) */
    cudaEvent_t before;   /* ordered: recorded on the caller's stream at a call; the handle's stream waits */
    /* The watchdog (a world with a host watch, not a queue's own): a thread
     * that asks the world's communicators for NCCL's asynchronous errors
     * every DOG_MS and, on one, stops the host world, so that ranks waiting
     * in a host collective (a sum of the loss, say) while this rank's NCCL
     * world has failed stop at once, not at the timeout. mu guards what it
     * reads: the handles' list and their nc, which the world's thread
     * changes under it (a handle made or freed, a communicator destroyed or
     * aborted), and aborted. */
    pthread_mutex_t mu;
    pthread_cond_t dog_cv;
    pthread_t dog;
    int dog_on, dog_stop;
};

enum { DOG_MS = 50 };
#define COUNTS_GRACE_S 0.2 /* counts_first */

static const comm_vtbl nccl_vtbl;

/* NCCL launches the work of a group at its outermost ncclGroupEnd. Two
 * threads may not issue work in parallel to independent communicators on
 * one GPU (NCCL's "Thread Safety"), which a rank's thread and its
 * communication queue's (comm_nccl_own_thread) would: so every launch, and
 * every call outside a group (made a group of its own: LONE), holds this
 * process's lock. A non-blocking communicator's call returns without
 * waiting for its peers (ncclInProgress), so the lock is held for the call
 * alone, never across a wait. */
static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t group_end(void)
{
    pthread_mutex_lock(&launch_lock);
    ncclResult_t rc = ncclGroupEnd();
    pthread_mutex_unlock(&launch_lock);
    return rc;
}

/* Whether an NCCL call failed (ncclInProgress: it goes on, non-blocking). */
static int failed(ncclResult_t rc) { return rc != ncclSuccess && rc != ncclInProgress; }

/* The result of a call made in a group of its own, which is now launched. */
static ncclResult_t lone(ncclResult_t rc)
{
    ncclResult_t end = group_end();
    return failed(rc) ? rc : end;
}

/* An NCCL call on m: recorded in the caller's group, else launched alone. */
#define LONE(m, call) ((m)->w->group ? (call) : lone((ncclGroupStart(), (call))))

/* The handle's float elements: NCCL's type, and where element k of p is. */
static ncclDataType_t ftype(const ncomm *m)
{
    return m->half == COMM_BF16 ? ncclBfloat16 : m->half == COMM_F16 ? ncclFloat16 : ncclFloat;
}
static void *fat(const ncomm *m, const void *p, size_t k) { return (char *)(uintptr_t)p + k * (m->half ? 2u : 4u); }

/* ---- waiting ---------------------------------------------------------- */


/* Between polls: spin briefly (a collective often ends within
 * microseconds), then sleep 20 us at a time. */
static void pause_poll(int *polls)
{
    if (++*polls < 200) return;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* Aborts every communicator of the world (the first reason stays); the
 * world's handles fail from now on. */
static void abort_world(nworld *w, const char *why)
{
    for (; w->group > 0; w->group--) (void)group_end(); /* leave no NCCL group open on this thread */
    pthread_mutex_lock(&w->mu);
    if (!w->aborted) snprintf(w->why, sizeof w->why, "%s", why);
    w->aborted = 1;
    for (ncomm *x = w->comms; x; x = x->next) {
        if (x->nc) (void)ncclCommAbort(x->nc);
        x->nc = NULL;
        x->pending = 0;
        x->touched = 0;
    }
    pthread_mutex_unlock(&w->mu);
}

/* An own world's abort asked for by another thread: done here, by the
 * thread using the world. 1 if the world is (now) aborted. */
static int take_abort(nworld *w)
{
    if (w->own && !w->aborted && atomic_load_explicit(&w->asked, memory_order_acquire))
        abort_world(w, w->asked_why);
    return w->aborted;
}

/* Whether the world the NCCL world was bootstrapped over (ranks as
 * threads, or processes over TCP) stopped: a rank failed, and this one's
 * wait on NCCL would last until the timeout. Looked at every 64th poll;
 * why gets the reason. */
static int host_down(const nworld *w, int polls, char *why, size_t n)
{
    return w->host && polls % 64 == 0 && comm_watch_stopped(w->host, why, n);
}

/* The watchdog's thread (struct nworld). It reports once, then ends. */
static void *watchdog(void *arg)
{
    nworld *w = arg;
    char why[sizeof w->why] = "";
    pthread_mutex_lock(&w->mu);
    while (!w->dog_stop && !w->aborted && !why[0]) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += DOG_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        (void)pthread_cond_timedwait(&w->dog_cv, &w->mu, &until);
        for (ncomm *x = w->comms; x && !w->dog_stop && !w->aborted && !why[0]; x = x->next) {
            ncclResult_t st = ncclSuccess;
            if (!x->nc || ncclCommGetAsyncError(x->nc, &st) != ncclSuccess || st == ncclSuccess ||
                st == ncclInProgress)
                continue;
            const char *last = ncclGetLastError(x->nc);
            snprintf(why, sizeof why, "rank %d failed: its NCCL communicator: %s (NCCL error %d)%s%.400s",
                     x->c.world_rank, ncclGetErrorString(st), (int)st, last && last[0] ? ": " : "",
                     last ? last : "");
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (why[0]) comm_watch_stop(w->host, why); /* (the world's thread aborts it once it sees the host stopped) */
    return NULL;
}

/* Starts the watchdog of a world with a host watch (not a queue's own);
 * without one (no thread), the world is only looked at when it is waited
 * for, as before. */
static void watchdog_start(nworld *w)
{
    if (w->host && !w->own && pthread_create(&w->dog, NULL, watchdog, w) == 0) w->dog_on = 1;
}

static void world_free(nworld *w)
{
    if (w->dog_on) {
        pthread_mutex_lock(&w->mu);
        w->dog_stop = 1;
        pthread_cond_signal(&w->dog_cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->dog, NULL);
    }
    if (w->before) (void)cudaEventDestroy(w->before);
    comm_watch_release(w->host);
    pthread_cond_destroy(&w->dog_cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* Records why op failed in m's error, aborts the world; returns -1. */
static int fail_abort(ncomm *m, const char *op, const char *why)
{
    char msg[sizeof m->w->why], what[760];
    /* (in the words every backend passes a failed rank on in, which
     * comm_names_other knows: the others' errors that quote it are not
     * taken for the cause) */
    snprintf(what, sizeof what, "%.20s: %.700s", op, why);
    comm_rank_failed(msg, sizeof msg, m->c.world_rank, what);
    comm_fail(&m->c, op, "%.600s; the world's NCCL communicators are aborted", why);
    /* the world it was bootstrapped over first: ncclCommAbort may wait for
     * the other ranks on the node to abort too (NCCL since 2.16), which
     * they do once they hear of this failure there */
    comm_watch_stop(m->w->host, msg);
    abort_world(m->w, msg);
    return -1;
}

/* An NCCL error; for an unhandled CUDA error, what CUDA says of the GPU
 * (a kernel's fault, typically: sticky, so still there to read). */
static int nccl_fail(ncclComm_t nc, ncomm *m, const char *op, const char *call, ncclResult_t rc)
{
    char why[800], cuda[360] = "";
    const char *last = ncclGetLastError(nc);
    cudaError_t ce = rc == ncclUnhandledCudaError ? cudaPeekAtLastError() : cudaSuccess;
    if (ce != cudaSuccess)
        snprintf(cuda, sizeof cuda, "; CUDA says %s (%s)%s", cudaGetErrorString(ce), cudaGetErrorName(ce),
                 kcuda_fault_hint((int)ce));
    snprintf(why, sizeof why, "%s: %s (NCCL error %d)%s%s%s", call, ncclGetErrorString(rc), (int)rc,
             last && last[0] ? ": " : "", last ? last : "", cuda);
    return fail_abort(m, op, why);
}

static int cuda_fail(ncomm *m, const char *op, const char *call, cudaError_t rc)
{
    char why[480];
    (void)cudaGetLastError(); /* (a sticky error stays) */
    snprintf(why, sizeof why, "%s: %s (%s)%s", call, cudaGetErrorString(rc), cudaGetErrorName(rc),
             kcuda_fault_hint((int)rc));
    return fail_abort(m, op, why);
}

static int timed_out(ncomm *m, const char *op)
{
    char why[400];
    snprintf(why, sizeof why, "waited more than %g s (MESH_COLLECTIVE_TIMEOUT_S): another rank is stuck or gone",
             m->w->timeout);
    return fail_abort(m, op, why);
}

static int counts_first(ncomm *m);

/* op's failure when the host world stopped: another rank failed, or this
 * one did elsewhere (its communication thread, say: why then names it). */
static int host_failed(ncomm *m, const char *op, const char *why)
{
    if (counts_first(m) != 0) return -1; /* (the cause here, likely of the other rank's failure too) */
    char msg[800], own[32];
    int n = snprintf(own, sizeof own, "rank %d", m->c.world_rank);
    int self = !strncmp(why, own, (size_t)n) && !isdigit((unsigned char)why[n]);
    snprintf(msg, sizeof msg, "%s (%.700s)", self ? "this rank failed elsewhere" : COMM_ANOTHER_FAILED, why);
    return fail_abort(m, op, msg);
}

/* op's failure when an own world's abort was asked for while it waited. */
static int asked_abort(ncomm *m, const char *op)
{
    return comm_fail(&m->c, op, "the world's NCCL communicators were aborted (%s)", m->w->why);
}

/* A call enqueued work on x (its stream): the next wait waits for it, and
 * in an ordered world so will the caller's stream. */
static void mark(ncomm *x, const char *op)
{
    x->touched = x->fresh = 1;
    x->last = op;
}

/* A query's answer, with "not ready" (no error: the work is still going)
 * cleared from the thread's last error, where a kernel launch's check
 * (cudaGetLastError) would otherwise find it. */
static cudaError_t not_ready_clear(cudaError_t ce)
{
    if (ce == cudaErrorNotReady) (void)cudaGetLastError();
    return ce;
}

/* Ordered world: checks the all-to-all counts of the world's handles that
 * are back (what each peer sends against what the caller expected); a
 * mismatch fails the all-to-all after the fact and aborts the world (its
 * transfers may wait for bytes that never come). 0, or -1 (recorded in m). */
static int check_counts(ncomm *m)
{
    for (ncomm *x = m->w->comms; x; x = x->next)
        for (int i = 0; i < A2A_CHECKS; i++) {
            a2a_check *k = &x->chk[i];
            if (!k->pending) continue;
            cudaError_t ce = not_ready_clear(cudaEventQuery(k->back));
            if (ce == cudaErrorNotReady) continue;
            if (ce != cudaSuccess) return cuda_fail(m, "all-to-all", "cudaEventQuery", ce);
            k->pending = 0;
            int p = x->c.size;
            for (int q = 0; q < p; q++) {
                if (k->host[p + q] == k->want[q]) continue;
                char why[640];
                snprintf(why, sizeof why, "rank %d expected %zu floats from rank %d, which sends %llu", x->c.rank,
                         k->want[q], q, (unsigned long long)k->host[p + q]);
                return fail_abort(m, "all-to-all", why);
            }
        }
    return 0;
}

/* Ordered world, a failure seen (this rank's NCCL error, or another
 * rank's through the host world): the all-to-all counts not back yet get
 * COUNTS_GRACE_S to come back (they travel ahead of the data), since
 * counts that disagree cause such failures and say best what went wrong.
 * -1 if they disagree (recorded in m), else 0. */
static int counts_first(ncomm *m)
{
    if (!m->w->ordered || m->w->aborted) return 0;
    double until = comm_now() + COUNTS_GRACE_S;
    for (;;) {
        if (check_counts(m) != 0) return -1;
        int pending = 0;
        for (ncomm *x = m->w->comms; x && !pending; x = x->next)
            for (int i = 0; i < A2A_CHECKS; i++) pending |= x->chk[i].pending;
        if (!pending || comm_now() > until) return 0;
        comm_sleep(1e-3);
    }
}

/* One look at the world's touched handles: 1 while one is busy (NCCL
 * still enqueueing; with streams, also its stream still working), else 0
 * (a handle whose stream is done is no longer touched); -1 when one failed
 * (the world aborted, recorded in m). */
static int look(ncomm *m, const char *op, int streams)
{
    int busy = 0;
    for (ncomm *x = m->w->comms; x; x = x->next) {
        if (!x->touched) continue;
        ncclResult_t st = ncclSuccess, rc = ncclCommGetAsyncError(x->nc, &st);
        if (rc != ncclSuccess) st = rc;
        if (st == ncclInProgress) {
            busy = 1;
            continue;
        }
        if (st != ncclSuccess) /* (ordered: all-to-all counts that disagree say why first) */
            return counts_first(m) != 0 ? -1 : nccl_fail(x->nc, m, op, "ncclCommGetAsyncError", st);
        if (!streams) continue;
        cudaError_t ce = not_ready_clear(cudaStreamQuery(x->stream));
        if (ce == cudaErrorNotReady) {
            busy = 1;
            continue;
        }
        if (ce != cudaSuccess) return cuda_fail(m, op, "cudaStreamQuery", ce);
        x->touched = x->fresh = 0;
    }
    return busy;
}

/* Polls the touched handles until none is busy (look): with streams,
 * until their work is done, else until NCCL has enqueued it (a
 * non-blocking communicator's ncclInProgress ends). Errors, the host
 * world's failure and the timeout abort the world, recorded in m. */
static int wait_for(ncomm *m, const char *op, int streams)
{
    nworld *w = m->w;
    double until = comm_now() + w->timeout;
    char why[640];
    for (int polls = 0;; pause_poll(&polls)) {
        if (take_abort(w)) return asked_abort(m, op);
        if (host_down(w, polls, why, sizeof why)) return host_failed(m, op, why);
        if (w->ordered && check_counts(m) != 0) return -1;
        int busy = look(m, op, streams);
        if (busy <= 0) return busy;
        if (comm_now() > until) return timed_out(m, op);
    }
}

/* Waits until the work enqueued on the world's touched handles is done. */
static int finish(ncomm *m, const char *op) { return wait_for(m, op, 1); }

/* Ordered world: m's stream waits for the caller's work so far, which
 * writes the call's buffers or reads those it writes. */
static int after_caller(ncomm *m, const char *op)
{
    nworld *w = m->w;
    if (!w->ordered) return 0;
    cudaError_t ce = cudaEventRecord(w->before, w->caller);
    if (ce != cudaSuccess) return cuda_fail(m, op, "cudaEventRecord", ce);
    ce = cudaStreamWaitEvent(m->stream, w->before, 0);
    return ce == cudaSuccess ? 0 : cuda_fail(m, op, "cudaStreamWaitEvent", ce);
}

/* Ordered world: the caller's stream waits for the work on x's stream so
 * far (failures recorded in m). */
static int join_caller(ncomm *x, ncomm *m, const char *op)
{
    cudaError_t ce = cudaEventRecord(x->done, x->stream);
    if (ce != cudaSuccess) return cuda_fail(m, op, "cudaEventRecord", ce);
    ce = cudaStreamWaitEvent(m->w->caller, x->done, 0);
    return ce == cudaSuccess ? 0 : cuda_fail(m, op, "cudaStreamWaitEvent", ce);
}

/* After a launch: the host waits for the work (finish); in an ordered
 * world, once NCCL has enqueued it, the caller's stream waits for every
 * stream that got work instead, and the host goes on; in a deferred one
 * (a queue's), the host goes on once it is enqueued. */
static int settle(ncomm *m, const char *op)
{
    nworld *w = m->w;
    if (w->deferred) return wait_for(m, op, 0); /* a queue's: its thread watches the work (comm_nccl_progress) */
    if (!w->ordered) return finish(m, op);
    if (wait_for(m, op, 0) != 0) return -1;
    for (ncomm *x = w->comms; x; x = x->next) {
        if (!x->fresh) continue;
        if (join_caller(x, m, op) != 0) return -1;
        x->fresh = 0;
    }
    return 0;
}

/* Waits for event ev, or (ev NULL) for m's stream alone (a staging copy:
 * no NCCL work on it), with a wait's checks. */
static int wait_gpu(ncomm *m, const char *op, cudaEvent_t ev)
{
    double until = comm_now() + m->w->timeout;
    char why[640];
    for (int polls = 0;; pause_poll(&polls)) {
        if (take_abort(m->w)) return asked_abort(m, op);
        if (host_down(m->w, polls, why, sizeof why)) return host_failed(m, op, why);
        cudaError_t ce = not_ready_clear(ev ? cudaEventQuery(ev) : cudaStreamQuery(m->stream));
        if (ce == cudaSuccess) return 0;
        if (ce != cudaErrorNotReady) return cuda_fail(m, op, ev ? "cudaEventQuery" : "cudaStreamQuery", ce);
        if (comm_now() > until) return timed_out(m, op);
    }
}

static int drain(ncomm *m, const char *op) { return wait_gpu(m, op, NULL); }

/* Polls a communicator being made (init, split) until it is ready, or
 * not: *st is its state; 0, or -1 past the deadline, or -2 when the world
 * w was bootstrapped over was aborted (why says why). */
static int ready(ncclComm_t nc, double until, const nworld *w, ncclResult_t *st, char *why, size_t n)
{
    for (int polls = 0;; pause_poll(&polls)) {
        if (w && host_down(w, polls, why, n)) return -2;
        ncclResult_t rc = ncclCommGetAsyncError(nc, st);
        if (rc != ncclSuccess) *st = rc;
        if (*st != ncclInProgress) return 0;
        if (comm_now() > until) return -1;
    }
}

/* ---- the calls -------------------------------------------------------- */

/* -1 (with why) when the world was aborted. */
static int dead(ncomm *m, const char *op)
{
    if (!take_abort(m->w) && m->nc) return 0;
    return comm_fail(&m->c, op, "the world's NCCL communicators were aborted (%s)",
                     m->w->aborted ? m->w->why : "no communicator");
}

/* The world's GPU made the calling thread's current device: a queue's
 * thread calls here first, and its first CUDA call on no device would make
 * device 0's context (memory on another process's GPU when every process
 * sees every GPU, as under torchrun). */
static void on_gpu(const ncomm *m)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == m->w->device) return;
    if (cudaSetDevice(m->w->device) != cudaSuccess) (void)cudaGetLastError(); /* (the call's own check reports it) */
}

/* -1 (not aborting) unless p is device memory the NCCL calls can use:
 * the world's GPU's (another GPU's would fault NCCL's kernels, or go
 * through peer access the world never asked for), or managed memory;
 * -1 aborting the world if CUDA cannot say (its GPU failed). */
static int on_device(ncomm *m, const char *op, const void *p, size_t bytes)
{
    struct cudaPointerAttributes a;
    on_gpu(m);
    if (bytes == 0) return 0;
    memset(&a, 0, sizeof a);
    cudaError_t rc = cudaPointerGetAttributes(&a, p); /* (host memory CUDA does not know: no error) */
    if (rc != cudaSuccess) return cuda_fail(m, op, "cudaPointerGetAttributes", rc); /* a failed GPU, say */
    if ((a.type == cudaMemoryTypeDevice && a.device == m->w->device) || a.type == cudaMemoryTypeManaged) return 0;
    if (a.type == cudaMemoryTypeDevice)
        return comm_fail(&m->c, op, "buffer %p is memory of CUDA device %d, not of this communicator's GPU (%d)", p,
                         a.device, m->w->device);
    return comm_fail(&m->c, op, "buffer %p is not device memory (the NCCL communicator takes device pointers)", p);
}

/* Issues the world's deferred sends, inside an NCCL group; on a failure,
 * *bad is the handle whose send failed. Sends to oneself stay pending (a
 * receive takes them without NCCL), unless self: at a group's end, where
 * the group's receive from oneself takes them through NCCL. */
static ncclResult_t issue_sends(nworld *w, int self, ncomm **bad)
{
    for (ncomm *x = w->comms; x; x = x->next) {
        int kept = 0;
        for (int i = 0; i < x->pending; i++) {
            nslot s = x->slot[i];
            if (s.peer == x->c.rank && !self) { /* kept, in order; its slot's buffer moves to i */
                x->slot[i] = x->slot[kept];
                x->slot[kept++] = s;
                continue;
            }
            ncclResult_t rc = ncclSend(s.data, s.bytes, ncclChar, s.peer, x->nc, x->stream);
            if (failed(rc)) {
                *bad = x;
                return rc;
            }
            mark(x, "send");
        }
        x->pending = kept; /* the issued buffers stay untouched until the wait for them ends */
    }
    return ncclSuccess;
}

/* Whether any deferred send would go through NCCL. */
static int any_pending(const nworld *w)
{
    for (const ncomm *x = w->comms; x; x = x->next)
        for (int i = 0; i < x->pending; i++)
            if (x->slot[i].peer != x->c.rank) return 1;
    return 0;
}

/* Ends an NCCL group this file opened, whose calls returned rc (the first
 * failure: `call` on handle bad), then aborts, or waits for the group
 * (unless it is nested in the caller's group_begin: then group_end waits).
 * The group is closed before any abort. */
static int close_group(ncomm *m, const char *op, const char *call, ncclResult_t rc, ncomm *bad)
{
    ncclResult_t end = group_end();
    if (failed(rc)) return nccl_fail(bad->nc, m, op, call, rc);
    if (failed(end)) return nccl_fail(m->nc, m, op, "ncclGroupEnd", end);
    return m->w->group ? 0 : settle(m, op);
}

/* The deferred sends go out before a call that is not a receive, and the
 * call waits for them to be received. */
static int flush_sends(ncomm *m, const char *op)
{
    ncomm *bad = m;
    if (!any_pending(m->w)) return 0;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    rc = issue_sends(m->w, 0, &bad);
    return close_group(m, op, "ncclSend", rc, bad);
}

/* The start of every call: -1 if the world was aborted (or, ordered, an
 * all-to-all's counts that are back disagree); outside a group, the
 * deferred sends go first; in an ordered world, m's stream waits for the
 * caller's. */
static int begin(ncomm *m, const char *op)
{
    on_gpu(m);
    if (dead(m, op) != 0 || (m->w->ordered && check_counts(m) != 0)) return -1;
    if (!m->w->group && flush_sends(m, op) != 0) return -1;
    return after_caller(m, op);
}

/* After a call enqueued one NCCL operation (rc): in a group it waits for
 * group_end, else for the operation (settle). */
static int issued(ncomm *m, const char *op, const char *call, ncclResult_t rc)
{
    if (failed(rc)) return nccl_fail(m->nc, m, op, call, rc);
    mark(m, op);
    return m->w->group ? 0 : settle(m, op);
}

static int n_all_reduce(comm *c, float *buf, size_t n)
{
    ncomm *m = (ncomm *)c;
    if (on_device(m, "all-reduce", buf, n) != 0 || begin(m, "all-reduce") != 0) return -1;
    return issued(m, "all-reduce", "ncclAllReduce",
                  LONE(m, ncclAllReduce(buf, buf, n, ftype(m), ncclSum, m->nc, m->stream)));
}

/* in[size x n] -> out[n]; out may be in + rank x n (NCCL's in-place form),
 * no other overlap. */
static int n_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    ncomm *m = (ncomm *)c;
    if (on_device(m, "reduce-scatter", in, n) != 0 || on_device(m, "reduce-scatter", out, n) != 0 ||
        begin(m, "reduce-scatter") != 0)
        return -1;
    return issued(m, "reduce-scatter", "ncclReduceScatter",
                  LONE(m, ncclReduceScatter(in, out, n, ftype(m), ncclSum, m->nc, m->stream)));
}

/* in[n] -> out[size x n]; in may be out + rank x n. */
static int n_all_gather(comm *c, const float *in, float *out, size_t n)
{
    ncomm *m = (ncomm *)c;
    if (on_device(m, "all-gather", in, n) != 0 || on_device(m, "all-gather", out, n) != 0 ||
        begin(m, "all-gather") != 0)
        return -1;
    return issued(m, "all-gather", "ncclAllGather",
                  LONE(m, ncclAllGather(in, out, n, ftype(m), m->nc, m->stream)));
}

/* Copies bytes between m's pinned host mirror and the device (either way)
 * and waits. */
static int copy_wait(ncomm *m, const char *op, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes, kind, m->stream);
    if (ce != cudaSuccess) return cuda_fail(m, op, "cudaMemcpyAsync", ce);
    return drain(m, op);
}

/* A copy between device buffers for a call (a send's staging, a receive
 * from oneself): waited for, or, in an ordered world, between the
 * caller's work before and after it. */
static int copy_in_turn(ncomm *m, const char *op, void *dst, const void *src, size_t bytes)
{
    if (!m->w->ordered) return copy_wait(m, op, dst, src, bytes, cudaMemcpyDeviceToDevice);
    if (after_caller(m, op) != 0) return -1;
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, m->stream);
    if (ce != cudaSuccess) return cuda_fail(m, op, "cudaMemcpyAsync", ce);
    m->touched = 1; /* (not fresh: joined now; in a group, a fresh NCCL call stays fresh) */
    m->last = op;
    return join_caller(m, m, op);
}

/* In an NCCL group the caller opened: the counts on m's device buffer
 * ([p] this rank's, then [p] received from each peer) go to and come from
 * every peer; the first failure. */
static ncclResult_t counts_exchange(ncomm *m)
{
    int p = m->c.size;
    ncclResult_t rc = ncclSuccess;
    for (int q = 0; q < p && !failed(rc); q++) {
        rc = ncclSend(m->dev + q, 1, ncclUint64, q, m->nc, m->stream);
        if (!failed(rc)) rc = ncclRecv(m->dev + p + q, 1, ncclUint64, q, m->nc, m->stream);
    }
    mark(m, "all-to-all");
    return rc;
}

/* Every rank learns what each peer sends it; -1 on every rank when one
 * expected other counts (the lowest such rank says which): the threads and
 * MPI backends' check, on the device. */
static int a2a_counts(ncomm *m, const size_t *send, const size_t *recv)
{
    const char *op = "all-to-all";
    int p = m->c.size, bad = -1;
    uint64_t *mine = m->host, *theirs = m->host + p;
    int32_t flag;
    for (int q = 0; q < p; q++) mine[q] = send[q];
    if (copy_wait(m, op, m->dev, mine, (size_t)p * sizeof *mine, cudaMemcpyHostToDevice) != 0) return -1;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    rc = counts_exchange(m);
    if (close_group(m, op, "ncclSend/ncclRecv of the counts", rc, m) != 0 ||
        copy_wait(m, op, theirs, m->dev + p, (size_t)p * sizeof *theirs, cudaMemcpyDeviceToHost) != 0)
        return -1;
    for (int q = p - 1; q >= 0; q--)
        if (theirs[q] != recv[q]) bad = q;
    /* the lowest rank that expected other counts, on every rank */
    int32_t *dflag = (int32_t *)(m->dev + 2 * (size_t)p), *hflag = (int32_t *)(m->host + 2 * (size_t)p);
    *hflag = bad >= 0 ? m->c.rank : INT_MAX;
    if (copy_wait(m, op, dflag, hflag, sizeof *hflag, cudaMemcpyHostToDevice) != 0 ||
        issued(m, op, "ncclAllReduce",
               LONE(m, ncclAllReduce(dflag, dflag, 1, ncclInt32, ncclMin, m->nc, m->stream))) != 0 ||
        copy_wait(m, op, hflag, dflag, sizeof *hflag, cudaMemcpyDeviceToHost) != 0)
        return -1;
    flag = *hflag;
    if (bad >= 0)
        return comm_fail(&m->c, op, "rank %d expected %zu floats from rank %d, which sends %llu", m->c.rank,
                         recv[bad], bad, (unsigned long long)theirs[bad]);
    if (flag != INT_MAX) return comm_fail(&m->c, op, "rank %d expected other counts", (int)flag);
    return 0;
}

/* The handle's checks (a2a_check), all made at its first ordered
 * all-to-all (a pinned allocation can take a while; not in every call):
 * one pinned block, one block of expected counts, an event each. 0, or -1
 * (not aborting: nothing is enqueued yet). */
static int check_alloc(ncomm *m)
{
    size_t p = (size_t)m->c.size;
    uint64_t *host = NULL;
    size_t *want = malloc(A2A_CHECKS * p * sizeof *want);
    cudaError_t ce = want ? cudaMallocHost((void **)&host, A2A_CHECKS * 2 * p * sizeof *host) : cudaSuccess;
    if (ce != cudaSuccess) host = NULL;
    for (int i = 0; want && ce == cudaSuccess && i < A2A_CHECKS; i++) {
        ce = cudaEventCreateWithFlags(&m->chk[i].back, cudaEventDisableTiming);
        if (ce != cudaSuccess) m->chk[i].back = NULL;
        m->chk[i].host = host + (size_t)i * 2 * p;
        m->chk[i].want = want + (size_t)i * p;
    }
    if (want && ce == cudaSuccess) return 0;
    for (int i = 0; i < A2A_CHECKS; i++) {
        if (m->chk[i].back) (void)cudaEventDestroy(m->chk[i].back);
        memset(&m->chk[i], 0, sizeof m->chk[i]);
    }
    if (host) (void)cudaFreeHost(host);
    free(want);
    return comm_fail(&m->c, "all-to-all", "the counts' checks: %s",
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "out of memory");
}

/* Ordered world: the counts go to the peers and theirs come back on m's
 * stream, ahead of the data, and are checked once back (check_counts, at
 * the world's next call or wait): the host waits for neither. */
static int a2a_counts_later(ncomm *m, const size_t *send, const size_t *recv)
{
    const char *op = "all-to-all";
    int p = m->c.size;
    a2a_check *k = &m->chk[m->chk_next];
    if (k->pending && (wait_gpu(m, op, k->back) != 0 || check_counts(m) != 0)) return -1; /* the ring is full */
    if (!k->host && check_alloc(m) != 0) return -1;
    for (int q = 0; q < p; q++) k->host[q] = send[q], k->want[q] = recv[q];
    cudaError_t ce = cudaMemcpyAsync(m->dev, k->host, (size_t)p * sizeof *k->host, cudaMemcpyHostToDevice, m->stream);
    if (ce != cudaSuccess) return cuda_fail(m, op, "cudaMemcpyAsync", ce);
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    rc = counts_exchange(m);
    ncclResult_t end = group_end();
    if (failed(rc)) return nccl_fail(m->nc, m, op, "ncclSend/ncclRecv of the counts", rc);
    if (failed(end)) return nccl_fail(m->nc, m, op, "ncclGroupEnd", end);
    if (wait_for(m, op, 0) != 0) return -1; /* enqueued: the copy back follows it on the stream */
    ce = cudaMemcpyAsync(k->host + p, m->dev + p, (size_t)p * sizeof *k->host, cudaMemcpyDeviceToHost, m->stream);
    if (ce == cudaSuccess) ce = cudaEventRecord(k->back, m->stream);
    if (ce != cudaSuccess) return cuda_fail(m, op, "cudaMemcpyAsync", ce);
    k->pending = 1;
    m->chk_next = (m->chk_next + 1) % A2A_CHECKS;
    return 0;
}

/* send[q] floats of in (peers' parts in rank order) to q, recv[q] from q
 * into out: a group of ncclSend/ncclRecv, after the counts are checked
 * (outside a group). */
static int n_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    const char *op = "all-to-all";
    ncomm *m = (ncomm *)c;
    size_t ns = 0, nr = 0;
    for (int q = 0; q < c->size; q++) {
        ns += send[q];
        nr += recv[q];
    }
    if (on_device(m, op, in, ns) != 0 || on_device(m, op, out, nr) != 0 || begin(m, op) != 0) return -1;
    /* (on m's stream after the caller's work: begin) */
    if (!m->w->group && (m->w->ordered ? a2a_counts_later(m, send, recv) : a2a_counts(m, send, recv)) != 0)
        return -1;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    size_t at = 0, rat = 0;
    for (int q = 0; q < c->size && !failed(rc); q++) {
        if (send[q]) rc = ncclSend(fat(m, in, at), send[q], ftype(m), q, m->nc, m->stream);
        if (recv[q] && !failed(rc)) rc = ncclRecv(fat(m, out, rat), recv[q], ftype(m), q, m->nc, m->stream);
        at += send[q];
        rat += recv[q];
    }
    mark(m, op);
    return close_group(m, op, "ncclSend/ncclRecv", rc, m); /* in the caller's group, only closes ours */
}

static int n_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    ncomm *m = (ncomm *)c;
    if (root < 0 || root >= c->size) return comm_fail(c, "broadcast", "root %d of a group of %d", root, c->size);
    if (on_device(m, "broadcast", buf, bytes) != 0 || begin(m, "broadcast") != 0) return -1;
    return issued(m, "broadcast", "ncclBroadcast",
                  LONE(m, ncclBroadcast(buf, buf, bytes, ncclChar, root, m->nc, m->stream)));
}

static int n_barrier(comm *c)
{
    ncomm *m = (ncomm *)c;
    if (begin(m, "barrier") != 0) return -1;
    int32_t *one = (int32_t *)(m->dev + 2 * (size_t)c->size);
    ncclResult_t rc = LONE(m, ncclAllReduce(one, one, 1, ncclInt32, ncclSum, m->nc, m->stream));
    if (failed(rc)) return nccl_fail(m->nc, m, "barrier", "ncclAllReduce", rc);
    mark(m, "barrier");
    return m->w->group ? 0 : finish(m, "barrier"); /* every rank came: a wait on the host, ordered or not */
}

static int peer_ok(comm *c, int peer, const char *what)
{
    if (peer >= 0 && peer < c->size) return 1;
    snprintf(c->error, sizeof c->error, "%s rank %d of a group of %d", what, peer, c->size);
    return 0;
}

/* A staging slot for a send of bytes, at the end of the pending ones;
 * NULL (with why) if out of memory. */
static nslot *stage_slot(ncomm *m, size_t bytes)
{
    if (m->pending == m->slots) {
        int n = m->slots ? 2 * m->slots : 4;
        nslot *s = realloc(m->slot, (size_t)n * sizeof *s);
        if (!s) return NULL;
        memset(s + m->slots, 0, (size_t)(n - m->slots) * sizeof *s);
        m->slot = s;
        m->slots = n;
    }
    nslot *s = &m->slot[m->pending];
    if (s->cap < bytes) { /* in the stream's order: a cudaFree would wait for every stream of the GPU */
        if (s->data) (void)cudaFreeAsync(s->data, m->stream);
        s->data = NULL;
        s->cap = 0;
        if (cudaSetDevice(m->w->device) != cudaSuccess || cudaMallocAsync(&s->data, bytes, m->stream) != cudaSuccess) {
            (void)cudaGetLastError();
            s->data = NULL;
            return NULL;
        }
        s->cap = bytes;
    }
    return s;
}

/* Eager on NCCL's terms: the data is copied to a staging buffer and the
 * send deferred (see the top of the file). */
static int n_send(comm *c, const void *buf, size_t bytes, int peer)
{
    ncomm *m = (ncomm *)c;
    if (!peer_ok(c, peer, "send to") || dead(m, "send") != 0 || on_device(m, "send", buf, bytes) != 0) return -1;
    if (bytes == 0) return 0; /* as the receive of 0 bytes: nothing moves */
    nslot *s = stage_slot(m, bytes);
    if (!s) return comm_fail(c, "send", "out of device memory staging %zu bytes", bytes);
    if (copy_in_turn(m, "send", s->data, buf, bytes) != 0) return -1;
    s->bytes = bytes;
    s->peer = peer;
    m->pending++;
    return 0;
}

/* A receive from oneself, outside a group: the oldest send to oneself,
 * copied from its staging buffer (NCCL is not involved, so any number of
 * sends to oneself may come first). */
static int recv_self(ncomm *m, void *buf, size_t bytes)
{
    int j = 0;
    while (j < m->pending && m->slot[j].peer != m->c.rank) j++;
    if (j == m->pending)
        return comm_fail(&m->c, "receive", "from itself (rank %d), which sent it nothing", m->c.rank);
    nslot s = m->slot[j];
    memmove(&m->slot[j], &m->slot[j + 1], (size_t)(m->pending - j - 1) * sizeof s);
    m->slot[--m->pending] = s; /* taken: its buffer is free again */
    if (s.bytes != bytes) {
        snprintf(m->c.error, sizeof m->c.error, "receive from rank %d: %zu bytes sent, %zu expected", m->c.rank,
                 s.bytes, bytes);
        return -1;
    }
    return copy_in_turn(m, "receive", buf, s.data, bytes);
}

/* Outside a group: one NCCL group with the world's deferred sends. */
static int n_recv(comm *c, void *buf, size_t bytes, int peer)
{
    ncomm *m = (ncomm *)c;
    if (!peer_ok(c, peer, "receive from") || dead(m, "receive") != 0 || on_device(m, "receive", buf, bytes) != 0)
        return -1;
    if (bytes == 0) return 0;
    if (m->w->group)
        return after_caller(m, "receive") != 0
                 ? -1
                 : issued(m, "receive", "ncclRecv", ncclRecv(buf, bytes, ncclChar, peer, m->nc, m->stream));
    if (peer == c->rank) return begin(m, "receive") != 0 ? -1 : recv_self(m, buf, bytes);
    if (after_caller(m, "receive") != 0) return -1;
    ncomm *bad = m;
    const char *call = "ncclSend";
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl_fail(m->nc, m, "receive", "ncclGroupStart", rc);
    rc = issue_sends(m->w, 0, &bad);
    if (!failed(rc)) {
        bad = m;
        call = "ncclRecv";
        rc = ncclRecv(buf, bytes, ncclChar, peer, m->nc, m->stream);
        mark(m, "receive");
    }
    return close_group(m, "receive", call, rc, bad);
}

static int n_group_begin(comm *c)
{
    ncomm *m = (ncomm *)c;
    if (dead(m, "group") != 0) return -1;
    if (m->w->group == 0) {
        ncclResult_t rc = ncclGroupStart();
        if (rc != ncclSuccess) return nccl_fail(m->nc, m, "group", "ncclGroupStart", rc);
    }
    m->w->group++;
    return 0;
}

/* The outermost group_end issues the group (with the deferred sends) and
 * waits for it. */
static int n_group_end(comm *c)
{
    ncomm *m = (ncomm *)c;
    if (dead(m, "group") != 0) return -1;
    if (m->w->group == 0) return comm_fail(c, "group", "group_end without group_begin");
    if (--m->w->group > 0) return 0;
    ncomm *bad = m;
    ncclResult_t rc = issue_sends(m->w, 1, &bad);
    return close_group(m, "group", "ncclSend", rc, bad);
}

/* An own world (a queue's) may be aborted from another thread: that asks
 * the thread using it (take_abort). A world already aborted (the call that
 * failed said why) has nothing left to abort or say. */
static void n_abort(comm *c, const char *why)
{
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    if (!w->own && w->aborted) return;
    char msg[sizeof w->why];
    comm_rank_failed(msg, sizeof msg, c->world_rank, why);
    fprintf(stderr, "mesh: %s; aborting its NCCL communicators\n", msg);
    fflush(stderr);
    if (!w->own) {
        abort_world(w, msg);
        return;
    }
    int first = 0;
    if (atomic_compare_exchange_strong(&w->claimed, &first, 1)) {
        snprintf(w->asked_why, sizeof w->asked_why, "%s", msg);
        atomic_store_explicit(&w->asked, 1, memory_order_release);
    }
}

/* ---- handles ---------------------------------------------------------- */

/* The handle's stream and count buffers; 0, or -1 with why. */
static int handle_buffers(ncomm *m, int device, char *err, size_t n)
{
    size_t bytes = (2 * (size_t)m->c.size + 1) * sizeof *m->dev;
    const char *what = NULL;
    if (cudaSetDevice(device) != cudaSuccess) what = "cudaSetDevice";
    else if (cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking) != cudaSuccess)
        what = "cudaStreamCreateWithFlags";
    else if (cudaMalloc((void **)&m->dev, bytes) != cudaSuccess) what = "cudaMalloc";
    else if (cudaMallocHost((void **)&m->host, bytes) != cudaSuccess) what = "cudaMallocHost";
    else if (cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming) != cudaSuccess)
        what = "cudaEventCreateWithFlags";
    if (!what) return 0;
    snprintf(err, n, "%s: %s", what, cudaGetErrorString(cudaGetLastError()));
    if (m->host) (void)cudaFreeHost(m->host);
    if (m->dev) (void)cudaFree(m->dev);
    if (m->stream) (void)cudaStreamDestroy(m->stream);
    return -1;
}

/* A handle on nc, owned from now on (aborted if this fails: NULL with why
 * in err), added to the world. */
static ncomm *wrap(nworld *w, ncclComm_t nc, int world_rank, char *err, size_t n)
{
    ncomm *m = calloc(1, sizeof *m);
    int rank = 0, size = 0;
    if (!m) snprintf(err, n, "out of memory");
    else if (ncclCommUserRank(nc, &rank) != ncclSuccess || ncclCommCount(nc, &size) != ncclSuccess || size < 1)
        snprintf(err, n, "ncclCommUserRank or ncclCommCount failed");
    if (!m || size < 1) {
        (void)ncclCommAbort(nc);
        free(m);
        return NULL;
    }
    m->c.v = &nccl_vtbl;
    m->c.rank = rank;
    m->c.size = size;
    m->c.world_rank = world_rank;
    if (handle_buffers(m, w->device, err, n) != 0) {
        (void)ncclCommAbort(nc);
        free(m);
        return NULL;
    }
    m->w = w;
    m->nc = nc;
    pthread_mutex_lock(&w->mu);
    m->next = w->comms;
    w->comms = m;
    pthread_mutex_unlock(&w->mu);
    return m;
}

static void n_free(comm *c);

/* A new communicator's first collective, made where it is made: NCCL
 * connects a communicator's peers lazily at its first collective (since
 * 2.22), allocating as it goes, and two communicators connecting at once
 * on one GPU from two threads (a rank's and its queue's, in orders that
 * differ between ranks) may deadlock, as NCCL's documentation warns. So
 * every rank connects each communicator here, in creation order, with a
 * barrier. */
static int connect_now(ncomm *m) { return n_barrier(&m->c); }

static int n_split(comm *c, int color, int key, comm **out)
{
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    ncclComm_t nc = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t st = ncclSuccess;
    char why[640];
    *out = NULL;
    if (w->group) return comm_fail(c, "split", "split between group_begin and group_end");
    if (begin(m, "split") != 0) return -1;
    cfg.blocking = 0;
    cfg.splitShare = 0; /* (not NCCL_COMM_SPLIT_SHARE_RESOURCES): a queue's split runs beside its parent */
    ncclResult_t rc = ncclCommSplit(m->nc, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &cfg);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        if (nc) (void)ncclCommAbort(nc);
        return nccl_fail(m->nc, m, "split", "ncclCommSplit", rc);
    }
    double until = comm_now() + w->timeout;
    int late = ready(m->nc, until, w, &st, why, sizeof why);
    if (!late && st == ncclSuccess && nc) late = ready(nc, until, w, &st, why, sizeof why);
    if (late || st != ncclSuccess) {
        if (nc) (void)ncclCommAbort(nc);
        if (late == -2) return host_failed(m, "split", why);
        if (late) return timed_out(m, "split");
        return nccl_fail(m->nc, m, "split", "ncclCommSplit", st);
    }
    if (!nc) return 0; /* color < 0: in no group */
    ncomm *x = wrap(w, nc, c->world_rank, why, sizeof why);
    if (!x) return comm_fail(c, "split", "%s", why);
    x->half = m->half;
    if (connect_now(x) != 0) {
        int r = comm_fail(c, "split", "%s", x->c.error);
        n_free(&x->c);
        return r;
    }
    *out = &x->c;
    return 0;
}

/* Issues the deferred sends, lets the communicator finish (ncclCommFinalize,
 * within the timeout) and frees it; the world goes with its last handle. */
static void n_free(comm *c)
{
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    (void)take_abort(w);
    if (!w->aborted && m->nc && !w->group && flush_sends(m, "free") != 0)
        fprintf(stderr, "mesh: %s\n", c->error);
    if (m->nc) {
        ncclResult_t st = ncclSuccess, rc = ncclCommFinalize(m->nc);
        int late = rc != ncclSuccess && rc != ncclInProgress, down = 0;
        char why[sizeof w->why];
        if (!late) { /* (a stopped host world: a rank failed, and the calls in flight wait for it) */
            down = ready(m->nc, comm_now() + w->timeout, w, &st, why, sizeof why) == -2;
            late = down || st != ncclSuccess;
        }
        if (down) {
            abort_world(w, why);
        } else if (late) {
            char msg[sizeof w->why];
            snprintf(msg, sizeof msg, "rank %d: ncclCommFinalize did not end cleanly (%s)", c->world_rank,
                     ncclGetErrorString(rc != ncclSuccess && rc != ncclInProgress ? rc : st));
            fprintf(stderr, "mesh: %s; aborting the world's NCCL communicators\n", msg);
            abort_world(w, msg); /* the world's other handles go without waiting a timeout each */
        } else {
            pthread_mutex_lock(&w->mu);
            (void)ncclCommDestroy(m->nc);
            m->nc = NULL;
            pthread_mutex_unlock(&w->mu);
        }
    }
    /* (its work done: the last all-to-all counts are back) */
    if (w->ordered && !w->aborted && check_counts(m) != 0) fprintf(stderr, "mesh: %s\n", c->error);
    pthread_mutex_lock(&w->mu);
    for (ncomm **at = &w->comms; *at; at = &(*at)->next)
        if (*at == m) {
            *at = m->next;
            break;
        }
    int last = !w->comms;
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < m->slots; i++)
        if (m->slot[i].data) (void)cudaFreeAsync(m->slot[i].data, m->stream);
    (void)cudaStreamSynchronize(m->stream);
    if (m->chk[0].host) (void)cudaFreeHost(m->chk[0].host); /* (check_alloc's blocks) */
    free(m->chk[0].want);
    for (int i = 0; i < A2A_CHECKS; i++)
        if (m->chk[i].back) (void)cudaEventDestroy(m->chk[i].back);
    free(m->slot);
    (void)cudaFree(m->dev);
    (void)cudaFreeHost(m->host);
    (void)cudaEventDestroy(m->done);
    (void)cudaStreamDestroy(m->stream);
    free(m);
    if (last) world_free(w);
}

/* A bucket of device buffers: a call per buffer (comm.c's packing is host
 * memory), all in one NCCL group, which NCCL launches as one (its
 * aggregated operations); the deferred sends go out before it, as before
 * any collective. A call that fails in NCCL has aborted the world, which
 * closed the group; one refused before (a host buffer) aborts it too. */
typedef int (*bucket_fn)(comm *c, float *buf, size_t n);

static int bucket(comm *c, const char *op, bucket_fn fn, float *const *bufs, const size_t *n, int k)
{
    ncomm *m = (ncomm *)c;
    if (k == 1) return fn(c, bufs[0], n[0]);
    if (begin(m, op) != 0 || n_group_begin(c) != 0) return -1;
    for (int i = 0; i < k; i++) {
        if (fn(c, bufs[i], n[i]) == 0) continue;
        if (!m->w->aborted) { /* refused before NCCL (a host buffer): the group is half enqueued */
            char why[sizeof c->error];
            snprintf(why, sizeof why, "%s", c->error);
            (void)fail_abort(m, op, why);
        }
        return -1;
    }
    return n_group_end(c);
}

static int bucket_reduce_scatter(comm *c, float *buf, size_t n)
{
    size_t len = n / (size_t)c->size;
    return n_reduce_scatter(c, buf, fat((ncomm *)c, buf, (size_t)c->rank * len), len);
}

static int bucket_all_gather(comm *c, float *buf, size_t n)
{
    size_t len = n / (size_t)c->size;
    return n_all_gather(c, fat((ncomm *)c, buf, (size_t)c->rank * len), buf, len);
}

static int n_all_reduce_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    return k > 0 ? bucket(c, "all-reduce", n_all_reduce, bufs, n, k) : 0;
}

static int n_reduce_scatter_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    return k > 0 ? bucket(c, "reduce-scatter", bucket_reduce_scatter, bufs, n, k) : 0;
}

static int n_all_gather_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    return k > 0 ? bucket(c, "all-gather", bucket_all_gather, bufs, n, k) : 0;
}

static const comm_vtbl nccl_vtbl = {
    "nccl", n_all_reduce, n_reduce_scatter, n_all_gather, n_all_to_all, n_broadcast, n_send, n_recv,
    n_barrier, n_split, n_group_begin, n_group_end, n_abort, n_free, n_all_reduce_v, n_reduce_scatter_v,
    n_all_gather_v,
};

/* ---- the world -------------------------------------------------------- */

int comm_nccl_available(char *why, size_t n)
{
    return dev_cuda_probe(why, n, NULL, 0); /* device_cuda.c: dlopen of the driver, then cudaGetDeviceCount */
}

/* This rank's readiness: its device usable (0), else -1 with why. */
static int use_device(int device, char *why, size_t n)
{
    if (!comm_nccl_available(why, n)) return -1;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess) return 0;
    (void)cudaGetLastError();
    snprintf(why, n, "cudaSetDevice(%d): %s", device, cudaGetErrorString(rc));
    return -1;
}

/* What every rank contributes to the bootstrap exchange. */
typedef struct boot_rec {
    int32_t ok;    /* its device is usable and, on rank 0, the id made */
    ncclUniqueId id; /* rank 0's */
} boot_rec;

/* The world's communicator from the unique id all ranks share; host: a
 * watch on the world it was bootstrapped over (held from now on), or NULL. */
static comm *world_init(int rank, int size, int device, double timeout_s, ncclUniqueId id, comm_watch *host,
                        char *err, size_t n)
{
    nworld *w = calloc(1, sizeof *w);
    ncclComm_t nc = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t st = ncclSuccess;
    char why[256] = ""; /* (a TCP world's reason: up to 255) */
    comm_watch_hold(host);
    if (!w) {
        comm_watch_release(host);
        snprintf(err, n, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->dog_cv, NULL);
    w->host = host;
    w->device = device;
    w->timeout = timeout_s;
    cfg.blocking = 0;
    cfg.commName = "mesh";
    ncclResult_t rc = ncclCommInitRankConfig(&nc, size, id, rank, &cfg);
    int late = 0;
    if (rc == ncclSuccess || rc == ncclInProgress) {
        late = ready(nc, comm_now() + timeout_s, w, &st, why, sizeof why);
        rc = late ? ncclInProgress : st;
    }
    if (rc != ncclSuccess) {
        const char *last = ncclGetLastError(nc);
        if (late == -2)
            snprintf(err, n, "ncclCommInitRankConfig (rank %d of %d): " COMM_ANOTHER_FAILED " (%.255s)", rank, size,
                     why);
        else if (late)
            snprintf(err, n, "ncclCommInitRankConfig (rank %d of %d): the other ranks did not come within %g s "
                     "(MESH_COLLECTIVE_TIMEOUT_S)", rank, size, timeout_s);
        else
            snprintf(err, n, "ncclCommInitRankConfig (rank %d of %d): %s (NCCL error %d)%s%s", rank, size,
                     ncclGetErrorString(rc), (int)rc, last && last[0] ? ": " : "", last ? last : "");
        if (nc) (void)ncclCommAbort(nc);
        world_free(w);
        return NULL;
    }
    ncomm *m = wrap(w, nc, rank, why, sizeof why);
    if (!m) {
        snprintf(err, n, "rank %d: the world's communicator: %s", rank, why);
        world_free(w);
        return NULL;
    }
    if (connect_now(m) != 0) {
        snprintf(err, n, "rank %d: the world's first barrier: %s", rank, m->c.error);
        n_free(&m->c);
        return NULL;
    }
    watchdog_start(w);
    return &m->c;
}

/* The first rank whose record is not ok, or -1. */
static int first_bad(const boot_rec *all, int size)
{
    for (int q = 0; q < size; q++)
        if (!all[q].ok) return q;
    return -1;
}

/* Every rank's record over the TCP rendezvous (rendezvous.h); 0, or -1
 * with why. */
static int exchange(const boot_rec *mine, boot_rec *all, int rank, int size, double timeout_s, char *err, size_t n)
{
    char host[256];
    int port = 0;
    if (rdv_env_address(host, sizeof host, &port, err, n) != 0) return -1;
    rdv *r = rdv_open(host, port, rank, size, timeout_s, err, n);
    if (!r) return -1;
    int rc = rdv_all_gather(r, mine, all, sizeof *mine, err, n);
    rdv_close(r);
    return rc == 0 ? 0 : -1;
}

comm *comm_nccl_world(int rank, int size, int device, double timeout_s, char *err, size_t n)
{
    char why[640] = "", rerr[480] = "";
    boot_rec mine;
    if (size < 1 || rank < 0 || rank >= size) {
        snprintf(err, n, "rank %d of a world of %d", rank, size);
        return NULL;
    }
    if (timeout_s <= 0) timeout_s = comm_timeout_from_env();
    memset(&mine, 0, sizeof mine);
    mine.ok = use_device(device, why, sizeof why) == 0;
    /* NCCL_COMM_ID=host:port makes every rank's id point at one root: no
     * exchange (one communicator at a time, NCCL's rule) */
    if (getenv("NCCL_COMM_ID")) {
        ncclResult_t rc = mine.ok ? ncclGetUniqueId(&mine.id) : ncclSuccess;
        if (!mine.ok || rc != ncclSuccess) {
            snprintf(err, n, "rank %d cannot use GPU %d: %s", rank, device, mine.ok ? ncclGetErrorString(rc) : why);
            return NULL;
        }
        return world_init(rank, size, device, timeout_s, mine.id, NULL, err, n);
    }
    if (mine.ok && rank == 0 && ncclGetUniqueId(&mine.id) != ncclSuccess) {
        snprintf(why, sizeof why, "ncclGetUniqueId failed");
        mine.ok = 0;
    }
    /* a rank that cannot take part still comes, so that the others fail
     * naming it rather than wait until the timeout */
    boot_rec *all = calloc((size_t)size, sizeof *all);
    int rc = all ? exchange(&mine, all, rank, size, timeout_s, rerr, sizeof rerr) : -1;
    if (!all) snprintf(rerr, sizeof rerr, "out of memory");
    int bad = rc == 0 ? first_bad(all, size) : -1;
    ncclUniqueId id = all ? all[0].id : mine.id;
    free(all);
    if (!mine.ok) {
        snprintf(err, n, "rank %d cannot use GPU %d: %s%s%s", rank, device, why,
                 rc != 0 ? "; the rendezvous failed too: " : "", rc != 0 ? rerr : "");
        return NULL;
    }
    if (rc != 0) {
        snprintf(err, n, "rank %d: bootstrapping the NCCL world: %s", rank, rerr);
        return NULL;
    }
    if (bad >= 0) {
        snprintf(err, n, "rank %d cannot use its GPU (or make the NCCL id): see its error", bad);
        return NULL;
    }
    return world_init(rank, size, device, timeout_s, id, NULL, err, n);
}

comm *comm_nccl_world_mpi(comm *boot, int device, double timeout_s, char *err, size_t n)
{
    char why[640] = "";
    ncclUniqueId id;
    int rank = boot->rank, size = boot->size, bad = -1;
    if (timeout_s <= 0) timeout_s = comm_timeout_from_env();
    memset(&id, 0, sizeof id);
    int ok = use_device(device, why, sizeof why) == 0;
    if (ok && rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
        snprintf(why, sizeof why, "ncclGetUniqueId failed");
        ok = 0;
    }
    /* who cannot take part, then rank 0's id (host buffers) */
    float mine = ok ? 0.0f : 1.0f, *flags = calloc((size_t)size, sizeof *flags);
    if (!flags) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    int rc = comm_all_gather(boot, &mine, flags, 1);
    for (int q = size - 1; rc == 0 && q >= 0; q--)
        if (flags[q] != 0.0f) bad = q;
    free(flags);
    if (rc == 0 && bad < 0) rc = comm_broadcast(boot, &id, sizeof id, 0);
    if (rc != 0) {
        snprintf(err, n, "bootstrapping the NCCL world over %s: %s", boot->v->name, boot->error);
        return NULL;
    }
    if (!ok) {
        snprintf(err, n, "rank %d cannot use GPU %d: %s", rank, device, why);
        return NULL;
    }
    if (bad >= 0) {
        snprintf(err, n, "rank %d cannot use its GPU (or make the NCCL id): see its error", bad);
        return NULL;
    }
    comm_watch *watch = comm_watch_of(boot);
    comm *c = world_init(rank, size, device, timeout_s, id, watch, err, n);
    comm_watch_release(watch);
    return c;
}

int comm_nccl_set_elements(comm *c, int type)
{
    if (!c || c->v != &nccl_vtbl || type < COMM_F32 || type > COMM_F16) return -1;
    ((ncomm *)c)->half = type;
    return 0;
}

int comm_nccl_flush(comm *c)
{
    c = c ? (comm *)(uintptr_t)comm_checked_inner(c) : NULL;
    if (!c || c->v != &nccl_vtbl) return 0;
    ncomm *m = (ncomm *)c;
    if (dead(m, "flush") != 0) return -1;
    return m->w->group ? 0 : flush_sends(m, "flush"); /* in a group: its end issues them */
}

int comm_nccl_order(comm *c, void *stream)
{
    if (!c || c->v != &nccl_vtbl) return -1;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    if (dead(m, "order") != 0) return -1;
    if (w->own) return comm_fail(c, "order", "a queue's own world is waited for by its own thread");
    if (w->group) return comm_fail(c, "order", "between group_begin and group_end");
    if (!w->before) {
        cudaError_t ce = cudaSetDevice(w->device);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&w->before, cudaEventDisableTiming);
        if (ce != cudaSuccess) {
            w->before = NULL;
            return comm_fail(c, "order", "cudaEventCreateWithFlags: %s", cudaGetErrorString(ce));
        }
    }
    w->caller = (cudaStream_t)stream;
    w->ordered = 1;
    return 0;
}

int comm_nccl_watch(void *ud, double waited_s, char *why, size_t n)
{
    comm *c = ud;
    if (!c || c->v != &nccl_vtbl) return 0;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    const char *op = NULL; /* the last call of a handle with work in flight: what the wait may wait for */
    if (w->ordered && !w->aborted && check_counts(m) != 0) { /* (counts that disagree: the transfers may hang) */
        snprintf(why, n, "%s", c->error);
        return -1;
    }
    for (ncomm *x = w->comms; x && !op; x = x->next)
        if (x->touched) op = x->last ? x->last : "a call";
    if (!op) return 0; /* no NCCL work in flight: the stream's kernels end by themselves */
    char down[640]; /* (an ordered world is never a queue's own: no abort is asked of it from elsewhere) */
    int st;
    if (w->host && comm_watch_stopped(w->host, down, sizeof down)) st = host_failed(m, op, down);
    else if ((st = look(m, op, 1)) > 0) st = waited_s > w->timeout ? timed_out(m, op) : 0;
    if (st == 0) return 0;
    snprintf(why, n, "%s", c->error);
    return -1;
}

/* The handle of an own world (a queue's: one handle), or NULL (c->error
 * says why when c is an NCCL handle). */
static ncomm *own_handle(comm *c, const char *op)
{
    if (!c || c->v != &nccl_vtbl) return NULL;
    ncomm *m = (ncomm *)c;
    if (!m->w->own) {
        comm_fail(c, op, "not a queue's own world (comm_nccl_own_thread)");
        return NULL;
    }
    on_gpu(m);
    return dead(m, op) == 0 ? m : NULL;
}

int comm_nccl_defer(comm *c)
{
    ncomm *m = own_handle(c, "defer");
    if (!m) return -1;
    m->w->deferred = 1;
    return 0;
}

int comm_nccl_wait_event(comm *c, void *event)
{
    ncomm *m = own_handle(c, "wait for an event");
    if (!m) return -1;
    cudaError_t ce = cudaStreamWaitEvent(m->stream, (cudaEvent_t)event, 0);
    return ce == cudaSuccess ? 0 : cuda_fail(m, "wait for an event", "cudaStreamWaitEvent", ce);
}

int comm_nccl_record_event(comm *c, void *event)
{
    ncomm *m = own_handle(c, "record an event");
    if (!m) return -1;
    cudaError_t ce = cudaEventRecord((cudaEvent_t)event, m->stream);
    return ce == cudaSuccess ? 0 : cuda_fail(m, "record an event", "cudaEventRecord", ce);
}

void comm_nccl_thread_on_gpu(comm *c)
{
    if (c && c->v == &nccl_vtbl) on_gpu((ncomm *)c);
}

int comm_nccl_progress(comm *c, double waited_s)
{
    if (!c || c->v != &nccl_vtbl) return 0;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    if (!m->touched) return 0;
    on_gpu(m);
    const char *op = m->last ? m->last : "a call";
    char why[640];
    if (take_abort(w)) return asked_abort(m, op);
    if (host_down(w, ++w->polls, why, sizeof why)) return host_failed(m, op, why);
    int busy = look(m, op, 1);
    if (busy > 0 && waited_s > w->timeout) return timed_out(m, op);
    return busy;
}

int comm_nccl_own_thread(comm *c)
{
    if (!c || c->v != &nccl_vtbl) return 0;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    if (w->own && w->comms == m && !m->next) return 0;
    if (dead(m, "own thread") != 0) return -1;
    if (w->group || m->pending || m->touched)
        return comm_fail(c, "own thread", "the handle has work in flight (a group open, sends deferred)");
    nworld *o = calloc(1, sizeof *o);
    if (!o) return comm_fail(c, "own thread", "out of memory");
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->dog_cv, NULL);
    o->device = w->device;
    o->timeout = w->timeout;
    o->own = 1;
    o->host = w->host;
    comm_watch_hold(o->host);
    atomic_init(&o->claimed, 0);
    atomic_init(&o->asked, 0);
    pthread_mutex_lock(&w->mu); /* (w's watchdog reads its list) */
    for (ncomm **at = &w->comms; *at; at = &(*at)->next)
        if (*at == m) {
            *at = m->next;
            break;
        }
    pthread_mutex_unlock(&w->mu);
    m->next = NULL;
    m->w = o;
    o->comms = m;
    return 0;
}

#else /* no CUDA in this build */

#define NO_CUDA "this libmesh was built without CUDA (make CUDA=1)"

int comm_nccl_available(char *why, size_t n)
{
    return dev_cuda_probe(why, n, NULL, 0); /* device_cuda.c: built without CUDA */
}

comm *comm_nccl_world(int rank, int size, int device, double timeout_s, char *err, size_t n)
{
    (void)rank;
    (void)size;
    (void)device;
    (void)timeout_s;
    snprintf(err, n, "%s", NO_CUDA);
    return NULL;
}

int comm_nccl_set_elements(comm *c, int type)
{
    (void)c;
    (void)type;
    return -1;
}

int comm_nccl_own_thread(comm *c)
{
    (void)c; /* no NCCL handle exists in this build */
    return 0;
}

int comm_nccl_order(comm *c, void *stream)
{
    (void)c;
    (void)stream;
    return -1;
}

int comm_nccl_watch(void *ud, double waited_s, char *why, size_t n)
{
    (void)ud;
    (void)waited_s;
    (void)why;
    (void)n;
    return 0;
}

int comm_nccl_flush(comm *c)
{
    (void)c;
    return 0;
}

int comm_nccl_defer(comm *c)
{
    (void)c; /* no NCCL handle exists in this build */
    return -1;
}

int comm_nccl_wait_event(comm *c, void *event)
{
    (void)c;
    (void)event;
    return -1;
}

int comm_nccl_record_event(comm *c, void *event)
{
    (void)c;
    (void)event;
    return -1;
}

void comm_nccl_thread_on_gpu(comm *c)
{
    (void)c; /* no NCCL handle exists in this build */
}

int comm_nccl_progress(comm *c, double waited_s)
{
    (void)c;
    (void)waited_s;
    return 0;
}

comm *comm_nccl_world_mpi(comm *boot, int device, double timeout_s, char *err, size_t n)
{
    (void)boot;
    (void)device;
    (void)timeout_s;
    snprintf(err, n, "%s", NO_CUDA);
    return NULL;
}

#endif
