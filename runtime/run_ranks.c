/* run_ranks.c — mesh_run_ranks: the ranks of a plan as threads of this
 * process, over the threads communicator (comm_threads.c). */
#include <pthread.h> /* pthread_create, pthread_join */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* calloc, free */

#include "api_impl.h" /* mesh__context_create, mesh__fail */
#include "comm.h"     /* comm_threads_* */

typedef struct rank_run {
    const mesh_plan *plan;
    comm_threads_world *world;
    int rank;
    mesh_rank_fn fn;
    void *ud;
    mesh_status st;
    char error[1024];
} rank_run;

static void *run_one(void *arg)
{
    rank_run *r = arg;
    comm *c = comm_threads_rank(r->world, r->rank);
    mesh_context *ctx = NULL;
    if (!c) {
        r->st = MESH_ERR_NOMEM;
        snprintf(r->error, sizeof r->error, "out of memory");
        return NULL;
    }
    r->st = mesh__context_create(r->plan, r->rank, c, NULL, NULL, &ctx);
    if (r->st == MESH_OK) {
        r->st = r->fn(ctx, r->rank, r->ud);
        if (r->st != MESH_OK) comm_abort(c, mesh_last_error()); /* the others stop, naming this rank */
    }
    if (r->st != MESH_OK) snprintf(r->error, sizeof r->error, "%s", mesh_last_error());
    mesh_context_free(ctx);
    comm_free(c);
    return NULL;
}

mesh_status mesh_run_ranks(const mesh_plan *mp, mesh_rank_fn fn, void *ud)
{
    if (!mp || !fn) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_run_ranks: NULL argument");
    int n = (int)mp->p.setup.world;
    if (n == 1) {
        mesh_context *ctx = NULL;
        mesh_status st = mesh_context_create(mp, 0, &ctx);
        if (st == MESH_OK) st = fn(ctx, 0, ud);
        mesh_context_free(ctx);
        return st;
    }
    char why[400];
    if (mesh__exec_supported(&mp->p, why, sizeof why) != 0) return mesh__fail(MESH_ERR_UNSUPPORTED, "%s", why);
    mesh__share_threads(n);
    rank_run *runs = calloc((size_t)n, sizeof *runs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    comm_threads_world *w = comm_threads_world_new(n, comm_timeout_from_env());
    if (!runs || !th || !w) {
        free(runs);
        free(th);
        comm_threads_world_free(w);
        return mesh__fail(MESH_ERR_NOMEM, "out of memory");
    }
    int started = 0;
    for (int r = 0; r < n; r++) {
        runs[r] = (rank_run){mp, w, r, fn, ud, MESH_OK, ""};
        if (pthread_create(&th[r], NULL, run_one, &runs[r]) != 0) break;
        started++;
    }
    if (started < n) { /* the started ranks fail in their first collective */
        comm *c = comm_threads_rank(w, started);
        if (c) comm_abort(c, "could not start its thread");
        for (int r = started + 1; r < n; r++) comm_free(comm_threads_rank(w, r));
        comm_free(c);
    }
    for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
    /* the cause: the first rank that failed on its own, not because another did */
    int cause = -1;
    for (int r = 0; r < started && cause < 0; r++)
        if (runs[r].st != MESH_OK && runs[r].st != MESH_ERR_RANK) cause = r;
    for (int r = 0; r < started && cause < 0; r++)
        if (runs[r].st != MESH_OK) cause = r;
    mesh_status st = started < n ? MESH_ERR_NOMEM : MESH_OK;
    if (cause >= 0) st = mesh__fail(runs[cause].st, "rank %d: %s", cause, runs[cause].error);
    else if (started < n) st = mesh__fail(st, "could not start the thread of rank %d", started);
    free(runs);
    free(th);
    return st;
}
