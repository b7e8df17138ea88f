/*
 * test_kcpu_attention.c: unit tests for the CPU rope, attention and moe
 * kernels (kernels/cpu/rope.c, attention.c, moe.c).
 *
 * Forwards are checked against naive double-precision references (attention
 * materialises the full T x T softmax); backwards against central finite
 * differences of those references, in double, of L = sum(r * out) for a
 * random r. Gradient buffers start non-zero to check that backwards
 * accumulate. Everything is small: the file runs in well under a second.
 */
#include "kcpu.h" /* the kernels under test */

#include <math.h>   /* defines: exp, log, sqrt, fabs, cos, sin, pow */
#include <stdint.h> /* defines: uint64_t */
#include <stdlib.h> /* defines: malloc, calloc, free */
#include <string.h> /* defines: memcpy */

#include "unit.h" /* defines: TEST_IMPL, ASSERT_*, unit_fail */

/* |got - want| <= atol + rtol * |want|, printing both and the index. */
#define ASSERT_CLOSE(got, want, rtol, atol, i)                              \
    do {                                                                    \
        double unit_g_ = (got), unit_w_ = (want);                           \
        if (!(fabs(unit_g_ - unit_w_) <= (atol) + (rtol) * fabs(unit_w_)))  \
            unit_fail(__FILE__, __LINE__, "%s ~ %s at [%ld]: %.9g vs %.9g", \
                      #got, #want, (long)(i), unit_g_, unit_w_);            \
    } while (0)

/* ---- helpers ------------------------------------------------------------ */

/* splitmix64: a small deterministic PRNG. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float rng_unit(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 11) * 0x1.0p-52 - 1.0);
}

static float *fill(uint64_t *s, long n, float amp)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    ASSERT_NOT_NULL(p);
    for (long i = 0; i < n; i++)
        p[i] = amp * rng_unit(s);
    return p;
}

static float *filled(long n, float v)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    ASSERT_NOT_NULL(p);
    for (long i = 0; i < n; i++)
        p[i] = v;
    return p;
}

static double *to_double(const float *p, long n)
{
    double *q = malloc((size_t)(n > 0 ? n : 1) * sizeof *q);
    ASSERT_NOT_NULL(q);
    for (long i = 0; i < n; i++)
        q[i] = p[i];
    return q;
}

/* Central difference of f at x[i] in double; restores x[i]. */
static double central(double (*f)(void *), void *ctx, double *x, long i)
{
    const double h = 1e-5;
    double x0 = x[i], lp, lm;
    x[i] = x0 + h;
    lp = f(ctx);
    x[i] = x0 - h;
    lm = f(ctx);
    x[i] = x0;
    return (lp - lm) / (2 * h);
}

/* ---- rope ------------------------------------------------------------- */

static const struct {
    int B, T, H, d, pos0;
} rope_shapes[] = {{1, 1, 1, 2, 0}, {2, 5, 3, 2, 0}, {2, 5, 3, 8, 0},
                   {1, 7, 2, 6, 11}};

TEST_IMPL(kcpu_rope_matches_reference)
{
    uint64_t s = 1;
    const float theta = 10000.0f;
    for (size_t c = 0; c < sizeof rope_shapes / sizeof rope_shapes[0]; c++) {
        int B = rope_shapes[c].B, T = rope_shapes[c].T, H = rope_shapes[c].H;
        int d = rope_shapes[c].d, pos0 = rope_shapes[c].pos0, half = d / 2;
        long n = (long)B * T * H * d;
        float *x = fill(&s, n, 1.0f), *out = filled(n, 0.0f);
        kcpu_rope_forward(out, x, B, T, H, d, theta, pos0);
        for (long i = 0; i < n; i++) {
            int t = (int)(i / (H * d) % T), j = (int)(i % d);
            int jj = j % half, first = j < half;
            double a = (pos0 + t) * pow(theta, -2.0 * jj / d);
            double x0 = x[first ? i : i - half], x1 = x[first ? i + half : i];
            double want = first ? x0 * cos(a) - x1 * sin(a)
                                : x0 * sin(a) + x1 * cos(a);
            ASSERT_CLOSE(out[i], want, 1e-6, 1e-6, i);
        }
        /* in place gives the same */
        kcpu_rope_forward(x, x, B, T, H, d, theta, pos0);
        for (long i = 0; i < n; i++)
            ASSERT_CLOSE(x[i], out[i], 0.0, 0.0, i);
        free(x);
        free(out);
    }
}

/* backward(forward(x)) = x for the identity functional; it accumulates. */
TEST_IMPL(kcpu_rope_backward_roundtrips)
{
    uint64_t s = 2;
    for (size_t c = 0; c < sizeof rope_shapes / sizeof rope_shapes[0]; c++) {
        int B = rope_shapes[c].B, T = rope_shapes[c].T, H = rope_shapes[c].H;
        int d = rope_shapes[c].d, pos0 = rope_shapes[c].pos0;
        long n = (long)B * T * H * d;
        float *x = fill(&s, n, 1.0f), *y = filled(n, 0.0f);
        float *dx = filled(n, 0.25f);
        kcpu_rope_forward(y, x, B, T, H, d, 500.0f, pos0 + 1000);
        kcpu_rope_backward(dx, y, B, T, H, d, 500.0f, pos0 + 1000);
        for (long i = 0; i < n; i++)
            ASSERT_CLOSE(dx[i] - 0.25f, x[i], 1e-5, 1e-6, i);
        free(x);
        free(y);
        free(dx);
    }
}

/* rope is linear, so its backward is its transpose: <r, R x> = <R^T r, x>. */
TEST_IMPL(kcpu_rope_backward_is_adjoint)
{
    uint64_t s = 3;
    int B = 2, T = 5, H = 3, d = 4;
    long n = (long)B * T * H * d;
    float *x = fill(&s, n, 1.0f), *r = fill(&s, n, 1.0f);
    float *y = filled(n, 0.0f), *g = filled(n, 0.0f);
    double lhs = 0.0, rhs = 0.0;
    kcpu_rope_forward(y, x, B, T, H, d, 10000.0f, 3);
    kcpu_rope_backward(g, r, B, T, H, d, 10000.0f, 3);
    for (long i = 0; i < n; i++) {
        lhs += (double)r[i] * y[i];
        rhs += (double)g[i] * x[i];
    }
    ASSERT_CLOSE(lhs, rhs, 1e-5, 1e-6, 0);
    free(x);
    free(r);
    free(y);
    free(g);
}

/* ---- attention ------------------------------------------------------- */

/* The kernel works in tiles of 64 query rows by 64 keys: the last shapes
 * cross tile edges (T = 64 exactly, 65, 70, 130), causal and not, with an
 * odd head size and grouped kv heads. T = 1 and non-causal T = 1 too. */
static const struct {
    int B, T, H, KV, d, causal;
    float amp;
} attn_shapes[] = {
    {1, 1, 1, 1, 2, 1, 1.0f},   {2, 5, 3, 1, 2, 1, 1.0f},
    {2, 5, 3, 3, 4, 1, 1.0f},   {1, 7, 4, 2, 3, 1, 1.5f},
    {2, 5, 3, 1, 4, 0, 1.0f},   {1, 6, 2, 1, 8, 1, 4.0f},
    {1, 1, 2, 1, 3, 0, 1.0f},   {1, 64, 2, 1, 4, 1, 1.0f},
    {1, 65, 2, 2, 5, 0, 1.0f},  {1, 70, 2, 1, 3, 1, 1.5f},
    {1, 130, 1, 1, 2, 1, 2.0f},
};

/* Naive attention in double with the full T x T softmax per head. */
static void naive_attention(double *out, double *lse, const double *q,
                            const double *k, const double *v, int B, int T,
                            int H, int KV, int d, int causal)
{
    double *p = malloc((size_t)T * T * sizeof *p);
    ASSERT_NOT_NULL(p);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / KV);
            for (int i = 0; i < T; i++) {
                double m = -INFINITY, z = 0.0;
                for (int j = 0; j < T; j++) {
                    double sc = 0.0;
                    for (int c = 0; c < d; c++)
                        sc += q[((long)b * T + i) * H * d + h * d + c] *
                              k[((long)b * T + j) * KV * d + g * d + c];
                    sc /= sqrt((double)d);
                    p[i * T + j] = (causal && j > i) ? -INFINITY : sc;
                    m = p[i * T + j] > m ? p[i * T + j] : m;
                }
                for (int j = 0; j < T; j++)
                    z += p[i * T + j] = exp(p[i * T + j] - m);
                if (lse)
                    lse[((long)b * H + h) * T + i] = m + log(z);
                for (int c = 0; c < d; c++) {
                    double o = 0.0;
                    for (int j = 0; j < T; j++)
                        o += p[i * T + j] / z *
                             v[((long)b * T + j) * KV * d + g * d + c];
                    out[((long)b * T + i) * H * d + h * d + c] = o;
                }
            }
        }
    free(p);
}

TEST_IMPL(kcpu_attention_forward_matches_naive)
{
    uint64_t s = 4;
    for (size_t c = 0; c < sizeof attn_shapes / sizeof attn_shapes[0]; c++) {
        int B = attn_shapes[c].B, T = attn_shapes[c].T, H = attn_shapes[c].H;
        int KV = attn_shapes[c].KV, d = attn_shapes[c].d;
        int causal = attn_shapes[c].causal;
        long nq = (long)B * T * H * d, nk = (long)B * T * KV * d;
        long nl = (long)B * H * T;
        float amp = attn_shapes[c].amp;
        float *q = fill(&s, nq, amp), *k = fill(&s, nk, amp);
        float *v = fill(&s, nk, 1.0f);
        float *out = filled(nq, 0.0f), *lse = filled(nl, 0.0f);
        double *qd = to_double(q, nq), *kd = to_double(k, nk);
        double *vd = to_double(v, nk);
        double *od = malloc((size_t)nq * sizeof *od);
        double *ld = malloc((size_t)nl * sizeof *ld);
        ASSERT_NOT_NULL(od);
        ASSERT_NOT_NULL(ld);
        kcpu_attention_forward(out, lse, q, k, v, B, T, H, KV, d, causal);
        naive_attention(od, ld, qd, kd, vd, B, T, H, KV, d, causal);
        for (long i = 0; i < nq; i++)
            ASSERT_CLOSE(out[i], od[i], 1e-5, 1e-6, i);
        for (long i = 0; i < nl; i++)
            ASSERT_CLOSE(lse[i], ld[i], 1e-5, 1e-6, i);
        free(q), free(k), free(v), free(out), free(lse);
        free(qd), free(kd), free(vd), free(od), free(ld);
    }
}

/* Scores far beyond exp's float range, growing along each row so the
 * online max moves at every key: still finite and right. */
TEST_IMPL(kcpu_attention_online_softmax_large_scores)
{
    enum { T = 6, d = 2 };
    float q[T * d], k[T * d], v[T * d], out[T * d], lse[T];
    double qd[T * d], kd[T * d], vd[T * d], od[T * d], ld[T];
    for (int t = 0; t < T; t++) {
        q[t * d] = 30.0f, q[t * d + 1] = -2.0f;
        k[t * d] = 10.0f * (float)t, k[t * d + 1] = (float)(t % 3);
        v[t * d] = (float)t, v[t * d + 1] = 1.0f - (float)t;
    }
    for (int i = 0; i < T * d; i++)
        qd[i] = q[i], kd[i] = k[i], vd[i] = v[i];
    kcpu_attention_forward(out, lse, q, k, v, 1, T, 1, 1, d, 1);
    naive_attention(od, ld, qd, kd, vd, 1, T, 1, 1, d, 1);
    for (int i = 0; i < T * d; i++)
        ASSERT_CLOSE(out[i], od[i], 1e-5, 1e-5, i);
    for (int i = 0; i < T; i++)
        ASSERT_CLOSE(lse[i], ld[i], 1e-5, 1e-4, i);
}

/* The same across tiles: T = 150 is three key tiles, and each new tile
 * holds a larger score, so every row's running max moves at each tile
 * edge and the output so far is rescaled (by factors that underflow to 0).
 * Causal and not; two runs give the same bits. */
TEST_IMPL(kcpu_attention_online_softmax_across_tiles)
{
    enum { T = 150, d = 2 };
    float q[T * d], k[T * d], v[T * d], out[T * d], lse[T], out2[T * d];
    float lse2[T];
    double qd[T * d], kd[T * d], vd[T * d], od[T * d], ld[T];
    for (int t = 0; t < T; t++) {
        q[t * d] = 30.0f, q[t * d + 1] = -2.0f;
        k[t * d] = 0.25f * (float)t, k[t * d + 1] = (float)(t % 3);
        v[t * d] = (float)(t % 7), v[t * d + 1] = 1.0f - (float)(t % 5);
    }
    for (int i = 0; i < T * d; i++)
        qd[i] = q[i], kd[i] = k[i], vd[i] = v[i];
    for (int causal = 0; causal <= 1; causal++) {
        kcpu_attention_forward(out, lse, q, k, v, 1, T, 1, 1, d, causal);
        kcpu_attention_forward(out2, lse2, q, k, v, 1, T, 1, 1, d, causal);
        naive_attention(od, ld, qd, kd, vd, 1, T, 1, 1, d, causal);
        for (int i = 0; i < T * d; i++) {
            ASSERT_CLOSE(out[i], od[i], 1e-5, 1e-5, i);
            ASSERT_INT_EQ(out2[i] == out[i], 1);
        }
        for (int i = 0; i < T; i++) {
            ASSERT_CLOSE(lse[i], ld[i], 1e-5, 1e-4, i);
            ASSERT_INT_EQ(lse2[i] == lse[i], 1);
        }
    }
}

/* L = sum(r * attention(q, k, v)) in double, for the finite differences. */
typedef struct attn_fd {
    double *q, *k, *v, *r, *out;
    int B, T, H, KV, d, causal;
} attn_fd;

static double attn_fd_loss(void *ctx)
{
    attn_fd *a = ctx;
    long n = (long)a->B * a->T * a->H * a->d;
    double L = 0.0;
    naive_attention(a->out, NULL, a->q, a->k, a->v, a->B, a->T, a->H, a->KV,
                    a->d, a->causal);
    for (long i = 0; i < n; i++)
        L += a->r[i] * a->out[i];
    return L;
}

TEST_IMPL(kcpu_attention_backward_matches_fd)
{
    uint64_t s = 5;
    for (size_t c = 0; c < sizeof attn_shapes / sizeof attn_shapes[0]; c++) {
        int B = attn_shapes[c].B, T = attn_shapes[c].T, H = attn_shapes[c].H;
        int KV = attn_shapes[c].KV, d = attn_shapes[c].d;
        int causal = attn_shapes[c].causal;
        long nq = (long)B * T * H * d, nk = (long)B * T * KV * d;
        float amp = attn_shapes[c].amp;
        float *q = fill(&s, nq, amp), *k = fill(&s, nk, amp);
        float *v = fill(&s, nk, 1.0f), *r = fill(&s, nq, 1.0f);
        float *out = filled(nq, 0.0f), *lse = filled((long)B * H * T, 0.0f);
        float *dq = filled(nq, 0.5f), *dk = filled(nk, 0.5f);
        float *dv = filled(nk, 0.5f);
        attn_fd a = {to_double(q, nq), to_double(k, nk), to_double(v, nk),
                     to_double(r, nq), malloc((size_t)nq * sizeof(double)),
                     B, T, H, KV, d, causal};
        ASSERT_NOT_NULL(a.out);
        kcpu_attention_forward(out, lse, q, k, v, B, T, H, KV, d, causal);
        kcpu_attention_backward(dq, dk, dv, r, out, lse, q, k, v, B, T, H, KV,
                                d, causal);
        /* past one tile, every 5th element: each difference costs T^2 */
        long step = T > 64 ? 5 : 1;
        for (long i = 0; i < nq; i += step)
            ASSERT_CLOSE(dq[i] - 0.5f, central(attn_fd_loss, &a, a.q, i),
                         1e-3, 1e-4, i);
        for (long i = 0; i < nk; i += step) {
            ASSERT_CLOSE(dk[i] - 0.5f, central(attn_fd_loss, &a, a.k, i),
                         1e-3, 1e-4, i);
            ASSERT_CLOSE(dv[i] - 0.5f, central(attn_fd_loss, &a, a.v, i),
                         1e-3, 1e-4, i);
        }
        free(q), free(k), free(v), free(r), free(out), free(lse);
        free(dq), free(dk), free(dv);
        free(a.q), free(a.k), free(a.v), free(a.r), free(a.out);
    }
}

/* The packed layout reads and writes the same numbers in place. */
static void attn_qkv_case(uint64_t s, int B, int T, int H, int KV, int d)
{
    int W = (H + 2 * KV) * d;
    long nq = (long)B * T * H * d, nk = (long)B * T * KV * d;
    long nl = (long)B * H * T, nx = (long)B * T * W;
    float *qkv = fill(&s, nx, 1.0f), *r = fill(&s, nq, 1.0f);
    float *q = filled(nq, 0.0f), *k = filled(nk, 0.0f), *v = filled(nk, 0.0f);
    float *o1 = filled(nq, 0.0f), *o2 = filled(nq, 0.0f);
    float *l1 = filled(nl, 0.0f), *l2 = filled(nl, 0.0f);
    float *dq = filled(nq, 0.0f), *dk = filled(nk, 0.0f);
    float *dv = filled(nk, 0.0f), *dqkv = filled(nx, 0.0f);
    for (long bt = 0; bt < (long)B * T; bt++) {
        memcpy(q + bt * H * d, qkv + bt * W, (size_t)H * d * sizeof(float));
        memcpy(k + bt * KV * d, qkv + bt * W + H * d,
               (size_t)KV * d * sizeof(float));
        memcpy(v + bt * KV * d, qkv + bt * W + (H + KV) * d,
               (size_t)KV * d * sizeof(float));
    }
    kcpu_attention_forward(o1, l1, q, k, v, B, T, H, KV, d, 1);
    kcpu_attention_qkv_forward(o2, l2, qkv, B, T, H, KV, d, 1);
    for (long i = 0; i < nq; i++)
        ASSERT_CLOSE(o2[i], o1[i], 0.0, 0.0, i);
    for (long i = 0; i < nl; i++)
        ASSERT_CLOSE(l2[i], l1[i], 0.0, 0.0, i);
    kcpu_attention_backward(dq, dk, dv, r, o1, l1, q, k, v, B, T, H, KV, d, 1);
    kcpu_attention_qkv_backward(dqkv, r, o2, l2, qkv, B, T, H, KV, d, 1);
    for (long bt = 0; bt < (long)B * T; bt++)
        for (int c = 0; c < W; c++) {
            float want = c < H * d ? dq[bt * H * d + c]
                         : c < (H + KV) * d
                             ? dk[bt * KV * d + c - H * d]
                             : dv[bt * KV * d + c - (H + KV) * d];
            ASSERT_CLOSE(dqkv[bt * W + c], want, 0.0, 0.0, bt * W + c);
        }
    free(qkv), free(r), free(q), free(k), free(v), free(o1), free(o2);
    free(l1), free(l2), free(dq), free(dk), free(dv), free(dqkv);
}

TEST_IMPL(kcpu_attention_qkv_matches_separate)
{
    attn_qkv_case(6, 2, 5, 4, 2, 3);
    attn_qkv_case(7, 2, 70, 4, 2, 3); /* two tiles of rows and keys */
}

/* ---- moe --------------------------------------------------------------- */

TEST_IMPL(kcpu_moe_capacity_formula)
{
    ASSERT_INT_EQ(kcpu_moe_capacity(8, 4, 1, 1.0), 2);
    ASSERT_INT_EQ(kcpu_moe_capacity(8, 4, 2, 1.25), 5);
    ASSERT_INT_EQ(kcpu_moe_capacity(9, 4, 2, 1.25), 6); /* 5.625 */
    ASSERT_INT_EQ(kcpu_moe_capacity(10, 1, 1, 1.1), 11);
    ASSERT_INT_EQ(kcpu_moe_capacity(3, 8, 1, 1.0), 1);
    ASSERT_INT_EQ(kcpu_moe_capacity(0, 8, 2, 1.0), 0);
}

/* Naive routing: softmax in double, top-k by sorting the experts. */
TEST_IMPL(kcpu_moe_route_matches_naive)
{
    enum { N = 7, D = 5, E = 4, K = 2 };
    uint64_t s = 7;
    float *x = fill(&s, N * D, 1.0f), *router = fill(&s, D * E, 1.0f);
    int C = kcpu_moe_capacity(N, E, K, 4.0);
    kcpu_moe_route *r = kcpu_moe_route_alloc(N, E, K, C);
    int count[E] = {0};
    ASSERT_NOT_NULL(r);
    ASSERT_INT_EQ(C, 14); /* 4.0 * 7 * 2 / 4 */
    kcpu_moe_route_forward(r, x, router, D);
    ASSERT_INT_EQ(r->dropped, 0);
    for (int n = 0; n < N; n++) {
        double z[E], p[E], m = -INFINITY, sum = 0.0, ksum = 0.0;
        int order[E];
        for (int e = 0; e < E; e++) {
            z[e] = 0.0;
            for (int c = 0; c < D; c++)
                z[e] += (double)x[n * D + c] * router[c * E + e];
            m = z[e] > m ? z[e] : m;
            order[e] = e;
        }
        for (int e = 0; e < E; e++)
            sum += p[e] = exp(z[e] - m);
        for (int e = 0; e < E; e++) {
            p[e] /= sum;
            ASSERT_CLOSE(r->probs[n * E + e], p[e], 1e-5, 1e-7, n * E + e);
        }
        for (int i = 0; i < E; i++) /* insertion sort, descending */
            for (int j = i; j > 0 && p[order[j]] > p[order[j - 1]]; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        for (int k = 0; k < K; k++)
            ksum += p[order[k]];
        for (int k = 0; k < K; k++) {
            int e = order[k];
            ASSERT_INT_EQ(r->expert[n * K + k], e);
            ASSERT_CLOSE(r->weight[n * K + k], p[e] / ksum, 1e-5, 1e-7, n);
            /* no drops: slots fill in token order */
            ASSERT_INT_EQ(r->slot[n * K + k], count[e]);
            ASSERT_INT_EQ(r->token[e * C + count[e]], n);
            count[e]++;
        }
    }
    for (int e = 0; e < E; e++) {
        ASSERT_INT_EQ(r->count[e], count[e]);
        ASSERT_INT_EQ(r->chosen[e], count[e]);
        for (int c = count[e]; c < C; c++)
            ASSERT_INT_EQ(r->token[e * C + c], -1);
    }
    kcpu_moe_route_free(r);
    kcpu_moe_route_free(NULL);
    free(x);
    free(router);
}

/* Equal probabilities go to the lower expert index. */
TEST_IMPL(kcpu_moe_route_ties_to_lower_expert)
{
    enum { N = 3, D = 2, E = 5, K = 3 };
    float x[N * D] = {1, 2, 3, 4, 5, 6}, router[D * E] = {0};
    kcpu_moe_route *r = kcpu_moe_route_alloc(N, E, K, N);
    ASSERT_NOT_NULL(r);
    router[0 * E + 4] = 1.0f; /* expert 4 leads; 0..3 tie behind it */
    router[1 * E + 4] = 1.0f;
    kcpu_moe_route_forward(r, x, router, D);
    for (int n = 0; n < N; n++) {
        ASSERT_INT_EQ(r->expert[n * K + 0], 4);
        ASSERT_INT_EQ(r->expert[n * K + 1], 0);
        ASSERT_INT_EQ(r->expert[n * K + 2], 1);
        ASSERT_CLOSE(r->weight[n * K + 1], r->weight[n * K + 2], 0.0, 0.0, n);
    }
    kcpu_moe_route_free(r);
}

/* Every token prefers expert 0, then 1: the first C tokens keep each. */
TEST_IMPL(kcpu_moe_capacity_drops_in_token_order)
{
    enum { N = 8, D = 1, E = 4 };
    float x[N], router[D * E] = {3.0f, 2.0f, 1.0f, 0.0f};
    for (int n = 0; n < N; n++)
        x[n] = 1.0f + 0.01f * (float)n;
    for (int K = 1; K <= 2; K++) {
        int C = kcpu_moe_capacity(N, E, K, 1.0);
        kcpu_moe_route *r = kcpu_moe_route_alloc(N, E, K, C);
        float xe[E * 4 * D], y[N * D];
        ASSERT_NOT_NULL(r);
        ASSERT_INT_EQ(C, 2 * K);
        kcpu_moe_route_forward(r, x, router, D);
        ASSERT_INT_EQ(r->dropped, (N - C) * K);
        ASSERT_INT_EQ(r->chosen[0], N);
        ASSERT_INT_EQ(r->count[0], C);
        ASSERT_INT_EQ(r->count[2], 0);
        ASSERT_INT_EQ(r->count[3], 0);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                ASSERT_INT_EQ(r->expert[n * K + k], k);
                ASSERT_INT_EQ(r->slot[n * K + k], n < C ? n : -1);
            }
        for (int e = 0; e < K; e++)
            for (int c = 0; c < C; c++)
                ASSERT_INT_EQ(r->token[e * C + c], c);
        /* dispatch gathers the kept tokens; dropped ones combine to zero */
        kcpu_moe_dispatch_forward(xe, x, r, D);
        for (int c = 0; c < C; c++)
            ASSERT_CLOSE(xe[c], x[c], 0.0, 0.0, c);
        ASSERT_CLOSE(xe[2 * C], 0.0f, 0.0, 0.0, 2 * C);
        kcpu_moe_combine_forward(y, xe, r, D);
        for (int n = 0; n < N; n++) {
            float want = 0.0f;
            for (int k = 0; k < K && n < C; k++)
                want += r->weight[n * K + k] * x[n];
            ASSERT_CLOSE(y[n], want, 1e-6, 0.0, n);
        }
        kcpu_moe_route_free(r);
    }
}

/* Three tokens, two experts, top-1: logits (ln3, 0), (2 ln3, 0), (-ln3, 0)
 * give p0 = 3/4, 9/10, 1/4; f = (2/3, 1/3), P = (1.9/3, 1.1/3), so
 * aux = 2 (2/3 * 1.9/3 + 1/3 * 1.1/3) = 9.8/9. */
TEST_IMPL(kcpu_moe_aux_loss_by_hand)
{
    enum { N = 3, D = 1, E = 2 };
    float x[N] = {1.0f, 2.0f, -1.0f}, router[E] = {(float)log(3.0), 0.0f};
    kcpu_moe_route *r = kcpu_moe_route_alloc(N, E, 1, N);
    ASSERT_NOT_NULL(r);
    kcpu_moe_route_forward(r, x, router, D);
    ASSERT_CLOSE(r->probs[0], 0.75, 1e-6, 0.0, 0);
    ASSERT_CLOSE(r->probs[2], 0.9, 1e-6, 0.0, 2);
    ASSERT_CLOSE(r->probs[4], 0.25, 1e-6, 0.0, 4);
    ASSERT_INT_EQ(r->chosen[0], 2);
    ASSERT_INT_EQ(r->chosen[1], 1);
    ASSERT_CLOSE(r->weight[0], 1.0, 0.0, 0.0, 0);
    ASSERT_CLOSE(r->aux, 9.8 / 9.0, 1e-6, 0.0, 0);
    kcpu_moe_route_free(r);
}

/* The whole layer in double with the routing (experts, slots, f) fixed:
 * L = sum(ry * moe(x)) + coef * aux. */
typedef struct moe_fd {
    const kcpu_moe_route *r;
    double *x, *router, *wg, *wu, *wd, *ry, *y;
    double coef;
    int D, F;
} moe_fd;

static double moe_fd_loss(void *ctx)
{
    moe_fd *m = ctx;
    const kcpu_moe_route *r = m->r;
    int N = r->N, E = r->E, K = r->K, D = m->D, F = m->F;
    double L = 0.0, aux = 0.0, P[16] = {0};
    for (int n = 0; n < N; n++) {
        double z[16], p[16], mx = -INFINITY, sum = 0.0, ksum = 0.0;
        for (int e = 0; e < E; e++) {
            z[e] = 0.0;
            for (int c = 0; c < D; c++)
                z[e] += m->x[n * D + c] * m->router[c * E + e];
            mx = z[e] > mx ? z[e] : mx;
        }
        for (int e = 0; e < E; e++)
            sum += p[e] = exp(z[e] - mx);
        for (int e = 0; e < E; e++)
            P[e] += p[e] / sum / N;
        for (int k = 0; k < K; k++)
            ksum += p[r->expert[n * K + k]];
        for (int c = 0; c < D; c++)
            m->y[n * D + c] = 0.0;
        for (int k = 0; k < K; k++) {
            int e = r->expert[n * K + k];
            double w = p[e] / ksum;
            if (r->slot[n * K + k] < 0)
                continue;
            for (int f = 0; f < F; f++) {
                double g = 0.0, u = 0.0, a;
                for (int c = 0; c < D; c++) {
                    g += m->x[n * D + c] * m->wg[((long)e * D + c) * F + f];
                    u += m->x[n * D + c] * m->wu[((long)e * D + c) * F + f];
                }
                a = g / (1.0 + exp(-g)) * u;
                for (int c = 0; c < D; c++)
                    m->y[n * D + c] += w * a * m->wd[((long)e * F + f) * D + c];
            }
        }
    }
    for (int e = 0; e < E; e++)
        aux += (double)r->chosen[e] / ((double)N * K) * P[e];
    for (long i = 0; i < (long)N * D; i++)
        L += m->ry[i] * m->y[i];
    return L + m->coef * E * aux;
}

/* One layer's forward and backward against moe_fd_loss; ry_amp 0 leaves
 * the aux loss alone in L, so its gradient is checked by itself (top-1, so
 * that the choices are unbalanced and the gradient is not zero). */
static void moe_layer_check(int K, float coef, float ry_amp, double atol)
{
    enum { N = 6, D = 4, E = 3, F = 5 };
    uint64_t s = 8;
    int C = kcpu_moe_capacity(N, E, K, 0.75);
    long nx = N * D, nr = D * E, nw = (long)E * D * F, nb = (long)E * C * D;
    long nh = (long)E * C * F;
    float *x = fill(&s, nx, 1.0f), *router = fill(&s, nr, 1.5f);
    float *wg = fill(&s, nw, 1.0f), *wu = fill(&s, nw, 1.0f);
    float *wd = fill(&s, nw, 1.0f), *ry = fill(&s, nx, ry_amp);
    float *xe = filled(nb, 0.0f), *ye = filled(nb, 0.0f), *y = filled(nx, 0.0f);
    float *hg = filled(nh, 0.0f), *hu = filled(nh, 0.0f);
    float *act = filled(nh, 0.0f), *scratch = filled(2L * C * F + N * E, 0.0f);
    float *dxe = filled(nb, 0.0f), *dye = filled(nb, 0.0f);
    float *dweight = filled(N * K, 0.0f), *dx = filled(nx, 0.5f);
    float *drouter = filled(nr, 0.5f), *dwg = filled(nw, 0.5f);
    float *dwu = filled(nw, 0.5f), *dwd = filled(nw, 0.5f);
    kcpu_moe_route *r = kcpu_moe_route_alloc(N, E, K, C);
    ASSERT_NOT_NULL(r);
    ASSERT_INT_EQ(C, K == 2 ? 3 : 2); /* ceil(0.75 * 6 * K / 3) */

    kcpu_moe_route_forward(r, x, router, D);
    kcpu_moe_dispatch_forward(xe, x, r, D);
    kcpu_moe_expert_forward(ye, hg, hu, act, xe, wg, wu, wd, r->count, E, C,
                            D, F);
    kcpu_moe_combine_forward(y, ye, r, D);
    ASSERT_INT_GE(r->dropped, 1); /* the test covers dropped pairs */

    kcpu_moe_combine_backward(dye, dweight, ry, ye, r, D);
    kcpu_moe_expert_backward(dxe, dwg, dwu, dwd, scratch, dye, hg, hu, act, xe,
                             wg, wu, wd, r->count, E, C, D, F);
    kcpu_moe_dispatch_backward(dx, dxe, r, D);
    kcpu_moe_route_backward(dx, drouter, scratch, dweight, coef, r, x, router,
                            D);

    moe_fd m = {r, to_double(x, nx), to_double(router, nr), to_double(wg, nw),
                to_double(wu, nw), to_double(wd, nw), to_double(ry, nx),
                malloc((size_t)nx * sizeof(double)), coef, D, F};
    ASSERT_NOT_NULL(m.y);
    moe_fd_loss(&m); /* the forward in double */
    for (long i = 0; i < nx; i++)
        ASSERT_CLOSE(y[i], m.y[i], 1e-5, 1e-6, i);
    double big = 0.0; /* the gradient is not vanishingly small */
    for (long i = 0; i < nx; i++)
        big = fabs(dx[i] - 0.5f) > big ? fabs(dx[i] - 0.5f) : big;
    ASSERT_INT_GE((int)(big / (100 * atol)), 1);
    for (long i = 0; i < nx; i++)
        ASSERT_CLOSE(dx[i] - 0.5f, central(moe_fd_loss, &m, m.x, i), 1e-3,
                     atol, i);
    for (long i = 0; i < nr; i++)
        ASSERT_CLOSE(drouter[i] - 0.5f, central(moe_fd_loss, &m, m.router, i),
                     1e-3, atol, i);
    for (long i = 0; i < nw; i++) {
        ASSERT_CLOSE(dwg[i] - 0.5f, central(moe_fd_loss, &m, m.wg, i), 1e-3,
                     atol, i);
        ASSERT_CLOSE(dwu[i] - 0.5f, central(moe_fd_loss, &m, m.wu, i), 1e-3,
                     atol, i);
        ASSERT_CLOSE(dwd[i] - 0.5f, central(moe_fd_loss, &m, m.wd, i), 1e-3,
                     atol, i);
    }
    kcpu_moe_route_free(r);
    free(x), free(router), free(wg), free(wu), free(wd), free(ry);
    free(xe), free(ye), free(y), free(hg), free(hu), free(act), free(scratch);
    free(dxe), free(dye), free(dweight), free(dx), free(drouter);
    free(dwg), free(dwu), free(dwd);
    free(m.x), free(m.router), free(m.wg), free(m.wu), free(m.wd), free(m.ry);
    free(m.y);
}

TEST_IMPL(kcpu_moe_layer_backward_matches_fd)
{
    moe_layer_check(2, 0.1f, 1.0f, 1e-4);
    moe_layer_check(1, 1.0f, 0.0f, 1e-6); /* the aux loss alone */
}
