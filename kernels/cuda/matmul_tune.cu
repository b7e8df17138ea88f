/* matmul_tune.cu — a product's cuBLASLt algorithm chosen by timing
 * (kcuda_ctx_set_gemm_tune), at a shape's first call.
 *
 * cuBLASLt's heuristic ranks its algorithms by a model of the GPU; its
 * first is not always the fastest on GPT-2's narrow shapes (docs/
 * benchmarks.md: 8192 x 768 x 2304 at 556 TFLOP/s through it, 594 through
 * cublasGemmEx). The tuning runs the heuristic's first few on the call's
 * own operands and keeps the fastest, as PyTorch's TunableOp does, but
 * only among those that compute what the first computes, bit for bit:
 * the first's kernel (its ALGO_ID) with another tile, stages, swizzle or
 * cluster shape, which adds each element's products over k in the same
 * order; not one that splits the sum over k, nor another kernel, both set
 * aside unrun; and, once run, with the first's output (a hash of every
 * element on the device), a check of that order on the call's own data
 * (which a small 2-byte output's rounding may hide: mode 1 tunes only
 * fp32 outputs and those of KCUDA_TUNE_MIN_OUTPUT elements or more, which
 * are also the products that take time).
 * The tuned numbers are then the default's, on every rank and in every
 * run, whichever algorithm a rank's clock picks.
 *
 * Each candidate runs once for its hash, then TUNE_REPS times between two
 * events. A product that adds to C (beta = 1, a backward's accumulation)
 * gets C back before each candidate's first run and at the end, from a
 * copy; one that overwrites C needs none. The first call of a shape waits
 * for the device; later calls find the cached choice (matmul.cu).
 */
#include <math.h>   /* defines: INFINITY */
#include <string.h> /* defines: memset */

#include "kcuda_impl.h"

enum {
    TUNE_REPS = 3,       /* timed runs of each candidate */
    HASH_BLOCKS = 64,    /* the hash's partial sums, added on the host */
    HASH_THREADS = 256,
};

/* Free memory the tuning leaves to the rest of the step. */
#define TUNE_MARGIN ((size_t)64 << 20)

/* A candidate must beat the fastest so far by this much to replace it:
 * the first is kept when the others only tie with it within the events'
 * noise. */
#define TUNE_GAIN 0.99f

/* splitmix64's finalizer: a word's every bit moves about half of the
 * result's. */
__device__ static unsigned long long tune_mix(unsigned long long x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* part[block] = the sum (mod 2^64) over this block's elements of
 * mix(index, bits) of C's batch x rows x cols elements (es bytes each,
 * row stride ld, batch stride stride, in elements): a hash that any order
 * of the additions gives, and that tells two outputs apart unless they
 * have the same bits in the same places. */
__global__ void tune_hash_kernel(const unsigned char *c, int rows, int cols,
                                 long long ld, long long stride, int batch,
                                 int es, unsigned long long *part)
{
    __shared__ unsigned long long sum[HASH_THREADS];
    long long per = (long long)rows * cols, n = per * batch;
    unsigned long long h = 0;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        long long b = e / per, rc = e % per;
        long long off = b * stride + (rc / cols) * ld + rc % cols;
        unsigned long long w =
            es == 2 ? (unsigned long long)((const unsigned short *)c)[off]
                    : (unsigned long long)((const unsigned int *)c)[off];
        h += tune_mix((unsigned long long)e * 0x9e3779b97f4a7c15ull ^ w);
    }
    sum[threadIdx.x] = h;
    __syncthreads();
    for (int half = HASH_THREADS / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half)
            sum[threadIdx.x] += sum[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[blockIdx.x] = sum[0];
}

namespace {

/* What one tuning holds (kcuda__gemm_tune releases it at its end). */
struct tune {
    const kcuda__gemm *g;
    cudaStream_t s;
    size_t span; /* bytes from C to its last element (batches included) */
    void *save;  /* C's bytes, when the product reads C; else NULL */
    unsigned long long *part;
    cudaEvent_t ev[2];
};

/* C as it was (when the product reads it). */
cudaError_t tune_restore(const tune *t)
{
    if (!t->save)
        return cudaSuccess;
    return cudaMemcpyAsync(t->g->C, t->save, t->span, cudaMemcpyDeviceToDevice,
                           t->s);
}

/* *h = the hash of the output, once the stream has computed it. */
cudaError_t tune_hash(const tune *t, unsigned long long *h)
{
    const kcuda__gemm *g = t->g;
    unsigned long long part[HASH_BLOCKS] = {};
    int es = (int)kcuda_dtype_size(g->c_f32 ? KCUDA_F32 : g->dt);
    tune_hash_kernel<<<HASH_BLOCKS, HASH_THREADS, 0, t->s>>>(
        (const unsigned char *)g->C, g->M, g->N, g->ldc, g->sc, g->batch, es,
        t->part);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(part, t->part, sizeof part, cudaMemcpyDeviceToHost,
                            t->s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(t->s);
    *h = 0;
    for (int i = 0; i < HASH_BLOCKS; i++)
        *h += part[i];
    return e;
}

/* An algorithm's configuration attribute, or -1 when it does not say. */
long long config_of(const cublasLtMatmulAlgo_t *algo,
                    cublasLtMatmulAlgoConfigAttributes_t attr)
{
    uint32_t v = 0; /* the three asked for are 4 bytes */
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &v, sizeof v,
                                             &written) != CUBLAS_STATUS_SUCCESS ||
        written != sizeof v)
        return -1;
    return (long long)v;
}

/* Why a candidate cannot give the first algorithm's bits, by its
 * configuration: 1 when it splits the sum over k (SPLITK_NUM > 1, or a
 * reduction scheme), 2 when it is another kernel (another ALGO_ID: its
 * tensor-core instructions may add a k step's products otherwise), 0 when
 * it is the first's kernel with another tile, stages, swizzle or cluster,
 * which sum each element over k in the same order. An attribute it does
 * not say counts against it. */
int set_aside(const cublasLtMatmulAlgo_t *algo, long long first_id)
{
    long long split = config_of(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    long long red = config_of(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    if (split != 1 || red != CUBLASLT_REDUCTION_SCHEME_NONE)
        return 1;
    long long id = config_of(algo, CUBLASLT_ALGO_CONFIG_ID);
    return id < 0 || id != first_id ? 2 : 0;
}

} /* namespace */

/* A cuBLASLt failure other than a refusal, as an error of the tuning. */
static int tune_blas_fail(const kcuda__gemm *g, cublasStatus_t ls,
                          cudaStream_t s)
{
    char fault[320];
    return kcuda__fail(KCUDA_ERR_BLAS, __FILE__, __LINE__,
                       "cublasLtMatmul failed (tuning M=%d N=%d K=%d): %s%s",
                       g->M, g->N, g->K, cublasLtGetStatusString(ls),
                       kcuda__gpu_fault(s, fault, sizeof fault));
}

int kcuda__gemm_tunes(kcuda_ctx *ctx, const kcuda__gemm *g)
{
    if (!ctx->gemm_tune)
        return 0;
    if (ctx->gemm_tune == 1 && !g->c_f32 && kcuda_dtype_size(g->dt) == 2 &&
        (double)g->M * g->N * g->batch < (double)KCUDA_TUNE_MIN_OUTPUT) {
        ctx->tune_stats.small++; /* little time to gain, and a weak check */
        return 0;
    }
    return 1;
}

int kcuda__gemm_tune(kcuda_ctx *ctx, const kcuda__gemm *g,
                     const kcuda__lt_call *call,
                     const cublasLtMatmulHeuristicResult_t *res, int n,
                     cudaStream_t s, int *pick)
{
    *pick = 0;
    kcuda_gemm_tune_stats *st = &ctx->tune_stats;
    size_t es = kcuda_dtype_size(g->c_f32 ? KCUDA_F32 : g->dt);
    tune t;
    memset(&t, 0, sizeof t);
    t.g = g;
    t.s = s;
    t.span = ((size_t)(g->batch - 1) * (size_t)g->sc +
              (size_t)(g->M - 1) * (size_t)g->ldc + (size_t)g->N) * es;
    size_t hash_bytes = HASH_BLOCKS * sizeof(unsigned long long);
    size_t need = hash_bytes + (g->beta != 0.0f ? t.span : 0);
    size_t free_bytes = 0, total = 0;
    KCUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (free_bytes < need + TUNE_MARGIN) {
        st->no_memory++;
        return 0;
    }
    int rc = 0, tuned = 0;
    void *buf = NULL;
    unsigned long long ref = 0;
    float best = INFINITY;
    long long first_id = config_of(&res[0].algo, CUBLASLT_ALGO_CONFIG_ID);
    cudaError_t e = cudaMallocAsync(&buf, need, s);
    if (e == cudaSuccess) {
        t.part = (unsigned long long *)buf;
        if (g->beta != 0.0f) {
            t.save = (char *)buf + hash_bytes;
            e = cudaMemcpyAsync(t.save, g->C, t.span, cudaMemcpyDeviceToDevice,
                                s);
        }
    }
    if (e == cudaSuccess)
        e = cudaEventCreate(&t.ev[0]);
    if (e == cudaSuccess)
        e = cudaEventCreate(&t.ev[1]);
    for (int i = 0; i < n && e == cudaSuccess && rc == 0; i++) {
        int why = i > 0 ? set_aside(&res[i].algo, first_id) : 0;
        if (why) {
            st->split += why == 1;
            st->other_kernel += why == 2;
            continue;
        }
        e = tune_restore(&t);
        if (e != cudaSuccess)
            break;
        cublasStatus_t ls = kcuda__lt_matmul(ctx, g, call, &res[i].algo, s);
        if (ls == CUBLAS_STATUS_NOT_SUPPORTED ||
            ls == CUBLAS_STATUS_INVALID_VALUE) {
            st->refused++;
            if (i == 0) /* the first refused: the caller's call says so */
                break;
            continue;
        }
        if (ls != CUBLAS_STATUS_SUCCESS) {
            rc = tune_blas_fail(g, ls, s);
            break;
        }
        unsigned long long h = 0;
        e = tune_hash(&t, &h);
        if (e != cudaSuccess)
            break;
        if (i == 0) {
            ref = h;
        } else if (h != ref) {
            st->other_bits++;
            continue;
        }
        e = cudaEventRecord(t.ev[0], s);
        for (int r = 0; r < TUNE_REPS && e == cudaSuccess && rc == 0; r++) {
            ls = kcuda__lt_matmul(ctx, g, call, &res[i].algo, s);
            if (ls != CUBLAS_STATUS_SUCCESS)
                rc = tune_blas_fail(g, ls, s);
        }
        float ms = 0.0f;
        if (e == cudaSuccess && rc == 0)
            e = cudaEventRecord(t.ev[1], s);
        if (e == cudaSuccess && rc == 0)
            e = cudaEventSynchronize(t.ev[1]);
        if (e == cudaSuccess && rc == 0)
            e = cudaEventElapsedTime(&ms, t.ev[0], t.ev[1]);
        if (e != cudaSuccess || rc != 0)
            break;
        st->timed++;
        tuned = 1;
        if (i == 0 || ms < best * TUNE_GAIN) {
            best = ms;
            *pick = i;
        }
    }
    if (e == cudaSuccess && rc == 0)
        e = tune_restore(&t);
    if (e != cudaSuccess && rc == 0)
        rc = kcuda__cuda_fail(e, "the tuning of a matmul", __FILE__, __LINE__);
    for (int i = 0; i < 2; i++)
        if (t.ev[i])
            (void)cudaEventDestroy(t.ev[i]);
    if (buf)
        (void)cudaFreeAsync(buf, s);
    if (rc) {
        *pick = 0;
        return rc;
    }
    if (tuned) {
        st->shapes++;
        st->changed += *pick != 0;
    }
    return 0;
}
