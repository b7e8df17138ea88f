/*
 * test_profile.c: the op profile (runtime/exec_prof.c, mesh_set_profile):
 * a training step split by kind of work, each node's kernels in one entry
 * (those fused into a matmul's kernel in the matmul's), the first step
 * left out, the numbers unchanged; on a GPU from CUDA events, with the
 * CPU's entries and calls.
 */
#include <math.h>   /* fabs */
#include <stdio.h>  /* printf, snprintf */
#include <string.h> /* strcmp, strlen */

#include "comm.h"    /* comm_now */
#include "device.h"  /* dev_cuda_probe */
#include "exec.h"    /* mesh__exec_* */
#include "fixture.h" /* fixture_tiny_gpt, fixture_plan */
#include "mesh.h"    /* mesh_compile, mesh_set_profile */
#include "plan.h"    /* plan_read */
#include "unit.h"    /* TEST_IMPL, ASSERT_* */

enum { MAX_ROWS = 64 };

/* a within 1e-12 of b, relatively (a mean's division rounds) */
#define NEAR_D(a, b)                                                                                   \
    do {                                                                                               \
        double a_ = (a), b_ = (b);                                                                     \
        if (!(fabs(a_ - b_) <= 1e-12 * fabs(b_)))                                                      \
            unit_fail(__FILE__, __LINE__, "%s = %.17g, %s = %.17g", #a, a_, #b, b_);                   \
    } while (0)

/* a == b, or the test fails naming both */
#define EQ_D(a, b)                                                                                     \
    do {                                                                                               \
        double a_ = (a), b_ = (b);                                                                     \
        if (a_ != b_) unit_fail(__FILE__, __LINE__, "%s = %.9g, %s = %.9g", #a, a_, #b, b_);           \
    } while (0)

typedef struct prof_row {
    char what[48];
    double ms, calls, gflop;
} prof_row;

static void compile_tiny(plan *p) { fixture_compile(p, fixture_tiny_gpt, NULL, 0); }

/* Steps [from, to] of the fixture's repeating batches; their losses into
 * loss[step - 1]; the seconds they took. */
static double train(mesh__exec *ex, int from, int to, double *loss)
{
    int32_t in[32], tg[32];
    double t0 = comm_now();
    for (int step = from; step <= to; step++) {
        for (size_t k = 0; k < 32; k++) {
            in[k] = (int32_t)((k * 5 + (size_t)step) % 16);
            tg[k] = (int32_t)((k * 5 + 1 + (size_t)step) % 16);
        }
        mesh__step_stats st;
        if (mesh__exec_train_step(ex, step, in, tg, &st) != 0)
            unit_fail(__FILE__, __LINE__, "step %d failed: %s", step, mesh__exec_error(ex));
        loss[step - 1] = st.loss;
    }
    return comm_now() - t0;
}

/* Every entry of ex's profile into r; their count. */
static int rows_of(mesh__exec *ex, prof_row *r, long long *steps, long long *untimed)
{
    int n = 0;
    while (n < MAX_ROWS &&
           mesh__exec_profile(ex, n, r[n].what, sizeof r[n].what, &r[n].ms, &r[n].calls, &r[n].gflop, steps,
                              untimed) == 0)
        n++;
    return n;
}

static const prof_row *find(const prof_row *r, int n, const char *what)
{
    for (int k = 0; k < n; k++)
        if (!strcmp(r[k].what, what)) return &r[k];
    return NULL;
}

/* What every profile of the fixture's steps shows: the entries of its
 * ops, calls per step as its graph has them (2 layers, 2 micro-batches:
 * 4 attentions; every matmul forward has its backward; the norm and
 * AdamW), none for what a matmul's kernel computes (its bias add and
 * GELU forward, the GELU's backward) or for a transpose, and a total
 * within the steps' time. */
static void check_rows(const prof_row *r, int n, double wall_ms)
{
    static const char *const must[] = {"matmul forward", "matmul backward", "attention forward",
                                       "attention backward", "layernorm forward", "layernorm backward",
                                       "cross_entropy forward", "embed forward", "embed backward", "optimizer"};
    for (size_t k = 0; k < sizeof must / sizeof must[0]; k++) {
        const prof_row *e = find(r, n, must[k]);
        if (!e || !(e->calls > 0) || !(e->ms >= 0))
            unit_fail(__FILE__, __LINE__, "no entry '%s' with calls in the profile", must[k]);
    }
    static const char *const never[] = {"bias_add forward", "gelu forward", "gelu backward", "transpose forward",
                                        "transpose backward", "collectives in turn"};
    for (size_t k = 0; k < sizeof never / sizeof never[0]; k++)
        if (find(r, n, never[k])) unit_fail(__FILE__, __LINE__, "an entry '%s' (run by the matmul's kernel)", never[k]);
    EQ_D(find(r, n, "attention forward")->calls, 4.0);
    EQ_D(find(r, n, "attention backward")->calls, 4.0);
    EQ_D(find(r, n, "optimizer")->calls, 2.0);
    EQ_D(find(r, n, "matmul backward")->calls, find(r, n, "matmul forward")->calls);
    /* model FLOPs: a matmul's 2 M K N forward, twice that backward;
     * attention's 4 B H T^2 d, half of it causal (2 sequences of 8, 2 heads
     * of 4: 2048 a call, 4 calls), 2.5 times that backward; none for the
     * rest */
    if (!(find(r, n, "matmul forward")->gflop > 0)) unit_fail(__FILE__, __LINE__, "no matmul FLOPs");
    NEAR_D(find(r, n, "matmul backward")->gflop, 2 * find(r, n, "matmul forward")->gflop);
    NEAR_D(find(r, n, "attention forward")->gflop * 1e9, 4 * 2048.0);
    NEAR_D(find(r, n, "attention backward")->gflop * 1e9, 2.5 * 4 * 2048.0);
    EQ_D(find(r, n, "layernorm forward")->gflop, 0.0);
    EQ_D(find(r, n, "optimizer")->gflop, 0.0);
    if (!(find(r, n, "matmul forward")->ms > 0) || !(find(r, n, "matmul backward")->ms > 0))
        unit_fail(__FILE__, __LINE__, "the matmuls took no time");
    double total = 0;
    for (int k = 0; k < n; k++) total += r[k].ms;
    if (!(total <= wall_ms * 1.01 + 0.5))
        unit_fail(__FILE__, __LINE__, "the entries add up to %.3f ms a step, the steps took %.3f", total, wall_ms);
}

TEST_IMPL(exec_profile_splits_the_step)
{
    char err[512], what[48];
    double ms, calls, gflop, a[4], b[4];
    long long steps = 0, untimed = 0;
    plan p;
    compile_tiny(&p);
    mesh__exec *prof = mesh__exec_create_flags(&p, NULL, NULL, MESH__EXEC_PROFILE, err, sizeof err);
    mesh__exec *plain = mesh__exec_create(&p, NULL, NULL, err, sizeof err);
    if (!prof || !plain) unit_fail(__FILE__, __LINE__, "%s", err);
    /* the first step warms up: nothing yet; a context without the profile never has any */
    train(prof, 1, 1, a);
    ASSERT_INT_EQ(mesh__exec_profile(prof, 0, what, sizeof what, &ms, &calls, &gflop, &steps, &untimed), -1);
    double wall = train(prof, 2, 4, a);
    train(plain, 1, 4, b);
    ASSERT_INT_EQ(mesh__exec_profile(plain, 0, what, sizeof what, &ms, &calls, &gflop, &steps, &untimed), -1);
    for (int k = 0; k < 4; k++) EQ_D(a[k], b[k]); /* timing changes no number */
    prof_row r[MAX_ROWS];
    int n = rows_of(prof, r, &steps, &untimed);
    ASSERT_INT_EQ((int)steps, 3);
    ASSERT_INT_EQ((int)untimed, 0);
    check_rows(r, n, 1e3 * wall / 3);
    ASSERT_INT_EQ(mesh__exec_profile(prof, n, what, sizeof what, &ms, &calls, &gflop, &steps, &untimed), -1);
    mesh__exec_free(prof);
    mesh__exec_free(plain);
    plan_free(&p);

    /* the public API: mesh_set_profile for the contexts created after it */
    mesh_plan *mp = fixture_plan(NULL, 0);
    mesh_context *ctx = NULL;
    int in[16], tg[16]; /* 2 micro-batches of 2 x 4 tokens, a vocabulary of 32 */
    for (int k = 0; k < 16; k++) {
        in[k] = (k * 7) % 32;
        tg[k] = (k * 7 + 1) % 32;
    }
    ASSERT_INT_EQ(mesh_set_profile(1), MESH_OK);
    ASSERT_INT_EQ(mesh_context_create(mp, 0, &ctx), MESH_OK);
    ASSERT_INT_EQ(mesh_set_profile(0), MESH_OK); /* (the tests after this one: off) */
    for (int k = 0; k < 2; k++) ASSERT_INT_EQ(mesh_train_step(ctx, in, tg, NULL), MESH_OK);
    mesh_profile_entry e;
    ASSERT_INT_EQ(mesh_context_profile(ctx, 0, sizeof e, &e), MESH_OK);
    ASSERT_INT_EQ((int)e.steps, 1);
    ASSERT_STR_EQ(e.what, "embed forward"); /* (the graph's first op) */
    ASSERT_INT_EQ(mesh_context_profile(ctx, -1, sizeof e, &e), MESH_ERR_INVALID_ARG);
    ASSERT_INT_EQ(mesh_context_profile(ctx, 0, sizeof e - 1, &e), MESH_ERR_INVALID_ARG);
    ASSERT_INT_EQ(mesh_context_profile(ctx, 0, sizeof e, NULL), MESH_ERR_INVALID_ARG);
    mesh_context_free(ctx);
    mesh_plan_free(mp);
}

/* On a GPU: the same entries and calls as the CPU's, from CUDA events
 * (the GPU's time of each: the matmuls' and attention's above 0, as
 * check_rows asks); without one, a SKIP line. */
TEST_IMPL(exec_cuda_profile_on_the_gpu)
{
    char why[320], err[512];
    if (!dev_cuda_probe(why, sizeof why, NULL, 0)) {
        printf("SKIP exec cuda profile: no GPU (%s)\n", why);
        return;
    }
    plan p;
    compile_tiny(&p);
    mesh__exec *cpu = mesh__exec_create_flags(&p, NULL, NULL, MESH__EXEC_PROFILE, err, sizeof err);
    if (!cpu) unit_fail(__FILE__, __LINE__, "%s", err);
    mesh__exec *gpu = mesh__exec_create_rank(&p, 0, NULL, NULL, 0, NULL, NULL, MESH__EXEC_CUDA | MESH__EXEC_PROFILE,
                                             err, sizeof err);
    if (!gpu) unit_fail(__FILE__, __LINE__, "%s", err);
    double a[4], b[4];
    prof_row rc[MAX_ROWS], rg[MAX_ROWS];
    long long steps = 0, untimed = 0;
    train(cpu, 1, 4, a);
    int nc = rows_of(cpu, rc, &steps, &untimed);
    train(gpu, 1, 1, b);
    double t0 = comm_now();
    train(gpu, 2, 4, b);
    int ng = rows_of(gpu, rg, &steps, &untimed); /* (it waits for the GPU: the steps' time ends here) */
    double wall = comm_now() - t0;
    ASSERT_INT_EQ((int)steps, 3);
    ASSERT_INT_EQ((int)untimed, 0);
    ASSERT_INT_EQ(ng, nc);
    for (int k = 0; k < ng; k++) {
        if (strcmp(rg[k].what, rc[k].what) || rg[k].calls != rc[k].calls)
            unit_fail(__FILE__, __LINE__, "entry %d: '%s' %g calls on the GPU, '%s' %g on the CPU", k, rg[k].what,
                      rg[k].calls, rc[k].what, rc[k].calls);
        /* (a bracket with no kernel of its own, as the fused cross-entropy's
         * backward, may read 0 between its events) */
        if (!(rg[k].ms >= 0)) unit_fail(__FILE__, __LINE__, "'%s': %g ms on the GPU", rg[k].what, rg[k].ms);
    }
    check_rows(rg, ng, 1e3 * wall / 3);
    mesh__exec_free(cpu);
    mesh__exec_free(gpu);
    plan_free(&p);
}
