/* matmul.cu — linear layers through cuBLASLt: y = x @ w (+ bias) with w
 * [in, out] or [out, in] (the tied LM head), their backwards (beta = 1, so
 * they accumulate like every kcpu backward), the backward of gelu(pre) @ w
 * with the GELU's (the DGELU epilogue), the batched products of the MoE
 * experts, and the bias gradient as a fixed-order column sum.
 *
 * cuBLASLt is column-major; a row-major [r, c] matrix is a column-major
 * [c, r] one with the same leading dimension, so C = A B in row-major is
 * C^T = B^T A^T in column-major: kcuda__gemm_run swaps the operands.
 * fp32 computes in fp32 (CUBLAS_COMPUTE_32F: no TF32, to match the CPU),
 * or where the context asks (kcuda_ctx_set_tf32) on TF32 tensor cores
 * (CUBLAS_COMPUTE_32F_FAST_TF32);
 * bf16 stores A, B, C in bf16 and accumulates in fp32 on tensor cores.
 * The first algorithm of cuBLASLt's heuristic (or, tuned, the fastest
 * that gives its bits: matmul_tune.cu) is cached per shape (and per
 * pointer alignment) in the context, so a shape always runs the same
 * algorithm, and cuBLASLt's own reductions are ordered: deterministic.
 */
#include <string.h> /* defines: memset, memcmp */

#include "kcuda_impl.h"

#define LT_CHECK(expr)                                                         \
    do {                                                                       \
        cublasStatus_t lt_st_ = (expr);                                        \
        if (lt_st_ != CUBLAS_STATUS_SUCCESS) {                                 \
            rc = kcuda__fail(KCUDA_ERR_BLAS, __FILE__, __LINE__, "%s: %s",     \
                             #expr, cublasLtGetStatusString(lt_st_));          \
            goto done;                                                         \
        }                                                                      \
    } while (0)

static cudaDataType_t lt_type(kcuda_dtype dt)
{
    return dt == KCUDA_BF16 ? CUDA_R_16BF : dt == KCUDA_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* A column-major layout of rows x cols with leading dimension ld, batched. */
static cublasStatus_t lt_layout(cublasLtMatrixLayout_t *l, kcuda_dtype dt,
                                int rows, int cols, int ld, int batch,
                                long long stride)
{
    cublasStatus_t st =
        cublasLtMatrixLayoutCreate(l, lt_type(dt), (uint64_t)rows,
                                   (uint64_t)cols, (int64_t)ld);
    if (st != CUBLAS_STATUS_SUCCESS || batch <= 1)
        return st;
    int32_t b = batch;
    int64_t s = stride;
    st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                          &b, sizeof b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutSetAttribute(
            *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s);
    return st;
}

/* The alignment that every batch's matrix keeps: the base pointer's, or
 * less when the batch stride in bytes is less aligned. */
static int batch_align(const void *p, long long stride, int batch,
                       kcuda_dtype dt)
{
    int al = kcuda__align_of(p);
    if (p && batch > 1) {
        unsigned long long bytes =
            (unsigned long long)stride * kcuda_dtype_size(dt);
        int sal = 1;
        while (sal < 256 && bytes % (2ull * sal) == 0)
            sal <<= 1;
        al = sal < al ? sal : al;
    }
    return al;
}

static kcuda__algo_key gemm_key(const kcuda_ctx *ctx, const kcuda__gemm *g)
{
    kcuda__algo_key k;
    memset(&k, 0, sizeof k);
    k.m = g->M;
    k.n = g->N;
    k.k = g->K;
    k.lda = g->lda;
    k.ldb = g->ldb;
    k.ldc = g->ldc;
    k.ta = g->ta;
    k.tb = g->tb;
    k.batch = g->batch;
    k.dt = (int)g->dt;
    k.epi = g->epi * 2 + (g->bias != NULL);
    k.beta_zero = g->beta == 0.0f;
    k.c_f32 = g->c_f32;
    k.tf32 = ctx->tf32 && g->dt == KCUDA_F32; /* fp32 operands on TF32 tensor cores */
    k.sa = g->sa;
    k.sb = g->sb;
    k.sc = g->sc;
    k.align_a = batch_align(g->A, g->sa, g->batch, g->dt);
    k.align_b = batch_align(g->B, g->sb, g->batch, g->dt);
    k.align_c = batch_align(g->C, g->sc, g->batch, g->c_f32 ? KCUDA_F32 : g->dt);
    k.align_bias = kcuda__align_of(g->bias);
    k.align_aux = kcuda__align_of(g->aux);
    return k;
}

static kcuda__algo_entry *algo_find(kcuda_ctx *ctx, const kcuda__algo_key *k)
{
    for (int i = 0; i < KCUDA__ALGO_CACHE; i++)
        if (ctx->algos[i].valid &&
            memcmp(&ctx->algos[i].key, k, sizeof *k) == 0)
            return &ctx->algos[i];
    return NULL;
}

/* The heuristic's preferences: the pointers' alignments, so that the chosen
 * algorithm does not assume more than the pointers have, and how a split
 * product may add its parts. */
static cublasStatus_t pref_set(cublasLtMatmulPreference_t pref,
                               const kcuda__algo_key *k)
{
    struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t v;
    } al[] = {
        /* cuBLASLt's A is our B and its B our A (the operand swap) */
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, (uint32_t)k->align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, (uint32_t)k->align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, (uint32_t)k->align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, (uint32_t)k->align_c},
        /* a split-K product's partial sums kept in fp32 (not in the
         * output's 2 bytes in between): every sum accumulates in fp32 */
        {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
         k->dt == KCUDA_F32 ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK
                            : (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE},
    };
    for (size_t i = 0; i < sizeof al / sizeof al[0]; i++) {
        cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
            pref, al[i].attr, &al[i].v, sizeof al[i].v);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t kcuda__lt_matmul(kcuda_ctx *ctx, const kcuda__gemm *g,
                                const kcuda__lt_call *call,
                                const cublasLtMatmulAlgo_t *algo,
                                cudaStream_t s)
{
    float alpha = 1.0f, beta = g->beta;
    return cublasLtMatmul(ctx->lt, call->desc, &alpha, g->B, call->la, g->A,
                          call->lb, &beta, g->C, call->lc, g->C, call->lc,
                          algo, ctx->workspace, ctx->workspace_bytes, s);
}

int kcuda__gemm_run(kcuda_ctx *ctx, const kcuda__gemm *g, cudaStream_t s)
{
    KCUDA_ARG(ctx != NULL, "matmul needs a kcuda_ctx (got NULL)");
    KCUDA_ARG(g->M > 0 && g->N > 0 && g->K > 0 && g->batch >= 1,
              "matmul: bad sizes M=%d N=%d K=%d batch=%d", g->M, g->N, g->K,
              g->batch);
    int rc = 0;
    kcuda__lt_call call = {NULL, NULL, NULL, NULL};
    cublasLtMatmulPreference_t pref = NULL;
    kcuda__algo_key key = gemm_key(ctx, g);
    kcuda__algo_entry *hit = algo_find(ctx, &key);
    cublasOperation_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;

    LT_CHECK(cublasLtMatmulDescCreate(
        &call.desc, key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                            &opa, sizeof opa));
    LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                            &opb, sizeof opb));
    if (g->epi == KCUDA__EPI_DGELU)
        epi = CUBLASLT_EPILOGUE_DGELU;
    else if (g->epi == KCUDA_EPI_GELU)
        epi = g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                      : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (g->bias)
        epi = CUBLASLT_EPILOGUE_BIAS;
    LT_CHECK(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                            &epi, sizeof epi));
    if (g->bias) {
        cudaDataType_t bt = lt_type(g->dt);
        LT_CHECK(cublasLtMatmulDescSetAttribute(
            call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
        LT_CHECK(cublasLtMatmulDescSetAttribute(
            call.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (g->epi == KCUDA_EPI_GELU || g->epi == KCUDA__EPI_DGELU) {
        int64_t ld = g->N;
        LT_CHECK(cublasLtMatmulDescSetAttribute(
            call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
            sizeof g->aux));
        LT_CHECK(cublasLtMatmulDescSetAttribute(
            call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    /* C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M], column-major */
    LT_CHECK(lt_layout(&call.la, g->dt, g->tb ? g->K : g->N, g->tb ? g->N : g->K,
                       g->ldb, g->batch, g->sb));
    LT_CHECK(lt_layout(&call.lb, g->dt, g->ta ? g->M : g->K, g->ta ? g->K : g->M,
                       g->lda, g->batch, g->sa));
    LT_CHECK(lt_layout(&call.lc, g->c_f32 ? KCUDA_F32 : g->dt, g->N, g->M, g->ldc,
                       g->batch, g->sc));

    cublasLtMatmulAlgo_t algo;
    if (hit) {
        algo = hit->algo;
    } else {
        cublasLtMatmulHeuristicResult_t res[KCUDA__TUNE_CANDIDATES];
        int found = 0, pick = 0, tune = kcuda__gemm_tunes(ctx, g);
        size_t ws = ctx->workspace_bytes;
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        LT_CHECK(pref_set(pref, &key));
        memset(res, 0, sizeof res);
        cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(
            ctx->lt, call.desc, call.la, call.lb, call.lc, call.lc, pref,
            tune ? KCUDA__TUNE_CANDIDATES : 1, res, &found);
        /* NOT_SUPPORTED (e.g. an epilogue this dtype lacks) or
         * INVALID_VALUE (a configuration it does not take): no algorithm,
         * which a fused product's caller answers without the epilogue */
        if (hst != CUBLAS_STATUS_SUCCESS || found < 1) {
            rc = kcuda__fail(KCUDA_ERR_NO_ALGO, __FILE__, __LINE__,
                             "cuBLASLt has no algorithm for M=%d N=%d K=%d "
                             "(dtype %d, epilogue %d): %s",
                             g->M, g->N, g->K, (int)g->dt, (int)epi,
                             hst != CUBLAS_STATUS_SUCCESS
                                 ? cublasLtGetStatusString(hst)
                                 : "none found");
            goto done;
        }
        if (tune && found > 1) {
            rc = kcuda__gemm_tune(ctx, g, &call, res, found, s, &pick);
            if (rc)
                goto done;
        }
        algo = res[pick].algo;
    }
    {
        cublasStatus_t st = kcuda__lt_matmul(ctx, g, &call, &algo, s);
        /* the heuristic's choice does not guarantee the call runs (the
         * header says so): a fresh algorithm refused is "no algorithm",
         * and an algorithm is cached only once it has run */
        if (st != CUBLAS_STATUS_SUCCESS) {
            int refused = !hit && (st == CUBLAS_STATUS_NOT_SUPPORTED ||
                                   st == CUBLAS_STATUS_INVALID_VALUE);
            char fault[320];
            rc = kcuda__fail(refused ? KCUDA_ERR_NO_ALGO : KCUDA_ERR_BLAS,
                             __FILE__, __LINE__,
                             "%s for M=%d N=%d K=%d (dtype %d, epilogue %d): "
                             "%s%s",
                             refused ? "cuBLASLt refused its own algorithm"
                                     : "cublasLtMatmul failed",
                             g->M, g->N, g->K, (int)g->dt, (int)epi,
                             cublasLtGetStatusString(st),
                             kcuda__gpu_fault(s, fault, sizeof fault));
            goto done;
        }
    }
    if (!hit) {
        hit = &ctx->algos[ctx->algo_next];
        ctx->algo_next = (ctx->algo_next + 1) % KCUDA__ALGO_CACHE;
        hit->key = key;
        hit->algo = algo;
        hit->valid = 1;
    }
done:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (call.lc)
        cublasLtMatrixLayoutDestroy(call.lc);
    if (call.lb)
        cublasLtMatrixLayoutDestroy(call.lb);
    if (call.la)
        cublasLtMatrixLayoutDestroy(call.la);
    if (call.desc)
        cublasLtMatmulDescDestroy(call.desc);
    return rc;
}

/* ---- the bias gradient --------------------------------------------------- */

int kcuda_bias_backward(kcuda_ctx *ctx, void *dbias, const void *dy, int M,
                        int N, kcuda_dtype dt, void *stream)
{
    KCUDA_DT_OK(dt);
    return kcuda__colsum_add(ctx, dbias, dt, dy, M, N, dt,
                             kcuda__stream(stream));
}

/* ---- bias and GELU outside cuBLASLt (its fallback) ----------------------- */

/* y[M,N] = gelu(pre) or pre, with pre = y + bias when bias is given (pre
 * may be y itself); the same GELU as activation.cu. */
template <typename T>
__global__ void bias_gelu_kernel(T *y, T *pre, const T *bias, int M, int N,
                                 int gelu)
{
    size_t n = (size_t)M * N, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        float v = kc_f(y[i]);
        if (bias)
            v += kc_f(bias[i % (size_t)N]);
        if (gelu) {
            T pv = kc_to<T>(v);
            pre[i] = pv;
            float x = kc_f(pv);
            float e = kc_gelu_exp(x);
            v = x / (1.0f + e);
        }
        y[i] = kc_to<T>(v);
    }
}

/* ---- the public products ------------------------------------------------ */

static kcuda__gemm gemm_init(kcuda_dtype dt)
{
    kcuda__gemm g;
    memset(&g, 0, sizeof g);
    g.batch = 1;
    g.dt = dt;
    return g;
}

/* y = x @ w(^T) + bias, then the epilogue; unfused if cuBLASLt has no
 * fused algorithm (or the GELU input's row length is not a multiple of 8,
 * which its epilogue needs). */
static int linear_forward(kcuda_ctx *ctx, void *y, void *pre, const void *x,
                          const void *w, const void *bias, int M, int K,
                          int N, int wt, kcuda_epilogue epi, kcuda_dtype dt,
                          cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    KCUDA_ARG(M > 0 && K > 0 && N > 0, "matmul: bad sizes M=%d K=%d N=%d", M,
              K, N);
    KCUDA_ARG(epi == KCUDA_EPI_NONE || (epi == KCUDA_EPI_GELU && pre && pre != y),
              "matmul: the GELU epilogue needs pre, apart from y");
    kcuda__gemm g = gemm_init(dt);
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = x;
    g.lda = K;
    g.B = w;
    g.tb = wt;
    g.ldb = wt ? K : N;
    g.C = y;
    g.ldc = N;
    g.bias = bias;
    g.epi = epi;
    g.aux = epi == KCUDA_EPI_GELU ? pre : NULL;
    /* cuBLASLt's GELU epilogue is its own tanh approximation: close enough
     * for 2-byte storage, not for fp32's tolerance. fp32's GELU, and one
     * whose row length the epilogue cannot take, is the kernel's below. */
    if (epi == KCUDA_EPI_GELU && (dt == KCUDA_F32 || N % 8 != 0)) {
        g.epi = KCUDA_EPI_NONE;
        g.aux = NULL;
    }
    int rc = kcuda__gemm_run(ctx, &g, s);
    if (rc == KCUDA_ERR_NO_ALGO && (g.bias || g.epi != KCUDA_EPI_NONE)) {
        g.bias = NULL; /* no fused algorithm: the product alone */
        g.epi = KCUDA_EPI_NONE;
        g.aux = NULL;
        rc = kcuda__gemm_run(ctx, &g, s);
    }
    int add_bias = bias && !g.bias, gelu = epi == KCUDA_EPI_GELU && g.epi == KCUDA_EPI_NONE;
    if (rc != 0 || (!add_bias && !gelu))
        return rc;
    size_t n = (size_t)M * N;
    KCUDA_DISPATCH(dt, T, {
        bias_gelu_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (T *)y, (T *)pre, add_bias ? (const T *)bias : NULL, M, N, gelu);
        KCUDA_LAUNCHED("bias_gelu_kernel");
    });
    return 0;
}

int kcuda_matmul_forward(kcuda_ctx *ctx, void *y, void *pre, const void *x,
                         const void *w, const void *bias, int M, int K, int N,
                         kcuda_epilogue epi, kcuda_dtype dt, void *stream)
{
    return linear_forward(ctx, y, pre, x, w, bias, M, K, N, 0, epi, dt,
                          kcuda__stream(stream));
}

int kcuda_matmul_wt_forward(kcuda_ctx *ctx, void *y, const void *x,
                            const void *w, const void *bias, int M, int K,
                            int N, kcuda_dtype dt, void *stream)
{
    return linear_forward(ctx, y, NULL, x, w, bias, M, K, N, 1,
                          KCUDA_EPI_NONE, dt, kcuda__stream(stream));
}

int kcuda_matmul_backward(kcuda_ctx *ctx, void *dx, void *dw, void *dbias,
                          const void *dy, const void *x, const void *w, int M,
                          int K, int N, kcuda_dtype dt, kcuda_dtype dw_dt,
                          int dx_assign, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(M > 0 && K > 0 && N > 0, "matmul: bad sizes M=%d K=%d N=%d", M,
              K, N);
    if (dx) { /* dx[M,K] += dy[M,N] @ w[K,N]^T */
        kcuda__gemm g = gemm_init(dt);
        g.M = M, g.N = K, g.K = N;
        g.A = dy, g.lda = N;
        g.B = w, g.tb = 1, g.ldb = N;
        g.C = dx, g.ldc = K, g.beta = dx_assign ? 0.0f : 1.0f;
        KCUDA_TRY(kcuda__gemm_run(ctx, &g, s));
    }
    KCUDA_ARG(dw_dt == dt || dw_dt == KCUDA_F32, "matmul: dw of dtype %d beside %d",
              (int)dw_dt, (int)dt);
    if (dw) { /* dw[K,N] += x[M,K]^T @ dy[M,N] */
        kcuda__gemm g = gemm_init(dt);
        g.M = K, g.N = N, g.K = M;
        g.A = x, g.ta = 1, g.lda = K;
        g.B = dy, g.ldb = N;
        g.C = dw, g.ldc = N, g.beta = 1.0f, g.c_f32 = dw_dt != dt;
        KCUDA_TRY(kcuda__gemm_run(ctx, &g, s));
    }
    if (dbias)
        KCUDA_TRY(kcuda__colsum_add(ctx, dbias, dw_dt, dy, M, N, dt, s));
    return 0;
}

int kcuda_matmul_gelu_backward(kcuda_ctx *ctx, void *dpre, void *dw,
                               const void *dy, const void *x, const void *w,
                               const void *pre, int M, int K, int N,
                               kcuda_dtype dt, kcuda_dtype dw_dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(M > 0 && K > 0 && N > 0, "matmul: bad sizes M=%d K=%d N=%d", M,
              K, N);
    KCUDA_ARG(dpre && pre && dpre != pre,
              "matmul: the GELU backward needs dpre and pre, apart");
    /* dpre[M,K] = gelu'(pre) * (dy[M,N] @ w[K,N]^T) */
    kcuda__gemm g = gemm_init(dt);
    g.M = M, g.N = K, g.K = N;
    g.A = dy, g.lda = N;
    g.B = w, g.tb = 1, g.ldb = N;
    g.C = dpre, g.ldc = K, g.beta = 0.0f;
    /* (cuBLASLt's GELU is its own, as in linear_forward: not for fp32) */
    if (dt != KCUDA_F32 && K % 8 == 0) {
        g.epi = KCUDA__EPI_DGELU;
        g.aux = (void *)pre;
    }
    int rc = kcuda__gemm_run(ctx, &g, s);
    if (rc == KCUDA_ERR_NO_ALGO && g.epi != KCUDA_EPI_NONE) {
        g.epi = KCUDA_EPI_NONE; /* no fused algorithm: the product alone */
        g.aux = NULL;
        rc = kcuda__gemm_run(ctx, &g, s);
    }
    if (rc != 0)
        return rc;
    if (g.epi == KCUDA_EPI_NONE)
        KCUDA_TRY(kcuda_gelu_backward(dpre, pre, dpre, (size_t)M * K, 1, dt,
                                      stream));
    return dw ? kcuda_matmul_backward(ctx, NULL, dw, NULL, dy, x, w, M, K, N,
                                      dt, dw_dt, 0, stream)
              : 0;
}

int kcuda_matmul_wt_backward(kcuda_ctx *ctx, void *dx, void *dw, void *dbias,
                             const void *dy, const void *x, const void *w,
                             int M, int K, int N, kcuda_dtype dt,
                             kcuda_dtype dw_dt, int dx_assign, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(M > 0 && K > 0 && N > 0, "matmul: bad sizes M=%d K=%d N=%d", M,
              K, N);
    if (dx) { /* dx[M,K] += dy[M,N] @ w[N,K] */
        kcuda__gemm g = gemm_init(dt);
        g.M = M, g.N = K, g.K = N;
        g.A = dy, g.lda = N;
        g.B = w, g.ldb = K;
        g.C = dx, g.ldc = K, g.beta = dx_assign ? 0.0f : 1.0f;
        KCUDA_TRY(kcuda__gemm_run(ctx, &g, s));
    }
    KCUDA_ARG(dw_dt == dt || dw_dt == KCUDA_F32, "matmul: dw of dtype %d beside %d",
              (int)dw_dt, (int)dt);
    if (dw) { /* dw[N,K] += dy[M,N]^T @ x[M,K] */
        kcuda__gemm g = gemm_init(dt);
        g.M = N, g.N = K, g.K = M;
        g.A = dy, g.ta = 1, g.lda = N;
        g.B = x, g.ldb = K;
        g.C = dw, g.ldc = K, g.beta = 1.0f, g.c_f32 = dw_dt != dt;
        KCUDA_TRY(kcuda__gemm_run(ctx, &g, s));
    }
    if (dbias)
        KCUDA_TRY(kcuda__colsum_add(ctx, dbias, dw_dt, dy, M, N, dt, s));
    return 0;
}
