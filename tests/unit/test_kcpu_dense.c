/*
 * test_kcpu_dense.c: unit tests for the dense CPU kernels (kcpu_dense.h).
 *
 * Forward passes are compared with naive loops in double precision. Backward
 * passes are compared with central finite differences of those double loops:
 * for a random dout r, the kernel's fp32 gradient of L = sum(r * out) must
 * match (L(in + h e_i) - L(in - h e_i)) / 2h for every input element i.
 * The inputs are generated in float and copied to double exactly, so both
 * sides differentiate the same function at the same point. Shapes include
 * odd sizes, a single row and C = 1.
 */
#include "kcpu_dense.h" /* the API under test; included first to prove it stands alone */

#include <math.h>   /* defines: fabs, sqrt, exp, log, tanh, NAN */
#include <pthread.h> /* defines: pthread_create, pthread_join */
#include <sys/wait.h> /* defines: waitpid, WIFEXITED */
#include <unistd.h>   /* defines: fork, alarm, _exit */
#include <stdlib.h> /* defines: malloc, calloc, free */
#include <string.h> /* defines: memcpy, memcmp */

#include "kcpu.h"            /* defines: kcpu_set_threads */
#include "kcpu_gemm_impl.h"  /* defines: kcpu__gemm (internal to the kernels) */
#include "kcpu_math_impl.h" /* defines: kcpu__expf (internal to the kernels) */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_*, unit_fail */

/* ---- helpers ------------------------------------------------------------ */

/* splitmix64: a small deterministic PRNG, same sequence on every machine. */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static void rng_seed(uint64_t seed)
{
    rng_state = seed;
}

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static float rng_uniform(float lo, float hi)
{
    double u = (double)(rng_next() >> 11) / 9007199254740992.0; /* 2^53 */
    return (float)(lo + (hi - lo) * u);
}

static float *fill(size_t n, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    ASSERT_NOT_NULL(p);
    for (size_t i = 0; i < n; i++)
        p[i] = rng_uniform(lo, hi);
    return p;
}

static float *zeros(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    ASSERT_NOT_NULL(p);
    return p;
}

static double *to_double(const float *p, size_t n)
{
    double *d = malloc((n ? n : 1) * sizeof *d);
    ASSERT_NOT_NULL(d);
    for (size_t i = 0; i < n; i++)
        d[i] = p[i];
    return d;
}

/* |got - want| <= rtol |want| + atol, else fail naming the element. */
static void check_close_at(const char *file, int line, const char *what,
                           size_t i, double got, double want, double rtol,
                           double atol)
{
    double err = fabs(got - want);
    if (!(err <= rtol * fabs(want) + atol))
        unit_fail(file, line, "%s[%zu]: got %.9g, want %.9g (err %.3g)",
                  what, i, got, want, err);
}
#define CHECK_CLOSE(what, i, got, want, rtol, atol)                         \
    check_close_at(__FILE__, __LINE__, what, i, got, want, rtol, atol)

/* Forward outputs: fp32 kernel against the double reference. */
#define FWD_RTOL 1e-5
#define FWD_ATOL 1e-5
/* Gradients: fp32 kernel against double central differences. */
#define GRAD_RTOL 1e-3
#define GRAD_ATOL 1e-4
#define FD_H 1e-5

static void check_fwd_at(const char *file, int line, const char *what,
                         const float *got, const double *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        check_close_at(file, line, what, i, got[i], want[i], FWD_RTOL,
                       FWD_ATOL);
}
#define CHECK_FWD(what, got, want, n)                                       \
    check_fwd_at(__FILE__, __LINE__, what, got, want, n)

/* A double-precision forward: reads its inputs through ctx, writes out. */
typedef void (*ref_fn)(const void *ctx, double *out);

/* Compare the kernel gradient got[nin] of L = sum(dout * out) with respect
 * to in[nin] (one of the arrays ctx points to) with central differences. */
static void check_grad_at(const char *file, int line, const char *what,
                          ref_fn f, const void *ctx, double *in, size_t nin,
                          const float *dout, size_t nout, const float *got)
{
    double *out = malloc(nout * sizeof *out);
    ASSERT_NOT_NULL(out);
    for (size_t i = 0; i < nin; i++) {
        double save = in[i], lp = 0.0, lm = 0.0;
        in[i] = save + FD_H;
        f(ctx, out);
        for (size_t k = 0; k < nout; k++)
            lp += (double)dout[k] * out[k];
        in[i] = save - FD_H;
        f(ctx, out);
        for (size_t k = 0; k < nout; k++)
            lm += (double)dout[k] * out[k];
        in[i] = save;
        check_close_at(file, line, what, i, got[i], (lp - lm) / (2 * FD_H),
                       GRAD_RTOL, GRAD_ATOL);
    }
    free(out);
}
#define CHECK_GRAD(what, f, ctx, in, nin, dout, nout, got)                  \
    check_grad_at(__FILE__, __LINE__, what, f, ctx, in, nin, dout, nout, got)

/* ---- matmul ------------------------------------------------------------- */

struct mm_ref {
    double *x, *w, *b; /* x[M,K]; w[K,N] or [N,K] (wt); b[N] or NULL */
    int M, K, N, wt;
};

static void mm_ref_fn(const void *ctx, double *y)
{
    const struct mm_ref *r = ctx;
    for (int i = 0; i < r->M; i++)
        for (int j = 0; j < r->N; j++) {
            double s = r->b ? r->b[j] : 0.0;
            for (int k = 0; k < r->K; k++)
                s += r->x[i * r->K + k] *
                     (r->wt ? r->w[j * r->K + k] : r->w[k * r->N + j]);
            y[i * r->N + j] = s;
        }
}

static const int mm_shapes[][3] = {
    {1, 1, 1}, {3, 5, 7}, {1, 9, 4}, {6, 1, 3}, {17, 33, 5}, {8, 16, 24},
};
enum { MM_NSHAPES = sizeof mm_shapes / sizeof mm_shapes[0] };

/* Forward and backward of one matmul shape, [in,out] or [out,in] weights. */
static void mm_case(int M, int K, int N, int wt, int with_bias)
{
    size_t nx = (size_t)M * K, nw = (size_t)K * N, ny = (size_t)M * N;
    float *x = fill(nx, -1, 1), *w = fill(nw, -1, 1);
    float *b = with_bias ? fill((size_t)N, -1, 1) : NULL;
    float *dy = fill(ny, -1, 1), *y = zeros(ny);
    float *dx = zeros(nx), *dw = zeros(nw), *db = zeros((size_t)N);
    struct mm_ref r = {to_double(x, nx), to_double(w, nw),
                       b ? to_double(b, (size_t)N) : NULL, M, K, N, wt};
    double *want = malloc(ny * sizeof *want);
    ASSERT_NOT_NULL(want);

    if (wt) {
        kcpu_matmul_wt_forward(y, x, w, b, M, K, N);
        kcpu_matmul_wt_backward(dx, dw, b ? db : NULL, dy, x, w, M, K, N);
    } else {
        kcpu_matmul_forward(y, x, w, b, M, K, N);
        kcpu_matmul_backward(dx, dw, b ? db : NULL, dy, x, w, M, K, N);
    }
    mm_ref_fn(&r, want);
    CHECK_FWD("matmul y", y, want, ny);
    CHECK_GRAD("matmul dx", mm_ref_fn, &r, r.x, nx, dy, ny, dx);
    CHECK_GRAD("matmul dw", mm_ref_fn, &r, r.w, nw, dy, ny, dw);
    if (b)
        CHECK_GRAD("matmul db", mm_ref_fn, &r, r.b, (size_t)N, dy, ny, db);
    else
        for (int j = 0; j < N; j++)
            ASSERT_INT_EQ(db[j] == 0.0f, 1);

    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw);
    free(db), free(r.x), free(r.w), free(r.b), free(want);
}

/* y = x @ w + b against a double loop, and its three gradients. */
TEST_IMPL(kcpu_matmul_forward_backward)
{
    rng_seed(1);
    for (int s = 0; s < MM_NSHAPES; s++) {
        mm_case(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], 0, 1);
        mm_case(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], 0, 0);
    }
}

/* The tied-head variant y = x @ w^T + b with w[N,K]. */
TEST_IMPL(kcpu_matmul_wt_forward_backward)
{
    rng_seed(2);
    for (int s = 0; s < MM_NSHAPES; s++) {
        mm_case(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], 1, 1);
        mm_case(mm_shapes[s][0], mm_shapes[s][1], mm_shapes[s][2], 1, 0);
    }
}

/* The two variants agree when w^T is stored explicitly. */
TEST_IMPL(kcpu_matmul_wt_matches_transpose)
{
    enum { M = 4, K = 3, N = 5 };
    float x[M * K], w[K * N], wt[N * K], b[N], y1[M * N], y2[M * N];
    rng_seed(3);
    for (int i = 0; i < M * K; i++)
        x[i] = rng_uniform(-1, 1);
    for (int i = 0; i < N; i++)
        b[i] = rng_uniform(-1, 1);
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++)
            wt[j * K + k] = w[k * N + j] = rng_uniform(-1, 1);
    kcpu_matmul_forward(y1, x, w, b, M, K, N);
    kcpu_matmul_wt_forward(y2, x, wt, b, M, K, N);
    for (int i = 0; i < M * N; i++)
        CHECK_CLOSE("y", (size_t)i, y2[i], y1[i], 1e-6, 1e-6);
}

/* ---- the accumulate convention ------------------------------------------ */

/* Calling a backward twice doubles the gradients: they add, not overwrite. */
TEST_IMPL(kcpu_backward_accumulates)
{
    enum { M = 3, K = 5, N = 7 };
    float x[M * K], w[K * N], dy[M * N];
    float dx1[M * K] = {0}, dw1[K * N] = {0}, db1[N] = {0};
    float dx2[M * K] = {0}, dw2[K * N] = {0}, db2[N] = {0};
    float mean[M], rstd[M], out[M * K], lw[K], lb[K];
    float ldx1[M * K] = {0}, ldw1[K] = {0}, ldx2[M * K] = {0}, ldw2[K] = {0};
    float ldb1[K] = {0}, ldb2[K] = {0};

    rng_seed(4);
    for (int i = 0; i < M * K; i++)
        x[i] = rng_uniform(-1, 1);
    for (int i = 0; i < K * N; i++)
        w[i] = rng_uniform(-1, 1);
    for (int i = 0; i < M * N; i++)
        dy[i] = rng_uniform(-1, 1);
    for (int i = 0; i < K; i++)
        lw[i] = rng_uniform(0.5f, 1.5f), lb[i] = rng_uniform(-1, 1);

    kcpu_matmul_backward(dx1, dw1, db1, dy, x, w, M, K, N);
    kcpu_matmul_backward(dx2, dw2, db2, dy, x, w, M, K, N);
    kcpu_matmul_backward(dx2, dw2, db2, dy, x, w, M, K, N);
    for (int i = 0; i < M * K; i++)
        CHECK_CLOSE("dx", (size_t)i, dx2[i], 2.0 * dx1[i], 1e-6, 1e-7);
    for (int i = 0; i < K * N; i++)
        CHECK_CLOSE("dw", (size_t)i, dw2[i], 2.0 * dw1[i], 1e-6, 1e-7);
    for (int i = 0; i < N; i++)
        CHECK_CLOSE("db", (size_t)i, db2[i], 2.0 * db1[i], 1e-6, 1e-7);

    /* a loop kernel too: layernorm, with dy's first M*K values as dout */
    kcpu_layernorm_forward(out, mean, rstd, x, lw, lb, M, K, 1e-5f);
    kcpu_layernorm_backward(ldx1, ldw1, ldb1, dy, x, lw, mean, rstd, M, K);
    for (int rep = 0; rep < 2; rep++)
        kcpu_layernorm_backward(ldx2, ldw2, ldb2, dy, x, lw, mean, rstd, M,
                                K);
    for (int i = 0; i < M * K; i++)
        CHECK_CLOSE("ln dx", (size_t)i, ldx2[i], 2.0 * ldx1[i], 1e-6, 1e-7);
    for (int i = 0; i < K; i++) {
        CHECK_CLOSE("ln dw", (size_t)i, ldw2[i], 2.0 * ldw1[i], 1e-6, 1e-7);
        CHECK_CLOSE("ln db", (size_t)i, ldb2[i], 2.0 * ldb1[i], 1e-6, 1e-7);
    }
}

/* ---- embedding ---------------------------------------------------------- */

struct emb_ref {
    double *table; /* [V,C] */
    const int32_t *ids;
    int n, C;
};

static void emb_ref_fn(const void *ctx, double *out)
{
    const struct emb_ref *r = ctx;
    for (int i = 0; i < r->n; i++)
        for (int c = 0; c < r->C; c++)
            out[i * r->C + c] = r->table[r->ids[i] * r->C + c];
}

/* Gather rows; the backward scatter-adds, repeated ids included. */
TEST_IMPL(kcpu_embedding_forward_backward)
{
    static const int shapes[][3] = {{1, 1, 1}, {5, 3, 1}, {7, 4, 6},
                                    {12, 10, 5}}; /* n, V, C */
    rng_seed(5);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int n = shapes[s][0], V = shapes[s][1], C = shapes[s][2];
        size_t nt = (size_t)V * C, no = (size_t)n * C;
        int32_t *ids = malloc((size_t)n * sizeof *ids);
        ASSERT_NOT_NULL(ids);
        for (int i = 0; i < n; i++) /* V < n for some shapes: repeats */
            ids[i] = (int32_t)(rng_next() % (uint64_t)V);
        ids[n - 1] = ids[0]; /* at least one repeat when n > 1 */
        float *table = fill(nt, -1, 1), *out = zeros(no);
        float *dout = fill(no, -1, 1), *dtable = zeros(nt);
        struct emb_ref r = {to_double(table, nt), ids, n, C};
        double *want = malloc(no * sizeof *want);
        ASSERT_NOT_NULL(want);

        kcpu_embedding_forward(out, ids, table, n, V, C);
        emb_ref_fn(&r, want);
        for (size_t i = 0; i < no; i++) /* a copy: exact */
            ASSERT_INT_EQ(out[i] == (float)want[i], 1);
        kcpu_embedding_backward(dtable, dout, ids, n, V, C);
        CHECK_GRAD("embedding dtable", emb_ref_fn, &r, r.table, nt, dout, no,
                   dtable);
        free(ids), free(table), free(out), free(dout), free(dtable);
        free(r.table), free(want);
    }
}

/* ---- layernorm and rmsnorm ---------------------------------------------- */

struct norm_ref {
    double *x, *w, *b; /* x[rows,C]; w[C]; b[C] or NULL */
    int rows, C, rms;
    double eps;
};

/* out[rows,C]; then, after the rows, mean[rows] and rstd[rows] when
 * stats is set (the forward check uses them, the gradient check does not). */
static void norm_ref_stats(const struct norm_ref *r, double *out,
                           double *stats)
{
    for (int i = 0; i < r->rows; i++) {
        const double *x = r->x + i * r->C;
        double mu = 0.0, var = 0.0;
        if (!r->rms) {
            for (int c = 0; c < r->C; c++)
                mu += x[c];
            mu /= r->C;
        }
        for (int c = 0; c < r->C; c++)
            var += (x[c] - mu) * (x[c] - mu);
        double rs = 1.0 / sqrt(var / r->C + r->eps);
        for (int c = 0; c < r->C; c++)
            out[i * r->C + c] =
                (x[c] - mu) * rs * r->w[c] + (r->b ? r->b[c] : 0.0);
        if (stats)
            stats[i] = mu, stats[r->rows + i] = rs;
    }
}

static void norm_ref_fn(const void *ctx, double *out)
{
    norm_ref_stats(ctx, out, NULL);
}

static const int norm_shapes[][2] = {{1, 1}, {1, 8}, {3, 7}, {4, 1},
                                     {5, 64}, {2, 21}};
enum { NORM_NSHAPES = sizeof norm_shapes / sizeof norm_shapes[0] };

static void norm_case(int rows, int C, int rms, int with_bias)
{
    size_t nx = (size_t)rows * C;
    float *x = fill(nx, -2, 2), *w = fill((size_t)C, 0.5f, 1.5f);
    float *b = with_bias ? fill((size_t)C, -1, 1) : NULL;
    float *out = zeros(nx), *mean = zeros((size_t)rows);
    float *rstd = zeros((size_t)rows), *dout = fill(nx, -1, 1);
    float *dx = zeros(nx), *dw = zeros((size_t)C), *db = zeros((size_t)C);
    struct norm_ref r = {to_double(x, nx), to_double(w, (size_t)C),
                         b ? to_double(b, (size_t)C) : NULL, rows, C, rms,
                         1e-5};
    double *want = malloc(nx * sizeof *want);
    double *stats = malloc(2 * (size_t)rows * sizeof *stats);
    ASSERT_NOT_NULL(want);
    ASSERT_NOT_NULL(stats);

    if (rms) {
        kcpu_rmsnorm_forward(out, rstd, x, w, rows, C, 1e-5f);
        kcpu_rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, C);
    } else {
        kcpu_layernorm_forward(out, mean, rstd, x, w, b, rows, C, 1e-5f);
        kcpu_layernorm_backward(dx, dw, b ? db : NULL, dout, x, w, mean,
                                rstd, rows, C);
    }
    norm_ref_stats(&r, want, stats);
    CHECK_FWD("norm out", out, want, nx);
    if (!rms)
        CHECK_FWD("norm mean", mean, stats, (size_t)rows);
    for (int i = 0; i < rows; i++) /* rstd can be 1/sqrt(eps) ~ 316 */
        CHECK_CLOSE("norm rstd", (size_t)i, rstd[i], stats[rows + i], 1e-6,
                    0);
    CHECK_GRAD("norm dx", norm_ref_fn, &r, r.x, nx, dout, nx, dx);
    CHECK_GRAD("norm dw", norm_ref_fn, &r, r.w, (size_t)C, dout, nx, dw);
    if (b)
        CHECK_GRAD("norm db", norm_ref_fn, &r, r.b, (size_t)C, dout, nx, db);

    free(x), free(w), free(b), free(out), free(mean), free(rstd);
    free(dout), free(dx), free(dw), free(db), free(r.x), free(r.w);
    free(r.b), free(want), free(stats);
}

TEST_IMPL(kcpu_layernorm_forward_backward)
{
    rng_seed(6);
    for (int s = 0; s < NORM_NSHAPES; s++) {
        norm_case(norm_shapes[s][0], norm_shapes[s][1], 0, 1);
        norm_case(norm_shapes[s][0], norm_shapes[s][1], 0, 0);
    }
}

TEST_IMPL(kcpu_rmsnorm_forward_backward)
{
    rng_seed(7);
    for (int s = 0; s < NORM_NSHAPES; s++)
        norm_case(norm_shapes[s][0], norm_shapes[s][1], 1, 0);
}

/* ---- activations -------------------------------------------------------- */

enum { ACT_GELU, ACT_SILU, ACT_SWIGLU };

struct act_ref {
    double *x, *up; /* x[n] (gate for swiglu); up[n] for swiglu */
    size_t n;
    int kind;
};

static void act_ref_fn(const void *ctx, double *out)
{
    const struct act_ref *r = ctx;
    for (size_t i = 0; i < r->n; i++) {
        double x = r->x[i];
        if (r->kind == ACT_GELU)
            out[i] = 0.5 * x *
                     (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) *
                                 (x + 0.044715 * x * x * x)));
        else if (r->kind == ACT_SILU)
            out[i] = x / (1.0 + exp(-x));
        else
            out[i] = x / (1.0 + exp(-x)) * r->up[i];
    }
}

static void act_case(int kind, size_t n)
{
    float *x = fill(n, -5, 5), *up = fill(n, -2, 2), *out = zeros(n);
    float *dout = fill(n, -1, 1), *dx = zeros(n), *dup = zeros(n);
    struct act_ref r = {to_double(x, n), to_double(up, n), n, kind};
    double *want = malloc(n * sizeof *want);
    ASSERT_NOT_NULL(want);

    if (kind == ACT_GELU) {
        kcpu_gelu_forward(out, x, n);
        kcpu_gelu_backward(dx, x, dout, n);
        /* in place, over dout's copy: the same bits as into a zeroed dx */
        float *d = malloc(n * sizeof *d);
        ASSERT_NOT_NULL(d);
        memcpy(d, dout, n * sizeof *d);
        kcpu_gelu_backward_inplace(d, x, n);
        ASSERT_INT_EQ(memcmp(d, dx, n * sizeof *d), 0);
        free(d);
    } else if (kind == ACT_SILU) {
        kcpu_silu_forward(out, x, n);
        kcpu_silu_backward(dx, x, dout, n);
    } else {
        kcpu_swiglu_forward(out, x, up, n);
        kcpu_swiglu_backward(dx, dup, dout, x, up, n);
    }
    act_ref_fn(&r, want);
    CHECK_FWD("activation out", out, want, n);
    CHECK_GRAD("activation dx", act_ref_fn, &r, r.x, n, dout, n, dx);
    if (kind == ACT_SWIGLU)
        CHECK_GRAD("swiglu dup", act_ref_fn, &r, r.up, n, dout, n, dup);

    free(x), free(up), free(out), free(dout), free(dx), free(dup);
    free(r.x), free(r.up), free(want);
}

TEST_IMPL(kcpu_activations_forward_backward)
{
    /* the kernels work in chunks of 64: one, three and a ragged tail */
    static const size_t sizes[] = {1, 7, 64, 200};
    rng_seed(8);
    for (int kind = ACT_GELU; kind <= ACT_SWIGLU; kind++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            act_case(kind, sizes[s]);
}

/* The kernels' exp against exp in double: under 1.5e-7 relative (about 2
 * ulp) from -87.3 to 88, 0 below and for -inf, e^88 above, NaN for NaN. */
TEST_IMPL(kcpu_expf_matches_exp)
{
    double worst = 0.0;
    for (int i = 0; i <= 1000000; i++) {
        float x = -87.3f + (88.0f + 87.3f) * (float)i / 1000000.0f;
        double want = exp((double)x);
        double err = fabs(kcpu__expf(x) - want) / want;
        worst = err > worst ? err : worst;
    }
    CHECK_CLOSE("worst relative error", 0, worst, 0.0, 0.0, 1.5e-7);
    CHECK_CLOSE("exp(0)", 0, kcpu__expf(0.0f), 1.0, 0.0, 0.0);
    CHECK_CLOSE("exp(-100)", 0, kcpu__expf(-100.0f), 0.0, 0.0, 0.0);
    CHECK_CLOSE("exp(-inf)", 0, kcpu__expf(-INFINITY), 0.0, 0.0, 0.0);
    CHECK_CLOSE("exp(1000)", 0, kcpu__expf(1000.0f), exp(88.0), 1.5e-7, 0);
    CHECK_CLOSE("exp(inf)", 0, kcpu__expf(INFINITY), exp(88.0), 1.5e-7, 0);
    ASSERT_INT_EQ(isnan(kcpu__expf(NAN)), 1);
}

/* GELU over [-12, 12] (where 1 + tanh(u) cancels for negative x, so the
 * reference uses the equal x / (1 + exp(-2u))), n a ragged number of
 * chunks: the forward within 2e-6 relative, the gradient within 2e-6
 * relative plus 1e-7 (it crosses zero near x = -0.75), both exact to
 * 1e-12 where the values themselves vanish. */
TEST_IMPL(kcpu_gelu_accurate_over_range)
{
    enum { N = 4801 };
    const double k = sqrt(2.0 / 3.14159265358979323846);
    float *x = zeros(N), *out = zeros(N), *ones = zeros(N), *dx = zeros(N);
    for (int i = 0; i < N; i++) {
        x[i] = -12.0f + 24.0f * (float)i / (N - 1);
        ones[i] = 1.0f;
    }
    kcpu_gelu_forward(out, x, N);
    kcpu_gelu_backward(dx, x, ones, N);
    for (int i = 0; i < N; i++) {
        double xi = x[i], u = k * (xi + 0.044715 * xi * xi * xi);
        double e = exp(-2.0 * u), sg = 1.0 / (1.0 + e);
        double du = k * (1.0 + 3.0 * 0.044715 * xi * xi);
        CHECK_CLOSE("gelu", (size_t)i, out[i], xi * sg, 2e-6, 1e-12);
        CHECK_CLOSE("gelu'", (size_t)i, dx[i],
                    sg + 2.0 * xi * du * sg * (e * sg), 2e-6, 1e-7);
    }
    free(x), free(out), free(ones), free(dx);
}

/* In place (out == x) is allowed for the forward passes. */
TEST_IMPL(kcpu_activations_in_place)
{
    float x[5] = {-3, -0.5f, 0, 0.25f, 4}, y[5], z[5];
    memcpy(y, x, sizeof x);
    kcpu_gelu_forward(z, x, 5);
    kcpu_gelu_forward(y, y, 5);
    for (int i = 0; i < 5; i++)
        ASSERT_INT_EQ(y[i] == z[i], 1);
    memcpy(y, x, sizeof x);
    kcpu_swiglu_forward(z, x, x, 5);
    kcpu_swiglu_forward(y, y, y, 5);
    for (int i = 0; i < 5; i++)
        ASSERT_INT_EQ(y[i] == z[i], 1);
}

/* ---- residual and broadcast add ----------------------------------------- */

struct add_ref {
    double *a, *p; /* a[B,T,C]; p[T,C] (or [B,T,C] when B == 0 marks plain) */
    int B, T, C;
};

static void add_ref_fn(const void *ctx, double *out)
{
    const struct add_ref *r = ctx;
    size_t tc = (size_t)r->T * r->C;
    for (int b = 0; b < r->B; b++)
        for (size_t i = 0; i < tc; i++)
            out[b * tc + i] = r->a[b * tc + i] + r->p[i];
}

TEST_IMPL(kcpu_add_forward_backward)
{
    static const int shapes[][3] = {{1, 1, 1}, {3, 1, 1}, {1, 5, 3},
                                    {3, 4, 7}}; /* B, T, C */
    rng_seed(9);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        size_t tc = (size_t)T * C, n = (size_t)B * tc;
        float *a = fill(n, -1, 1), *p = fill(tc, -1, 1), *out = zeros(n);
        float *dout = fill(n, -1, 1), *da = zeros(n), *dp = zeros(tc);
        float *bb = fill(n, -1, 1), *db = zeros(n);
        struct add_ref r = {to_double(a, n), to_double(p, tc), B, T, C};
        double *want = malloc(n * sizeof *want);
        ASSERT_NOT_NULL(want);

        /* broadcast: out = a + p over the batch */
        kcpu_add_broadcast_forward(out, a, p, B, T, C);
        add_ref_fn(&r, want);
        CHECK_FWD("broadcast out", out, want, n);
        kcpu_add_broadcast_backward(da, dp, dout, B, T, C);
        CHECK_GRAD("broadcast da", add_ref_fn, &r, r.a, n, dout, n, da);
        CHECK_GRAD("broadcast dp", add_ref_fn, &r, r.p, tc, dout, n, dp);

        /* plain residual: out = a + bb, da and db both get dout (added) */
        kcpu_add_forward(out, a, bb, n);
        for (size_t i = 0; i < n; i++)
            ASSERT_INT_EQ(out[i] == a[i] + bb[i], 1);
        memset(da, 0, n * sizeof *da);
        kcpu_add_backward(da, db, dout, n);
        kcpu_add_backward(NULL, db, dout, n);
        for (size_t i = 0; i < n; i++) {
            ASSERT_INT_EQ(da[i] == dout[i], 1);
            ASSERT_INT_EQ(db[i] == 2.0f * dout[i], 1);
        }
        kcpu_add_forward(a, a, bb, n); /* in place */
        for (size_t i = 0; i < n; i++)
            ASSERT_INT_EQ(a[i] == out[i], 1);

        free(a), free(p), free(out), free(dout), free(da), free(dp);
        free(bb), free(db), free(r.a), free(r.p), free(want);
    }
}

/* ---- fused softmax cross-entropy ---------------------------------------- */

struct ce_ref {
    double *logits; /* [N,Vp], the first V columns used */
    const int32_t *targets;
    int N, V, Vp;
};

/* out[0] = mean loss; out[1 + i] = row i's loss when rows is set. */
static void ce_ref_rows(const struct ce_ref *r, double *out, int rows)
{
    double total = 0.0;
    for (int i = 0; i < r->N; i++) {
        const double *row = r->logits + (size_t)i * r->Vp;
        double s = 0.0; /* naive log-softmax, no max shift: values are small */
        for (int j = 0; j < r->V; j++)
            s += exp(row[j]);
        double loss = log(s) - row[r->targets[i]];
        if (rows)
            out[1 + i] = loss;
        total += loss;
    }
    out[0] = total / r->N;
}

static void ce_ref_fn(const void *ctx, double *out)
{
    ce_ref_rows(ctx, out, 0);
}

/* Loss and per-row losses against a naive log-softmax; dlogits against
 * finite differences of dloss * mean loss, padded columns included (zero). */
TEST_IMPL(kcpu_crossentropy_forward_backward)
{
    static const int shapes[][3] = {{1, 1, 1},   {1, 5, 8},    {3, 7, 7},
                                    {4, 10, 16}, {9, 33, 40},  {2, 64, 64},
                                    {3, 150, 160}}; /* N, V, Vp */
    rng_seed(10);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], V = shapes[s][1], Vp = shapes[s][2];
        size_t nl = (size_t)N * Vp;
        float *logits = fill(nl, -4, 4), *dlogits = zeros(nl);
        float *losses = zeros((size_t)N), *rowmax = zeros((size_t)N);
        float *lse = zeros((size_t)N), dloss = 0.7f;
        int32_t *targets = malloc((size_t)N * sizeof *targets);
        double *want = malloc((size_t)(N + 1) * sizeof *want);
        ASSERT_NOT_NULL(targets);
        ASSERT_NOT_NULL(want);
        for (int i = 0; i < N; i++)
            targets[i] = (int32_t)(rng_next() % (uint64_t)V);
        struct ce_ref r = {to_double(logits, nl), targets, N, V, Vp};

        float loss = kcpu_crossentropy_forward(losses, rowmax, lse, logits,
                                               targets, N, V, Vp);
        ce_ref_rows(&r, want, 1);
        CHECK_CLOSE("mean loss", 0, loss, want[0], FWD_RTOL, FWD_ATOL);
        CHECK_FWD("row loss", losses, want + 1, (size_t)N);
        kcpu_crossentropy_backward(dlogits, logits, targets, rowmax, lse,
                                   dloss, N, V, Vp);
        CHECK_GRAD("dlogits", ce_ref_fn, &r, r.logits, nl, &dloss, 1,
                   dlogits);
        for (int i = 0; i < N; i++)
            for (int j = V; j < Vp; j++)
                ASSERT_INT_EQ(dlogits[(size_t)i * Vp + j] == 0.0f, 1);

        free(logits), free(dlogits), free(losses), free(rowmax), free(lse);
        free(targets), free(want), free(r.logits);
    }
}

/* Padded columns are never read: NaN or huge values there change nothing,
 * and their gradient slots are left as they were. Large logits stay finite
 * (the max is subtracted before exp). */
TEST_IMPL(kcpu_crossentropy_padded_vocab_masked)
{
    enum { N = 3, V = 5, Vp = 8 };
    float packed[N * V], padded[N * Vp], dpacked[N * V] = {0};
    float dpadded[N * Vp], losses1[N], losses2[N], mx[N], ls[N];
    int32_t targets[N] = {0, 4, 2};

    rng_seed(11);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++) {
            float v = 500.0f + rng_uniform(-3, 3);
            if (j < V)
                packed[i * V + j] = padded[i * Vp + j] = v;
            else
                padded[i * Vp + j] = j == V ? NAN : 1e30f;
            dpadded[i * Vp + j] = j < V ? 0.0f : 123.0f; /* sentinels */
        }

    float l1 = kcpu_crossentropy_forward(losses1, mx, ls, packed, targets, N,
                                         V, V);
    kcpu_crossentropy_backward(dpacked, packed, targets, mx, ls, 2.0f, N, V,
                               V);
    float l2 = kcpu_crossentropy_forward(losses2, mx, ls, padded, targets, N,
                                         V, Vp);
    kcpu_crossentropy_backward(dpadded, padded, targets, mx, ls, 2.0f, N, V,
                               Vp);
    ASSERT_INT_EQ(isfinite(l1), 1);
    ASSERT_INT_EQ(l1 == l2, 1);
    for (int i = 0; i < N; i++) {
        ASSERT_INT_EQ(losses1[i] == losses2[i], 1);
        double rowsum = 0.0;
        for (int j = 0; j < Vp; j++) {
            float g = dpadded[i * Vp + j];
            if (j < V) {
                ASSERT_INT_EQ(g == dpacked[i * V + j], 1);
                rowsum += g;
            } else {
                ASSERT_INT_EQ(g == 123.0f, 1);
            }
        }
        /* softmax - onehot sums to zero over the vocabulary */
        CHECK_CLOSE("row sum of dlogits", (size_t)i, rowsum, 0.0, 0, 1e-6);
    }
    /* one hand value: uniform logits give loss log(V), p = 1/V */
    {
        float flat[V] = {2, 2, 2, 2, 2}, d[V] = {0}, l, m, s;
        int32_t t = 3;
        float loss = kcpu_crossentropy_forward(&l, &m, &s, flat, &t, 1, V, V);
        kcpu_crossentropy_backward(d, flat, &t, &m, &s, 1.0f, 1, V, V);
        CHECK_CLOSE("uniform loss", 0, loss, log(5.0), 1e-6, 0);
        for (int j = 0; j < V; j++)
            CHECK_CLOSE("uniform dlogits", (size_t)j, d[j],
                        0.2 - (j == 3 ? 1.0 : 0.0), 1e-6, 1e-7);
    }
}

/* ---- AdamW and clipping ------------------------------------------------- */

/* One step by hand: p = 1, g = 0.5, m = v = 0, t = 1 gives mhat = g,
 * vhat = g^2, so the Adam update is g / (|g| + eps) ~ 1. */
TEST_IMPL(kcpu_adamw_hand_step)
{
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    kcpu_adamw_step(&p, &g, 1.0, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
    CHECK_CLOSE("m", 0, m, 0.05, 1e-6, 0);
    /* 1 - 0.999f is 0.00099998713 in float, not 0.001 */
    CHECK_CLOSE("v", 0, v, (1.0 - (double)0.999f) * 0.25, 1e-6, 0);
    /* 1 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.01 * 1) = 0.899 */
    CHECK_CLOSE("p", 0, p, 0.899, 1e-6, 0);
}

/* Several steps over a buffer against a double loop of the same formula;
 * N is two chunks of 64 and a ragged tail. */
TEST_IMPL(kcpu_adamw_matches_reference)
{
    enum { N = 150, STEPS = 5 };
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    float p[N], m[N] = {0}, v[N] = {0}, g[N];
    double pd[N], md[N] = {0}, vd[N] = {0};

    rng_seed(12);
    for (int i = 0; i < N; i++)
        pd[i] = p[i] = rng_uniform(-1, 1);
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++)
            g[i] = rng_uniform(-1, 1);
        g[0] = 0.0f; /* a zero gradient: only decay and momentum move it */
        kcpu_adamw_step(p, g, 1.0, m, v, N, (float)lr, (float)b1, (float)b2,
                        (float)eps, (float)wd, t);
        for (int i = 0; i < N; i++) {
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(b1, t));
            double vh = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pd[i]);
        }
    }
    for (int i = 0; i < N; i++) {
        CHECK_CLOSE("p", (size_t)i, p[i], pd[i], 1e-5, 1e-6);
        CHECK_CLOSE("m", (size_t)i, m[i], md[i], 1e-5, 1e-7);
        CHECK_CLOSE("v", (size_t)i, v[i], vd[i], 1e-5, 1e-9);
    }
}

/* The gradients' factor folded into the step gives the bits of scaling
 * them first (kcpu_scale_buffers) and stepping with 1.0, and leaves them
 * alone; over two chunks and a tail, three steps. */
TEST_IMPL(kcpu_adamw_scaled_as_scale_then_step)
{
    enum { N = 150 };
    /* [0] scaled first, [1] the factor folded in, [2] no factor */
    float p[3][N], m[3][N] = {{0}}, v[3][N] = {{0}}, g[N], gs[N], g0[N];
    rng_seed(31);
    for (int i = 0; i < N; i++)
        p[0][i] = p[1][i] = p[2][i] = rng_uniform(-1, 1);
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < N; i++)
            g0[i] = g[i] = gs[i] = rng_uniform(-3, 3);
        double scale = t == 2 ? 1.0 : 0.3712345678901 / t;
        float *b = gs;
        size_t n = N;
        kcpu_scale_buffers(&b, &n, 1, scale);
        kcpu_adamw_step(p[0], gs, 1.0, m[0], v[0], N, 3e-3f, 0.9f, 0.95f,
                        1e-8f, 0.1f, t);
        kcpu_adamw_step(p[1], g, scale, m[1], v[1], N, 3e-3f, 0.9f, 0.95f,
                        1e-8f, 0.1f, t);
        kcpu_adamw_step(p[2], g0, 1.0, m[2], v[2], N, 3e-3f, 0.9f, 0.95f,
                        1e-8f, 0.1f, t);
        ASSERT_INT_EQ(memcmp(g, g0, sizeof g), 0);
    }
    ASSERT_INT_EQ(memcmp(p[0], p[1], sizeof p[0]), 0);
    ASSERT_INT_EQ(memcmp(m[0], m[1], sizeof m[0]), 0);
    ASSERT_INT_EQ(memcmp(v[0], v[1], sizeof v[0]), 0);
    ASSERT_INT_EQ(memcmp(m[1], m[2], sizeof m[1]) != 0, 1); /* (the factor counted) */
}

/* Norm over buffers {3, 4} and {12} is 13; clipping to 1 scales by
 * 1 / (13 + 1e-6); clipping to 100 leaves the buffers alone. */
TEST_IMPL(kcpu_clip_global_norm_known)
{
    float a[2] = {3, 4}, b[1] = {12}, e[1] = {99};
    float *bufs[3] = {a, e, b};
    const float *cbufs[3] = {a, e, b};
    size_t sizes[3] = {2, 0, 1}; /* an empty buffer in the middle */

    CHECK_CLOSE("norm", 0, kcpu_global_norm(cbufs, sizes, 3), 13.0, 1e-7, 0);
    CHECK_CLOSE("norm", 0, kcpu_clip_global_norm(bufs, sizes, 3, 100.0f),
                13.0, 1e-7, 0);
    ASSERT_INT_EQ(a[0] == 3.0f && a[1] == 4.0f && b[0] == 12.0f, 1);

    CHECK_CLOSE("norm", 0, kcpu_clip_global_norm(bufs, sizes, 3, 1.0f), 13.0,
                1e-7, 0);
    CHECK_CLOSE("a0", 0, a[0], 3.0 / (13.0 + 1e-6), 1e-6, 0);
    CHECK_CLOSE("a1", 1, a[1], 4.0 / (13.0 + 1e-6), 1e-6, 0);
    CHECK_CLOSE("b0", 0, b[0], 12.0 / (13.0 + 1e-6), 1e-6, 0);
    ASSERT_INT_EQ(e[0] == 99.0f, 1); /* size 0: untouched */
    CHECK_CLOSE("clipped norm", 0, kcpu_global_norm(cbufs, sizes, 3), 1.0,
                1e-6, 0);
    CHECK_CLOSE("zero buffers", 0, kcpu_global_norm(cbufs, sizes, 0), 0.0, 0,
                0);
}

/* A long buffer (groups of 8 and a tail) against sums in double. */
TEST_IMPL(kcpu_clip_global_norm_long_buffer)
{
    enum { N = 1003 };
    float *x, *bufs[1];
    size_t sizes[1] = {N};
    double ss = 0.0, norm;
    rng_seed(13);
    bufs[0] = x = fill(N, -2, 2);
    for (int i = 0; i < N; i++)
        ss += (double)x[i] * x[i];
    norm = sqrt(ss);
    double *want = to_double(x, N);
    CHECK_CLOSE("norm", 0, kcpu_clip_global_norm(bufs, sizes, 1, 1.0f), norm,
                1e-6, 0);
    for (int i = 0; i < N; i++)
        CHECK_CLOSE("clipped", (size_t)i, x[i], want[i] / (norm + 1e-6), 1e-6,
                    0);
    free(x), free(want);
}

/* ---- the products' threads (gemm.c) ------------------------------------- */

/* The shapes: C [M, N] += x [M, K] @ w [K, N] in the layouts the kernels
 * use, cut by rows, by columns (few rows, many columns), and in one block
 * (small). */
static const int gemm_shapes[][5] = {
    /* M, N, K, ta, tb */
    {512, 64, 64, 0, 0},   {300, 96, 70, 0, 1}, {64, 64, 512, 1, 0},
    {64, 1100, 64, 0, 0},  {70, 600, 96, 1, 1}, {7, 9, 5, 0, 0},
    {512, 4, 64, 0, 0},    {512, 64, 4, 0, 1}, /* one block of many rows (a router's) */
};
enum { GEMM_NSHAPES = sizeof gemm_shapes / sizeof gemm_shapes[0] };

/* C = beta C + op(A) op(B) for shape s on `threads` threads, from C0. */
static float *gemm_on(int s, int threads, const float *A, const float *B, const float *C0, float beta)
{
    int M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
    int ta = gemm_shapes[s][3], tb = gemm_shapes[s][4];
    float *C = malloc((size_t)M * N * sizeof *C);
    memcpy(C, C0, (size_t)M * N * sizeof *C);
    kcpu_set_threads(threads);
    kcpu__gemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
    return C;
}

/* Every product gives the same bits on 1, 2, 3 and 5 threads (OpenBLAS's
 * own threading does not: its products change with the count), and the
 * double loop's values. */
TEST_IMPL(kcpu_gemm_same_bits_on_any_thread_count)
{
    rng_seed(21);
    for (int s = 0; s < GEMM_NSHAPES; s++) {
        int M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
        int ta = gemm_shapes[s][3], tb = gemm_shapes[s][4];
        float *A = fill((size_t)M * K, -1, 1), *B = fill((size_t)K * N, -1, 1);
        float *C0 = fill((size_t)M * N, -1, 1);
        float *one = gemm_on(s, 1, A, B, C0, 1.0f);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double want = C0[(size_t)i * N + j];
                for (int k = 0; k < K; k++)
                    want += (double)A[ta ? (size_t)k * M + i : (size_t)i * K + k] *
                            B[tb ? (size_t)j * K + k : (size_t)k * N + j];
                CHECK_CLOSE("C", (size_t)i * N + j, one[(size_t)i * N + j], want, FWD_RTOL, FWD_ATOL);
            }
        static const int counts[] = {2, 3, 5};
        for (int c = 0; c < 3; c++) {
            float *more = gemm_on(s, counts[c], A, B, C0, 1.0f);
            if (memcmp(one, more, (size_t)M * N * sizeof *one) != 0)
                unit_fail(__FILE__, __LINE__, "shape %d (%d x %d x %d): %d threads differ from 1", s, M, N, K,
                          counts[c]);
            free(more);
        }
        free(A), free(B), free(C0), free(one);
    }
    kcpu_set_threads(0);
}

/* Threads that multiply at once (a process's ranks) each use their own
 * workers: the same bits as alone. */
typedef struct gemm_rank {
    int s;
    const float *A, *B, *C0;
    float *C;
} gemm_rank;

static void *gemm_rank_main(void *arg)
{
    gemm_rank *r = arg;
    for (int rep = 0; rep < 20; rep++) {
        free(r->C);
        r->C = gemm_on(r->s, 2, r->A, r->B, r->C0, 0.0f);
    }
    return NULL;
}

TEST_IMPL(kcpu_gemm_threads_at_once)
{
    enum { RANKS = 3 };
    const int s = 0, M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
    rng_seed(22);
    float *A = fill((size_t)M * K, -1, 1), *B = fill((size_t)K * N, -1, 1), *C0 = fill((size_t)M * N, -1, 1);
    float *want = gemm_on(s, 1, A, B, C0, 0.0f);
    gemm_rank r[RANKS];
    pthread_t t[RANKS];
    for (int i = 0; i < RANKS; i++) {
        r[i] = (gemm_rank){s, A, B, C0, NULL};
        ASSERT_INT_EQ(pthread_create(&t[i], NULL, gemm_rank_main, &r[i]), 0);
    }
    for (int i = 0; i < RANKS; i++) {
        ASSERT_INT_EQ(pthread_join(t[i], NULL), 0);
        ASSERT_INT_EQ(memcmp(r[i].C, want, (size_t)M * N * sizeof *want), 0);
        free(r[i].C);
    }
    free(A), free(B), free(C0), free(want);
    kcpu_set_threads(0);
}

/* A child of fork() multiplies on workers of its own (its parent's are not
 * in it): the same bits, and no wait for threads that do not exist. (The
 * hazard gemm.c's fork epoch guards against, a fork while a parent's worker
 * holds the pool's lock, is not staged here; nor is this in make tsan,
 * which cannot start threads after a fork of a process of several.) */
TEST_IMPL(kcpu_fork_then_gemm)
{
    const int s = 0, M = gemm_shapes[s][0], N = gemm_shapes[s][1], K = gemm_shapes[s][2];
    rng_seed(23);
    float *A = fill((size_t)M * K, -1, 1), *B = fill((size_t)K * N, -1, 1), *C0 = fill((size_t)M * N, -1, 1);
    float *want = gemm_on(s, 2, A, B, C0, 0.0f); /* this thread's workers started */
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_INT_EQ(pid >= 0, 1);
    if (pid == 0) {
        alarm(20); /* a hang fails the test */
        float *got = gemm_on(s, 2, A, B, C0, 0.0f);
        _exit(memcmp(got, want, (size_t)M * N * sizeof *got) == 0 ? 0 : 3);
    }
    int st = 0;
    ASSERT_INT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_INT_EQ(WIFEXITED(st) && WEXITSTATUS(st) == 0, 1);
    free(A), free(B), free(C0), free(want);
    kcpu_set_threads(0);
}
