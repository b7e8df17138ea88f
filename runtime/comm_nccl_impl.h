/* comm_nccl_impl.h — internal to the NCCL communicator (comm.h's NCCL
 * backend, built with CUDA=1): its handles and worlds, and what its files
 * call of each other (nccl__NAME). comm_nccl.c's head comment describes
 * the backend; each function below is described where it is defined.
 * Its files:
 *   comm_nccl.c        the collectives, groups, abort, and the vtable
 *   comm_nccl_p2p.c    sends (staged on the device, deferred) and receives
 *   comm_nccl_chan.c   ring channels: a communicator and stream for each
 *                      direction between neighbours, whose sends are eager
 *   comm_nccl_a2a.c    the all-to-all, and its counts' exchange
 *   comm_nccl_wait.c   waiting for NCCL and the GPU: the checks of a wait,
 *                      failures and the world's abort, the watchdog
 *   comm_nccl_world.c  handles, the world's creation (the bootstrap over
 *                      TCP or a host world, splits), and comm.h's
 *                      comm_nccl_* calls
 *   comm_nccl_none.c   comm.h's comm_nccl_* calls in a build without CUDA
 */
#ifndef MESH_COMM_NCCL_IMPL_H
#define MESH_COMM_NCCL_IMPL_H

#include <cuda_runtime.h> /* defines: cudaStream_t, cudaEvent_t, cudaError_t */
#include <nccl.h>         /* defines: ncclComm_t, ncclResult_t, ncclDataType_t */
#include <pthread.h>      /* defines: pthread_mutex_t, pthread_cond_t, pthread_t */
#include <stdatomic.h>    /* defines: atomic_int: an own world's abort asked from another thread */
#include <stddef.h>       /* defines: size_t */
#include <stdint.h>       /* defines: uint64_t, uintptr_t */

#include "comm.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the NCCL communicator needs NCCL >= 2.18 (ncclCommSplit, non-blocking communicators)"
#endif

typedef struct nslot { /* a staged send; kept (with its buffer) for reuse once issued */
    void *data;
    size_t cap, bytes;
    int peer;
    cudaEvent_t sent; /* a channel's (comm_nccl_chan.c): recorded after its send, */
    int busy;         /* which may still be on its way while this is set */
} nslot;

struct ncomm;
typedef struct nchan { /* a ring channel (comm_nccl_chan.c): its handle, and the peer (a rank of its owner) */
    struct ncomm *h;
    int peer;
} nchan;

enum { CHANS = 2 }; /* a handle's channels each way: to (from) its next and its previous rank */

typedef struct nworld nworld;

/* Ordered world: an all-to-all's counts, exchanged on the handle's stream
 * and checked once they are back (nccl__check_counts), not waited for. */
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
    nchan out[CHANS], in[CHANS]; /* its ring channels (comm_nccl_channels); h NULL where none */
    struct ncomm *chan[2 * CHANS]; /* the same, in the order they were made */
    int chans;
    int sending;  /* a channel: its sender's handle (sends not waited for by the world's other calls) */
    int inflight; /* a sender's channel: sends issued since its owner's last flush */
    char what[40]; /* a channel: its calls' name ("send to rank 1"; the owner's rank), which a failure says */
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

enum { DOG_MS = 50 }; /* the watchdog's period */

/* Whether an NCCL call failed (ncclInProgress: it goes on, non-blocking). */
static inline int nccl__failed(ncclResult_t rc) { return rc != ncclSuccess && rc != ncclInProgress; }

/* An NCCL call on m: recorded in the caller's group, else launched alone. */
#define LONE(m, call) ((m)->w->group ? (call) : nccl__lone((ncclGroupStart(), (call))))

/* The handle's float elements: NCCL's type, and where element k of p is. */
static inline ncclDataType_t nccl__ftype(const ncomm *m)
{
    return m->half == COMM_BF16 ? ncclBfloat16 : m->half == COMM_F16 ? ncclFloat16 : ncclFloat;
}

static inline void *nccl__fat(const ncomm *m, const void *p, size_t k)
{
    return (char *)(uintptr_t)p + k * (m->half ? 2u : 4u);
}

/* The NCCL handles' table (comm_nccl.c): a comm is an NCCL handle (an
 * ncomm) when its v is &nccl__vtbl. */
extern const comm_vtbl nccl__vtbl;

/* ---- comm_nccl.c: the calls ---------------------------------------------- */

ncclResult_t nccl__group_end(void);
ncclResult_t nccl__lone(ncclResult_t rc);
int nccl__dead(ncomm *m, const char *op);
void nccl__on_gpu(const ncomm *m);
int nccl__on_device(ncomm *m, const char *op, const void *p, size_t bytes);
int nccl__close_group(ncomm *m, const char *op, const char *call, ncclResult_t rc, ncomm *bad);
int nccl__begin(ncomm *m, const char *op);
int nccl__issued(ncomm *m, const char *op, const char *call, ncclResult_t rc);
int nccl__barrier(comm *c);

/* ---- comm_nccl_p2p.c: sends and receives --------------------------------- */

ncclResult_t nccl__issue_sends(nworld *w, int self, ncomm **bad);
int nccl__flush_sends(ncomm *m, const char *op);
int nccl__send(comm *c, const void *buf, size_t bytes, int peer);
int nccl__recv(comm *c, void *buf, size_t bytes, int peer);
nslot *nccl__slot(ncomm *m, int i, size_t bytes, cudaStream_t stream);
int nccl__copy_in_turn(ncomm *m, const char *op, void *dst, const void *src, size_t bytes);

/* ---- comm_nccl_chan.c: ring channels ------------------------------------ */

ncomm *nccl__chan_of(const nchan *at, int peer);
int nccl__chan_send(ncomm *m, ncomm *ch, const void *buf, size_t bytes);
int nccl__chan_recv(ncomm *m, ncomm *ch, void *buf, size_t bytes);
int nccl__chan_flush(ncomm *m, const char *op);
void nccl__chan_free(ncomm *m);

/* ---- comm_nccl_a2a.c: the all-to-all ------------------------------------- */

int nccl__all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv);

/* ---- comm_nccl_wait.c: waiting, failing ---------------------------------- */

void nccl__abort_world(nworld *w, const char *why);
int nccl__take_abort(nworld *w);
int nccl__host_down(const nworld *w, int polls, char *why, size_t n);
void nccl__watchdog_start(nworld *w);
void nccl__world_free(nworld *w);
int nccl__fail_abort(ncomm *m, const char *op, const char *why);
int nccl__nccl_fail(ncclComm_t nc, ncomm *m, const char *op, const char *call, ncclResult_t rc);
int nccl__cuda_fail(ncomm *m, const char *op, const char *call, cudaError_t rc);
int nccl__timed_out(ncomm *m, const char *op);
int nccl__host_failed(ncomm *m, const char *op, const char *why);
int nccl__asked_abort(ncomm *m, const char *op);
void nccl__mark(ncomm *x, const char *op);
int nccl__check_counts(ncomm *m);
int nccl__look(ncomm *m, const char *op, int streams);
int nccl__wait_for(ncomm *m, const char *op, int streams);
int nccl__finish(ncomm *m, const char *op);
int nccl__after_caller(ncomm *m, const char *op);
int nccl__stream_after_caller(ncomm *x, ncomm *m, const char *op);
int nccl__join_caller(ncomm *x, ncomm *m, const char *op);
int nccl__settle(ncomm *m, const char *op);
int nccl__wait_gpu(ncomm *m, const char *op, cudaEvent_t ev);
int nccl__ready(ncclComm_t nc, double until, const nworld *w, ncclResult_t *st, char *why, size_t n);
int nccl__copy_wait(ncomm *m, const char *op, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);

/* ---- comm_nccl_world.c: handles ------------------------------------------ */

int nccl__split(comm *c, int color, int key, comm **out);
void nccl__free(comm *c);

#endif
