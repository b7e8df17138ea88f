/*
 * mpi_tests.c: the MPI communicator (runtime/comm_mpi.c) and
 * mesh_run_ranks in a job of several processes, one case per run; tests/run.sh
 * starts it under mpirun -n 2 and -n 4 and checks what every process
 * prints, the exit status and the time taken.
 *
 * usage: mpi_tests CASE [PLAN DATA]
 *   collectives   comm_case_collectives (tests/unit/comm_cases.c, which the
 *                 threads backend passes too): "ok collectives (rank R of N)"
 *   groups        comm_case_groups, on 4 ranks
 *   async         comm_case_async: a communication queue's thread calls MPI
 *                 while the rank does (MPI_THREAD_MULTIPLE)
 *   async-abort   rank 1 aborts while the others wait for their queue: the
 *                 job stops (mpirun exits 3) with a line naming rank 1
 *   abort         rank 1 aborts; the others wait in an all-reduce: the job
 *                 stops (mpirun exits 3) with a line naming rank 1
 *   timeout       rank 1 never comes to the all-reduce: rank 0's watchdog
 *                 stops the job after MESH_COLLECTIVE_TIMEOUT_S
 *   fail-at-step  trains PLAN on DATA; rank 1 fails on its own at step 3,
 *                 while the others go on: the job stops naming rank 1
 *   exit-at-step  the same, but rank 1's process calls exit(1) there
 *   all-fail      every rank fails at step 2: each returns its status (no
 *                 abort), printing "rank R: status ..."
 */
#include <stdio.h>  /* defines: printf */
#include <stdlib.h> /* defines: exit */
#include <string.h> /* defines: strcmp, strstr */
#include <unistd.h> /* defines: sleep */

#include "comm.h"       /* defines: comm_mpi_world */
#include "comm_cases.h" /* defines: comm_case_* */
#include "mesh.h"       /* defines: mesh_run_ranks */

static int comm_case(const char *name)
{
    char err[1400] = "", note[1100] = "";
    comm *c = comm_mpi_world(0, err, sizeof err);
    if (!c) {
        printf("not ok %s: %s\n", name, err);
        return 1;
    }
    int rc = 0, rank = c->rank, size = c->size;
    float x[16] = {0};
    if (strcmp(name, "collectives") == 0) {
        rc = comm_case_collectives(c, note, err, sizeof err);
        if (rc == 0 && !strstr(note, "4 bytes sent, 8 expected")) {
            snprintf(err, sizeof err, "a receive of the wrong size said: '%s'", note);
            rc = 1;
        }
    } else if (strcmp(name, "groups") == 0) {
        rc = comm_case_groups(c, err, sizeof err);
    } else if (strcmp(name, "async") == 0) {
        rc = comm_case_async(c, err, sizeof err);
        if (rc == 1 && !comm_mpi_thread_multiple()) snprintf(err, sizeof err, "MPI has no MPI_THREAD_MULTIPLE");
    } else if (strcmp(name, "async-abort") == 0) {
        rc = comm_case_async_abort(c, err, sizeof err); /* (MPI_Abort stops the job first) */
    } else if (strcmp(name, "abort") == 0) {
        if (rank == 1) comm_abort(c, "the loss is not finite at step 3");
        rc = comm_all_reduce(c, x, 16) == 0 ? 1 : -1; /* either way: not ok */
        snprintf(err, sizeof err, "the all-reduce returned: %s", c->error);
    } else if (strcmp(name, "timeout") == 0) {
        if (rank == 1) sleep(60);
        rc = comm_all_reduce(c, x, 16) == 0 ? 1 : -1;
        snprintf(err, sizeof err, "the all-reduce returned: %s", c->error);
    } else {
        snprintf(err, sizeof err, "no case '%s'", name);
        rc = 1;
    }
    if (rc == 0) printf("ok %s (rank %d of %d)\n", name, rank, size);
    else printf("not ok %s (rank %d of %d): %d %s\n", name, rank, size, rc, err);
    comm_free(c);
    return rc != 0;
}

typedef struct train {
    const mesh_plan *plan;
    const char *data;
    int fail_rank, fail_step; /* fail_rank -1: every rank */
    int exit_there;           /* exit(1) instead of returning the failure */
} train;

/* Trains 8 steps; fails at fail_step on fail_rank, as a rank of meshrun
 * whose step cannot go on (the message comes from a failing call). */
static mesh_status train_rank(mesh_context *ctx, int rank, void *ud)
{
    train *t = ud;
    int data_rank, mb, mbs, seq;
    mesh_data *data = NULL;
    mesh_context_rank(ctx, NULL, &data_rank, NULL);
    mesh_plan_batch(t->plan, &mb, &mbs, &seq, NULL);
    static int in[1 << 16], tg[1 << 16];
    mesh_status st = (size_t)mb * (size_t)mbs * (size_t)seq > sizeof in / sizeof in[0] ? MESH_ERR_INVALID_ARG
                                                                                        : mesh_data_open(t->plan, t->data, data_rank, &data);
    for (int step = 1; st == MESH_OK && step <= 8; step++) {
        mesh_plan *none = NULL;
        if (step == t->fail_step && (t->fail_rank < 0 || rank == t->fail_rank)) {
            if (t->exit_there) exit(1);
            char path[96];
            snprintf(path, sizeof path, "/nonexistent/rank-%d-fails-at-step-%d.plan", rank, step);
            st = mesh_plan_load(path, &none);
            break;
        }
        if ((st = mesh_data_next(data, in, tg)) == MESH_OK) st = mesh_train_step(ctx, in, tg, NULL);
    }
    mesh_data_free(data);
    return st;
}

static int train_case(const char *name, const char *plan_path, const char *data)
{
    mesh_plan *plan = NULL;
    int rank = 0;
    mesh_job_info(&rank, NULL, NULL);
    if (mesh_plan_load(plan_path, &plan) != MESH_OK) {
        printf("not ok %s: %s\n", name, mesh_last_error());
        return 1;
    }
    int all = strcmp(name, "all-fail") == 0;
    train t = {plan, data, all ? -1 : 1, all ? 2 : 3, strcmp(name, "exit-at-step") == 0};
    mesh_status st = mesh_run_ranks(plan, train_rank, &t);
    printf("rank %d: status %s: %s\n", rank, mesh_status_str(st), st == MESH_OK ? "" : mesh_last_error());
    mesh_plan_free(plan);
    return st != MESH_OK;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2) return comm_case(argv[1]);
    if (argc == 4 && (strcmp(argv[1], "fail-at-step") == 0 || strcmp(argv[1], "exit-at-step") == 0 ||
                      strcmp(argv[1], "all-fail") == 0))
        return train_case(argv[1], argv[2], argv[3]);
    fprintf(stderr, "usage: mpi_tests collectives|groups|abort|timeout\n"
                    "       mpi_tests fail-at-step|exit-at-step|all-fail PLAN DATA\n");
    return 2;
}
