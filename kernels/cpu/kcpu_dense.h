/* kcpu_dense.h — the dense CPU kernels (see kcpu.h for the conventions).
 *
 * Shapes are written row-major in brackets: x[M,K] is M rows of K floats.
 * Matrix dimensions are int (what cblas_sgemm takes); flat lengths of
 * elementwise ops and optimizer buffers are size_t. Every backward ADDS into
 * its gradient buffers (+=); a gradient pointer documented "(may be NULL)"
 * is skipped when NULL. Inputs and outputs must not alias unless a comment
 * says they may. Invalid arguments (a token id out of range, a negative
 * size) are internal errors: they are caught by assert, not reported.
 *
 * One area per file: matmul.c, embed.c, norm.c, activation.c, residual.c,
 * loss.c, optim.c, precision.c (the bf16 and fp16 rounding of mixed precision).
 */
#ifndef MESH_KCPU_DENSE_H
#define MESH_KCPU_DENSE_H

#include <stddef.h> /* defines: size_t */
#include <stdint.h> /* defines: int32_t */

/* ---- matmul.c: linear layers through cblas_sgemm ----------------------- */

/* y = x @ w + bias. Weights are stored [in, out], as the language does.
 * y[M,N] out; x[M,K]; w[K,N]; bias[N] (may be NULL). */
void kcpu_matmul_forward(float *y, const float *x, const float *w,
                         const float *bias, int M, int K, int N);

/* dx += dy @ w^T, dw += x^T @ dy, dbias += sum over rows of dy.
 * dx[M,K], dw[K,N], dbias[N] (each may be NULL); dy[M,N]; x[M,K]; w[K,N]. */
void kcpu_matmul_backward(float *dx, float *dw, float *dbias, const float *dy,
                          const float *x, const float *w, int M, int K,
                          int N);

/* y = x @ w^T + bias with w stored [out, in]: the tied LM head, where w is
 * the token embedding table [V,C] (N = V, K = C).
 * y[M,N] out; x[M,K]; w[N,K]; bias[N] (may be NULL). */
void kcpu_matmul_wt_forward(float *y, const float *x, const float *w,
                            const float *bias, int M, int K, int N);

/* dx += dy @ w, dw += dy^T @ x, dbias += sum over rows of dy.
 * dx[M,K], dw[N,K], dbias[N] (each may be NULL); dy[M,N]; x[M,K]; w[N,K]. */
void kcpu_matmul_wt_backward(float *dx, float *dw, float *dbias,
                             const float *dy, const float *x, const float *w,
                             int M, int K, int N);

/* ---- embed.c: token embedding lookup ----------------------------------- */

/* out[i,:] = table[ids[i],:], each id in [0, V).
 * out[n,C] out; ids[n]; table[V,C]. */
void kcpu_embedding_forward(float *out, const int32_t *ids,
                            const float *table, int n, int V, int C);

/* dtable[ids[i],:] += dout[i,:], in index order i = 0..n-1, so repeated ids
 * sum in a fixed order (deterministic).
 * dtable[V,C]; dout[n,C]; ids[n]. */
void kcpu_embedding_backward(float *dtable, const float *dout,
                             const int32_t *ids, int n, int V, int C);

/* Vocabulary-parallel forms: the table holds rows [row0, row0 + rows) of
 * the whole vocabulary. Forward: an id outside gives a zero row (the tp
 * ranks' outputs then sum to the lookup); backward: only ids inside add.
 * out[n,C]; ids[n]; table[rows,C]. */
void kcpu_embedding_rows_forward(float *out, const int32_t *ids, const float *table, int n, int row0, int rows,
                                 int C);
void kcpu_embedding_rows_backward(float *dtable, const float *dout, const int32_t *ids, int n, int row0, int rows,
                                  int C);

/* ---- norm.c: layernorm and rmsnorm over the last axis ------------------ */

/* out = (x - mean) * rstd * w + b per row, rstd = 1 / sqrt(var + eps) with
 * the biased variance. Saves mean and rstd for the backward.
 * out[rows,C] out; mean[rows] out; rstd[rows] out; x[rows,C]; w[C];
 * b[C] (may be NULL: no bias). */
void kcpu_layernorm_forward(float *out, float *mean, float *rstd,
                            const float *x, const float *w, const float *b,
                            int rows, int C, float eps);

/* dx, dw, db += the gradients of layernorm, from the saved mean and rstd.
 * dx[rows,C], dw[C], db[C] (each may be NULL); dout[rows,C]; x[rows,C];
 * w[C]; mean[rows]; rstd[rows]. */
void kcpu_layernorm_backward(float *dx, float *dw, float *db,
                             const float *dout, const float *x,
                             const float *w, const float *mean,
                             const float *rstd, int rows, int C);

/* out = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps). Saves rstd.
 * out[rows,C] out; rstd[rows] out; x[rows,C]; w[C]. */
void kcpu_rmsnorm_forward(float *out, float *rstd, const float *x,
                          const float *w, int rows, int C, float eps);

/* dx, dw += the gradients of rmsnorm, from the saved rstd.
 * dx[rows,C], dw[C] (each may be NULL); dout[rows,C]; x[rows,C]; w[C];
 * rstd[rows]. */
void kcpu_rmsnorm_backward(float *dx, float *dw, const float *dout,
                           const float *x, const float *w, const float *rstd,
                           int rows, int C);

/* ---- activation.c: elementwise activations ----------------------------- */

/* GELU, tanh approximation (GPT-2):
 * out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * out[n] out (may alias x); x[n]. */
void kcpu_gelu_forward(float *out, const float *x, size_t n);

/* dx += gelu'(x) * dout.  dx[n]; x[n]; dout[n]. */
void kcpu_gelu_backward(float *dx, const float *x, const float *dout,
                        size_t n);

/* d = gelu'(x) * d, in place: the GELU input's gradient from the output's,
 * the same bits as kcpu_gelu_backward into a zeroed dx (the fused matmul
 * and GELU backward's second half).  d[n]; x[n]. */
void kcpu_gelu_backward_inplace(float *d, const float *x, size_t n);

/* SiLU: out = x * sigmoid(x).  out[n] out (may alias x); x[n]. */
void kcpu_silu_forward(float *out, const float *x, size_t n);

/* dx += silu'(x) * dout.  dx[n]; x[n]; dout[n]. */
void kcpu_silu_backward(float *dx, const float *x, const float *dout,
                        size_t n);

/* SwiGLU: out = silu(gate) * up.
 * out[n] out (may alias gate or up); gate[n]; up[n]. */
void kcpu_swiglu_forward(float *out, const float *gate, const float *up,
                         size_t n);

/* dgate += silu'(gate) * up * dout, dup += silu(gate) * dout.
 * dgate[n], dup[n] (each may be NULL); dout[n]; gate[n]; up[n]. */
void kcpu_swiglu_backward(float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n);

/* ---- residual.c: residual and broadcast adds --------------------------- */

/* out = a + b.  out[n] out (may alias a or b); a[n]; b[n]. */
void kcpu_add_forward(float *out, const float *a, const float *b, size_t n);

/* da += dout, db += dout.  da[n], db[n] (each may be NULL); dout[n]. */
void kcpu_add_backward(float *da, float *db, const float *dout, size_t n);

/* out[b,t,c] = a[b,t,c] + p[t,c]: a [T,C] tensor (a position embedding)
 * added to every batch entry.
 * out[B,T,C] out (may alias a); a[B,T,C]; p[T,C]. */
void kcpu_add_broadcast_forward(float *out, const float *a, const float *p,
                                int B, int T, int C);

/* da += dout, dp[t,c] += sum over b of dout[b,t,c].
 * da[B,T,C], dp[T,C] (each may be NULL); dout[B,T,C]. */
void kcpu_add_broadcast_backward(float *da, float *dp, const float *dout,
                                 int B, int T, int C);

/* ---- loss.c: fused softmax + cross-entropy ----------------------------- */

/* Softmax over the first V of Vp columns of each row (the Vp - V padded
 * columns are ignored, whatever they hold), then the cross-entropy against
 * targets. Writes each row's loss, and saves only two floats per row for the
 * backward: the row maximum and lse = log(sum_j exp(logits - max)). Returns
 * the mean loss over the N rows (accumulated in double).
 * losses[N] out; rowmax[N] out; lse[N] out; logits[N,Vp]; targets[N], each
 * in [0, V); 1 <= V <= Vp. */
float kcpu_crossentropy_forward(float *losses, float *rowmax, float *lse,
                                const float *logits, const int32_t *targets,
                                int N, int V, int Vp);

/* dlogits += (softmax(logits) - onehot(target)) * dloss / N, the gradient
 * of dloss * (mean loss). The probabilities are recomputed from logits and
 * the saved rowmax and lse; the padded columns [V, Vp) get nothing.
 * dlogits[N,Vp]; logits[N,Vp]; targets[N]; rowmax[N]; lse[N]. */
void kcpu_crossentropy_backward(float *dlogits, const float *logits,
                                const int32_t *targets, const float *rowmax,
                                const float *lse, float dloss, int N, int V,
                                int Vp);

/* Vocabulary-parallel cross-entropy: a shard holds columns [col0, col0 +
 * W) of the logits (rows of W floats) of a vocabulary of V; columns at or
 * past V are padding. A rank computes its shard's row maxima and target
 * logits (0 where the target is elsewhere), the ranks take the maximum
 * and exchange sums of exp(logit - max), and the loss of row i is
 * log(sum) + max - target logit.
 * rowmax[N] out (-inf for a shard of padding); target_logit[N] out. */
void kcpu_crossentropy_shard_max(float *rowmax, float *target_logit, const float *logits, const int32_t *targets,
                                 int N, int col0, int W, int V);
/* What a shard gives the exchange of sums, x[2N] out: x[i] = the sum over
 * the shard's columns of exp(logit - rowmax[i]), in double, and x[N + i]
 * = target_logit[i] as a double. */
void kcpu_crossentropy_shard_sumexp(double *x, const float *target_logit, const float *logits, const float *rowmax,
                                    int N, int col0, int W, int V);
/* After the exchange of the shards' maxima (all[P][N], every shard's
 * rowmax in shard order): rowmax[i] = the largest of all[q N + i], taken
 * from q = 0 up (a later one replaces it only when greater). */
void kcpu_crossentropy_shard_rowmax(float *rowmax, const float *all, int N, int P);
/* After the exchange of every shard's x (kcpu_crossentropy_shard_sumexp's:
 * all[P][2N] doubles, shard order):
 * per row, sum = the sum over q (from q = 0, starting at 0.0) of
 * all[q 2N + i], t = that of all[q 2N + N + i]; lse[i] = (float)log(sum),
 * losses[i] = (float)(log(sum) - (t - rowmax[i])), and all[i] is
 * overwritten with that loss as a double. Returns the mean loss: the
 * double losses summed in row order, over N, as a float (the kcpu_
 * crossentropy_forward's mean of a whole row). */
float kcpu_crossentropy_shard_finish(float *losses, float *lse, double *all, const float *rowmax, int N, int P);
/* kcpu_crossentropy_backward on a shard: rowmax and lse are the whole
 * rows' (after the exchange). dlogits[N,W]; logits[N,W]. With dlogits ==
 * logits the gradient overwrites the logits (the columns past V zeroed):
 * the bits of a zeroed dlogits added to. */
void kcpu_crossentropy_shard_backward(float *dlogits, const float *logits, const int32_t *targets,
                                      const float *rowmax, const float *lse, float dloss, int N, int col0, int W,
                                      int V);

/* ---- optim.c: AdamW and global-norm clipping --------------------------- */

/* One AdamW step (t counts from 1), decoupled weight decay:
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr * ( (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
 *               + weight_decay * p )
 * params[n], m[n], v[n] updated; grads[n], each taken as
 * (float)(g * grad_scale) with the product in double, the value
 * kcpu_scale_buffers would leave (the clipping's and loss scale's factor
 * folded in: 1.0 takes them as they are). */
void kcpu_adamw_step(float *params, const float *grads, double grad_scale,
                     float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int t);

/* The sum of squares over all the buffers together, in double (the
 * square of kcpu_global_norm before rounding). */
double kcpu_sum_squares(const float *const *bufs, const size_t *sizes, int nbufs);

/* Every element of every buffer times scale (the product in double). */
void kcpu_scale_buffers(float *const *bufs, const size_t *sizes, int nbufs, double scale);

/* The L2 norm over all the buffers together, summed in double.
 * bufs[nbufs] each of sizes[i] floats. */
float kcpu_global_norm(const float *const *bufs, const size_t *sizes,
                       int nbufs);

/* Clip by global norm: scale every buffer by min(1, max_norm / (norm +
 * 1e-6)). Returns the norm before clipping.
 * bufs[nbufs] each of sizes[i] floats, updated. */
float kcpu_clip_global_norm(float *const *bufs, const size_t *sizes,
                            int nbufs, float max_norm);

/* ---- precision.c: storage precisions ---------------------------------- */

/* The storage type a mixed-precision run keeps its values in. */
typedef enum kcpu_precision { KCPU_FP32, KCPU_BF16, KCPU_FP16 } kcpu_precision;

/* x rounded to the nearest bfloat16 number (ties to even; NaN stays NaN,
 * floats past bf16's largest round to infinity). */
float kcpu_bf16_round(float x);

/* x rounded to the nearest IEEE binary16 number (ties to even, subnormals
 * below 2^-14 in steps of 2^-24); past 65504 (from 65520 on) it is
 * infinity, as a GPU's conversion gives. */
float kcpu_fp16_round(float x);

/* x[n] rounded in place to precision p (KCPU_FP32: unchanged). */
void kcpu_round(float *x, size_t n, kcpu_precision p);

/* 2-byte storage of precision p (KCPU_BF16: the top half of a binary32;
 * KCPU_FP16: IEEE binary16): dst[n] <- src[n] rounded as kcpu_round
 * rounds; and back, exactly. */
void kcpu_pack16(uint16_t *dst, const float *src, size_t n, kcpu_precision p);
void kcpu_unpack16(float *dst, const uint16_t *src, size_t n, kcpu_precision p);

#endif
