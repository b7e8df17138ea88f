/* comm_watch.c — a watch on a world (comm.h): whether it stopped, asked
 * without waiting, by whatever was bootstrapped over it (the NCCL world
 * polls it while it waits on the GPU). One for each backend that can say:
 * a threads world (a rank aborted it), a TCP one (a rank aborted it, or
 * its process ended before saying goodbye) and an MPI one (this process's
 * rank failed: comm_mpi_stop; another process's failure ends the job). */
#include "comm.h"

#include <stdatomic.h> /* atomic_int: holders on several threads */
#include <stdlib.h>    /* calloc, free */

struct comm_watch {
    atomic_int refs;
    comm_threads_world *threads; /* one of the two, held */
    comm_tcp_state *tcp;
    int mpi; /* or an MPI world: this process's (comm_mpi_stop) */
};

comm_watch *comm_watch_of(const comm *c)
{
    comm_threads_world *tw = comm_threads_world_of(c);
    comm_tcp_state *pw = tw ? NULL : comm_tcp_state_of(c);
    int mpi = !tw && !pw && comm_mpi_of(c);
    if (!tw && !pw && !mpi) return NULL;
    comm_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    atomic_init(&w->refs, 1);
    w->mpi = mpi;
    if (tw) comm_threads_world_hold(w->threads = tw);
    else if (pw) comm_tcp_hold(w->tcp = pw);
    return w;
}

void comm_watch_hold(comm_watch *w)
{
    if (w) atomic_fetch_add(&w->refs, 1);
}

void comm_watch_stop(comm_watch *w, const char *why)
{
    if (!w) return;
    if (w->threads) comm_threads_stop(w->threads, why);
    else if (w->tcp) comm_tcp_stop(w->tcp, why);
    else comm_mpi_stop(why);
}

int comm_watch_stopped(comm_watch *w, char *why, size_t n)
{
    if (!w) return 0;
    if (w->threads) return comm_threads_aborted(w->threads, why, n);
    return w->tcp ? comm_tcp_stopped(w->tcp, why, n) : comm_mpi_stopped(why, n);
}

void comm_watch_release(comm_watch *w)
{
    if (!w || atomic_fetch_sub(&w->refs, 1) != 1) return;
    comm_threads_release(w->threads);
    comm_tcp_release(w->tcp);
    free(w);
}
