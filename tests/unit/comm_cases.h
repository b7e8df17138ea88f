/*
 * comm_cases.h: communicator checks that every backend must pass, run by
 * one rank on its handle: the threads backend's unit tests (test_comm.c)
 * and the MPI tests (tests/mpi/mpi_tests.c, under mpirun) run the same
 * ones, against the same serial references, so that both give the same
 * bits.
 */
#ifndef MESH_COMM_CASES_H
#define MESH_COMM_CASES_H

#include <stddef.h> /* defines: size_t */

#include "comm.h" /* defines: comm */

enum { COMM_CASES_MAX_RANKS = 8 };

/* Every collective (the bucket calls, all_reduce_v, reduce_scatter_v and
 * all_gather_v, too) against a serial reference (sums in rank order, equal
 * to the bit), point to point around the ring with sends first, and a
 * receive of the wrong size, whose message goes to note. A group of 2 to
 * COMM_CASES_MAX_RANKS ranks. Returns 0 if all passed; -1 if a call failed
 * (its message in err); else a bit per failed check. */
int comm_case_collectives(comm *c, char *note, char *err, size_t n);

/* A group of 4 split 2 x 2 ("tp" {0,1} {2,3}, "dp" {0,2} {1,3} with keys
 * reversed), sums and point to point inside the groups, and a rank that
 * opts out of a split. Returns as comm_case_collectives. */
int comm_case_groups(comm *c, char *err, size_t n);

/* Failure: rank 1 aborts ("the loss is not finite at step 3"); any other
 * rank enters an all-reduce, which must fail (its message in err). Returns
 * 0 as expected, 1 if the all-reduce succeeded. */
int comm_case_one_aborts(comm *c, char *err, size_t n);

/* A timeout: rank 1 waits `idle` seconds, never entering the all-reduce
 * the others enter, which must fail (its message in err). Returns as
 * comm_case_one_aborts. */
int comm_case_one_missing(comm *c, double idle, char *err, size_t n);

/* A communication queue (comm_async.h) beside the rank's own calls: an
 * all-reduce, a reduce-scatter, a bucket of two (all_reduce_v) and an
 * all-gather queued, blocking all-reduces on c meanwhile, then the waits: every
 * result equal to the serial reference (the bits of the blocking calls).
 * Returns as comm_case_collectives; 1 if the backend takes no queue. */
int comm_case_async(comm *c, char *err, size_t n);

/* Failure in a queue: rank 1 aborts ("rank 1 ran out of memory") while
 * the others have an all-reduce queued: their wait must fail naming it,
 * later calls fail at once, and comm_async_free returns (err: the wait's
 * message; or the queue's making's, when the abort came before a peer had
 * finished it). Returns 0 as expected. */
int comm_case_async_abort(comm *c, char *err, size_t n);

/* A queue's hooks (comm_async_hooks): each call marked in the caller's
 * thread before the queue runs it, and waited for in the queue's, in
 * ticket order; with a ring of 4 marks over a slow queue, never more than
 * 4 calls marked and not yet waited for (a slot is not marked again before
 * its call ran); a wait that fails fails its call and the queue with the
 * hook's reason, a mark that fails the issue. The sums are right. */
int comm_case_async_hooks(comm *c, char *err, size_t n);

#endif
