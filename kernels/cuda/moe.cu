/* moe.cu — mixture of experts on the GPU, following moe.c's rules
 * (kcpu_moe.h): top-k softmax routing with first-come-first-served
 * capacity, dispatch into per-expert buffers, SwiGLU experts as batched
 * cuBLASLt products, and the weighted combine.
 *
 *  - route: the router product through cuBLASLt into probs; one thread per
 *    token for the softmax and the top-k (the CPU's loops, operation for
 *    operation: ties go to the lower expert); one block per expert for the
 *    capacity, a block-wide scan over the tokens in index order, so each
 *    expert's buffer holds its tokens in index order, as on the CPU.
 *  - dispatch/combine: one thread per (row, column); a token's rows are
 *    gathered, never scattered, so no two threads write one element.
 */
#include <string.h> /* defines: memset */

#include "kcuda_impl.h"

#define MOE_SCAN_THREADS 1024

/* ---- the routing arrays ------------------------------------------------- */

typedef struct moe_layout {
    size_t expert, weight, slot, token, count, chosen, probs, pmean, dropped,
        aux, total;
} moe_layout;

static int moe_layout_of(moe_layout *l, int N, int E, int K, int C)
{
    if (N < 0 || E < 1 || K < 1 || K > E || C < 0 || N > (1 << 24) ||
        E > (1 << 16) || (long)E * C > (1L << 28))
        return -1;
    size_t nk = (size_t)N * K, ec = (size_t)E * C, ne = (size_t)N * E;
    l->expert = 0;
    l->weight = l->expert + kcuda__round256(nk * sizeof(int));
    l->slot = l->weight + kcuda__round256(nk * sizeof(float));
    l->token = l->slot + kcuda__round256(nk * sizeof(int));
    l->count = l->token + kcuda__round256(ec * sizeof(int));
    l->chosen = l->count + kcuda__round256((size_t)E * sizeof(int));
    l->probs = l->chosen + kcuda__round256((size_t)E * sizeof(int));
    l->pmean = l->probs + kcuda__round256(ne * sizeof(float));
    l->dropped = l->pmean + kcuda__round256((size_t)E * sizeof(double));
    l->aux = l->dropped + 256;
    l->total = l->aux + 256;
    return 0;
}

size_t kcuda_moe_route_bytes(int N, int E, int K, int C)
{
    moe_layout l;
    return moe_layout_of(&l, N, E, K, C) == 0 ? l.total : 0;
}

int kcuda_moe_route_bind(kcuda_moe_route *r, void *mem, int N, int E, int K,
                         int C)
{
    moe_layout l;
    KCUDA_ARG(r != NULL && mem != NULL, "moe_route_bind: NULL argument");
    KCUDA_ARG(moe_layout_of(&l, N, E, K, C) == 0,
              "moe_route_bind: sizes out of range N=%d E=%d K=%d C=%d", N, E,
              K, C);
    char *m = (char *)mem;
    r->N = N;
    r->E = E;
    r->K = K;
    r->C = C;
    r->expert = (int *)(m + l.expert);
    r->weight = (float *)(m + l.weight);
    r->slot = (int *)(m + l.slot);
    r->token = (int *)(m + l.token);
    r->count = (int *)(m + l.count);
    r->chosen = (int *)(m + l.chosen);
    r->probs = (float *)(m + l.probs);
    r->pmean = (double *)(m + l.pmean);
    r->dropped = (int *)(m + l.dropped);
    r->aux = (float *)(m + l.aux);
    return 0;
}

/* ---- routing forward ---------------------------------------------------- */

/* One thread per token: probs[n] = softmax(logits[n]) in place, then the
 * K largest, largest first, ties to the lower index, and their
 * renormalised weights: moe.c's loops. */
__global__ void moe_token_kernel(float *probs, int *expert, float *weight,
                                 int N, int E, int K)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    float *row = probs + (size_t)n * E, m = row[0], s = 0.0f;
    for (int e = 1; e < E; e++)
        m = row[e] > m ? row[e] : m;
    for (int e = 0; e < E; e++) {
        row[e] = expf(row[e] - m);
        s += row[e];
    }
    for (int e = 0; e < E; e++)
        row[e] /= s;
    int *ex = expert + (size_t)n * K;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < k; i++)
                taken |= ex[i] == e;
            if (!taken && (best < 0 || row[e] > row[best]))
                best = e;
        }
        ex[k] = best;
    }
    float sum = 0.0f;
    for (int k = 0; k < K; k++)
        sum += row[ex[k]];
    for (int k = 0; k < K; k++)
        weight[(size_t)n * K + k] = row[ex[k]] / sum;
}

/* Exclusive scan of v over the block (MOE_SCAN_THREADS); *total gets the
 * sum. sh: 32 ints. */
__device__ int block_exclusive_scan(int v, int *sh, int *total)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    __syncthreads();
    if (lane == 31)
        sh[w] = x;
    __syncthreads();
    if (w == 0) {
        int t = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o)
                t += y;
        }
        sh[lane] = t; /* inclusive over warps */
    }
    __syncthreads();
    int before = w > 0 ? sh[w - 1] : 0;
    *total = sh[(blockDim.x >> 5) - 1];
    return before + x - v;
}

/* One block per expert e: walk the tokens in index order; the ones that
 * chose e take slots 0, 1, ... while they last (first come, first served).
 * Also pmean[e], the mean over tokens of probs[., e] (in double). */
__global__ void __launch_bounds__(MOE_SCAN_THREADS)
    moe_slots_kernel(int *slot, int *token, int *count, int *chosen,
                     double *pmean, const int *expert, const float *probs,
                     int N, int E, int K, int C)
{
    __shared__ int sh[32];
    __shared__ double shd[32];
    int e = blockIdx.x, running = 0;
    double P = 0.0;
    for (int base = 0; base < N; base += blockDim.x) {
        int n = base + threadIdx.x, kidx = -1;
        if (n < N) {
            for (int k = 0; k < K; k++)
                if (expert[(size_t)n * K + k] == e)
                    kidx = k;
            P += probs[(size_t)n * E + e];
        }
        int total;
        int pos = running + block_exclusive_scan(kidx >= 0, sh, &total);
        if (kidx >= 0) {
            size_t nk = (size_t)n * K + kidx;
            if (pos < C) {
                slot[nk] = pos;
                token[(size_t)e * C + pos] = n;
            } else {
                slot[nk] = -1;
            }
        }
        running += total;
        __syncthreads(); /* sh is reused by the next chunk's scan */
    }
    P = kc_block_sum_d(P, shd);
    if (threadIdx.x == 0) {
        count[e] = running < C ? running : C;
        chosen[e] = running;
        pmean[e] = N > 0 ? P / N : 0.0;
    }
}

/* dropped = sum of (chosen - count); aux = E sum_e f_e P_e, f_e =
 * chosen_e / (N K), in double as on the CPU. */
__global__ void moe_aux_kernel(int *dropped, float *aux, const int *chosen,
                               const int *count, const double *pmean, int N,
                               int E, int K)
{
    int d = 0;
    double a = 0.0;
    for (int e = 0; e < E; e++) {
        d += chosen[e] - count[e];
        if (N > 0)
            a += (double)chosen[e] / ((double)N * K) * pmean[e];
    }
    *dropped = d;
    *aux = (float)(a * E);
}

int kcuda_moe_route_forward(kcuda_ctx *ctx, kcuda_moe_route *r,
                            const float *x, const float *router, int D,
                            void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_ARG(r != NULL && D > 0, "moe_route_forward: bad arguments");
    int N = r->N, E = r->E, K = r->K, C = r->C;
    KCUDA_CHECK(cudaMemsetAsync(r->token, 0xff, (size_t)E * C * sizeof(int), s));
    if (N > 0) { /* probs[N,E] = x[N,D] @ router[D,E] */
        kcuda__gemm g;
        memset(&g, 0, sizeof g);
        g.M = N, g.N = E, g.K = D;
        g.A = x, g.lda = D;
        g.B = router, g.ldb = E;
        g.C = r->probs, g.ldc = E;
        g.batch = 1;
        g.dt = KCUDA_F32;
        KCUDA_TRY(kcuda__gemm_run(ctx, &g, s));
        moe_token_kernel<<<(N + 127) / 128, 128, 0, s>>>(r->probs, r->expert,
                                                         r->weight, N, E, K);
        KCUDA_LAUNCHED("moe_token_kernel");
    }
    moe_slots_kernel<<<E, MOE_SCAN_THREADS, 0, s>>>(
        r->slot, r->token, r->count, r->chosen, r->pmean, r->expert, r->probs,
        N, E, K, C);
    KCUDA_LAUNCHED("moe_slots_kernel");
    moe_aux_kernel<<<1, 1, 0, s>>>(r->dropped, r->aux, r->chosen, r->count,
                                   r->pmean, N, E, K);
    KCUDA_LAUNCHED("moe_aux_kernel");
    return 0;
}

/* ---- routing backward --------------------------------------------------- */

/* One thread per token: dz[n] (the gradient of the router logits), moe.c's
 * arithmetic: through the renormalised weights (a softmax over the chosen
 * logits) and, with aux_coef, the aux loss through the full softmax. */
__global__ void moe_dz_kernel(float *scratch, const float *dweight,
                              float aux_coef, const float *probs,
                              const int *expert, const float *weight,
                              const int *chosen, int N, int E, int K)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    float *dz = scratch + (size_t)n * E;
    const float *p = probs + (size_t)n * E;
    const int *ex = expert + (size_t)n * K;
    const float *w = weight + (size_t)n * K, *dw = dweight + (size_t)n * K;
    for (int e = 0; e < E; e++)
        dz[e] = 0.0f;
    float wdw = 0.0f;
    for (int k = 0; k < K; k++)
        wdw += w[k] * dw[k];
    for (int k = 0; k < K; k++)
        dz[ex[k]] += w[k] * (dw[k] - wdw);
    if (aux_coef != 0.0f) {
        float pg = 0.0f;
        for (int e = 0; e < E; e++)
            pg += p[e] * ((float)chosen[e] / ((float)N * K));
        for (int e = 0; e < E; e++) {
            float f = (float)chosen[e] / ((float)N * K);
            dz[e] += aux_coef * (float)E / (float)N * p[e] * (f - pg);
        }
    }
}

int kcuda_moe_route_backward(kcuda_ctx *ctx, float *dx, float *drouter,
                             float *scratch, const float *dweight,
                             float aux_coef, const kcuda_moe_route *r,
                             const float *x, const float *router, int D,
                             void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_ARG(r != NULL && D > 0, "moe_route_backward: bad arguments");
    int N = r->N, E = r->E, K = r->K;
    if (N == 0)
        return 0;
    moe_dz_kernel<<<(N + 127) / 128, 128, 0, s>>>(scratch, dweight, aux_coef,
                                                  r->probs, r->expert,
                                                  r->weight, r->chosen, N, E,
                                                  K);
    KCUDA_LAUNCHED("moe_dz_kernel");
    /* logits = x @ router: drouter += x^T dz, dx += dz router^T */
    return kcuda_matmul_backward(ctx, dx, drouter, NULL, scratch, x, router, N,
                                 D, E, KCUDA_F32, KCUDA_F32, 0, stream);
}

/* ---- dispatch and combine ----------------------------------------------- */

/* xe[e, c, :] = x[token[e, c], :], zeros where the slot is empty. */
template <typename T>
__global__ void moe_dispatch_kernel(T *xe, const T *x, const int *token,
                                    size_t n, int D)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        size_t row = i / (size_t)D;
        int c = (int)(i % (size_t)D), t = token[row];
        xe[i] = t < 0 ? kc_to<T>(0.0f) : x[(size_t)t * D + c];
    }
}

/* dx[n, c] += dxe rows of token n's kept experts, in ascending expert
 * order (moe.c walks the buffers in order). */
template <typename T>
__global__ void moe_dispatch_bwd_kernel(T *dx, const T *dxe, const int *expert,
                                        const int *slot, int N, int K, int C,
                                        int D)
{
    size_t n_all = (size_t)N * D, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all;
         i += stride) {
        int n = (int)(i / (size_t)D), c = (int)(i % (size_t)D);
        const int *ex = expert + (size_t)n * K, *sl = slot + (size_t)n * K;
        float acc = kc_f(dx[i]);
        int last = -1;
        for (int pass = 0; pass < K; pass++) {
            int best = -1;
            for (int k = 0; k < K; k++)
                if (sl[k] >= 0 && ex[k] > last && (best < 0 || ex[k] < ex[best]))
                    best = k;
            if (best < 0)
                break;
            last = ex[best];
            acc += kc_f(dxe[((size_t)ex[best] * C + sl[best]) * D + c]);
        }
        dx[i] = kc_to<T>(acc);
    }
}

/* y[n, c] = sum over kept k of weight[n,k] ye[expert, slot, c]. */
template <typename T>
__global__ void moe_combine_kernel(T *y, const T *ye, const int *expert,
                                   const int *slot, const float *weight, int N,
                                   int K, int C, int D)
{
    size_t n_all = (size_t)N * D, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_all;
         i += stride) {
        int n = (int)(i / (size_t)D), c = (int)(i % (size_t)D);
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            size_t nk = (size_t)n * K + k;
            if (slot[nk] < 0)
                continue;
            acc += weight[nk] *
                   kc_f(ye[((size_t)expert[nk] * C + slot[nk]) * D + c]);
        }
        y[i] = kc_to<T>(acc);
    }
}

/* One block per (token, k): dye row += w dy[n]; dweight[nk] += dy[n] . ye
 * row (a block sum in a fixed order). */
template <typename T>
__global__ void moe_combine_bwd_kernel(T *dye, float *dweight, const T *dy,
                                       const T *ye, const int *expert,
                                       const int *slot, const float *weight,
                                       int K, int C, int D)
{
    __shared__ float sh[32];
    size_t nk = blockIdx.x;
    if (slot[nk] < 0)
        return;
    size_t row = ((size_t)expert[nk] * C + slot[nk]) * D;
    const T *g = dy + nk / K * D;
    float w = weight[nk], s = 0.0f;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float gc = kc_f(g[c]);
        dye[row + c] = kc_to<T>(kc_f(dye[row + c]) + w * gc);
        s += gc * kc_f(ye[row + c]);
    }
    s = kc_block_sum(s, sh);
    if (threadIdx.x == 0)
        dweight[nk] += s;
}

int kcuda_moe_dispatch_forward(void *xe, const void *x,
                               const kcuda_moe_route *r, int D,
                               kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(r != NULL && D > 0, "moe_dispatch: bad arguments");
    size_t n = (size_t)r->E * r->C * D;
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(dt, T, {
        moe_dispatch_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (T *)xe, (const T *)x, r->token, n, D);
        KCUDA_LAUNCHED("moe_dispatch_kernel");
    });
    return 0;
}

int kcuda_moe_dispatch_backward(void *dx, const void *dxe,
                                const kcuda_moe_route *r, int D,
                                kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(r != NULL && D > 0, "moe_dispatch: bad arguments");
    size_t n = (size_t)r->N * D;
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(dt, T, {
        moe_dispatch_bwd_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (T *)dx, (const T *)dxe, r->expert, r->slot, r->N, r->K, r->C, D);
        KCUDA_LAUNCHED("moe_dispatch_bwd_kernel");
    });
    return 0;
}

int kcuda_moe_combine_forward(void *y, const void *ye,
                              const kcuda_moe_route *r, int D,
                              kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(r != NULL && D > 0, "moe_combine: bad arguments");
    size_t n = (size_t)r->N * D;
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(dt, T, {
        moe_combine_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (T *)y, (const T *)ye, r->expert, r->slot, r->weight, r->N, r->K,
            r->C, D);
        KCUDA_LAUNCHED("moe_combine_kernel");
    });
    return 0;
}

int kcuda_moe_combine_backward(void *dye, float *dweight, const void *dy,
                               const void *ye, const kcuda_moe_route *r,
                               int D, kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(r != NULL && D > 0, "moe_combine: bad arguments");
    size_t nk = (size_t)r->N * r->K;
    if (nk == 0)
        return 0;
    KCUDA_ARG(nk <= 0x7fffffffu, "moe_combine: N*K too large");
    KCUDA_DISPATCH(dt, T, {
        moe_combine_bwd_kernel<T><<<(unsigned)nk, 128, 0, s>>>(
            (T *)dye, dweight, (const T *)dy, (const T *)ye, r->expert,
            r->slot, r->weight, r->K, r->C, D);
        KCUDA_LAUNCHED("moe_combine_bwd_kernel");
    });
    return 0;
}

/* ---- experts -------------------------------------------------------------- */

/* One batched product over the E experts, row-major per expert:
 * C[M,N] = op(A) op(B) (+ C). */
static int expert_gemm(kcuda_ctx *ctx, int E, int M, int N, int K,
                       const void *A, int ta, long long sa, const void *B,
                       int tb, long long sb, void *Cm, long long sc,
                       float beta, kcuda_dtype dt, cudaStream_t s)
{
    kcuda__gemm g;
    memset(&g, 0, sizeof g);
    g.M = M, g.N = N, g.K = K;
    g.A = A, g.ta = ta, g.lda = ta ? M : K, g.sa = sa;
    g.B = B, g.tb = tb, g.ldb = tb ? K : N, g.sb = sb;
    g.C = Cm, g.ldc = N, g.sc = sc;
    g.beta = beta;
    g.batch = E;
    g.dt = dt;
    return kcuda__gemm_run(ctx, &g, s);
}

int kcuda_moe_expert_forward(kcuda_ctx *ctx, void *ye, void *hg, void *hu,
                             void *act, const void *xe, const void *w_gate,
                             const void *w_up, const void *w_down,
                             const int *count, int E, int C, int D, int F,
                             kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(E >= 1 && C >= 0 && D > 0 && F > 0, "moe_expert: bad sizes");
    if (C == 0)
        return 0;
    long long CD = (long long)C * D, CF = (long long)C * F,
              DF = (long long)D * F;
    /* hg = xe @ w_gate, hu = xe @ w_up: [C,D] @ [D,F] per expert */
    KCUDA_TRY(expert_gemm(ctx, E, C, F, D, xe, 0, CD, w_gate, 0, DF, hg, CF,
                          0.0f, dt, s));
    KCUDA_TRY(expert_gemm(ctx, E, C, F, D, xe, 0, CD, w_up, 0, DF, hu, CF,
                          0.0f, dt, s));
    KCUDA_TRY(kcuda__swiglu_rows_forward(act, hg, hu, count, E, C, F, dt, s));
    /* ye = act @ w_down: [C,F] @ [F,D]; zero past count since act is */
    return expert_gemm(ctx, E, C, D, F, act, 0, CF, w_down, 0, DF, ye, CD,
                       0.0f, dt, s);
}

int kcuda_moe_expert_backward(kcuda_ctx *ctx, void *dxe, void *dw_gate,
                              void *dw_up, void *dw_down, const void *dye,
                              const void *hg, const void *hu, const void *act,
                              const void *xe, const void *w_gate,
                              const void *w_up, const void *w_down,
                              const int *count, int E, int C, int D, int F,
                              kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(E >= 1 && C >= 0 && D > 0 && F > 0, "moe_expert: bad sizes");
    if (C == 0)
        return 0;
    long long CD = (long long)C * D, CF = (long long)C * F,
              DF = (long long)D * F;
    size_t part = kcuda__round256((size_t)E * CF * kcuda_dtype_size(dt));
    void *scratch = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, 2 * part, &scratch, s));
    void *dg = scratch, *du = (char *)scratch + part;
    /* ye = act @ w_down: dw_down += act^T dye; du = dye w_down^T (d act) */
    KCUDA_TRY(expert_gemm(ctx, E, F, D, C, act, 1, CF, dye, 0, CD, dw_down, DF,
                          1.0f, dt, s));
    KCUDA_TRY(expert_gemm(ctx, E, C, F, D, dye, 0, CD, w_down, 1, DF, du, CF,
                          0.0f, dt, s));
    /* act = silu(hg) hu: dg, du, zero past count */
    KCUDA_TRY(kcuda__swiglu_rows_backward(dg, du, du, hg, hu, count, E, C, F,
                                          dt, s));
    /* hg = xe w_gate, hu = xe w_up */
    KCUDA_TRY(expert_gemm(ctx, E, D, F, C, xe, 1, CD, dg, 0, CF, dw_gate, DF,
                          1.0f, dt, s));
    KCUDA_TRY(expert_gemm(ctx, E, D, F, C, xe, 1, CD, du, 0, CF, dw_up, DF,
                          1.0f, dt, s));
    KCUDA_TRY(expert_gemm(ctx, E, C, D, F, dg, 0, CF, w_gate, 1, DF, dxe, CD,
                          1.0f, dt, s));
    return expert_gemm(ctx, E, C, D, F, du, 0, CF, w_up, 1, DF, dxe, CD, 1.0f,
                       dt, s);
}
