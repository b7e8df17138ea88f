/* common.cu — what every kcuda op shares: the last-error text (one per
 * thread), the no-crash device probe, dtype conversion, and the context
 * (cuBLASLt handle, workspace, scratch).
 */
#include <dlfcn.h>  /* defines: dlopen, dlclose, dlerror */
#include <stdarg.h> /* defines: va_list */
#include <stdio.h>  /* defines: snprintf, vsnprintf */
#include <stdint.h> /* defines: uint64_t, UINT64_MAX */
#include <stdlib.h> /* defines: calloc, free */
#include <string.h> /* defines: strrchr, memset */

#include "kcuda_impl.h"

/* ---- errors ------------------------------------------------------------- */

static thread_local char kcuda_errbuf[512];
/* the bytes the last failure could not allocate (kcuda_failed_alloc_bytes) */
static thread_local size_t kcuda_oom_bytes;

const char *kcuda_last_error(void)
{
    return kcuda_errbuf;
}

int kcuda_out_of_memory(int rc)
{
    return rc == (int)cudaErrorMemoryAllocation;
}

size_t kcuda_failed_alloc_bytes(void)
{
    return kcuda_oom_bytes;
}

/* The file's last path component, for shorter messages. */
static const char *base_name(const char *file)
{
    const char *s = strrchr(file, '/');
    return s ? s + 1 : file;
}

int kcuda__fail(int code, const char *file, int line, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(kcuda_errbuf, sizeof kcuda_errbuf, "%s:%d: %s", base_name(file),
             line, msg);
    kcuda_oom_bytes = 0; /* (kcuda_alloc sets it after its failure) */
    return code;
}

int kcuda__cuda_fail(cudaError_t e, const char *what, const char *file,
                     int line)
{
    return kcuda__fail((int)e, file, line, "%s: %s (%s, %d)%s", what,
                       cudaGetErrorString(e), cudaGetErrorName(e), (int)e,
                       kcuda_fault_hint((int)e));
}

const char *kcuda_fault_hint(int cuda_error)
{
    switch ((cudaError_t)cuda_error) {
    case cudaErrorECCUncorrectable:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
        return ": a kernel faulted on this GPU (here or earlier; it takes no more work): "
               "CUDA_LAUNCH_BLOCKING=1 names the kernel, compute-sanitizer the bad access";
    default: return "";
    }
}

const char *kcuda__gpu_fault(cudaStream_t s, char *buf, size_t n)
{
    cudaError_t e = cudaStreamQuery(s); /* a fault is sticky: every call after it returns it */
    if (e == cudaSuccess || e == cudaErrorNotReady)
        return "";
    if (!kcuda_fault_hint((int)e)[0]) { /* some other error: not this call's to report */
        (void)cudaGetLastError();
        return "";
    }
    snprintf(buf, n, "; the GPU: %s (%s, %d)%s", cudaGetErrorString(e), cudaGetErrorName(e), (int)e,
             kcuda_fault_hint((int)e));
    return buf;
}

/* ---- the probe ---------------------------------------------------------- */

int kcuda_available(char *why, size_t n)
{
    char none[1];
    int count = 0;
    if (!why || n == 0) {
        why = none;
        n = sizeof none;
    }
    why[0] = '\0';
    /* the cheapest probe, and the one that cannot crash: no driver means
     * no libcuda.so.1 (the toolkit's stub is libcuda.so only) */
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
        const char *e = dlerror();
        snprintf(why, n, "no CUDA driver (%s)",
                 e ? e : "libcuda.so.1 not found");
        return 0;
    }
    dlclose(driver);
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, n, "cudaGetDeviceCount: %s (%s, %d)",
                 cudaGetErrorString(rc), cudaGetErrorName(rc), (int)rc);
        return 0;
    }
    if (count <= 0) {
        snprintf(why, n, "no CUDA device (cudaGetDeviceCount found none)");
        return 0;
    }
    return 1;
}

size_t kcuda_dtype_size(kcuda_dtype dt)
{
    return dt == KCUDA_F32 ? 4 : 2;
}

/* ---- conversion --------------------------------------------------------- */

template <typename D, typename S>
__global__ void convert_kernel(D *dst, const S *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        dst[i] = kc_to<D>(kc_f(src[i]));
}

int kcuda_convert(void *dst, kcuda_dtype dst_dt, const void *src,
                  kcuda_dtype src_dt, size_t n, void *stream)
{
    KCUDA_DT_OK(dst_dt);
    KCUDA_DT_OK(src_dt);
    KCUDA_ARG(dst_dt == src_dt || dst != src,
              "kcuda_convert: dst and src alias across dtypes");
    cudaStream_t s = kcuda__stream(stream);
    if (n == 0 || dst == src) /* (the same dtype: nothing to do; a copy's areas may not overlap) */
        return 0;
    if (dst_dt == src_dt) {
        KCUDA_CHECK(cudaMemcpyAsync(dst, src, n * kcuda_dtype_size(dst_dt),
                                    cudaMemcpyDeviceToDevice, s));
        return 0;
    }
    unsigned blocks = kcuda__blocks(n, 256);
    KCUDA_DISPATCH(dst_dt, D, {
        KCUDA_DISPATCH(src_dt, S, {
            convert_kernel<D, S><<<blocks, 256, 0, s>>>((D *)dst, (const S *)src, n);
        });
    });
    KCUDA_LAUNCHED("convert_kernel");
    return 0;
}

/* ---- the context -------------------------------------------------------- */

void kcuda_ctx_set_deterministic(kcuda_ctx *ctx, int mode)
{
    if (ctx)
        ctx->dq_atomics = mode == 0 ? 1 : mode == 2 ? 2 : 0;
}

void kcuda_ctx_set_gemm_tune(kcuda_ctx *ctx, int mode)
{
    if (ctx)
        ctx->gemm_tune = mode == 1 || mode == 2 ? mode : 0;
}

void kcuda_ctx_set_tf32(kcuda_ctx *ctx, int on)
{
    if (ctx)
        ctx->tf32 = on != 0;
}

int kcuda_ctx_gemm_tune_stats(const kcuda_ctx *ctx,
                              kcuda_gemm_tune_stats *out)
{
    if (out) {
        memset(out, 0, sizeof *out);
        if (ctx)
            *out = ctx->tune_stats;
    }
    return ctx ? ctx->gemm_tune : 0;
}

void kcuda_gemm_tune_describe(const kcuda_gemm_tune_stats *st, char *buf,
                              size_t n)
{
    if (!buf || n == 0)
        return;
    if (!st) {
        buf[0] = 0;
        return;
    }
    snprintf(buf, n,
             "%d shapes tuned, %d candidates timed; set aside: %d split k, "
             "%d other kernels, %d other bits; %d refused, %d changed, %d "
             "without the memory, %d too small",
             st->shapes, st->timed, st->split, st->other_kernel,
             st->other_bits, st->refused, st->changed, st->no_memory,
             st->small);
}

int kcuda_ctx_create(kcuda_ctx **out)
{
    KCUDA_ARG(out != NULL, "kcuda_ctx_create: out is NULL");
    *out = NULL;
    kcuda_ctx *c = (kcuda_ctx *)calloc(1, sizeof *c);
    if (!c)
        return kcuda__fail(KCUDA_ERR_ARG, __FILE__, __LINE__,
                           "kcuda_ctx_create: out of host memory");
    cublasStatus_t st = cublasLtCreate(&c->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(c);
        return kcuda__fail(KCUDA_ERR_BLAS, __FILE__, __LINE__,
                           "cublasLtCreate: %s", cublasLtGetStatusString(st));
    }
    cudaError_t e = cudaMalloc(&c->workspace, KCUDA_WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        cublasLtDestroy(c->lt);
        free(c);
        return kcuda__cuda_fail(e, "cudaMalloc(cuBLASLt workspace)", __FILE__,
                                __LINE__);
    }
    c->workspace_bytes = KCUDA_WORKSPACE_BYTES;
    /* the default pool keeps freed memory: no trimming at a synchronize */
    int dev = 0;
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess ||
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold,
                                &keep) != cudaSuccess) {
        e = cudaGetLastError();
        cudaFree(c->workspace);
        cublasLtDestroy(c->lt);
        free(c);
        return kcuda__cuda_fail(e, "the default memory pool", __FILE__,
                                __LINE__);
    }
    *out = c;
    return 0;
}

int kcuda_alloc(void **p, size_t bytes, void *stream)
{
    KCUDA_ARG(p != NULL, "kcuda_alloc: p is NULL");
    *p = NULL;
    cudaError_t e = cudaMallocAsync(p, bytes ? bytes : 1, kcuda__stream(stream));
    if (e == cudaSuccess)
        return 0;
    *p = NULL;
    int rc = kcuda__fail((int)e, __FILE__, __LINE__, "cudaMallocAsync of %zu bytes: %s (%s, %d)%s", bytes,
                         cudaGetErrorString(e), cudaGetErrorName(e), (int)e, kcuda_fault_hint((int)e));
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* (not sticky: the device goes on) */
        kcuda_oom_bytes = bytes;
    }
    return rc;
}

int kcuda_free(void *p, void *stream)
{
    if (p)
        KCUDA_CHECK(cudaFreeAsync(p, kcuda__stream(stream)));
    return 0;
}

void kcuda_ctx_free(kcuda_ctx *ctx)
{
    if (!ctx)
        return;
    (void)cudaDeviceSynchronize(); /* queued work may use the buffers */
    cudaFree(ctx->workspace);
    if (ctx->scratch) { /* stream-ordered (kcuda__scratch) */
        (void)cudaFreeAsync(ctx->scratch, 0);
        (void)cudaStreamSynchronize(0);
    }
    kcuda__cudnn_free(ctx->cudnn);
    cublasLtDestroy(ctx->lt);
    free(ctx);
}

int kcuda__scratch(kcuda_ctx *ctx, size_t bytes, void **out,
                   cudaStream_t stream)
{
    KCUDA_ARG(ctx != NULL, "this op needs a kcuda_ctx (got NULL)");
    if (bytes == 0)
        bytes = 256;
    if (bytes > ctx->scratch_bytes) {
        /* grow by half again, so that a run of growing calls stays short;
         * just `bytes` when the half does not fit */
        size_t want = bytes + bytes / 2;
        /* stream-ordered: the old buffer's users on the stream run first,
         * and no other stream is waited for (kcuda_alloc) */
        void *old = ctx->scratch;
        ctx->scratch = NULL;
        ctx->scratch_bytes = 0;
        KCUDA_TRY(kcuda_free(old, stream));
        int rc = kcuda_alloc(&ctx->scratch, want, stream);
        if (kcuda_out_of_memory(rc)) {
            want = bytes;
            rc = kcuda_alloc(&ctx->scratch, want, stream);
        }
        KCUDA_TRY(rc);
        ctx->scratch_bytes = want;
    }
    *out = ctx->scratch;
    return 0;
}

size_t kcuda_ctx_scratch_bytes(const kcuda_ctx *ctx)
{
    return ctx ? ctx->scratch_bytes : 0;
}
