/* launch.c — which process of which job this is: the variables its
 * launcher set, read in a fixed order (docs/runtime.md, "Launching"), and
 * mesh_job_info.
 *
 * The first launcher whose variables are all set wins: torchrun (RANK,
 * WORLD_SIZE), Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE), PMIx
 * (PMIX_RANK; the size from SLURM_NTASKS in a job step, else MPI's), PMI-2
 * or Hydra (PMI_RANK, PMI_SIZE), SLURM's srun (SLURM_PROCID, SLURM_NTASKS,
 * in a job step: SLURM_STEP_ID; a batch script has the first two too, as
 * task 0 of the allocation, and runs as one process); none: one process.
 * Launcher variables come before SLURM's, which a process mpirun starts
 * inside an allocation inherits.
 */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* getenv, strtol */

#include "api_impl.h" /* mesh__job, mesh__fail */

static const struct launcher {
    const char *name, *rank, *size; /* size NULL: SLURM_NTASKS in a job step, else unknown */
    const char *also;               /* a variable that must be set too, or NULL */
} launchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", NULL},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", NULL},
    {"pmix", "PMIX_RANK", NULL, NULL},
    {"pmi", "PMI_RANK", "PMI_SIZE", NULL},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID"},
};

/* The variable's value as a number >= lo; 0 if unset, -1 (with the reason)
 * if it is not such a number. */
static int env_int(const char *name, int lo, int *out, char *err, size_t n)
{
    const char *s = getenv(name);
    char *end;
    if (!s) return 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > 1 << 30) {
        snprintf(err, n, "%s='%s' is not a %s", name, s, lo ? "number of processes" : "rank");
        return -1;
    }
    *out = (int)v;
    return 1;
}

int mesh__job_detect(mesh__job *job, char *err, size_t n)
{
    *job = (mesh__job){"none", 0, 1, 0};
    job->mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const struct launcher *l = &launchers[i];
        const char *size = l->size ? l->size : getenv("SLURM_STEP_ID") ? "SLURM_NTASKS" : "";
        if (!getenv(l->rank) || (l->size && !getenv(l->size)) || (l->also && !getenv(l->also))) continue;
        job->launcher = l->name;
        job->size = 0;
        if (env_int(l->rank, 0, &job->rank, err, n) < 0 || (size[0] && env_int(size, 1, &job->size, err, n) < 0))
            return -1;
        if (job->size > 0 && job->rank >= job->size) {
            snprintf(err, n, "%s says this is rank %d of a job of %d processes (%s)", l->name, job->rank, job->size,
                     size);
            return -1;
        }
        return 0;
    }
    return 0;
}

int mesh__job_local_rank(void)
{
    static const char *const vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
    char err[160];
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        int r = -1;
        if (env_int(vars[i], 0, &r, err, sizeof err) == 1) return r;
    }
    return -1;
}

mesh_status mesh_job_info(int *rank, int *processes, const char **launcher)
{
    mesh__job job;
    char err[200];
    if (mesh__job_detect(&job, err, sizeof err) != 0) return mesh__fail(MESH_ERR_INVALID_ARG, "%s", err);
    if (rank) *rank = job.rank;
    if (processes) *processes = job.size;
    if (launcher) *launcher = job.launcher;
    return MESH_OK;
}
