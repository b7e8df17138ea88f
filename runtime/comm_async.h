/* comm_async.h — collectives that run while the caller computes
 * (internal to libmesh): a queue of calls over a communicator of its own,
 * run in order by a thread of its own.
 *
 * The executor issues a bucket's gradient sum as soon as backward has
 * finished its gradients and goes on with the layers below; it waits for
 * the queue before the optimizer reads them (docs/parallelism.md, overlap).
 *
 * Every member of the group issues the same calls in the same order (the
 * plan's program is the same on each); each is the backend's own call on
 * the queue's communicator (a copy of the group made by comm_split), so a
 * result is the same bits as the blocking call's. A buffer handed to the
 * queue is the queue's until its ticket is waited for: the caller neither
 * writes it nor (for an output) reads it.
 *
 * The bracket, if any, is called around each call in the queue's thread
 * (open 1, then 0): the guarded test device opens its memory with it.
 *
 * Failure: a call that fails fails the queue: its wait and every later
 * call and wait return -1 with the reason in comm_async_error (the
 * backend's message: which call, which rank). A rank that fails elsewhere
 * stops the world (comm_abort): the queue's calls then fail too, so
 * comm_async_free never waits longer than the backend's timeout.
 */
#ifndef MESH_COMM_ASYNC_H
#define MESH_COMM_ASYNC_H

#include <stddef.h> /* size_t */

#include "comm.h" /* comm */

typedef struct comm_async comm_async;

typedef void (*comm_async_bracket)(void *ud, int open);

/* 1 if c's backend lets a queue's thread call it while the rank calls
 * it too: threads, TCP, MPI with MPI_THREAD_MULTIPLE; not NCCL (one
 * thread a world; its overlap is its own stream's). */
int comm_async_supported(const comm *c);

/* A queue over c's group (collective over c: it splits c), with its
 * thread. 0, or -1 with the reason in c->error (out of memory, no
 * thread, the split failed). */
int comm_async_new(comm *c, comm_async_bracket bracket, void *ud, comm_async **out);

/* Queues a call (comm.h's, with the same arguments): returns its ticket
 * (>= 1, in issue order), or -1 if the queue failed or is out of memory. */
long comm_async_all_reduce(comm_async *a, float *buf, size_t n);
long comm_async_reduce_scatter(comm_async *a, const float *in, float *out, size_t n);
long comm_async_all_gather(comm_async *a, const float *in, float *out, size_t n);
/* the bucket calls (comm.h's _v); the arrays are copied, the buffers not */
long comm_async_all_reduce_v(comm_async *a, float *const *bufs, const size_t *n, int k);
long comm_async_reduce_scatter_v(comm_async *a, float *const *bufs, const size_t *n, int k);
long comm_async_all_gather_v(comm_async *a, float *const *bufs, const size_t *n, int k);

/* Waits until the call of `ticket` (and all before it) has run: 0, or -1
 * if the queue failed. comm_async_wait_all: every call issued. */
int comm_async_wait(comm_async *a, long ticket);
int comm_async_wait_all(comm_async *a);

/* The ticket of the latest call issued (0 before the first). */
long comm_async_last(const comm_async *a);

/* Calls issued that have not finished running (0 after wait_all). */
long comm_async_pending(const comm_async *a);

/* Stops the world (comm_abort on the queue's communicator): a rank that
 * fails with calls in flight, so that the queue's calls end at once. */
void comm_async_abort(comm_async *a, const char *why);

/* Test hook: the queue's thread sleeps `seconds` before each call, so that
 * a caller that reads a buffer before waiting for its call reads it stale
 * every time, not once in a while. */
void comm_async_set_delay(comm_async *a, double seconds);

/* Seconds the queue's calls have run so far, in all (its thread's busy
 * time: what overlapping can hide). */
double comm_async_busy(const comm_async *a);

/* Why the queue failed ("" if it did not). */
const char *comm_async_error(const comm_async *a);

/* Waits for the queue, ends its thread and frees its communicator;
 * NULL does nothing. */
void comm_async_free(comm_async *a);

#endif
