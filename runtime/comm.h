/* comm.h — communicators: the collectives and point-to-point transfers
 * the ranks of a plan exchange (internal to libmesh).
 *
 * A communicator is one rank's handle on a group of ranks. Backends fill
 * a small function table: threads (all ranks as threads of one process,
 * shared-memory collectives; comm_threads.c), MPI (one rank per process;
 * comm_mpi.c) and NCCL. Every call is
 * collective over the group unless said otherwise, returns 0, or -1 with
 * the reason in c->error ("all-reduce over 4 ranks: rank 2 failed: ...").
 *
 * Determinism: sums are taken in rank order, the same on every rank, so a
 * result is the same run to run, on every member, and in every backend (to
 * the bit).
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
     * is eager (the data is copied and the sender goes on), so sends and
     * receives in any order cannot deadlock */
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

/* Records why a call failed, "OP over N ranks (this is rank R): WHY", in
 * c->error; returns -1. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int comm_fail(comm *c, const char *op, const char *fmt, ...);

/* A backend's scratch buffer *buf of *cap floats, grown to hold n (kept
 * when it does); NULL if out of memory. */
float *comm_scratch(float **buf, size_t *cap, size_t n);

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

#endif
