/* cublas.cpp (CPU emulation, tests/gpu/emu): cublasGemmEx, as cuBLAS
 * documents it, through the emulated cuBLASLt: the call's descriptors and
 * layouts made, the heuristic's algorithm, the product, the descriptors
 * freed, on the handle's stream (cublasSetStream; default the legacy
 * one). Arguments cuBLAS refuses (sizes below 0, leading dimensions below
 * the rows) give CUBLAS_STATUS_INVALID_VALUE. */
#include <cublas_v2.h>

#include "internal.h"

struct cublasContext {
    uint32_t magic;
    cublasLtHandle_t lt;
    cudaStream_t stream;
};

namespace {

const uint32_t BLAS = 0x53414c42; /* "BLAS" */

/* The Lt objects of one call, freed whatever happens. */
struct Call {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~Call()
    {
        if (pref)
            cublasLtMatmulPreferenceDestroy(pref);
        for (cublasLtMatrixLayout_t l : {a, b, c})
            if (l)
                cublasLtMatrixLayoutDestroy(l);
        if (desc)
            cublasLtMatmulDescDestroy(desc);
    }
};

} /* namespace */

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtHandle_t lt = nullptr;
    cublasStatus_t st = cublasLtCreate(&lt);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    *handle = new cublasContext{BLAS, lt, nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h || h->magic != BLAS)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasLtDestroy(h->lt);
    h->magic = 0;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t streamId)
{
    if (!h || h->magic != BLAS)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    return cublasLtGetStatusString(status);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo; /* (a hint; every algorithm computes the same product here) */
    if (!h || h->magic != BLAS)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (computeType != CUBLAS_COMPUTE_32F) {
        emu::diag("cublasGemmEx: compute type %d is not emulated", (int)computeType);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    int arows = transa == CUBLAS_OP_N ? m : k, brows = transb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || !alpha || !beta || lda < (arows > 1 ? arows : 1) ||
        ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    Call c;
    cublasStatus_t st;
    if ((st = cublasLtMatmulDescCreate(&c.desc, computeType, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa)) !=
            CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb)) !=
            CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatrixLayoutCreate(&c.a, Atype, (uint64_t)arows, (uint64_t)(transa == CUBLAS_OP_N ? k : m),
                                         lda)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatrixLayoutCreate(&c.b, Btype, (uint64_t)brows, (uint64_t)(transb == CUBLAS_OP_N ? n : k),
                                         ldb)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatrixLayoutCreate(&c.c, Ctype, (uint64_t)m, (uint64_t)n, ldc)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatmulPreferenceCreate(&c.pref)) != CUBLAS_STATUS_SUCCESS)
        return st;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    st = cublasLtMatmulAlgoGetHeuristic(h->lt, c.desc, c.a, c.b, c.c, c.c, c.pref, 1, &res, &found);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (found < 1)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return cublasLtMatmul(h->lt, c.desc, alpha, A, c.a, B, c.b, beta, C, c.c, C, c.c, &res.algo, nullptr, 0,
                          h->stream);
}

} /* extern "C" */
