/* cublaslt.cpp (CPU emulation, tests/gpu/emu): cublasLtMatmul as NVIDIA
 * documents it, for the cases kernels/cuda/matmul.cu can ask for.
 *
 *   D = alpha op(A) op(B) + beta C, then the epilogue,
 *
 * matrices column-major, a layout rows x cols with leading dimension ld
 * (>= rows), batched by BATCH_COUNT and STRIDED_BATCH_OFFSET (elements).
 * Compute type CUBLAS_COMPUTE_32F with float alpha and beta: the products
 * and sums in fp32, summed in k order (a real algorithm's order
 * and split are its own), C read only if beta != 0, D rounded to its type
 * (nearest even) once; CUBLAS_COMPUTE_32F_FAST_TF32 (fp32 A and B only)
 * the same with each operand rounded to TF32 first (10 bits of mantissa,
 * to nearest, ties away from zero: PTX's cvt.rna.tf32.f32; whether
 * NVIDIA's kernels round or cut the low bits is undocumented, so no test
 * may depend on which). Epilogues DEFAULT, BIAS (bias[i] added to row i of
 * D, a vector of D's rows, in D's type), GELU, GELU_BIAS, GELU_AUX and
 * GELU_AUX_BIAS (the aux matrix, leading dimension EPILOGUE_AUX_LD, gets
 * the GELU input; GELU is the tanh approximation), and DGELU (D = the
 * product times the tanh approximation's slope at the aux matrix, read;
 * beta must be 0, since what cuBLASLt does with C there is undocumented);
 * others are NOT_SUPPORTED. A GELU aux leading dimension that is not a
 * multiple of 8 is NOT_SUPPORTED, one below D's rows INVALID_VALUE, as are
 * inconsistent layouts.
 *
 * The heuristic returns up to four or five algorithms (as many as asked for), in
 * this order (an algorithm's data[3]), with the configuration that
 * cublasLtMatmulAlgoConfigGetAttribute reports (ALGO_ID, SPLITK_NUM,
 * REDUCTION_SCHEME):
 *   KORDER    the sum over k in order, as above (kernel 0, no split);
 *   RETILED   kernel 0 in another tile shape: the same sums in the same
 *             order, so KORDER's bits;
 *   SPLITK    the two halves of k summed apart, then added (kernel 0,
 *             split 2, partial sums in the compute type; offered when the
 *             preference's reduction mask allows that, and k > 1);
 *   REVERSED  kernel 1, the sum over k from its end, without a split
 *             (another kernel's own order);
 *   ROTATED   only with EMU_CUBLASLT_ROTATED set (tests): kernel 0
 *             without a split, as KORDER says it is, but the sum over k
 *             starting from its middle: an order its configuration does
 *             not show, which only the output's bits tell (the tuning's
 *             check, kernels/cuda/matmul_tune.cu; in a 2-byte output of
 *             a small product, rounding may hide it).
 * Each one remembers the problem it was
 * chosen for and the pointer alignments it may assume (the preferences'
 * MIN_ALIGNMENT_*_BYTES, default 256; the bias and aux pointers' own),
 * capped at 16 bytes (a vectorized kernel); cublasLtMatmul refuses it,
 * NOT_SUPPORTED, for another kind of problem or less aligned pointers
 * (each batch's matrix included). In place (C == D) needs C's layout to be
 * D's. Matrices outside the current device's memory (the host's, or another
 * GPU's) fault the device (sticky cudaErrorIllegalAddress), as a kernel's
 * load would. With
 * EMU_CUBLASLT_REFUSE_EPILOGUE set, cublasLtMatmul refuses every fused
 * epilogue (NOT_SUPPORTED) that the heuristic offered, as a real algorithm
 * may.
 */
#include <cublasLt.h>

#include <math.h>  /* tanhf */
#include <stdlib.h> /* getenv */
#include <string.h> /* memcpy */

#include <vector> /* std::vector */

#include "emu/convert.h"
#include "internal.h"

struct cublasLtContext {
    uint32_t magic;
};

struct cublasLtMatmulDescOpaque_t {
    uint32_t magic;
    int32_t compute, scale, pointer_mode, transa, transb, transc;
    uint32_t epilogue;
    const void *bias;
    int64_t bias_stride;
    void *aux;
    int64_t aux_ld, aux_stride;
    int32_t aux_type, bias_type;
};

struct cublasLtMatrixLayoutOpaque_t {
    uint32_t magic;
    uint32_t type;
    int32_t order;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};

struct cublasLtMatmulPreferenceOpaque_t {
    uint32_t magic;
    uint32_t search;
    uint64_t max_workspace;
    uint32_t reduction;
    uint32_t align[4]; /* A, B, C, D */
    float waves;
    uint64_t impl;
};

namespace {

const uint32_t HANDLE = 0x4c544c48, DESC = 0x4c544d44, LAYOUT = 0x4c544c4f, PREF = 0x4c545052;
const uint64_t ALGO = 0x4f474c412d756d65ull; /* "emu-ALGO" */

using emu::diag;

bool is_type(uint32_t t)
{
    return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF;
}

size_t type_size(uint32_t t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

float load(uint32_t t, const void *p, size_t i)
{
    if (t == CUDA_R_32F)
        return static_cast<const float *>(p)[i];
    uint16_t h = static_cast<const uint16_t *>(p)[i];
    return t == CUDA_R_16BF ? emu_bf16_to_f32(h) : emu_f16_to_f32(h);
}

void store(uint32_t t, void *p, size_t i, float v)
{
    if (t == CUDA_R_32F)
        static_cast<float *>(p)[i] = v;
    else
        static_cast<uint16_t *>(p)[i] = t == CUDA_R_16BF ? emu_f32_to_bf16(v) : emu_f32_to_f16(v);
}

/* The largest power of two (<= 256) dividing the address. */
unsigned align_of(uintptr_t a)
{
    unsigned al = 1;
    while (al < 256 && (a & al) == 0)
        al <<= 1;
    return al;
}

/* The alignment every batch's matrix keeps. */
unsigned batch_align(const void *p, int batch, int64_t stride, size_t es)
{
    unsigned al = align_of((uintptr_t)p);
    if (batch > 1 && stride != 0) {
        unsigned s = align_of((uintptr_t)((uint64_t)stride * es));
        al = s < al ? s : al;
    }
    return al;
}

/* A checked problem. */
struct Problem {
    bool ta, tb;
    uint64_t m, n, k;
    int batch;
    const cublasLtMatrixLayoutOpaque_t *A, *B, *C, *D;
    bool bias, gelu, aux, dgelu; /* dgelu: aux is the GELU input, read */
    uint32_t bias_type, aux_type;
};

#define FAIL(st, ...)                                                          \
    do {                                                                       \
        diag(__VA_ARGS__);                                                     \
        return st;                                                             \
    } while (0)

cublasStatus_t check(const cublasLtMatmulDescOpaque_t *d, const cublasLtMatrixLayoutOpaque_t *A,
                     const cublasLtMatrixLayoutOpaque_t *B, const cublasLtMatrixLayoutOpaque_t *C,
                     const cublasLtMatrixLayoutOpaque_t *D, Problem *p, const char *who)
{
    if (!d || d->magic != DESC)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: not a matmul descriptor", who);
    const cublasLtMatrixLayoutOpaque_t *L[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if (!L[i] || L[i]->magic != LAYOUT)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: layout %c is not a matrix layout", who, "ABCD"[i]);
    if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
        d->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED,
             "%s: compute type %d is not emulated (CUBLAS_COMPUTE_32F and _FAST_TF32 are)", who,
             d->compute);
    if (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && (A->type != CUDA_R_32F || B->type != CUDA_R_32F))
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: CUBLAS_COMPUTE_32F_FAST_TF32 with A, B of types %u, %u "
             "(fp32 only)", who, A->type, B->type);
    if (d->scale != CUDA_R_32F)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: scale type %d is not emulated (CUDA_R_32F is)", who,
             d->scale);
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: only host alpha and beta are emulated", who);
    if (d->transc != CUBLAS_OP_N)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: TRANSC must be CUBLAS_OP_N", who);
    for (int32_t t : {d->transa, d->transb})
        if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: bad transpose %d", who, t);
    for (int i = 0; i < 4; i++) {
        if (L[i]->order != CUBLASLT_ORDER_COL)
            FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: only column-major layouts are emulated", who);
        if (!is_type(L[i]->type))
            FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: data type %u of %c is not emulated", who,
                 L[i]->type, "ABCD"[i]);
        if (L[i]->ld < 1 || (uint64_t)L[i]->ld < L[i]->rows)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: %c is %llu x %llu with ld %lld (< rows)", who,
                 "ABCD"[i], (unsigned long long)L[i]->rows, (unsigned long long)L[i]->cols,
                 (long long)L[i]->ld);
        if (L[i]->batch < 1 || L[i]->batch != D->batch)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: batch counts %d (%c) and %d (D) differ", who,
                 L[i]->batch, "ABCD"[i], D->batch);
    }
    if (A->type != B->type || C->type != D->type ||
        !(D->type == A->type || (D->type == CUDA_R_32F && A->type != CUDA_R_32F)))
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: types A %u, B %u, C %u, D %u: no such matmul", who,
             A->type, B->type, C->type, D->type);
    p->ta = d->transa != CUBLAS_OP_N;
    p->tb = d->transb != CUBLAS_OP_N;
    p->m = D->rows;
    p->n = D->cols;
    p->k = p->ta ? A->rows : A->cols;
    uint64_t am = p->ta ? A->cols : A->rows;
    uint64_t bk = p->tb ? B->cols : B->rows, bn = p->tb ? B->rows : B->cols;
    if (am != p->m || bk != p->k || bn != p->n || C->rows != p->m || C->cols != p->n)
        FAIL(CUBLAS_STATUS_INVALID_VALUE,
             "%s: inconsistent shapes: op(A) %llu x %llu, op(B) %llu x %llu, C %llu x %llu, "
             "D %llu x %llu",
             who, (unsigned long long)am, (unsigned long long)p->k, (unsigned long long)bk,
             (unsigned long long)bn, (unsigned long long)C->rows, (unsigned long long)C->cols,
             (unsigned long long)p->m, (unsigned long long)p->n);
    p->batch = D->batch;
    p->A = A;
    p->B = B;
    p->C = C;
    p->D = D;
    p->dgelu = false;
    switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: p->bias = p->gelu = p->aux = false; break;
    case CUBLASLT_EPILOGUE_BIAS: p->bias = true, p->gelu = p->aux = false; break;
    case CUBLASLT_EPILOGUE_GELU: p->gelu = true, p->bias = p->aux = false; break;
    case CUBLASLT_EPILOGUE_GELU_BIAS: p->gelu = p->bias = true, p->aux = false; break;
    case CUBLASLT_EPILOGUE_GELU_AUX: p->gelu = p->aux = true, p->bias = false; break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: p->gelu = p->aux = p->bias = true; break;
    case CUBLASLT_EPILOGUE_DGELU: p->dgelu = p->aux = true, p->bias = p->gelu = false; break;
    default:
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: epilogue %u is not emulated", who, d->epilogue);
    }
    if (p->bias) {
        if (!d->bias)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: a bias epilogue without a bias pointer", who);
        p->bias_type = d->bias_type == -1 ? D->type : (uint32_t)d->bias_type;
        if (p->bias_type != D->type) /* cuBLASLt: the bias has D's type */
            FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: bias type %u for D of type %u", who,
                 p->bias_type, D->type);
    }
    if (p->aux) {
        if (!d->aux)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: a GELU aux epilogue without an aux pointer", who);
        if (d->aux_ld < 0 || (uint64_t)d->aux_ld < p->m)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: EPILOGUE_AUX_LD %lld is below D's %llu rows",
                 who, (long long)d->aux_ld, (unsigned long long)p->m);
        if (d->aux_ld % 8 != 0 || d->aux_stride % 8 != 0)
            FAIL(CUBLAS_STATUS_NOT_SUPPORTED,
                 "%s: the GELU aux leading dimension (%lld) and batch stride (%lld) must be "
                 "multiples of 8",
                 who, (long long)d->aux_ld, (long long)d->aux_stride);
        p->aux_type = d->aux_type == -1 ? D->type : (uint32_t)d->aux_type;
        if (p->aux_type != D->type)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: aux type %u for D of type %u", who,
                 p->aux_type, D->type);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* What an algorithm is chosen for, beside the shapes. */
uint64_t signature(const cublasLtMatmulDescOpaque_t *d, const Problem &p)
{
    return (uint64_t)d->epilogue | (uint64_t)p.A->type << 16 | (uint64_t)p.D->type << 24 |
           (uint64_t)p.ta << 32 | (uint64_t)p.tb << 33 | (uint64_t)(p.batch > 1) << 34 |
           (uint64_t)(d->compute == CUBLAS_COMPUTE_32F_FAST_TF32) << 35;
}

unsigned cap16(unsigned a)
{
    return a < 16 ? a : 16;
}

/* [p + lo, p + hi) of a matrix (every batch's elements) in the current
 * device's memory (another GPU's faults the kernel as the host's would). */
bool in_device(const void *p, uint64_t rows, uint64_t cols, int64_t ld, int batch,
               int64_t stride, size_t es)
{
    if (rows == 0 || cols == 0)
        return true;
    int64_t last = (int64_t)(rows - 1) + (int64_t)(cols - 1) * ld;
    int64_t lo = 0, hi = last;
    if (batch > 1) {
        int64_t b = (int64_t)(batch - 1) * stride;
        lo = b < 0 ? b : 0;
        hi = last + (b > 0 ? b : 0);
    }
    return emu::device_of(static_cast<const char *>(p) + lo * (int64_t)es, (size_t)(hi - lo + 1) * es) ==
           emu::current_device();
}

/* v rounded to TF32: 10 bits of mantissa, to nearest, ties away from zero
 * (cvt.rna.tf32.f32); infinities and NaNs as they are. */
float to_tf32(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0x1000u) & ~0x1fffu;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* D = fa op(A) op(B) + fb C, with the epilogue: fp32 products and sums in
 * k order (of TF32 operands with CUBLAS_COMPUTE_32F_FAST_TF32), D rounded
 * once. */
/* The heuristic's algorithms, in its order (the header comment). */
enum Variant : uint64_t { KORDER, RETILED, SPLITK, REVERSED, ROTATED, VARIANTS };

void product(const Problem &p, const cublasLtMatmulDescOpaque_t &d, uint64_t variant, float fa,
             const void *Ap,
             const cublasLtMatrixLayoutOpaque_t &A, const void *Bp,
             const cublasLtMatrixLayoutOpaque_t &B, float fb, const void *Cp,
             const cublasLtMatrixLayoutOpaque_t &C, void *Dp, const cublasLtMatrixLayoutOpaque_t &D)
{
    uint64_t m = p.m, n = p.n, k = p.k;
    std::vector<float> out(m * n), pre(p.aux && !p.dgelu ? m * n : 0);
    const bool tf32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    for (int b = 0; b < p.batch; b++) {
        size_t ao = (size_t)((int64_t)b * A.stride), bo = (size_t)((int64_t)b * B.stride);
        size_t co = (size_t)((int64_t)b * C.stride), dof = (size_t)((int64_t)b * D.stride);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                auto term = [&](uint64_t q) {
                    size_t ai = p.ta ? q + i * (uint64_t)A.ld : i + q * (uint64_t)A.ld;
                    size_t bi = p.tb ? j + q * (uint64_t)B.ld : q + j * (uint64_t)B.ld;
                    float x = load(A.type, Ap, ao + ai), y = load(B.type, Bp, bo + bi);
                    return tf32 ? to_tf32(x) * to_tf32(y) : x * y;
                };
                float acc = 0.0f;
                if (variant == SPLITK) {
                    float lo = 0.0f, hi = 0.0f;
                    for (uint64_t q = 0; q < k / 2; q++)
                        lo += term(q);
                    for (uint64_t q = k / 2; q < k; q++)
                        hi += term(q);
                    acc = lo + hi;
                } else if (variant == REVERSED) {
                    for (uint64_t q = k; q-- > 0;)
                        acc += term(q);
                } else if (variant == ROTATED) {
                    for (uint64_t q = 0; q < k; q++)
                        acc += term((q + k / 2) % k);
                } else {
                    for (uint64_t q = 0; q < k; q++)
                        acc += term(q);
                }
                float v = fa * acc;
                if (fb != 0.0f)
                    v += fb * load(C.type, Cp, co + i + j * (uint64_t)C.ld);
                if (p.bias)
                    v += load(p.bias_type, d.bias, (size_t)((int64_t)b * d.bias_stride) + i);
                if (p.dgelu) { /* times the slope of the tanh approximation at aux */
                    float x = load(p.aux_type, d.aux,
                                   (size_t)((int64_t)b * d.aux_stride) + i + j * (uint64_t)d.aux_ld);
                    float c = 0.7978845608028654f, t = tanhf(c * (x + 0.044715f * x * x * x));
                    v *= 0.5f * (1.0f + t) +
                         0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
                } else if (p.aux) {
                    pre[i + j * m] = v;
                }
                if (p.gelu) /* the tanh approximation */
                    v = 0.5f * v *
                        (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
                out[i + j * m] = v;
            }
        /* written after all is read: D may be C */
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                store(D.type, Dp, dof + i + j * (uint64_t)D.ld, out[i + j * m]);
                if (p.aux && !p.dgelu)
                    store(p.aux_type, d.aux,
                          (size_t)((int64_t)b * d.aux_stride) + i + j * (uint64_t)d.aux_ld,
                          pre[i + j * m]);
            }
    }
}

} /* namespace */

extern "C" {

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "<unknown>";
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "<unknown>";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *lightHandle = new cublasLtContext{HANDLE};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    if (!h || h->magic != HANDLE)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulDescOpaque_t *d = new cublasLtMatmulDescOpaque_t();
    d->magic = DESC;
    d->compute = computeType;
    d->scale = scaleType;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = d->transc = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->aux_type = d->bias_type = -1;
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    if (!d || d->magic != DESC)
        return CUBLAS_STATUS_INVALID_VALUE;
    d->magic = 0;
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

/* The attribute's size must be its type's. */
#define SET(field, type)                                                       \
    do {                                                                       \
        if (sizeInBytes != sizeof(type))                                       \
            return CUBLAS_STATUS_INVALID_VALUE;                                \
        type v_;                                                               \
        memcpy(&v_, buf, sizeof v_);                                           \
        field = v_;                                                            \
        return CUBLAS_STATUS_SUCCESS;                                          \
    } while (0)

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    if (!d || d->magic != DESC || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: SET(d->compute, int32_t);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: SET(d->scale, int32_t);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: SET(d->pointer_mode, int32_t);
    case CUBLASLT_MATMUL_DESC_TRANSA: SET(d->transa, int32_t);
    case CUBLASLT_MATMUL_DESC_TRANSB: SET(d->transb, int32_t);
    case CUBLASLT_MATMUL_DESC_TRANSC: SET(d->transc, int32_t);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: SET(d->epilogue, uint32_t);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: SET(d->bias, const void *);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: SET(d->bias_stride, int64_t);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: SET(d->aux, void *);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: SET(d->aux_ld, int64_t);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: SET(d->aux_stride, int64_t);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: SET(d->aux_type, int32_t);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: SET(d->bias_type, int32_t);
    }
    diag("cublasLtMatmulDescSetAttribute: attribute %d is not emulated", (int)attr);
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatrixLayoutOpaque_t *l = new cublasLtMatrixLayoutOpaque_t();
    l->magic = LAYOUT;
    l->type = (uint32_t)type;
    l->order = CUBLASLT_ORDER_COL;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    l->batch = 1;
    l->stride = 0;
    *matLayout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    if (!l || l->magic != LAYOUT)
        return CUBLAS_STATUS_INVALID_VALUE;
    l->magic = 0;
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    if (!l || l->magic != LAYOUT || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: SET(l->type, uint32_t);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: SET(l->order, int32_t);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: SET(l->rows, uint64_t);
    case CUBLASLT_MATRIX_LAYOUT_COLS: SET(l->cols, uint64_t);
    case CUBLASLT_MATRIX_LAYOUT_LD: SET(l->ld, int64_t);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: SET(l->batch, int32_t);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: SET(l->stride, int64_t);
    }
    diag("cublasLtMatrixLayoutSetAttribute: attribute %d is not emulated", (int)attr);
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreferenceOpaque_t *p = new cublasLtMatmulPreferenceOpaque_t();
    p->magic = PREF;
    p->reduction = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (uint32_t &a : p->align)
        a = 256;
    p->impl = ~(uint64_t)0;
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    if (!p || p->magic != PREF)
        return CUBLAS_STATUS_INVALID_VALUE;
    p->magic = 0;
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    if (!p || p->magic != PREF || !buf)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: SET(p->search, uint32_t);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: SET(p->max_workspace, uint64_t);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: SET(p->reduction, uint32_t);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: SET(p->align[0], uint32_t);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: SET(p->align[1], uint32_t);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: SET(p->align[2], uint32_t);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: SET(p->align[3], uint32_t);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: SET(p->waves, float);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: SET(p->impl, uint64_t);
    }
    diag("cublasLtMatmulPreferenceSetAttribute: attribute %d is not emulated", (int)attr);
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned)
{
    if (!h || h->magic != HANDLE)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!pref || pref->magic != PREF || requested < 1 || !results || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    Problem p;
    cublasStatus_t st = check(d, A, B, C, D, &p, "cublasLtMatmulAlgoGetHeuristic");
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    /* (the reduction mask: CUBLASLT_REDUCTION_SCHEME_NONE is 0, so every
     * mask, 0 included, allows the unsplit products; SPLITK's partial sums
     * are fp32, the compute type) */
    unsigned al[6] = {cap16(pref->align[0]), cap16(pref->align[1]), cap16(pref->align[2]),
                      cap16(pref->align[3]),
                      p.bias ? cap16(align_of((uintptr_t)d->bias)) : 1,
                      p.aux ? cap16(align_of((uintptr_t)d->aux)) : 1};
    for (uint64_t v = KORDER; v < VARIANTS && *returned < requested; v++) {
        if (v == SPLITK && ((pref->reduction & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) == 0 ||
                            p.k < 2))
            continue;
        if (v == ROTATED && !getenv("EMU_CUBLASLT_ROTATED"))
            continue;
        cublasLtMatmulHeuristicResult_t *r = &results[*returned];
        memset(r, 0, sizeof *r);
        uint64_t *a = r->algo.data;
        a[0] = ALGO;
        a[1] = signature(d, p);
        for (int i = 0; i < 6; i++)
            a[2] |= (uint64_t)al[i] << (8 * i);
        a[3] = v;
        r->workspaceSize = 0;
        r->state = CUBLAS_STATUS_SUCCESS;
        r->wavesCount = 1.0f;
        ++*returned;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void *buf, size_t sizeInBytes,
                                                    size_t *sizeWritten)
{
    if (!algo || algo->data[0] != ALGO || algo->data[3] >= VARIANTS)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t v = algo->data[3];
    uint32_t value;
    switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: value = v == REVERSED ? 1 : 0; break;
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: value = v == SPLITK ? 2 : 1; break;
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
        value = v == SPLITK ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
        break;
    default:
        diag("cublasLtMatmulAlgoConfigGetAttribute: attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (sizeInBytes == 0) { /* the size asked for */
        if (!sizeWritten)
            return CUBLAS_STATUS_INVALID_VALUE;
        *sizeWritten = sizeof value;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || sizeInBytes != sizeof value)
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, &value, sizeof value);
    if (sizeWritten)
        *sizeWritten = sizeof value;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *Ap, cublasLtMatrixLayout_t A, const void *Bp,
                              cublasLtMatrixLayout_t B, const void *beta, const void *Cp,
                              cublasLtMatrixLayout_t C, void *Dp, cublasLtMatrixLayout_t D,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream)
{
    const char *who = "cublasLtMatmul";
    if (!h || h->magic != HANDLE)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || (workspaceSizeInBytes > 0 && !workspace))
        return CUBLAS_STATUS_INVALID_VALUE;
    Problem p;
    cublasStatus_t st = check(d, A, B, C, D, &p, who);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!algo || algo->data[0] != ALGO || algo->data[3] >= VARIANTS)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: not an algorithm from the heuristic", who);
    if (algo->data[1] != signature(d, p))
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED,
             "%s: the algorithm was chosen for another epilogue, type, transpose or batching",
             who);
    /* EMU_CUBLASLT_REFUSE_EPILOGUE (tests): a fused epilogue refused at the
     * call, as a real algorithm the heuristic chose may be (cublasLt.h: the
     * heuristic's choice does not fully guarantee the algorithm will run) */
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && getenv("EMU_CUBLASLT_REFUSE_EPILOGUE"))
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: epilogue %u refused (EMU_CUBLASLT_REFUSE_EPILOGUE)", who,
             d->epilogue);
    float fa, fb;
    memcpy(&fa, alpha, sizeof fa);
    memcpy(&fb, beta, sizeof fb);
    /* DGELU with beta != 0: the documentation does not say whether C is
     * added before or after the GELU's slope, so no kernel may rely on it */
    if (p.dgelu && fb != 0.0f)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "%s: DGELU with beta %g (not emulated)", who, (double)fb);
    if (Cp == Dp && fb != 0.0f &&
        (C->type != D->type || C->ld != D->ld || C->stride != D->stride))
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: in place (C == D) with different C and D layouts",
             who);
    /* the pointers against what the algorithm may assume */
    struct {
        const char *name;
        const void *ptr;
        int64_t stride;
        size_t es;
    } ops[6] = {{"A", Ap, A->stride, type_size(A->type)},
                {"B", Bp, B->stride, type_size(B->type)},
                {"C", Cp, C->stride, type_size(C->type)},
                {"D", Dp, D->stride, type_size(D->type)},
                {"bias", p.bias ? d->bias : nullptr, d->bias_stride, type_size(D->type)},
                {"aux", p.aux ? d->aux : nullptr, d->aux_stride, type_size(D->type)}};
    for (int i = 0; i < 6; i++) {
        if (i == 2 && fb == 0.0f)
            continue; /* C is not read */
        if (i >= 4 && !ops[i].ptr)
            continue;
        if (!ops[i].ptr || (uintptr_t)ops[i].ptr % ops[i].es != 0)
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%s: %s pointer %p", who, ops[i].name, ops[i].ptr);
        unsigned need = (unsigned)(algo->data[2] >> (8 * i)) & 0xffu;
        unsigned have = batch_align(ops[i].ptr, p.batch, ops[i].stride, ops[i].es);
        if (have < need)
            FAIL(CUBLAS_STATUS_NOT_SUPPORTED,
                 "%s: %s (%p, batch stride %lld) is %u-byte aligned; the algorithm was chosen "
                 "for %u",
                 who, ops[i].name, ops[i].ptr, (long long)ops[i].stride, have, need);
    }
    cudaError_t se = emu::sticky_error();
    if (se != cudaSuccess || !emu::stream_ok(stream))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (emu::fault_here(emu::FAULT_MATMUL, who))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (emu::stream_device(stream) != emu::current_device()) {
        emu::diag("cublasLtMatmul on device %d into a stream of device %d", emu::current_device(),
                  emu::stream_device(stream));
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    /* every matrix in device memory, else the kernel would fault */
    bool ok = in_device(Ap, A->rows, A->cols, A->ld, p.batch, A->stride, ops[0].es) &&
              in_device(Bp, B->rows, B->cols, B->ld, p.batch, B->stride, ops[1].es) &&
              (fb == 0.0f ||
               in_device(Cp, C->rows, C->cols, C->ld, p.batch, C->stride, ops[2].es)) &&
              in_device(Dp, D->rows, D->cols, D->ld, p.batch, D->stride, ops[3].es) &&
              (!p.bias || in_device(d->bias, p.m, 1, (int64_t)p.m, p.batch,
                                    d->bias_stride, ops[4].es)) &&
              (!p.aux || in_device(d->aux, p.m, p.n, d->aux_ld, p.batch,
                                   d->aux_stride, ops[5].es));
    if (!ok) {
        diag("%s: a matrix is not (wholly) in this device's memory: the kernel faults", who);
        emu::set_sticky(cudaErrorIllegalAddress);
        return CUBLAS_STATUS_SUCCESS; /* the fault shows at the next call */
    }
    /* the product, in the stream's order: what it reads, copied */
    const cublasLtMatrixLayoutOpaque_t LA = *A, LB = *B, LC = *C, LD = *D;
    const cublasLtMatmulDescOpaque_t dd = *d;
    const uint64_t variant = algo->data[3];
    emu::stream_run(stream, [=] { product(p, dd, variant, fa, Ap, LA, Bp, LB, fb, Cp, LC, Dp, LD); });
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
