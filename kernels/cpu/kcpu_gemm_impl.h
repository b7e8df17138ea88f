/* kcpu_gemm_impl.h — internal to kernels/cpu: the matrix product every
 * kernel uses (gemm.c), the same bits on any number of threads. Not API.
 */
#ifndef MESH_KCPU_GEMM_IMPL_H
#define MESH_KCPU_GEMM_IMPL_H

/* C[M,N] = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm
 * (op: transposed if ta, tb), on the calling thread and its workers. */
void kcpu__gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                float beta, float *C, int ldc);

#endif
