/* selftest.cu (CPU emulation, tests/gpu/emu): the emulator against CUDA's
 * documented semantics, and against the mistakes it must catch (a lenient
 * emulator proves nothing). Built and launched like the kernels (its
 * <<<...>>> rewritten by launch_rewrite.py); it uses only CUDA's API and,
 * for mma, ldmatrix, wgmma and cp.async, the kernels' kcuda_ptx.h. Built
 * by nvcc for sm_90a too (gpu_selftest, make CUDA=1), a GPU runs the
 * semantics cases (on_a_gpu, below) against the same expectations: the
 * hardware checks the emulation.
 *
 * usage: emu_selftest [NAME]   (no argument: every case, each in a
 * process of its own, since a kernel fault is sticky for the process)
 *
 * Prints `ok N - name` / `not ok N - name`, then `# N passed, N failed`.
 * Under ThreadSanitizer the race cases must end in a TSan report (exit
 * code 66: the Makefile's TSAN_OPTIONS); without it they are skipped. A
 * case that checks what one setting of EMU_CP_ASYNC or EMU_WARPS does is
 * skipped under the other (run.sh runs both).
 */
#include <cub/device/device_radix_sort.cuh>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>     /* tanhf */
#include <stdio.h>    /* printf */
#include <stdlib.h>   /* exit */
#include <string.h>   /* strcmp, memcmp, strstr */
#include <sys/wait.h> /* waitpid */
#include <unistd.h>   /* fork, execv */

#include <algorithm> /* std::max */
#include <thread>    /* std::thread: another GPU's thread (t_other_gpu) */
#include <vector>    /* std::vector */

/* kc_mma16816, kc_ldsm4, kc_ldsm4_t, kc_pack2, kc_cp_async16..., as the
 * kernels call them (relative to this file: the build's copy of it,
 * $(BUILD)/emu-gen/tests/gpu/emu/, finds the build's copy of kernels/cuda,
 * whose launches are rewritten too) */
#include "../../../kernels/cuda/kcuda_ptx.h"

#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#else
#define TSAN 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h> /* __asan_address_is_poisoned */
#define ASAN 1
#else
#define ASAN 0
#endif

/* Atomics of the kernels below: the host compiler's builtins on the
 * emulation (its device code is the host's), CUDA's on a GPU. */
#ifdef EMU_CUDA_RUNTIME_H
#define ST_FETCH_ADD(p, v) __atomic_fetch_add(p, v, __ATOMIC_RELAXED)
#define ST_LOAD_ACQUIRE(p) __atomic_load_n(p, __ATOMIC_ACQUIRE)
#else
#define ST_FETCH_ADD(p, v) atomicAdd(p, v)
#define ST_LOAD_ACQUIRE(p) (*(const volatile int *)(p))
#endif

/* 1 on the emulation, 0 built by nvcc for a GPU (gpu_selftest): the
 * cases that check the emulator's own behaviour (a mistake it catches, a
 * mode of it) run only on the emulation. */
#ifdef EMU_CUDA_RUNTIME_H
#define EMULATED 1
#else
#define EMULATED 0
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

/* A 2-byte type's bits, and a value of given bits (memcpy: a GPU's
 * headers keep the member private). */
template <class T> static uint16_t bits16(T x)
{
    uint16_t u;
    memcpy(&u, &x, 2);
    return u;
}

template <class T> static T of_bits(uint16_t u)
{
    T x;
    memcpy(static_cast<void *>(&x), &u, 2);
    return x;
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

/* ---- mma.m16n8k16 and ldmatrix (emu/ptx.h) --------------------------------------- */

/* Through kcuda_ptx.h's wrappers, as the kernels call them (bf16, f16,
 * kc_f and kc_to come with it, from kcuda_impl.h). */
template <class L> static uint16_t bits_of(L x)
{
    uint16_t b;
    memcpy(&b, &x, 2);
    return b;
}

/* 16-bit values whose products and sums are exact in fp32 and in both
 * types: multiples of 1/4 in [-3, 3], and of 1/8 for C. */
static float mma_val(int i, int mul, int mod)
{
    return (float)((i * mul) % mod - mod / 2) * 0.25f;
}

/* The device's D (16 x 8, dd) is C + A B exactly: a [16][K] and b
 * [K][8] as fp32 values, their products and sums exact. */
static void expect_mma(const float *dd, const float *c, const float *a, const float *b, int K)
{
    std::vector<float> d(128);
    CHECK(cudaMemcpy(d.data(), dd, 512, cudaMemcpyDeviceToHost) == cudaSuccess);
    int bad = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float want = c[i * 8 + j];
            for (int k = 0; k < K; k++)
                want += a[i * K + k] * b[k * 8 + j];
            if (d[i * 8 + j] != want && bad++ < 4)
                fprintf(stderr, "# D[%d][%d] = %g, want %g\n", i, j, d[i * 8 + j], want);
        }
    CHECK(bad == 0);
}

/* One warp: the fragments of a (16 x 16, row-major), b (16 x 8, [k][n])
 * and c (16 x 8) straight from global memory by PTX's layouts, d = c + a b,
 * written back by the C layout. */
template <class L>
__global__ void k_mma16816(float *out, const L *a, const L *b, const float *c)
{
    unsigned lane = threadIdx.x, g = lane / 4, t = lane % 4;
    uint32_t ra[4], rb[2];
    float d[4];
    for (unsigned h = 0; h < 4; h++) { /* a[h]: rows g, g+8; columns 2t.., 2t+8.. */
        unsigned row = g + 8 * (h & 1), col = 2 * t + 8 * (h >> 1);
        ra[h] = kc_pack2<L>(kc_f(a[row * 16 + col]), kc_f(a[row * 16 + col + 1]));
    }
    for (unsigned h = 0; h < 2; h++) { /* b[h]: k 2t.. (+8), n g */
        unsigned k = 2 * t + 8 * h;
        rb[h] = kc_pack2<L>(kc_f(b[k * 8 + g]), kc_f(b[(k + 1) * 8 + g]));
    }
    for (unsigned h = 0; h < 4; h++) /* d[h]: row g (+8), column 2t (+1) */
        d[h] = c[(g + 8 * (h >> 1)) * 8 + 2 * t + (h & 1)];
    kc_mma16816<L>(d, ra, rb);
    for (unsigned h = 0; h < 4; h++)
        out[(g + 8 * (h >> 1)) * 8 + 2 * t + (h & 1)] = d[h];
}

template <class L> static void mma16816_case()
{
    std::vector<L> ha(256), hb(128);
    std::vector<float> fa(256), fb(128), hc(128);
    for (int i = 0; i < 256; i++)
        fa[i] = kc_f(ha[i] = kc_to<L>(mma_val(i, 7, 25)));
    for (int i = 0; i < 128; i++) {
        fb[i] = kc_f(hb[i] = kc_to<L>(mma_val(i, 5, 23)));
        hc[i] = mma_val(i, 3, 17) * 0.5f;
    }
    L *da = dalloc<L>(256), *db = dalloc<L>(128);
    float *dc = dalloc<float>(128), *dd = dalloc<float>(128);
    cudaMemcpy(da, ha.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), 256, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), 512, cudaMemcpyHostToDevice);
    k_mma16816<L><<<1, 32>>>(dd, da, db, dc);
    expect_mma(dd, hc.data(), fa.data(), fb.data(), 16);
}

static void t_mma16816()
{
    mma16816_case<bf16>();
    mma16816_case<f16>();
}

/* mma.m16n8k8 on TF32 operands, through kc_tf32 and kc_mma1688_tf32 as
 * the fp32 attention calls them: a (16 x 8) and b (8 x 8, [k][n]) fp32
 * values, each rounded by kc_tf32 into its fragment by PTX's layout, and
 * c; the values' products and sums exact in fp32 (multiples of 1/4 in
 * [-3, 3]) once rounded. Some values have low bits for kc_tf32 to round
 * off (2^-14 more than a multiple of 1/4: always rounded away in TF32's
 * 10 bits of mantissa), so D is C plus the products of the rounded values
 * wherever the rounding is cvt.rna's. Then kc_tf32 alone on values at
 * and beside a half of TF32's last place, each sign: to nearest, halves
 * away from zero. */
__global__ void k_mma1688_tf32(float *out, const float *a, const float *b, const float *c)
{
    unsigned lane = threadIdx.x, g = lane / 4, t = lane % 4;
    uint32_t ra[4], rb[2];
    float d[4];
    for (unsigned h = 0; h < 4; h++) /* a[h]: row g (+8), column t (+4) */
        ra[h] = kc_tf32(a[(g + 8 * (h & 1)) * 8 + t + 4 * (h >> 1)]);
    for (unsigned h = 0; h < 2; h++) /* b[h]: k t (+4), n g */
        rb[h] = kc_tf32(b[(t + 4 * h) * 8 + g]);
    for (unsigned h = 0; h < 4; h++)
        d[h] = c[(g + 8 * (h >> 1)) * 8 + 2 * t + (h & 1)];
    kc_mma1688_tf32(d, ra, rb);
    for (unsigned h = 0; h < 4; h++)
        out[(g + 8 * (h >> 1)) * 8 + 2 * t + (h & 1)] = d[h];
}

__global__ void k_tf32_round(uint32_t *out, const float *x, int n)
{
    int i = (int)threadIdx.x;
    if (i < n)
        out[i] = kc_tf32(x[i]);
}

static void t_mma1688_tf32()
{
    std::vector<float> ha(128), hb(64), hc(128), ra(128), rb(64);
    const float off = ldexpf(1.0f, -14); /* under half of TF32's last place (2^-12 at 1/4) for |x| >= 1/4 */
    for (int i = 0; i < 128; i++) {
        ra[i] = mma_val(i, 7, 25);
        ha[i] = ra[i] + (i % 3 == 0 && fabsf(ra[i]) >= 0.25f ? (ra[i] > 0 ? off : -off) : 0.0f);
        hc[i] = mma_val(i, 3, 17) * 0.5f;
    }
    for (int i = 0; i < 64; i++) {
        rb[i] = mma_val(i, 5, 23);
        hb[i] = rb[i] + (i % 2 == 0 && fabsf(rb[i]) >= 0.25f ? (rb[i] > 0 ? off : -off) : 0.0f);
    }
    float *da = dalloc<float>(128), *db = dalloc<float>(64), *dc = dalloc<float>(128), *dd = dalloc<float>(128);
    cudaMemcpy(da, ha.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), 256, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), 512, cudaMemcpyHostToDevice);
    k_mma1688_tf32<<<1, 32>>>(dd, da, db, dc);
    expect_mma(dd, hc.data(), ra.data(), rb.data(), 8);
    /* kc_tf32: 1 + 2^-11 is half of TF32's last place (2^-10) past 1 */
    const float h = ldexpf(1.0f, -11), u = ldexpf(1.0f, -10), e = ldexpf(1.0f, -20);
    const float x[] = {1.0f + h, 1.0f + h - e, 1.0f + h + e, -(1.0f + h), -(1.0f + h - e), 1.0f + u + h, 3.0f, 0.0f};
    const float want[] = {1.0f + u, 1.0f, 1.0f + u, -(1.0f + u), -1.0f, 1.0f + 2 * u, 3.0f, 0.0f};
    const int n = (int)(sizeof x / sizeof x[0]);
    float *dx = dalloc<float>(n);
    uint32_t *dr = dalloc<uint32_t>(n);
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
    k_tf32_round<<<1, 32>>>(dr, dx, n);
    uint32_t got[sizeof x / sizeof x[0]];
    CHECK(cudaMemcpy(got, dr, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, &want[i], 4);
        if (got[i] != w) {
            fprintf(stderr, "# kc_tf32(%.9g) = 0x%08x, want 0x%08x (%.9g)\n", x[i], got[i], w, want[i]);
            CHECK(got[i] == w);
        }
    }
}

/* The row of the padded [16][24] tile lane l gives ldmatrix x4: A and a B
 * stored [k][n] (.trans): row (l & 7) + 8 ((l >> 3) & 1), column 8 (l >> 4);
 * a B stored [n][k]: row (l & 7) + 8 (l >> 4), column 8 ((l >> 3) & 1). */
static __host__ __device__ unsigned ldsm_a_off(unsigned l)
{
    return ((l & 7) + 8 * ((l >> 3) & 1)) * 24 + 8 * (l >> 4);
}
static __host__ __device__ unsigned ldsm_nk_off(unsigned l)
{
    return ((l & 7) + 8 * (l >> 4)) * 24 + 8 * ((l >> 3) & 1);
}

/* a (16 x 16, [m][k]) into a static __shared__ tile and b (16 x 16, [n][k]
 * or, kn, [k][n]) into the dynamic one, rows 24 elements apart; A by
 * ldmatrix x4, B by x4 (or x4.trans); out (16 x 16) = c + a b over two
 * n-tiles of 8. raw: each lane's A and B registers. sync 0 leaves out the
 * __syncwarp between the tiles' writes and ldmatrix (a race). */
template <class L>
__global__ void k_ldsm(float *out, uint32_t *raw, const L *a, const L *b, const float *c,
                       int kn, int sync)
{
    __shared__ __align__(16) L sa[16 * 24];
    extern __shared__ __align__(128) unsigned char smem[];
    L *sb = reinterpret_cast<L *>(smem);
    unsigned lane = threadIdx.x, g = lane / 4, t = lane % 4;
    for (unsigned i = lane; i < 256; i += 32) {
        sa[i / 16 * 24 + i % 16] = a[i];
        sb[i / 16 * 24 + i % 16] = b[i];
    }
    if (sync)
        __syncwarp();
    uint32_t ra[4], rb[4];
    kc_ldsm4(ra, &sa[ldsm_a_off(lane)]);
    if (kn)
        kc_ldsm4_t(rb, &sb[ldsm_a_off(lane)]);
    else
        kc_ldsm4(rb, &sb[ldsm_nk_off(lane)]);
    for (unsigned i = 0; i < 4; i++) {
        raw[lane * 8 + i] = ra[i];
        raw[lane * 8 + 4 + i] = rb[i];
    }
    for (unsigned j = 0; j < 2; j++) { /* n-tile j: columns 8j..8j+7 */
        float d[4];
        uint32_t bj[2] = {rb[2 * j], rb[2 * j + 1]};
        for (unsigned h = 0; h < 4; h++)
            d[h] = c[(g + 8 * (h >> 1)) * 16 + 8 * j + 2 * t + (h & 1)];
        kc_mma16816<L>(d, ra, bj);
        for (unsigned h = 0; h < 4; h++)
            out[(g + 8 * (h >> 1)) * 16 + 8 * j + 2 * t + (h & 1)] = d[h];
    }
}

/* What ldmatrix x4 gives lane l from a padded tile whose rows the lanes
 * passed at off(lane), by PTX's definition: M_i[row][col] is element col
 * of the row lane 8i + row passed; r[i] = M_i[g][2t] | M_i[g][2t+1] << 16,
 * with .trans M_i[2t][g] | M_i[2t+1][g] << 16. */
template <class L>
static uint32_t ldsm_want(const std::vector<L> &tile, unsigned (*off)(unsigned), unsigned l,
                          unsigned i, int trans)
{
    unsigned g = l / 4, t = l % 4;
    auto M = [&](unsigned row, unsigned col) { return (uint32_t)bits_of(tile[off(8 * i + row) + col]); };
    return trans ? M(2 * t, g) | M(2 * t + 1, g) << 16 : M(g, 2 * t) | M(g, 2 * t + 1) << 16;
}

template <class L> static void ldsm_case(int kn, bool check_raw)
{
    std::vector<L> ha(256), hb(256);
    std::vector<float> fa(256), fb(256), hc(256); /* fa [m][k], fb [k][n] */
    for (int i = 0; i < 256; i++) {
        fa[i] = kc_f(ha[i] = kc_to<L>(mma_val(i, 7, 25)));
        hb[i] = kc_to<L>(mma_val(i, 5, 23));
        hc[i] = mma_val(i, 3, 17) * 0.5f;
    }
    for (int x = 0; x < 16; x++) /* hb [x][y]: [k][n] if kn, else [n][k] */
        for (int y = 0; y < 16; y++)
            fb[kn ? x * 16 + y : y * 16 + x] = kc_f(hb[x * 16 + y]);
    L *da = dalloc<L>(256), *db = dalloc<L>(256);
    float *dc = dalloc<float>(256), *dd = dalloc<float>(256);
    uint32_t *draw = dalloc<uint32_t>(256);
    cudaMemcpy(da, ha.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), 1024, cudaMemcpyHostToDevice);
    k_ldsm<L><<<1, 32, 16 * 24 * sizeof(L)>>>(dd, draw, da, db, dc, kn, 1);
    std::vector<float> d(256);
    std::vector<uint32_t> raw(256);
    CHECK(cudaMemcpy(d.data(), dd, 1024, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(raw.data(), draw, 1024, cudaMemcpyDeviceToHost) == cudaSuccess);
    int bad = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = hc[m * 16 + n];
            for (int k = 0; k < 16; k++)
                want += fa[m * 16 + k] * fb[k * 16 + n];
            if (d[m * 16 + n] != want && bad++ < 4)
                fprintf(stderr, "# kn %d: D[%d][%d] = %g, want %g\n", kn, m, n, d[m * 16 + n], want);
        }
    CHECK(bad == 0);
    if (!check_raw)
        return;
    std::vector<L> ta(16 * 24), tb(16 * 24); /* the tiles as shared memory held them */
    for (int i = 0; i < 256; i++) {
        ta[i / 16 * 24 + i % 16] = ha[i];
        tb[i / 16 * 24 + i % 16] = hb[i];
    }
    bad = 0;
    for (unsigned l = 0; l < 32; l++)
        for (unsigned i = 0; i < 4; i++) {
            uint32_t wa = ldsm_want(ta, ldsm_a_off, l, i, 0);
            uint32_t wb = kn ? ldsm_want(tb, ldsm_a_off, l, i, 1) : ldsm_want(tb, ldsm_nk_off, l, i, 0);
            if ((raw[l * 8 + i] != wa || raw[l * 8 + 4 + i] != wb) && bad++ < 4)
                fprintf(stderr, "# lane %u r[%u]: A 0x%08x (want 0x%08x), B 0x%08x (want 0x%08x)\n", l, i,
                        raw[l * 8 + i], wa, raw[l * 8 + 4 + i], wb);
        }
    CHECK(bad == 0);
    /* and A's registers are the fragments PTX's A layout defines */
    for (unsigned l = 0; l < 32; l++)
        for (unsigned h = 0; h < 4; h++) {
            unsigned row = l / 4 + 8 * (h & 1), col = 2 * (l % 4) + 8 * (h >> 1);
            CHECK(raw[l * 8 + h] ==
                  ((uint32_t)bits_of(ha[row * 16 + col]) | (uint32_t)bits_of(ha[row * 16 + col + 1]) << 16));
        }
}

static void t_ldsm()
{
    ldsm_case<bf16>(0, true);
    ldsm_case<bf16>(1, true);
    ldsm_case<f16>(0, false);
    ldsm_case<f16>(1, false);
}

/* A misaligned row (lane 5's, 2 bytes in), .trans in odd lanes only, a
 * row outside shared memory (global memory; dynamic shared memory past the
 * launch's bytes). */
__global__ void k_ldsm_bad(uint32_t *out, int how)
{
    __shared__ __align__(16) bf16 sa[16 * 24];
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned lane = threadIdx.x;
    for (unsigned i = lane; i < 16 * 24; i += 32)
        sa[i] = kc_to<bf16>((float)i);
    __syncwarp();
    const bf16 *p = &sa[ldsm_a_off(lane)];
    uint32_t r[4];
    if (how == 0)
        kc_ldsm4(r, p + (lane == 5));
    else if (how == 1 && (lane & 1))
        kc_ldsm4_t(r, p);
    else if (how == 1)
        kc_ldsm4(r, p);
    else if (how == 2)
        kc_ldsm4(r, lane == 9 ? (const void *)out : p);
    else
        kc_ldsm4(r, lane == 9 ? (const void *)(smem + 16) : p);
    out[lane] = r[0] ^ r[1] ^ r[2] ^ r[3];
}

static void t_ldsm_misaligned()
{
    k_ldsm_bad<<<1, 32>>>(dalloc<uint32_t>(32), 0);
    expect_fault(cudaErrorMisalignedAddress);
}

static void t_ldsm_divergent_trans()
{
    k_ldsm_bad<<<1, 32>>>(dalloc<uint32_t>(32), 1);
    expect_fault(cudaErrorIllegalInstruction);
}

static void t_ldsm_global()
{
    k_ldsm_bad<<<1, 32>>>(dalloc<uint32_t>(32), 2);
    expect_fault(cudaErrorIllegalAddress);
}

static void t_ldsm_past_dynamic()
{
    k_ldsm_bad<<<1, 32, 16>>>(dalloc<uint32_t>(32), 3); /* smem + 16: past the 16 bytes */
    expect_fault(cudaErrorIllegalAddress);
}

/* ---- wgmma (emu/ptx.h, kcuda_ptx.h's kc_wgmma) ------------------------------------ */

/* B's byte offset of (k, n) in the canonical layout without swizzling
 * (kcuda_ptx.h): K-major (trans 0) or N-major (1). */
static unsigned wg_off(int trans, unsigned k, unsigned n, unsigned lbo, unsigned sbo)
{
    return trans ? 2 * (n % 8) + sbo * (n / 8) + 16 * (k % 8) + lbo * (k / 8)
                 : 16 * (n % 8) + sbo * (n / 8) + 2 * (k % 8) + lbo * (k / 8);
}

enum { WG_N = 32, WG_SMEM_SS = 8192 };

/* One warpgroup: A [64 x 16] from global memory into each warp's
 * registers by mma's A layout; B's image (`img`, laid out
 * by the host, `bytes` long) copied into shared memory; D = C + A B (acc) or A B, C
 * from global memory by the accumulator layout. Before the wait each
 * thread saves what its d holds (the wait has not run: C's values), and
 * after it D. */
template <class L, int TRANS, int N>
__global__ void k_wgmma(float *out, float *early, const L *a, const unsigned char *img, unsigned bytes,
                        const float *c, unsigned lbo, unsigned sbo, int acc)
{
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (unsigned i = tid; i < bytes; i += blockDim.x)
        smem[i] = img[i];
    kc_fence_proxy_async();
    __syncthreads();
    uint32_t ra[4];
    for (unsigned h = 0; h < 4; h++) {
        unsigned row = 16 * w + g + 8 * (h & 1), col = 2 * t + 8 * (h >> 1);
        ra[h] = kc_pack2<L>(kc_f(a[row * 16 + col]), kc_f(a[row * 16 + col + 1]));
    }
    float d[N / 8][4];
    for (unsigned j = 0; j < N / 8; j++)
        for (unsigned e = 0; e < 4; e++)
            d[j][e] = c[(16 * w + g + 8 * (e / 2)) * N + 8 * j + 2 * t + e % 2];
    kc_wgmma_fence();
    kc_wgmma<L, N, TRANS>(d, ra, smem, lbo, sbo, acc);
    kc_wgmma_commit();
#ifdef EMU_CUDA_RUNTIME_H /* (on a GPU the read is undefined: ptxas waits first) */
    for (unsigned j = 0; j < N / 8; j++)
        for (unsigned e = 0; e < 4; e++)
            early[(16 * w + g + 8 * (e / 2)) * N + 8 * j + 2 * t + e % 2] = d[j][e];
#else
    (void)early;
#endif
    kc_wgmma_wait<0>();
    for (unsigned j = 0; j < N / 8; j++)
        for (unsigned e = 0; e < 4; e++)
            out[(16 * w + g + 8 * (e / 2)) * N + 8 * j + 2 * t + e % 2] = d[j][e];
}

/* The same with A from shared memory too (kc_wgmma_ss, N 64): A's image
 * at byte 8192 of `img`, K-major by albo and asbo. */
template <class L, int TRANS>
__global__ void k_wgmma_ss(float *out, float *early, const unsigned char *img, const float *c, unsigned lbo,
                           unsigned sbo, unsigned albo, unsigned asbo, int acc)
{
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (unsigned i = tid; i < 2 * WG_SMEM_SS; i += blockDim.x)
        smem[i] = img[i];
    kc_fence_proxy_async();
    __syncthreads();
    float d[8][4];
    for (unsigned j = 0; j < 8; j++)
        for (unsigned e = 0; e < 4; e++)
            d[j][e] = c[(16 * w + g + 8 * (e / 2)) * 64 + 8 * j + 2 * t + e % 2];
    kc_wgmma_fence();
    kc_wgmma_ss<L, 64, TRANS>(d, smem + WG_SMEM_SS, albo, asbo, smem, lbo, sbo, acc);
    kc_wgmma_commit();
#ifdef EMU_CUDA_RUNTIME_H
    for (unsigned j = 0; j < 8; j++)
        for (unsigned e = 0; e < 4; e++)
            early[(16 * w + g + 8 * (e / 2)) * 64 + 8 * j + 2 * t + e % 2] = d[j][e];
#else
    (void)early;
#endif
    kc_wgmma_wait<0>();
    for (unsigned j = 0; j < 8; j++)
        for (unsigned e = 0; e < 4; e++)
            out[(16 * w + g + 8 * (e / 2)) * 64 + 8 * j + 2 * t + e % 2] = d[j][e];
}

template <class L, int TRANS> static void wgmma_ss_case(unsigned lbo, unsigned sbo, unsigned albo, unsigned asbo)
{
    std::vector<float> fa(64 * 16), fb(16 * 64), hc(64 * 64);
    std::vector<unsigned char> img(2 * WG_SMEM_SS, 0xff);
    for (unsigned m = 0; m < 64; m++)
        for (unsigned k = 0; k < 16; k++) {
            L x = kc_to<L>(mma_val((int)(m * 16 + k), 7, 25));
            fa[m * 16 + k] = kc_f(x);
            unsigned off = wg_off(0, k, m, albo, asbo); /* K-major, m as n */
            CHECK(off + 2 <= WG_SMEM_SS);
            memcpy(&img[WG_SMEM_SS + off], &x, 2);
        }
    for (unsigned k = 0; k < 16; k++)
        for (unsigned n = 0; n < 64; n++) {
            L x = kc_to<L>(mma_val((int)(k * 64 + n), 5, 23));
            fb[k * 64 + n] = kc_f(x);
            unsigned off = wg_off(TRANS, k, n, lbo, sbo);
            CHECK(off + 2 <= WG_SMEM_SS);
            memcpy(&img[off], &x, 2);
        }
    for (int i = 0; i < 64 * 64; i++)
        hc[i] = mma_val(i, 3, 17) * 0.5f;
    unsigned char *dimg = dalloc<unsigned char>(2 * WG_SMEM_SS);
    float *dc = dalloc<float>(64 * 64), *dd = dalloc<float>(64 * 64), *de = dalloc<float>(64 * 64);
    cudaMemcpy(dimg, img.data(), img.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice);
    k_wgmma_ss<L, TRANS><<<1, 128, 2 * WG_SMEM_SS>>>(dd, de, dimg, dc, lbo, sbo, albo, asbo, 1);
    std::vector<float> d(64 * 64), e(64 * 64);
    CHECK(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(e.data(), de, e.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    int bad = 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++) {
            float want = hc[i * 64 + j];
            for (int k = 0; k < 16; k++)
                want += fa[i * 16 + k] * fb[k * 64 + j];
            if (d[i * 64 + j] != want && bad++ < 4)
                fprintf(stderr, "# D[%d][%d] = %g, want %g\n", i, j, d[i * 64 + j], want);
            if (EMULATED && e[i * 64 + j] != hc[i * 64 + j] && bad++ < 4)
                fprintf(stderr, "# before the wait, D[%d][%d] = %g\n", i, j, e[i * 64 + j]);
        }
    CHECK(bad == 0);
}

template <class L, int TRANS, int N = WG_N> static void wgmma_case(unsigned lbo, unsigned sbo, int acc)
{
    std::vector<L> ha(64 * 16);
    std::vector<float> fa(64 * 16), fb(16 * N), hc(64 * N);
    unsigned bytes = 0;
    for (unsigned k = 0; k < 16; k++)
        for (unsigned n = 0; n < N; n++)
            bytes = std::max(bytes, wg_off(TRANS, k, n, lbo, sbo) + 2);
    bytes = (bytes + 127) / 128 * 128;
    std::vector<unsigned char> img(bytes, 0xff);
    for (int i = 0; i < 64 * 16; i++)
        fa[i] = kc_f(ha[i] = kc_to<L>(mma_val(i, 7, 25)));
    for (unsigned k = 0; k < 16; k++)
        for (unsigned n = 0; n < N; n++) {
            L x = kc_to<L>(mma_val((int)(k * N + n), 5, 23));
            fb[k * N + n] = kc_f(x);
            memcpy(&img[wg_off(TRANS, k, n, lbo, sbo)], &x, 2);
        }
    for (int i = 0; i < 64 * N; i++)
        hc[i] = mma_val(i, 3, 17) * 0.5f;
    L *da = dalloc<L>(64 * 16);
    unsigned char *dimg = dalloc<unsigned char>(bytes);
    float *dc = dalloc<float>(64 * N), *dd = dalloc<float>(64 * N), *de = dalloc<float>(64 * N);
    cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dimg, img.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice);
    k_wgmma<L, TRANS, N><<<1, 128, bytes>>>(dd, de, da, dimg, bytes, dc, lbo, sbo, acc);
    std::vector<float> d(64 * N), e(64 * N);
    CHECK(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(e.data(), de, e.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    int bad = 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < N; j++) {
            float want = acc ? hc[i * N + j] : 0.0f;
            for (int k = 0; k < 16; k++)
                want += fa[i * 16 + k] * fb[k * N + j];
            if (d[i * N + j] != want && bad++ < 4)
                fprintf(stderr, "# N %d: D[%d][%d] = %g, want %g\n", N, i, j, d[i * N + j], want);
            if (EMULATED && e[i * N + j] != hc[i * N + j] && bad++ < 4) /* before the wait: still C */
                fprintf(stderr, "# before the wait, D[%d][%d] = %g, want C's %g\n", i, j, e[i * N + j],
                        hc[i * N + j]);
        }
    CHECK(bad == 0);
}

/* Both majors, with the offsets the attention's tiles use (K-major: the
 * next 8 columns of k 512 bytes on, the next 8 rows 128; N-major: the
 * next 8 keys 128, the next 8 columns 512) and others; bf16 and f16;
 * accumulating into C and not. */
static void t_wgmma()
{
    wgmma_case<bf16, 0>(512, 128, 1);
    wgmma_case<bf16, 1>(128, 512, 1);
    wgmma_case<f16, 0>(1024, 256, 0);
    wgmma_case<f16, 1>(256, 1024, 1);
    wgmma_case<bf16, 1>(1024, 128, 0);
    /* the attention's products with A in registers: N the head size (64,
     * 128), B N-major in its tiles of core matrices (the next 8 keys 128
     * bytes on, the next 8 columns a chunk of 64 rows, 1024) */
    wgmma_case<bf16, 1, 64>(128, 1024, 1);
    wgmma_case<f16, 1, 128>(128, 1024, 1);
    /* A from shared memory: the attention's tiles' layout, and others */
    wgmma_ss_case<bf16, 0>(1024, 128, 1024, 128);
    wgmma_ss_case<f16, 1>(128, 1024, 256, 512);
}

/* Mistakes: a block of 64 threads (half a warpgroup), B misaligned,
 * B past the dynamic shared memory, a thread exiting with its product
 * not waited for, and lanes of a warp queuing different products. */
__global__ void k_wgmma_bad(float *out, int how)
{
    extern __shared__ __align__(128) unsigned char smem[];
    float d[4][4] = {};
    uint32_t ra[4] = {0, 0, 0, 0};
    unsigned lane = threadIdx.x % 32;
    const unsigned char *b = how == 1 ? smem + 8 : smem;
    unsigned sbo = how == 2 ? 4096 : 128;
    if (how == 4 && lane == 5)
        sbo = 256;
    kc_wgmma_fence();
    kc_wgmma<bf16, 32, 0>(d, ra, b, 512, sbo, 1);
    kc_wgmma_commit();
    if (how != 3)
        kc_wgmma_wait<0>();
    out[threadIdx.x] = d[0][0];
}

static void t_wgmma_half_warpgroup()
{
    k_wgmma_bad<<<1, 64, 2048>>>(dalloc<float>(128), 0);
    expect_fault(cudaErrorIllegalInstruction);
}

static void t_wgmma_misaligned()
{
    k_wgmma_bad<<<1, 128, 2048>>>(dalloc<float>(128), 1);
    expect_fault(cudaErrorMisalignedAddress);
}

static void t_wgmma_past_dynamic()
{
    k_wgmma_bad<<<1, 128, 2048>>>(dalloc<float>(128), 2);
    expect_fault(cudaErrorIllegalAddress);
}

static void t_wgmma_not_waited()
{
    k_wgmma_bad<<<1, 128, 2048>>>(dalloc<float>(128), 3);
    expect_fault(cudaErrorIllegalInstruction);
}

static void t_wgmma_divergent()
{
    k_wgmma_bad<<<1, 128, 2048>>>(dalloc<float>(128), 4);
    expect_fault(cudaErrorIllegalInstruction);
}

/* The fences a product needs (exec.cpp, "the fences of warpgroup
 * products"): B's 2048 bytes come into shared memory by cp.async (each of
 * the 128 threads one 16-byte chunk of src), then the product. how 0: as
 * the kernels do it (the copies waited for, fence.proxy.async, a barrier,
 * wgmma.fence, the product); 1: no wgmma.fence; 2: D written after the
 * fence; 3: A written after it; 4: no fence.proxy.async; 5: the
 * fence.proxy.async before the wait, so before the copy has landed
 * (EMU_CP_ASYNC=late: with the copies landing as issued it would be after
 * them). Each but 0 stops the kernel at the product. */
__global__ void k_wgmma_fences(float *out, const unsigned char *src, int how)
{
    extern __shared__ __align__(128) unsigned char smem[];
    float d[4][4] = {};
    uint32_t ra[4] = {0x3f803f80u, 0, 0, 0};
    unsigned tid = threadIdx.x;
    kc_cp_async16(smem + 16 * tid, src + 16 * tid, true);
    kc_cp_async_commit();
    if (how == 5)
        kc_fence_proxy_async();
    kc_cp_async_wait<0>();
    if (how != 4 && how != 5)
        kc_fence_proxy_async();
    __syncthreads();
    if (how != 1)
        kc_wgmma_fence();
    if (how == 2)
        d[1][2] = 1.0f;
    if (how == 3)
        ra[2] = 0x3f80u;
    kc_wgmma<bf16, 32, 0>(d, ra, smem, 1024, 128, 1);
    kc_wgmma_commit();
    kc_wgmma_wait<0>();
    out[tid] = d[0][0];
}

/* ... and the emulator's message must name the mistake (`why`), not
 * another one (a case only the emulation runs). */
static void wgmma_fences(int how, const char *why)
{
    unsigned char *src = dalloc<unsigned char>(2048);
    CHECK(cudaMemset(src, 0, 2048) == cudaSuccess);
    float *out = dalloc<float>(128);
    k_wgmma_fences<<<1, 128, 2048>>>(out, src, how);
    if (how == 0) {
        float h[128];
        CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(h[0] == 0.0f); /* (B is zeros) */
        return;
    }
    expect_fault(cudaErrorIllegalInstruction);
#ifdef EMU_CUDA_RUNTIME_H
    if (!strstr(emu::last_failure(), why))
        fprintf(stderr, "# the kernel stopped for another reason than \"%s\": %s\n", why, emu::last_failure());
    CHECK(strstr(emu::last_failure(), why) != nullptr);
#else
    (void)why;
#endif
}

static void t_wgmma_fenced()
{
    wgmma_fences(0, "");
}

static void t_wgmma_no_fence()
{
    wgmma_fences(1, "with no wgmma.fence before it");
}

static void t_wgmma_d_written_after_fence()
{
    wgmma_fences(2, "its D registers were written after the last wgmma.fence");
}

static void t_wgmma_a_written_after_fence()
{
    wgmma_fences(3, "its A registers were written after the last wgmma.fence");
}

static void t_wgmma_no_proxy_fence()
{
    wgmma_fences(4, "reads B at shared byte 0, which thread 0's cp.async wrote with no fence.proxy.async");
}

static void t_wgmma_proxy_fence_before_the_copy()
{
    wgmma_fences(5, "reads B at shared byte 0, which thread 0's cp.async wrote with no fence.proxy.async");
}

/* Dynamic shared memory past the launch's bytes, where a GPU has none for
 * the block: writes all of its 1024 bytes (fill), or reads byte 512 of a
 * launch of 256 (look): 0xff, not what the launch before wrote there;
 * under AddressSanitizer it asks whether the byte is poisoned instead
 * of reading it (a read there would be reported), 0xff standing for yes;
 * byte 255, within the launch's, must not be (0 if it is). */
__global__ void k_smem_past(unsigned *out, int look)
{
    extern __shared__ __align__(128) unsigned char smem[];
    if (!look) {
        for (unsigned i = threadIdx.x; i < 1024; i += blockDim.x)
            smem[i] = 7;
        return;
    }
    if (threadIdx.x != 0) /* (one thread reads) */
        return;
#if ASAN
    out[0] = __asan_address_is_poisoned(smem + 512) ? 0xff : 0;
    out[1] = __asan_address_is_poisoned(smem + 255) ? 0 : smem[255];
#else
    out[0] = smem[512];
    out[1] = smem[255];
#endif
}

static void t_smem_past_dynamic()
{
    unsigned *out = dalloc<unsigned>(2), h[2];
    k_smem_past<<<1, 32, 1024>>>(out, 0);
    k_smem_past<<<1, 32, 256>>>(out, 1);
    CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 0xff); /* past the launch's bytes: 0xff (or poisoned), not the 7 written before */
    CHECK(h[1] == 0xff); /* within them: the fill at the block's start, not poisoned */
}

__global__ void k_mma16816_divergent(float *out)
{
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    if (threadIdx.x & 1)
        kc_mma16816<bf16>(d, a, b);
    else
        kc_mma16816<f16>(d, a, b);
    out[threadIdx.x] = d[0];
}

static void t_mma16816_divergent()
{
    k_mma16816_divergent<<<1, 32>>>(dalloc<float>(32));
    expect_fault(cudaErrorIllegalInstruction);
}

/* The tiles written, then ldmatrix without __syncwarp: the rows other
 * lanes wrote are read unordered (a race TSan must see). */
static void t_race_ldsm()
{
    bf16 *a = dalloc<bf16>(256);
    k_ldsm<bf16><<<1, 32, 16 * 24 * 2>>>(dalloc<float>(256), dalloc<uint32_t>(256), a, a,
                                         dalloc<float>(256), 0, 0);
    cudaDeviceSynchronize();
}

/* ---- cp.async (emu/ptx.h, through kcuda_ptx.h) ---------------------------------------- */

static bool env_is(const char *name, const char *value)
{
    const char *e = getenv(name);
    return e && strcmp(e, value) == 0;
}

enum { CP_THREADS = 64, CP_SNAPS = 11 };
const unsigned char CP_OLD = 0xa5; /* what the destinations hold before the copies */

/* One block of 64 threads, each with three 16-byte chunks of the dynamic
 * shared memory: g1 (a copy of src's 16-byte chunk t, group 1), z (16
 * zero bytes, no source read: full false, group 1) and g2 (src's chunk
 * 64 + t, group 2). Each
 * chunk is filled with CP_OLD first (and a barrier). out[t] gets 11
 * snapshots of 16 bytes: its own g1, z, g2 right after the issue (0-2);
 * its own g1 after a __syncthreads (3); g1, z, g2 after wait<1> (4-6);
 * g2 after wait<0> (7); thread (t + 32) % 64's g1, z, g2 after a
 * __syncthreads (8-10). */
__global__ void k_cp_async(unsigned char *out, const unsigned char *src)
{
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned t = threadIdx.x, o = (t + 32) % CP_THREADS;
    unsigned char *g1 = smem, *z = smem + 16 * CP_THREADS, *g2 = smem + 32 * CP_THREADS;
    unsigned char *snap = out + t * CP_SNAPS * 16;
    memset(g1 + 16 * t, CP_OLD, 16);
    memset(z + 16 * t, CP_OLD, 16);
    memset(g2 + 16 * t, CP_OLD, 16);
    __syncthreads();
    kc_cp_async16(g1 + 16 * t, src + 16 * t, true);
    kc_cp_async16(z + 16 * t, src + 16 * t, false);
    kc_cp_async_commit();
    kc_cp_async16(g2 + 16 * t, src + 16 * (CP_THREADS + t), true);
    kc_cp_async_commit();
    memcpy(snap + 0 * 16, g1 + 16 * t, 16);
    memcpy(snap + 1 * 16, z + 16 * t, 16);
    memcpy(snap + 2 * 16, g2 + 16 * t, 16);
    __syncthreads(); /* orders no copies */
    memcpy(snap + 3 * 16, g1 + 16 * t, 16);
    kc_cp_async_wait<1>();
    memcpy(snap + 4 * 16, g1 + 16 * t, 16);
    memcpy(snap + 5 * 16, z + 16 * t, 16);
    memcpy(snap + 6 * 16, g2 + 16 * t, 16);
    kc_cp_async_wait<0>();
    memcpy(snap + 7 * 16, g2 + 16 * t, 16);
    __syncthreads(); /* every thread's copies landed: another's are seen */
    memcpy(snap + 8 * 16, g1 + 16 * o, 16);
    memcpy(snap + 9 * 16, z + 16 * o, 16);
    memcpy(snap + 10 * 16, g2 + 16 * o, 16);
}

/* Runs k_cp_async; checks the snapshots, early: the copies landed as
 * issued (EMU_CP_ASYNC=early), else at the waits. */
static void cp_async_case(bool early)
{
    std::vector<unsigned char> hs(2 * CP_THREADS * 16);
    for (size_t i = 0; i < hs.size(); i++)
        hs[i] = (unsigned char)(1 + i % 127); /* never 0 nor CP_OLD; no two chunks alike */
    unsigned char *src = dalloc<unsigned char>(hs.size());
    unsigned char *out = dalloc<unsigned char>(CP_THREADS * CP_SNAPS * 16);
    cudaMemcpy(src, hs.data(), hs.size(), cudaMemcpyHostToDevice);
    k_cp_async<<<1, CP_THREADS, 3 * 16 * CP_THREADS>>>(out, src);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<unsigned char> h(CP_THREADS * CP_SNAPS * 16);
    cudaMemcpy(h.data(), out, h.size(), cudaMemcpyDeviceToHost);
    const unsigned char zero[16] = {0};
    unsigned char old[16];
    memset(old, CP_OLD, 16);
    int bad = 0;
    for (unsigned t = 0; t < CP_THREADS; t++) {
        unsigned o = (t + 32) % CP_THREADS;
        const unsigned char *g1 = &hs[16 * t], *g2 = &hs[16 * (CP_THREADS + t)];
        const unsigned char *want[CP_SNAPS] = {
            early ? g1 : old, early ? zero : old, early ? g2 : old, /* issued */
            early ? g1 : old,                                      /* a barrier later */
            g1, zero, early ? g2 : old,                            /* wait<1> */
            g2,                                                    /* wait<0> */
            &hs[16 * o], zero, &hs[16 * (CP_THREADS + o)]};        /* another's, after a barrier */
        for (unsigned k = 0; k < CP_SNAPS; k++)
            if (memcmp(&h[(t * CP_SNAPS + k) * 16], want[k], 16) != 0 && bad++ < 6)
                fprintf(stderr, "# thread %u snapshot %u: byte 0 is 0x%02x, want 0x%02x\n", t, k,
                        h[(t * CP_SNAPS + k) * 16], want[k][0]);
    }
    CHECK(bad == 0);
}

static void t_cp_async()
{
    cp_async_case(false);
}

static void t_cp_async_early()
{
    cp_async_case(true);
}

/* how 0: a destination 8 bytes off 16; 1: one in global memory; 2: a
 * source 8 bytes off 16; 3: 129 copies queued (committed, never waited
 * for: past the emulator's queue, CP_MAX). */
__global__ void k_cp_async_bad(unsigned char *g, int how)
{
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *d = smem + 16 * threadIdx.x;
    const unsigned char *s = g + 16 * threadIdx.x;
    if (how == 0)
        kc_cp_async16(d + 8, s, true);
    else if (how == 1)
        kc_cp_async16(g + 16 * (32 + threadIdx.x), s, true);
    else if (how == 2)
        kc_cp_async16(d, s + 8, true);
    else
        for (int i = 0; i < 129; i++) {
            kc_cp_async16(d, s, true);
            kc_cp_async_commit();
        }
    kc_cp_async_wait<0>();
    g[16 * threadIdx.x] = d[0];
}

static void t_cp_async_misaligned_destination()
{
    k_cp_async_bad<<<1, 32, 32 * 16 + 16>>>(dalloc<unsigned char>(64 * 16), 0);
    expect_fault(cudaErrorMisalignedAddress);
}

static void t_cp_async_global_destination()
{
    k_cp_async_bad<<<1, 32, 32 * 16>>>(dalloc<unsigned char>(64 * 16), 1);
    expect_fault(cudaErrorIllegalAddress);
}

static void t_cp_async_misaligned_source()
{
    k_cp_async_bad<<<1, 32, 32 * 16>>>(dalloc<unsigned char>(64 * 16), 2);
    expect_fault(cudaErrorMisalignedAddress);
}

static void t_cp_async_too_many()
{
    k_cp_async_bad<<<1, 32, 32 * 16>>>(dalloc<unsigned char>(64 * 16), 3);
    expect_fault(cudaErrorLaunchFailure);
}

/* Thread 0 copies 16 bytes into shared memory and waits for them; thread
 * 32 (another warp) reads them with no __syncthreads between (a race TSan
 * must see: the copy's write is thread 0's, made at its wait, or at the
 * issue with EMU_CP_ASYNC=early). */
__global__ void k_race_cp_async(unsigned char *out, const unsigned char *src)
{
    extern __shared__ __align__(128) unsigned char smem[];
    if (threadIdx.x == 0) {
        kc_cp_async16(smem, src, true);
        kc_cp_async_commit();
        kc_cp_async_wait<0>();
    }
    if (threadIdx.x == 32)
        out[0] = smem[3];
}

static void t_race_cp_async()
{
    k_race_cp_async<<<1, 64, 16>>>(dalloc<unsigned char>(16), dalloc<unsigned char>(16));
    cudaDeviceSynchronize();
}

/* ---- warps abreast or one at a time (EMU_WARPS) ------------------------------------------ */

enum { WS_WARPS = 3, WS_STEPS = 3 };

/* Each warp passes 3 __syncwarp; after each, its lane 0 takes a ticket
 * (an atomic counter: the order in which the warps ran, no race). */
__global__ void k_warps(int *ticket_of, int *counter)
{
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (unsigned s = 0; s < WS_STEPS; s++) {
        __syncwarp();
        if (lane == 0)
            ticket_of[w * WS_STEPS + s] = ST_FETCH_ADD(counter, 1);
    }
    __syncthreads();
}

/* The tickets warp w's steps got; the warps' order (first to last, or
 * last to first with EMU_ORDER=reverse) is rank: serial, the warp of rank
 * r takes its 3 steps' tickets 3r..3r+2 (each runs alone to its barrier);
 * abreast, step s of every warp comes before step s + 1 of any (rank r,
 * step s: 3s + r). */
static void warps_case(bool serial)
{
    int *tick = dalloc<int>(WS_WARPS * WS_STEPS), *counter = dalloc<int>(1);
    k_warps<<<1, 32 * WS_WARPS>>>(tick, counter);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    int h[WS_WARPS * WS_STEPS];
    cudaMemcpy(h, tick, sizeof h, cudaMemcpyDeviceToHost);
    bool reverse = env_is("EMU_ORDER", "reverse");
    int bad = 0;
    for (int w = 0; w < WS_WARPS; w++) {
        int rank = reverse ? WS_WARPS - 1 - w : w;
        for (int s = 0; s < WS_STEPS; s++) {
            int want = serial ? WS_STEPS * rank + s : WS_WARPS * s + rank;
            if (h[w * WS_STEPS + s] != want && bad++ < 4)
                fprintf(stderr, "# warp %d step %d: ticket %d, want %d\n", w, s, h[w * WS_STEPS + s], want);
        }
    }
    CHECK(bad == 0);
}

static void t_warps_serial()
{
    warps_case(true);
}

static void t_warps_abreast()
{
    warps_case(false);
}

/* ---- conversions ------------------------------------------------------------------ */

static void t_convert()
{
    /* ties to even, subnormals, overflow, NaN */
    CHECK(bits16(__float2bfloat16_rn(1.0f + 0x1p-8f)) == 0x3f80);         /* tie, to even */
    CHECK(bits16(__float2bfloat16_rn(1.0f + 0x1p-7f + 0x1p-8f)) == 0x3f82); /* tie, up */
    CHECK(bits16(__float2bfloat16_rn(3.0e38f * 1.2f)) == 0x7f80);
    CHECK(bits16(__float2bfloat16_rn(NAN)) == 0x7fff);
    CHECK(bits16(__float2half_rn(1.0f + 0x1p-11f)) == 0x3c00);
    CHECK(bits16(__float2half_rn(65504.0f)) == 0x7bff);
    CHECK(bits16(__float2half_rn(65519.0f)) == 0x7bff);
    CHECK(bits16(__float2half_rn(65520.0f)) == 0x7c00);
    CHECK(bits16(__float2half_rn(0x1p-24f)) == 0x0001);
    CHECK(bits16(__float2half_rn(0x1p-25f)) == 0x0000);
    CHECK(bits16(__float2half_rn(0x1.8p-25f)) == 0x0001);
    CHECK(bits16(__float2half_rn(-0x1p-14f)) == 0x8400);
    CHECK(bits16(__float2half_rn(NAN)) == 0x7fff);
    CHECK(__half2float(of_bits<__half>(0x0001)) == 0x1p-24f);
    CHECK(__half2float(of_bits<__half>(0xfbff)) == -65504.0f);
    CHECK(__bfloat162float(of_bits<__nv_bfloat16>(0xc0a0)) == -5.0f);
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

/* A kernel handed another GPU's memory (no peer access): refused as the
 * fault it would be, the launch's GPU's own is fine. */
static void t_other_gpu()
{
    setenv("MESH_EMU_GPUS", "2", 1); /* (read once, at the process's first device call) */
    int n = 0;
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 2);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    int *theirs = dalloc<int>(1);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    int *mine = dalloc<int>(1);
    k_count<<<1, 32>>>(mine);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    k_count<<<1, 32>>>(theirs);
    expect_fault(cudaErrorIllegalAddress);
    /* device 0's fault is its own: a thread that has not chosen a device
     * (device 0's) can read that and choose device 1, and work there */
    bool fine = false;
    std::thread other([&] {
        int d = -1;
        fine = cudaGetDevice(&d) == cudaSuccess && d == 0 && cudaSetDevice(1) == cudaSuccess;
        k_count<<<1, 32>>>(theirs);
        fine = fine && cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess;
    });
    other.join();
    CHECK(fine);
    CHECK(cudaSetDevice(0) == cudaErrorIllegalAddress); /* (the chosen device's sticky error) */
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
            CHECK(bits16(D[i + j * ldc]) == bits16(__float2bfloat16_rn(g)));
            CHECK(bits16(X[i + j * ldc]) == bits16(__float2bfloat16_rn(pre)));
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

/* Blocks taking turns (kc_wait_ge, kc_add_release): block b waits until
 * the b blocks before it are done, then appends its index with plain
 * accesses, which only the turns order (ThreadSanitizer would report
 * them otherwise), and gives the next block its turn. */
__global__ void k_turns(int *turn, int *order, int *len)
{
    if (threadIdx.x == 0)
        kc_wait_ge(turn, (int)blockIdx.x);
    __syncthreads();
    if (threadIdx.x == 0)
        order[(*len)++] = (int)blockIdx.x;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        kc_add_release(turn, 1);
}

static void t_turns()
{
    enum { N = 24 }; /* more blocks than runners: some wait for blocks run before them on their runner */
    int *turn = dalloc<int>(1), *order = dalloc<int>(N), *len = dalloc<int>(1);
    k_turns<<<N, 64>>>(turn, order, len);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    int h[N], t = 0, n = 0;
    cudaMemcpy(h, order, sizeof h, cudaMemcpyDeviceToHost);
    cudaMemcpy(&t, turn, sizeof t, cudaMemcpyDeviceToHost);
    cudaMemcpy(&n, len, sizeof n, cudaMemcpyDeviceToHost);
    CHECK(t == N && n == N);
    for (int i = 0; i < N; i++)
        CHECK(h[i] == i);
}

/* ---- streams: the device runs behind the host -------------------------------------- */

/* Waits until the host sets *flag (page-locked memory the device reads),
 * then writes v: a stream held until the host lets it go. */
__global__ void k_hold(const int *flag, int *x, int v)
{
    while (!ST_LOAD_ACQUIRE(flag)) {
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
    int mode;  /* MODE_*: checks what one setting of the emulator does (skipped under the other) */
};

/* The settings a case checks the emulator's behaviour under (exec.cpp's
 * environment variables; run.sh runs the self-tests under both). */
enum { MODE_ANY, MODE_CP_LATE, MODE_CP_EARLY, MODE_WARPS_ABREAST, MODE_WARPS_SERIAL };

/* Why a case of this mode does not run under this environment; null if it does. */
static const char *mode_skip(int mode)
{
    bool early = env_is("EMU_CP_ASYNC", "early"), serial = env_is("EMU_WARPS", "serial");
    switch (mode) {
    case MODE_CP_LATE:
        return early ? "checks cp.async copies landing at the wait (EMU_CP_ASYNC=early lands them as issued)"
                     : nullptr;
    case MODE_CP_EARLY: return early ? nullptr : "needs EMU_CP_ASYNC=early (run.sh's second self-test run)";
    case MODE_WARPS_ABREAST:
        return serial ? "checks the warps abreast (EMU_WARPS=serial runs them one at a time)" : nullptr;
    case MODE_WARPS_SERIAL: return serial ? nullptr : "needs EMU_WARPS=serial (run.sh's second self-test run)";
    }
    return nullptr;
}

static const Case cases[] = {
    {"launch_limits", t_launch_limits, 0, 0, 0},
    {"threads_barriers_fill", t_threads, 0, 0, 0},
    {"shuffles", t_shfl, 0, 0, 0},
    {"shuffle_exited_lane", t_shfl_exited, 0, 0, 0},
    {"shuffle_not_in_own_mask", t_shfl_not_in_mask, 0, 0, 0},
    {"shuffle_reads_outside_mask", t_shfl_reads_outside, 0, 0, 0},
    {"syncthreads_after_exit", t_sync_exited, 0, 0, 0},
    {"deadlock", t_deadlock, 0, 0, 0},
    {"mma_m16n8k16", t_mma16816, 0, 0, 0},
    {"mma_m16n8k16_divergent_type", t_mma16816_divergent, 0, 0, 0},
    {"mma_m16n8k8_tf32", t_mma1688_tf32, 0, 0, 0},
    {"ldmatrix", t_ldsm, 0, 0, 0},
    {"ldmatrix_misaligned", t_ldsm_misaligned, 0, 0, 0},
    {"ldmatrix_divergent_trans", t_ldsm_divergent_trans, 0, 0, 0},
    {"ldmatrix_global_memory", t_ldsm_global, 0, 0, 0},
    {"ldmatrix_past_dynamic_shared_memory", t_ldsm_past_dynamic, 0, 0, 0},
    {"wgmma", t_wgmma, 0, 0, 0},
    {"wgmma_half_warpgroup", t_wgmma_half_warpgroup, 0, 0, 0},
    {"wgmma_misaligned", t_wgmma_misaligned, 0, 0, 0},
    {"wgmma_past_dynamic_shared_memory", t_wgmma_past_dynamic, 0, 0, 0},
    {"wgmma_not_waited", t_wgmma_not_waited, 0, 0, 0},
    {"wgmma_divergent", t_wgmma_divergent, 0, 0, 0},
    {"wgmma_fenced", t_wgmma_fenced, 0, 0, 0},
    {"wgmma_no_fence", t_wgmma_no_fence, 0, 0, 0},
    {"wgmma_d_written_after_fence", t_wgmma_d_written_after_fence, 0, 0, 0},
    {"wgmma_a_written_after_fence", t_wgmma_a_written_after_fence, 0, 0, 0},
    {"wgmma_no_proxy_fence", t_wgmma_no_proxy_fence, 0, 0, 0},
    {"wgmma_proxy_fence_before_the_copy", t_wgmma_proxy_fence_before_the_copy, 0, 0, MODE_CP_LATE},
    {"shared_memory_past_the_launchs_bytes", t_smem_past_dynamic, 0, 0, 0},
    {"cp_async", t_cp_async, 0, 0, MODE_CP_LATE},
    {"cp_async_early", t_cp_async_early, 0, 0, MODE_CP_EARLY},
    {"cp_async_misaligned_destination", t_cp_async_misaligned_destination, 0, 0, 0},
    {"cp_async_global_destination", t_cp_async_global_destination, 0, 0, 0},
    {"cp_async_misaligned_source", t_cp_async_misaligned_source, 0, 0, 0},
    {"cp_async_too_many_queued", t_cp_async_too_many, 0, 0, 0},
    {"warps_abreast", t_warps_abreast, 0, 0, MODE_WARPS_ABREAST},
    {"warps_serial", t_warps_serial, 0, 0, MODE_WARPS_SERIAL},
    {"conversions", t_convert, 0, 0, 0},
    {"memory", t_memory, 0, 0, 0},
    {"kernel_given_another_gpus_memory", t_other_gpu, 0, 0, 0},
    {"cublaslt", t_cublaslt, 0, 0, 0},
    {"cub_sort_pairs", t_cub, 0, 0, 0},
    {"launch_returns_before_the_kernel_runs", t_async_launch, 0, 1, 0},
    {"stream_wait_event_holds_the_stream", t_wait_event, 0, 1, 0},
    {"timed_events", t_event_timing, 0, 1, 0},
    {"legacy_stream_waits_for_blocking_streams", t_legacy_stream, 0, 1, 0},
    {"copies_take_their_sources_in_order", t_copy_sources, 0, 1, 0},
    {"no_race", t_norace, 0, 0, 0},
    {"blocks_take_turns", t_turns, 0, 0, 0},
    {"race_missing_syncthreads", t_race_block, 1, 0, 0},
    {"race_missing_syncwarp", t_race_warp, 1, 0, 0},
    {"race_between_blocks", t_race_grid, 1, 0, 0},
    {"race_ldmatrix_missing_syncwarp", t_race_ldsm, 1, 0, 0},
    {"race_cp_async_missing_syncthreads", t_race_cp_async, 1, 0, 0},
    {"race_host_reads_before_the_copy", t_race_host_read, 1, 1, 0},
};

enum { NCASES = sizeof cases / sizeof cases[0] };

/* The cases a GPU runs (gpu_selftest, built by nvcc: tests/gpu/run.sh's
 * first step): CUDA's documented semantics that the emulation models and
 * the kernels rely on, the instructions' layouts first (mma.sync,
 * ldmatrix, wgmma's descriptors, in both majors and at the attention's
 * offsets), so that a GPU checks the emulation itself, and where it
 * differs says which instruction. Not the mistakes the emulation must
 * catch (on a GPU some hang or are undefined), its modes, its races, nor
 * what only it checks strictly (copies past an allocation, bad handles,
 * when a cp.async lands). */
static const char *const on_a_gpu[] = {
    "threads_barriers_fill", "shuffles", "mma_m16n8k16", "mma_m16n8k8_tf32", "ldmatrix", "wgmma", "conversions",
    "cublaslt", "cub_sort_pairs", "launch_returns_before_the_kernel_runs",
    "stream_wait_event_holds_the_stream", "timed_events",
};

static bool runs_here(const char *name)
{
    if (EMULATED)
        return true;
    for (const char *n : on_a_gpu)
        if (strcmp(n, name) == 0)
            return true;
    return false;
}

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
    if (!EMULATED) { /* a GPU, or a clear skip */
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess || count == 0) {
            printf("SKIP gpu: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "no device");
            return 0;
        }
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            printf("# device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    }
    int passed = 0, failed = 0, n = 0;
    printf("1..%d\n", NCASES);
    for (const Case &c : cases) {
        n++;
        if (!runs_here(c.name)) {
            printf("ok %d - %s # SKIP the emulation's own (on a GPU: undefined, or no check)\n", n, c.name);
            passed++;
            continue;
        }
        if (c.race && !TSAN) {
            printf("ok %d - %s # SKIP needs ThreadSanitizer (make gpu-emu-tsan)\n", n, c.name);
            passed++;
            continue;
        }
        if (const char *why = mode_skip(c.mode)) {
            printf("ok %d - %s # SKIP %s\n", n, c.name, why);
            passed++;
            continue;
        }
        /* under TSan (a second a case, each in a process of its own):
         * only what TSan adds to, the races it must report, a kernel
         * without one, the barriers, blocks taking turns, and the
         * streams' ordering; make gpu-emu runs the others twice */
        if (TSAN && !c.race && !c.async && strcmp(c.name, "no_race") != 0 &&
            strcmp(c.name, "threads_barriers_fill") != 0 && strcmp(c.name, "blocks_take_turns") != 0) {
            printf("ok %d - %s # SKIP under ThreadSanitizer (make gpu-emu runs it)\n", n, c.name);
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
