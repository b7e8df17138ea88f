/* kcuda_impl.h — internal to kernels/cuda (C++ for nvcc): error recording,
 * the context's layout, bf16/fp16 <-> fp32 element access, 16-byte packs,
 * warp and block reductions, launch helpers. Not API; nothing outside
 * kernels/cuda includes it.
 */
#ifndef MESH_KCUDA_IMPL_H
#define MESH_KCUDA_IMPL_H

#include <cublasLt.h>     /* defines: cublasLtHandle_t, cublasLtMatmulAlgo_t */
#include <cuda_bf16.h>    /* defines: __nv_bfloat16, conversions */
#include <cuda_fp16.h>    /* defines: __half, conversions */
#include <cuda_runtime.h> /* defines: cudaStream_t, cudaError_t */
#include <float.h>        /* defines: FLT_MIN */
#include <math.h>         /* defines: INFINITY */
#include <stddef.h>       /* defines: size_t */
#include <stdint.h>       /* defines: uintptr_t */

#include "kcuda.h"

typedef __nv_bfloat16 bf16;
typedef __half f16;

/* ---- errors (common.cu) --------------------------------------------------- */

/* Records "file:line: message" as this thread's last error; returns code. */
int kcuda__fail(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same for a CUDA error: the message names what failed and CUDA's
 * words for the error; returns (int)e. */
int kcuda__cuda_fail(cudaError_t e, const char *what, const char *file,
                     int line);

/* After a cuBLAS(Lt) call on stream s failed: "; the GPU: WORDS (NAME,
 * N): a kernel faulted ..." in buf (n bytes) when the GPU holds a kernel's
 * fault (here or earlier: cuBLAS reports one only as its own failure, "the
 * GPU program failed to execute"), else "". */
const char *kcuda__gpu_fault(cudaStream_t s, char *buf, size_t n);

/* Return KCUDA_ERR_ARG with a message unless cond holds. */
#define KCUDA_ARG(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond))                                                           \
            return kcuda__fail(KCUDA_ERR_ARG, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* Propagate a CUDA error (a call, or a launch's cudaGetLastError). */
#define KCUDA_CHECK(expr)                                                      \
    do {                                                                       \
        cudaError_t kcuda_e_ = (expr);                                         \
        if (kcuda_e_ != cudaSuccess)                                           \
            return kcuda__cuda_fail(kcuda_e_, #expr, __FILE__, __LINE__);      \
    } while (0)

/* After a launch: its configuration error, if any, named after the kernel. */
#define KCUDA_LAUNCHED(name)                                                   \
    do {                                                                       \
        cudaError_t kcuda_e_ = cudaGetLastError();                             \
        if (kcuda_e_ != cudaSuccess)                                           \
            return kcuda__cuda_fail(kcuda_e_, "launch of " name, __FILE__,     \
                                    __LINE__);                                 \
    } while (0)

/* Propagate a kcuda status (0 or an error already recorded). */
#define KCUDA_TRY(...)                                                         \
    do {                                                                       \
        int kcuda_rc_ = (__VA_ARGS__);                                         \
        if (kcuda_rc_ != 0)                                                    \
            return kcuda_rc_;                                                  \
    } while (0)

/* ---- the context (common.cu; its matmul parts in matmul.cu) --------------- */

/* One cached cuBLASLt algorithm: the key is every argument the heuristic
 * sees, compared bytewise (zero-filled first). */
typedef struct kcuda__algo_key {
    int m, n, k, lda, ldb, ldc, ta, tb, batch, dt, epi, beta_zero, c_f32, tf32;
    long long sa, sb, sc;
    int align_a, align_b, align_c, align_bias, align_aux;
} kcuda__algo_key;

typedef struct kcuda__algo_entry {
    kcuda__algo_key key;
    cublasLtMatmulAlgo_t algo;
    int valid;
} kcuda__algo_entry;

enum { KCUDA__ALGO_CACHE = 64 };

struct kcuda_ctx {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    void *scratch; /* grows on demand: kcuda__scratch */
    size_t scratch_bytes;
    kcuda__algo_entry algos[KCUDA__ALGO_CACHE];
    int algo_next; /* round-robin replacement */
    int dq_atomics; /* kcuda_ctx_set_deterministic's mode for attention's dq: 0 by
                       calloc, the default (mode 1): its own kernel; 1 (mode 0): the
                       dk/dv kernel's atomics in arrival order; 2 (mode 2): in turns */
    int gemm_tune;  /* kcuda_ctx_set_gemm_tune's mode: 0 by calloc (the heuristic's first) */
    int tf32;       /* kcuda_ctx_set_tf32: fp32 products on TF32 tensor cores; 0 by calloc */
    kcuda_gemm_tune_stats tune_stats;
    int attn_cudnn; /* kcuda_ctx_set_attention_cudnn: 0 by calloc (ours), 1, 2 (the forward) */
    struct kcuda__cudnn *cudnn; /* attention_cudnn.cu's: made at the first use */
};

/* ---- attention_cudnn.cu ----------------------------------------------------- */

typedef struct kcuda__cudnn kcuda__cudnn;
void kcuda__cudnn_free(kcuda__cudnn *c);

/* *out = at least `bytes` of the context's scratch (256-byte aligned).
 * Growing frees the old buffer and allocates a larger one in `stream`'s
 * order (work queued there may still read the old one; nothing waits): the
 * context's ops must all be queued on that one stream. */
int kcuda__scratch(kcuda_ctx *ctx, size_t bytes, void **out,
                   cudaStream_t stream);

/* Rounds n up to a multiple of 256 (scratch carving). */
static inline size_t kcuda__round256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

static inline cudaStream_t kcuda__stream(void *s)
{
    return (cudaStream_t)s;
}

/* The largest power of two (<= 256) dividing the address. */
static inline int kcuda__align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    int al = 1;
    while (al < 256 && (a & (uintptr_t)al) == 0)
        al <<= 1;
    return p ? al : 256;
}

/* 1 when every non-NULL pointer is 16-byte aligned. */
static inline bool kcuda__aligned16(const void *a, const void *b = nullptr,
                                    const void *c = nullptr,
                                    const void *d = nullptr,
                                    const void *e = nullptr)
{
    const void *p[5] = {a, b, c, d, e};
    for (int i = 0; i < 5; i++)
        if (p[i] && ((uintptr_t)p[i] & 15u) != 0)
            return false;
    return true;
}

/* Blocks for a grid-stride loop over `work` items of `threads` each, capped
 * (the loops stride over the rest). */
static inline unsigned kcuda__blocks(size_t work, int threads)
{
    size_t b = (work + (size_t)threads - 1) / (size_t)threads;
    if (b < 1)
        b = 1;
    if (b > 65536u * 16u)
        b = 65536u * 16u;
    return (unsigned)b;
}

/* Runs body with T bound to the storage type of dt (float, bf16, fp16). */
#define KCUDA_DISPATCH(dt, T, ...)                                             \
    do {                                                                       \
        if ((dt) == KCUDA_BF16) {                                              \
            typedef bf16 T;                                                    \
            __VA_ARGS__                                                        \
        } else if ((dt) == KCUDA_F16) {                                        \
            typedef f16 T;                                                     \
            __VA_ARGS__                                                        \
        } else {                                                               \
            typedef float T;                                                   \
            __VA_ARGS__                                                        \
        }                                                                      \
    } while (0)

#define KCUDA_DT_OK(dt)                                                        \
    KCUDA_ARG((dt) == KCUDA_F32 || (dt) == KCUDA_BF16 || (dt) == KCUDA_F16,    \
              "unknown dtype %d", (int)(dt))

/* ---- element access ------------------------------------------------------- */

__device__ __forceinline__ float kc_f(float x)
{
    return x;
}
__device__ __forceinline__ float kc_f(bf16 x)
{
    return __bfloat162float(x);
}
__device__ __forceinline__ float kc_f(f16 x)
{
    return __half2float(x);
}

template <typename T> __device__ __forceinline__ T kc_to(float x);
template <> __device__ __forceinline__ float kc_to<float>(float x)
{
    return x;
}
template <> __device__ __forceinline__ bf16 kc_to<bf16>(float x)
{
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ f16 kc_to<f16>(float x)
{
    return __float2half_rn(x);
}

/* ---- exponentials --------------------------------------------------------- */

#define KC_LOG2E 1.44269504088896340736f
#define KC_LN2 0.693147180559945309417f

/* e^x as 2^(x log2(e)): exp2f is the GPU's ex2 instruction (2 ulp) with a
 * compare and two multiplies for denormal results, where expf adds eight
 * instructions around it for its last ulp. The product's
 * rounding costs |x| 2^-24 relatively: at most 5e-6 where e^x is a
 * normal float, and no more than 1e-7 where x is within 1 of 0, which is
 * where a softmax's sum has its weight. For the loops that would be
 * bound by their exponentials rather than by memory (the cross-entropy's
 * over the vocabulary; attention keeps its scores in log2 units and
 * calls kc_exp2 itself). The CPU's reference keeps expf. */
__device__ __forceinline__ float kc_exp(float x)
{
    return exp2f(x * KC_LOG2E);
}

/* 2^x, flushed to zero where it is below 2^-126: ex2.approx.ftz.f32, one
 * MUFU.EX2 on the GPU, where exp2f (ex2.approx.f32) wraps the same
 * instruction in a compare and two multiplies to give the denormal results
 * (x below -126) too. Equal to exp2f wherever that is a normal float. For
 * the attention's probabilities, whose loops are bound by the
 * instructions around the tensor cores' (a denormal probability weighs
 * nothing against the row's largest, 1). The emulation (tests/gpu/emu)
 * flushes the host's exp2f the same way. */
__device__ __forceinline__ float kc_exp2(float x)
{
#if defined(__CUDA_ARCH__) && !defined(EMU_CUDA_RUNTIME_H)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
#endif
}

/* ---- GELU (tanh approximation) ------------------------------------------- */

#define KC_GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define KC_GELU_CUBE 0.044715f

/* e^(-2u), u = sqrt(2/pi) (x + 0.044715 x^3): gelu(x) = x / (1 + e). The
 * exponent is capped at 88, as kcpu__expf caps it: below x = -10.07 an
 * uncapped e is inf, and the backward's e s = inf * 0 would be NaN (the
 * CPU's is 1). */
__device__ __forceinline__ float kc_gelu_exp(float x)
{
    return expf(fminf(-2.0f * KC_GELU_SCALE * (x + KC_GELU_CUBE * x * x * x), 88.0f));
}

/* 16 bytes of T: 4 floats or 8 bf16. */
template <typename T> struct alignas(16) kc_pack {
    static constexpr int W = 16 / (int)sizeof(T);
    T v[W];
};

template <typename T>
__device__ __forceinline__ void kc_load_pack(float *dst, const T *src)
{
    kc_pack<T> p = *reinterpret_cast<const kc_pack<T> *>(src);
#pragma unroll
    for (int j = 0; j < kc_pack<T>::W; j++)
        dst[j] = kc_f(p.v[j]);
}

template <typename T>
__device__ __forceinline__ void kc_store_pack(T *dst, const float *src)
{
    kc_pack<T> p;
#pragma unroll
    for (int j = 0; j < kc_pack<T>::W; j++)
        p.v[j] = kc_to<T>(src[j]);
    *reinterpret_cast<kc_pack<T> *>(dst) = p;
}

/* ---- reductions ----------------------------------------------------------- */

/* Butterfly sums: every lane ends with the same bits (each step adds the
 * same two partials, and a + b == b + a exactly). */
__device__ __forceinline__ float kc_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double kc_warp_sum_d(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kc_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. `sh` holds 32 floats; the call syncs. */
__device__ __forceinline__ float kc_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int nw = (int)(blockDim.x >> 5);
    v = kc_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return kc_warp_sum(t);
}

__device__ __forceinline__ double kc_block_sum_d(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int nw = (int)(blockDim.x >> 5);
    v = kc_warp_sum_d(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    return kc_warp_sum_d(t);
}

__device__ __forceinline__ float kc_block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int nw = (int)(blockDim.x >> 5);
    v = kc_warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -INFINITY;
    return kc_warp_max(t);
}

/* ---- shared across files -------------------------------------------------- */

/* The backward's epilogue (kcuda_matmul_gelu_backward), beside the
 * forward's kcuda_epilogue: C = gelu'(aux) * op(A) @ op(B) (beta 0). */
#define KCUDA__EPI_DGELU 2

/* The cuBLASLt product of row-major matrices (matmul.cu):
 *   C[M,N] = op(A) @ op(B) (+ C if beta = 1), then the epilogue,
 * with A stored [M,K] (ta = 0) or [K,M] (ta = 1), B stored [K,N] (tb = 0)
 * or [N,K] (tb = 1), batch products at element strides sa, sb, sc. */
typedef struct kcuda__gemm {
    int M, N, K;
    const void *A;
    int lda, ta;
    const void *B;
    int ldb, tb;
    void *C;
    int ldc;
    float beta; /* 0 or 1 */
    int batch;
    long long sa, sb, sc;
    const void *bias; /* [N] or NULL */
    void *aux;        /* GELU input [M,N] (ld N): written by KCUDA_EPI_GELU, read by
                         KCUDA__EPI_DGELU */
    int epi;          /* kcuda_epilogue, or KCUDA__EPI_DGELU */
    kcuda_dtype dt;
    int c_f32;        /* C (and the output) fp32 beside 2-byte A and B: a weight gradient
                         accumulated in fp32 (no epilogue) */
} kcuda__gemm;

int kcuda__gemm_run(kcuda_ctx *ctx, const kcuda__gemm *g, cudaStream_t s);

/* A product's cuBLASLt call, built once by kcuda__gemm_run (matmul.cu) and
 * run by it, or by the tuning, with one algorithm or another. */
typedef struct kcuda__lt_call {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
} kcuda__lt_call;

cublasStatus_t kcuda__lt_matmul(kcuda_ctx *ctx, const kcuda__gemm *g,
                                const kcuda__lt_call *call,
                                const cublasLtMatmulAlgo_t *algo,
                                cudaStream_t s);

/* The most algorithms of the heuristic that the tuning runs. */
enum { KCUDA__TUNE_CANDIDATES = 8 };

/* Whether a shape's first call is tuned (matmul_tune.cu): the context's
 * mode, and in mode 1 the output's size (a small 2-byte one is counted
 * in the stats and left to the heuristic's first). */
int kcuda__gemm_tunes(kcuda_ctx *ctx, const kcuda__gemm *g);

/* The tuning of a shape's first call (matmul_tune.cu,
 * kcuda_ctx_set_gemm_tune): res[0..n) are the heuristic's algorithms, in
 * its order; *pick is set to the index of the fastest that gives res[0]'s
 * bits (0 when none is faster, or when the tuning cannot run: too little
 * free memory, res[0] refused). The call's output, and C when it is
 * read, are as they were before on return. An error only for a failing
 * device. */
int kcuda__gemm_tune(kcuda_ctx *ctx, const kcuda__gemm *g,
                     const kcuda__lt_call *call,
                     const cublasLtMatmulHeuristicResult_t *res, int n,
                     cudaStream_t s, int *pick);

/* Column sums in a fixed order (colsum.cu): dst[N] (of dst_dt: dt, or
 * KCUDA_F32 beside 2-byte src) += sum over rows of src[M,N] (dt), through
 * the context's scratch. */
#define COLSUM_ROWS 256 /* rows per partial sum: the partials depend on the shape alone */
int kcuda__colsum_add(kcuda_ctx *ctx, void *dst, kcuda_dtype dst_dt,
                      const void *src, int M, int N, kcuda_dtype dt,
                      cudaStream_t s);
/* The pieces, for sums of products (norm.cu): the number of chunks of
 * COLSUM_ROWS rows (0 for M = 0, or an error when the grid cannot hold
 * them), and dst[c] += the sum over the chunks of part[chunk, c] (any
 * number of chunks), in a fixed order. */
int kcuda__colsum_chunks(int M, int N, const char *what);
int kcuda__colsum_finish(void *dst, kcuda_dtype dst_dt, const float *part,
                         int chunks, int N, cudaStream_t s);

/* The elementwise SwiGLU on rows of experts' buffers (activation.cu), for
 * moe.cu: act[e,c,:] = silu(hg) * hu, zero for rows c >= count[e]. */
int kcuda__swiglu_rows_forward(void *act, const void *hg, const void *hu,
                               const int *count, int E, int C, int F,
                               kcuda_dtype dt, cudaStream_t s);
/* dg = silu'(hg) * hu * dact, du = silu(hg) * dact (overwritten, du may be
 * dact's buffer), zero for rows c >= count[e]. */
int kcuda__swiglu_rows_backward(void *dg, void *du, const void *dact,
                                const void *hg, const void *hu,
                                const int *count, int E, int C, int F,
                                kcuda_dtype dt, cudaStream_t s);


/* ---- the elementwise engine (activation.cu, residual.cu) ------------------ */

/* NI input and NO output arrays of T; an output that is also read (a
 * gradient that accumulates) is passed as an input too. */
template <typename T, int NI, int NO> struct kc_ew_ptrs {
    const T *in[NI];
    T *out[NO];
};

/* out[o][i] = f(in[.][i]) for i < n. F is a functor with
 * `__device__ void operator()(const float *x, float *y) const` (x[NI],
 * y[NO]). With vec, every pointer is 16-byte aligned and the body moves
 * 16-byte packs; the last n % W elements go one by one. Each element's
 * inputs are read before its outputs are written, so an output may alias
 * an input. */
template <typename T, int NI, int NO, typename F>
__global__ void kc_ew_kernel(kc_ew_ptrs<T, NI, NO> p, size_t n, int vec, F f)
{
    constexpr int W = kc_pack<T>::W;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t nv = vec ? n / W : 0;
    for (size_t k = tid; k < nv; k += stride) {
        float a[NI][W], b[NO][W];
#pragma unroll
        for (int i = 0; i < NI; i++)
            kc_load_pack<T>(a[i], p.in[i] + k * W);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float x[NI], y[NO];
#pragma unroll
            for (int i = 0; i < NI; i++)
                x[i] = a[i][j];
            f(x, y);
#pragma unroll
            for (int o = 0; o < NO; o++)
                b[o][j] = y[o];
        }
#pragma unroll
        for (int o = 0; o < NO; o++)
            kc_store_pack<T>(p.out[o] + k * W, b[o]);
    }
    for (size_t i = nv * W + tid; i < n; i += stride) {
        float x[NI], y[NO];
#pragma unroll
        for (int q = 0; q < NI; q++)
            x[q] = kc_f(p.in[q][i]);
        f(x, y);
#pragma unroll
        for (int o = 0; o < NO; o++)
            p.out[o][i] = kc_to<T>(y[o]);
    }
}

/* Launches kc_ew_kernel over n elements of dtype dt. */
template <int NI, int NO, typename F>
int kc_ew_launch(const void *const *in, void *const *out, size_t n,
                 kcuda_dtype dt, F f, cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    if (n == 0)
        return 0;
    int vec = 1;
    for (int i = 0; i < NI; i++)
        vec &= kcuda__aligned16(in[i]);
    for (int o = 0; o < NO; o++)
        vec &= kcuda__aligned16(out[o]);
    KCUDA_DISPATCH(dt, T, {
        kc_ew_ptrs<T, NI, NO> p;
        for (int i = 0; i < NI; i++)
            p.in[i] = (const T *)in[i];
        for (int o = 0; o < NO; o++)
            p.out[o] = (T *)out[o];
        size_t work = vec ? n / kc_pack<T>::W + 1 : n;
        kc_ew_kernel<T, NI, NO, F>
            <<<kcuda__blocks(work, 256), 256, 0, s>>>(p, n, vec, f);
        KCUDA_LAUNCHED("kc_ew_kernel");
    });
    return 0;
}

#endif
