/* comm_nccl_wait.c — the NCCL communicator's waits (comm_nccl_impl.h): for NCCL
 * to enqueue a call and for the GPU to finish it, each wait polling for
 * NCCL's asynchronous errors, CUDA's, a failed rank of the host world, an
 * abort asked from another thread, all-to-all counts that disagree, and
 * the timeout; what a failure does (the world's communicators aborted,
 * the failure passed on in the words every backend uses); and the
 * world's watchdog thread.
 */
#include <ctype.h>  /* defines: isdigit */
#include <stdio.h>  /* defines: snprintf */
#include <stdlib.h> /* defines: free */
#include <string.h> /* defines: strncmp */
#include <time.h>   /* defines: nanosleep, clock_gettime */

#include "kcuda.h" /* defines: kcuda_fault_hint */

#include "comm_nccl_impl.h"

#define COUNTS_GRACE_S 0.2 /* counts_first */

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
void nccl__abort_world(nworld *w, const char *why)
{
    for (; w->group > 0; w->group--) (void)nccl__group_end(); /* leave no NCCL group open on this thread */
    pthread_mutex_lock(&w->mu);
    if (!w->aborted) snprintf(w->why, sizeof w->why, "%s", why);
    w->aborted = 1;
    for (ncomm *x = w->comms; x; x = x->next) {
        if (x->nc) (void)ncclCommAbort(x->nc);
        x->nc = NULL;
        x->pending = 0;
        x->touched = x->inflight = 0;
    }
    pthread_mutex_unlock(&w->mu);
}

/* An own world's abort asked for by another thread: done here, by the
 * thread using the world. 1 if the world is (now) aborted. */
int nccl__take_abort(nworld *w)
{
    if (w->own && !w->aborted && atomic_load_explicit(&w->asked, memory_order_acquire))
        nccl__abort_world(w, w->asked_why);
    return w->aborted;
}

/* Whether the world the NCCL world was bootstrapped over (ranks as
 * threads, or processes over TCP) stopped: a rank failed, and this one's
 * wait on NCCL would last until the timeout. Looked at every 64th poll;
 * why gets the reason. */
int nccl__host_down(const nworld *w, int polls, char *why, size_t n)
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
void nccl__watchdog_start(nworld *w)
{
    if (w->host && !w->own && pthread_create(&w->dog, NULL, watchdog, w) == 0) w->dog_on = 1;
}

void nccl__world_free(nworld *w)
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
int nccl__fail_abort(ncomm *m, const char *op, const char *why)
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
    nccl__abort_world(m->w, msg);
    return -1;
}

/* An NCCL error; for an unhandled CUDA error, what CUDA says of the GPU
 * (a kernel's fault, typically: sticky, so still there to read). */
int nccl__nccl_fail(ncclComm_t nc, ncomm *m, const char *op, const char *call, ncclResult_t rc)
{
    char why[800], cuda[360] = "";
    const char *last = ncclGetLastError(nc);
    cudaError_t ce = rc == ncclUnhandledCudaError ? cudaPeekAtLastError() : cudaSuccess;
    if (ce != cudaSuccess)
        snprintf(cuda, sizeof cuda, "; CUDA says %s (%s)%s", cudaGetErrorString(ce), cudaGetErrorName(ce),
                 kcuda_fault_hint((int)ce));
    snprintf(why, sizeof why, "%s: %s (NCCL error %d)%s%s%s", call, ncclGetErrorString(rc), (int)rc,
             last && last[0] ? ": " : "", last ? last : "", cuda);
    return nccl__fail_abort(m, op, why);
}

int nccl__cuda_fail(ncomm *m, const char *op, const char *call, cudaError_t rc)
{
    char why[480];
    (void)cudaGetLastError(); /* (a sticky error stays) */
    snprintf(why, sizeof why, "%s: %s (%s)%s", call, cudaGetErrorString(rc), cudaGetErrorName(rc),
             kcuda_fault_hint((int)rc));
    return nccl__fail_abort(m, op, why);
}

int nccl__timed_out(ncomm *m, const char *op)
{
    char why[400];
    snprintf(why, sizeof why, "waited more than %g s (MESH_COLLECTIVE_TIMEOUT_S): another rank is stuck or gone",
             m->w->timeout);
    return nccl__fail_abort(m, op, why);
}

static int counts_first(ncomm *m);

/* op's failure when the host world stopped: another rank failed, or this
 * one did elsewhere (its communication thread, say: why then names it). */
int nccl__host_failed(ncomm *m, const char *op, const char *why)
{
    if (counts_first(m) != 0) return -1; /* (the cause here, likely of the other rank's failure too) */
    char msg[800], own[32];
    int n = snprintf(own, sizeof own, "rank %d", m->c.world_rank);
    int self = !strncmp(why, own, (size_t)n) && !isdigit((unsigned char)why[n]);
    snprintf(msg, sizeof msg, "%s (%.700s)", self ? "this rank failed elsewhere" : COMM_ANOTHER_FAILED, why);
    return nccl__fail_abort(m, op, msg);
}

/* op's failure when an own world's abort was asked for while it waited. */
int nccl__asked_abort(ncomm *m, const char *op)
{
    return comm_fail(&m->c, op, "the world's NCCL communicators were aborted (%s)", m->w->why);
}

/* A call enqueued work on x (its stream): the next wait waits for it, and
 * in an ordered world so will the caller's stream. */
void nccl__mark(ncomm *x, const char *op)
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
int nccl__check_counts(ncomm *m)
{
    for (ncomm *x = m->w->comms; x; x = x->next)
        for (int i = 0; i < A2A_CHECKS; i++) {
            a2a_check *k = &x->chk[i];
            if (!k->pending) continue;
            cudaError_t ce = not_ready_clear(cudaEventQuery(k->back));
            if (ce == cudaErrorNotReady) continue;
            if (ce != cudaSuccess) return nccl__cuda_fail(m, "all-to-all", "cudaEventQuery", ce);
            k->pending = 0;
            int p = x->c.size;
            for (int q = 0; q < p; q++) {
                if (k->host[p + q] == k->want[q]) continue;
                char why[640];
                snprintf(why, sizeof why, "rank %d expected %zu floats from rank %d, which sends %llu", x->c.rank,
                         k->want[q], q, (unsigned long long)k->host[p + q]);
                return nccl__fail_abort(m, "all-to-all", why);
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
        if (nccl__check_counts(m) != 0) return -1;
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
int nccl__look(ncomm *m, const char *op, int streams)
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
            return counts_first(m) != 0 ? -1 : nccl__nccl_fail(x->nc, m, op, "ncclCommGetAsyncError", st);
        if (!streams) continue;
        cudaError_t ce = not_ready_clear(cudaStreamQuery(x->stream));
        if (ce == cudaErrorNotReady) {
            busy = 1;
            continue;
        }
        if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaStreamQuery", ce);
        x->touched = x->fresh = 0;
    }
    return busy;
}

/* Polls the touched handles until none is busy (look): with streams,
 * until their work is done, else until NCCL has enqueued it (a
 * non-blocking communicator's ncclInProgress ends). Errors, the host
 * world's failure and the timeout abort the world, recorded in m. */
int nccl__wait_for(ncomm *m, const char *op, int streams)
{
    nworld *w = m->w;
    double until = comm_now() + w->timeout;
    char why[640];
    for (int polls = 0;; pause_poll(&polls)) {
        if (nccl__take_abort(w)) return nccl__asked_abort(m, op);
        if (nccl__host_down(w, polls, why, sizeof why)) return nccl__host_failed(m, op, why);
        if (w->ordered && nccl__check_counts(m) != 0) return -1;
        int busy = nccl__look(m, op, streams);
        if (busy <= 0) return busy;
        if (comm_now() > until) return nccl__timed_out(m, op);
    }
}

/* Waits until the work enqueued on the world's touched handles is done. */
int nccl__finish(ncomm *m, const char *op) { return nccl__wait_for(m, op, 1); }

/* Ordered world: x's stream waits for the caller's work so far, which
 * writes the call's buffers or reads those it writes (failures recorded
 * in m). */
int nccl__stream_after_caller(ncomm *x, ncomm *m, const char *op)
{
    nworld *w = m->w;
    if (!w->ordered) return 0;
    cudaError_t ce = cudaEventRecord(w->before, w->caller);
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaEventRecord", ce);
    ce = cudaStreamWaitEvent(x->stream, w->before, 0);
    return ce == cudaSuccess ? 0 : nccl__cuda_fail(m, op, "cudaStreamWaitEvent", ce);
}

int nccl__after_caller(ncomm *m, const char *op) { return nccl__stream_after_caller(m, m, op); }

/* Ordered world: the caller's stream waits for the work on x's stream so
 * far (failures recorded in m). */
int nccl__join_caller(ncomm *x, ncomm *m, const char *op)
{
    cudaError_t ce = cudaEventRecord(x->done, x->stream);
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaEventRecord", ce);
    ce = cudaStreamWaitEvent(m->w->caller, x->done, 0);
    return ce == cudaSuccess ? 0 : nccl__cuda_fail(m, op, "cudaStreamWaitEvent", ce);
}

/* After a launch: the host waits for the work (finish); in an ordered
 * world, once NCCL has enqueued it, the caller's stream waits for every
 * stream that got work instead, and the host goes on; in a deferred one
 * (a queue's), the host goes on once it is enqueued. */
int nccl__settle(ncomm *m, const char *op)
{
    nworld *w = m->w;
    if (w->deferred) return nccl__wait_for(m, op, 0); /* a queue's: its thread watches the work (comm_nccl_progress) */
    if (!w->ordered) return nccl__finish(m, op);
    if (nccl__wait_for(m, op, 0) != 0) return -1;
    for (ncomm *x = w->comms; x; x = x->next) {
        if (!x->fresh) continue;
        if (nccl__join_caller(x, m, op) != 0) return -1;
        x->fresh = 0;
    }
    return 0;
}

/* Waits for event ev, or (ev NULL) for m's stream alone (a staging copy:
 * no NCCL work on it), with a wait's checks. */
int nccl__wait_gpu(ncomm *m, const char *op, cudaEvent_t ev)
{
    double until = comm_now() + m->w->timeout;
    char why[640];
    for (int polls = 0;; pause_poll(&polls)) {
        if (nccl__take_abort(m->w)) return nccl__asked_abort(m, op);
        if (nccl__host_down(m->w, polls, why, sizeof why)) return nccl__host_failed(m, op, why);
        cudaError_t ce = not_ready_clear(ev ? cudaEventQuery(ev) : cudaStreamQuery(m->stream));
        if (ce == cudaSuccess) return 0;
        if (ce != cudaErrorNotReady) return nccl__cuda_fail(m, op, ev ? "cudaEventQuery" : "cudaStreamQuery", ce);
        if (comm_now() > until) return nccl__timed_out(m, op);
    }
}

static int drain(ncomm *m, const char *op) { return nccl__wait_gpu(m, op, NULL); }

/* Polls a communicator being made (init, split) until it is ready, or
 * not: *st is its state; 0, or -1 past the deadline, or -2 when the world
 * w was bootstrapped over was aborted (why says why). */
int nccl__ready(ncclComm_t nc, double until, const nworld *w, ncclResult_t *st, char *why, size_t n)
{
    for (int polls = 0;; pause_poll(&polls)) {
        if (w && nccl__host_down(w, polls, why, n)) return -2;
        ncclResult_t rc = ncclCommGetAsyncError(nc, st);
        if (rc != ncclSuccess) *st = rc;
        if (*st != ncclInProgress) return 0;
        if (comm_now() > until) return -1;
    }
}

/* Copies bytes between m's pinned host mirror and the device (either way)
 * and waits. */
int nccl__copy_wait(ncomm *m, const char *op, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes, kind, m->stream);
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaMemcpyAsync", ce);
    return drain(m, op);
}
