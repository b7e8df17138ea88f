/* verify.h — static deadlock and consistency check over rank programs.
 *
 * Each rank is a straight-line program of collectives, sends and receives.
 * verify_run executes all of them symbolically, as the runtime would:
 *
 *   - ranks run their ops in order;
 *   - a send never waits (it is posted, as with a buffered or non-blocking
 *     send whose wait comes later);
 *   - a receive waits until a send from `peer` with the same tag was
 *     posted, and takes the oldest such send; the two must agree on bytes;
 *   - a collective waits until every member of its group is at a
 *     collective on that group; they must all agree on `coll` and `bytes`,
 *     and a rank may only enter collectives of groups it belongs to.
 *
 * A run fails on the first disagreement, when no rank can move while some
 * have ops left (a deadlock), or when a send is never received. The check
 * is event-driven: each op is executed once and a blocked rank is only
 * looked at again when what it waits for arrives, so the cost is linear in
 * the ops plus the group sizes of the collectives: 3072 ranks of about
 * 10^4 ops each (2.8e7 ops) take about a second at -O2.
 *
 * Ownership: verify_run reads its inputs and keeps nothing.
 */
#ifndef MESH_VERIFY_H
#define MESH_VERIFY_H

#include <stddef.h> /* size_t */

#include "sched.h" /* sched */

typedef enum verify_kind { VERIFY_COLL, VERIFY_SEND, VERIFY_RECV } verify_kind;

typedef struct verify_op {
    verify_kind kind;
    int group;        /* VERIFY_COLL: index into the groups array */
    int coll;         /* collective type code; all members must agree */
    long long bytes;  /* must agree across a collective's members, and between a send and its receive */
    int peer;         /* VERIFY_SEND/RECV: the other rank */
    int tag;          /* p2p matching: a recv matches the oldest unmatched send from peer with the same tag */
    const char *what; /* human description for messages, e.g. "all-reduce(tp) of h.3 attention out";
                         NULL: messages describe the op from its fields */
} verify_op;

typedef struct verify_program {
    const verify_op *ops;
    int n;
} verify_program;

typedef struct verify_group {
    const int *ranks; /* distinct ranks, 0 .. n_ranks-1 */
    int n;
} verify_group;

/* Returns 0 when every rank runs to completion; otherwise -1 and a
 * message naming the ranks and the operations at fault (msg may be NULL;
 * a message longer than msg_len is cut). Deadlock messages list each
 * blocked rank, its op and what it waits for, up to 8 ranks. Malformed
 * input (a peer or group out of range, a group listing a rank twice) and
 * running out of memory fail the same way. */
int verify_run(const verify_program *ranks, int n_ranks, const verify_group *groups, int n_groups,
               char *msg, size_t msg_len);

/* Checks a pipeline schedule: stage st becomes rank st, each SEND/RECV unit
 * a send/recv whose tag names the transfer (2 * (micro * pp*v + c) + d,
 * where c is the chunk that consumes the data and d is 0 for activations,
 * 1 for gradients). Returns verify_run's result. */
int verify_sched(const sched *s, char *msg, size_t msg_len);

#endif
