/*
 * test_comm_tcp.c: the TCP communicator (runtime/comm_tcp.c) and its
 * rendezvous (runtime/rendezvous.c). Each rank is a thread of the test
 * process with its own world (comm_tcp_connect on 127.0.0.1 and a free
 * port), so the ranks talk through real sockets: the cases of
 * comm_cases.c (which the threads and MPI backends pass), sums equal to
 * the threads backend's to the bit, and failure: an abort, a rank that
 * never comes, a process that dies (a forked rank) and a failed rank at
 * comm_tcp_finish stop the others, naming the rank. Rank threads only
 * record; checks run on the main thread.
 */
#include <arpa/inet.h>  /* defines: htonl */
#include <netinet/in.h> /* defines: sockaddr_in */
#include <pthread.h>    /* defines: pthread_create */
#include <stdio.h>      /* defines: snprintf */
#include <stdlib.h>     /* defines: setenv, unsetenv */
#include <string.h>     /* defines: strstr, memcmp */
#include <sys/socket.h> /* defines: socket, bind */
#include <sys/wait.h>   /* defines: waitpid */
#include <unistd.h>     /* defines: fork, _exit, close */

#include "comm.h"       /* defines: comm_tcp_*, comm_threads_* */
#include "comm_cases.h" /* defines: comm_case_* */
#include "rendezvous.h" /* defines: rdv_* */
#include "unit.h"       /* defines: TEST_IMPL, ASSERT_* */

enum { P = 4, MAXP = 8 };

typedef struct rank_job {
    int port, size, rank;
    double timeout;
    comm_threads_world *tw;  /* set: a threads world instead of TCP */
    int (*body)(struct rank_job *j, comm *c);
    int rc;                  /* the body's result: 0 if every check passed */
    char error[1100];         /* the first failing call's message */
    char note[1100];          /* what the body noted */
    double seconds;          /* time in the body */
    float *out;              /* what the body computed, for comparisons */
    comm_watch *watch;       /* a watch the body took, for after the world */
} rank_job;


/* A port nobody listens on now (the kernel's pick). */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_INT_GE(fd, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_INT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ASSERT_INT_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void *run_rank(void *arg)
{
    rank_job *j = arg;
    comm *c = j->tw ? comm_threads_rank(j->tw, j->rank)
                    : comm_tcp_connect("127.0.0.1", j->port, j->rank, j->size, j->timeout, j->error, sizeof j->error);
    double t0 = comm_now();
    j->rc = c ? j->body(j, c) : -1;
    j->seconds = comm_now() - t0;
    if (c && j->rc != 0 && !j->error[0]) snprintf(j->error, sizeof j->error, "%s", c->error);
    comm_free(c);
    return NULL;
}

/* Runs body on n rank threads of a new TCP world (threads: a threads
 * world); jobs[] receives the results. */
static void run_world(int n, double timeout, int threads, int (*body)(rank_job *, comm *), rank_job *jobs)
{
    pthread_t th[MAXP];
    int port = free_port();
    comm_threads_world *tw = threads ? comm_threads_world_new(n, timeout) : NULL;
    ASSERT_INT_EQ(threads && !tw, 0);
    for (int r = 0; r < n; r++) {
        float *out = jobs[r].out;
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r] = (rank_job){port, n, r, timeout, tw, body, 0, "", "", 0, out, NULL};
        ASSERT_INT_EQ(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

static void expect_all_ok(const rank_job *jobs, int n)
{
    for (int r = 0; r < n; r++) {
        if (jobs[r].rc != 0) fprintf(stderr, "# rank %d: %d %s\n", r, jobs[r].rc, jobs[r].error);
        ASSERT_INT_EQ(jobs[r].rc, 0);
    }
}

static int collectives(rank_job *j, comm *c)
{
    if (c->size != j->size || c->world_rank != c->rank) return 1;
    return comm_case_collectives(c, j->note, j->error, sizeof j->error);
}

TEST_IMPL(comm_tcp_collectives_match_serial)
{
    for (int n = 2; n <= P; n += 2) {
        rank_job jobs[P] = {{0}};
        run_world(n, 30, 0, collectives, jobs);
        expect_all_ok(jobs, n);
        for (int r = 0; r < n; r++) ASSERT_NOT_NULL(strstr(jobs[r].note, "4 bytes sent, 8 expected"));
    }
}

static int groups(rank_job *j, comm *c) { return comm_case_groups(c, j->error, sizeof j->error); }

TEST_IMPL(comm_tcp_split_groups)
{
    rank_job jobs[P] = {{0}};
    run_world(P, 30, 0, groups, jobs);
    expect_all_ok(jobs, P);
}

/* Sums whose order shows: magnitudes from 1e-4 to 1e4, so that any other
 * order of adding the ranks' values changes the bits. */
enum { SN = 100003, SRS = 4099 };
static float wide(int rank, size_t i) { return (float)((int)((i * 7919 + (size_t)rank * 104729) % 2001) - 1000) * (float)(1e-4 * (double)(1 + (i + (size_t)rank) % 9 * 1000)); }

static int sums(rank_job *j, comm *c)
{
    float *buf = j->out, *in = malloc((size_t)c->size * SRS * sizeof *in);
    if (!in) return -1;
    for (size_t i = 0; i < SN; i++) buf[i] = wide(c->rank, i);
    for (size_t i = 0; i < (size_t)c->size * SRS; i++) in[i] = wide(c->rank, i + 17);
    int rc = comm_all_reduce(c, buf, SN) != 0 || comm_reduce_scatter(c, in, buf + SN, SRS) != 0;
    free(in);
    return rc;
}

TEST_IMPL(comm_tcp_sums_equal_threads_bits)
{
    for (int n = 2; n <= P; n++) {
        rank_job tcp[P] = {{0}}, thr[P] = {{0}};
        for (int r = 0; r < n; r++) {
            tcp[r].out = malloc((SN + SRS) * sizeof(float));
            thr[r].out = malloc((SN + SRS) * sizeof(float));
            ASSERT_NOT_NULL(tcp[r].out);
            ASSERT_NOT_NULL(thr[r].out);
        }
        run_world(n, 30, 0, sums, tcp);
        run_world(n, 30, 1, sums, thr);
        expect_all_ok(tcp, n);
        expect_all_ok(thr, n);
        for (int r = 0; r < n; r++) {
            ASSERT_INT_EQ(memcmp(tcp[r].out, thr[r].out, (SN + SRS) * sizeof(float)), 0);
            ASSERT_INT_EQ(memcmp(tcp[r].out, tcp[0].out, SN * sizeof(float)), 0); /* every rank the same sum */
        }
        for (int r = 0; r < n; r++) {
            free(tcp[r].out);
            free(thr[r].out);
        }
    }
}

/* Rank 1 fails before the collective; the others' all-reduce fails at
 * once, naming it. */
static int one_aborts(rank_job *j, comm *c) { return comm_case_one_aborts(c, j->error, sizeof j->error); }

TEST_IMPL(comm_tcp_abort_stops_everyone)
{
    rank_job jobs[3] = {{0}};
    run_world(3, 30, 0, one_aborts, jobs);
    for (int r = 0; r < 3; r++) ASSERT_INT_EQ(jobs[r].rc, 0);
    for (int r = 0; r < 3; r += 2) {
        ASSERT_NOT_NULL(strstr(jobs[r].error, "all-reduce over 3 ranks"));
        ASSERT_NOT_NULL(strstr(jobs[r].error, "rank 1 failed: the loss is not finite at step 3"));
        ASSERT_INT_LT((long)(jobs[r].seconds * 10), 20); /* well within the 30 s timeout */
    }
}

/* A watch on the world (what an NCCL world bootstrapped over it polls):
 * nothing while the world runs; rank 1's abort within a moment, with its
 * reason; still readable once every handle is freed. */
static int watched(rank_job *j, comm *c)
{
    char why[256] = "";
    int go = 1;
    if (comm_barrier(c) != 0) return 1;
    if (c->rank == 1) { /* (aborts once rank 0 has looked: told by an eager send) */
        if (comm_recv(c, &go, sizeof go, 0) != 0) return 3;
        comm_abort(c, "its GPU failed");
        return 0;
    }
    j->watch = comm_watch_of(c);
    if (!j->watch || comm_watch_stopped(j->watch, why, sizeof why) != 0 || why[0]) return 2;
    if (comm_send(c, &go, sizeof go, 1) != 0) return 3;
    for (double t0 = comm_now(); !comm_watch_stopped(j->watch, why, sizeof why); comm_sleep(1e-3))
        if (comm_now() - t0 > 5) return 4;
    snprintf(j->note, sizeof j->note, "%s", why);
    return 0;
}

TEST_IMPL(comm_tcp_watch_sees_the_abort)
{
    rank_job jobs[2] = {{0}};
    run_world(2, 30, 0, watched, jobs);
    expect_all_ok(jobs, 2);
    ASSERT_STR_EQ(jobs[0].note, "rank 1 failed: its GPU failed");
    char why[256] = "";
    ASSERT_INT_EQ(comm_watch_stopped(jobs[0].watch, why, sizeof why), 1); /* held: after the world's end */
    ASSERT_STR_EQ(why, "rank 1 failed: its GPU failed");
    comm_watch_hold(jobs[0].watch);
    comm_watch_release(jobs[0].watch);
    comm_watch_release(jobs[0].watch);
    ASSERT_NULL(comm_watch_of(NULL));
    ASSERT_INT_EQ(comm_watch_stopped(NULL, why, sizeof why), 0);
    comm_watch_release(NULL);
}

/* Rank 1 stays but never comes to the collective: rank 0 gives up after
 * the timeout, naming its wait and rank 1. */
static int one_missing(rank_job *j, comm *c) { return comm_case_one_missing(c, 1, j->error, sizeof j->error); }

TEST_IMPL(comm_tcp_timeout_names_the_wait)
{
    rank_job jobs[2] = {{0}};
    run_world(2, 0.2, 0, one_missing, jobs);
    ASSERT_INT_EQ(jobs[0].rc, 0);
    ASSERT_NOT_NULL(strstr(jobs[0].error, "all-reduce over 2 ranks (this is rank 0): rank 0 waited in all-reduce "
                                          "for more than 0.2 s (MESH_COLLECTIVE_TIMEOUT_S): rank 1 sent nothing"));
    ASSERT_INT_LT((long)(jobs[0].seconds * 10), 20);
}

/* Ranks 0 and 2 are threads here; rank 1 a process that does one
 * all-reduce and dies in the middle of the run: the others' next
 * all-reduce fails naming it, long before the timeout (or their first,
 * when they learn of the death before they took rank 1's part of it). */
static int survive(rank_job *j, comm *c)
{
    float x[64] = {0};
    int rc = comm_all_reduce(c, x, 64) != 0 ? -1 : comm_all_reduce(c, x, 64);
    snprintf(j->error, sizeof j->error, "%s", c->error);
    return rc == 0;
}

TEST_IMPL(comm_tcp_dead_process_is_named)
{
    int port = free_port();
    pid_t pid = fork(); /* before any thread */
    ASSERT_INT_GE(pid, 0);
    if (pid == 0) {
        char err[400];
        float x[64] = {0};
        comm *c = comm_tcp_connect("127.0.0.1", port, 1, 3, 30, err, sizeof err);
        _exit(c && comm_all_reduce(c, x, 64) == 0 ? 0 : 9); /* no goodbye */
    }
    rank_job jobs[3] = {{0}};
    pthread_t th[3];
    for (int r = 0; r < 3; r += 2) {
        jobs[r] = (rank_job){port, 3, r, 30, NULL, survive, 0, "", "", 0, NULL, NULL};
        ASSERT_INT_EQ(pthread_create(&th[r], NULL, run_rank, &jobs[r]), 0);
    }
    for (int r = 0; r < 3; r += 2) pthread_join(th[r], NULL);
    int st = -1;
    ASSERT_INT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_INT_EQ(WIFEXITED(st) && WEXITSTATUS(st) == 0, 1);
    for (int r = 0; r < 3; r += 2) {
        if (jobs[r].rc != 0) fprintf(stderr, "# rank %d: %d %s\n", r, jobs[r].rc, jobs[r].error);
        ASSERT_INT_EQ(jobs[r].rc, 0);
        ASSERT_NOT_NULL(strstr(jobs[r].error, "all-reduce over 3 ranks"));
        ASSERT_NOT_NULL(strstr(jobs[r].error, "rank 1 failed: its connection closed in the middle of the run"));
        ASSERT_INT_LT((long)(jobs[r].seconds * 10), 50);
    }
}

/* comm_tcp_finish: rank 1 fails alone while the others wait in an
 * all-reduce: it stops them after its grace (half the timeout, here
 * 2 s), naming itself, and every rank returns 1. */
static int fails_at_finish(rank_job *j, comm *c)
{
    float x[8] = {0};
    int first;
    if (c->rank == 1) {
        first = comm_tcp_finish(c, 1, "cannot open 'data.bin'");
    } else {
        int rc = comm_all_reduce(c, x, 8);
        snprintf(j->note, sizeof j->note, "%s", c->error);
        first = comm_tcp_finish(c, rc != 0, c->error);
    }
    snprintf(j->error, sizeof j->error, "%s", c->error);
    return first != 1;
}

/* ... and when every rank reaches the end, the lowest failed rank, no stop. */
static int all_finish(rank_job *j, comm *c)
{
    int first = comm_tcp_finish(c, c->rank >= 1, "failed alike");
    snprintf(j->error, sizeof j->error, "%s", c->error);
    return first != 1 || c->error[0] != '\0';
}

TEST_IMPL(comm_tcp_finish_names_the_failed_rank)
{
    rank_job jobs[3] = {{0}};
    run_world(3, 4, 0, fails_at_finish, jobs);
    for (int r = 0; r < 3; r++) {
        if (jobs[r].rc != 0) fprintf(stderr, "# rank %d: %s\n", r, jobs[r].error);
        ASSERT_INT_EQ(jobs[r].rc, 0);
    }
    for (int r = 0; r < 3; r += 2) {
        ASSERT_NOT_NULL(strstr(jobs[r].note, "rank 1 failed: cannot open 'data.bin'"));
        ASSERT_INT_LT((long)(jobs[r].seconds * 10), 35); /* the grace, not the timeout */
    }
    run_world(3, 30, 0, all_finish, jobs);
    expect_all_ok(jobs, 3);
}

/* The rendezvous: all-gather, and what it says when a rank never comes. */
typedef struct rdv_job {
    int port, rank, size;
    double timeout;
    int got[3];
    char err[400];
    int rc;
} rdv_job;

static void *rdv_rank(void *arg)
{
    rdv_job *j = arg;
    rdv *r = rdv_open("127.0.0.1", j->port, j->rank, j->size, j->timeout, j->err, sizeof j->err);
    int mine = 100 + j->rank;
    j->rc = r ? rdv_all_gather(r, &mine, j->got, sizeof mine, j->err, sizeof j->err) : -1;
    rdv_close(r);
    return NULL;
}

TEST_IMPL(comm_tcp_rendezvous)
{
    int port = free_port();
    rdv_job jobs[3];
    pthread_t th[3];
    for (int r = 2; r >= 0; r--) { /* rank 0 last: the others retry until it listens */
        jobs[r] = (rdv_job){port, r, 3, 30, {0, 0, 0}, "", 0};
        ASSERT_INT_EQ(pthread_create(&th[r], NULL, rdv_rank, &jobs[r]), 0);
        if (r == 1) comm_sleep(0.2);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) {
        ASSERT_INT_EQ(jobs[r].rc, 0);
        for (int q = 0; q < 3; q++) ASSERT_INT_EQ(jobs[r].got[q], 100 + q);
    }
    /* rank 0 alone, then rank 1 alone: each says who did not come */
    char err[400], want[200];
    port = free_port();
    ASSERT_NULL(rdv_open("127.0.0.1", port, 0, 3, 0.3, err, sizeof err));
    snprintf(want, sizeof want, "rendezvous at 127.0.0.1:%d: 1 of 3 ranks came within 0.3 s (missing: 1, 2)", port);
    ASSERT_NOT_NULL(strstr(err, want));
    ASSERT_NULL(rdv_open("127.0.0.1", port, 1, 3, 0.3, err, sizeof err));
    snprintf(want, sizeof want, "rendezvous at 127.0.0.1:%d: rank 0 did not answer within 0.3 s (Connection refused)",
             port);
    ASSERT_STR_EQ(err, want);
    /* a TCP world of 1: no sockets at all */
    comm *c = comm_tcp_connect("127.0.0.1", port, 0, 1, 1, err, sizeof err);
    ASSERT_NOT_NULL(c);
    float x[3] = {1, 2, 3}, y[3];
    ASSERT_INT_EQ(comm_all_gather(c, x, y, 3), 0);
    ASSERT_INT_EQ(memcmp(x, y, sizeof x), 0);
    ASSERT_INT_EQ(comm_tcp_finish(c, 0, ""), -1);
    comm_free(c);
}

TEST_IMPL(comm_tcp_address_from_env)
{
    char host[64], err[200];
    int port = 0;
    unsetenv("MESH_MASTER_ADDR");
    unsetenv("MASTER_ADDR");
    unsetenv("MESH_PORT");
    unsetenv("MASTER_PORT");
    ASSERT_INT_EQ(rdv_env_address(host, sizeof host, &port, err, sizeof err), 0);
    ASSERT_STR_EQ(host, "127.0.0.1");
    ASSERT_INT_EQ(port, 29501);
    /* torchrun's: MASTER_PORT is its store's, the rendezvous the next */
    setenv("MASTER_ADDR", "node7", 1);
    setenv("MASTER_PORT", "29500", 1);
    ASSERT_INT_EQ(rdv_env_address(host, sizeof host, &port, err, sizeof err), 0);
    ASSERT_STR_EQ(host, "node7");
    ASSERT_INT_EQ(port, 29501);
    setenv("MESH_MASTER_ADDR", "10.0.0.2", 1);
    setenv("MESH_PORT", "4000", 1);
    ASSERT_INT_EQ(rdv_env_address(host, sizeof host, &port, err, sizeof err), 0);
    ASSERT_STR_EQ(host, "10.0.0.2");
    ASSERT_INT_EQ(port, 4000);
    setenv("MESH_PORT", "40x", 1);
    ASSERT_INT_EQ(rdv_env_address(host, sizeof host, &port, err, sizeof err), -1);
    ASSERT_STR_EQ(err, "MESH_PORT='40x' is not a port (1 to 65535)");
    unsetenv("MESH_PORT");
    setenv("MASTER_PORT", "65535", 1);
    ASSERT_INT_EQ(rdv_env_address(host, sizeof host, &port, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "MASTER_PORT='65535' is not a port (1 to 65534); the rendezvous uses MASTER_PORT + 1"));
    ASSERT_INT_EQ(rdv_env_address(host, 4, &port, err, sizeof err), -1);
    ASSERT_STR_EQ(err, "MESH_MASTER_ADDR is 8 characters long: too long for a host name");
    /* comm_tcp_world takes the rank and size from RANK and WORLD_SIZE */
    unsetenv("RANK");
    ASSERT_NULL(comm_tcp_world(1, err, sizeof err));
    ASSERT_NOT_NULL(strstr(err, "RANK is not set"));
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "2", 1);
    ASSERT_NULL(comm_tcp_world(1, err, sizeof err));
    ASSERT_STR_EQ(err, "RANK=2 of WORLD_SIZE=2: no such rank");
}

/* A communication queue (comm_async.h) over TCP: its calls share the
 * world's sockets with the rank's own, at the same time. */
static int async_calls(rank_job *j, comm *c) { return comm_case_async(c, j->error, sizeof j->error); }
static int async_abort(rank_job *j, comm *c) { return comm_case_async_abort(c, j->error, sizeof j->error); }

TEST_IMPL(comm_tcp_async_queue)
{
    rank_job jobs[4] = {{0}};
    run_world(4, 30, 0, async_calls, jobs);
    expect_all_ok(jobs, 4);
    run_world(3, 30, 0, async_abort, jobs);
    for (int r = 0; r < 3; r++) ASSERT_INT_EQ(jobs[r].rc, 0);
    for (int r = 0; r < 3; r += 2) {
        ASSERT_NOT_NULL(strstr(jobs[r].error, "over 3 ranks"));
        ASSERT_NOT_NULL(strstr(jobs[r].error, "rank 1 ran out of memory"));
        ASSERT_INT_LT((long)(jobs[r].seconds * 10), 20);
    }
}
