/* comm.h — communicators: the collectives and point-to-point transfers
 * the ranks of a plan exchange (internal to libmesh).
 *
 * A communicator is one rank's handle on a group of ranks. Backends fill
 * a small function table: threads (all ranks as threads of one process,
 * shared-memory collectives; comm_threads.c), MPI (one rank per process;
 * comm_mpi.c) and NCCL (one rank per process and GPU; comm_nccl.c). The
 * buffers are host memory, but NCCL's are device memory. Every call is
 * collective over the group unless said otherwise, returns 0, or -1 with
 * the reason in c->error ("all-reduce over 4 ranks: rank 2 failed: ...").
 *
 * Determinism: sums are taken in rank order, the same on every rank, so a
 * result is the same run to run, on every member, and in every backend (to
 * the bit); NCCL's sums are its own (the same on every member, not in rank
 * order).
 *
 * Failure: a rank that fails calls comm_abort (or its thread ends without
 * freeing its handle through comm_free after an error): every rank waiting
 * in, or later entering, any collective of the same world returns -1
 * naming the failed rank and what it was doing. A rank that does not
 * arrive within the world's timeout makes the others fail the same way.
 *
 * Ownership: comm_split returns a new handle the caller frees with
 * comm_free; a world's handles are freed by each rank, and the world with
 * its last handle.
 */
#ifndef MESH_COMM_H
#define MESH_COMM_H

#include <stddef.h> /* size_t */

typedef struct comm comm;

/* The float elements a communicator's calls count: fp32 (every backend),
 * or 2-byte bf16 or fp16 (NCCL's and the checked one's, when set). */
enum { COMM_F32 = 0, COMM_BF16 = 1, COMM_F16 = 2 };

typedef struct comm_vtbl {
    const char *name; /* "threads", "mpi", "nccl" */
    /* buf[n] summed over the group, in place */
    int (*all_reduce)(comm *c, float *buf, size_t n);
    /* in[size x n] summed; out[n] receives this rank's n (chunk `rank`) */
    int (*reduce_scatter)(comm *c, const float *in, float *out, size_t n);
    /* in[n] of each rank into out[size x n], rank order */
    int (*all_gather)(comm *c, const float *in, float *out, size_t n);
    /* send[q] floats of in (peers' parts in rank order) to peer q; recv[q]
     * floats from peer q into out, in rank order */
    int (*all_to_all)(comm *c, const float *in, const size_t *send, float *out, const size_t *recv);
    /* bytes of root's buf to every rank's buf */
    int (*broadcast)(comm *c, void *buf, size_t bytes, int root);
    /* point to point (not collective): bytes to or from one peer; a send
     * is eager (the data is copied and the sender goes on), so sends and
     * receives in any order cannot deadlock (NCCL: the send is issued at
     * the sender's next call, with it when that is a receive; a receiver
     * that first waits for the sender in anything else deadlocks, see
     * comm_nccl.c) */
    int (*send)(comm *c, const void *buf, size_t bytes, int peer);
    int (*recv)(comm *c, void *buf, size_t bytes, int peer);
    int (*barrier)(comm *c);
    /* a group per color (color < 0: none, *out = NULL), ranks ordered by
     * (key, rank in c) */
    int (*split)(comm *c, int color, int key, comm **out);
    /* transfers between group_begin and group_end may be issued in any
     * order without deadlock (NCCL's ncclGroupStart/End) */
    int (*group_begin)(comm *c);
    int (*group_end)(comm *c);
    /* not collective: stops every rank of the world, with why */
    void (*abort)(comm *c, const char *why);
    void (*free)(comm *c);
    /* k buffers in one call (a gradient bucket), the same k and sizes on
     * every member: all_reduce_v sums each bufs[i][n[i]] in place;
     * reduce_scatter_v sums each and leaves this rank's chunk of it (n[i] /
     * size elements, n[i] a multiple of size) at bufs[i] + rank x n[i] /
     * size; all_gather_v fills each bufs[i] with every rank's chunk of it,
     * this rank's being at bufs[i] + rank x n[i] / size. NULL: comm.c packs
     * the buffers into one and makes one call (host memory) */
    int (*all_reduce_v)(comm *c, float *const *bufs, const size_t *n, int k);
    int (*reduce_scatter_v)(comm *c, float *const *bufs, const size_t *n, int k);
    int (*all_gather_v)(comm *c, float *const *bufs, const size_t *n, int k);
} comm_vtbl;

struct comm {
    const comm_vtbl *v;
    int rank, size;        /* in this group */
    int world_rank;        /* in the world */
    char error[1024];      /* why the last call failed */
    float *packed;         /* comm.c's: the buffers of a _v call packed into one (freed by comm_free) */
    size_t packed_n;
};

/* Calls through the table; comm_free(NULL) does nothing. */
int comm_all_reduce(comm *c, float *buf, size_t n);
int comm_reduce_scatter(comm *c, const float *in, float *out, size_t n);
int comm_all_gather(comm *c, const float *in, float *out, size_t n);
int comm_all_reduce_v(comm *c, float *const *bufs, const size_t *n, int k);
int comm_reduce_scatter_v(comm *c, float *const *bufs, const size_t *n, int k);
int comm_all_gather_v(comm *c, float *const *bufs, const size_t *n, int k);
int comm_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv);
int comm_broadcast(comm *c, void *buf, size_t bytes, int root);
int comm_send(comm *c, const void *buf, size_t bytes, int peer);
int comm_recv(comm *c, void *buf, size_t bytes, int peer);
int comm_barrier(comm *c);
int comm_split(comm *c, int color, int key, comm **out);
int comm_group_begin(comm *c);
int comm_group_end(comm *c);
void comm_abort(comm *c, const char *why);
void comm_free(comm *c);
/* Makes c's float elements `type` (COMM_F32, COMM_BF16, COMM_F16) for its
 * calls from now on: an NCCL or a checked handle's (comm_nccl_set_elements,
 * comm_checked_set_elements); every other backend counts fp32 only.
 * Returns 0, or -1 when c cannot (a 2-byte type on a backend without). */
int comm_set_elements(comm *c, int type);

/* ---- threads ---------------------------------------------------------- */

typedef struct comm_threads_world comm_threads_world;

/* A world of size ranks, each a thread of this process; a collective that
 * waits longer than timeout_s for a rank fails. NULL if out of memory. */
comm_threads_world *comm_threads_world_new(int size, double timeout_s);

/* Rank `rank`'s handle on the whole world (called by that rank's thread, or
 * by any thread before the ranks start). The world is freed with the last
 * handle; a world no handle was taken from, with comm_threads_world_free. */
comm *comm_threads_rank(comm_threads_world *w, int rank);
void comm_threads_world_free(comm_threads_world *w);

/* The threads world of c (a threads handle, or a checked one over it), or
 * NULL. A hold on it (comm_threads_world_hold) keeps it readable until
 * comm_threads_release, whatever the ranks free meanwhile, and
 * comm_threads_aborted says, without waiting, whether it was aborted (1,
 * with why) or not (0). A communicator bootstrapped over a threads world
 * (NCCL's) polls it, so that a rank's failure ends the others' waits on
 * the GPU at once. None of these is collective. */
comm_threads_world *comm_threads_world_of(const comm *c);
void comm_threads_world_hold(comm_threads_world *w);
int comm_threads_aborted(comm_threads_world *w, char *why, size_t n);
void comm_threads_stop(comm_threads_world *w, const char *why); /* aborts it, as a rank's comm_abort does */
void comm_threads_release(comm_threads_world *w);

/* A watch on the world of c (comm.c): says, without waiting, whether the
 * world stopped (a rank failed, or waited too long), with why, and keeps
 * that readable until comm_watch_release, whatever the ranks free
 * meanwhile. A communicator bootstrapped over a world (NCCL's) polls it,
 * so that a rank's failure ends the others' waits on the GPU at once. For
 * a threads world (comm_threads_world_hold), a TCP one (comm_tcp_hold) or
 * an MPI one, or a checked handle over one; NULL for any other or when out
 * of memory. comm_watch_hold adds a holder (each calls
 * comm_watch_release); NULL is a watch that never sees a stop.
 * comm_watch_stop stops the watched world itself, as this rank's
 * comm_abort would (the first reason stays; the TCP peers are told): for a
 * communicator that fails first, so that the others hear of it before it
 * waits on anything of its own. An MPI world's watch sees only this
 * process's stops (comm_mpi_stop: the other processes' failures end the
 * job through the launcher), and such a stop ends a wait in MPI that
 * outlasts it by a second with the job. None of these is collective. */
typedef struct comm_watch comm_watch;
comm_watch *comm_watch_of(const comm *c);
void comm_watch_hold(comm_watch *w);
int comm_watch_stopped(comm_watch *w, char *why, size_t n);
void comm_watch_stop(comm_watch *w, const char *why);
void comm_watch_release(comm_watch *w);

/* The collective timeout: MESH_COLLECTIVE_TIMEOUT_S, else 600 seconds. */
double comm_timeout_from_env(void);

/* Records why a call failed, "OP over N ranks (this is rank R): WHY", in
 * c->error; returns -1. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int comm_fail(comm *c, const char *op, const char *fmt, ...);

/* The words every backend passes on for a failed rank: "rank R failed:
 * WHY" in buf[n] (its abort, a peer's closed connection, a process that
 * exits mid-run); and comm_nccl's for a wait ended by another rank's
 * failure, "another rank failed (WHY)". comm_names_other says whether
 * error, rank self's, is one of these about another rank: a failure
 * passed on, not the cause (mesh_run_ranks names the cause first). */
#define COMM_ANOTHER_FAILED "another rank failed"
void comm_rank_failed(char *buf, size_t n, int rank, const char *why);
int comm_names_other(const char *error, int self);

/* Seconds on the monotonic clock, and a sleep of s seconds: the backends'
 * timeouts and polls. */
double comm_now(void);
void comm_sleep(double s);

/* A backend's scratch buffer *buf of *cap floats, grown to hold n (kept
 * when it does); NULL if out of memory. */
float *comm_scratch(float **buf, size_t *cap, size_t n);

/* ---- checked (comm_checked.c) ------------------------------------------ */

/* Is [p, p + bytes) device memory? (ud: the maker's) */
typedef int (*comm_buf_check)(void *ud, const void *p, size_t bytes);

/* A handle on in's group that fails any call given a buffer `ok` rejects
 * ("a host buffer ... handed to a device communicator"), else makes the
 * call on in: the guarded test device's stand-in for NCCL, which takes
 * device buffers only. Its splits are checked too. own: in is freed with
 * it. NULL if out of memory. comm_checked_inner: the communicator under
 * any checked ones (c itself if none). */
comm *comm_checked_new(comm *in, int own, comm_buf_check ok, void *ud);
/* Makes c's float elements `type` (COMM_F32, the default; COMM_BF16 or
 * COMM_F16: 2 bytes, sums widened to fp32, made by in and rounded once;
 * gathers and all-to-alls move the bytes); its later splits inherit it.
 * -1 if c is not a checked one. */
int comm_checked_set_elements(comm *c, int type);
const comm *comm_checked_inner(const comm *c);
/* Stages c's calls through host memory: each copies its device buffers to
 * a host area with d's copies (on a stream of c's own, waited for), makes
 * the call there and copies the results back, so that in never touches
 * d's memory (a GPU's, moved by a host communicator; the guarded device's,
 * kept closed). Its later splits inherit it (each with its own stream).
 * 0, or -1 (not a checked handle, or no stream: c->error says why). */
struct dev;
int comm_checked_stage(comm *c, struct dev *d);
/* A staged handle's copies move to d (a stream of its own on d): for a
 * split used by another thread (a communication queue's), which must not
 * share the rank's device handle. 0 (also when c is not staged, or not a
 * checked handle), or -1 (c->error says why). */
int comm_checked_restage(comm *c, struct dev *d);

/* ---- MPI (comm_mpi.c; a build with MPI=0 has only the stubs) ------------ */

/* This process's handle on the world of an MPI job, one rank per process:
 * MPI is initialised on the first call (with MPI_THREAD_MULTIPLE, unless
 * the program did it; then it is finalised at exit), and each call makes
 * a new world (a copy of MPI_COMM_WORLD, errors returned, not fatal). A
 * watchdog thread stops the job (MPI_Abort, status 3) when one call waits
 * longer than timeout_s, naming the rank and the call; so does a process
 * that exits (exit, return from main) between this call and
 * comm_mpi_finish or the world's comm_free. NULL with the reason in err
 * if MPI cannot start or this build has none. */
comm *comm_mpi_world(double timeout_s, char *err, size_t n);

/* The end of a world's run, called by every rank once it has finished
 * (failed: its work failed): returns the lowest rank that failed, or -1.
 * A rank that did not fail waits for all; one that failed waits at most a
 * few seconds (the others may be stuck in a collective, waiting for it),
 * then stops the job with comm_abort(why). */
int comm_mpi_finish(comm *c, int failed, const char *why);

/* 1 if MPI runs with MPI_THREAD_MULTIPLE (two threads may call it at
 * once: a communication queue beside the rank, comm_async.h), else 0. */
int comm_mpi_thread_multiple(void);

/* comm_mpi_of: 1 if c is an MPI handle (or a checked handle over one).
 * comm_mpi_stop: this process's rank failed in a communicator bootstrapped
 * over its MPI world (NCCL's, through comm_watch_stop; the first reason
 * stays, until the next comm_mpi_world): comm_mpi_stopped then says so,
 * with why, to every thread that asks, and the watchdog stops the job if a
 * wait in MPI lasts more than a second after it (the other ranks may wait
 * on the GPU for this one, and only this process knows). */
int comm_mpi_of(const comm *c);
void comm_mpi_stop(const char *why);
int comm_mpi_stopped(char *why, size_t n);

/* ---- TCP (comm_tcp.c, over rendezvous.c) -------------------------------- */

/* This process's handle on the world of a job that no MPI launcher
 * started (torchrun, or anything that sets RANK, WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT), one rank per process: rank RANK of WORLD_SIZE meets the
 * others at the rendezvous rdv_env_address gives (MESH_PORT, else
 * MASTER_PORT + 1), and every two ranks get a socket. Host buffers, sums
 * in rank order (the threads backend's bits). A call that waits longer
 * than timeout_s (<= 0: comm_timeout_from_env) stops every rank, naming
 * the wait; so does comm_abort, naming its rank, and a process that ends
 * before it frees its world (exit, crash, kill). NULL with the reason in
 * err. */
comm *comm_tcp_world(double timeout_s, char *err, size_t n);

/* The same as rank `rank` of `size` at the rendezvous host:port (the
 * tests run several in one process, a thread each). */
comm *comm_tcp_connect(const char *host, int port, int rank, int size, double timeout_s, char *err, size_t n);

/* The end of a world's run, as comm_mpi_finish: called by every rank once
 * it has finished (failed: its work failed); returns the lowest rank that
 * failed, or -1. A rank that did not fail waits for all; one that failed
 * waits at most a few seconds (the others may be stuck in a collective,
 * waiting for it), then stops them with comm_abort(why). If the world
 * stopped, returns the rank that stopped it, with why in c->error. */
int comm_tcp_finish(comm *c, int failed, const char *why);

/* The state of c's TCP world (c a TCP handle, or a checked one over it),
 * or NULL. Held (comm_tcp_hold), it stays readable after the world's last
 * handle is freed (which still ends the connections), until
 * comm_tcp_release; comm_tcp_stopped: 1 with why once the world stopped,
 * else 0. For comm_watch_of. */
typedef struct comm_tcp_state comm_tcp_state;
comm_tcp_state *comm_tcp_state_of(const comm *c);
void comm_tcp_hold(comm_tcp_state *w);
int comm_tcp_stopped(comm_tcp_state *w, char *why, size_t n);
void comm_tcp_stop(comm_tcp_state *w, const char *why); /* stops it, telling the peers, as comm_abort does */
void comm_tcp_release(comm_tcp_state *w);

/* ---- NCCL (comm_nccl*.c; without CUDA=1, comm_nccl_none.c's stubs) ----- */

/* Every buffer passed to an NCCL handle is a device pointer (the CUDA
 * executor owns them), on the world's device; the work that writes it is
 * finished before the call (its stream synchronised), and the result is in
 * place when the call returns (unless the world is ordered on a stream:
 * comm_nccl_order). A reduce-scatter's out may be in + rank x n
 * and an all-gather's in may be out + rank x n, no other overlap. A receive
 * names the size that was sent (NCCL does not check it). Each handle has
 * its own CUDA stream; a call that fails in NCCL or CUDA, or waits longer
 * than the world's timeout, aborts every NCCL communicator of the world
 * (ncclCommAbort) and returns -1 naming the call, the rank and NCCL's
 * error; so does every later call. comm_abort aborts them too, and says so
 * on stderr; the other processes' calls then fail (NCCL's remote error, or
 * their timeout). One thread uses a world at a time (a split made a world
 * of its own, comm_nccl_own_thread, may be another thread's). */

/* 1 if this process can use a GPU (CUDA driver and device present), else
 * 0 with the reason in why ("no CUDA driver (libcuda.so.1: ...)", "this
 * libmesh was built without CUDA (make CUDA=1)"); never crashes without a
 * driver. why may be NULL. */
int comm_nccl_available(char *why, size_t n);

/* Rank `rank` of a world of `size` processes, each on its GPU `device`
 * (cudaSetDevice first): rank 0 makes the NCCL unique id, which the TCP
 * rendezvous (rendezvous.h, at MESH_PORT, else MASTER_PORT + 1, on
 * MESH_MASTER_ADDR or MASTER_ADDR) gives every rank; with NCCL_COMM_ID set,
 * no rendezvous. Collective over the world; a rank that cannot use its GPU
 * still comes, and every rank fails naming it. timeout_s <= 0: the
 * environment's (comm_timeout_from_env). NULL with the reason in err. */
comm *comm_nccl_world(int rank, int size, int device, double timeout_s, char *err, size_t n);

/* The same, bootstrapped over boot, a communicator of host buffers (the
 * MPI world, comm_mpi_world; or any): its rank and size, rank 0's id by
 * comm_broadcast. boot stays the caller's. */
comm *comm_nccl_world_mpi(comm *boot, int device, double timeout_s, char *err, size_t n);

/* Makes c's float elements `type` (comm.h's COMM_F32, the default;
 * COMM_BF16, COMM_F16): every float count and offset of its all-reduces,
 * reduce-scatters, all-gathers and all-to-alls is then of that type's
 * elements (its buffers keep their `float *` type), summed by NCCL in that
 * type; its later splits inherit it. Returns 0, or -1 when c is not an
 * NCCL handle. */
int comm_nccl_set_elements(comm *c, int type);

/* The sends c's world deferred (comm_nccl_p2p.c: an NCCL send is issued at
 * the rank's next call) go out now, and the call returns once they are
 * received (ordered: once enqueued, the caller's stream waiting for
 * them); so do c's channels' sends (comm_nccl_channels) since the last
 * flush. For the end of a pipeline's schedule, whose last send would
 * otherwise wait for a later NCCL call while the receiver waits for it
 * (the rank's next collective being on the host world, as an evaluation's
 * loss sum is). Not collective. Returns 0 (nothing done for a handle of
 * another backend, whose sends are eager), or -1 with the reason in
 * c->error (the world aborted). */
int comm_nccl_flush(comm *c);

/* Gives c's ranks channels of their own for the sends between neighbours
 * (comm_nccl_chan.c): rank r's sends to r + 1 and to r - 1, and its
 * receives from them (with ring, also between the last rank and the
 * first), each on an NCCL communicator and stream of their own, so that
 * they are as eager as the other backends': a send is issued at once and
 * waits on the GPU for its receive alone, never for the rank's other
 * calls, and any order of sends and receives that the threads backend
 * runs (a pipeline's interleaved schedule's) runs here. Sends to other
 * ranks stay deferred. A channel's send or receive is refused between
 * group_begin and group_end. Collective over c (2 to 6 splits, whatever c's size); once
 * per handle (again: nothing). Returns 0 (nothing done for a handle of
 * another backend), or -1 with the reason in c->error. */
int comm_nccl_channels(comm *c, int ring);

/* Orders the calls of c's world on the caller's CUDA stream `stream` (a
 * cudaStream_t of the world's device; NULL: its legacy default stream)
 * instead of waiting for them: each call's work starts after the work the
 * caller enqueued on the stream before the call, and the work the caller
 * enqueues after it starts after the call's (events between the stream
 * and the handles' streams), as PyTorch's process groups do; the call
 * returns once NCCL has enqueued its work, without waiting for the GPU. A
 * send's buffer may be rewritten by the stream's later work; a receive's
 * and a collective's result is there for the stream's later work, and for
 * the host once it has waited for the stream. A barrier still waits on
 * the host. Errors, a failed rank of the host world and the timeout are
 * then noticed by the next call, or by comm_nccl_watch while the host
 * waits for the stream. So are an all-to-all's counts that disagree: they
 * are checked once back, not waited for, and then abort the world naming
 * them (unordered, the call fails on every rank, the world intact). Not for a queue's own world. Returns 0, or -1
 * when c is not an NCCL handle (c->error says why if it is one). */
int comm_nccl_order(comm *c, void *stream);

/* For the host's waits on an ordered world's stream (device.h's
 * dev_set_watch, ud: a handle of the world): 0 while its work goes on or
 * is done; -1 with why (n bytes) when an NCCL or CUDA error came, an
 * all-to-all's counts disagree, the world it was bootstrapped over
 * failed, it was aborted, or its work has
 * kept the host waiting longer than the world's timeout (waited_s; the
 * message names the last call): every NCCL communicator of the world is
 * then aborted, which ends its work on the GPU. Not for another thread's
 * world. */
int comm_nccl_watch(void *ud, double waited_s, char *why, size_t n);

/* Makes c, a fresh split with nothing in flight, an NCCL world of its own,
 * so that a thread other than the one using the rest of the world may use
 * it (NCCL's groups, and this backend's deferred sends, are one thread's):
 * a communication queue's (comm_async.h). Its comm_abort may then come
 * from any thread: the thread using it aborts it at its next wait or call,
 * and comm_free. Returns 0 (nothing done for a handle of another backend),
 * or -1 with the reason in c->error. */
int comm_nccl_own_thread(comm *c);

/* The thread about to use c, an own world (comm_nccl_own_thread), makes
 * c's GPU its current device, first thing: a thread that has not chosen
 * one is on device 0, and were device 0 another rank's that had faulted,
 * its first call would answer that rank's fault as this one's. Nothing
 * for a handle of another backend. */
void comm_nccl_thread_on_gpu(comm *c);

/* A queue's own world ordered on the GPU instead of waited for
 * (comm_async's deferred queues; all for the thread using the world):
 *   - comm_nccl_defer(c): its calls return once NCCL has enqueued their
 *     work on the handle's stream; the work goes on, watched by
 *     comm_nccl_progress;
 *   - comm_nccl_wait_event(c, event): the work of its next calls starts
 *     after `event` (a cudaEvent_t of the world's device, recorded on
 *     another stream: the kernels that write the call's buffers);
 *   - comm_nccl_record_event(c, event): records `event` after the work
 *     enqueued so far (another stream then waits for it, cudaStreamWaitEvent);
 *   - comm_nccl_progress(c, waited_s): one look at the work in flight: 1
 *     while it runs, 0 once it is done (or there is none), -1 with the
 *     reason in c->error when an NCCL or CUDA error came, the world it was
 *     bootstrapped over failed, comm_abort was asked for, or the work is
 *     still running after waited_s > the world's timeout (waited_s: how
 *     long the thread has had nothing else to do): the world is then
 *     aborted, which ends its work on the GPU, and the message names the
 *     last call.
 * Each returns 0 (progress: also 1), or -1 with the reason in c->error (c
 * not an own world: -1; progress of another backend's handle: 0). */
int comm_nccl_defer(comm *c);
int comm_nccl_wait_event(comm *c, void *event);
int comm_nccl_record_event(comm *c, void *event);
int comm_nccl_progress(comm *c, double waited_s);

#endif
