/*
 * test_launch.c: which process of which job this is (runtime/launch.c,
 * mesh_job_info): the launchers' variables in their order, the batch
 * script of a SLURM allocation as one process, and variables that are not
 * numbers. Each test runs in its own process (runner.c), so setenv is safe.
 */
#include <stdlib.h> /* defines: setenv, unsetenv */
#include <string.h> /* defines: strcmp, strstr */

#include "mesh.h" /* defines: mesh_job_info */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

/* Clears every variable mesh_job_info reads, then sets NAME=VALUE pairs. */
static void env(const char *const *set)
{
    static const char *const all[] = {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                      "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                                      "SLURM_STEP_ID"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) unsetenv(all[i]);
    for (; set && set[0]; set += 2) setenv(set[0], set[1], 1);
}

/* mesh_job_info must say rank of size from launcher. */
static void expect(const char *launcher, int rank, int size)
{
    int r = -1, n = -1;
    const char *l = NULL;
    ASSERT_INT_EQ(mesh_job_info(&r, &n, &l), MESH_OK);
    ASSERT_NOT_NULL(l);
    ASSERT_INT_EQ(strcmp(l, launcher), 0);
    ASSERT_INT_EQ(r, rank);
    ASSERT_INT_EQ(n, size);
}

TEST_IMPL(launch_none_is_one_process)
{
    env(NULL);
    expect("none", 0, 1);
    ASSERT_INT_EQ(mesh_job_info(NULL, NULL, NULL), MESH_OK);
}

TEST_IMPL(launch_order_first_match_wins)
{
    /* srun's task (a job step) */
    env((const char *const[]){"SLURM_PROCID", "3", "SLURM_NTASKS", "4", "SLURM_STEP_ID", "0", NULL});
    expect("srun", 3, 4);
    /* the batch script of an allocation is task 0 of it, not of a step: one process */
    env((const char *const[]){"SLURM_PROCID", "0", "SLURM_NTASKS", "4", NULL});
    expect("none", 0, 1);
    /* mpirun inside an allocation: Open MPI's variables before SLURM's */
    env((const char *const[]){"SLURM_PROCID", "0", "SLURM_NTASKS", "4", "SLURM_STEP_ID", "0",
                              "OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "PMIX_RANK", "1", NULL});
    expect("mpirun", 1, 2);
    /* srun --mpi=pmix: PMIX_RANK, the size from the step */
    env((const char *const[]){"PMIX_RANK", "1", "SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_STEP_ID", "0",
                              NULL});
    expect("pmix", 1, 2);
    /* PMIx alone: the size is MPI's to tell */
    env((const char *const[]){"PMIX_RANK", "5", NULL});
    expect("pmix", 5, 0);
    env((const char *const[]){"PMI_RANK", "2", "PMI_SIZE", "3", "SLURM_PROCID", "0", NULL});
    expect("pmi", 2, 3);
    /* torchrun first; RANK alone is not torchrun's */
    env((const char *const[]){"RANK", "2", "WORLD_SIZE", "4", "OMPI_COMM_WORLD_RANK", "0",
                              "OMPI_COMM_WORLD_SIZE", "4", NULL});
    expect("torchrun", 2, 4);
    env((const char *const[]){"RANK", "2", "OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "4", NULL});
    expect("mpirun", 0, 4);
}

TEST_IMPL(launch_bad_variables_are_errors)
{
    int r;
    env((const char *const[]){"OMPI_COMM_WORLD_RANK", "one", "OMPI_COMM_WORLD_SIZE", "2", NULL});
    ASSERT_INT_EQ(mesh_job_info(&r, NULL, NULL), MESH_ERR_INVALID_ARG);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "OMPI_COMM_WORLD_RANK='one' is not a rank"));
    env((const char *const[]){"RANK", "0", "WORLD_SIZE", "0", NULL});
    ASSERT_INT_EQ(mesh_job_info(&r, NULL, NULL), MESH_ERR_INVALID_ARG);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "WORLD_SIZE='0' is not a number of processes"));
    env((const char *const[]){"PMI_RANK", "3", "PMI_SIZE", "3", NULL});
    ASSERT_INT_EQ(mesh_job_info(&r, NULL, NULL), MESH_ERR_INVALID_ARG);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "pmi says this is rank 3 of a job of 3 processes (PMI_SIZE)"));
}
