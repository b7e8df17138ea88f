/* emu/ptx.h (CPU emulation, tests/gpu/emu): the PTX instructions
 * kernels/cuda/kcuda_ptx.h wraps: mma, ldmatrix and (at the end) cp.async;
 * the first two are those whose register layouts PTX documents (PTX
 * ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" and
 * "ldmatrix"). Both are warp-synchronous operations of the emulator: all 32
 * lanes of the warp must call them (mask 0xffffffff), and they complete in
 * exec.cpp (do_mma, do_ldmatrix) once every lane has.
 *
 * g = lane / 4, t = lane % 4; a 32-bit register holds two 2-byte elements,
 * the lower-indexed one in its low 16 bits.
 *
 * mma_m16n8k16(d, a, b, bf16): mma.sync.aligned.m16n8k16.row.col.f32 with
 * bf16 (bf16 true) or f16 inputs, d += a b:
 *   A [16 x 16] (row, k): a[0] (g, 2t..2t+1), a[1] (g+8, 2t..2t+1),
 *                         a[2] (g, 2t+8..2t+9), a[3] (g+8, 2t+8..2t+9)
 *   B [16 x 8] (k, n):    b[0] (2t..2t+1, g), b[1] (2t+8..2t+9, g)
 *   C, D [16 x 8] fp32:   d[0] (g, 2t), d[1] (g, 2t+1),
 *                         d[2] (g+8, 2t), d[3] (g+8, 2t+1)
 * D[i][j] = C[i][j] + sum over k of A[i][k] B[k][j], each product exact
 * in fp32, summed in k order from C (the tensor cores' internal order and
 * rounding are not emulated). Every lane must pass the same type, else
 * cudaErrorIllegalInstruction.
 *
 * mma_m16n8k8_tf32(d, a, b): mma.sync.aligned.m16n8k8.row.col.f32.tf32
 * .tf32.f32, d += a b, one TF32 element (an fp32's bits) a register:
 *   A [16 x 8] (row, k):  a[0] (g, t), a[1] (g+8, t), a[2] (g, t+4),
 *                         a[3] (g+8, t+4)
 *   B [8 x 8] (k, n):     b[0] (t, g), b[1] (t+4, g)
 *   C, D:                 as m16n8k16's
 * Each operand's low 13 bits are ignored (TF32 keeps 10 of fp32's 23
 * bits of mantissa: a value not rounded first, by cvt.rna, is cut here;
 * PTX leaves such an operand's meaning open, and the kernels always round
 * first), the products exact in fp32 and summed in k order from C, as
 * m16n8k16's.
 *
 * ldmatrix_x4(r, p, trans): ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16.
 * Lanes 8i..8i+7 pass the addresses of rows 0..7 of 8 x 8 matrix i (8
 * contiguous 2-byte elements each); M_i[row][col] is element col of the
 * row lane 8i + row passed. The lane receives r[i] = M_i[g][2t] |
 * M_i[g][2t+1] << 16, or with trans r[i] = M_i[2t][g] | M_i[2t+1][g] << 16.
 * Checked: every lane's row is non-null (else cudaErrorIllegalAddress),
 * 16-byte aligned (cudaErrorMisalignedAddress) and in the block's shared
 * memory (cudaErrorIllegalAddress; exec.cpp says what it can tell), and
 * every lane passes the same trans (cudaErrorIllegalInstruction).
 *
 * ThreadSanitizer: the emulator reads the rows when the operation
 * completes, on the block's runner thread, in exec.cpp, which is not
 * instrumented; TSan sees nothing of that read (no false report, and no
 * race found either). So each lane then reads again, in its own fiber
 * and instrumented (this header is compiled into the kernel), the bytes
 * of the 8 elements it received (op.src, set by the emulator): TSan
 * checks the warp's reads against every write not ordered before them by
 * __syncthreads or __syncwarp (ldmatrix, like the shuffles, orders no
 * memory), including a lane's own row that other lanes receive. The
 * values are the ones read at completion; this read only shows TSan (and
 * ASan) the accesses. The registers (a, b, d, r) are the lane's own, read
 * and written by the emulator as a shuffle's are.
 */
#ifndef EMU_PTX_H
#define EMU_PTX_H

#include <stdint.h> /* uint32_t */

#include <chrono> /* std::chrono::steady_clock */
#include <thread> /* std::this_thread::yield */

#include "device.h"

namespace emu {

inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                         const uint32_t (&b)[2], bool bf16)
{
    WarpOp op = {};
    op.kind = OP_MMA_M16N8K16;
    op.mask = 0xffffffffu;
    op.elem = bf16 ? ELEM_BF16 : ELEM_F16;
    op.a = a;
    op.b = b;
    op.c = d; /* read in full before d is written */
    op.d = d;
    warp_op(&op);
}

inline void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    WarpOp op = {};
    op.kind = OP_MMA_M16N8K8;
    op.mask = 0xffffffffu;
    op.elem = ELEM_TF32;
    op.a = a;
    op.b = b;
    op.c = d; /* read in full before d is written */
    op.d = d;
    warp_op(&op);
}

inline void ldmatrix_x4(uint32_t (&r)[4], const void *p, int trans)
{
    WarpOp op = {};
    op.kind = OP_LDMATRIX_X4;
    op.mask = 0xffffffffu;
    op.ptr = p;
    op.trans = trans ? 1 : 0;
    op.d = r;
    warp_op(&op);
    /* the sanitizers' view of the read (above): bytewise, whatever type
     * the shared memory holds */
    for (int e = 0; e < 8; e++) {
        const volatile unsigned char *q =
            static_cast<const volatile unsigned char *>(op.src[e]);
        (void)q[0];
        (void)q[1];
    }
}

/* cp.async (kcuda_ptx.h's kc_cp_async16, _commit, _wait; exec.cpp):
 * cp_async16(dst, src, n) queues a copy of n (0..16) bytes from src and
 * 16 - n zero bytes into the 16 bytes at dst, in the thread's open group;
 * cp_async_commit() closes that group; cp_async_wait(n) lands, in the
 * order issued, the copies of every committed group but the n most
 * recent. Only then are they written, so a thread that reads the
 * destination before its wait reads what was there (at a block's start,
 * NaN bytes), as on a GPU it may. __syncthreads lands nothing. Copies
 * still queued when the thread exits land then. With EMU_CP_ASYNC=early
 * each copy lands as it is issued instead, as on a GPU it may too: then
 * a copy into a buffer other threads still read (no barrier between
 * their reads and the issue) overwrites it under them. run.sh runs the
 * kernels' tests both ways (late with the threads forward, early with
 * them reversed). Checked: dst 16-byte aligned and in the block's shared
 * memory, src 16-byte aligned (when n > 0), at most 64 copies per thread
 * issued and not yet waited for, early or late (the emulator's queue,
 * exec.cpp's CP_MAX, not a GPU's limit).
 *
 * ThreadSanitizer: exec.cpp makes a copy with memcpy and memset, which
 * TSan intercepts, in the issuing thread's fiber as the copy lands; so
 * TSan sees the copy as that thread's read of src and write of dst at
 * that moment (the wait, or the issue with EMU_CP_ASYNC=early), and
 * another thread's access to dst not ordered with it by a barrier is a
 * reported race (emu_selftest race_cp_async_missing_syncthreads). */
void cp_async16(void *dst, const void *src, unsigned n);
void cp_async_commit();
void cp_async_wait(int n);

/* Warpgroup products (kcuda_ptx.h's kc_wgmma_*; exec.cpp):
 * wgmma.mma_async.sync.aligned.m64nNk16.f32 with bf16 or f16 inputs, A
 * from registers, B from shared memory in the canonical layout without
 * swizzling that a matrix descriptor names (PTX ISA, "Shared Memory
 * Matrix Layout": start address b, leading and stride dimension byte
 * offsets lbo and sbo); trans 0: B K-major, element (k, n) at byte
 * 16 (n % 8) + sbo (n / 8) + 2 (k % 8) + lbo (k / 8); trans 1: N-major,
 * 2 (n % 8) + sbo (n / 8) + 16 (k % 8) + lbo (k / 8). Warp w of the
 * warpgroup computes its 16 rows: its A operand is mma.m16n8k16's
 * (a[4] as there) and its D is float d[N / 2], d[4j + e] at row
 * g + 8 (e / 2), column 8 j + 2 t + e % 2 (g = lane / 4, t = lane % 4).
 *
 * wgmma_rs(...) queues the product in the thread's open group, reading
 * nothing yet; wgmma_commit() closes the group; wgmma_wait(n) (every lane
 * of the warp) completes, in the order issued, the products of every
 * committed group but the n most recent: only then are a, b's shared
 * memory and d (when acc) read and d written, so a kernel that reads d
 * before its wait reads what was there, and one that changes a or b
 * before it changes the product, as on a GPU they may. D = acc ? D + A B
 * : A B, exact products summed in k order in fp32 (as mma_m16n8k16).
 * Checked at the wait: every lane of the warp queued the same products
 * (N, b, lbo, sbo, trans, type), the block has the warpgroup's 128
 * threads, b 16-byte aligned and every element in shared memory, lbo and
 * sbo multiples of 16 below 2^18 (the descriptor's encoding); a thread
 * that exits with products not waited for traps. Checked at the issue
 * (exec.cpp, "the fences of warpgroup products"): a wgmma.fence
 * (wgmma_fence) since another instruction wrote the product's A or D
 * registers, and before the thread's first product; and in the shared
 * operands no bytes a cp.async wrote without its thread's
 * fence.proxy.async (fence_proxy_async) after it. */
void wgmma_rs(float *d, int n, const uint32_t *a, const void *b, unsigned lbo, unsigned sbo, int trans,
              bool bf16, bool acc);
/* The same with A [64 x 16] in shared memory, K-major: (m, k) at
 * 16 (m % 8) + asbo (m / 8) + 2 (k % 8) + albo (k / 8); warp w of the
 * warpgroup reads rows 16 (w % 4) .. + 15. */
void wgmma_ss(float *d, int n, const void *a, unsigned albo, unsigned asbo, const void *b, unsigned lbo,
              unsigned sbo, int trans, bool bf16, bool acc);
void wgmma_commit();
void wgmma_fence();
void fence_proxy_async();

/* The B operands (WgmmaB, emu/device.h) of the calling thread's products
 * that wgmma_wait(n) completes (at most max, their number returned). */
int wgmma_due(int n, WgmmaB *out, int max);

/* ThreadSanitizer (as ldmatrix above): the emulator reads B at the wait
 * on its runner thread, which TSan does not see; so before the warp
 * completes them each lane reads, here and instrumented, its 32nd of
 * every due product's elements of B, the ones whose index k N + n is its
 * lane number modulo 32 (and of A's, when in shared memory, as a K-major
 * operand of 64 columns). */
inline void wgmma_wait(int n)
{
    WgmmaB due[32];
    int nd = wgmma_due(n, due, 32);
    unsigned lane = (unsigned)(threadIdx.x & 31);
    for (int i = 0; i < nd; i++)
        for (unsigned e = lane; e < 16 * due[i].n; e += 32) {
            const volatile unsigned char *q = due[i].b + wgmma_offset(due[i], e / due[i].n, e % due[i].n);
            (void)q[0];
            (void)q[1];
        }
    WarpOp op = {};
    op.kind = OP_WGMMA_WAIT;
    op.mask = 0xffffffffu;
    op.arg = n;
    warp_op(&op);
}

/* Blocks taking turns (kc_wait_ge, kc_add_release): ld.acquire.gpu in a
 * loop until *p >= v, and red.release.gpu.add. A runner runs its blocks
 * in index order and the runners run at once, so a block that waits only
 * for blocks of lower index (as a GPU, which starts blocks in index order,
 * needs) gets its turn; the spin yields its OS thread between reads, and
 * traps after 20 s (a turn that never comes). ThreadSanitizer sees the
 * acquire and release. */
inline void wait_ge(const int *p, int v)
{
    auto t0 = std::chrono::steady_clock::now();
    for (unsigned n = 0; __atomic_load_n(p, __ATOMIC_ACQUIRE) < v; n++) {
        std::this_thread::yield();
        if ((n & 1023) == 1023 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20))
            trap(cudaErrorLaunchTimeout, "waited 20 s for %d at %p (it is %d)", v, (const void *)p,
                 __atomic_load_n(p, __ATOMIC_ACQUIRE));
    }
}

inline void add_release(int *p, int v)
{
    __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
}

} /* namespace emu */

#endif
