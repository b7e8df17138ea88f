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
 * were made. Hence a send before a collective reaches a peer already
 * waiting to receive it, and a send and a receive that two ranks post in
 * the same order pair up. That is not every order a pipeline makes (the
 * interleaved schedule's is not), so a handle may have ring channels
 * (comm_nccl_channels, comm_nccl_chan.c): sends to its neighbours, and
 * receives from them, on a communicator and stream per direction, issued
 * at once and waiting for nothing but their own receive: eager as the
 * threads' and MPI's (the executor's pipeline group has them). What a
 * deferred send cannot do is a send that is
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
 * The backend needs CUDA=1 (MESH_CUDA): its files (comm_nccl_impl.h lists
 * them) are built only then, and comm_nccl_none.c, built otherwise, has
 * its constructors say so.
 */
#include <stdio.h>  /* defines: snprintf, fprintf */
#include <string.h> /* defines: memset */

#include "comm_nccl_impl.h"

/* NCCL launches the work of a group at its outermost ncclGroupEnd. Two
 * threads may not issue work in parallel to independent communicators on
 * one GPU (NCCL's "Thread Safety"), which a rank's thread and its
 * communication queue's (comm_nccl_own_thread) would: so every launch, and
 * every call outside a group (made a group of its own: LONE), holds this
 * process's lock. A non-blocking communicator's call returns without
 * waiting for its peers (ncclInProgress), so the lock is held for the call
 * alone, never across a wait. */
static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;

ncclResult_t nccl__group_end(void)
{
    pthread_mutex_lock(&launch_lock);
    ncclResult_t rc = ncclGroupEnd();
    pthread_mutex_unlock(&launch_lock);
    return rc;
}

/* The result of a call made in a group of its own, which is now launched. */
ncclResult_t nccl__lone(ncclResult_t rc)
{
    ncclResult_t end = nccl__group_end();
    return nccl__failed(rc) ? rc : end;
}

/* -1 (with why) when the world was aborted. */
int nccl__dead(ncomm *m, const char *op)
{
    if (!nccl__take_abort(m->w) && m->nc) return 0;
    return comm_fail(&m->c, op, "the world's NCCL communicators were aborted (%s)",
                     m->w->aborted ? m->w->why : "no communicator");
}

/* The world's GPU made the calling thread's current device: a queue's
 * thread calls here first, and its first CUDA call on no device would make
 * device 0's context (memory on another process's GPU when every process
 * sees every GPU, as under torchrun). */
void nccl__on_gpu(const ncomm *m)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == m->w->device) return;
    if (cudaSetDevice(m->w->device) != cudaSuccess) (void)cudaGetLastError(); /* (the call's own check reports it) */
}

/* -1 (not aborting) unless p is device memory the NCCL calls can use:
 * the world's GPU's (another GPU's would fault NCCL's kernels, or go
 * through peer access the world never asked for), or managed memory;
 * -1 aborting the world if CUDA cannot say (its GPU failed). */
int nccl__on_device(ncomm *m, const char *op, const void *p, size_t bytes)
{
    struct cudaPointerAttributes a;
    nccl__on_gpu(m);
    if (bytes == 0) return 0;
    memset(&a, 0, sizeof a);
    cudaError_t rc = cudaPointerGetAttributes(&a, p); /* (host memory CUDA does not know: no error) */
    if (rc != cudaSuccess) return nccl__cuda_fail(m, op, "cudaPointerGetAttributes", rc); /* a failed GPU, say */
    if ((a.type == cudaMemoryTypeDevice && a.device == m->w->device) || a.type == cudaMemoryTypeManaged) return 0;
    if (a.type == cudaMemoryTypeDevice)
        return comm_fail(&m->c, op, "buffer %p is memory of CUDA device %d, not of this communicator's GPU (%d)", p,
                         a.device, m->w->device);
    return comm_fail(&m->c, op, "buffer %p is not device memory (the NCCL communicator takes device pointers)", p);
}

/* Ends an NCCL group the communicator opened, whose calls returned rc (the first
 * failure: `call` on handle bad), then aborts, or waits for the group
 * (unless it is nested in the caller's group_begin: then nccl__group_end waits).
 * The group is closed before any abort. */
int nccl__close_group(ncomm *m, const char *op, const char *call, ncclResult_t rc, ncomm *bad)
{
    ncclResult_t end = nccl__group_end();
    if (nccl__failed(rc)) return nccl__nccl_fail(bad->nc, m, op, call, rc);
    if (nccl__failed(end)) return nccl__nccl_fail(m->nc, m, op, "ncclGroupEnd", end);
    return m->w->group ? 0 : nccl__settle(m, op);
}

/* The start of every call: -1 if the world was aborted (or, ordered, an
 * all-to-all's counts that are back disagree); outside a group, the
 * deferred sends go first; in an ordered world, m's stream waits for the
 * caller's. */
int nccl__begin(ncomm *m, const char *op)
{
    nccl__on_gpu(m);
    if (nccl__dead(m, op) != 0 || (m->w->ordered && nccl__check_counts(m) != 0)) return -1;
    if (!m->w->group && nccl__flush_sends(m, op) != 0) return -1;
    return nccl__after_caller(m, op);
}

/* After a call enqueued one NCCL operation (rc): in a group it waits for
 * nccl__group_end, else for the operation (settle). */
int nccl__issued(ncomm *m, const char *op, const char *call, ncclResult_t rc)
{
    if (nccl__failed(rc)) return nccl__nccl_fail(m->nc, m, op, call, rc);
    nccl__mark(m, op);
    return m->w->group ? 0 : nccl__settle(m, op);
}

static int n_all_reduce(comm *c, float *buf, size_t n)
{
    ncomm *m = (ncomm *)c;
    if (nccl__on_device(m, "all-reduce", buf, n) != 0 || nccl__begin(m, "all-reduce") != 0) return -1;
    return nccl__issued(m, "all-reduce", "ncclAllReduce",
                  LONE(m, ncclAllReduce(buf, buf, n, nccl__ftype(m), ncclSum, m->nc, m->stream)));
}

/* in[size x n] -> out[n]; out may be in + rank x n (NCCL's in-place form),
 * no other overlap. */
static int n_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    ncomm *m = (ncomm *)c;
    if (nccl__on_device(m, "reduce-scatter", in, n) != 0 || nccl__on_device(m, "reduce-scatter", out, n) != 0 ||
        nccl__begin(m, "reduce-scatter") != 0)
        return -1;
    return nccl__issued(m, "reduce-scatter", "ncclReduceScatter",
                  LONE(m, ncclReduceScatter(in, out, n, nccl__ftype(m), ncclSum, m->nc, m->stream)));
}

/* in[n] -> out[size x n]; in may be out + rank x n. */
static int n_all_gather(comm *c, const float *in, float *out, size_t n)
{
    ncomm *m = (ncomm *)c;
    if (nccl__on_device(m, "all-gather", in, n) != 0 || nccl__on_device(m, "all-gather", out, n) != 0 ||
        nccl__begin(m, "all-gather") != 0)
        return -1;
    return nccl__issued(m, "all-gather", "ncclAllGather",
                  LONE(m, ncclAllGather(in, out, n, nccl__ftype(m), m->nc, m->stream)));
}

static int n_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    ncomm *m = (ncomm *)c;
    if (root < 0 || root >= c->size) return comm_fail(c, "broadcast", "root %d of a group of %d", root, c->size);
    if (nccl__on_device(m, "broadcast", buf, bytes) != 0 || nccl__begin(m, "broadcast") != 0) return -1;
    return nccl__issued(m, "broadcast", "ncclBroadcast",
                  LONE(m, ncclBroadcast(buf, buf, bytes, ncclChar, root, m->nc, m->stream)));
}

int nccl__barrier(comm *c)
{
    ncomm *m = (ncomm *)c;
    if (nccl__begin(m, "barrier") != 0) return -1;
    int32_t *one = (int32_t *)(m->dev + 2 * (size_t)c->size);
    ncclResult_t rc = LONE(m, ncclAllReduce(one, one, 1, ncclInt32, ncclSum, m->nc, m->stream));
    if (nccl__failed(rc)) return nccl__nccl_fail(m->nc, m, "barrier", "ncclAllReduce", rc);
    nccl__mark(m, "barrier");
    return m->w->group ? 0 : nccl__finish(m, "barrier"); /* every rank came: a wait on the host, ordered or not */
}

static int n_group_begin(comm *c)
{
    ncomm *m = (ncomm *)c;
    if (nccl__dead(m, "group") != 0) return -1;
    if (m->w->group == 0) {
        ncclResult_t rc = ncclGroupStart();
        if (rc != ncclSuccess) return nccl__nccl_fail(m->nc, m, "group", "ncclGroupStart", rc);
    }
    m->w->group++;
    return 0;
}

/* The outermost nccl__group_end issues the group (with the deferred sends) and
 * waits for it. */
static int n_group_end(comm *c)
{
    ncomm *m = (ncomm *)c;
    if (nccl__dead(m, "group") != 0) return -1;
    if (m->w->group == 0) return comm_fail(c, "group", "group_end without group_begin");
    if (--m->w->group > 0) return 0;
    ncomm *bad = m;
    ncclResult_t rc = nccl__issue_sends(m->w, 1, &bad);
    return nccl__close_group(m, "group", "ncclSend", rc, bad);
}

/* An own world (a queue's) may be aborted from another thread: that asks
 * the thread using it (nccl__take_abort). A world already aborted (the call that
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
        nccl__abort_world(w, msg);
        return;
    }
    int first = 0;
    if (atomic_compare_exchange_strong(&w->claimed, &first, 1)) {
        snprintf(w->asked_why, sizeof w->asked_why, "%s", msg);
        atomic_store_explicit(&w->asked, 1, memory_order_release);
    }
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
    if (nccl__begin(m, op) != 0 || n_group_begin(c) != 0) return -1;
    for (int i = 0; i < k; i++) {
        if (fn(c, bufs[i], n[i]) == 0) continue;
        if (!m->w->aborted) { /* refused before NCCL (a host buffer): the group is half enqueued */
            char why[sizeof c->error];
            snprintf(why, sizeof why, "%s", c->error);
            (void)nccl__fail_abort(m, op, why);
        }
        return -1;
    }
    return n_group_end(c);
}

static int bucket_reduce_scatter(comm *c, float *buf, size_t n)
{
    size_t len = n / (size_t)c->size;
    return n_reduce_scatter(c, buf, nccl__fat((ncomm *)c, buf, (size_t)c->rank * len), len);
}

static int bucket_all_gather(comm *c, float *buf, size_t n)
{
    size_t len = n / (size_t)c->size;
    return n_all_gather(c, nccl__fat((ncomm *)c, buf, (size_t)c->rank * len), buf, len);
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

const comm_vtbl nccl__vtbl = {
    "nccl", n_all_reduce, n_reduce_scatter, n_all_gather, nccl__all_to_all, n_broadcast, nccl__send, nccl__recv,
    nccl__barrier, nccl__split, n_group_begin, n_group_end, n_abort, nccl__free, n_all_reduce_v, n_reduce_scatter_v,
    n_all_gather_v,
};
