/*
 * test_verify.c: the static deadlock and consistency check
 * (compiler/verify.c): hand-written broken programs, each message checked
 * for the ranks and ops at fault; programs that must pass; every pipeline
 * schedule sched_build makes; and a 3072-rank program for speed.
 */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* strstr, strlen */

#include "sched.h"  /* defines: sched_* */
#include "unit.h"   /* defines: TEST_IMPL, ASSERT_* */
#include "verify.h" /* defines: verify_* */

enum { ALL_REDUCE = 1, ALL_GATHER = 2 };

#define COLL(g, type, n, what) {VERIFY_COLL, g, type, n, -1, 0, what}
#define SEND(to, tag, n, what) {VERIFY_SEND, -1, 0, n, to, tag, what}
#define RECV(from, tag, n, what) {VERIFY_RECV, -1, 0, n, from, tag, what}
#define PROG(ops) {ops, (int)(sizeof ops / sizeof ops[0])}

static char msg[4096];

/* Fails unless the message contains every given string. */
static void says(int line, const char *const *want) {
    for (; *want; want++)
        if (!strstr(msg, *want)) unit_fail(__FILE__, line, "message lacks \"%s\":\n%s", *want, msg);
}
#define ASSERT_SAYS(...) says(__LINE__, (const char *const[]){__VA_ARGS__, NULL})

static int run(const verify_program *p, int n, const verify_group *g, int n_groups) {
    msg[0] = '\0';
    return verify_run(p, n, g, n_groups, msg, sizeof msg);
}

static const int pair[] = {0, 1};

/* tp pairs {0,1} {2,3}, dp pairs {0,2} {1,3}, activations 0->1 and 2->3. */
TEST_IMPL(verify_passes_mixed_program)
{
    static const int tp0[] = {0, 1}, tp1[] = {2, 3}, dp0[] = {0, 2}, dp1[] = {1, 3};
    verify_group g[] = {{tp0, 2}, {tp1, 2}, {dp0, 2}, {dp1, 2}};
    verify_op r0[] = {COLL(0, ALL_REDUCE, 64, "ar tp"), SEND(1, 7, 32, "act"), COLL(2, ALL_REDUCE, 16, "ar dp")};
    verify_op r1[] = {COLL(0, ALL_REDUCE, 64, "ar tp"), RECV(0, 7, 32, "act"), COLL(3, ALL_REDUCE, 16, "ar dp")};
    verify_op r2[] = {COLL(1, ALL_REDUCE, 64, NULL), SEND(3, 7, 32, NULL), COLL(2, ALL_REDUCE, 16, NULL)};
    verify_op r3[] = {COLL(1, ALL_REDUCE, 64, NULL), RECV(2, 7, 32, NULL), COLL(3, ALL_REDUCE, 16, NULL)};
    verify_program p[] = {PROG(r0), PROG(r1), PROG(r2), PROG(r3)};
    ASSERT_INT_EQ(run(p, 4, g, 4), 0);
    ASSERT_STR_EQ(msg, "");
    /* Rank 3 receiving before its tp all-reduce stalls the whole mesh. */
    verify_op r3b[] = {RECV(2, 7, 32, NULL), COLL(1, ALL_REDUCE, 64, NULL), COLL(3, ALL_REDUCE, 16, NULL)};
    p[3] = (verify_program)PROG(r3b);
    ASSERT_INT_EQ(run(p, 4, g, 4), -1);
    ASSERT_STR_EQ(msg, "deadlock: 4 of 4 ranks blocked, none can proceed:\n"
                       "  rank 0 at op 2 (ar dp): waits in group 2 for rank 2\n"
                       "  rank 1 at op 2 (ar dp): waits in group 3 for rank 3\n"
                       "  rank 2 at op 0 (collective 1 on group 1): waits in group 1 for rank 3\n"
                       "  rank 3 at op 0 (recv from rank 2, tag 7): waits for a send from rank 2 with tag 7");
    p[3] = (verify_program)PROG(r3);
    ASSERT_INT_EQ(verify_run(p, 4, g, 4, NULL, 0), 0);
    ASSERT_INT_EQ(verify_run(NULL, 0, NULL, 0, NULL, 0), 0); /* nothing to run */
}

/* Two ranks enter two collectives on two groups in swapped order: each
 * waits in a group the other never reaches. */
TEST_IMPL(verify_swapped_collectives_deadlock)
{
    verify_group g[] = {{pair, 2}, {pair, 2}};
    verify_op r0[] = {COLL(0, ALL_REDUCE, 4096, "all-reduce(tp) of h.3 attention out"),
                      COLL(1, ALL_REDUCE, 8192, "all-reduce(dp) of grads")};
    verify_op r1[] = {COLL(1, ALL_REDUCE, 8192, "all-reduce(dp) of grads"),
                      COLL(0, ALL_REDUCE, 4096, "all-reduce(tp) of h.3 attention out")};
    verify_program p[] = {PROG(r0), PROG(r1)};
    ASSERT_INT_EQ(run(p, 2, g, 2), -1);
    ASSERT_STR_EQ(msg, "deadlock: 2 of 2 ranks blocked, none can proceed:\n"
                       "  rank 0 at op 0 (all-reduce(tp) of h.3 attention out): waits in group 0 for rank 1\n"
                       "  rank 1 at op 0 (all-reduce(dp) of grads): waits in group 1 for rank 0");
}

/* The same swap on one group: the collectives meet and disagree. */
TEST_IMPL(verify_swapped_collectives_mismatch)
{
    verify_group g[] = {{pair, 2}};
    verify_op r0[] = {COLL(0, ALL_REDUCE, 4096, "all-reduce(tp)"), COLL(0, ALL_GATHER, 4096, "all-gather(tp)")};
    verify_op r1[] = {COLL(0, ALL_GATHER, 4096, "all-gather(tp)"), COLL(0, ALL_REDUCE, 4096, "all-reduce(tp)")};
    verify_program p[] = {PROG(r0), PROG(r1)};
    ASSERT_INT_EQ(run(p, 2, g, 1), -1);
    ASSERT_STR_EQ(msg, "collective mismatch on group 0: rank 1 enters op 0 (all-gather(tp)) with 4096 bytes "
                       "while rank 0 enters op 0 (all-reduce(tp)) with 4096 bytes (collective types 2 and 1)");
}

/* Four ranks, one enters a different collective type. */
TEST_IMPL(verify_collective_type_mismatch)
{
    static const int tp[] = {0, 1, 2, 3};
    verify_group g[] = {{tp, 4}};
    verify_op ag[] = {COLL(0, ALL_GATHER, 4096, "all-gather(tp)")};
    verify_op ar[] = {COLL(0, ALL_REDUCE, 4096, "all-reduce(tp)")};
    verify_program p[] = {PROG(ag), PROG(ag), PROG(ag), PROG(ar)};
    ASSERT_INT_EQ(run(p, 4, g, 1), -1);
    ASSERT_SAYS("rank 3 enters op 0 (all-reduce(tp)) with 4096 bytes",
                "while rank 0 enters op 0 (all-gather(tp)) with 4096 bytes");
}

/* Same type, different sizes. */
TEST_IMPL(verify_collective_size_mismatch)
{
    verify_group g[] = {{pair, 2}};
    verify_op a[] = {COLL(0, ALL_REDUCE, 4096, "all-reduce(tp) of mlp out")};
    verify_op b[] = {COLL(0, ALL_REDUCE, 2048, "all-reduce(tp) of mlp out")};
    verify_program p[] = {PROG(a), PROG(b)};
    ASSERT_INT_EQ(run(p, 2, g, 1), -1);
    ASSERT_STR_EQ(msg, "collective mismatch on group 0: rank 1 enters op 0 (all-reduce(tp) of mlp out) with "
                       "2048 bytes while rank 0 enters op 0 (all-reduce(tp) of mlp out) with 4096 bytes");
}

TEST_IMPL(verify_collective_not_member)
{
    static const int tp0[] = {0, 1}, tp1[] = {2, 3};
    verify_group g[] = {{tp0, 2}, {tp1, 2}};
    verify_op ok0[] = {COLL(0, ALL_REDUCE, 64, "all-reduce(tp)")};
    verify_op bad[] = {COLL(1, ALL_REDUCE, 64, "all-reduce(tp) of h.0")};
    verify_op ok1[] = {COLL(1, ALL_REDUCE, 64, "all-reduce(tp) of h.0")};
    verify_program p[] = {PROG(ok0), PROG(bad), PROG(ok1), PROG(ok1)};
    ASSERT_INT_EQ(run(p, 4, g, 2), -1);
    ASSERT_STR_EQ(msg, "rank 1 enters op 0 (all-reduce(tp) of h.0) on group 1, which it is not a member of "
                       "(members: 2, 3)");
}

/* A send nobody receives. */
TEST_IMPL(verify_missing_receive)
{
    verify_op r0[] = {SEND(1, 5, 4096, "send act micro 0"), SEND(1, 6, 4096, "send act micro 1")};
    verify_op r1[] = {RECV(0, 6, 4096, "recv act micro 1")};
    verify_program p[] = {PROG(r0), PROG(r1)};
    ASSERT_INT_EQ(run(p, 2, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "1 send is never received:\n"
                       "  rank 0 op 0 (send act micro 0): 4096 bytes to rank 1 with tag 5");
}

/* A receive with no send: a deadlock naming the rank and its op. */
TEST_IMPL(verify_receive_without_send)
{
    verify_op r0[] = {SEND(1, 5, 4096, "send act micro 0")};
    verify_op r1[] = {RECV(0, 5, 4096, "recv act micro 0"), RECV(0, 6, 4096, "recv act micro 1")};
    verify_program p[] = {PROG(r0), PROG(r1)};
    ASSERT_INT_EQ(run(p, 2, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "deadlock: 1 of 2 ranks blocked, none can proceed:\n"
                       "  rank 1 at op 1 (recv act micro 1): waits for a send from rank 0 with tag 6 "
                       "(rank 0 has finished)");
}

TEST_IMPL(verify_send_recv_size_mismatch)
{
    verify_op r0[] = {SEND(1, 5, 4096, "send act micro 0 of h.11")};
    verify_op r1[] = {RECV(0, 5, 2048, "recv act micro 0 of h.12")};
    verify_program p[] = {PROG(r0), PROG(r1)};
    ASSERT_INT_EQ(run(p, 2, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "size mismatch: rank 1 op 0 (recv act micro 0 of h.12) receives 2048 bytes from rank 0, "
                       "but rank 0 op 0 (send act micro 0 of h.11) sends 4096 bytes (tag 5)");
}

/* A receive takes the oldest send with its tag, whatever else came first. */
TEST_IMPL(verify_receive_matches_oldest_send_by_tag)
{
    verify_op r0[] = {SEND(1, 1, 100, NULL), SEND(1, 2, 200, NULL), SEND(1, 1, 300, NULL)};
    verify_op r1[] = {RECV(0, 2, 200, NULL), RECV(0, 1, 100, NULL), RECV(0, 1, 300, NULL)};
    verify_program p[] = {PROG(r0), PROG(r1)};
    ASSERT_INT_EQ(run(p, 2, NULL, 0), 0);
    verify_op r1b[] = {RECV(0, 2, 200, NULL), RECV(0, 1, 300, NULL), RECV(0, 1, 100, NULL)};
    p[1] = (verify_program)PROG(r1b);
    ASSERT_INT_EQ(run(p, 2, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "size mismatch: rank 1 op 1 (recv from rank 0, tag 1) receives 300 bytes from rank 0, "
                       "but rank 0 op 0 (send to rank 1, tag 1) sends 100 bytes (tag 1)");
}

/* Blocked ranks: at most 8 are listed, then a count. */
TEST_IMPL(verify_deadlock_list_is_capped)
{
    enum { N = 20 };
    verify_op ops[N][2];
    verify_program p[N];
    for (int i = 0; i < N; i++) {
        ops[i][0] = (verify_op)RECV((i + N - 1) % N, 0, 8, "recv from the left");
        ops[i][1] = (verify_op)SEND((i + 1) % N, 0, 8, "send to the right");
        p[i] = (verify_program){ops[i], 2};
    }
    ASSERT_INT_EQ(run(p, N, NULL, 0), -1);
    ASSERT_SAYS("deadlock: 20 of 20 ranks blocked", "rank 0 at op 0 (recv from the left): waits for a send from "
                "rank 19 with tag 0", "rank 7 at op 0", "\n  and 12 more");
    ASSERT_NULL(strstr(msg, "rank 8 at"));
    /* One rank that receives before it sends breaks the cycle. */
    ops[0][0] = (verify_op)SEND(1, 0, 8, "send to the right");
    ops[0][1] = (verify_op)RECV(N - 1, 0, 8, "recv from the left");
    ASSERT_INT_EQ(run(p, N, NULL, 0), 0);
}

/* A collective waiting on a member stuck elsewhere names the member. */
TEST_IMPL(verify_deadlock_names_missing_members)
{
    static const int dp[] = {0, 1, 2, 3, 4};
    verify_group g[] = {{dp, 5}};
    verify_op ar[] = {COLL(0, ALL_REDUCE, 64, "all-reduce(dp) of grads")};
    verify_op stuck[] = {RECV(0, 9, 64, "recv of a lost tensor"), COLL(0, ALL_REDUCE, 64, "all-reduce(dp) of grads")};
    verify_op done[] = {SEND(4, 1, 8, NULL)};
    verify_op r4[] = {RECV(3, 1, 8, NULL)};
    verify_program p[] = {PROG(ar), PROG(ar), PROG(stuck), PROG(done), PROG(r4)};
    ASSERT_INT_EQ(run(p, 5, g, 1), -1);
    ASSERT_STR_EQ(msg, "deadlock: 3 of 5 ranks blocked, none can proceed:\n"
                       "  rank 0 at op 0 (all-reduce(dp) of grads): waits in group 0 for ranks 2, 3 (finished), "
                       "4 (finished)\n"
                       "  rank 1 at op 0 (all-reduce(dp) of grads): waits in group 0 for ranks 2, 3 (finished), "
                       "4 (finished)\n"
                       "  rank 2 at op 0 (recv of a lost tensor): waits for a send from rank 0 with tag 9");
}

/* Malformed input is an error with a message, never a crash. */
TEST_IMPL(verify_rejects_malformed_input)
{
    static const int dup[] = {0, 1, 0}, out[] = {0, 5};
    verify_op to9[] = {SEND(9, 0, 8, "send to nowhere")};
    verify_op g7[] = {COLL(7, ALL_REDUCE, 8, NULL)};
    verify_op none[] = {SEND(1, 0, 8, NULL)};
    verify_program p[] = {PROG(to9), PROG(none)};
    ASSERT_INT_EQ(run(p, 2, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "rank 0 op 0 (send to nowhere) names rank 9, but there are 2 ranks");
    p[0] = (verify_program)PROG(g7);
    ASSERT_INT_EQ(run(p, 2, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "rank 0 op 0 (collective 1 on group 7) names group 7, but there are 0 groups");
    verify_group gd[] = {{dup, 3}};
    ASSERT_INT_EQ(run(p, 2, gd, 1), -1);
    ASSERT_STR_EQ(msg, "group 0 lists rank 0 twice");
    verify_group go[] = {{out, 2}};
    ASSERT_INT_EQ(run(p, 2, go, 1), -1);
    ASSERT_STR_EQ(msg, "group 0 lists rank 5, but there are 2 ranks");
    verify_group ge[] = {{out, 0}};
    ASSERT_INT_EQ(run(p, 2, ge, 1), -1);
    ASSERT_STR_EQ(msg, "group 0 has no members");
    verify_program neg[] = {{NULL, -1}};
    ASSERT_INT_EQ(run(neg, 1, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "rank 0 has a bad program (-1 ops)");
    ASSERT_INT_EQ(run(NULL, 3, NULL, 0), -1);
    ASSERT_STR_EQ(msg, "verify: bad arguments (3 ranks, 0 groups)");
}

/* A short buffer gets a cut, terminated message. */
TEST_IMPL(verify_message_is_cut_to_fit)
{
    verify_op r1[] = {RECV(0, 5, 4096, "recv act micro 0")};
    verify_op r0[] = {SEND(1, 6, 4096, "send act micro 0")};
    verify_program p[] = {PROG(r0), PROG(r1)};
    char small[16];
    memset(small, 'x', sizeof small);
    ASSERT_INT_EQ(verify_run(p, 2, NULL, 0, small, sizeof small), -1);
    ASSERT_STR_EQ(small, "deadlock: 1 of ");
    ASSERT_INT_EQ(verify_run(p, 2, NULL, 0, NULL, 0), -1);
}

/* dp=48 x pp=8 x tp=8 = 3072 ranks: per step each rank receives from its
 * previous pipeline stage, all-reduces in its tp group and sends to the
 * next stage; a dp all-reduce at the end. Every op runs once, so this is
 * fast: about 850 ops a rank here, 0.1 s at -O2; with 3333 steps (2.8e7
 * ops, 10^4 on the middle stages) it takes about a second. */
TEST_IMPL(verify_large_mesh)
{
    enum { DP = 48, PP = 8, TP = 8, N = DP * PP * TP, STEPS = 300, OPS = 3 * STEPS + 1 };
    int *members = malloc(sizeof(int) * (size_t)N * 2);
    verify_group *g = malloc(sizeof *g * (size_t)(N / TP + N / DP));
    verify_op *ops = malloc(sizeof *ops * (size_t)N * OPS);
    verify_program *p = malloc(sizeof *p * N);
    ASSERT_NOT_NULL(members);
    ASSERT_NOT_NULL(g);
    ASSERT_NOT_NULL(ops);
    ASSERT_NOT_NULL(p);
    /* rank = (d * PP + s) * TP + t; tp groups first, then dp groups. */
    int k = 0;
    for (int i = 0; i < N / TP; i++) {
        g[i] = (verify_group){members + k, TP};
        for (int t = 0; t < TP; t++) members[k++] = i * TP + t;
    }
    for (int j = 0; j < PP * TP; j++) {
        g[N / TP + j] = (verify_group){members + k, DP};
        for (int d = 0; d < DP; d++) members[k++] = d * PP * TP + j;
    }
    for (int r = 0; r < N; r++) {
        int s = r / TP % PP, n = 0;
        verify_op *o = ops + (size_t)r * OPS;
        for (int i = 0; i < STEPS; i++) {
            if (s > 0) o[n++] = (verify_op)RECV(r - TP, i, 1 << 20, "recv act");
            o[n++] = (verify_op)COLL(r / TP, ALL_REDUCE, 1 << 16, "all-reduce(tp)");
            if (s < PP - 1) o[n++] = (verify_op)SEND(r + TP, i, 1 << 20, "send act");
        }
        o[n++] = (verify_op)COLL(N / TP + r % (PP * TP), ALL_REDUCE, 1 << 24, "all-reduce(dp)");
        p[r] = (verify_program){o, n};
    }
    ASSERT_INT_EQ(run(p, N, g, N / TP + PP * TP), 0);
    /* The last rank skips one tp all-reduce: its group waits for it. */
    p[N - 1].n--;
    verify_op *last = ops + (size_t)(N - 1) * OPS;
    last[p[N - 1].n - 1] = last[p[N - 1].n]; /* drop the step's all-reduce, keep the dp one */
    ASSERT_INT_EQ(run(p, N, g, N / TP + PP * TP), -1);
    /* Its tp group (ranks 3064-3070) waits for it in vain; so do the dp
     * groups of those ranks (7 x 47 more), since 3064-3070 never get
     * there. Rank 56 (d=0, stage 7, t=0) is the first in that list. */
    ASSERT_SAYS("deadlock: 336 of 3072 ranks blocked",
                "\n  rank 56 at op 600 (all-reduce(dp)): waits in group 440 for rank 3064\n",
                "\n  and 328 more");
    free(members);
    free(g);
    free(ops);
    free(p);
}

/* ---- Pipeline schedules --------------------------------------------- */

/* Every schedule sched_build makes runs to completion. */
TEST_IMPL(verify_sched_grid)
{
    static const int ps[] = {1, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++) {
        int p = ps[i], ms[] = {1, p, 2 * p, 3 * p + 1, 16};
        for (int j = 0; j < 5; j++)
            for (int kind = SCHED_KIND_GPIPE; kind <= SCHED_KIND_INTERLEAVED; kind++)
                for (int v = 1; v <= (kind == SCHED_KIND_INTERLEAVED ? 4 : 1); v++) {
                    sched s;
                    if (sched_build(&s, (sched_kind)kind, p, ms[j], v, NULL, 0) != 0) continue;
                    msg[0] = '\0';
                    if (verify_sched(&s, msg, sizeof msg) != 0)
                        unit_fail(__FILE__, __LINE__, "kind %d pp %d m %d v %d: %s", kind, p, ms[j], v, msg);
                    sched_free(&s);
                }
    }
}

/* A receive moved before the send it waits on, through the peer: stage 0
 * waits for gradients of micro 0 before running its forward, stage 1 for
 * that forward's activations. */
TEST_IMPL(verify_sched_catches_reordered_receive)
{
    sched s;
    ASSERT_INT_EQ(sched_build(&s, SCHED_KIND_1F1B, 2, 2, 1, NULL, 0), 0);
    /* stage 0: F0.0 >a0.0@1 F1.0 >a1.0@1 <g0.0@1 B0.0 ... -> <g0.0@1 first */
    sched_unit *u = s.stages[0].units;
    ASSERT_INT_EQ(u[4].op, SCHED_RECV_GRAD);
    sched_unit recv = u[4];
    memmove(u + 1, u, 4 * sizeof *u);
    u[0] = recv;
    ASSERT_INT_EQ(verify_sched(&s, msg, sizeof msg), -1);
    ASSERT_STR_EQ(msg, "deadlock: 2 of 2 ranks blocked, none can proceed:\n"
                       "  rank 0 at op 0 (recv grad micro 0 chunk 0 from stage 1, <g0.0@1): waits for a send "
                       "from rank 1 with tag 1\n"
                       "  rank 1 at op 0 (recv act micro 0 chunk 1 from stage 0, <a0.1@0): waits for a send "
                       "from rank 0 with tag 2");
    sched_free(&s);
}

/* A dropped send: the receiver waits forever. */
TEST_IMPL(verify_sched_catches_dropped_send)
{
    sched s;
    ASSERT_INT_EQ(sched_build(&s, SCHED_KIND_1F1B, 2, 2, 1, NULL, 0), 0);
    sched_unit *u = s.stages[1].units; /* <a0.1@0 F0.1 B0.1 >g0.1@0 ... */
    ASSERT_INT_EQ(u[3].op, SCHED_SEND_GRAD);
    memmove(u + 3, u + 4, (size_t)(s.stages[1].n_units - 4) * sizeof *u);
    s.stages[1].n_units--;
    ASSERT_INT_EQ(verify_sched(&s, msg, sizeof msg), -1);
    ASSERT_SAYS("deadlock: 1 of 2 ranks blocked", "rank 0 at op 2 (recv grad micro 0 chunk 0 from stage 1",
                "(rank 1 has finished)");
    ASSERT_INT_EQ(verify_sched(NULL, msg, sizeof msg), -1);
    ASSERT_STR_EQ(msg, "verify: no schedule");
    sched_free(&s);
}
