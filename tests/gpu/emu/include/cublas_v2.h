/* cublas_v2.h (CPU emulation, tests/gpu/emu): the part of cuBLAS that
 * tests/gpu/gpu_bench.c compares our matmuls with (cublasGemmEx), with
 * cuBLAS's names and values; cublas.cpp computes it through the emulated
 * cuBLASLt (cublaslt.cpp): the same fp32 products and sums. */
#ifndef EMU_CUBLAS_V2_H
#define EMU_CUBLAS_V2_H

#include "cublasLt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cublasContext *cublasHandle_t;

typedef enum { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t streamId);
const char *cublasGetStatusString(cublasStatus_t status);
/* C = alpha op(A) op(B) + beta C, column-major, C m x n; CUBLAS_COMPUTE_32F
 * with float alpha and beta only (else CUBLAS_STATUS_NOT_SUPPORTED). */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                            const void *B, cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType, cublasGemmAlgo_t algo);

#ifdef __cplusplus
}
#endif

#endif
