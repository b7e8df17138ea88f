/* kern.h — the kernels the executor runs, on its device (internal to
 * libmesh).
 *
 * A small function table (kern_vtbl) and its state (kern), as comm.h's
 * communicators and device.h's devices are. The executor (exec_ops.c,
 * exec_step.c) calls every kernel through it, so one executor trains on
 * either device:
 *   - "cpu"  (kern_cpu.c): the CPU kernels (kernels/cpu, kcpu.h), the
 *     reference; every call is finished when it returns.
 *   - "cuda" (kern_cuda.c, built with make CUDA=1): the CUDA kernels
 *     (kernels/cuda, kcuda.h) on the device's stream, with fp32, bf16 or
 *     fp16 storage (kern.half); calls are asynchronous, and the one that
 *     returns numbers to the host (sum_squares) waits for the stream.
 * With CUDA=0 the cuda table's open says libmesh was built without it.
 *
 * Tensors are device pointers (host pointers on the CPU) to fp32 elements,
 * or 2-byte ones (bf16, fp16) with kern.half (`float *` arguments are fp32
 * always: statistics, AdamW's masters and moments); token ids are int32. Shapes, what a forward overwrites and what a
 * backward ADDS into (+=) are the kcpu function's of the same name
 * (kcpu_dense.h, kcpu_attention.h). Every call returns 0, or -1 with the
 * message in kern_last_error(): "cuda: kcuda_matmul_forward: ..." (the
 * executor adds the op and the rank).
 */
#ifndef MESH_KERN_H
#define MESH_KERN_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "device.h" /* dev */

typedef struct kern kern;

/* A moe layer's routing: N tokens of width D over E experts, the top K of
 * each, C rows per expert (the capacity). */
typedef struct kern_moe_dims {
    int N, D, E, K, C;
} kern_moe_dims;

/* One tensor of kern_vtbl.adamw_many: adamw_step's arrays, size and
 * weight decay. */
typedef struct kern_adamw {
    float *params;
    void *params_lp;
    const void *grads;
    float *m, *v;
    size_t n;
    float weight_decay;
} kern_adamw;

typedef struct kern_vtbl {
    const char *name; /* "cpu", "cuda" */
    /* sets up k on k->d (a cuBLASLt context, a little device scratch);
     * returns 0 or -1 with k->error */
    int (*open)(kern *k);
    void (*close)(kern *k);
    int (*matmul_forward)(kern *k, void *y, const void *x, const void *w, int M, int K, int N);
    int (*matmul_backward)(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M,
                           int K, int N);
    /* y = x @ w + bias (bias [N]); with gelu, pre = x @ w + bias and y =
     * gelu(pre): one kernel on a GPU (cuBLASLt's epilogues) */
    int (*matmul_bias_forward)(kern *k, void *y, void *pre, const void *x, const void *w, const void *bias, int M,
                               int K, int N, int gelu);
    /* the backward of y = gelu(pre) @ w, x = gelu(pre) its input, the
     * GELU's with the product's: dpre = gelu'(pre) * (dy @ w^T), always
     * overwritten, and dw += x^T @ dy: one kernel on a GPU (cuBLASLt's DGELU
     * epilogue), the product's gradient never stored */
    int (*matmul_gelu_backward)(kern *k, void *dpre, void *dw, const void *dy, const void *x, const void *w,
                                const void *pre, int M, int K, int N);
    int (*matmul_wt_forward)(kern *k, void *y, const void *x, const void *w, int M, int K, int N);
    int (*matmul_wt_backward)(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M,
                              int K, int N);
    int (*embedding_rows_forward)(kern *k, void *out, const int32_t *ids, const void *table, int n, int row0,
                                  int rows, int C);
    int (*embedding_rows_backward)(kern *k, void *dtable, const void *dout, const int32_t *ids, int n, int row0,
                                   int rows, int C);
    int (*arange)(kern *k, int32_t *out, size_t n); /* out[i] = i */
    int (*add_forward)(kern *k, void *out, const void *a, const void *b, size_t n);
    int (*add_backward)(kern *k, void *da, void *db, const void *dout, size_t n);
    int (*add_broadcast_forward)(kern *k, void *out, const void *a, const void *p, int B, int T, int C);
    int (*add_broadcast_backward)(kern *k, void *da, void *dp, const void *dout, int B, int T, int C);
    int (*layernorm_forward)(kern *k, void *out, float *mean, float *rstd, const void *x, const void *w,
                             const void *b, int rows, int C, float eps);
    int (*layernorm_backward)(kern *k, void *dx, void *dw, void *db, const void *dout, const void *x,
                              const void *w, const float *mean, const float *rstd, int rows, int C);
    int (*rmsnorm_forward)(kern *k, void *out, float *rstd, const void *x, const void *w, int rows, int C,
                           float eps);
    int (*rmsnorm_backward)(kern *k, void *dx, void *dw, const void *dout, const void *x, const void *w,
                            const float *rstd, int rows, int C);
    /* the residual add and the norm after it, one pass on a GPU: res = a +
     * b, stored, then out = layernorm(res) (mean, rstd; bias may be NULL)
     * or with rms rmsnorm(res) (rstd; mean and bias unused), the same
     * numbers as add_forward then layernorm_forward or rmsnorm_forward */
    int (*add_norm_forward)(kern *k, void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                            const void *w, const void *bias, int rows, int C, float eps, int rms);
    int (*attention_forward)(kern *k, void *out, float *lse, const void *q, const void *kk, const void *v, int B,
                             int T, int H, int KV, int d, int causal);
    int (*attention_backward)(kern *k, void *dq, void *dk, void *dv, const void *dout, const void *out,
                              const float *lse, const void *q, const void *kk, const void *v, int B, int T,
                              int H, int KV, int d, int causal);
    int (*attention_qkv_forward)(kern *k, void *out, float *lse, const void *qkv, int B, int T, int H, int KV,
                                 int d, int causal);
    int (*attention_qkv_backward)(kern *k, void *dqkv, const void *dout, const void *out, const float *lse,
                                  const void *qkv, int B, int T, int H, int KV, int d, int causal);
    int (*rope_forward)(kern *k, void *out, const void *x, int B, int T, int H, int d, float theta);
    int (*rope_backward)(kern *k, void *dx, const void *dout, int B, int T, int H, int d, float theta);
    int (*gelu_forward)(kern *k, void *out, const void *x, size_t n);
    /* (dx may be dout itself, with kern.assign: in place, memplan's grad_alias) */
    int (*gelu_backward)(kern *k, void *dx, const void *x, const void *dout, size_t n);
    int (*silu_forward)(kern *k, void *out, const void *x, size_t n);
    int (*silu_backward)(kern *k, void *dx, const void *x, const void *dout, size_t n);
    int (*swiglu_forward)(kern *k, void *out, const void *gate, const void *up, size_t n);
    int (*swiglu_backward)(kern *k, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                           size_t n);
    /* the whole vocabulary's rows (Vp columns, V real): losses, rowmax,
     * lse [N] each, and the mean loss (one float): fp32, on the device;
     * with dlogits (NULL: none) the backward's too, in the same pass where
     * the device can: the gradient for dloss written over dlogits (0 past
     * V), which may be logits itself (mem_buf.grad_in_value) */
    int (*crossentropy_forward)(kern *k, float *mean, float *losses, float *rowmax, float *lse,
                                const void *logits, const int32_t *targets, void *dlogits, float dloss, int N,
                                int V, int Vp);
    /* the vocabulary-parallel pieces: each row's maximum and target logit
     * (if in [col0, col0 + W)) over this shard's columns, and its sum of
     * exp(logit - rowmax) in double beside its target logit as a double
     * (x: 2N doubles, on the device) */
    int (*crossentropy_shard_max)(kern *k, float *rowmax, float *target_logit, const void *logits,
                                  const int32_t *targets, int N, int col0, int W, int V);
    int (*crossentropy_shard_sumexp)(kern *k, double *x, const float *target_logit, const void *logits,
                                     const float *rowmax, int N, int col0, int W, int V);
    /* after the exchanges (kcpu_crossentropy_shard_rowmax, _finish; fp32
     * or double, on the device): the rows' maxima from every shard's
     * (all[P][N]); the losses, lse and the mean loss (one float) from
     * every shard's sums and target logits (all[P][2N], overwritten) */
    int (*crossentropy_shard_rowmax)(kern *k, float *rowmax, const float *all, int N, int P);
    int (*crossentropy_shard_finish)(kern *k, float *mean, float *losses, float *lse, double *all,
                                     const float *rowmax, int N, int P);
    int (*crossentropy_shard_backward)(kern *k, void *dlogits, const void *logits, const int32_t *targets,
                                       const float *rowmax, const float *lse, float dloss, int N, int col0, int W,
                                       int V);
    /* The param gradients' calls: sum_squares' and adamw_step's grads
     * are the gradients' type (fp32 with kern.grad32, else the tensors').
     * ss[b] = the sum of squares of bufs[b][0..n[b]), in double, to the
     * host (the one call that waits for the device) */
    int (*sum_squares)(kern *k, double *ss, void *const *bufs, const size_t *n, int nbufs);
    /* params (fp32) updated; params_lp (may be NULL; the GPU's bf16 weights)
     * gets them rounded. Each gradient is taken as g * gscale (the product
     * in double, rounded to the gradients' type: clipping and the loss
     * scale's factor; 1.0: as it is); a backend may leave the scaled
     * gradients in grads. */
    int (*adamw_step)(kern *k, float *params, void *params_lp, const void *grads, double gscale, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t);
    /* y (fp32) += x, in fp32: x in the tensors' type (an op's contribution
     * to fp32 gradients), or fp32 when x_f32 */
    int (*accumulate)(kern *k, float *y, const void *x, size_t n, int x_f32);
    /* mixture of experts (kcpu_moe.h: the routing rules, shapes, and what
     * each call overwrites or adds into). `route` is device memory of
     * moe_route_bytes (16-byte aligned), laid out by the backend;
     * moe_route_count points at its [E] kept counts (no memory is
     * touched). Routing, dweight and scratch are fp32; x, the router and
     * the experts' buffers are the tensors' storage type. route_forward
     * writes the aux loss (without its coefficient) to *aux, one fp32
     * float on the device. */
    size_t (*moe_route_bytes)(int N, int E, int K, int C);
    int *(*moe_route_count)(void *route, const kern_moe_dims *g);
    int (*moe_route_forward)(kern *k, void *route, float *aux, const void *x, const void *router,
                             const kern_moe_dims *g);
    int (*moe_route_backward)(kern *k, void *dx, void *drouter, float *scratch, const float *dweight, float aux_coef,
                              const void *route, const void *x, const void *router, const kern_moe_dims *g);
    int (*moe_dispatch_forward)(kern *k, void *xe, const void *x, const void *route, const kern_moe_dims *g);
    int (*moe_dispatch_backward)(kern *k, void *dx, const void *dxe, const void *route, const kern_moe_dims *g);
    int (*moe_combine_forward)(kern *k, void *y, const void *ye, const void *route, const kern_moe_dims *g);
    int (*moe_combine_backward)(kern *k, void *dye, float *dweight, const void *dy, const void *ye, const void *route,
                                const kern_moe_dims *g);
    /* E experts (a rank's local ones) on the rows of xe; scratch [2, C, F] */
    int (*moe_expert_forward)(kern *k, void *ye, void *hg, void *hu, void *act, const void *xe, const void *w_gate,
                              const void *w_up, const void *w_down, const int *count, int E, int C, int D, int F);
    int (*moe_expert_backward)(kern *k, void *dxe, void *dw_gate, void *dw_up, void *dw_down, float *scratch,
                               const void *dye, const void *hg, const void *hu, const void *act, const void *xe,
                               const void *w_gate, const void *w_up, const void *w_down, const int *count, int E,
                               int C, int D, int F);
    /* optional (NULL in the CPU tables): what one of the device's options
     * did (kern_report), in words, into buf; -1 when it is off */
    int (*report)(kern *k, int what, char *buf, size_t n);
    /* optional (NULL: the executor calls adamw_step a tensor): adamw_step
     * on each of ts[count] (the same gradient factor, rates and step; each
     * its own weight decay), each tensor's bits those of its own call, in
     * few launches on a GPU */
    int (*adamw_many)(kern *k, const kern_adamw *ts, int count, double gscale, float lr, float beta1, float beta2,
                      float eps, int t);
} kern_vtbl;

/* The options kern_vtbl's report speaks of. */
enum {
    KERN_REPORT_GEMM_TUNING,    /* the matmuls' algorithms timed (MESH_GEMM_TUNE=1) */
    KERN_REPORT_ATTENTION_CUDNN /* the attention on cuDNN (MESH_ATTN_CUDNN=1) */
};

/* The table's entries after open and close, in kern_vtbl's order: each
 * backend names its functions after them (static in its file), so a table
 * is {"name", open, close, KERN_ENTRIES, report or NULL, adamw_many or
 * NULL}. */
#define KERN_ENTRIES \
    matmul_forward, matmul_backward, matmul_bias_forward, matmul_gelu_backward, matmul_wt_forward, matmul_wt_backward, \
    embedding_rows_forward, embedding_rows_backward, arange, add_forward, add_backward, add_broadcast_forward, \
    add_broadcast_backward, layernorm_forward, layernorm_backward, rmsnorm_forward, rmsnorm_backward, add_norm_forward, \
    attention_forward, attention_backward, attention_qkv_forward, attention_qkv_backward, rope_forward, \
    rope_backward, gelu_forward, gelu_backward, silu_forward, silu_backward, swiglu_forward, swiglu_backward, \
    crossentropy_forward, crossentropy_shard_max, crossentropy_shard_sumexp, crossentropy_shard_rowmax, \
    crossentropy_shard_finish, crossentropy_shard_backward, \
    sum_squares, adamw_step, accumulate, moe_route_bytes, moe_route_count, moe_route_forward, \
    moe_route_backward, moe_dispatch_forward, moe_dispatch_backward, moe_combine_forward, moe_combine_backward, \
    moe_expert_forward, moe_expert_backward

struct kern {
    const kern_vtbl *v;
    dev *d;            /* the device the tensors live on (not owned) */
    void *stream;      /* the device's stream (a cudaStream_t; NULL: the default) */
    void *impl;        /* the backend's own state */
    int half;          /* 2-byte float tensors: KERN_BF16 or KERN_FP16 (a GPU's, or kern_cpu16's);
                          0: fp32 (the CPU keeps mixed precision in fp32 words) */
    int grad32;        /* the param gradients are fp32 (sum_squares, adamw_step): mixed
                          precision's main gradients, set by the executor */
    int dw32;          /* the weight gradients a call sums over rows are fp32 (a param's main
                          gradient, added to in fp32), while the executor sets it around the
                          call: dw of matmul_backward, matmul_gelu_backward and matmul_wt_backward, dtable of
                          embedding_rows_backward, dw and db of layernorm_backward, dw of
                          rmsnorm_backward, dp of add_broadcast_backward */
    int assign;        /* bit k: the call's k-th input gradient is overwritten, not added to
                          (the executor did not zero it: every element is written), set by the
                          executor around the call: dx of matmul_backward and
                          matmul_wt_backward, dlogits of crossentropy_shard_backward, dx of
                          gelu_backward and silu_backward (bit 0); da, db of add_backward (bits
                          0, 1); da of add_broadcast_backward; dq, dk, dv of attention_backward
                          (bits 0..2); dqkv of attention_qkv_backward */
    char error[1024];  /* why the last call failed */
};

extern const kern_vtbl kern_cpu_vtbl;
extern const kern_vtbl kern_cuda_vtbl; /* with CUDA=0, open fails: built without CUDA */
extern const kern_vtbl kern_cpu16_vtbl; /* tests: the CPU kernels on 2-byte storage (kern_cpu16.c) */

/* k's table for device d (dev's name "cpu" or "cuda"), with 2-byte storage
 * (half: KERN_BF16 or KERN_FP16; on the CPU: kern_cpu16.c, the tests'
 * stand-in for a GPU's layout) or fp32 (0): opened, 0; or -1 with the
 * message in err[n].
 * kern_close(k) frees what open made. */
enum { KERN_BF16 = 1, KERN_FP16 = 2 };
int kern_open(kern *k, dev *d, int half, char *err, size_t n);
void kern_close(kern *k);

#endif
