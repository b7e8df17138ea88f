/* comm_nccl_world.c — the NCCL communicator's handles and worlds
 * (comm_nccl_impl.h): a handle's stream and buffers, splits, freeing;
 * the world's creation from a unique id shared over the TCP rendezvous or
 * a host world (MPI, threads, TCP), with the first barrier that connects
 * it; and comm.h's comm_nccl_* calls (ordering on the caller's stream, a
 * queue's own world, the watch of a host wait).
 */
#include <stdio.h>  /* defines: snprintf, fprintf */
#include <stdlib.h> /* defines: calloc, free, getenv */
#include <string.h> /* defines: memset */

#include "device.h"     /* defines: dev_cuda_probe: whether a GPU is usable */
#include "rendezvous.h" /* defines: rdv_open, rdv_all_gather: the unique id over TCP */

#include "comm_nccl_impl.h"

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
    m->c.v = &nccl__vtbl;
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

/* A new communicator's first collective, made where it is made: NCCL
 * connects a communicator's peers lazily at its first collective (since
 * 2.22), allocating as it goes, and two communicators connecting at once
 * on one GPU from two threads (a rank's and its queue's, in orders that
 * differ between ranks) may deadlock, as NCCL's documentation warns. So
 * every rank connects each communicator here, in creation order, with a
 * barrier. */
static int connect_now(ncomm *m) { return nccl__barrier(&m->c); }

int nccl__split(comm *c, int color, int key, comm **out)
{
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    ncclComm_t nc = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t st = ncclSuccess;
    char why[640];
    *out = NULL;
    if (w->group) return comm_fail(c, "split", "split between group_begin and group_end");
    if (nccl__begin(m, "split") != 0) return -1;
    cfg.blocking = 0;
    cfg.splitShare = 0; /* (not NCCL_COMM_SPLIT_SHARE_RESOURCES): a queue's split runs beside its parent */
    ncclResult_t rc = ncclCommSplit(m->nc, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &cfg);
    if (rc != ncclSuccess && rc != ncclInProgress) {
        if (nc) (void)ncclCommAbort(nc);
        return nccl__nccl_fail(m->nc, m, "split", "ncclCommSplit", rc);
    }
    double until = comm_now() + w->timeout;
    int late = nccl__ready(m->nc, until, w, &st, why, sizeof why);
    if (!late && st == ncclSuccess && nc) late = nccl__ready(nc, until, w, &st, why, sizeof why);
    if (late || st != ncclSuccess) {
        if (nc) (void)ncclCommAbort(nc);
        if (late == -2) return nccl__host_failed(m, "split", why);
        if (late) return nccl__timed_out(m, "split");
        return nccl__nccl_fail(m->nc, m, "split", "ncclCommSplit", st);
    }
    if (!nc) return 0; /* color < 0: in no group */
    ncomm *x = wrap(w, nc, c->world_rank, why, sizeof why);
    if (!x) return comm_fail(c, "split", "%s", why);
    x->half = m->half;
    if (connect_now(x) != 0) {
        int r = comm_fail(c, "split", "%s", x->c.error);
        nccl__free(&x->c);
        return r;
    }
    *out = &x->c;
    return 0;
}

/* Issues the deferred sends, lets the communicator finish (ncclCommFinalize,
 * within the timeout) and frees it; the world goes with its last handle. */
void nccl__free(comm *c)
{
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    (void)nccl__take_abort(w);
    nccl__chan_free(m);
    if (!w->aborted && m->nc && !w->group && nccl__flush_sends(m, "free") != 0)
        fprintf(stderr, "mesh: %s\n", c->error);
    if (m->nc) {
        ncclResult_t st = ncclSuccess, rc = ncclCommFinalize(m->nc);
        int late = rc != ncclSuccess && rc != ncclInProgress, down = 0;
        char why[sizeof w->why];
        if (!late) { /* (a stopped host world: a rank failed, and the calls in flight wait for it) */
            down = nccl__ready(m->nc, comm_now() + w->timeout, w, &st, why, sizeof why) == -2;
            late = down || st != ncclSuccess;
        }
        if (down) {
            nccl__abort_world(w, why);
        } else if (late) {
            char msg[sizeof w->why];
            snprintf(msg, sizeof msg, "rank %d: ncclCommFinalize did not end cleanly (%s)", c->world_rank,
                     ncclGetErrorString(rc != ncclSuccess && rc != ncclInProgress ? rc : st));
            fprintf(stderr, "mesh: %s; aborting the world's NCCL communicators\n", msg);
            nccl__abort_world(w, msg); /* the world's other handles go without waiting a timeout each */
        } else {
            pthread_mutex_lock(&w->mu);
            (void)ncclCommDestroy(m->nc);
            m->nc = NULL;
            pthread_mutex_unlock(&w->mu);
        }
    }
    /* (its work done: the last all-to-all counts are back) */
    if (w->ordered && !w->aborted && nccl__check_counts(m) != 0) fprintf(stderr, "mesh: %s\n", c->error);
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
    for (int i = 0; i < m->slots; i++)
        if (m->slot[i].sent) (void)cudaEventDestroy(m->slot[i].sent);
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
    if (last) nccl__world_free(w);
}

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
        late = nccl__ready(nc, comm_now() + timeout_s, w, &st, why, sizeof why);
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
        nccl__world_free(w);
        return NULL;
    }
    ncomm *m = wrap(w, nc, rank, why, sizeof why);
    if (!m) {
        snprintf(err, n, "rank %d: the world's communicator: %s", rank, why);
        nccl__world_free(w);
        return NULL;
    }
    if (connect_now(m) != 0) {
        snprintf(err, n, "rank %d: the world's first barrier: %s", rank, m->c.error);
        nccl__free(&m->c);
        return NULL;
    }
    nccl__watchdog_start(w);
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
    if (!c || c->v != &nccl__vtbl || type < COMM_F32 || type > COMM_F16) return -1;
    ((ncomm *)c)->half = type;
    return 0;
}

int comm_nccl_flush(comm *c)
{
    c = c ? (comm *)(uintptr_t)comm_checked_inner(c) : NULL;
    if (!c || c->v != &nccl__vtbl) return 0;
    ncomm *m = (ncomm *)c;
    if (nccl__dead(m, "flush") != 0) return -1;
    if (m->w->group) return 0; /* in a group: its end issues them */
    return nccl__flush_sends(m, "flush") != 0 ? -1 : nccl__chan_flush(m, "flush");
}

int comm_nccl_order(comm *c, void *stream)
{
    if (!c || c->v != &nccl__vtbl) return -1;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    if (nccl__dead(m, "order") != 0) return -1;
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
    if (!c || c->v != &nccl__vtbl) return 0;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    const char *op = NULL; /* the last call of a handle with work in flight: what the wait may wait for */
    if (w->ordered && !w->aborted && nccl__check_counts(m) != 0) { /* (counts that disagree: the transfers may hang) */
        snprintf(why, n, "%s", c->error);
        return -1;
    }
    for (ncomm *x = w->comms; x && !op; x = x->next)
        if (x->touched) op = x->last ? x->last : "a call";
    if (!op) return 0; /* no NCCL work in flight: the stream's kernels end by themselves */
    char down[640]; /* (an ordered world is never a queue's own: no abort is asked of it from elsewhere) */
    int st;
    if (w->host && comm_watch_stopped(w->host, down, sizeof down)) st = nccl__host_failed(m, op, down);
    else if ((st = nccl__look(m, op, 1)) > 0) st = waited_s > w->timeout ? nccl__timed_out(m, op) : 0;
    if (st == 0) return 0;
    snprintf(why, n, "%s", c->error);
    return -1;
}

/* The handle of an own world (a queue's: one handle), or NULL (c->error
 * says why when c is an NCCL handle). */
static ncomm *own_handle(comm *c, const char *op)
{
    if (!c || c->v != &nccl__vtbl) return NULL;
    ncomm *m = (ncomm *)c;
    if (!m->w->own) {
        comm_fail(c, op, "not a queue's own world (comm_nccl_own_thread)");
        return NULL;
    }
    nccl__on_gpu(m);
    return nccl__dead(m, op) == 0 ? m : NULL;
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
    return ce == cudaSuccess ? 0 : nccl__cuda_fail(m, "wait for an event", "cudaStreamWaitEvent", ce);
}

int comm_nccl_record_event(comm *c, void *event)
{
    ncomm *m = own_handle(c, "record an event");
    if (!m) return -1;
    cudaError_t ce = cudaEventRecord((cudaEvent_t)event, m->stream);
    return ce == cudaSuccess ? 0 : nccl__cuda_fail(m, "record an event", "cudaEventRecord", ce);
}

void comm_nccl_thread_on_gpu(comm *c)
{
    if (c && c->v == &nccl__vtbl) nccl__on_gpu((ncomm *)c);
}

int comm_nccl_progress(comm *c, double waited_s)
{
    if (!c || c->v != &nccl__vtbl) return 0;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    if (!m->touched) return 0;
    nccl__on_gpu(m);
    const char *op = m->last ? m->last : "a call";
    char why[640];
    if (nccl__take_abort(w)) return nccl__asked_abort(m, op);
    if (nccl__host_down(w, ++w->polls, why, sizeof why)) return nccl__host_failed(m, op, why);
    int busy = nccl__look(m, op, 1);
    if (busy > 0 && waited_s > w->timeout) return nccl__timed_out(m, op);
    return busy;
}

int comm_nccl_own_thread(comm *c)
{
    if (!c || c->v != &nccl__vtbl) return 0;
    ncomm *m = (ncomm *)c;
    nworld *w = m->w;
    if (w->own && w->comms == m && !m->next) return 0;
    if (nccl__dead(m, "own thread") != 0) return -1;
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
