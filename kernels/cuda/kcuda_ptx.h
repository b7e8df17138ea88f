/* kcuda_ptx.h — internal to kernels/cuda: PTX instructions CUDA C++ has
 * no documented-layout form of, for kernels that keep their tiles in
 * registers and load them behind their math (attention.cu). WMMA's
 * fragments have no documented layout, so a kernel using them must go
 * through shared memory to reach its elements; these do not.
 *
 *   kc_mma16816<L>(d, a, b)   d += a b: mma.sync.aligned.m16n8k16.row.col,
 *                             fp32 accumulators, L = bf16 or f16 inputs
 *   kc_ldsm4(r, p)            ldmatrix.sync.aligned.m8n8.x4.shared.b16
 *   kc_ldsm4_t(r, p)          the same with .trans
 *   kc_pack2<L>(lo, hi)       two floats rounded to L, lo in the low half
 *   kc_cp_async16, kc_cp_async16_n, kc_cp_async_commit, kc_cp_async_wait<N>
 *                             cp.async 16-byte copies into shared memory
 *                             (at the end)
 *   kc_wait_ge, kc_add_release
 *                             blocks taking turns through a counter in
 *                             global memory (acquire and release)
 *
 * Layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
 * point type"; g = lane / 4, t = lane % 4; each 32-bit register holds two
 * 2-byte elements, the lower-indexed one in its low half):
 *   A [16 x 16] row-major: a[0] (g, 2t..2t+1), a[1] (g+8, 2t..),
 *                          a[2] (g, 2t+8..),   a[3] (g+8, 2t+8..)
 *   B [16 x 8] (k x n):    b[0] (k 2t..2t+1, n g), b[1] (k 2t+8.., n g)
 *   C, D [16 x 8] fp32:    d[0], d[1] (g, 2t), (g, 2t+1);
 *                          d[2], d[3] (g+8, 2t), (g+8, 2t+1)
 * ldmatrix .x4: lanes 8i..8i+7 give the 16-byte rows of 8 x 8 matrix i
 * (shared memory, 16-byte aligned); r[i] is matrix i's (row g, columns 2t,
 * 2t+1), or with .trans its (rows 2t, 2t+1, column g). So a row-major
 * [16 x 16] tile loads as an A operand, a tile stored [n][k] as B operands
 * (no .trans) and one stored [k][n] as B operands with .trans.
 *
 * On the CPU emulation (tests/gpu/emu) the same calls are warp-synchronous
 * operations of the emulator (emu/ptx.h) with these layouts.
 */
#ifndef MESH_KCUDA_PTX_H
#define MESH_KCUDA_PTX_H

#include <stdint.h>    /* defines: uint32_t, uint16_t */
#include <string.h>    /* defines: memcpy */
#include <type_traits> /* defines: std::is_same */

#include "kcuda_impl.h"

#ifdef EMU_CUDA_RUNTIME_H
#include <emu/ptx.h> /* defines: emu::mma_m16n8k16, emu::ldmatrix_x4, emu::cp_async16 */
#endif

template <typename L>
__device__ __forceinline__ uint32_t kc_pack2(float lo, float hi)
{
    static_assert(sizeof(L) == 2, "kc_pack2: a 2-byte type");
    L l = kc_to<L>(lo), h = kc_to<L>(hi);
    uint16_t lb, hb;
    memcpy(&lb, &l, 2);
    memcpy(&hb, &h, 2);
    return (uint32_t)lb | (uint32_t)hb << 16;
}

template <typename L>
__device__ __forceinline__ void kc_mma16816(float (&d)[4], const uint32_t (&a)[4],
                                            const uint32_t (&b)[2])
{
    static_assert(sizeof(L) == 2, "kc_mma16816: bf16 or f16 inputs");
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::mma_m16n8k16(d, a, b, std::is_same<L, bf16>::value);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same<L, bf16>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                       "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                       "r"(b[1]));
#elif defined(__CUDA_ARCH__)
    (void)d, (void)a, (void)b;
    __trap(); /* the tensor cores' bf16 path needs sm_80 or later */
#else
    (void)d, (void)a, (void)b;
#endif
}

__device__ __forceinline__ void kc_ldsm4_impl(uint32_t (&r)[4], const void *p,
                                              int trans)
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::ldmatrix_x4(r, p, trans);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
                     "{%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                     "{%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
#else
    (void)p, (void)trans;
    r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

/* p: this lane's row (lanes 8i..8i+7: matrix i's rows 0..7). */
__device__ __forceinline__ void kc_ldsm4(uint32_t (&r)[4], const void *p)
{
    kc_ldsm4_impl(r, p, 0);
}

__device__ __forceinline__ void kc_ldsm4_t(uint32_t (&r)[4], const void *p)
{
    kc_ldsm4_impl(r, p, 1);
}

/* Asynchronous copies into shared memory (cp.async, sm_80): 16 bytes from
 * global memory to shared memory, or 16 zero bytes when !full (its
 * src-size 0: nothing is read); kc_cp_async16_n: the first n bytes (0,
 * 4, 8, 12 or 16) from src, the rest zeros. A thread's copies land only when it waits
 * for them: kc_cp_async_commit() closes the thread's group of copies
 * issued since the last one, kc_cp_async_wait<N>() waits until at most
 * the N most recent committed groups are pending. They are not ordered
 * by __syncthreads, and another thread sees them only after the issuing
 * thread's wait and a barrier. */
__device__ __forceinline__ void kc_cp_async16_n(void *dst, const void *src, int n)
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::cp_async16(dst, src, (unsigned)n);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(n));
#else
    (void)dst, (void)src, (void)n;
#endif
}

__device__ __forceinline__ void kc_cp_async16(void *dst, const void *src, bool full)
{
    kc_cp_async16_n(dst, src, full ? 16 : 0);
}

__device__ __forceinline__ void kc_cp_async_commit()
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> __device__ __forceinline__ void kc_cp_async_wait()
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Blocks taking turns: kc_wait_ge(p, v) spins (one thread) until *p >= v,
 * reading with ld.acquire.gpu and sleeping between reads;
 * kc_add_release(p, v) adds v with red.release.gpu. A block may wait only
 * for blocks of lower linear index (a GPU starts blocks in that order, so
 * those are running or done). A turn that never comes traps after about
 * 2^24 reads (seconds): a launch failure the next CUDA call reports, not
 * a hang. The writer's other threads order their writes before the add by
 * __threadfence and __syncthreads; the waiter's by __syncthreads after. */
__device__ __forceinline__ void kc_wait_ge(const int *p, int v)
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::wait_ge(p, v);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    for (unsigned n = 0;; n++) {
        int x;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
        if (x >= v)
            return;
        if (n == (1u << 24))
            __trap();
        __nanosleep(64);
    }
#else
    (void)p, (void)v;
#endif
}

__device__ __forceinline__ void kc_add_release(int *p, int v)
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::add_release(p, v);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#else
    (void)p, (void)v;
#endif
}

#endif
