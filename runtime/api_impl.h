/* api_impl.h — what the files of the public API share (internal to libmesh).
 *
 * The public handles are defined here so that api.c (plans, contexts,
 * checkpoints, sampling), data_api.c (token streams) and tokenizer.c can
 * each see them; mesh.h keeps them opaque. Every public call that fails
 * records its message with mesh__fail, which mesh_last_error returns.
 */
#ifndef MESH_API_IMPL_H
#define MESH_API_IMPL_H

#include "checkpoint.h" /* mesh__ckpt_lock */
#include "exec.h"       /* mesh__exec */
#include "mesh.h"       /* mesh_status */
#include "plan.h"       /* plan */

struct mesh_plan {
    plan p;
};

struct mesh_context {
    const mesh_plan *plan;
    mesh__exec *ex;
    long long step; /* steps taken (a skipped one included) */
    int rank;       /* in the plan's world */
    mesh_device_kind device; /* what it runs on (mesh_set_device): the executor's arena and
                                kernels are on the GPU with MESH_DEVICE_CUDA */
    char device_why[640];    /* why (mesh_context_device) */
    comm *nccl;     /* several ranks on GPUs: the world of device buffers (NCCL's), owned */
    mesh__ckpt_lock ckpt_lock; /* rank 0: its hold on the folder it saves in (checkpoint.h) */
};

/* Test hook: executor flags (MESH__EXEC_*) every context created from now
 * on gets, besides the process's settings (MESH__EXEC_GUARD for tests of
 * several ranks). */
void mesh__set_exec_flags(unsigned flags);

/* Rank `rank`'s context over world (NULL for a plan of one rank); on
 * failure the world is aborted. */
mesh_status mesh__context_create(const mesh_plan *mp, int rank, comm *world, mesh_alloc_fn alloc, void *ud,
                                 mesh_context **out);

/* Records the message of a failing call for mesh_last_error (this
 * thread's) and returns st. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
mesh_status mesh__fail(mesh_status st, const char *fmt, ...);

/* This process's place in its job, from its launcher's variables
 * (launch.c; the order is docs/runtime.md's). */
typedef struct mesh__job {
    const char *launcher; /* "torchrun", "mpirun", "pmix", "pmi", "srun"; "none" */
    int rank, size;       /* size 0: the launcher does not say (srun --mpi=pmix's PMIX_RANK alone) */
    int mpi;              /* MPI started the process: its ranks can talk through MPI */
} mesh__job;

/* 0, or -1 with the reason in err for a variable that is not a number or
 * a rank outside the job. */
int mesh__job_detect(mesh__job *job, char *err, size_t n);

/* This process's rank on its node, from the launcher's variables
 * (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID);
 * -1 when none says. */
int mesh__job_local_rank(void);

/* Unless mesh_set_threads was called: the kernels' threads set to the
 * process's cores divided by ranks sharing them. */
void mesh__share_threads(int ranks);

/* The vocabulary token ids must be below: the smaller of the embedding
 * table's rows (padded) and the loss's classes (without the padding). */
int mesh__plan_vocab(const plan *p);

/* MESH_OK if each of ids[n] is a token of p's vocabulary (0 to
 * mesh__plan_vocab - 1), else MESH_ERR_INVALID_ARG naming the first that
 * is not (who: the call; what: "inputs", "targets"): no kernel, on the
 * CPU or a GPU, reads an embedding row or a logit past the table. */
mesh_status mesh__check_ids(const plan *p, const int *ids, size_t n, const char *who, const char *what);

#endif
