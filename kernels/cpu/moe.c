/* moe.c — mixture of experts: top-k softmax routing with capacity, dispatch
 * into per-expert buffers, SwiGLU experts (kcpu__gemm per expert) and the
 * weighted combine. The routing rules are written out in kcpu_moe.h. */
#include <limits.h> /* defines: INT_MAX */
#include <math.h>   /* defines: ceil, expf */
#include <stdlib.h> /* defines: malloc, free */
#include <string.h> /* defines: memset, memcpy */

#include "kcpu_moe.h"

#include "kcpu_gemm_impl.h" /* defines: kcpu__gemm */

int kcpu_moe_capacity(int N, int E, int K, double capacity_factor)
{
    double c = capacity_factor * N * K / E;
    double up = ceil(c - 1e-9 * c);
    if (N > 0 && up < 1.0)
        up = 1.0;
    return up > INT_MAX ? INT_MAX : (int)up;
}

/* Round a byte count up to a multiple of 16, for the arrays that follow. */
static size_t moe_align(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Offsets of the routing arrays from the start of their memory. */
typedef struct moe_layout {
    size_t expert, weight, slot, token, count, chosen, probs, total;
} moe_layout;

static int moe_layout_of(moe_layout *l, int N, int E, int K, int C)
{
    if (N < 0 || E < 1 || K < 1 || K > E || C < 0 || N > (1 << 24) ||
        E > (1 << 16) || (long)E * C > (1L << 28))
        return -1;
    size_t nk = (size_t)N * K, ec = (size_t)E * C, ne = (size_t)N * E;
    l->expert = 0;
    l->weight = l->expert + moe_align(nk * sizeof(int));
    l->slot = l->weight + moe_align(nk * sizeof(float));
    l->token = l->slot + moe_align(nk * sizeof(int));
    l->count = l->token + moe_align(ec * sizeof(int));
    l->chosen = l->count + moe_align((size_t)E * sizeof(int));
    l->probs = l->chosen + moe_align((size_t)E * sizeof(int));
    l->total = l->probs + moe_align(ne * sizeof(float));
    return 0;
}

size_t kcpu_moe_route_bytes(int N, int E, int K, int C)
{
    moe_layout l;
    return moe_layout_of(&l, N, E, K, C) == 0 ? l.total : 0;
}

int kcpu_moe_route_bind(kcpu_moe_route *r, void *mem, int N, int E, int K, int C)
{
    moe_layout l;
    if (moe_layout_of(&l, N, E, K, C) != 0)
        return -1;
    char *m = mem;
    r->N = N;
    r->E = E;
    r->K = K;
    r->C = C;
    r->expert = (int *)(void *)(m + l.expert);
    r->weight = (float *)(void *)(m + l.weight);
    r->slot = (int *)(void *)(m + l.slot);
    r->token = (int *)(void *)(m + l.token);
    r->count = (int *)(void *)(m + l.count);
    r->chosen = (int *)(void *)(m + l.chosen);
    r->probs = (float *)(void *)(m + l.probs);
    return 0;
}

kcpu_moe_route *kcpu_moe_route_alloc(int N, int E, int K, int C)
{
    moe_layout l;
    if (moe_layout_of(&l, N, E, K, C) != 0)
        return NULL;
    size_t head = moe_align(sizeof(kcpu_moe_route));
    char *m = calloc(1, head + l.total);
    if (!m)
        return NULL;
    kcpu_moe_route *r = (kcpu_moe_route *)(void *)m;
    if (kcpu_moe_route_bind(r, m + head, N, E, K, C) != 0) {
        free(m);
        return NULL;
    }
    return r;
}

void kcpu_moe_route_free(kcpu_moe_route *r)
{
    free(r);
}

/* probs[n] = softmax(logits[n]) over E, in place. */
static void moe_softmax_rows(float *p, int N, int E)
{
    for (int n = 0; n < N; n++) {
        float *row = p + (long)n * E, m = row[0], s = 0.0f;
        for (int e = 1; e < E; e++)
            m = row[e] > m ? row[e] : m;
        for (int e = 0; e < E; e++) {
            row[e] = expf(row[e] - m);
            s += row[e];
        }
        for (int e = 0; e < E; e++)
            row[e] /= s;
    }
}

/* The K largest of p[0..E-1], largest first, ties to the lower index:
 * K passes of an arg-max over the experts not yet taken. */
static void moe_top_k(int *out, const float *p, int E, int K)
{
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < k; i++)
                taken |= out[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        out[k] = best;
    }
}

void kcpu_moe_route_forward(kcpu_moe_route *r, const float *x,
                            const float *router, int D)
{
    int N = r->N, E = r->E, K = r->K, C = r->C;
    if (N > 0)
        kcpu__gemm(0, 0, N, E, D, 1.0f, x, D, router, E, 0.0f, r->probs, E);
    moe_softmax_rows(r->probs, N, E);
    for (long i = 0; i < (long)E * C; i++)
        r->token[i] = -1;
    memset(r->count, 0, (size_t)E * sizeof(int));
    memset(r->chosen, 0, (size_t)E * sizeof(int));
    r->dropped = 0;
    for (int n = 0; n < N; n++) {
        const float *p = r->probs + (long)n * E;
        int *ex = r->expert + (long)n * K;
        float sum = 0.0f;
        moe_top_k(ex, p, E, K);
        for (int k = 0; k < K; k++)
            sum += p[ex[k]];
        for (int k = 0; k < K; k++) {
            int e = ex[k];
            long nk = (long)n * K + k;
            r->weight[nk] = p[e] / sum;
            r->chosen[e]++;
            if (r->count[e] < C) {
                r->slot[nk] = r->count[e];
                r->token[(long)e * C + r->count[e]++] = n;
            } else {
                r->slot[nk] = -1;
                r->dropped++;
            }
        }
    }
    /* aux = E * sum_e f_e P_e, f_e = chosen_e / (N K), P_e = mean_n p[n,e] */
    double aux = 0.0;
    for (int e = 0; e < E && N > 0; e++) {
        double P = 0.0;
        for (int n = 0; n < N; n++)
            P += r->probs[(long)n * E + e];
        aux += (double)r->chosen[e] / ((double)N * K) * (P / N);
    }
    r->aux = (float)(aux * E);
}

void kcpu_moe_route_backward(float *dx, float *drouter, float *scratch,
                             const float *dweight, float aux_coef,
                             const kcpu_moe_route *r, const float *x,
                             const float *router, int D)
{
    int N = r->N, E = r->E, K = r->K;
    if (N == 0)
        return;
    for (int n = 0; n < N; n++) {
        float *dz = scratch + (long)n * E;
        const float *p = r->probs + (long)n * E;
        const int *ex = r->expert + (long)n * K;
        const float *w = r->weight + (long)n * K;
        const float *dw = dweight + (long)n * K;
        memset(dz, 0, (size_t)E * sizeof(float));
        /* w = softmax over the chosen logits: dz_k = w_k (dw_k - w . dw) */
        float wdw = 0.0f;
        for (int k = 0; k < K; k++)
            wdw += w[k] * dw[k];
        for (int k = 0; k < K; k++)
            dz[ex[k]] += w[k] * (dw[k] - wdw);
        /* aux: d/dp[n,e] = coef * E f_e / N, then back through softmax */
        if (aux_coef != 0.0f) {
            float pg = 0.0f;
            for (int e = 0; e < E; e++)
                pg += p[e] * ((float)r->chosen[e] / ((float)N * K));
            for (int e = 0; e < E; e++) {
                float f = (float)r->chosen[e] / ((float)N * K);
                dz[e] += aux_coef * (float)E / (float)N * p[e] * (f - pg);
            }
        }
    }
    /* logits = x @ router: drouter += x^T dz, dx += dz router^T */
    kcpu__gemm(1, 0, D, E, N, 1.0f, x, D, scratch, E, 1.0f, drouter, E);
    kcpu__gemm(0, 1, N, D, E, 1.0f, scratch, E, router, E, 1.0f, dx, D);
}

void kcpu_moe_dispatch_forward(float *xe, const float *x,
                               const kcpu_moe_route *r, int D)
{
    for (long i = 0; i < (long)r->E * r->C; i++) {
        float *row = xe + i * D;
        if (r->token[i] < 0)
            memset(row, 0, (size_t)D * sizeof(float));
        else
            memcpy(row, x + (long)r->token[i] * D, (size_t)D * sizeof(float));
    }
}

void kcpu_moe_dispatch_backward(float *dx, const float *dxe,
                                const kcpu_moe_route *r, int D)
{
    for (long i = 0; i < (long)r->E * r->C; i++) {
        if (r->token[i] < 0)
            continue;
        float *g = dx + (long)r->token[i] * D;
        for (int c = 0; c < D; c++)
            g[c] += dxe[i * D + c];
    }
}

void kcpu_moe_combine_forward(float *y, const float *ye,
                              const kcpu_moe_route *r, int D)
{
    memset(y, 0, (size_t)r->N * D * sizeof(float));
    for (long nk = 0; nk < (long)r->N * r->K; nk++) {
        if (r->slot[nk] < 0)
            continue;
        const float *src =
            ye + ((long)r->expert[nk] * r->C + r->slot[nk]) * D;
        float *dst = y + nk / r->K * D, w = r->weight[nk];
        for (int c = 0; c < D; c++)
            dst[c] += w * src[c];
    }
}

void kcpu_moe_combine_backward(float *dye, float *dweight, const float *dy,
                               const float *ye, const kcpu_moe_route *r, int D)
{
    for (long nk = 0; nk < (long)r->N * r->K; nk++) {
        if (r->slot[nk] < 0)
            continue;
        long row = ((long)r->expert[nk] * r->C + r->slot[nk]) * D;
        const float *g = dy + nk / r->K * D;
        float w = r->weight[nk], s = 0.0f;
        for (int c = 0; c < D; c++) {
            dye[row + c] += w * g[c];
            s += g[c] * ye[row + c];
        }
        dweight[nk] += s;
    }
}

static float moe_sigmoid(float z)
{
    return 1.0f / (1.0f + expf(-z));
}

void kcpu_moe_expert_forward(float *ye, float *hg, float *hu, float *act,
                             const float *xe, const float *w_gate,
                             const float *w_up, const float *w_down,
                             const int *count, int E, int C, int D, int F)
{
    memset(ye, 0, (size_t)E * C * D * sizeof(float));
    for (int e = 0; e < E; e++) {
        int M = count[e];
        long xo = (long)e * C * D, ho = (long)e * C * F;
        long wo = (long)e * D * F; /* same for w_down's [F, D] */
        if (M == 0)
            continue;
        kcpu__gemm(0, 0, M, F, D, 1.0f, xe + xo, D, w_gate + wo, F, 0.0f, hg + ho, F);
        kcpu__gemm(0, 0, M, F, D, 1.0f, xe + xo, D, w_up + wo, F, 0.0f, hu + ho, F);
        for (long i = 0; i < (long)M * F; i++) {
            float g = hg[ho + i];
            act[ho + i] = g * moe_sigmoid(g) * hu[ho + i];
        }
        kcpu__gemm(0, 0, M, D, F, 1.0f, act + ho, F, w_down + wo, D, 0.0f, ye + xo, D);
    }
}

void kcpu_moe_expert_backward(float *dxe, float *dw_gate, float *dw_up,
                              float *dw_down, float *scratch,
                              const float *dye, const float *hg,
                              const float *hu, const float *act,
                              const float *xe, const float *w_gate,
                              const float *w_up, const float *w_down,
                              const int *count, int E, int C, int D, int F)
{
    float *dg = scratch, *du = scratch + (long)C * F;
    for (int e = 0; e < E; e++) {
        int M = count[e];
        long xo = (long)e * C * D, ho = (long)e * C * F, wo = (long)e * D * F;
        if (M == 0)
            continue;
        /* ye = act @ w_down: dw_down += act^T dye, d act = dye w_down^T */
        kcpu__gemm(1, 0, F, D, M, 1.0f, act + ho, F, dye + xo, D, 1.0f, dw_down + wo, D);
        kcpu__gemm(0, 1, M, F, D, 1.0f, dye + xo, D, w_down + wo, D, 0.0f, du, F);
        /* act = silu(hg) hu; silu'(g) = s (1 + g (1 - s)) */
        for (long i = 0; i < (long)M * F; i++) {
            float g = hg[ho + i], s = moe_sigmoid(g);
            dg[i] = du[i] * hu[ho + i] * s * (1.0f + g * (1.0f - s));
            du[i] *= g * s;
        }
        /* hg = xe w_gate, hu = xe w_up */
        kcpu__gemm(1, 0, D, F, M, 1.0f, xe + xo, D, dg, F, 1.0f, dw_gate + wo, F);
        kcpu__gemm(1, 0, D, F, M, 1.0f, xe + xo, D, du, F, 1.0f, dw_up + wo, F);
        kcpu__gemm(0, 1, M, D, F, 1.0f, dg, F, w_gate + wo, F, 1.0f, dxe + xo, D);
        kcpu__gemm(0, 1, M, D, F, 1.0f, du, F, w_up + wo, F, 1.0f, dxe + xo, D);
    }
}
