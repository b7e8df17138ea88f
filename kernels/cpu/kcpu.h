/* kcpu.h — the CPU kernels: the reference implementation every other
 * backend is tested against (style.md: "the CPU kernel is the spec").
 *
 * Plain loops with shape comments on every argument, and matrix products
 * through OpenBLAS (cblas_sgemm). Every op has a forward and a backward;
 * backward functions ACCUMULATE into gradient buffers (+=), so a tensor
 * used twice (a residual, a tied weight) gets the sum; callers zero them.
 * Activations and parameters are fp32; token ids int32. Prefix: kcpu_.
 *
 * The kernels are split by area, one header each:
 *   kcpu_dense.h      matmul, bias, embedding, layernorm, rmsnorm, gelu,
 *                     silu, swiglu, add, fused softmax cross-entropy,
 *                     AdamW, global-norm clipping, bf16/fp16 rounding
 *   kcpu_attention.h  rotary embedding, causal (grouped-query) attention
 *   kcpu_moe.h        mixture-of-experts routing, dispatch and combine
 *
 * The loops are written so that gcc -O2 vectorises them (fixed-count inner
 * loops, a branch-free exp): kcpu_math_impl.h, internal to kernels/cpu,
 * says how. Every kernel is deterministic: sums run in a fixed order.
 */
#ifndef MESH_KCPU_H
#define MESH_KCPU_H

#include "kcpu_attention.h"
#include "kcpu_dense.h"
#include "kcpu_moe.h"

/* threads.c: the cores this process may run on (its affinity mask, so
 * ranks pinned to their own cores do not oversubscribe); gemm.c: the
 * number of threads the kernels' products use (each multiplying thread's
 * own: a rank's), n, or all available for n <= 0. The products give the
 * same bits on any number. */
int kcpu_threads_available(void);
void kcpu_set_threads(int n);

#endif
