/* run_ranks.c — mesh_run_ranks: the ranks of a plan as threads of this
 * process, over the threads communicator (comm_threads.c), or, in a job of
 * several processes (launch.c), this process's one rank over MPI
 * (comm_mpi.c) when an MPI launcher started it, else over TCP (comm_tcp.c:
 * torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). */
#include <pthread.h> /* pthread_create, pthread_join */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* calloc, free, getenv, strtol */
#include <string.h>  /* strcmp, strncmp, strlen */

#include "api_impl.h" /* mesh__context_create, mesh__fail, mesh__job */
#include "comm.h"     /* comm_threads_*, comm_mpi_*, comm_tcp_* */

typedef struct rank_run {
    const mesh_plan *plan;
    comm_threads_world *world;
    int rank;
    mesh_rank_fn fn;
    void *ud;
    mesh_status st;
    char error[2048];
} rank_run;

/* The rank's context over c, and fn on it: r->st, and r->error if it
 * failed. A failed rank's NCCL calls in flight would never end (its peers
 * wait for calls it will not make), so its NCCL world must be aborted, not
 * finished, before the context goes: with ranks as threads (tell), c is
 * aborted, which stops the others at once, naming this rank, and which the
 * NCCL world watches as it finishes; one rank per process aborts its NCCL
 * world itself (saying so on stderr), then comm_*_finish tells the others.
 * A rank with a step that failed (mesh__exec_failed: a collective, or its
 * device) has failed, even if fn went on and returned MESH_OK: the others
 * may wait in a collective of that step. */
static void run_rank(rank_run *r, comm *c, int tell)
{
    mesh_context *ctx = NULL;
    r->st = mesh__context_create(r->plan, r->rank, c, NULL, NULL, &ctx);
    if (r->st == MESH_OK) r->st = r->fn(ctx, r->rank, r->ud);
    if (r->st == MESH_OK && ctx->ex && mesh__exec_failed(ctx->ex))
        r->st = mesh__fail(MESH_ERR_RANK, "its function returned MESH_OK, but a step of it failed: %s",
                           mesh__exec_error(ctx->ex));
    if (r->st != MESH_OK) {
        snprintf(r->error, sizeof r->error, "%s", mesh_last_error());
        if (tell && c) comm_abort(c, r->error);
        else if (ctx && ctx->nccl) comm_abort(ctx->nccl, r->error);
    }
    mesh_context_free(ctx);
}

static void *run_one(void *arg)
{
    rank_run *r = arg;
    comm *c = comm_threads_rank(r->world, r->rank);
    if (!c) {
        r->st = MESH_ERR_NOMEM;
        snprintf(r->error, sizeof r->error, "out of memory");
        return NULL;
    }
    run_rank(r, c, 1); /* (a failed rank aborts c: the others stop, naming it) */
    comm_free(c);
    return NULL;
}

/* The processes that share this node's cores: torchrun's LOCAL_WORLD_SIZE
 * (mpirun binds each process to its cores instead); 1 if unset. */
static int local_processes(void)
{
    const char *s = getenv("LOCAL_WORLD_SIZE");
    char *end;
    long v = s ? strtol(s, &end, 10) : 1;
    return s && (end == s || *end || v < 1 || v > 1 << 20) ? 1 : (int)v;
}

/* "the plan has 4 ranks (dp 4 x ...); this job has 2 processes" */
/* st, with "rank R: " before why unless why starts so already (the
 * executor names the rank itself). */
static mesh_status fail_rank(mesh_status st, int rank, const char *why)
{
    char own[24];
    snprintf(own, sizeof own, "rank %d: ", rank);
    return strncmp(why, own, strlen(own)) ? mesh__fail(st, "%s%s", own, why) : mesh__fail(st, "%s", why);
}

static mesh_status mismatch(const mesh_plan *mp, int processes)
{
    const fe_setup *s = &mp->p.setup;
    char hint[120] = "run it in one process";
    if (s->world > 1)
        snprintf(hint, sizeof hint, "start one process per rank (mpirun -n %lld), or one process, which runs them "
                 "all as threads", s->world);
    return mesh__fail(MESH_ERR_INVALID_ARG, "the plan has %lld rank%s (dp %lld x tp %lld x pp %lld x ep %lld); "
                      "this job has %d process%s: %s", s->world, s->world == 1 ? "" : "s", s->dp, s->tp, s->pp,
                      s->ep, processes, processes == 1 ? "" : "es", hint);
}

/* This process is rank job->rank of a job of several processes: fn runs
 * for that rank alone, over MPI (an MPI launcher's job) or TCP (torchrun's,
 * or any that sets RANK and WORLD_SIZE). */
static mesh_status run_process_rank(const mesh_plan *mp, const mesh__job *job, mesh_rank_fn fn, void *ud)
{
    int n = (int)mp->p.setup.world, tcp = !job->mpi;
    char why[512];
    if (job->size > 0 && job->size != n) return mismatch(mp, job->size);
    if (tcp && strcmp(job->launcher, "torchrun") != 0)
        return mesh__fail(MESH_ERR_UNSUPPORTED, "%s started this process (rank %d of %d) without MPI: launch with "
                          "srun --mpi=pmix or mpirun -n %d, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as "
                          "torchrun does (the ranks then talk over TCP)", job->launcher, job->rank, job->size, n);
    if (n > 1 && mesh__exec_supported(&mp->p, why, sizeof why) != 0)
        return mesh__fail(MESH_ERR_UNSUPPORTED, "%s", why);
    comm *c = tcp ? comm_tcp_world(comm_timeout_from_env(), why, sizeof why)
                  : comm_mpi_world(comm_timeout_from_env(), why, sizeof why);
    if (!c) return mesh__fail(tcp ? MESH_ERR_IO : MESH_ERR_UNSUPPORTED, "%s", why);
    if (c->size != n || (job->size > 0 && c->world_rank != job->rank)) {
        mesh_status st = c->size != n ? mismatch(mp, c->size)
                                      : mesh__fail(MESH_ERR_INVALID_ARG, "%s says this is rank %d, %s says %d",
                                                   job->launcher, job->rank, tcp ? "RANK" : "MPI", c->world_rank);
        comm_free(c);
        return st;
    }
    mesh__share_threads(tcp ? local_processes() : 1);
    rank_run r = {mp, NULL, c->world_rank, fn, ud, MESH_OK, ""};
    run_rank(&r, n > 1 ? c : NULL, 0); /* (comm_*_finish tells the others) */
    /* MPI stops the job if the others go on; TCP stops them, and says why */
    int first = tcp ? comm_tcp_finish(c, r.st != MESH_OK, r.error) : comm_mpi_finish(c, r.st != MESH_OK, r.error);
    char after[sizeof c->error];
    snprintf(after, sizeof after, "%s", tcp ? c->error : "");
    comm_free(c);
    if (r.st != MESH_OK) return fail_rank(r.st, r.rank, r.error);
    if (first >= 0 && after[0]) return fail_rank(MESH_ERR_RANK, r.rank, after);
    if (first >= 0) return mesh__fail(MESH_ERR_RANK, "rank %d failed (its process says why)", first);
    return MESH_OK;
}

mesh_status mesh_run_ranks(const mesh_plan *mp, mesh_rank_fn fn, void *ud)
{
    if (!mp || !fn) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_run_ranks: NULL argument");
    int n = (int)mp->p.setup.world;
    mesh__job job;
    char why[400];
    if (mesh__job_detect(&job, why, sizeof why) != 0) return mesh__fail(MESH_ERR_INVALID_ARG, "%s", why);
    if (job.size != 1) return run_process_rank(mp, &job, fn, ud);
    if (n == 1) {
        mesh_context *ctx = NULL;
        mesh_status st = mesh_context_create(mp, 0, &ctx);
        if (st == MESH_OK) st = fn(ctx, 0, ud);
        mesh_context_free(ctx);
        return st;
    }
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
    /* the cause: the first rank that failed on its own, not because another
     * did: its fn's own status, else a failure in a collective or on its
     * GPU that names no other rank's (comm_names_other) */
    int cause = -1;
    for (int r = 0; r < started && cause < 0; r++)
        if (runs[r].st != MESH_OK && runs[r].st != MESH_ERR_RANK) cause = r;
    for (int r = 0; r < started && cause < 0; r++)
        if (runs[r].st != MESH_OK && !comm_names_other(runs[r].error, r)) cause = r;
    for (int r = 0; r < started && cause < 0; r++)
        if (runs[r].st != MESH_OK) cause = r;
    mesh_status st = started < n ? MESH_ERR_NOMEM : MESH_OK;
    if (cause >= 0) st = fail_rank(runs[cause].st, cause, runs[cause].error);
    else if (started < n) st = mesh__fail(st, "could not start the thread of rank %d", started);
    free(runs);
    free(th);
    return st;
}
