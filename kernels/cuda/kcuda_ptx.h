/* kcuda_ptx.h — internal to kernels/cuda: PTX instructions CUDA C++ has
 * no documented-layout form of, for kernels that keep their tiles in
 * registers and load them behind their math (attention.cu). WMMA's
 * fragments have no documented layout, so a kernel using them must go
 * through shared memory to reach its elements; these do not.
 *
 *   kc_mma16816<L>(d, a, b)   d += a b: mma.sync.aligned.m16n8k16.row.col,
 *                             fp32 accumulators, L = bf16 or f16 inputs
 *   kc_mma1688_tf32(d, a, b)  d += a b: mma.sync.aligned.m16n8k8.row.col
 *                             .f32.tf32.tf32.f32 (fp32 operands as TF32)
 *   kc_tf32(x)                cvt.rna.tf32.f32: x rounded to TF32 (10
 *                             bits of mantissa, half away from zero), its
 *                             fp32 bits; kc_tf32_round(x) the same as a
 *                             float, kc_bits(x) an fp32's bits
 *   kc_ldsm4(r, p)            ldmatrix.sync.aligned.m8n8.x4.shared.b16
 *   kc_ldsm4_t(r, p)          the same with .trans
 *   kc_pack2<L>(lo, hi)       two floats rounded to L, lo in the low half
 *   kc_cp_async16, kc_cp_async16_n, kc_cp_async_commit, kc_cp_async_wait<N>
 *                             cp.async 16-byte copies into shared memory
 *                             (at the end)
 *   kc_wait_ge, kc_add_release
 *                             blocks taking turns through a counter in
 *                             global memory (acquire and release)
 *   kc_wgmma<L, N, TRANSB>(d, a, b, lbo, sbo, acc), kc_wgmma_ss (A from
 *   shared memory too), kc_wgmma_fence,
 *   kc_wgmma_commit, kc_wgmma_wait<N>, kc_wgmma_hold, kc_fence_proxy_async, kc_wgmma_desc
 *                             warpgroup products (sm_90a, at the end)
 *
 * Layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
 * point type"; g = lane / 4, t = lane % 4; each 32-bit register holds two
 * 2-byte elements, the lower-indexed one in its low half):
 *   A [16 x 16] row-major: a[0] (g, 2t..2t+1), a[1] (g+8, 2t..),
 *                          a[2] (g, 2t+8..),   a[3] (g+8, 2t+8..)
 *   B [16 x 8] (k x n):    b[0] (k 2t..2t+1, n g), b[1] (k 2t+8.., n g)
 *   C, D [16 x 8] fp32:    d[0], d[1] (g, 2t), (g, 2t+1);
 *                          d[2], d[3] (g+8, 2t), (g+8, 2t+1)
 * m16n8k8 with TF32 operands (one 32-bit element a register, "Matrix
 * Fragments for mma.m16n8k8", .tf32):
 *   A [16 x 8] row-major:  a[0] (g, t), a[1] (g+8, t), a[2] (g, t+4),
 *                          a[3] (g+8, t+4)
 *   B [8 x 8] (k x n):     b[0] (k t, n g), b[1] (k t+4, n g)
 *   C, D [16 x 8] fp32:    as m16n8k16's
 * An operand is rounded by kc_tf32 first: what the tensor cores do with
 * the low 13 bits of one that is not is not documented (the emulation
 * cuts them). ldmatrix (b16) loads fp32 elements whole in this A layout
 * and B's [n][k]: lane (g, t)'s register of an 8 x 8 b16 matrix is its
 * row g's 4-byte element t.
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
#include <emu/ptx.h> /* defines: emu::mma_m16n8k16, emu::mma_m16n8k8_tf32, emu::ldmatrix_x4, emu::cp_async16 */
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

/* x rounded to TF32 (cvt.rna: to nearest, half away from zero; Inf and
 * NaN as they are), as the bits of an fp32 whose low 13 bits are 0: the
 * operand kc_mma1688_tf32 takes. */
__device__ __forceinline__ uint32_t kc_tf32(float x)
{
    uint32_t u;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(EMU_CUDA_RUNTIME_H)
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(u) : "f"(x));
#else
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0x1000u) & ~0x1fffu;
#endif
    return u;
}

/* x rounded as kc_tf32 rounds it, as an fp32 value (a tile rounded once
 * in shared memory, its elements then operands as they stand). */
__device__ __forceinline__ float kc_tf32_round(float x)
{
    uint32_t u = kc_tf32(x);
    float r;
    memcpy(&r, &u, 4);
    return r;
}

/* An fp32's bits, for an operand register. */
__device__ __forceinline__ uint32_t kc_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

__device__ __forceinline__ void kc_mma1688_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::mma_m16n8k8_tf32(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
    (void)d, (void)a, (void)b;
    __trap(); /* TF32 tensor cores need sm_80 or later */
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

/* ---- warpgroup products (wgmma, sm_90a) --------------------------------
 *
 * wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: the 4 warps of a
 * warpgroup (threads 128 i .. 128 i + 127, all of them) compute
 * D[64 x N] (+)= A[64 x 16] B[16 x N]; warp w of the group holds rows
 * 16 w .. 16 w + 15 of A and D in mma.m16n8k16's layouts (above): a[4]
 * as that A operand, and d[N / 8][4] as N / 8 of its C/D tiles side by
 * side, d[j][e] at row g + 8 (e / 2), column 8 j + 2 t + e % 2. B is read
 * from shared memory by the tensor cores themselves, once for the whole
 * warpgroup, in the canonical layout without swizzling (PTX ISA,
 * "Shared Memory Matrix Layout"): 8 x 8 core matrices of 128 contiguous
 * bytes, 8 rows of 16 bytes; TRANSB 0 (K-major, B stored [n][k]): element
 * (k, n) at byte 16 (n % 8) + sbo (n / 8) + 2 (k % 8) + lbo (k / 8);
 * TRANSB 1 (N-major, stored [k][n]): 2 (n % 8) + sbo (n / 8) + 16 (k % 8)
 * + lbo (k / 8). b 16-byte aligned, lbo and sbo multiples of 16.
 *
 * Asynchronous: kc_wgmma only queues the product; kc_wgmma_commit closes
 * the thread's group of them, kc_wgmma_wait<N> waits until at most the
 * N most recent groups are pending. Until then d, a and b's bytes must
 * not be touched (not read, not written). kc_wgmma_fence must come before
 * the first kc_wgmma after d or a were written by other instructions.
 * Shared memory written by ordinary stores or cp.async is seen by the
 * tensor cores' reads (the async proxy) only after kc_fence_proxy_async
 * in the writing threads, then a barrier.
 *
 * Built only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL; the Makefile's
 * CUDA_ARCH_WGMMA, attention_wg.cu's): any other target traps, and the
 * host never launches such a kernel there (attn_wg_available's probe).
 * On the CPU emulation these are
 * emu/ptx.h's wgmma_rs, wgmma_commit and wgmma_wait, with the same
 * layouts and the same deferral, and the two fences its wgmma_fence and
 * fence_proxy_async, which let it check at each product that neither is
 * missing.
 */

/* The 64-bit matrix descriptor of B at shared address `saddr` (no
 * swizzle, base offset 0): bits 0-13 the address, 16-29 lbo, 32-45 sbo,
 * each (x & 0x3ffff) >> 4. */
__host__ __device__ constexpr uint64_t kc_wgmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | (uint64_t)((lbo & 0x3ffffu) >> 4) << 16 |
           (uint64_t)((sbo & 0x3ffffu) >> 4) << 32;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(EMU_CUDA_RUNTIME_H)
#define KC_WGMMA 1
#endif
/* A device pass for a target without wgmma (the build's compute_90 PTX):
 * a kernel made of warpgroup products compiles to its trap alone
 * (KC_WGMMA_KERNEL_BODY), not to code that could only trap, which would
 * double its compile time for nothing. */
#if defined(__CUDA_ARCH__) && !defined(KC_WGMMA) && !defined(EMU_CUDA_RUNTIME_H)
#define KC_WGMMA_ABSENT 1
#endif

/* The asm of one product: N / 2 accumulators (the operands after TRANS),
 * then a[4] (ASTR), the descriptor, acc (scale-d: 0 ignores D's old
 * values) and TRANSB, each named by its operand number. */
#define KC_WG_STR16                                                                                             \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define KC_WG_STR32                                                                                             \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
    "%28,%29,%30,%31}"
#define KC_WG_STR64                                                                                             \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
    "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,"  \
    "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define KC_WG_D1(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define KC_WG_D4(j) KC_WG_D1(j), KC_WG_D1(j + 1), KC_WG_D1(j + 2), KC_WG_D1(j + 3)
#define KC_WG_ASM(SHAPE, TY, DSTR, ASTR, DESC, ACC, TRANS, ...)                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                                \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " DSTR ", " ASTR ", " DESC ", p, 1, 1, " \
                 TRANS ";\n}\n"                                                                                 \
                 : __VA_ARGS__                                                                                   \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc), "n"(TRANSB))

template <typename L, int N, int TRANSB>
__device__ __forceinline__ void kc_wgmma(float (&d)[N / 8][4], const uint32_t (&a)[4], const void *b, uint32_t lbo,
                                         uint32_t sbo, int acc)
{
    static_assert(sizeof(L) == 2 && (N == 32 || N == 64 || N == 128) && (TRANSB == 0 || TRANSB == 1),
                  "kc_wgmma: bf16 or f16 inputs, N 32, 64 or 128");
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::wgmma_rs(&d[0][0], N, a, b, lbo, sbo, TRANSB, std::is_same<L, bf16>::value, acc != 0);
#elif defined(KC_WGMMA)
    uint64_t desc = kc_wgmma_desc((uint32_t)__cvta_generic_to_shared(b), lbo, sbo);
    constexpr bool BF = std::is_same<L, bf16>::value;
    if constexpr (N == 32) {
        if constexpr (BF)
            KC_WG_ASM("m64n32k16", "bf16", KC_WG_STR16, "{%16,%17,%18,%19}", "%20", "%21", "%22", KC_WG_D4(0));
        else
            KC_WG_ASM("m64n32k16", "f16", KC_WG_STR16, "{%16,%17,%18,%19}", "%20", "%21", "%22", KC_WG_D4(0));
    } else if constexpr (N == 64) {
        if constexpr (BF)
            KC_WG_ASM("m64n64k16", "bf16", KC_WG_STR32, "{%32,%33,%34,%35}", "%36", "%37", "%38", KC_WG_D4(0),
                      KC_WG_D4(4));
        else
            KC_WG_ASM("m64n64k16", "f16", KC_WG_STR32, "{%32,%33,%34,%35}", "%36", "%37", "%38", KC_WG_D4(0),
                      KC_WG_D4(4));
    } else {
        if constexpr (BF)
            KC_WG_ASM("m64n128k16", "bf16", KC_WG_STR64, "{%64,%65,%66,%67}", "%68", "%69", "%70",
                      KC_WG_D4(0), KC_WG_D4(4), KC_WG_D4(8), KC_WG_D4(12));
        else
            KC_WG_ASM("m64n128k16", "f16", KC_WG_STR64, "{%64,%65,%66,%67}", "%68", "%69", "%70",
                      KC_WG_D4(0), KC_WG_D4(4), KC_WG_D4(8), KC_WG_D4(12));
    }
#elif defined(__CUDA_ARCH__)
    (void)d, (void)a, (void)b, (void)lbo, (void)sbo, (void)acc;
    __trap(); /* wgmma needs sm_90a */
#else
    (void)d, (void)a, (void)b, (void)lbo, (void)sbo, (void)acc;
#endif
}

/* The same with A [64 x 16] from shared memory too, K-major (stored
 * [m][k]: element (m, k) at 16 (m % 8) + asbo (m / 8) + 2 (k % 8) +
 * albo (k / 8)), read by the tensor cores as B is; N = 64 only. */
#define KC_WG_ASM_SS(TY)                                                                                       \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                  \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " KC_WG_STR32 ", %32, %33, p, 1, 1, " \
                 "0, %35;\n}\n"                                                                                 \
                 : KC_WG_D4(0), KC_WG_D4(4)                                                                      \
                 : "l"(adesc), "l"(desc), "r"(acc), "n"(TRANSB))

template <typename L, int N, int TRANSB>
__device__ __forceinline__ void kc_wgmma_ss(float (&d)[N / 8][4], const void *a, uint32_t albo, uint32_t asbo,
                                            const void *b, uint32_t lbo, uint32_t sbo, int acc)
{
    static_assert(sizeof(L) == 2 && N == 64 && (TRANSB == 0 || TRANSB == 1),
                  "kc_wgmma_ss: bf16 or f16 inputs, N 64");
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::wgmma_ss(&d[0][0], N, a, albo, asbo, b, lbo, sbo, TRANSB, std::is_same<L, bf16>::value, acc != 0);
#elif defined(KC_WGMMA)
    uint64_t adesc = kc_wgmma_desc((uint32_t)__cvta_generic_to_shared(a), albo, asbo);
    uint64_t desc = kc_wgmma_desc((uint32_t)__cvta_generic_to_shared(b), lbo, sbo);
    if constexpr (std::is_same<L, bf16>::value)
        KC_WG_ASM_SS("bf16");
    else
        KC_WG_ASM_SS("f16");
#elif defined(__CUDA_ARCH__)
    (void)d, (void)a, (void)albo, (void)asbo, (void)b, (void)lbo, (void)sbo, (void)acc;
    __trap(); /* wgmma needs sm_90a */
#else
    (void)d, (void)a, (void)albo, (void)asbo, (void)b, (void)lbo, (void)sbo, (void)acc;
#endif
}

__device__ __forceinline__ void kc_wgmma_fence()
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::wgmma_fence();
#elif defined(KC_WGMMA)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void kc_wgmma_commit()
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::wgmma_commit();
#elif defined(KC_WGMMA)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void kc_wgmma_wait()
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::wgmma_wait(N);
#elif defined(KC_WGMMA)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/* Pins d's registers at this point of the program, after the
 * kc_wgmma_wait that completed the products writing them: nvcc sees
 * the product's asm as the registers' last writer, so without this it
 * could move an instruction that reads or writes them above the wait
 * (CUTLASS's warpgroup_fence_operand does the same). No instruction. */
template <int N>
__device__ __forceinline__ void kc_wgmma_hold(float (&d)[N][4])
{
#if defined(KC_WGMMA)
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(d[j][e])::"memory");
#else
    (void)d;
#endif
}

/* Orders this thread's earlier shared-memory writes (stores, landed
 * cp.async copies) before later reads by the async proxy (wgmma's B). */
__device__ __forceinline__ void kc_fence_proxy_async()
{
#ifdef EMU_CUDA_RUNTIME_H
    ::emu::fence_proxy_async();
#elif defined(KC_WGMMA)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

#endif
