/* kern_cuda.c — the executor's kernels on a CUDA GPU (kern.h): the CUDA
 * kernels (kernels/cuda, kcuda.h) in fp32, bf16 or fp16, on the kern's stream, with one
 * cuBLASLt context and a little device scratch (sums of squares on their
 * way to the host, moe's fp32 copies of 2-byte tensors). Built for real with
 * make CUDA=1 (MESH_CUDA=1); otherwise open says libmesh has no CUDA.
 */
#include "kern.h"

#include <pthread.h> /* pthread_once */
#include <stdint.h>  /* uintptr_t */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* atoi, calloc, free, getenv */
#include <string.h>  /* memset, strcmp */

#if MESH_CUDA

#include "kcuda.h" /* kcuda_* */

/* the storage type of the float tensors */
#define DT(k) ((k)->half == KERN_BF16 ? KCUDA_BF16 : (k)->half == KERN_FP16 ? KCUDA_F16 : KCUDA_F32)
#define GT(k) ((k)->grad32 ? KCUDA_F32 : DT(k)) /* the param gradients' type */
#define WT(k) ((k)->dw32 ? KCUDA_F32 : DT(k))   /* a weight gradient's, kern.dw32 */

typedef struct cuda_kern {
    kcuda_ctx *ctx;
    void *dss;      /* device: sum_squares' results (doubles) */
    size_t dss_cap; /* its bytes */
    void *tmp;      /* device: fp32 copies for moe's routing of 2-byte tensors */
    size_t tmp_cap; /* its bytes */
    size_t counted; /* the bytes of these counted in the device's `held` */
} cuda_kern;

#define CTX(k) (((cuda_kern *)(k)->impl)->ctx)

/* The device's `held` (the kernels' bytes beside the plan's arena: its
 * OOM messages, mesh_context_kernel_memory) made to count what this kern
 * holds now: cuBLASLt's workspace, the context's scratch (which an op
 * grows), dss and tmp. */
static void recount(kern *k)
{
    cuda_kern *c = k->impl;
    if (!c || !c->ctx) return;
    size_t now = KCUDA_WORKSPACE_BYTES + kcuda_ctx_scratch_bytes(c->ctx) + c->dss_cap + c->tmp_cap;
    k->d->held = k->d->held - c->counted + now;
    c->counted = now;
}

/* 0, or -1 with "cuda:N (GPU): NAME: kcuda's message" in k->error; a full
 * device says how full, as dev_alloc does: of `bytes` allocated for
 * `what` when known (bytes > 0; else the bytes an op's scratch could not
 * grow to, kcuda_failed_alloc_bytes), else beside kcuda's message. The
 * kernels' bytes are the device's `held`, counted again first (recount:
 * after a failed growth the scratch holds nothing). */
static int check_alloc(kern *k, const char *name, int rc, const char *what, size_t bytes)
{
    recount(k);
    if (rc == 0) return 0;
    size_t free_bytes = 0, total = 0;
    int full = kcuda_out_of_memory(rc), info = full && dev_mem_info(k->d, &free_bytes, &total) == MESH_OK;
    char text[400];
    if (full && bytes == 0 && (bytes = kcuda_failed_alloc_bytes()) > 0)
        what = "the kernels' scratch (cudaMallocAsync)";
    if (full && bytes > 0) {
        dev_oom_text(text, sizeof text, what, bytes, k->d->planned, k->d->held, info, free_bytes, total);
        snprintf(k->error, sizeof k->error, "%s: %s: %.800s", k->d->name, name, text);
    } else if (info) {
        snprintf(k->error, sizeof k->error, "%s: %s: %s (the device has %zu free of %zu)", k->d->name, name,
                 kcuda_last_error(), free_bytes, total);
    } else {
        snprintf(k->error, sizeof k->error, "%s: %s: %s", k->d->name, name, kcuda_last_error());
    }
    return -1;
}

static int check(kern *k, const char *name, int rc) { return check_alloc(k, name, rc, NULL, 0); }

static int from_dev(kern *k, const char *name, mesh_status st)
{
    if (st == MESH_OK) return 0;
    snprintf(k->error, sizeof k->error, "%s (%s)", dev_last_error(k->d), name);
    return -1;
}

#define KC(name, ...) return check(k, #name, name(__VA_ARGS__))

/* *buf, of *cap bytes, made `bytes` long when shorter: stream-ordered
 * (kcuda_alloc: no wait for the device's other streams). NULL, with the
 * error, if that fails. */
static void *grown(kern *k, void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap) return *buf;
    void *p = NULL, *old = *buf;
    *buf = NULL;
    *cap = 0;
    if (check(k, "kcuda_free", kcuda_free(old, k->stream)) ||
        check_alloc(k, "kcuda_alloc", kcuda_alloc(&p, bytes, k->stream), "cudaMallocAsync", bytes))
        return NULL;
    *cap = bytes;
    recount(k);
    return *buf = p;
}

static void cuda_close(kern *k);

/* The attention kernels' layouts that gpu_bench compares, for a training
 * step to try them (tests/gpu/run.sh's train_gpt2): MESH_ATTN_FWD_ROWS,
 * the forward's query rows a block (64 or 128,
 * kcuda_attention_forward_rows), and MESH_ATTN_BWD_BLOCKS=1, the
 * backward's kernels compiled for more blocks an SM
 * (kcuda_attention_backward_blocks); the same bits either way; and
 * MESH_ATTN_WGMMA=1, the attention on warpgroup products where the GPU
 * takes them (kcuda_attention_wgmma: an H100 or H200; the last bits
 * may differ). Unset, the kernels' defaults. Process-wide, set once,
 * at the first open (every rank reads the same environment). */
static pthread_once_t attn_layouts_once = PTHREAD_ONCE_INIT;

static void attn_layouts(void)
{
    const char *rows = getenv("MESH_ATTN_FWD_ROWS"), *blocks = getenv("MESH_ATTN_BWD_BLOCKS");
    const char *wg = getenv("MESH_ATTN_WGMMA");
    if (rows && *rows) kcuda_attention_forward_rows(atoi(rows));
    if (blocks && *blocks) kcuda_attention_backward_blocks(atoi(blocks));
    if (wg && *wg) (void)kcuda_attention_wgmma(atoi(wg));
}

/* Which of vals[0..n) the environment's `name` is: its index; -1 when it
 * is unset or empty; else -2 with the error ("expected A, B or C"). */
static int env_choice(kern *k, const char *name, const char *const *vals, int n)
{
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(v, vals[i]) == 0) return i;
    int w = snprintf(k->error, sizeof k->error, "%s=%.100s: expected ", name, v);
    for (int i = 0; i < n && w >= 0 && (size_t)w < sizeof k->error; i++)
        w += snprintf(k->error + w, sizeof k->error - (size_t)w, "%s%s", vals[i],
                      i + 2 < n ? ", " : i + 1 < n ? " or " : "");
    return -2;
}

#define ENV_CHOICE(k, name, ...)                                                                                  \
    env_choice(k, name, (const char *const[]){__VA_ARGS__},                                                       \
               (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)))

static int cuda_open(kern *k)
{
    cuda_kern *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(k->error, sizeof k->error, "%s: out of host memory", k->d->name);
        return -1;
    }
    k->impl = c;
    if (check_alloc(k, "kcuda_ctx_create", kcuda_ctx_create(&c->ctx), "cudaMalloc (cuBLASLt's workspace)",
                    KCUDA_WORKSPACE_BYTES) != 0) {
        free(c);
        k->impl = NULL;
        return -1;
    }
    recount(k); /* (cuBLASLt's workspace) */
    /* the kernels' own stream, non-blocking: no implicit waits for (or
     * of) the legacy default stream, which a program embedding libmesh,
     * or another rank sharing the GPU, may use */
    dev_stream *s = NULL;
    if (from_dev(k, "the kernels' stream", dev_stream_create(k->d, &s)) != 0) {
        cuda_close(k);
        return -1;
    }
    k->stream = s;
    /* MESH_DETERMINISTIC=0: the attention backward's dq by atomics in any
     * order; 2: the same in turns; 1 (the default): dq's own kernel
     * (docs/gpu.md, Determinism) */
    /* MESH_GEMM_TUNE=1: each product's cuBLASLt algorithm timed at its
     * shape's first call, among those that give the default's bits
     * (kcuda_ctx_set_gemm_tune 1). MESH_ATTN_CUDNN=1: the attention on
     * cuDNN's fused kernels where it takes the call; fwd: its forward
     * only, the backward on ours (kcuda_ctx_set_attention_cudnn 1, 2: the
     * values' indices). MESH_TF32=1: fp32 products on TF32 tensor cores
     * (kcuda_ctx_set_tf32). The first of them set to something else
     * stops. */
    int tune = -1, cudnn = -1, tf32 = -1, det = -1;
    if ((det = ENV_CHOICE(k, "MESH_DETERMINISTIC", "0", "1", "2")) == -2 ||
        ENV_CHOICE(k, "MESH_ATTN_FWD_ROWS", "64", "128") == -2 || ENV_CHOICE(k, "MESH_ATTN_BWD_BLOCKS", "0", "1") == -2 ||
        ENV_CHOICE(k, "MESH_ATTN_WGMMA", "0", "1") == -2 || (tune = ENV_CHOICE(k, "MESH_GEMM_TUNE", "0", "1")) == -2 ||
        (cudnn = ENV_CHOICE(k, "MESH_ATTN_CUDNN", "0", "1", "fwd")) == -2 ||
        (tf32 = ENV_CHOICE(k, "MESH_TF32", "0", "1")) == -2) {
        cuda_close(k);
        return -1;
    }
    if (det == 0 || det == 2) kcuda_ctx_set_deterministic(c->ctx, det);
    if (tune > 0) kcuda_ctx_set_gemm_tune(c->ctx, tune);
    if (cudnn > 0) kcuda_ctx_set_attention_cudnn(c->ctx, cudnn);
    if (tf32 > 0) kcuda_ctx_set_tf32(c->ctx, 1);
    pthread_once(&attn_layouts_once, attn_layouts);
    return 0;
}

static void cuda_close(kern *k)
{
    cuda_kern *c = k->impl;
    if (!c) return;
    (void)kcuda_free(c->dss, k->stream); /* (kcuda_ctx_free waits for the device) */
    (void)kcuda_free(c->tmp, k->stream);
    kcuda_ctx_free(c->ctx);
    k->d->held -= c->counted;
    dev_stream_destroy(k->d, (dev_stream *)k->stream); /* (idle: kcuda_ctx_free waited for the device) */
    k->stream = NULL;
    free(c);
    k->impl = NULL;
}

static int matmul_forward(kern *k, void *y, const void *x, const void *w, int M, int K, int N)
{
    KC(kcuda_matmul_forward, CTX(k), y, NULL, x, w, NULL, M, K, N, KCUDA_EPI_NONE, DT(k), k->stream);
}

static int matmul_backward(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M, int K,
                           int N)
{
    KC(kcuda_matmul_backward, CTX(k), dx, dw, NULL, dy, x, w, M, K, N, DT(k), WT(k), k->assign, k->stream);
}

/* The bias (and GELU) in cuBLASLt's epilogue where it offers one. */
static int matmul_bias_forward(kern *k, void *y, void *pre, const void *x, const void *w, const void *bias, int M,
                               int K, int N, int gelu)
{
    KC(kcuda_matmul_forward, CTX(k), y, gelu ? pre : NULL, x, w, bias, M, K, N, gelu ? KCUDA_EPI_GELU : KCUDA_EPI_NONE,
       DT(k), k->stream);
}

/* The GELU's gradient in cuBLASLt's epilogue where it offers one. */
static int matmul_gelu_backward(kern *k, void *dpre, void *dw, const void *dy, const void *x, const void *w,
                                const void *pre, int M, int K, int N)
{
    KC(kcuda_matmul_gelu_backward, CTX(k), dpre, dw, dy, x, w, pre, M, K, N, DT(k), WT(k), k->stream);
}

static int matmul_wt_forward(kern *k, void *y, const void *x, const void *w, int M, int K, int N)
{
    KC(kcuda_matmul_wt_forward, CTX(k), y, x, w, NULL, M, K, N, DT(k), k->stream);
}

static int matmul_wt_backward(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M,
                              int K, int N)
{
    KC(kcuda_matmul_wt_backward, CTX(k), dx, dw, NULL, dy, x, w, M, K, N, DT(k), WT(k), k->assign,
       k->stream);
}

static int embedding_rows_forward(kern *k, void *out, const int32_t *ids, const void *table, int n, int row0,
                                  int rows, int C)
{
    KC(kcuda_embedding_rows_forward, out, ids, table, n, row0, rows, C, DT(k), k->stream);
}

static int embedding_rows_backward(kern *k, void *dtable, const void *dout, const int32_t *ids, int n, int row0,
                                   int rows, int C)
{
    KC(kcuda_embedding_rows_backward, CTX(k), dtable, dout, ids, n, row0, rows, C, DT(k), WT(k), k->stream);
}

static int arange(kern *k, int32_t *out, size_t n)
{
    KC(kcuda_arange, out, n, k->stream);
}

static int add_forward(kern *k, void *out, const void *a, const void *b, size_t n)
{
    KC(kcuda_add_forward, out, a, b, n, DT(k), k->stream);
}

static int add_backward(kern *k, void *da, void *db, const void *dout, size_t n)
{
    KC(kcuda_add_backward, da, db, dout, n, k->assign, DT(k), k->stream);
}

static int add_broadcast_forward(kern *k, void *out, const void *a, const void *p, int B, int T, int C)
{
    KC(kcuda_add_broadcast_forward, out, a, p, B, T, C, DT(k), k->stream);
}

static int add_broadcast_backward(kern *k, void *da, void *dp, const void *dout, int B, int T, int C)
{
    KC(kcuda_add_broadcast_backward, CTX(k), da, dp, dout, B, T, C, DT(k), WT(k), k->assign & 1, k->stream);
}

static int layernorm_forward(kern *k, void *out, float *mean, float *rstd, const void *x, const void *w,
                             const void *b, int rows, int C, float eps)
{
    KC(kcuda_layernorm_forward, out, mean, rstd, x, w, b, rows, C, eps, DT(k), k->stream);
}

static int add_norm_forward(kern *k, void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                            const void *w, const void *bias, int rows, int C, float eps, int rms)
{
    if (rms) KC(kcuda_add_rmsnorm_forward, res, out, rstd, a, b, w, rows, C, eps, DT(k), k->stream);
    KC(kcuda_add_layernorm_forward, res, out, mean, rstd, a, b, w, bias, rows, C, eps, DT(k), k->stream);
}

static int layernorm_backward(kern *k, void *dx, void *dw, void *db, const void *dout, const void *x, const void *w,
                              const float *mean, const float *rstd, int rows, int C)
{
    KC(kcuda_layernorm_backward, CTX(k), dx, dw, db, dout, x, w, mean, rstd, rows, C, DT(k), WT(k), k->stream);
}

static int rmsnorm_forward(kern *k, void *out, float *rstd, const void *x, const void *w, int rows, int C,
                           float eps)
{
    KC(kcuda_rmsnorm_forward, out, rstd, x, w, rows, C, eps, DT(k), k->stream);
}

static int rmsnorm_backward(kern *k, void *dx, void *dw, const void *dout, const void *x, const void *w,
                            const float *rstd, int rows, int C)
{
    KC(kcuda_rmsnorm_backward, CTX(k), dx, dw, dout, x, w, rstd, rows, C, DT(k), WT(k), k->stream);
}

static int attention_forward(kern *k, void *out, float *lse, const void *q, const void *kk, const void *v, int B,
                             int T, int H, int KV, int d, int causal)
{
    KC(kcuda_attention_forward, CTX(k), out, lse, q, kk, v, B, T, H, KV, d, causal, DT(k), k->stream);
}

static int attention_backward(kern *k, void *dq, void *dk, void *dv, const void *dout, const void *out,
                              const float *lse, const void *q, const void *kk, const void *v, int B, int T, int H,
                              int KV, int d, int causal)
{
    KC(kcuda_attention_backward, CTX(k), dq, dk, dv, dout, out, lse, q, kk, v, B, T, H, KV, d, causal, k->assign & 7,
       DT(k), k->stream);
}

static int attention_qkv_forward(kern *k, void *out, float *lse, const void *qkv, int B, int T, int H, int KV,
                                 int d, int causal)
{
    KC(kcuda_attention_qkv_forward, CTX(k), out, lse, qkv, B, T, H, KV, d, causal, DT(k), k->stream);
}

static int attention_qkv_backward(kern *k, void *dqkv, const void *dout, const void *out, const float *lse,
                                  const void *qkv, int B, int T, int H, int KV, int d, int causal)
{
    KC(kcuda_attention_qkv_backward, CTX(k), dqkv, dout, out, lse, qkv, B, T, H, KV, d, causal, k->assign & 1, DT(k),
       k->stream);
}

static int rope_forward(kern *k, void *out, const void *x, int B, int T, int H, int d, float theta)
{
    KC(kcuda_rope_forward, out, x, B, T, H, d, theta, 0, DT(k), k->stream);
}

static int rope_backward(kern *k, void *dx, const void *dout, int B, int T, int H, int d, float theta)
{
    KC(kcuda_rope_backward, dx, dout, B, T, H, d, theta, 0, DT(k), k->stream);
}

static int gelu_forward(kern *k, void *out, const void *x, size_t n)
{
    KC(kcuda_gelu_forward, out, x, n, DT(k), k->stream);
}

static int gelu_backward(kern *k, void *dx, const void *x, const void *dout, size_t n)
{
    KC(kcuda_gelu_backward, dx, x, dout, n, k->assign & 1, DT(k), k->stream);
}

static int silu_forward(kern *k, void *out, const void *x, size_t n)
{
    KC(kcuda_silu_forward, out, x, n, DT(k), k->stream);
}

static int silu_backward(kern *k, void *dx, const void *x, const void *dout, size_t n)
{
    KC(kcuda_silu_backward, dx, x, dout, n, k->assign & 1, DT(k), k->stream);
}

static int swiglu_forward(kern *k, void *out, const void *gate, const void *up, size_t n)
{
    KC(kcuda_swiglu_forward, out, gate, up, n, DT(k), k->stream);
}

static int swiglu_backward(kern *k, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                           size_t n)
{
    KC(kcuda_swiglu_backward, dgate, dup, dout, gate, up, n, DT(k), k->stream);
}

static int crossentropy_forward(kern *k, float *mean, float *losses, float *rowmax, float *lse, const void *logits,
                                const int32_t *targets, void *dlogits, float dloss, int N, int V, int Vp)
{
    if (dlogits) /* one kernel: the row read once more, from L2 */
        KC(kcuda_crossentropy_fused, losses, rowmax, lse, mean, dlogits, logits, targets, dloss, N, V, Vp, DT(k),
           k->stream);
    KC(kcuda_crossentropy_forward, losses, rowmax, lse, mean, logits, targets, N, V, Vp, DT(k), k->stream);
}

static int crossentropy_shard_max(kern *k, float *rowmax, float *target_logit, const void *logits,
                                  const int32_t *targets, int N, int col0, int W, int V)
{
    KC(kcuda_crossentropy_shard_max, rowmax, target_logit, logits, targets, N, col0, W, V, DT(k), k->stream);
}

static int crossentropy_shard_sumexp(kern *k, double *x, const float *target_logit, const void *logits,
                                     const float *rowmax, int N, int col0, int W, int V)
{
    KC(kcuda_crossentropy_shard_sumexp, x, target_logit, logits, rowmax, N, col0, W, V, DT(k), k->stream);
}

static int crossentropy_shard_rowmax(kern *k, float *rowmax, const float *all, int N, int P)
{
    KC(kcuda_crossentropy_shard_rowmax, rowmax, all, N, P, k->stream);
}

static int crossentropy_shard_finish(kern *k, float *mean, float *losses, float *lse, double *all,
                                     const float *rowmax, int N, int P)
{
    KC(kcuda_crossentropy_shard_finish, mean, losses, lse, all, rowmax, N, P, k->stream);
}

static int crossentropy_shard_backward(kern *k, void *dlogits, const void *logits, const int32_t *targets,
                                       const float *rowmax, const float *lse, float dloss, int N, int col0, int W,
                                       int V)
{
    KC(kcuda_crossentropy_shard_backward, dlogits, logits, targets, rowmax, lse, dloss, N, col0, W, V, k->assign,
       DT(k), k->stream);
}

/* Every buffer's sum into the device scratch (a few launches for them
 * all), then one copy back. */
static int sum_squares(kern *k, double *ss, void *const *bufs, const size_t *n, int nbufs)
{
    cuda_kern *c = k->impl;
    dev_stream *s = (dev_stream *)k->stream;
    if (nbufs <= 0) return 0;
    double *dss = grown(k, &c->dss, &c->dss_cap, (size_t)nbufs * sizeof(double));
    if (!dss) return -1;
    if (from_dev(k, "sums of squares", dev_memset(k->d, dss, 0, (size_t)nbufs * sizeof(double), s))) return -1;
    if (check(k, "kcuda_sum_squares_many",
              kcuda_sum_squares_many(c->ctx, dss, (const void *const *)bufs, n, nbufs, GT(k), k->stream)))
        return -1;
    if (from_dev(k, "sums of squares", dev_copy(k->d, ss, dss, (size_t)nbufs * sizeof(double),
                                                DEV_DEVICE_TO_HOST, s)))
        return -1;
    return from_dev(k, "sums of squares", dev_stream_sync(k->d, s));
}

static int adamw_step(kern *k, float *params, void *params_lp, const void *grads, double gscale, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t)
{
    KC(kcuda_adamw_step, params, params_lp, DT(k), grads, GT(k), gscale, m, v, n, lr, beta1, beta2, eps, weight_decay,
       t, k->stream);
}

/* kcuda_adamw_step_many over the tensors, in chunks of a host array of
 * kcuda's layout. */
static int adamw_many(kern *k, const kern_adamw *ts, int count, double gscale, float lr, float beta1, float beta2,
                      float eps, int t)
{
    enum { CHUNK = 96 };
    kcuda_adamw_tensor buf[CHUNK];
    for (int b0 = 0; b0 < count; b0 += CHUNK) {
        int n = count - b0 < CHUNK ? count - b0 : CHUNK;
        for (int b = 0; b < n; b++) {
            const kern_adamw *x = &ts[b0 + b];
            buf[b] = (kcuda_adamw_tensor){x->params, x->params_lp, x->grads, x->m, x->v, x->n, x->weight_decay};
        }
        if (check(k, "kcuda_adamw_step_many",
                  kcuda_adamw_step_many(buf, n, DT(k), GT(k), gscale, lr, beta1, beta2, eps, t, k->stream)))
            return -1;
    }
    return 0;
}

static int accumulate(kern *k, float *y, const void *x, size_t n, int x_f32)
{
    KC(kcuda_accumulate, y, x, x_f32 ? KCUDA_F32 : DT(k), n, k->stream);
}

/* ---- mixture of experts: the routing arrays bound in the route memory at
 * each call (binding touches no memory). The routing kernels are fp32: with
 * 2-byte tensors, x and the router are converted into the kern's scratch,
 * and the gradients are summed there and added into the 2-byte ones. ---- */

static size_t moe_route_bytes(int N, int E, int K, int C) { return kcuda_moe_route_bytes(N, E, K, C); }

static kcuda_moe_route moe_bind(const void *route, const kern_moe_dims *g)
{
    kcuda_moe_route r;
    memset(&r, 0, sizeof r);
    kcuda_moe_route_bind(&r, (void *)(uintptr_t)route, g->N, g->E, g->K, g->C);
    return r;
}

static int *moe_route_count(void *route, const kern_moe_dims *g) { return moe_bind(route, g).count; }

/* n floats of device scratch, grown when short. */
static float *scratch_floats(kern *k, size_t n)
{
    cuda_kern *c = k->impl;
    return grown(k, &c->tmp, &c->tmp_cap, n * sizeof(float));
}

/* x [N, D] and the router [D, E] as fp32: themselves, or copies in tmp. */
static int moe_fp32_inputs(kern *k, const float **xf, const float **rf, const void *x, const void *router,
                           const kern_moe_dims *g, size_t extra)
{
    size_t nd = (size_t)g->N * (size_t)g->D, de = (size_t)g->D * (size_t)g->E;
    if (!k->half) {
        *xf = x;
        *rf = router;
        return extra && !scratch_floats(k, extra) ? -1 : 0;
    }
    float *t = scratch_floats(k, nd + de + extra);
    if (!t) return -1;
    if (check(k, "kcuda_convert", kcuda_convert(t, KCUDA_F32, x, DT(k), nd, k->stream)) ||
        check(k, "kcuda_convert", kcuda_convert(t + nd, KCUDA_F32, router, DT(k), de, k->stream)))
        return -1;
    *xf = t;
    *rf = t + nd;
    return 0;
}

/* The aux loss copied on the device, where the caller wants it. */
static int moe_route_forward(kern *k, void *route, float *aux, const void *x, const void *router,
                             const kern_moe_dims *g)
{
    kcuda_moe_route r = moe_bind(route, g);
    const float *xf, *rf;
    if (moe_fp32_inputs(k, &xf, &rf, x, router, g, 0) ||
        check(k, "kcuda_moe_route_forward", kcuda_moe_route_forward(CTX(k), &r, xf, rf, g->D, k->stream)))
        return -1;
    return from_dev(k, "moe's aux loss",
                    dev_copy(k->d, aux, r.aux, sizeof *aux, DEV_DEVICE_TO_DEVICE, (dev_stream *)k->stream));
}

/* With 2-byte tensors, dx and drouter are summed in fp32 scratch (after
 * x's and the router's copies), rounded to the storage type after them
 * (each 256-byte aligned) and added into the 2-byte gradients. */
static int moe_route_backward(kern *k, void *dx, void *drouter, float *scratch, const float *dweight, float aux_coef,
                              const void *route, const void *x, const void *router, const kern_moe_dims *g)
{
    kcuda_moe_route r = moe_bind(route, g);
    size_t nd = (size_t)g->N * (size_t)g->D, de = (size_t)g->D * (size_t)g->E;
    size_t half = (nd / 2 + 64) & ~(size_t)63; /* floats holding nd 2-byte ones, rounded to 256 bytes */
    const float *xf, *rf;
    if (moe_fp32_inputs(k, &xf, &rf, x, router, g, k->half ? nd + de + half + de : 0)) return -1;
    if (!k->half)
        KC(kcuda_moe_route_backward, CTX(k), dx, drouter, scratch, dweight, aux_coef, &r, xf, rf, g->D, k->stream);
    float *dxf = (float *)((cuda_kern *)k->impl)->tmp + nd + de, *drf = dxf + nd, *dx_lp = drf + de, *dr_lp = dx_lp + half;
    if (from_dev(k, "moe's fp32 scratch",
                 dev_memset(k->d, dxf, 0, (nd + de) * sizeof(float), (dev_stream *)k->stream)) ||
        check(k, "kcuda_moe_route_backward",
              kcuda_moe_route_backward(CTX(k), dxf, drf, scratch, dweight, aux_coef, &r, xf, rf, g->D, k->stream)) ||
        check(k, "kcuda_convert", kcuda_convert(dx_lp, DT(k), dxf, KCUDA_F32, nd, k->stream)) ||
        check(k, "kcuda_convert", kcuda_convert(dr_lp, DT(k), drf, KCUDA_F32, de, k->stream)) ||
        check(k, "kcuda_add_forward", kcuda_add_forward(dx, dx, dx_lp, nd, DT(k), k->stream)))
        return -1;
    KC(kcuda_add_forward, drouter, drouter, dr_lp, de, DT(k), k->stream);
}

static int moe_dispatch_forward(kern *k, void *xe, const void *x, const void *route, const kern_moe_dims *g)
{
    kcuda_moe_route r = moe_bind(route, g);
    KC(kcuda_moe_dispatch_forward, xe, x, &r, g->D, DT(k), k->stream);
}

static int moe_dispatch_backward(kern *k, void *dx, const void *dxe, const void *route, const kern_moe_dims *g)
{
    kcuda_moe_route r = moe_bind(route, g);
    KC(kcuda_moe_dispatch_backward, dx, dxe, &r, g->D, DT(k), k->stream);
}

static int moe_combine_forward(kern *k, void *y, const void *ye, const void *route, const kern_moe_dims *g)
{
    kcuda_moe_route r = moe_bind(route, g);
    KC(kcuda_moe_combine_forward, y, ye, &r, g->D, DT(k), k->stream);
}

static int moe_combine_backward(kern *k, void *dye, float *dweight, const void *dy, const void *ye, const void *route,
                                const kern_moe_dims *g)
{
    kcuda_moe_route r = moe_bind(route, g);
    KC(kcuda_moe_combine_backward, dye, dweight, dy, ye, &r, g->D, DT(k), k->stream);
}

static int moe_expert_forward(kern *k, void *ye, void *hg, void *hu, void *act, const void *xe, const void *w_gate,
                              const void *w_up, const void *w_down, const int *count, int E, int C, int D, int F)
{
    KC(kcuda_moe_expert_forward, CTX(k), ye, hg, hu, act, xe, w_gate, w_up, w_down, count, E, C, D, F, DT(k),
       k->stream);
}

/* The context holds the backward's scratch (scratch is the CPU's). */
static int moe_expert_backward(kern *k, void *dxe, void *dw_gate, void *dw_up, void *dw_down, float *scratch,
                               const void *dye, const void *hg, const void *hu, const void *act, const void *xe,
                               const void *w_gate, const void *w_up, const void *w_down, const int *count, int E,
                               int C, int D, int F)
{
    (void)scratch;
    KC(kcuda_moe_expert_backward, CTX(k), dxe, dw_gate, dw_up, dw_down, dye, hg, hu, act, xe, w_gate, w_up, w_down,
       count, E, C, D, F, DT(k), k->stream);
}

/* What the matmul tuning (MESH_GEMM_TUNE=1) or the attention on cuDNN
 * (MESH_ATTN_CUDNN=1) did, or -1 when it is off. */
static int report(kern *k, int what, char *buf, size_t n)
{
    const cuda_kern *c = k->impl;
    if (!c) return -1;
    if (what == KERN_REPORT_GEMM_TUNING) {
        kcuda_gemm_tune_stats st;
        if (kcuda_ctx_gemm_tune_stats(c->ctx, &st) == 0) return -1;
        kcuda_gemm_tune_describe(&st, buf, n);
        return 0;
    }
    kcuda_attention_cudnn_stats st;
    if (what != KERN_REPORT_ATTENTION_CUDNN || kcuda_ctx_attention_cudnn(c->ctx, &st) == 0) return -1;
    kcuda_attention_cudnn_describe(&st, buf, n);
    return 0;
}

const kern_vtbl kern_cuda_vtbl = {"cuda", cuda_open, cuda_close, KERN_ENTRIES, report, adamw_many};

#else /* no CUDA in this build */

static int nocuda_open(kern *k)
{
    snprintf(k->error, sizeof k->error, "cuda: this libmesh was built without CUDA (make CUDA=1)");
    return -1;
}

/* kern_open never hands out this table: only open is called. */
const kern_vtbl kern_cuda_vtbl = {.name = "cuda", .open = nocuda_open};

#endif
