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
 * Hooks (comm_async_hooks) tie the queue to a device's own ordering. A
 * GPU's kernels run after the host has moved on, so "backward has
 * finished the gradient" means its kernels are enqueued, not done: mark
 * runs in the caller's thread as a call is queued and records an event on
 * the compute stream; wait runs in the queue's thread before the call and
 * waits for that event (on the host, or, deferred, the queue's stream
 * waits for it on the GPU, and the caller's stream waits for the call's
 * work after its comm_async_wait: then neither host waits for the GPU).
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

/* What a queue's owner runs for each call (any hook may be NULL):
 *   - mark(ud, ticket): in the caller's thread as call `ticket` is queued,
 *     before the queue's thread can run it;
 *   - wait(ud, ticket, c): in the queue's thread, before it runs the call
 *     (c: the queue's communicator);
 *   - ran(ud, ticket, c): in the queue's thread, once the call has run
 *     (deferred: once its work is enqueued);
 *   - joined(ud, ticket): in the caller's thread, at the end of a
 *     successful comm_async_wait for `ticket` (the latest call waited for).
 * A hook returns 0, or -1 with its reason in err (n bytes): a failed mark
 * fails the issue, a failed wait or ran the call, a failed joined the wait
 * (each fails the queue).
 * marks > 0: the owner keeps a slot per call in flight, `ticket % marks`
 * (a ring of events): issuing call t first waits until call t - marks
 * has run, so that no slot is marked again while its call may still wait
 * for it. 0: no bound.
 * deferred: the queue's NCCL calls return once NCCL has enqueued their
 * work on the queue's stream (comm_nccl_defer), not once it is done; the
 * hooks order it on the GPU instead (wait: the queue's stream waits for
 * the caller's kernels, comm_nccl_wait_event; ran: an event after the
 * call, comm_nccl_record_event; joined: the caller's stream waits for it).
 * A call then counts as run once enqueued (comm_async_wait returns then),
 * and while the queue has nothing else to do its thread watches the work
 * in flight (comm_nccl_progress: errors, a failed rank, the timeout). Other
 * backends' calls are done when they return: deferred changes nothing. */
typedef struct comm_async_hooks {
    int (*mark)(void *ud, long ticket, char *err, size_t n);
    int (*wait)(void *ud, long ticket, comm *c, char *err, size_t n);
    int (*ran)(void *ud, long ticket, comm *c, char *err, size_t n);
    int (*joined)(void *ud, long ticket, char *err, size_t n);
    void *ud;
    int marks;
    int deferred;
} comm_async_hooks;

/* 1 if c's backend lets a queue's thread call it while the rank calls
 * it too: threads, TCP, MPI with MPI_THREAD_MULTIPLE, NCCL (the queue's
 * communicator gets an NCCL world of its own, comm_nccl_own_thread, and its
 * own stream). */
int comm_async_supported(const comm *c);

/* A queue over c's group (collective over c: it splits c), with its
 * thread; hooks (copied) may be NULL. 0, or -1 with the reason in
 * c->error (out of memory, no thread, the split failed). */
int comm_async_new(comm *c, const comm_async_hooks *hooks, comm_async **out);

/* The queue's thread stages its communicator's copies (a checked handle
 * staged through host memory: comm_checked_stage) on d, its own handle on
 * the device, not on the rank's. Before the first call is queued. 0, or -1
 * with the reason in comm_async_error. */
struct dev;
int comm_async_own_device(comm_async *a, struct dev *d);

/* Queues a call (comm.h's, with the same arguments): returns its ticket
 * (>= 1, in issue order), or -1 if the queue failed, is out of memory or
 * the mark failed. With hooks.marks, it may first wait for an earlier
 * call (see comm_async_hooks). */
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

/* Calls issued that have not finished running (0 after wait_all), and,
 * deferred, one more while work enqueued is not known to be done (so
 * possibly 1 after wait_all). */
long comm_async_pending(const comm_async *a);

/* Stops the world (comm_abort on the queue's communicator): a rank that
 * fails with calls in flight, so that the queue's calls end at once. */
void comm_async_abort(comm_async *a, const char *why);

/* The float elements (comm.h's COMM_*) of the calls issued from now on:
 * the queue's thread sets its group's (comm_set_elements) before each.
 * The issuing thread's own setting; until set, the group's own type. */
void comm_async_set_elements(comm_async *a, int type);

/* Test hook: the queue's thread sleeps `seconds` before each call, so that
 * a caller that reads a buffer before waiting for its call reads it stale
 * every time, not once in a while. */
void comm_async_set_delay(comm_async *a, double seconds);

/* Seconds the queue's calls have run so far, in all (its thread's busy
 * time: what overlapping can hide; deferred: the time its stream had work,
 * as its thread saw it). */
double comm_async_busy(const comm_async *a);

/* Why the queue failed ("" if it did not). */
const char *comm_async_error(const comm_async *a);

/* Waits for the queue, ends its thread and frees its communicator;
 * NULL does nothing. */
void comm_async_free(comm_async *a);

#endif
