/* loss.cu — fused softmax + cross-entropy over a (padded) vocabulary.
 *
 * One block per row. The forward reads the row once: each thread keeps an
 * online maximum m and sum s of exp(x - m) over its columns (16-byte packs
 * where the rows allow), and the threads' (m, s) pairs are merged in a
 * fixed tree (m = max, s = s1 e^(m1 - m) + s2 e^(m2 - m): the same bits in
 * every lane, since each merge adds the same two terms). It saves, as kcpu
 * does, only the row maximum and lse = log(s) per row. The backward
 * recomputes p = exp(x - max) / s column by column and adds
 * (p - onehot) * dloss / N into dlogits. The vocabulary-parallel pieces
 * (kcpu_crossentropy_shard_*) share the kernels. Its exponentials are
 * kc_exp's (a multiply and an ex2): with expf's nine instructions an
 * element, the loops would be bound by arithmetic, not by the bandwidth
 * of reading a 2-byte logit.
 */
#include "kcuda_impl.h"

#define CE_THREADS 256

/* The columns of a shard that are not padding: [0, valid). */
__host__ __device__ static inline int ce_valid(int col0, int W, int V)
{
    int valid = V - col0;
    return valid < 0 ? 0 : valid > W ? W : valid;
}

/* Merge (m2, s2) into (m, s). */
__device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2)
{
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY)
        return; /* both empty */
    s = s * kc_exp(m - mn) + s2 * kc_exp(m2 - mn);
    m = mn;
}

/* The block's (max, sum of exp(x - max)) over row[0, valid): every thread
 * gets it. sh: 64 floats. */
template <typename T>
__device__ void ce_row_stats(const T *row, int valid, int vec, float *sh,
                             float &m_out, float &s_out)
{
    constexpr int W = kc_pack<T>::W;
    float m = -INFINITY, s = 0.0f;
    int full = vec ? valid / W * W : 0;
    for (int c = threadIdx.x * W; c < full; c += blockDim.x * W) {
        float x[W], pm = -INFINITY;
        kc_load_pack<T>(x, row + c);
#pragma unroll
        for (int j = 0; j < W; j++)
            pm = fmaxf(pm, x[j]);
        float mn = fmaxf(m, pm), t = 0.0f;
        if (mn == -INFINITY)
            continue; /* -inf so far: e^(-inf - -inf) would be NaN */
#pragma unroll
        for (int j = 0; j < W; j++)
            t += kc_exp(x[j] - mn);
        s = s * kc_exp(m - mn) + t;
        m = mn;
    }
    for (int c = full + threadIdx.x; c < valid; c += blockDim.x) {
        float x = kc_f(row[c]);
        float mn = fmaxf(m, x);
        if (mn == -INFINITY)
            continue;
        s = s * kc_exp(m - mn) + kc_exp(x - mn);
        m = mn;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int nw = (int)(blockDim.x >> 5);
    __syncthreads();
    if (lane == 0) {
        sh[w] = m;
        sh[32 + w] = s;
    }
    __syncthreads();
    m = -INFINITY;
    s = 0.0f;
    for (int k = 0; k < nw; k++) /* in warp order: fixed */
        ms_merge(m, s, sh[k], sh[32 + k]);
    m_out = m;
    s_out = s;
}

/* dlogits row += (exp(x - mx) inv - onehot(t)) scale over [0, valid). */
template <typename T>
__device__ void ce_row_grad(T *drow, const T *row, int valid, int t, float mx,
                            float inv, float scale, int vec, int assign)
{
    constexpr int W = kc_pack<T>::W;
    int full = vec ? valid / W * W : 0;
    for (int c = threadIdx.x * W; c < full; c += blockDim.x * W) {
        float x[W], d[W];
        kc_load_pack<T>(x, row + c);
        if (assign) {
#pragma unroll
            for (int j = 0; j < W; j++)
                d[j] = 0.0f;
        } else {
            kc_load_pack<T>(d, drow + c);
        }
#pragma unroll
        for (int j = 0; j < W; j++) {
            float ind = c + j == t ? 1.0f : 0.0f;
            d[j] += (kc_exp(x[j] - mx) * inv - ind) * scale;
        }
        kc_store_pack<T>(drow + c, d);
    }
    for (int c = full + threadIdx.x; c < valid; c += blockDim.x) {
        float ind = c == t ? 1.0f : 0.0f;
        float d = (assign ? 0.0f : kc_f(drow[c])) +
                  (kc_exp(kc_f(row[c]) - mx) * inv - ind) * scale;
        drow[c] = kc_to<T>(d);
    }
}

/* Forward (and, with dlogits, the backward too, overwriting it, 0 past V:
 * it may be the logits themselves) of one row per block. */
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    ce_fwd_kernel(float *losses, float *rowmax, float *lse, T *dlogits,
                  const T *logits, const int32_t *targets, int V, int Vp,
                  float scale, int vec)
{
    __shared__ float sh[64];
    int i = blockIdx.x;
    const T *row = logits + (size_t)i * Vp;
    float m, s;
    ce_row_stats<T>(row, V, vec, sh, m, s);
    int t = targets[i];
    double ls = log((double)s);
    float lsf = (float)ls;
    if (threadIdx.x == 0) {
        /* -log p[target] = lse - (logit[target] - max); NaN for a
         * target out of range (read nowhere) */
        float xt = t >= 0 && t < V ? kc_f(row[t]) : NAN;
        losses[i] = (float)(ls - ((double)xt - m));
        rowmax[i] = m;
        lse[i] = lsf;
    }
    if (dlogits) {
        float inv = (float)exp(-(double)lsf);
        T *drow = dlogits + (size_t)i * Vp;
        __syncthreads(); /* row[t] read above before any thread overwrites it */
        /* each element read, then written, by one thread: in place too */
        ce_row_grad<T>(drow, row, V, t, m, inv, scale, vec, 1);
        for (int c = V + threadIdx.x; c < Vp; c += blockDim.x)
            drow[c] = kc_to<T>(0.0f);
    }
}

/* *mean = the mean of losses[N] (floats, or doubles), summed in double in a
 * fixed order. One block of CE_MEAN_THREADS: its bound keeps the compiler
 * within 64 registers a thread, or the launch would fail for want of them
 * (a block of 1024 threads has 65536). */
#define CE_MEAN_THREADS 1024
template <typename L>
__global__ void __launch_bounds__(CE_MEAN_THREADS)
    ce_mean_kernel(float *mean, const L *losses, int N)
{
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x)
        acc += losses[i];
    acc = kc_block_sum_d(acc, sh);
    if (threadIdx.x == 0)
        *mean = (float)(acc / N);
}

/* The backward of a shard: rows of W columns [col0, col0 + W); assign:
 * overwritten, its columns past V (valid..W) zeroed. */
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    ce_bwd_kernel(T *dlogits, const T *logits, const int32_t *targets,
                  const float *rowmax, const float *lse, int col0, int W,
                  int valid, float scale, int vec, int assign)
{
    int i = blockIdx.x;
    T *drow = dlogits + (size_t)i * W;
    float inv = (float)exp(-(double)lse[i]); /* 1 / sum of exp(x - max) */
    ce_row_grad<T>(drow, logits + (size_t)i * W, valid, targets[i] - col0,
                   rowmax[i], inv, scale, vec, assign);
    if (assign)
        for (int c = valid + threadIdx.x; c < W; c += blockDim.x)
            drow[c] = kc_to<T>(0.0f);
}

/* rowmax and target logit of a shard's row. */
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    ce_shard_max_kernel(float *rowmax, float *target_logit, const T *logits,
                        const int32_t *targets, int col0, int W, int valid)
{
    __shared__ float sh[32];
    int i = blockIdx.x;
    const T *row = logits + (size_t)i * W;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < valid; c += blockDim.x)
        m = fmaxf(m, kc_f(row[c]));
    m = kc_block_max(m, sh);
    if (threadIdx.x == 0) {
        int t = targets[i] - col0;
        rowmax[i] = m;
        target_logit[i] = t >= 0 && t < valid ? kc_f(row[t]) : 0.0f;
    }
}

/* x[i] = sum over the shard's columns of exp(x - rowmax[i]), in double;
 * x[N + i] = target_logit[i]. */
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    ce_shard_sumexp_kernel(double *x, const float *target_logit,
                           const T *logits, const float *rowmax, int W,
                           int valid)
{
    __shared__ double sh[32];
    int i = blockIdx.x;
    const T *row = logits + (size_t)i * W;
    float mx = rowmax[i];
    double acc = 0.0;
    for (int c = threadIdx.x; c < valid; c += blockDim.x)
        acc += kc_exp(kc_f(row[c]) - mx);
    acc = kc_block_sum_d(acc, sh);
    if (threadIdx.x == 0) {
        x[i] = acc;
        x[gridDim.x + i] = (double)target_logit[i];
    }
}

/* 16-byte packs over rows of `cols` elements. */
static int ce_vec(kcuda_dtype dt, int cols, const void *a, const void *b)
{
    return (cols * kcuda_dtype_size(dt)) % 16 == 0 && kcuda__aligned16(a, b);
}

static int ce_forward(float *losses, float *rowmax, float *lse,
                      float *mean_loss, void *dlogits, const void *logits,
                      const int32_t *targets, float dloss, int N, int V,
                      int Vp, kcuda_dtype dt, cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    KCUDA_ARG(N > 0 && V > 0 && V <= Vp,
              "crossentropy: bad sizes N=%d V=%d Vp=%d", N, V, Vp);
    float scale = (float)((double)dloss / N);
    int vec = ce_vec(dt, Vp, logits, dlogits);
    KCUDA_DISPATCH(dt, T, {
        ce_fwd_kernel<T><<<(unsigned)N, CE_THREADS, 0, s>>>(
            losses, rowmax, lse, (T *)dlogits, (const T *)logits, targets, V,
            Vp, scale, vec);
        KCUDA_LAUNCHED("ce_fwd_kernel");
    });
    if (mean_loss) {
        ce_mean_kernel<float><<<1, CE_MEAN_THREADS, 0, s>>>(mean_loss, losses, N);
        KCUDA_LAUNCHED("ce_mean_kernel");
    }
    return 0;
}

int kcuda_crossentropy_forward(float *losses, float *rowmax, float *lse,
                               float *mean_loss, const void *logits,
                               const int32_t *targets, int N, int V, int Vp,
                               kcuda_dtype dt, void *stream)
{
    return ce_forward(losses, rowmax, lse, mean_loss, NULL, logits, targets,
                      0.0f, N, V, Vp, dt, kcuda__stream(stream));
}

int kcuda_crossentropy_fused(float *losses, float *rowmax, float *lse,
                             float *mean_loss, void *dlogits,
                             const void *logits, const int32_t *targets,
                             float dloss, int N, int V, int Vp,
                             kcuda_dtype dt, void *stream)
{
    KCUDA_ARG(dlogits != NULL, "crossentropy_fused: dlogits is NULL");
    return ce_forward(losses, rowmax, lse, mean_loss, dlogits, logits,
                      targets, dloss, N, V, Vp, dt, kcuda__stream(stream));
}

int kcuda_crossentropy_shard_backward(void *dlogits, const void *logits,
                                      const int32_t *targets,
                                      const float *rowmax, const float *lse,
                                      float dloss, int N, int col0, int W,
                                      int V, int assign, kcuda_dtype dt,
                                      void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(N > 0 && V > 0 && W > 0 && col0 >= 0,
              "crossentropy: bad sizes N=%d V=%d W=%d col0=%d", N, V, W, col0);
    int valid = ce_valid(col0, W, V);
    if (valid == 0) { /* a shard wholly past the vocabulary: no gradient */
        if (assign)
            KCUDA_CHECK(cudaMemsetAsync(dlogits, 0,
                                        (size_t)N * W * kcuda_dtype_size(dt),
                                        s));
        return 0;
    }
    float scale = (float)((double)dloss / N);
    int vec = ce_vec(dt, W, logits, dlogits);
    KCUDA_DISPATCH(dt, T, {
        ce_bwd_kernel<T><<<(unsigned)N, CE_THREADS, 0, s>>>(
            (T *)dlogits, (const T *)logits, targets, rowmax, lse, col0, W,
            valid, scale, vec, assign);
        KCUDA_LAUNCHED("ce_bwd_kernel");
    });
    return 0;
}

int kcuda_crossentropy_backward(void *dlogits, const void *logits,
                                const int32_t *targets, const float *rowmax,
                                const float *lse, float dloss, int N, int V,
                                int Vp, kcuda_dtype dt, void *stream)
{
    KCUDA_ARG(V <= Vp, "crossentropy: V=%d > Vp=%d", V, Vp);
    return kcuda_crossentropy_shard_backward(dlogits, logits, targets, rowmax,
                                             lse, dloss, N, 0, Vp, V, 0, dt,
                                             stream);
}

int kcuda_crossentropy_shard_max(float *rowmax, float *target_logit,
                                 const void *logits, const int32_t *targets,
                                 int N, int col0, int W, int V,
                                 kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(N >= 0 && W > 0 && col0 >= 0, "crossentropy shard: bad sizes");
    if (N == 0)
        return 0;
    int valid = ce_valid(col0, W, V);
    KCUDA_DISPATCH(dt, T, {
        ce_shard_max_kernel<T><<<(unsigned)N, CE_THREADS, 0, s>>>(
            rowmax, target_logit, (const T *)logits, targets, col0, W, valid);
        KCUDA_LAUNCHED("ce_shard_max_kernel");
    });
    return 0;
}

int kcuda_crossentropy_shard_sumexp(double *x, const float *target_logit,
                                    const void *logits, const float *rowmax,
                                    int N, int col0, int W, int V,
                                    kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(N >= 0 && W > 0 && col0 >= 0, "crossentropy shard: bad sizes");
    if (N == 0)
        return 0;
    int valid = ce_valid(col0, W, V);
    KCUDA_DISPATCH(dt, T, {
        ce_shard_sumexp_kernel<T><<<(unsigned)N, CE_THREADS, 0, s>>>(
            x, target_logit, (const T *)logits, rowmax, W, valid);
        KCUDA_LAUNCHED("ce_shard_sumexp_kernel");
    });
    return 0;
}

/* ---- the vocabulary-parallel pieces after the exchanges ----------------- */

/* rowmax[i] = the largest of all[q N + i], from q = 0 up (kcpu's order). */
__global__ void ce_shard_rowmax_kernel(float *rowmax, const float *all, int N,
                                       int P)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
         i < (size_t)N; i += (size_t)gridDim.x * blockDim.x) {
        float m = all[i];
        for (int q = 1; q < P; q++) {
            float v = all[(size_t)q * (size_t)N + i];
            m = v > m ? v : m;
        }
        rowmax[i] = m;
    }
}

/* Each row's sums over the shards in shard order, its loss and lse; the
 * loss as a double into all[i] (read by ce_mean_kernel). */
__global__ void ce_shard_finish_kernel(float *losses, float *lse, double *all,
                                       const float *rowmax, int N, int P)
{
    size_t n2 = 2 * (size_t)N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
         i < (size_t)N; i += (size_t)gridDim.x * blockDim.x) {
        double sum = 0.0, t = 0.0;
        for (int q = 0; q < P; q++) {
            sum += all[(size_t)q * n2 + i];
            t += all[(size_t)q * n2 + (size_t)N + i];
        }
        double ls = log(sum), loss = ls - (t - (double)rowmax[i]);
        losses[i] = (float)loss;
        lse[i] = (float)ls;
        all[i] = loss;
    }
}

int kcuda_crossentropy_shard_rowmax(float *rowmax, const float *all, int N,
                                    int P, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_ARG(N >= 0 && P >= 1, "crossentropy shard rowmax: bad sizes");
    if (N == 0)
        return 0;
    ce_shard_rowmax_kernel<<<kcuda__blocks((size_t)N, 256), 256, 0, s>>>(
        rowmax, all, N, P);
    KCUDA_LAUNCHED("ce_shard_rowmax_kernel");
    return 0;
}

int kcuda_crossentropy_shard_finish(float *mean_loss, float *losses,
                                    float *lse, double *all,
                                    const float *rowmax, int N, int P,
                                    void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_ARG(N > 0 && P >= 1, "crossentropy shard finish: bad sizes");
    ce_shard_finish_kernel<<<kcuda__blocks((size_t)N, 256), 256, 0, s>>>(
        losses, lse, all, rowmax, N, P);
    KCUDA_LAUNCHED("ce_shard_finish_kernel");
    ce_mean_kernel<double><<<1, CE_MEAN_THREADS, 0, s>>>(mean_loss, all, N);
    KCUDA_LAUNCHED("ce_mean_kernel");
    return 0;
}
