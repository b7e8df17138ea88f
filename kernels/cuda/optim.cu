/* optim.cu — the AdamW step on fp32 master weights, sums of squares in a
 * fixed order, scaling and clipping by the global norm.
 *
 * The AdamW arithmetic is optim.c's, operation for operation, written with
 * the round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...) so that nvcc
 * contracts nothing into fused multiply-adds: in fp32 the GPU gives the
 * CPU's bits. The bias corrections are computed on the host in double, as
 * kcpu_adamw_step does, and so is its gradients' factor (clipping, a loss
 * scale), applied as the gradients are read.
 */
#include <math.h>   /* defines: pow */
#include <string.h> /* defines: memset */

#include "kcuda_impl.h"

#define SS_BLOCKS 1024 /* partial sums: a fixed grid, for reproducibility */
#define SS_THREADS 256
#define SS_MANY 64 /* kcuda_sum_squares_many's buffers a launch */
#define AW_MANY 24 /* kcuda_adamw_step_many's tensors a launch (1.4 KB of arguments) */
#define AW_BLOCKS 2048 /* ... and blocks a tensor at most (the rest in strides) */

/* x * scale in double, rounded to a float and then to T: what
 * scale_kernel stores, and the gradient adamw_elem takes. */
template <typename T>
__device__ __forceinline__ T scaled(T x, double scale)
{
    return kc_to<T>((float)(kc_f(x) * scale));
}

/* Element i of AdamW (kcpu_adamw_step's operations, in its order). */
template <typename G, typename L>
__device__ __forceinline__ void adamw_elem(float *params, L *params_lp, const G *grads, double gscale, float *m,
                                           float *v, size_t i, float lr, float beta1, float beta2, float eps,
                                           float wd, float c1, float c2)
{
    float ob1 = __fsub_rn(1.0f, beta1), ob2 = __fsub_rn(1.0f, beta2);
    float g = kc_f(scaled(grads[i], gscale)), p = params[i];
    /* m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g g */
    float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(ob1, g));
    float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(ob2, g), g));
    m[i] = mi;
    v[i] = vi;
    float mhat = __fdiv_rn(mi, c1);
    float root = __fsqrt_rn(__fdiv_rn(vi, c2));
    /* p -= lr (mhat / (root + eps) + wd p) */
    float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(root, eps)), __fmul_rn(wd, p));
    p = __fsub_rn(p, __fmul_rn(lr, step));
    params[i] = p;
    if (params_lp)
        params_lp[i] = kc_to<L>(p);
}

/* Up to AW_MANY tensors of one launch; tensor b's blocks are
 * first[b] .. first[b + 1] - 1 (first[AW_MANY] past the last). */
struct adamw_many_args {
    kcuda_adamw_tensor t[AW_MANY];
    unsigned first[AW_MANY + 1];
    int count;
};

template <typename G, typename L>
__global__ void adamw_many_kernel(adamw_many_args a, double gscale, float lr, float beta1, float beta2, float eps,
                                  float c1, float c2)
{
    int b = 0;
    while (b + 1 < a.count && blockIdx.x >= a.first[b + 1]) /* (block-uniform) */
        b++;
    const kcuda_adamw_tensor &x = a.t[b];
    size_t stride = (size_t)(a.first[b + 1] - a.first[b]) * blockDim.x;
    for (size_t i = (size_t)(blockIdx.x - a.first[b]) * blockDim.x + threadIdx.x; i < x.n; i += stride)
        adamw_elem<G, L>(x.params, (L *)x.params_lp, (const G *)x.grads, gscale, x.m, x.v, i, lr, beta1, beta2, eps,
                         x.weight_decay, c1, c2);
}

int kcuda_adamw_step_many(const kcuda_adamw_tensor *ts, int count, kcuda_dtype lp_dt, kcuda_dtype grad_dt,
                          double grad_scale, float lr, float beta1, float beta2, float eps, int t, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(grad_dt);
    KCUDA_DT_OK(lp_dt);
    KCUDA_ARG(t >= 1, "adamw: step t=%d, must count from 1", t);
    KCUDA_ARG(count >= 0 && (count == 0 || ts), "adamw_step_many: bad arguments");
    /* the bias corrections in double, as kcpu_adamw_step has them (1 -
     * beta^t loses digits in float; double arguments: CUDA's float
     * overload of pow would compute in float) */
    float c1 = (float)(1.0 - pow((double)beta1, (double)t));
    float c2 = (float)(1.0 - pow((double)beta2, (double)t));
    for (int b0 = 0; b0 < count; b0 += AW_MANY) {
        adamw_many_args a;
        memset(&a, 0, sizeof a);
        a.count = count - b0 < AW_MANY ? count - b0 : AW_MANY;
        for (int b = 0; b < a.count; b++) {
            a.t[b] = ts[b0 + b];
            size_t want = (ts[b0 + b].n + 255) / 256;
            a.first[b + 1] = a.first[b] + (unsigned)(want < AW_BLOCKS ? want : AW_BLOCKS);
        }
        if (a.first[a.count] == 0) /* every tensor empty */
            continue;
        KCUDA_DISPATCH(grad_dt, G, {
            KCUDA_DISPATCH(lp_dt, L, {
                adamw_many_kernel<G, L><<<a.first[a.count], 256, 0, s>>>(a, grad_scale, lr, beta1, beta2, eps, c1,
                                                                         c2);
                KCUDA_LAUNCHED("adamw_many_kernel");
            });
        });
    }
    return 0;
}

int kcuda_adamw_step(float *params, void *params_lp, kcuda_dtype lp_dt,
                     const void *grads, kcuda_dtype grad_dt,
                     double grad_scale, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps,
                     float weight_decay, int t, void *stream)
{
    const kcuda_adamw_tensor one = {params, params_lp, grads, m, v, n, weight_decay};
    return kcuda_adamw_step_many(&one, 1, lp_dt, grad_dt, grad_scale, lr, beta1, beta2, eps, t, stream);
}

/* y += x, in fp32 (x widened from its storage type). */
template <typename T>
__global__ void accumulate_kernel(float *y, const T *x, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        y[i] = __fadd_rn(y[i], kc_f(x[i]));
}

int kcuda_accumulate(float *y, const void *x, kcuda_dtype x_dt, size_t n,
                     void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(x_dt);
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(x_dt, T, {
        accumulate_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            y, (const T *)x, n);
        KCUDA_LAUNCHED("accumulate_kernel");
    });
    return 0;
}

/* Up to SS_MANY buffers of one launch: their elements, sizes, and first
 * partial sum's index in the scratch (first[SS_MANY] past the last). */
struct ss_many_args {
    const void *buf[SS_MANY];
    size_t n[SS_MANY];
    unsigned first[SS_MANY + 1];
    int nbufs;
};

/* Every buffer's partial sums of x^2 (double) in one grid: block
 * first[b] + j is buffer b's block j of a grid of at most SS_BLOCKS, its
 * sum in part[first[b] + j]. Element i is block (i / SS_THREADS) %
 * SS_BLOCKS's, so that a smaller grid (a small buffer's) gives the
 * partial sums of the fixed one, whose other blocks would hold zeros. */
template <typename T>
__global__ void __launch_bounds__(SS_THREADS) ss_many_partial_kernel(double *part, ss_many_args a)
{
    __shared__ double sh[32];
    int b = 0;
    while (b + 1 < a.nbufs && blockIdx.x >= a.first[b + 1]) /* (block-uniform) */
        b++;
    const T *x = (const T *)a.buf[b];
    size_t n = a.n[b], stride = (size_t)SS_BLOCKS * SS_THREADS;
    double acc = 0.0;
    for (size_t i = (size_t)(blockIdx.x - a.first[b]) * SS_THREADS + threadIdx.x; i < n; i += stride) {
        double xi = kc_f(x[i]);
        acc += xi * xi;
    }
    acc = kc_block_sum_d(acc, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = acc;
}

/* ss[b] += buffer b's partials, a block each, summed as SS_BLOCKS
 * partials with zeros after its own (the same bits for any number). */
__global__ void __launch_bounds__(SS_BLOCKS) ss_many_finish_kernel(double *ss, const double *part, ss_many_args a)
{
    __shared__ double sh[32];
    unsigned b = blockIdx.x, nb = a.first[b + 1] - a.first[b];
    double t = kc_block_sum_d(threadIdx.x < nb ? part[a.first[b] + threadIdx.x] : 0.0, sh);
    if (threadIdx.x == 0)
        ss[b] += t;
}

int kcuda_sum_squares_many(kcuda_ctx *ctx, double *ss, const void *const *bufs, const size_t *n, int nbufs,
                           kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(nbufs >= 0 && (nbufs == 0 || (ss && bufs && n)), "sum_squares_many: bad arguments");
    for (int b0 = 0; b0 < nbufs; b0 += SS_MANY) {
        ss_many_args a;
        memset(&a, 0, sizeof a);
        a.nbufs = nbufs - b0 < SS_MANY ? nbufs - b0 : SS_MANY;
        for (int b = 0; b < a.nbufs; b++) {
            size_t want = (n[b0 + b] + SS_THREADS - 1) / SS_THREADS;
            a.buf[b] = bufs[b0 + b];
            a.n[b] = n[b0 + b];
            a.first[b + 1] = a.first[b] + (unsigned)(want < SS_BLOCKS ? want : SS_BLOCKS);
        }
        unsigned blocks = a.first[a.nbufs];
        void *scratch = NULL;
        KCUDA_TRY(kcuda__scratch(ctx, (size_t)blocks * sizeof(double), &scratch, s));
        if (blocks > 0) /* (empty buffers have no partials: their sums stay) */
            KCUDA_DISPATCH(dt, T, {
                ss_many_partial_kernel<T><<<blocks, SS_THREADS, 0, s>>>((double *)scratch, a);
                KCUDA_LAUNCHED("ss_many_partial_kernel");
            });
        ss_many_finish_kernel<<<(unsigned)a.nbufs, SS_BLOCKS, 0, s>>>(ss + b0, (const double *)scratch, a);
        KCUDA_LAUNCHED("ss_many_finish_kernel");
    }
    return 0;
}

int kcuda_sum_squares(kcuda_ctx *ctx, double *ss, const void *buf, size_t n,
                      kcuda_dtype dt, void *stream)
{
    if (n == 0) /* (ss as it is, not += 0.0) */
        return 0;
    return kcuda_sum_squares_many(ctx, ss, &buf, &n, 1, dt, stream);
}

/* x = x * scale (in double); with ss, scale = max_norm / (norm + 1e-6),
 * norm = sqrt(*ss) rounded to a float as kcpu_global_norm returns it, and
 * nothing happens unless it is below 1. */
template <typename T>
__global__ void scale_kernel(T *x, size_t n, double scale, const double *ss,
                             float max_norm)
{
    if (ss) {
        scale = (double)max_norm / ((double)(float)sqrt(*ss) + 1e-6);
        if (!(scale < 1.0))
            return;
    }
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        x[i] = scaled(x[i], scale);
}

static int scale_launch(void *buf, size_t n, double scale, const double *ss,
                        float max_norm, kcuda_dtype dt, cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(dt, T, {
        scale_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (T *)buf, n, scale, ss, max_norm);
        KCUDA_LAUNCHED("scale_kernel");
    });
    return 0;
}

int kcuda_scale(void *buf, size_t n, double scale, kcuda_dtype dt,
                void *stream)
{
    return scale_launch(buf, n, scale, NULL, 0.0f, dt, kcuda__stream(stream));
}

int kcuda_clip_scale(void *buf, size_t n, const double *ss, float max_norm,
                     kcuda_dtype dt, void *stream)
{
    KCUDA_ARG(ss != NULL, "clip_scale: ss is NULL");
    return scale_launch(buf, n, 1.0, ss, max_norm, dt, kcuda__stream(stream));
}
