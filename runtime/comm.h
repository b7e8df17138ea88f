/* comm.h — communicators: the collectives and point-to-point transfers
 * the ranks of a plan exchange (internal to libmesh).
 *
 * A communicator is one rank's handle on a group of ranks. Backends fill
 * a small function table: threads (all ranks as threads of one process,
 * shared-memory collectives; comm_threads.c), MPI and NCCL. Every call is
 * collective over the group unless said otherwise, returns 0, or -1 with
 * the reason in c->error ("all-reduce over 4 ranks: rank 2 failed: ...").
 *
 * Determinism: sums are taken in rank order, the same on every rank, so a
 * result is the same run to run and on every member.
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
     * returns once the peer has the data */
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
} comm_vtbl;

struct comm {
    const comm_vtbl *v;
    int rank, size;        /* in this group */
    int world_rank;        /* in the world */
    char error[320];       /* why the last call failed */
};

/* Calls through the table; comm_free(NULL) does nothing. */
int comm_all_reduce(comm *c, float *buf, size_t n);
int comm_reduce_scatter(comm *c, const float *in, float *out, size_t n);
int comm_all_gather(comm *c, const float *in, float *out, size_t n);
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

/* The collective timeout: MESH_COLLECTIVE_TIMEOUT_S, else 600 seconds. */
double comm_timeout_from_env(void);

#endif
