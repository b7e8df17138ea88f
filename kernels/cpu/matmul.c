/* matmul.c — linear layers: y = x @ w (+ bias) and y = x @ w^T (+ bias).
 *
 * Every product goes through kcpu__gemm (gemm.c: OpenBLAS, the same bits
 * on any number of threads) in row-major order; backward
 * passes use beta = 1 so that they accumulate into the gradients, as every
 * kcpu backward does. Weights are [in, out] (kcpu_matmul_*) or [out, in]
 * (kcpu_matmul_wt_*, the tied LM head).
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <stddef.h> /* defines: size_t */

#include "kcpu_gemm_impl.h" /* defines: kcpu__gemm */
#include "kcpu_math_impl.h" /* defines: kcpu__add_into */

/* y[M,N] = bias broadcast over rows, or nothing when bias is NULL. */
static void matmul_add_bias(float *y, const float *bias, int M, int N)
{
    if (!bias)
        return;
    for (int i = 0; i < M; i++)
        kcpu__add_into(y + (size_t)i * N, bias, (size_t)N);
}

/* dbias[N] += sum over the M rows of dy[M,N]. */
static void matmul_bias_backward(float *dbias, const float *dy, int M, int N)
{
    if (!dbias)
        return;
    for (int i = 0; i < M; i++) /* in row order: deterministic */
        kcpu__add_into(dbias, dy + (size_t)i * N, (size_t)N);
}

void kcpu_matmul_forward(float *y, const float *x, const float *w,
                         const float *bias, int M, int K, int N)
{
    assert(M > 0 && K > 0 && N > 0);
    /* y[M,N] = x[M,K] @ w[K,N] */
    kcpu__gemm(0, 0, M, N, K, 1.0f, x, K, w, N, 0.0f, y, N);
    matmul_add_bias(y, bias, M, N);
}

void kcpu_matmul_backward(float *dx, float *dw, float *dbias, const float *dy,
                          const float *x, const float *w, int M, int K, int N)
{
    assert(M > 0 && K > 0 && N > 0);
    if (dx) /* dx[M,K] += dy[M,N] @ w[K,N]^T */
        kcpu__gemm(0, 1, M, K, N, 1.0f, dy, N, w, N, 1.0f, dx, K);
    if (dw) /* dw[K,N] += x[M,K]^T @ dy[M,N] */
        kcpu__gemm(1, 0, K, N, M, 1.0f, x, K, dy, N, 1.0f, dw, N);
    matmul_bias_backward(dbias, dy, M, N);
}

void kcpu_matmul_wt_forward(float *y, const float *x, const float *w,
                            const float *bias, int M, int K, int N)
{
    assert(M > 0 && K > 0 && N > 0);
    /* y[M,N] = x[M,K] @ w[N,K]^T */
    kcpu__gemm(0, 1, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
    matmul_add_bias(y, bias, M, N);
}

void kcpu_matmul_wt_backward(float *dx, float *dw, float *dbias,
                             const float *dy, const float *x, const float *w,
                             int M, int K, int N)
{
    assert(M > 0 && K > 0 && N > 0);
    if (dx) /* dx[M,K] += dy[M,N] @ w[N,K] */
        kcpu__gemm(0, 0, M, K, N, 1.0f, dy, N, w, K, 1.0f, dx, K);
    if (dw) /* dw[N,K] += dy[M,N]^T @ x[M,K] */
        kcpu__gemm(1, 0, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K);
    matmul_bias_backward(dbias, dy, M, N);
}
