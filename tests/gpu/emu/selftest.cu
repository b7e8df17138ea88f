/* selftest.cu (CPU emulation, tests/gpu/emu): the emulator against CUDA's
 * documented semantics, and against the mistakes it must catch (a lenient
 * emulator proves nothing). Built and launched like the kernels (its
 * <<<...>>> rewritten by launch_rewrite.py); it uses only CUDA's API.
 *
 * usage: emu_selftest [NAME]   (no argument: every case, each in a
 * process of its own, since a kernel fault is sticky for the process)
 *
 * Prints `ok N - name` / `not ok N - name`, then `# N passed, N failed`.
 * Under ThreadSanitizer the race cases must end in a TSan report (exit
 * code 66: the Makefile's TSAN_OPTIONS); without it they are skipped.
 */
#include <cub/device/device_radix_sort.cuh>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <math.h>     /* tanhf */
#include <stdio.h>    /* printf */
#include <stdlib.h>   /* exit */
#include <string.h>   /* strcmp */
#include <sys/wait.h> /* waitpid */
#include <unistd.h>   /* fork, execv */

#include <vector> /* std::vector */

using namespace nvcuda;

#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#else
#define TSAN 0
#endif

static int fails;
static std::vector<void *> allocs; /* freed after the case */

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "# %s:%d: %s\n", __FILE__, __LINE__, #cond);       \
            fails++;                                                           \
        }                                                                      \
    } while (0)

template <class T> static T *dalloc(size_t n)
{
    void *p = nullptr;
    if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
        fprintf(stderr, "# cudaMalloc failed\n");
        exit(1);
    }
    cudaMemset(p, 0, n * sizeof(T));
    cudaDeviceSynchronize(); /* (the set is queued on the legacy stream, which a
                                non-blocking stream's work does not wait for) */
    allocs.push_back(p);
    return static_cast<T *>(p);
}

/* ---- launches ---------------------------------------------------------------- */

__global__ void k_count(int *n)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        *n += 1;
}

__global__ void k_smem(int *n)
{
    extern __shared__ __align__(128) unsigned char smem[];
    if (threadIdx.x == 0) {
        smem[0] = 1;
        *n += 1;
    }
}

static void t_launch_limits()
{
    int *n = dalloc<int>(1);
    k_count<<<1, 1025>>>(n);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess); /* not sticky */
    k_count<<<dim3(1, 65536), 32>>>(n);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    k_count<<<1, dim3(32, 2, 65)>>>(n);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    k_count<<<0, 32>>>(n);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    k_smem<<<1, 32, 48 * 1024 + 1>>>(n);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               227 * 1024 + 1) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue); /* a call's error too */
    CHECK(cudaFuncSetAttribute(k_smem, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               100 * 1024) == cudaSuccess);
    k_smem<<<1, 32, 100 * 1024>>>(n);
    CHECK(cudaGetLastError() == cudaSuccess);
    k_smem<<<1, 32, 100 * 1024 + 1>>>(n);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    k_count<<<3, 64, 0, (cudaStream_t)0x1234>>>(n);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    int h = -1;
    cudaMemcpy(&h, n, 4, cudaMemcpyDeviceToHost);
    CHECK(h == 1); /* only the valid launch ran */
}

/* ---- built-in variables, barriers, the 0xff fill -------------------------------- */

__global__ void k_ids(unsigned *out)
{
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] = b * 100000u + t;
}

/* Every thread writes its slot, then reads another warp's: right only
 * with the barrier. Also reads a slot nobody writes: the fill. */
__global__ void k_barrier(float *out, unsigned *unwritten)
{
    __shared__ float sh[257];
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned t = threadIdx.x;
    sh[t] = (float)(t + blockIdx.x);
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = sh[(t + 37) % blockDim.x];
    if (t == 0) {
        float u = sh[256];
        memcpy(&unwritten[blockIdx.x * 2], &u, 4);
        memcpy(&unwritten[blockIdx.x * 2 + 1], smem + 8, 4);
    }
    __syncthreads();
    if (t == 0) {
        sh[256] = 1.0f; /* the next block on this runner must not see it */
        smem[8] = 0;
    }
}

static void t_threads()
{
    dim3 grid(3, 2, 2), block(8, 4, 2);
    unsigned nb = 12, nt = 64;
    unsigned *ids = dalloc<unsigned>(nb * nt);
    k_ids<<<grid, block>>>(ids);
    CHECK(cudaGetLastError() == cudaSuccess);
    std::vector<unsigned> h(nb * nt);
    cudaMemcpy(h.data(), ids, h.size() * 4, cudaMemcpyDeviceToHost);
    for (unsigned i = 0; i < nb * nt; i++)
        CHECK(h[i] == i / nt * 100000u + i % nt);
    float *out = dalloc<float>(9 * 256);
    unsigned *uw = dalloc<unsigned>(18);
    k_barrier<<<9, 256, 64>>>(out, uw);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> o(9 * 256);
    std::vector<unsigned> u(18);
    cudaMemcpy(o.data(), out, o.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(u.data(), uw, u.size() * 4, cudaMemcpyDeviceToHost);
    for (unsigned b = 0; b < 9; b++) {
        for (unsigned t = 0; t < 256; t++)
            CHECK(o[b * 256 + t] == (float)((t + 37) % 256 + b));
        CHECK(u[2 * b] == 0xffffffffu && u[2 * b + 1] == 0xffffffffu);
    }
}

/* ---- warp shuffles ------------------------------------------------------------- */

__global__ void k_shfl(int *out)
{
    int l = (int)threadIdx.x, v = 100 + l;
    int *o = out + 8 * l;
    o[0] = __shfl_xor_sync(0xffffffffu, v, 5);
    o[1] = __shfl_xor_sync(0xffffffffu, v, 9, 8);  /* into a later group: own */
    o[2] = __shfl_up_sync(0xffffffffu, v, 3);
    o[3] = __shfl_up_sync(0xffffffffu, v, 3, 8);
    o[4] = __shfl_down_sync(0xffffffffu, v, 3);
    o[5] = __shfl_down_sync(0xffffffffu, v, 3, 8);
    o[6] = __shfl_sync(0xffffffffu, v, 35);       /* 35 % 32 */
    o[7] = __shfl_sync(0xffffffffu, v, 6, 4);
    double d = __shfl_xor_sync(0xffffffffu, 0.5 + l, 1);
    if (d != 0.5 + (l ^ 1))
        o[0] = -1;
}

static void t_shfl()
{
    int *out = dalloc<int>(32 * 8);
    k_shfl<<<1, 32>>>(out);
    std::vector<int> h(32 * 8);
    cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost);
    for (int l = 0; l < 32; l++) {
        const int *o = &h[8 * l];
        CHECK(o[0] == 100 + (l ^ 5));
        CHECK(o[1] == ((l ^ 9) / 8 > l / 8 ? 100 + l : 100 + (l ^ 9)));
        CHECK(o[2] == (l >= 3 ? 100 + l - 3 : 100 + l));
        CHECK(o[3] == (l % 8 >= 3 ? 100 + l - 3 : 100 + l));
        CHECK(o[4] == (l + 3 < 32 ? 100 + l + 3 : 100 + l));
        CHECK(o[5] == (l % 8 + 3 < 8 ? 100 + l + 3 : 100 + l));
        CHECK(o[6] == 103);
        CHECK(o[7] == 100 + (l & ~3) + 2);
    }
}

/* A kernel fault: the message, the sticky error, later calls failing. */
static void expect_fault(cudaError_t want)
{
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == want);
    CHECK(cudaGetLastError() == want); /* sticky: not cleared */
    CHECK(cudaGetLastError() == want);
    void *p = nullptr;
    CHECK(cudaMalloc(&p, 16) == want);
}

__global__ void k_shfl_exited(int *out)
{
    if (threadIdx.x >= 16)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

static void t_shfl_exited()
{
    k_shfl_exited<<<1, 32>>>(dalloc<int>(32));
    expect_fault(cudaErrorIllegalInstruction);
}

__global__ void k_shfl_not_in_mask(int *out)
{
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 0);
}

static void t_shfl_not_in_mask()
{
    k_shfl_not_in_mask<<<1, 32>>>(dalloc<int>(32));
    expect_fault(cudaErrorIllegalInstruction);
}

__global__ void k_shfl_reads_outside(int *out)
{
    if (threadIdx.x < 16) /* lane 3 reads lane 19, not in the mask */
        out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (int)threadIdx.x, 16);
}

static void t_shfl_reads_outside()
{
    k_shfl_reads_outside<<<1, 32>>>(dalloc<int>(32));
    expect_fault(cudaErrorIllegalInstruction);
}

__global__ void k_sync_exited(int *out)
{
    if (threadIdx.x >= 64)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

static void t_sync_exited()
{
    k_sync_exited<<<1, 128>>>(dalloc<int>(128));
    expect_fault(cudaErrorIllegalInstruction);
}

__global__ void k_deadlock(int *out)
{
    if (threadIdx.x % 32 < 16)
        __syncwarp();
    else
        __syncthreads();
    out[threadIdx.x] = 1;
}

static void t_deadlock()
{
    k_deadlock<<<1, 64>>>(dalloc<int>(64));
    expect_fault(cudaErrorLaunchFailure);
}

/* ---- WMMA -------------------------------------------------------------------- */

/* c[16x16] = a b (+ c0), a row-major, b column-major, through shared
 * memory, with the ordering __syncwarp gives. */
template <class T>
__global__ void k_wmma(float *c, const T *a, const T *b, int offset, unsigned ldm)
{
    __shared__ __align__(128) T sa[16 * 24 + 64];
    __shared__ __align__(128) T sb[16 * 24];
    __shared__ __align__(128) float sc[16 * 16];
    for (int i = threadIdx.x; i < 256; i += 32) {
        sa[offset + i / 16 * 24 + i % 16] = a[i];
        sb[i / 16 * 24 + i % 16] = b[i]; /* b[n][k]: column-major k x n */
        sc[i] = 1.0f;
    }
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, sa + offset, ldm);
    wmma::load_matrix_sync(fb, sb, 24);
    wmma::load_matrix_sync(acc, sc, 16, wmma::mem_row_major);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_col_major);
}

template <class T, class C> static void wmma_case(C conv, float (*back)(T))
{
    std::vector<T> ha(256), hb(256);
    std::vector<float> fa(256), fb(256);
    for (int i = 0; i < 256; i++) {
        ha[i] = conv((float)((i * 7) % 13) - 6.0f);
        hb[i] = conv((float)((i * 5) % 11) * 0.25f - 1.0f);
        fa[i] = back(ha[i]);
        fb[i] = back(hb[i]);
    }
    T *da = dalloc<T>(256), *db = dalloc<T>(256);
    float *dc = dalloc<float>(256);
    cudaMemcpy(da, ha.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), 512, cudaMemcpyHostToDevice);
    k_wmma<T><<<1, 32>>>(dc, da, db, 0, 24);
    std::vector<float> c(256);
    CHECK(cudaMemcpy(c.data(), dc, 1024, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = 1.0f;
            for (int k = 0; k < 16; k++)
                want += fa[m * 16 + k] * fb[n * 16 + k];
            CHECK(c[n * 16 + m] == want); /* stored column-major */
        }
}

static __nv_bfloat16 to_bf16(float f)
{
    return __float2bfloat16_rn(f);
}
static float from_bf16(__nv_bfloat16 h)
{
    return __bfloat162float(h);
}
static __half to_f16(float f)
{
    return __float2half_rn(f);
}
static float from_f16(__half h)
{
    return __half2float(h);
}

static void t_wmma()
{
    wmma_case<__nv_bfloat16>(to_bf16, from_bf16);
    wmma_case<__half>(to_f16, from_f16);
}

static void t_wmma_misaligned()
{
    __nv_bfloat16 *d = dalloc<__nv_bfloat16>(256);
    k_wmma<__nv_bfloat16><<<1, 32>>>(dalloc<float>(256), d, d, 8, 24); /* 16 bytes in */
    expect_fault(cudaErrorMisalignedAddress);
}

static void t_wmma_bad_ldm()
{
    __half *d = dalloc<__half>(256);
    k_wmma<__half><<<1, 32>>>(dalloc<float>(256), d, d, 0, 20); /* not a multiple of 8 */
    expect_fault(cudaErrorMisalignedAddress);
}

__global__ void k_wmma_diverge(float *c)
{
    __shared__ __align__(128) float sc[2][256];
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::store_matrix_sync(sc[threadIdx.x & 1], acc, 16, wmma::mem_row_major);
    c[threadIdx.x] = sc[0][threadIdx.x];
}

static void t_wmma_diverge()
{
    k_wmma_diverge<<<1, 32>>>(dalloc<float>(32));
    expect_fault(cudaErrorIllegalInstruction);
}

/* ---- conversions ------------------------------------------------------------------ */

static void t_convert()
{
    /* ties to even, subnormals, overflow, NaN */
    CHECK(__float2bfloat16_rn(1.0f + 0x1p-8f).__x == 0x3f80);         /* tie, to even */
    CHECK(__float2bfloat16_rn(1.0f + 0x1p-7f + 0x1p-8f).__x == 0x3f82); /* tie, up */
    CHECK(__float2bfloat16_rn(3.0e38f * 1.2f).__x == 0x7f80);
    CHECK(__float2bfloat16_rn(NAN).__x == 0x7fff);
    CHECK(__float2half_rn(1.0f + 0x1p-11f).__x == 0x3c00);
    CHECK(__float2half_rn(65504.0f).__x == 0x7bff);
    CHECK(__float2half_rn(65519.0f).__x == 0x7bff);
    CHECK(__float2half_rn(65520.0f).__x == 0x7c00);
    CHECK(__float2half_rn(0x1p-24f).__x == 0x0001);
    CHECK(__float2half_rn(0x1p-25f).__x == 0x0000);
    CHECK(__float2half_rn(0x1.8p-25f).__x == 0x0001);
    CHECK(__float2half_rn(-0x1p-14f).__x == 0x8400);
    CHECK(__float2half_rn(NAN).__x == 0x7fff);
    __half h;
    h.__x = 0x0001;
    CHECK(__half2float(h) == 0x1p-24f);
    h.__x = 0xfbff;
    CHECK(__half2float(h) == -65504.0f);
    __nv_bfloat16 b;
    b.__x = 0xc0a0;
    CHECK(__bfloat162float(b) == -5.0f);
}

/* ---- memory ----------------------------------------------------------------------- */

static void t_memory()
{
    char *p = dalloc<char>(100);
    char host[200] = {0};
    CHECK(cudaMemcpy(p, host, 100, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(p + 1, host, 100, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(host, p, 101, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(cudaMemset(p + 50, 0, 51) == cudaErrorInvalidValue);
    CHECK(cudaMemcpyAsync(p, p + 10, 20, cudaMemcpyDeviceToDevice, 0) == cudaErrorInvalidValue);
    CHECK(cudaFree(p + 1) == cudaErrorInvalidValue);
    CHECK(cudaFree(host) == cudaErrorInvalidValue);
    CHECK((uintptr_t)p % 256 == 0);
    void *q = nullptr;
    CHECK(cudaMalloc(&q, 7) == cudaSuccess && (uintptr_t)q % 256 == 0);
    CHECK(cudaFree(q) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue); /* cudaFree(host)'s */
    CHECK(cudaGetLastError() == cudaSuccess);
}

/* ---- cuBLASLt ------------------------------------------------------------------------ */

struct Lt {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulPreference_t p;
};

static cublasStatus_t lt_setup(Lt &t, cudaDataType_t dt, int m, int n, int k, int ta, int tb,
                               int lda, int ldb, int ldc)
{
    cublasLtCreate(&t.h);
    cublasLtMatmulDescCreate(&t.d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa);
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob);
    cublasLtMatrixLayoutCreate(&t.a, dt, ta ? k : m, ta ? m : k, lda);
    cublasLtMatrixLayoutCreate(&t.b, dt, tb ? n : k, tb ? k : n, ldb);
    cublasLtMatrixLayoutCreate(&t.c, dt, m, n, ldc);
    return cublasLtMatmulPreferenceCreate(&t.p);
}

static cublasStatus_t lt_heur(Lt &t, cublasLtMatmulHeuristicResult_t *r)
{
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(t.h, t.d, t.a, t.b, t.c, t.c, t.p, 1, r, &found);
    return st == CUBLAS_STATUS_SUCCESS && found != 1 ? CUBLAS_STATUS_INTERNAL_ERROR : st;
}

static void t_cublaslt()
{
    /* D[m,n] = op(A) op(B) + bias, GELU with aux, bf16, A^T and B^T */
    const int m = 24, n = 10, k = 7, lda = 9, ldb = 12, ldc = 32;
    Lt t;
    lt_setup(t, CUDA_R_16BF, m, n, k, 1, 1, lda, ldb, ldc);
    std::vector<__nv_bfloat16> A(lda * m), B(ldb * k), bias(m);
    std::vector<float> fA(lda * m), fB(ldb * k), fbias(m);
    for (size_t i = 0; i < A.size(); i++)
        fA[i] = __bfloat162float(A[i] = __float2bfloat16_rn((float)((i * 3) % 7) * 0.5f - 1.5f));
    for (size_t i = 0; i < B.size(); i++)
        fB[i] = __bfloat162float(B[i] = __float2bfloat16_rn((float)((i * 5) % 9) * 0.25f - 1.0f));
    for (int i = 0; i < m; i++)
        fbias[i] = __bfloat162float(bias[i] = __float2bfloat16_rn(0.125f * (float)i - 1.0f));
    __nv_bfloat16 *dA = dalloc<__nv_bfloat16>(A.size()), *dB = dalloc<__nv_bfloat16>(B.size());
    __nv_bfloat16 *dbias = dalloc<__nv_bfloat16>(m), *dD = dalloc<__nv_bfloat16>(ldc * n);
    __nv_bfloat16 *daux = dalloc<__nv_bfloat16>(ldc * n);
    cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dbias, bias.data(), m * 2, cudaMemcpyHostToDevice);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    int64_t auxld = 28; /* not a multiple of 8 */
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias);
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &daux,
                                   sizeof daux);
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld,
                                   sizeof auxld);
    cublasLtMatmulHeuristicResult_t r;
    CHECK(lt_heur(t, &r) == CUBLAS_STATUS_NOT_SUPPORTED);
    auxld = 16; /* below D's 24 rows */
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld,
                                   sizeof auxld);
    CHECK(lt_heur(t, &r) == CUBLAS_STATUS_INVALID_VALUE);
    auxld = 32;
    cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld,
                                   sizeof auxld);
    CHECK(cublasLtMatmulDescSetAttribute(t.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld, 4) ==
          CUBLAS_STATUS_INVALID_VALUE); /* the attribute's size */
    CHECK(lt_heur(t, &r) == CUBLAS_STATUS_SUCCESS);
    float alpha = 1.0f, beta = 0.0f;
    CHECK(cublasLtMatmul(t.h, t.d, &alpha, dA, t.a, dB, t.b, &beta, dD, t.c, dD, t.c, &r.algo,
                         nullptr, 0, 0) == CUBLAS_STATUS_SUCCESS);
    std::vector<__nv_bfloat16> D(ldc * n), X(ldc * n);
    cudaMemcpy(D.data(), dD, D.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(X.data(), daux, X.size() * 2, cudaMemcpyDeviceToHost);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int q = 0; q < k; q++) /* A^T: A is k x m; B^T: B is n x k */
                acc += fA[q + i * lda] * fB[j + q * ldb];
            float pre = acc + fbias[i];
            float g = 0.5f * pre * (1.0f + tanhf(0.7978845608028654f * (pre + 0.044715f * pre * pre * pre)));
            CHECK(D[i + j * ldc].__x == __float2bfloat16_rn(g).__x);
            CHECK(X[i + j * ldc].__x == __float2bfloat16_rn(pre).__x);
        }
    /* the algorithm assumed 16-byte alignment (the default preference) */
    CHECK(cublasLtMatmul(t.h, t.d, &alpha, dA + 1, t.a, dB, t.b, &beta, dD, t.c, dD, t.c,
                         &r.algo, nullptr, 0, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
    /* an inconsistent layout: ld below rows */
    cublasLtMatrixLayout_t bad;
    cublasLtMatrixLayoutCreate(&bad, CUDA_R_16BF, m, n, m - 1);
    int found = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(t.h, t.d, t.a, t.b, bad, bad, t.p, 1, &r, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);
    /* mismatched shapes */
    cublasLtMatrixLayout_t wrong;
    cublasLtMatrixLayoutCreate(&wrong, CUDA_R_16BF, m, n + 1, ldc);
    CHECK(cublasLtMatmulAlgoGetHeuristic(t.h, t.d, t.a, t.b, wrong, wrong, t.p, 1, &r, &found) ==
          CUBLAS_STATUS_INVALID_VALUE);

    /* batched fp32, beta = 1 (C == D), strided */
    Lt u;
    const int bm = 5, bn = 3, bk = 4, nb = 3;
    lt_setup(u, CUDA_R_32F, bm, bn, bk, 0, 0, bm, bk, bm);
    int32_t cnt = nb;
    int64_t sa = bm * bk + 2, sb = bk * bn, sc = bm * bn + 1;
    for (auto l : {u.a, u.b, u.c})
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt);
    cublasLtMatrixLayoutSetAttribute(u.a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sa, 8);
    cublasLtMatrixLayoutSetAttribute(u.b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, 8);
    cublasLtMatrixLayoutSetAttribute(u.c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sc, 8);
    uint32_t four = 4;
    for (auto at : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        cublasLtMatmulPreferenceSetAttribute(u.p, at, &four, sizeof four);
    CHECK(lt_heur(u, &r) == CUBLAS_STATUS_SUCCESS);
    std::vector<float> ha(sa * nb), hb(sb * nb), hc(sc * nb);
    for (size_t i = 0; i < ha.size(); i++)
        ha[i] = (float)(i % 7) - 3.0f;
    for (size_t i = 0; i < hb.size(); i++)
        hb[i] = (float)(i % 5) - 2.0f;
    for (size_t i = 0; i < hc.size(); i++)
        hc[i] = (float)i;
    float *ga = dalloc<float>(ha.size()), *gb = dalloc<float>(hb.size()), *gc = dalloc<float>(hc.size());
    cudaMemcpy(ga, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(gb, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(gc, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice);
    beta = 1.0f;
    CHECK(cublasLtMatmul(u.h, u.d, &alpha, ga, u.a, gb, u.b, &beta, gc, u.c, gc, u.c, &r.algo,
                         nullptr, 0, 0) == CUBLAS_STATUS_SUCCESS);
    std::vector<float> got(hc.size());
    cudaMemcpy(got.data(), gc, got.size() * 4, cudaMemcpyDeviceToHost);
    for (int b = 0; b < nb; b++)
        for (int j = 0; j < bn; j++)
            for (int i = 0; i < bm; i++) {
                float acc = 0.0f;
                for (int q = 0; q < bk; q++)
                    acc += ha[b * sa + i + q * bm] * hb[b * sb + q + j * bk];
                CHECK(got[b * sc + i + j * bm] == acc + hc[b * sc + i + j * bm]);
            }
    CHECK(got[sc - 1] == hc[sc - 1]); /* between the batches: untouched */
}

/* ---- cub ------------------------------------------------------------------------------- */

static void t_cub()
{
    const int n = 1000;
    std::vector<int32_t> keys(n), vals(n);
    for (int i = 0; i < n; i++) {
        keys[i] = (i * 7919) % 37 - 10; /* repeats, negatives */
        vals[i] = i;
    }
    int32_t *ki = dalloc<int32_t>(n), *ko = dalloc<int32_t>(n), *vi = dalloc<int32_t>(n),
            *vo = dalloc<int32_t>(n);
    cudaMemcpy(ki, keys.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(vi, vals.data(), n * 4, cudaMemcpyHostToDevice);
    size_t bytes = 0;
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, ki, ko, vi, vo, n) == cudaSuccess);
    CHECK(bytes > 0);
    void *tmp = dalloc<char>(bytes);
    CHECK(cub::DeviceRadixSort::SortPairs(tmp, bytes, ki, ko, vi, vo, n, 0, 32) == cudaSuccess);
    std::vector<int32_t> k2(n), v2(n);
    cudaMemcpy(k2.data(), ko, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(v2.data(), vo, n * 4, cudaMemcpyDeviceToHost);
    for (int i = 1; i < n; i++) {
        CHECK(k2[i - 1] <= k2[i]);
        if (k2[i - 1] == k2[i])
            CHECK(v2[i - 1] < v2[i]); /* stable */
    }
    for (int i = 0; i < n; i++)
        CHECK(keys[v2[i]] == k2[i]);
    /* bits [0, 3) only: stable by the low bits of the (sign-flipped) keys */
    CHECK(cub::DeviceRadixSort::SortPairs(tmp, bytes, ki, ko, vi, vo, n, 0, 3) == cudaSuccess);
    cudaMemcpy(k2.data(), ko, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(v2.data(), vo, n * 4, cudaMemcpyDeviceToHost);
    for (int i = 1; i < n; i++) {
        CHECK((k2[i - 1] & 7) <= (k2[i] & 7));
        if ((k2[i - 1] & 7) == (k2[i] & 7))
            CHECK(v2[i - 1] < v2[i]);
    }
    /* too little storage, overlapping buffers */
    size_t small = bytes - 1;
    CHECK(cub::DeviceRadixSort::SortPairs(tmp, small, ki, ko, vi, vo, n) == cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(tmp, bytes, ki, ki + 1, vi, vo, n) == cudaErrorInvalidValue);
}

/* ---- races (ThreadSanitizer) ------------------------------------------------------------- */

/* Warp 1 reads what warp 0 wrote, no __syncthreads between. */
__global__ void k_race_block(float *out)
{
    __shared__ float sh[64];
    sh[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = sh[(threadIdx.x + 32) % 64];
}

/* Lanes read each other's shared slots after a shuffle, no __syncwarp. */
__global__ void k_race_warp(float *out)
{
    __shared__ float sh[32];
    sh[threadIdx.x] = (float)threadIdx.x;
    float v = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
    out[threadIdx.x] = sh[threadIdx.x ^ 1] + v;
}

/* Two blocks add into one element. */
__global__ void k_race_grid(float *out)
{
    if (threadIdx.x == 0)
        out[0] += 1.0f;
}

/* The same with the barriers: no report. */
__global__ void k_norace(float *out)
{
    __shared__ float sh[64];
    sh[threadIdx.x] = (float)threadIdx.x;
    __syncwarp();
    float v = sh[(threadIdx.x ^ 1) % 64];
    __syncthreads();
    out[blockIdx.x * 64 + threadIdx.x] = sh[(threadIdx.x + 32) % 64] + v;
}

static void t_race_block()
{
    k_race_block<<<1, 64>>>(dalloc<float>(64));
    cudaDeviceSynchronize();
}

static void t_race_warp()
{
    k_race_warp<<<1, 32>>>(dalloc<float>(32));
    cudaDeviceSynchronize();
}

static void t_race_grid()
{
    k_race_grid<<<2, 32>>>(dalloc<float>(1));
    cudaDeviceSynchronize();
}

static void t_norace()
{
    float *o = dalloc<float>(8 * 64);
    k_norace<<<8, 64>>>(o);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> h(8 * 64);
    cudaMemcpy(h.data(), o, h.size() * 4, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 8 * 64; i++)
        CHECK(h[i] == (float)((i % 64 + 32) % 64 + ((i % 64) ^ 1)));
}

/* ---- streams: the device runs behind the host -------------------------------------- */

/* Waits until the host sets *flag (page-locked memory the device reads),
 * then writes v: a stream held until the host lets it go. */
__global__ void k_hold(const int *flag, int *x, int v)
{
    while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
    }
    *x = v;
}

static bool async_streams()
{
    const char *e = getenv("EMU_ASYNC");
    return !e || strcmp(e, "0") != 0;
}

static int *pinned_int(int v)
{
    int *p = nullptr;
    if (cudaMallocHost((void **)&p, sizeof *p) != cudaSuccess) {
        fprintf(stderr, "# cudaMallocHost failed\n");
        exit(1);
    }
    *p = v;
    return p;
}

static int read_dev(const int *x)
{
    int h = -1;
    CHECK(cudaMemcpy(&h, x, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
}

/* A launch returns before its kernel runs; a copy to the host lands when
 * the stream gets to it. (With synchronous streams the kernel would wait
 * for the host forever: the case needs asynchronous streams.) */
static void t_async_launch()
{
    int *flag = pinned_int(0), *out = pinned_int(-1), *x = dalloc<int>(1);
    k_hold<<<1, 1>>>(flag, x, 7);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaMemcpyAsync(out, x, sizeof *x, cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    CHECK(cudaStreamQuery(0) == cudaErrorNotReady);
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    CHECK(cudaStreamSynchronize(0) == cudaSuccess);
    CHECK(*out == 7);
    CHECK(cudaStreamQuery(0) == cudaSuccess);
    cudaFreeHost(flag);
    cudaFreeHost(out);
}

/* cudaStreamWaitEvent holds the waiting stream, not the host. */
static void t_wait_event()
{
    int *flag = pinned_int(0), *x = dalloc<int>(1), *y = dalloc<int>(1);
    cudaStream_t a, b;
    cudaEvent_t e;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    k_hold<<<1, 1, 0, a>>>(flag, x, 7);
    CHECK(cudaEventRecord(e, a) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(y, x, sizeof *x, cudaMemcpyDeviceToDevice, b) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    CHECK(cudaStreamQuery(b) == cudaErrorNotReady);
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(read_dev(y) == 7);
    CHECK(cudaEventQuery(e) == cudaSuccess);
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFreeHost(flag);
}

/* Timed events: the time between two points of a stream's work, and a
 * stream's own wait for another's event between two of its points (as the
 * executor measures the compute stream's waits for the communication
 * queue's collectives); not ready before the work is done; an event
 * without timing, or not recorded, cannot be timed. */
static void t_event_timing()
{
    int *flag = pinned_int(0), *x = dalloc<int>(1);
    cudaStream_t a, b;
    cudaEvent_t from, to, pre, post, e, untimed, unrecorded;
    CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&from, cudaEventDefault) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&to, cudaEventDefault) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&pre, cudaEventDefault) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&post, cudaEventDefault) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&unrecorded, cudaEventDefault) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventRecord(from, a) == cudaSuccess);
    k_hold<<<1, 1, 0, a>>>(flag, x, 7);
    CHECK(cudaEventRecord(to, a) == cudaSuccess);
    CHECK(cudaEventRecord(e, a) == cudaSuccess);
    CHECK(cudaEventRecord(pre, b) == cudaSuccess); /* b waits for a's kernel between pre and post */
    CHECK(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
    CHECK(cudaEventRecord(post, b) == cudaSuccess);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, from, to) == cudaErrorNotReady);
    CHECK(cudaEventElapsedTime(&ms, pre, post) == cudaErrorNotReady);
    usleep(30000);
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    CHECK(cudaStreamSynchronize(b) == cudaSuccess);
    CHECK(cudaEventElapsedTime(&ms, from, to) == cudaSuccess && ms >= 29 && ms < 10000);
    CHECK(cudaEventElapsedTime(&ms, to, from) == cudaSuccess && ms <= -29);
    CHECK(cudaEventElapsedTime(&ms, pre, post) == cudaSuccess && ms >= 29 && ms < 10000);
    CHECK(cudaEventRecord(e, b) == cudaSuccess);
    CHECK(cudaEventElapsedTime(&ms, from, e) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventElapsedTime(&ms, untimed, to) == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventElapsedTime(&ms, from, unrecorded) == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventElapsedTime(NULL, from, to) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    /* recorded again: the new point's time */
    CHECK(cudaEventRecord(from, a) == cudaSuccess);
    CHECK(cudaStreamSynchronize(a) == cudaSuccess);
    CHECK(cudaEventElapsedTime(&ms, to, from) == cudaSuccess && ms >= 0 && ms < 29);
    cudaEvent_t all[] = {from, to, pre, post, e, untimed, unrecorded};
    for (cudaEvent_t v : all)
        cudaEventDestroy(v);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFreeHost(flag);
}

/* The legacy stream waits for blocking streams' earlier work, not for
 * non-blocking ones'. */
static void t_legacy_stream()
{
    int *flag = pinned_int(0), *x = dalloc<int>(1), *y = dalloc<int>(1), *z = dalloc<int>(1);
    cudaStream_t s, n;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&n, cudaStreamNonBlocking) == cudaSuccess);
    k_hold<<<1, 1, 0, s>>>(flag, x, 7);
    CHECK(cudaMemcpyAsync(y, x, sizeof *x, cudaMemcpyDeviceToDevice, 0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(z, x, sizeof *x, cudaMemcpyDeviceToDevice, n) == cudaSuccess);
    CHECK(cudaStreamSynchronize(n) == cudaSuccess); /* not held */
    CHECK(cudaStreamQuery(0) == cudaErrorNotReady);
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(read_dev(y) == 7);
    CHECK(read_dev(z) == 0);
    cudaStreamDestroy(s);
    cudaStreamDestroy(n);
    cudaFreeHost(flag);
}

/* A copy from pageable memory takes its source when called; one from
 * page-locked memory when the stream gets to it (not under TSan, which
 * rightly calls the host's write and that read a race). */
static void t_copy_sources()
{
    int *flag = pinned_int(0), *hold = dalloc<int>(1), *x = dalloc<int>(1), *y = dalloc<int>(1);
    int *pv = pinned_int(5);
    int hv = 5;
    k_hold<<<1, 1>>>(flag, hold, 1);
    CHECK(cudaMemcpyAsync(x, &hv, sizeof hv, cudaMemcpyHostToDevice, 0) == cudaSuccess);
    if (!TSAN)
        CHECK(cudaMemcpyAsync(y, pv, sizeof *pv, cudaMemcpyHostToDevice, 0) == cudaSuccess);
    hv = 6;
    if (!TSAN)
        *pv = 6;
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    CHECK(cudaStreamSynchronize(0) == cudaSuccess);
    CHECK(read_dev(x) == 5);
    if (!TSAN)
        CHECK(read_dev(y) == 6);
    cudaFreeHost(flag);
    cudaFreeHost(pv);
}

/* The host reads a copy's destination without waiting for the stream
 * (until it sees the copy's value, so that TSan sees reads on both sides
 * of the copy's write). */
static void t_race_host_read()
{
    int *out = pinned_int(0), *x = dalloc<int>(1);
    cudaMemset(x, 1, sizeof *x);
    CHECK(cudaMemcpyAsync(out, x, sizeof *x, cudaMemcpyDeviceToHost, 0) == cudaSuccess);
    for (long i = 0; i < 2000000000L && *(volatile int *)out == 0; i++) {
    }
    cudaDeviceSynchronize();
    cudaFreeHost(out);
}

/* ---- the runner ------------------------------------------------------------------------ */

struct Case {
    const char *name;
    void (*fn)();
    int race;  /* 1: must end in a ThreadSanitizer report (TSan builds only) */
    int async; /* 1: needs the streams to run behind the host (skipped with EMU_ASYNC=0) */
};

static const Case cases[] = {
    {"launch_limits", t_launch_limits, 0, 0},
    {"threads_barriers_fill", t_threads, 0, 0},
    {"shuffles", t_shfl, 0, 0},
    {"shuffle_exited_lane", t_shfl_exited, 0, 0},
    {"shuffle_not_in_own_mask", t_shfl_not_in_mask, 0, 0},
    {"shuffle_reads_outside_mask", t_shfl_reads_outside, 0, 0},
    {"syncthreads_after_exit", t_sync_exited, 0, 0},
    {"deadlock", t_deadlock, 0, 0},
    {"wmma", t_wmma, 0, 0},
    {"wmma_misaligned", t_wmma_misaligned, 0, 0},
    {"wmma_bad_ldm", t_wmma_bad_ldm, 0, 0},
    {"wmma_divergent_arguments", t_wmma_diverge, 0, 0},
    {"conversions", t_convert, 0, 0},
    {"memory", t_memory, 0, 0},
    {"cublaslt", t_cublaslt, 0, 0},
    {"cub_sort_pairs", t_cub, 0, 0},
    {"launch_returns_before_the_kernel_runs", t_async_launch, 0, 1},
    {"stream_wait_event_holds_the_stream", t_wait_event, 0, 1},
    {"timed_events", t_event_timing, 0, 1},
    {"legacy_stream_waits_for_blocking_streams", t_legacy_stream, 0, 1},
    {"copies_take_their_sources_in_order", t_copy_sources, 0, 1},
    {"no_race", t_norace, 0, 0},
    {"race_missing_syncthreads", t_race_block, 1, 0},
    {"race_missing_syncwarp", t_race_warp, 1, 0},
    {"race_between_blocks", t_race_grid, 1, 0},
    {"race_host_reads_before_the_copy", t_race_host_read, 1, 1},
};

enum { NCASES = sizeof cases / sizeof cases[0] };

int main(int argc, char **argv)
{
    if (argc == 2) { /* one case, in this process */
        for (const Case &c : cases)
            if (strcmp(c.name, argv[1]) == 0) {
                c.fn();
                for (void *p : allocs)
                    cudaFree(p);
                return fails ? 1 : 0;
            }
        fprintf(stderr, "no case %s\n", argv[1]);
        return 2;
    }
    int passed = 0, failed = 0, n = 0;
    printf("1..%d\n", NCASES);
    for (const Case &c : cases) {
        n++;
        if (c.race && !TSAN) {
            printf("ok %d - %s # SKIP needs ThreadSanitizer (make gpu-emu-tsan)\n", n, c.name);
            passed++;
            continue;
        }
        if (c.async && !async_streams()) {
            printf("ok %d - %s # SKIP needs asynchronous streams (EMU_ASYNC=0 runs them synchronously)\n", n, c.name);
            passed++;
            continue;
        }
        fflush(stdout);
        fflush(stderr);
        FILE *log = tmpfile(); /* the case's stderr: shown if it fails */
        pid_t pid = fork();
        if (pid == 0) {
            if (log)
                dup2(fileno(log), 2);
            char *args[] = {argv[0], const_cast<char *>(c.name), nullptr};
            execv(argv[0], args);
            _exit(127);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        bool ok = c.race ? code == 66 : code == 0;
        printf("%sok %d - %s%s\n", ok ? "" : "not ", n, c.name,
               ok ? "" : c.race ? " (no ThreadSanitizer report)" : "");
        fflush(stdout);
        if (!ok && log) {
            char line[1024];
            rewind(log);
            while (fgets(line, sizeof line, log))
                fprintf(stderr, "%s%s", line[0] == '#' ? "" : "# ", line);
        }
        if (log)
            fclose(log);
        (ok ? passed : failed)++;
    }
    printf("# %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
