/* kcuda.h — the CUDA kernels: every op of the CPU backend (kernels/cpu,
 * kcpu.h, the spec) on an NVIDIA GPU, forward and backward. Prefix kcuda_.
 *
 * Plain C declarations, usable from C11 host code without CUDA headers:
 * a CUDA stream is passed as `void *stream` (a cudaStream_t; NULL is the
 * legacy default stream), and every tensor is a DEVICE pointer. Each op is
 * one launcher in one kernels/cuda/<area>.cu file, compiled by nvcc with
 * extern "C" linkage.
 *
 * Conventions, the same as kcpu's (kcpu_dense.h) unless written here:
 *  - Shapes are row-major in brackets, x[M,K]; layouts, what a forward
 *    overwrites and what a backward ADDS into (+=), epsilon placement and
 *    saved statistics are exactly the kcpu function's of the same name, so
 *    that the GPU can be checked against the CPU (tests/gpu/gpu_tests*.c).
 *  - Storage precision: `kcuda_dtype dt` applies to every float tensor of
 *    the call (activations, weights, their gradients) except those typed
 *    `float *` / `const float *` here, which are always fp32: saved row
 *    statistics (mean, rstd, lse, rowmax, losses), routing weights, the
 *    AdamW master weights and moments. Arithmetic is fp32 throughout
 *    (bf16 is storage only; sums and matrix products accumulate in fp32,
 *    some row sums in double as the CPU does), and every bf16 result is
 *    rounded to nearest even once, when stored.
 *  - Deterministic: no float atomics; every sum has a fixed order that
 *    depends on the shapes only (not on the GPU's size or on timing), so a
 *    call gives the same bits on every run. cuBLASLt products use the same
 *    algorithm for the same shapes and pointer alignments (up to 256
 *    bytes) within one kcuda_ctx.
 *  - Launchers are asynchronous on `stream`. They return 0, a CUDA error
 *    code (a cudaError_t value > 0, e.g. of the launch), or a negative
 *    KCUDA_ERR_* code; kcuda_last_error() then says what failed, in words.
 *    An error in a kernel that already ran shows up in a later call (or a
 *    cudaStreamSynchronize), as usual with CUDA.
 *  - Invalid arguments (negative sizes, an unsupported head size) return
 *    KCUDA_ERR_ARG; token ids out of range are NOT checked on the GPU (the
 *    CPU kernels assert them): such rows read or write nothing (a
 *    cross-entropy row whose target is out of range gets a NaN loss).
 *
 * Ops that need cuBLASLt or scratch memory take a kcuda_ctx: one per
 * stream (or per thread), like a cuBLAS handle. Everything else takes only
 * device pointers and a stream.
 */
#ifndef MESH_KCUDA_H
#define MESH_KCUDA_H

#include <stddef.h> /* defines: size_t */
#include <stdint.h> /* defines: int32_t */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- common.cu: dtypes, errors, the device probe, the context ----------- */

/* Storage types of float tensors. */
typedef enum kcuda_dtype {
    KCUDA_F32 = 0,  /* IEEE binary32 */
    KCUDA_BF16 = 1, /* bfloat16: the top 16 bits of a binary32 */
    KCUDA_F16 = 2   /* IEEE binary16 (fp16: tensor cores as bf16; a loss scale keeps gradients in range) */
} kcuda_dtype;

/* Return codes besides 0 and CUDA's (positive) error codes. */
enum {
    KCUDA_ERR_ARG = -1,         /* an argument is invalid or unsupported */
    KCUDA_ERR_BLAS = -2,        /* cuBLASLt failed (kcuda_last_error says how) */
    KCUDA_ERR_NO_ALGO = -3      /* cuBLASLt has no algorithm for the shapes */
};

/* What the last failing kcuda_* call of this thread said; "" if none. The
 * text stays until the next failure on this thread. */
const char *kcuda_last_error(void);

/* 1 when rc (a kcuda_* call's) says the device's memory is full
 * (cudaErrorMemoryAllocation). */
int kcuda_out_of_memory(int rc);

/* The bytes that this thread's last failing kcuda_* call could not
 * allocate (kcuda_alloc's, or a context's scratch growing for an op); 0
 * when that failure was not an allocation's. */
size_t kcuda_failed_alloc_bytes(void);

/* For a CUDA error that a fault in a kernel leaves behind (sticky: every
 * later call on the device fails with it, and the process must end; an
 * illegal address, a launch failure, a device-side assert...), what to
 * add to its message: that an earlier kernel faulted, and how to find
 * which; "" for any other code. */
const char *kcuda_fault_hint(int cuda_error);

/* 1 when a CUDA device is usable; else 0, with the reason in why[n] (which
 * may be NULL). Never crashes without a driver: it tries
 * dlopen("libcuda.so.1") before asking the CUDA runtime. */
int kcuda_available(char *why, size_t n);

/* Bytes per element: 4, or 2 (bf16, fp16). */
size_t kcuda_dtype_size(kcuda_dtype dt);

/* dst[n] = src[n], converted (fp32 to bf16 rounds to nearest even). dst and
 * src may be the same buffer only when the dtypes are equal. */
int kcuda_convert(void *dst, kcuda_dtype dst_dt, const void *src,
                  kcuda_dtype src_dt, size_t n, void *stream);

/* The device memory a context's cuBLASLt workspace takes: NVIDIA's
 * recommendation on Hopper. */
#define KCUDA_WORKSPACE_BYTES ((size_t)32 << 20)

/* A cuBLASLt handle, its workspace (KCUDA_WORKSPACE_BYTES), cached matmul algorithms and a
 * scratch buffer that grows on demand (the ops that need one say so). Use a
 * context on one stream only (its scratch is reused and regrown in that
 * stream's order; another stream would need an event between them).
 * kcuda_ctx_free(NULL) does nothing;
 * freeing waits for the device. Creating one makes the device's default
 * memory pool keep what is freed into it (its release threshold the
 * largest), so that the stream-ordered allocations below stay cheap. */
typedef struct kcuda_ctx kcuda_ctx;
int kcuda_ctx_create(kcuda_ctx **out);
void kcuda_ctx_free(kcuda_ctx *ctx);
/* The device memory the context's scratch holds now (0 for NULL). It
 * grows to half again what an op asks, or to just what it asks when that
 * half does not fit. */
size_t kcuda_ctx_scratch_bytes(const kcuda_ctx *ctx);
/* How the context's ops may sum (today the attention backward in bf16 and
 * fp16, whose dq sums products over the key tiles):
 *   1 (the default) deterministic: dq by a kernel of its own, which owns a
 *     tile of queries and walks its key tiles (7 tile products a pair of
 *     tiles; fp32's path in every mode); the fastest of the three on an
 *     H200 at GPT-2's shapes (docs/benchmarks.md);
 *   0 the dk/dv kernel adds its dq into fp32 with atomics, in the order
 *     they arrive (FlashAttention-2's way, 5 products): not the same bits
 *     from run to run;
 *   2 the same atomics, the key tiles of a query tile taking turns in a
 *     fixed order: deterministic.
 * Other values are 1. */
void kcuda_ctx_set_deterministic(kcuda_ctx *ctx, int mode);

/* How a product picks its cuBLASLt algorithm, at a shape's first call
 * (the choice is then cached for the shape, as always):
 *   0 (the default) the first of cuBLASLt's heuristic;
 *   1 timed: of the heuristic's first 8 algorithms, those that are the
 *     first's kernel (its ALGO_ID) in another tile, stages, swizzle or
 *     cluster shape, without a split of the sum over k, run on the call's
 *     own operands, 1 + 3 times each, and the fastest is kept among those
 *     whose output has the first's bits (a hash of every element, on the
 *     device). So the numbers are the default's, run to run and rank to
 *     rank, whichever one a rank's timing picks. Only products whose
 *     output is fp32 or has at least KCUDA_TUNE_MIN_OUTPUT elements are
 *     tuned: a smaller one takes little time, and in its few 2-byte
 *     outputs rounding may hide another order of the sums from the hash;
 *   2 the same for every product, however small (the tests' shapes on the
 *     emulation). The first call of a shape
 *     then waits for the device (events), saves and restores C when the
 *     product adds to it (a buffer of C's size, for that call only), and
 *     skips the tuning, keeping the first, when the device has not that
 *     much free memory and 64 MiB more.
 * Other values are 0. Set it before the context's first product: a shape
 * already cached keeps its algorithm. */
void kcuda_ctx_set_gemm_tune(kcuda_ctx *ctx, int mode);
#define KCUDA_TUNE_MIN_OUTPUT (1 << 18)

/* fp32 products on TF32 tensor cores (on != 0): the context's cuBLASLt
 * products of fp32 operands (the matmuls and the experts') compute in
 * CUBLAS_COMPUTE_32F_FAST_TF32, which rounds each operand to TF32
 * (fp32's range, 10 bits of mantissa: fp16's precision) and sums in fp32,
 * as PyTorch's allow_tf32; and the fp32 attention's tile products (Q K^T,
 * P V and the backward's) run as mma.sync m16n8k8 on TF32 operands, each
 * rounded by cvt.rna (the softmax and its sums stay fp32). Several times
 * fp32's speed on Ampere and Hopper; the results differ from the CPU's
 * by about fp16 rounding's, not fp32's 1e-6. 0, the default: true fp32.
 * Set it before the context's first product (a shape's algorithm is
 * cached with it). */
void kcuda_ctx_set_tf32(kcuda_ctx *ctx, int on);

/* What the tuning did so far, for tests and logs: shapes tuned (a first
 * call with more than one candidate), candidates timed (the first
 * included), set aside unrun for a split sum or for being another kernel,
 * set aside for other bits, refused by cuBLASLt at the call, shapes whose
 * fastest was not the first, shapes not tuned for want of free memory,
 * and shapes left to the first for their small 2-byte output (mode 1).
 * Returns the context's mode (0: off, nothing tuned). */
typedef struct kcuda_gemm_tune_stats {
    int shapes, timed, split, other_kernel, other_bits, refused, changed,
        no_memory, small;
} kcuda_gemm_tune_stats;
int kcuda_ctx_gemm_tune_stats(const kcuda_ctx *ctx,
                              kcuda_gemm_tune_stats *out);
/* The stats in words, into buf (n bytes, truncated): "16 shapes tuned,
 * 39 candidates timed; set aside: ...". */
void kcuda_gemm_tune_describe(const kcuda_gemm_tune_stats *st, char *buf,
                              size_t n);

/* Stream-ordered device memory (cudaMallocAsync, cudaFreeAsync from the
 * device's default pool) for buffers that grow while training: usable by
 * `stream`'s later work. A cudaMalloc or cudaFree would wait for every
 * stream of the device, a communication queue's running NCCL collective
 * included, which may wait for a peer that waits for this rank: a
 * deadlock. kcuda_free(NULL, ...) does nothing. */
int kcuda_alloc(void **p, size_t bytes, void *stream);
int kcuda_free(void *p, void *stream);

/* ---- matmul.cu: linear layers through cuBLASLt -------------------------- */

/* Epilogues fused into the forward product. */
typedef enum kcuda_epilogue {
    KCUDA_EPI_NONE = 0,
    KCUDA_EPI_GELU = 1 /* y = gelu(x @ w + bias), saving pre = x @ w + bias */
} kcuda_epilogue;

/* y = x @ w + bias, w stored [in, out] (kcpu_matmul_forward), then the
 * epilogue. The bias, and in bf16 and fp16 the GELU, are fused into
 * cuBLASLt's epilogue where it offers one, else applied by a kernel after
 * the product. fp32's GELU is always the kernel's (activation.cu's):
 * cuBLASLt's is its own tanh approximation, within 2-byte storage's
 * tolerance of ours but not within fp32's. fp32 is plain fp32 (no TF32);
 * bf16 runs on tensor cores with fp32 accumulation (a split product's
 * parts too). pre must not be y.
 * y[M,N] out; pre[M,N] out (KCUDA_EPI_GELU only, else may be NULL);
 * x[M,K]; w[K,N]; bias[N] (may be NULL). */
int kcuda_matmul_forward(kcuda_ctx *ctx, void *y, void *pre, const void *x,
                         const void *w, const void *bias, int M, int K, int N,
                         kcuda_epilogue epi, kcuda_dtype dt, void *stream);

/* dx += dy @ w^T, dw += x^T @ dy, dbias += sum over rows of dy (the bias
 * sum in a fixed order through the context's scratch).
 * dx[M,K], dw[K,N], dbias[N] (each may be NULL); dy[M,N]; x[M,K]; w[K,N].
 * dw and dbias are of dw_dt: dt, or KCUDA_F32 beside 2-byte tensors (fp32
 * main gradients: the product added to them in fp32, never rounded to 2
 * bytes). dx_assign: dx = dy @ w^T instead (cuBLASLt's beta 0: dx's old
 * contents are not read, and need not be zeroed). */
int kcuda_matmul_backward(kcuda_ctx *ctx, void *dx, void *dw, void *dbias,
                          const void *dy, const void *x, const void *w, int M,
                          int K, int N, kcuda_dtype dt, kcuda_dtype dw_dt,
                          int dx_assign, void *stream);

/* The backward of y = gelu(pre) @ w (x = gelu(pre), the product's input),
 * the GELU's with the product's: dpre = gelu'(pre) * (dy @ w^T),
 * overwritten (its old contents are not read), and dw += x^T @ dy as
 * kcuda_matmul_backward's. In bf16 and fp16, cuBLASLt's DGELU epilogue
 * where it offers one: the product's fp32 sums times the GELU's slope at
 * pre, rounded once, and the product never stored. fp32, a row length K
 * not a multiple of 8 and an epilogue refused take the product and then
 * activation.cu's GELU backward in place (the two ops' own kernels).
 * dpre[M,K], pre[M,K] (apart); dw[K,N] of dw_dt (may be NULL); dy[M,N];
 * x[M,K]; w[K,N]. */
int kcuda_matmul_gelu_backward(kcuda_ctx *ctx, void *dpre, void *dw,
                               const void *dy, const void *x, const void *w,
                               const void *pre, int M, int K, int N,
                               kcuda_dtype dt, kcuda_dtype dw_dt,
                               void *stream);

/* y = x @ w^T + bias with w stored [out, in] (the tied LM head).
 * y[M,N] out; x[M,K]; w[N,K]; bias[N] (may be NULL). */
int kcuda_matmul_wt_forward(kcuda_ctx *ctx, void *y, const void *x,
                            const void *w, const void *bias, int M, int K,
                            int N, kcuda_dtype dt, void *stream);

/* dx += dy @ w, dw += dy^T @ x, dbias += sum over rows of dy.
 * dx[M,K], dw[N,K], dbias[N] (each may be NULL); dy[M,N]; x[M,K]; w[N,K];
 * dw and dbias of dw_dt, and dx_assign, as kcuda_matmul_backward's. */
int kcuda_matmul_wt_backward(kcuda_ctx *ctx, void *dx, void *dw, void *dbias,
                             const void *dy, const void *x, const void *w,
                             int M, int K, int N, kcuda_dtype dt,
                             kcuda_dtype dw_dt, int dx_assign, void *stream);

/* dbias[N] += sum over the M rows of dy[M,N], in a fixed order (two
 * passes through the context's scratch). */
int kcuda_bias_backward(kcuda_ctx *ctx, void *dbias, const void *dy, int M,
                        int N, kcuda_dtype dt, void *stream);

/* ---- embed.cu: token embedding ------------------------------------------ */

/* out[i] = i: the positions an arange() gives. out[n] (device). */
int kcuda_arange(int32_t *out, size_t n, void *stream);

/* out[i,:] = table[ids[i],:]. out[n,C] out; ids[n] (device); table[V,C]. */
int kcuda_embedding_forward(void *out, const int32_t *ids, const void *table,
                            int n, int V, int C, kcuda_dtype dt, void *stream);

/* dtable[ids[i],:] += dout[i,:], repeated ids summed in index order
 * i = 0..n-1 exactly as kcpu_embedding_backward (the same bits in fp32):
 * the ids are sorted stably (cub radix sort, in the context's scratch) and
 * one block owns each distinct id, so no two threads write a row.
 * dtable[V,C]; dout[n,C]; ids[n]. */
int kcuda_embedding_backward(kcuda_ctx *ctx, void *dtable, const void *dout,
                             const int32_t *ids, int n, int V, int C,
                             kcuda_dtype dt, void *stream);

/* Vocabulary-parallel forms (kcpu_embedding_rows_*): the table holds rows
 * [row0, row0 + rows); an id outside gives a zero row forward and adds
 * nothing backward. The backward's dtable is of table_dt: dt, or KCUDA_F32
 * beside 2-byte tensors (an fp32 main gradient, added to in fp32). */
int kcuda_embedding_rows_forward(void *out, const int32_t *ids,
                                 const void *table, int n, int row0, int rows,
                                 int C, kcuda_dtype dt, void *stream);
int kcuda_embedding_rows_backward(kcuda_ctx *ctx, void *dtable,
                                  const void *dout, const int32_t *ids, int n,
                                  int row0, int rows, int C, kcuda_dtype dt,
                                  kcuda_dtype table_dt, void *stream);

/* ---- norm.cu: layernorm and rmsnorm, plain and fused with the residual -- */

/* out = (x - mean) * rstd * w + b per row, rstd = 1 / sqrt(var + eps),
 * biased variance (two passes over the row, fp32). Saves mean and rstd.
 * out[rows,C] out; mean[rows], rstd[rows] out (fp32); x[rows,C]; w[C];
 * b[C] (may be NULL). */
int kcuda_layernorm_forward(void *out, float *mean, float *rstd,
                            const void *x, const void *w, const void *b,
                            int rows, int C, float eps, kcuda_dtype dt,
                            void *stream);

/* dx, dw, db += the gradients of layernorm from the saved mean and rstd.
 * dw and db are column sums over the rows, in a fixed order through the
 * context's scratch. dx[rows,C], dw[C], db[C] (each may be NULL);
 * dout[rows,C]; x[rows,C]; w[C]; mean[rows]; rstd[rows]. dw and db are of
 * dw_dt: dt, or KCUDA_F32 beside 2-byte tensors (fp32 main gradients,
 * added to in fp32). */
int kcuda_layernorm_backward(kcuda_ctx *ctx, void *dx, void *dw, void *db,
                             const void *dout, const void *x, const void *w,
                             const float *mean, const float *rstd, int rows,
                             int C, kcuda_dtype dt, kcuda_dtype dw_dt,
                             void *stream);

/* out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps). Saves rstd. */
int kcuda_rmsnorm_forward(void *out, float *rstd, const void *x,
                          const void *w, int rows, int C, float eps,
                          kcuda_dtype dt, void *stream);

/* dx, dw += the gradients of rmsnorm from the saved rstd (dx, dw may be
 * NULL; dw of dw_dt, as layernorm's). */
int kcuda_rmsnorm_backward(kcuda_ctx *ctx, void *dx, void *dw,
                           const void *dout, const void *x, const void *w,
                           const float *rstd, int rows, int C, kcuda_dtype dt,
                           kcuda_dtype dw_dt, void *stream);

/* The residual add fused with the norm that follows it, in one pass over
 * memory: res = a + b (stored in dt), then out = layernorm(res) exactly as
 * kcuda_layernorm_forward of the stored res (kcpu_add_forward followed by
 * kcpu_layernorm_forward). res may alias a or b. The backward is the two
 * backwards: kcuda_layernorm_backward with x = res, adding into the
 * residual stream's gradient, then kcuda_add_backward.
 * res[rows,C] out; out[rows,C] out; mean, rstd[rows] out; a, b[rows,C]. */
int kcuda_add_layernorm_forward(void *res, void *out, float *mean,
                                float *rstd, const void *a, const void *b,
                                const void *w, const void *bias, int rows,
                                int C, float eps, kcuda_dtype dt,
                                void *stream);
/* res = a + b, then out = rmsnorm(res). */
int kcuda_add_rmsnorm_forward(void *res, void *out, float *rstd,
                              const void *a, const void *b, const void *w,
                              int rows, int C, float eps, kcuda_dtype dt,
                              void *stream);

/* ---- activation.cu: elementwise activations ----------------------------- */

/* GELU, tanh approximation, computed as kcpu does: x / (1 + e^(-2u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3). out[n] (may alias x); x[n]. */
int kcuda_gelu_forward(void *out, const void *x, size_t n, kcuda_dtype dt,
                       void *stream);
/* dx += gelu'(x) * dout (assign: dx = ..., its old contents not read;
 * then dx may be dout itself: in place). */
int kcuda_gelu_backward(void *dx, const void *x, const void *dout, size_t n,
                        int assign, kcuda_dtype dt, void *stream);
/* SiLU: out = x * sigmoid(x). out may alias x. */
int kcuda_silu_forward(void *out, const void *x, size_t n, kcuda_dtype dt,
                       void *stream);
/* dx += silu'(x) * dout (assign as gelu's). */
int kcuda_silu_backward(void *dx, const void *x, const void *dout, size_t n,
                        int assign, kcuda_dtype dt, void *stream);
/* SwiGLU: out = silu(gate) * up. out may alias gate or up. */
int kcuda_swiglu_forward(void *out, const void *gate, const void *up,
                         size_t n, kcuda_dtype dt, void *stream);
/* dgate += silu'(gate) * up * dout, dup += silu(gate) * dout (each may be
 * NULL). */
int kcuda_swiglu_backward(void *dgate, void *dup, const void *dout,
                          const void *gate, const void *up, size_t n,
                          kcuda_dtype dt, void *stream);

/* ---- residual.cu: residual and broadcast (bias) adds -------------------- */

/* out = a + b. out may alias a or b. */
int kcuda_add_forward(void *out, const void *a, const void *b, size_t n,
                      kcuda_dtype dt, void *stream);
/* da += dout, db += dout (each may be NULL); assign (bits 0 and 1: da,
 * db): that one is overwritten, da = dout (a copy; its old contents need
 * not be zeroed). */
int kcuda_add_backward(void *da, void *db, const void *dout, size_t n,
                       int assign, kcuda_dtype dt, void *stream);
/* out[b,t,c] = a[b,t,c] + p[t,c] (a position embedding; with T = 1, a
 * bias). out[B,T,C] (may alias a); a[B,T,C]; p[T,C]. */
int kcuda_add_broadcast_forward(void *out, const void *a, const void *p,
                                int B, int T, int C, kcuda_dtype dt,
                                void *stream);
/* da += dout, dp[t,c] += sum over b of dout[b,t,c] (a fixed order,
 * through the context's scratch: kcuda_bias_backward's sums). da[B,T,C],
 * dp[T,C] (each may be NULL); dp of dp_dt: dt, or KCUDA_F32 beside 2-byte
 * tensors (an fp32 main gradient). da_assign: da = dout instead. */
int kcuda_add_broadcast_backward(kcuda_ctx *ctx, void *da, void *dp,
                                 const void *dout, int B, int T, int C,
                                 kcuda_dtype dt, kcuda_dtype dp_dt,
                                 int da_assign, void *stream);

/* ---- loss.cu: fused softmax + cross-entropy ----------------------------- */

/* kcpu_crossentropy_forward: softmax over the first V of Vp columns, the
 * loss per row, and the row maximum and lse = log(sum exp(logit - max))
 * saved for the backward (one pass over the row: an online max and sum,
 * combined in a fixed tree). mean_loss (device, may be NULL) gets the mean
 * of the losses, summed in double in a fixed order.
 * losses[N], rowmax[N], lse[N] out (fp32); logits[N,Vp]; targets[N]. */
int kcuda_crossentropy_forward(float *losses, float *rowmax, float *lse,
                               float *mean_loss, const void *logits,
                               const int32_t *targets, int N, int V, int Vp,
                               kcuda_dtype dt, void *stream);
/* dlogits += (softmax(logits) - onehot(target)) * dloss / N; the padded
 * columns [V, Vp) get nothing. dlogits[N,Vp]; logits[N,Vp]. */
int kcuda_crossentropy_backward(void *dlogits, const void *logits,
                                const int32_t *targets, const float *rowmax,
                                const float *lse, float dloss, int N, int V,
                                int Vp, kcuda_dtype dt, void *stream);
/* Forward and backward in one kernel (one block per row reads the row
 * twice, the second time from L2): the forward's outputs, and the
 * backward's gradient written over dlogits (0 in the padded columns),
 * which may be logits itself (the gradient in the logits' place). */
int kcuda_crossentropy_fused(float *losses, float *rowmax, float *lse,
                             float *mean_loss, void *dlogits,
                             const void *logits, const int32_t *targets,
                             float dloss, int N, int V, int Vp,
                             kcuda_dtype dt, void *stream);
/* Vocabulary-parallel pieces (kcpu_crossentropy_shard_*): a shard holds
 * columns [col0, col0 + W) of rows of W. x[2N] are doubles: the sums, then
 * the target logits. */
int kcuda_crossentropy_shard_max(float *rowmax, float *target_logit,
                                 const void *logits, const int32_t *targets,
                                 int N, int col0, int W, int V,
                                 kcuda_dtype dt, void *stream);
int kcuda_crossentropy_shard_sumexp(double *x, const float *target_logit,
                                    const void *logits, const float *rowmax,
                                    int N, int col0, int W, int V,
                                    kcuda_dtype dt, void *stream);
/* After the exchanges (kcpu_crossentropy_shard_rowmax, _finish; fp32 and
 * double whatever the logits' type): rowmax[N] from every shard's
 * all[P][N]; losses, lse [N] and *mean_loss from every shard's x,
 * all[P][2N] (overwritten). kcpu's bits but for the mean, summed in double
 * in a fixed order of the GPU's (as kcuda_crossentropy_forward's) and
 * log's last bit. */
int kcuda_crossentropy_shard_rowmax(float *rowmax, const float *all, int N,
                                    int P, void *stream);
int kcuda_crossentropy_shard_finish(float *mean_loss, float *losses,
                                    float *lse, double *all,
                                    const float *rowmax, int N, int P,
                                    void *stream);
/* assign: dlogits (every column of the shard, 0 past V) is overwritten,
 * not added to (its old contents need not be zeroed); with assign it may
 * be logits itself (each element is read, then written, by one thread). */
int kcuda_crossentropy_shard_backward(void *dlogits, const void *logits,
                                      const int32_t *targets,
                                      const float *rowmax, const float *lse,
                                      float dloss, int N, int col0, int W,
                                      int V, int assign, kcuda_dtype dt,
                                      void *stream);

/* ---- optim.cu: AdamW with fp32 master weights, norms, clipping ---------- */

/* kcpu_adamw_step on fp32 master weights, moments in fp32, gradients in
 * grad_dt; the same operations in the same order (no fused multiply-add),
 * so fp32 gives kcpu's bits. params_lp[n] (may be NULL) gets the updated
 * weights rounded to lp_dt (bf16, fp16), for a 2-byte forward. params[n],
 * m[n], v[n] updated; grads[n], each taken as kcuda_scale(grad_scale)
 * would leave it (the product in double, rounded to grad_dt; 1.0: as
 * they are), so that clipping costs no pass of its own. */
int kcuda_adamw_step(float *params, void *params_lp, kcuda_dtype lp_dt,
                     const void *grads, kcuda_dtype grad_dt,
                     double grad_scale, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps,
                     float weight_decay, int t, void *stream);

/* One tensor of kcuda_adamw_step_many: kcuda_adamw_step's arrays, size
 * and weight decay. */
typedef struct kcuda_adamw_tensor {
    float *params;
    void *params_lp; /* may be NULL */
    const void *grads;
    float *m, *v;
    size_t n;
    float weight_decay;
} kcuda_adamw_tensor;

/* kcuda_adamw_step on each of ts[count], all with the same dtypes,
 * gradient factor, rates and step t (each its own weight decay): each
 * tensor gets the bits of its own call, in one launch for every 24
 * tensors (a model's parameters in a handful, not one launch each). */
int kcuda_adamw_step_many(const kcuda_adamw_tensor *ts, int count, kcuda_dtype lp_dt, kcuda_dtype grad_dt,
                          double grad_scale, float lr, float beta1, float beta2, float eps, int t, void *stream);

/* y[n] += x[n] in fp32, x widened from x_dt (fp32 main gradients
 * accumulating an op's 2-byte contribution: kcpu_add_forward(y, y, x) on
 * widened x). */
int kcuda_accumulate(float *y, const void *x, kcuda_dtype x_dt, size_t n,
                     void *stream);

/* *ss += the sum of squares of buf[n], in double, in a fixed order (a
 * fixed grid's partial sums in the context's scratch, then one block):
 * kcpu_sum_squares over several buffers is a zeroed ss and one call each.
 * ss: one device double. */
int kcuda_sum_squares(kcuda_ctx *ctx, double *ss, const void *buf, size_t n,
                      kcuda_dtype dt, void *stream);
/* ss[b] += the sum of squares of bufs[b][n[b]] for each b < nbufs (all of
 * dtype dt), each the bits kcuda_sum_squares gives it, in two launches
 * for every 64 buffers (where a call a buffer takes two each: a model's
 * gradient norm in a handful, not two a parameter). ss: nbufs device
 * doubles. */
int kcuda_sum_squares_many(kcuda_ctx *ctx, double *ss, const void *const *bufs, const size_t *n, int nbufs,
                           kcuda_dtype dt, void *stream);
/* buf[n] = buf * scale (the product in double), kcpu_scale_buffers. */
int kcuda_scale(void *buf, size_t n, double scale, kcuda_dtype dt,
                void *stream);
/* Clipping without a host round trip: with norm = sqrt(*ss) (a device
 * double, e.g. from kcuda_sum_squares), buf *= max_norm / (norm + 1e-6)
 * when that is below 1 (kcpu_clip_global_norm's rule); call per buffer. */
int kcuda_clip_scale(void *buf, size_t n, const double *ss, float max_norm,
                     kcuda_dtype dt, void *stream);

/* ---- rope.cu: rotary embedding ------------------------------------------ */

/* kcpu_rope_forward: rotate-half RoPE, angles (pos0 + t) * theta^(-2j/d)
 * in double. out[B,T,H*d] (may equal x); x[B,T,H*d]; d even. */
int kcuda_rope_forward(void *out, const void *x, int B, int T, int H, int d,
                       float theta, int pos0, kcuda_dtype dt, void *stream);
/* dx += the inverse rotation of dout. */
int kcuda_rope_backward(void *dx, const void *dout, int B, int T, int H,
                        int d, float theta, int pos0, kcuda_dtype dt,
                        void *stream);

/* ---- attention.cu: causal grouped-query flash attention ----------------- */

/* softmax(q k^T / sqrt(d)) v per head, causal if `causal`: blocks of 64
 * query rows walk tiles of 64 keys in shared memory with an online softmax
 * (no T x T matrix anywhere), and save lse [B,H,T] (fp32) for the backward.
 * Query head h reads kv head h / (H / KV). Head sizes d <= 128 (padded to
 * 32, 64 or 128 inside). bf16 and fp16 run the tile products on tensor
 * cores (mma.sync, fp32 accumulation, P rounded to 2 bytes for P V); fp32
 * in plain fp32.
 * out[B,T,H*d]; lse[B,H,T]; q[B,T,H*d]; k, v[B,T,KV*d]. */
int kcuda_attention_forward(kcuda_ctx *ctx, void *out, float *lse, const void *q,
                            const void *k, const void *v, int B, int T, int H,
                            int KV, int d, int causal, kcuda_dtype dt,
                            void *stream);
/* dq, dk, dv += the gradients (kcpu_attention_backward), recomputing the
 * probabilities from q, k and lse. Deterministic without atomics: one
 * kernel owns each key tile (dk, dv, summing the H / KV query heads in
 * order), another each query tile (dq). Scratch: D = rowsum(dout * out),
 * B*H*T floats in the context. assign: dq (bit 0), dk (1), dv (2) are
 * overwritten, not added to (their old contents need not be zeroed). */
int kcuda_attention_backward(kcuda_ctx *ctx, void *dq, void *dk, void *dv,
                             const void *dout, const void *out,
                             const float *lse, const void *q, const void *k,
                             const void *v, int B, int T, int H, int KV,
                             int d, int causal, int assign, kcuda_dtype dt,
                             void *stream);
/* The packed layout: each row of qkv is H*d q, KV*d k, KV*d v channels
 * (kcpu_attention_qkv_*); read and accumulated in place (assign: dqkv
 * overwritten). */
int kcuda_attention_qkv_forward(kcuda_ctx *ctx, void *out, float *lse, const void *qkv,
                                int B, int T, int H, int KV, int d,
                                int causal, kcuda_dtype dt, void *stream);
int kcuda_attention_qkv_backward(kcuda_ctx *ctx, void *dqkv,
                                 const void *dout, const void *out,
                                 const float *lse, const void *qkv, int B,
                                 int T, int H, int KV, int d, int causal,
                                 int assign, kcuda_dtype dt, void *stream);
/* Tests: the attention kernels' grid takes at most `rows` (batch, head)
 * pairs in its y dimension (1..65535, CUDA's limit and the default; 0
 * restores it), the rest in z slices, so that a small case can run the
 * slices that B*H > 65535 needs. Not thread-safe: set it before launching. */
void kcuda_attention_grid_rows(int rows);
/* The forward's query rows a block: 64 (16 a warp, its queries' operands
 * held in registers in 2-byte types) or 128 (32 a warp,
 * each K and V fragment a warp loads serving two tiles of rows); 0, the
 * default, 64 at head sizes up to 64 and 128 for bf16 and fp16 above
 * (fp32: always 64). The same bits either way; for the benchmark and the
 * tests. Not thread-safe: set it before launching. */
void kcuda_attention_forward_rows(int rows);
/* The backward's kernels in bf16 and fp16 at head sizes 33 to 64
 * (GPT-2's) compiled for more blocks an SM (on: the dk/dv kernel 3, dq's
 * 4, against 2 and 4 with the registers they take, ptxas sm_90) or
 * not (0, the default). The same bits either way; for the benchmark (to
 * choose the default on a GPU) and the tests. Not thread-safe: set it
 * before launching. */
void kcuda_attention_backward_blocks(int on);
/* The attention in bf16 and fp16 (the forward and the default backward's
 * two main kernels; dq by atomics keeps mma.sync's) on warpgroup
 * products (wgmma: the tensor cores read the tiles from shared memory
 * once for the block's 4 warps) where the GPU runs the build's sm_90a
 * code (an H100 or H200: attention_wg.cu's probe says) and the rows are
 * in 16-byte packs; else, and by default (0), mma.sync's.
 * The results may differ from the default's in their last bits (the
 * products' internal order). Returns whether the current GPU takes it
 * (on, and the sm_90a code loaded). Not thread-safe: set it before
 * launching. */
int kcuda_attention_wgmma(int on);
/* Which of the default backward's two main kernels run (after the one
 * that computes D): both (0, the default), the dk/dv kernel alone (1: dq
 * left as it was) or dq's alone (2: dk and dv left as they were). For
 * the benchmark only, to time each without a profiler; the modes with dq
 * by atomics (kcuda_ctx_set_deterministic 0 and 2) ignore it. Not
 * thread-safe: set it before launching. */
void kcuda_attention_backward_only(int which);

/* ---- attention_cudnn.cu: the attention on cuDNN's fused kernels ---------- */

/* The context's attention in bf16 and fp16 (forward and backward, the
 * calls above) on cuDNN's fused flash attention where it takes the call
 * (on 1; 2: the forward only, the backward on this file's kernels from
 * cuDNN's lse), else on this file's kernels (0, the default). cuDNN is loaded
 * at the first call: the library MESH_CUDNN_LIB names, else
 * libcudnn.so.9 (then libcudnn_graph.so.9) from the loader's path;
 * libmesh does not link it. It declines (ours run, and the stats say why)
 * where there is no cuDNN 9, for fp32, head sizes not a multiple of 8 or
 * above 128, a mask other than causal, T < 2, rows not in 16-byte packs,
 * a backward that adds to any of dq, dk and dv, and a shape whose graph
 * cuDNN refuses. Its backward is cuDNN's deterministic one unless
 * kcuda_ctx_set_deterministic(ctx, 0). Its lse is the same [B,H,T]
 * natural-log logsumexp as ours, so either backward takes either
 * forward's. The results differ from ours in their last bits (other
 * sums, another rounding of P). Set it before the context's first
 * attention. */
void kcuda_ctx_set_attention_cudnn(kcuda_ctx *ctx, int on);
typedef struct kcuda_attention_cudnn_stats {
    size_t version;          /* cudnnGetVersion() (91900: 9.19.0); 0: no cuDNN */
    long calls[2];           /* forward, backward calls cuDNN ran */
    long declined[2];        /* calls left to this file's kernels */
    int plans, refused;      /* shapes whose graph built a plan, or not */
    char why_declined[320];  /* the last reason a call was declined */
    char why[320];           /* the last refusal, in cuDNN's words */
} kcuda_attention_cudnn_stats;
/* *st = what the context's attention did on cuDNN; returns whether it is
 * on (kcuda_ctx_set_attention_cudnn's 1 or 2; 0 off). */
int kcuda_ctx_attention_cudnn(kcuda_ctx *ctx, kcuda_attention_cudnn_stats *st);
/* Whether cuDNN (loaded as above) builds a plan for each of the
 * attention's graphs of a shape, forward and backward (deterministic or
 * not), in the packed qkv layout, on the GPU that device_json describes
 * (cuDNN's device properties as JSON, CUDNN_ATTR_DEVICEPROP_JSON_
 * REPRESENTATION): no GPU needed, so a machine with cuDNN's libraries
 * and none can check that the graphs are ones cuDNN has engines for.
 * cuDNN compiles its engines' kernels at the plan (NVRTC) and loads them
 * through the driver: without a GPU, a plan that compiled and failed only
 * to load (EXECUTION_FAILED_CUDA_DRIVER: the toolkit's stub libcuda.so.1
 * on the loader's path gives the compiler a driver to find, and the load
 * fails) counts as built. workspace (may be NULL): the bytes each plan
 * (forward, backward) asks for besides its tensors, -1 where none built.
 * 1 both built; 0 not (why: the first refusal, in cuDNN's words); -1 no
 * cuDNN (why says so). */
int kcuda_attention_cudnn_check(const char *device_json, kcuda_dtype dt, int B, int T, int H, int KV, int d,
                                int deterministic, long long workspace[2], char *why, size_t n);
/* One line of it for a log: "cuDNN 9.19.0: 24 forward and 24 backward
 * calls on it, ...". */
void kcuda_attention_cudnn_describe(const kcuda_attention_cudnn_stats *st, char *buf, size_t n);

/* ---- moe.cu: mixture-of-experts routing, dispatch, experts, combine ----- */

/* kcpu_moe_route (kcpu_moe.h, whose routing rules these follow exactly) in
 * device memory: every array is a device pointer, the two scalars too.
 * Routing is fp32 (the router product is small). */
typedef struct kcuda_moe_route {
    int N, E, K, C;
    int *expert;   /* [N, K] chosen experts, highest probability first */
    float *weight; /* [N, K] renormalised routing weights */
    int *slot;     /* [N, K] row in expert[n,k]'s buffer, -1 if dropped */
    int *token;    /* [E, C] token in each buffer row, -1 if empty */
    int *count;    /* [E] tokens kept per expert (<= C) */
    int *chosen;   /* [E] tokens that chose e, before capacity */
    float *probs;  /* [N, E] softmax of the router logits */
    double *pmean; /* [E] mean over tokens of probs[., e] */
    int *dropped;  /* [1] (token, expert) pairs dropped by capacity */
    float *aux;    /* [1] E * sum_e f_e P_e, without the coefficient */
} kcuda_moe_route;

/* Device bytes for the arrays (0 for sizes out of range) and binding them
 * into mem (a device allocation of that many bytes, 16-byte aligned);
 * bind returns KCUDA_ERR_ARG for sizes out of range. Capacity: use
 * kcpu_moe_capacity (host arithmetic). */
size_t kcuda_moe_route_bytes(int N, int E, int K, int C);
int kcuda_moe_route_bind(kcuda_moe_route *r, void *mem, int N, int E, int K,
                         int C);

/* Fill r from x @ router (a cuBLASLt product into r->probs, then one
 * thread per token for softmax and top-k, one block per expert for the
 * first-come-first-served slots). x[N,D]; router[D,E] (fp32). */
int kcuda_moe_route_forward(kcuda_ctx *ctx, kcuda_moe_route *r,
                            const float *x, const float *router, int D,
                            void *stream);
/* kcpu_moe_route_backward. dx[N,D], drouter[D,E] (+=); scratch[N,E]
 * (device); dweight[N,K]. */
int kcuda_moe_route_backward(kcuda_ctx *ctx, float *dx, float *drouter,
                             float *scratch, const float *dweight,
                             float aux_coef, const kcuda_moe_route *r,
                             const float *x, const float *router, int D,
                             void *stream);

/* xe[e, c] = x[token[e, c]], zero rows where the slot is empty.
 * xe[E,C,D]; x[N,D]. */
int kcuda_moe_dispatch_forward(void *xe, const void *x,
                               const kcuda_moe_route *r, int D,
                               kcuda_dtype dt, void *stream);
/* dx += the rows of dxe, a token's rows in ascending expert order (as the
 * CPU's loop adds them). One thread per (token, column): no conflicts. */
int kcuda_moe_dispatch_backward(void *dx, const void *dxe,
                                const kcuda_moe_route *r, int D,
                                kcuda_dtype dt, void *stream);
/* y[n] = sum over kept k of weight[n,k] * ye[expert[n,k], slot[n,k]]. */
int kcuda_moe_combine_forward(void *y, const void *ye,
                              const kcuda_moe_route *r, int D,
                              kcuda_dtype dt, void *stream);
/* dye += weight * dy at each kept (token, k)'s row; dweight[N,K] (fp32)
 * += dy . ye of that row. */
int kcuda_moe_combine_backward(void *dye, float *dweight, const void *dy,
                               const void *ye, const kcuda_moe_route *r,
                               int D, kcuda_dtype dt, void *stream);

/* SwiGLU experts (kcpu_moe_expert_*) as batched cuBLASLt products over the
 * E experts on all C rows of each buffer; rows at or past count[e] (a
 * device array, r->count) are masked so that ye is zero there and the
 * backward adds nothing from them, as on the CPU. Unlike the CPU, hg and
 * hu past count[e] are written (with whatever the product gives there) and
 * act there is zero; and the backward's dye must be finite on every row
 * (zero past count[e], as the executor fills it: dw_down's product runs
 * over all C rows, and 0 x NaN would be NaN). Backward scratch: 2*E*C*F
 * elements in the context. */
int kcuda_moe_expert_forward(kcuda_ctx *ctx, void *ye, void *hg, void *hu,
                             void *act, const void *xe, const void *w_gate,
                             const void *w_up, const void *w_down,
                             const int *count, int E, int C, int D, int F,
                             kcuda_dtype dt, void *stream);
int kcuda_moe_expert_backward(kcuda_ctx *ctx, void *dxe, void *dw_gate,
                              void *dw_up, void *dw_down, const void *dye,
                              const void *hg, const void *hu, const void *act,
                              const void *xe, const void *w_gate,
                              const void *w_up, const void *w_down,
                              const int *count, int E, int C, int D, int F,
                              kcuda_dtype dt, void *stream);

#ifdef __cplusplus
}
#endif

#endif
