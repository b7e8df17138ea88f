/* kern_cpu16.c — the CPU kernels on a GPU's 2-byte storage (kern.h), for
 * tests: the float tensors are bf16 or fp16 arrays (kern.half), as the
 * CUDA table keeps them, and each call widens its tensors to fp32 scratch,
 * runs the CPU kernel (kern_cpu.c) and rounds what it wrote back (ties to
 * even).
 *
 * So the executor's GPU layout of a bf16 or fp16 plan (2-byte activations,
 * weights and gradients, the plan's own memory plan) runs on a machine
 * without a GPU, through every path a GPU takes (ZeRO's shards, tp's
 * conversions, the pipeline's transfers, moe's exchanges, fp16's loss
 * scale), and is checked against the CPU's own mixed-precision runs, which
 * keep the same numbers in 4-byte words: a kernel rounds its results once
 * when it stores them, as the CPU rounds each op's results. fp32 arguments
 * (statistics, AdamW's masters and moments, moe's routing) pass through.
 * Slow: every call converts.
 */
#include "kern.h"

#include <stdint.h> /* uint16_t */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, realloc, free */

#include "kcpu.h" /* kcpu_pack16, kcpu_unpack16 */

enum { SLOTS = 16 };

/* The call's fp32 copies: slot i widens t[i] (n[i] elements), written back
 * if back[i]. */
typedef struct c16 {
    float *f[SLOTS];
    size_t cap[SLOTS];
    void *t[SLOTS];
    size_t n[SLOTS];
    int back[SLOTS];
    int used, failed;
} c16;

#define CPU kern_cpu_vtbl

static c16 *self(kern *k) { return k->impl; }

/* The storage's rounding: bf16 or fp16. */
static kcpu_precision prec(const kern *k) { return k->half == KERN_FP16 ? KCPU_FP16 : KCPU_BF16; }

static int c16_open(kern *k)
{
    if (!(k->impl = calloc(1, sizeof(c16)))) {
        snprintf(k->error, sizeof k->error, "cpu16: out of host memory");
        return -1;
    }
    return 0;
}

static void c16_close(kern *k)
{
    c16 *c = self(k);
    for (int i = 0; c && i < SLOTS; i++) free(c->f[i]);
    free(c);
    k->impl = NULL;
}

/* An fp32 copy of the 2-byte tensor t[n] (NULL for NULL), written back to t
 * when the call ends if back. */
static float *widen(kern *k, const void *t, size_t n, int back)
{
    c16 *c = self(k);
    if (!t || c->failed) return NULL;
    for (int j = 0; j < c->used; j++) /* a tensor passed twice (x + x's gradients): one copy, as one memory */
        if (c->t[j] == t && c->n[j] == n) {
            c->back[j] |= back;
            return c->f[j];
        }
    int i = c->used;
    if (i == SLOTS) {
        c->failed = 1;
        snprintf(k->error, sizeof k->error, "cpu16: more than %d tensors in one call", SLOTS);
        return NULL;
    }
    if (c->cap[i] < n) {
        float *f = realloc(c->f[i], (n ? n : 1) * sizeof *f);
        if (!f) {
            c->failed = 1;
            snprintf(k->error, sizeof k->error, "cpu16: out of host memory (%zu floats)", n);
            return NULL;
        }
        c->f[i] = f;
        c->cap[i] = n;
    }
    kcpu_unpack16(c->f[i], t, n, prec(k));
    c->t[i] = (void *)(uintptr_t)t;
    c->n[i] = n;
    c->back[i] = back;
    c->used++;
    return c->f[i];
}

#define IN(p, n) widen(k, (p), (size_t)(n), 0)
#define IO(p, n) widen(k, (p), (size_t)(n), 1)

/* The call's end: what it wrote rounded back to 2 bytes; its result, or -1
 * when a copy could not be made (then the kernel did not run). */
static int end(kern *k, int rc)
{
    c16 *c = self(k);
    for (int i = 0; i < c->used; i++)
        if (c->back[i] && !c->failed) kcpu_pack16(c->t[i], c->f[i], c->n[i], prec(k));
    rc = c->failed ? -1 : rc;
    c->used = c->failed = 0;
    return rc;
}

/* Runs the CPU kernel on the copies, unless making them failed. */
#define RUN(call) return end(k, self(k)->failed ? -1 : (call))

static int matmul_forward(kern *k, void *y, const void *x, const void *w, int M, int K, int N)
{
    float *Y = IO(y, (size_t)M * N), *X = IN(x, (size_t)M * K), *W = IN(w, (size_t)K * N);
    RUN(CPU.matmul_forward(k, Y, X, W, M, K, N));
}

static int matmul_backward(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M, int K,
                           int N)
{
    float *DX = IO(dx, (size_t)M * K), *DW = k->dw32 ? dw : IO(dw, (size_t)K * N); /* (dw32: fp32) */
    float *DY = IN(dy, (size_t)M * N), *X = IN(x, (size_t)M * K), *W = IN(w, (size_t)K * N);
    RUN(CPU.matmul_backward(k, DX, DW, DY, X, W, M, K, N));
}

static int matmul_bias_forward(kern *k, void *y, void *pre, const void *x, const void *w, const void *bias, int M,
                               int K, int N, int gelu)
{
    float *Y = IO(y, (size_t)M * N), *P = IO(pre, (size_t)M * N), *X = IN(x, (size_t)M * K);
    float *W = IN(w, (size_t)K * N), *B = IN(bias, N);
    RUN(CPU.matmul_bias_forward(k, Y, P, X, W, B, M, K, N, gelu));
}

/* In fp32 on the copies, rounded once as one GPU kernel stores dpre. */
static int matmul_gelu_backward(kern *k, void *dpre, void *dw, const void *dy, const void *x, const void *w,
                                const void *pre, int M, int K, int N)
{
    float *DP = IO(dpre, (size_t)M * K), *DW = k->dw32 ? dw : IO(dw, (size_t)K * N); /* (dw32: fp32) */
    float *DY = IN(dy, (size_t)M * N), *X = IN(x, (size_t)M * K), *W = IN(w, (size_t)K * N);
    float *P = IN(pre, (size_t)M * K);
    RUN(CPU.matmul_gelu_backward(k, DP, DW, DY, X, W, P, M, K, N));
}

static int matmul_wt_forward(kern *k, void *y, const void *x, const void *w, int M, int K, int N)
{
    float *Y = IO(y, (size_t)M * N), *X = IN(x, (size_t)M * K), *W = IN(w, (size_t)N * K);
    RUN(CPU.matmul_wt_forward(k, Y, X, W, M, K, N));
}

static int matmul_wt_backward(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M,
                              int K, int N)
{
    float *DX = IO(dx, (size_t)M * K), *DW = k->dw32 ? dw : IO(dw, (size_t)N * K); /* (dw32: fp32) */
    float *DY = IN(dy, (size_t)M * N), *X = IN(x, (size_t)M * K), *W = IN(w, (size_t)N * K);
    RUN(CPU.matmul_wt_backward(k, DX, DW, DY, X, W, M, K, N));
}

static int embedding_rows_forward(kern *k, void *out, const int32_t *ids, const void *table, int n, int row0,
                                  int rows, int C)
{
    float *O = IO(out, (size_t)n * C), *T = IN(table, (size_t)rows * C);
    RUN(CPU.embedding_rows_forward(k, O, ids, T, n, row0, rows, C));
}

static int embedding_rows_backward(kern *k, void *dtable, const void *dout, const int32_t *ids, int n, int row0,
                                   int rows, int C)
{
    float *DT = k->dw32 ? dtable : IO(dtable, (size_t)rows * C), *DO = IN(dout, (size_t)n * C); /* (dw32: fp32) */
    RUN(CPU.embedding_rows_backward(k, DT, DO, ids, n, row0, rows, C));
}

static int arange(kern *k, int32_t *out, size_t n) { return CPU.arange(k, out, n); }

static int add_forward(kern *k, void *out, const void *a, const void *b, size_t n)
{
    float *O = IO(out, n), *A = IN(a, n), *B = IN(b, n);
    RUN(CPU.add_forward(k, O, A, B, n));
}

static int add_backward(kern *k, void *da, void *db, const void *dout, size_t n)
{
    float *DA = IO(da, n), *DB = IO(db, n), *DO = IN(dout, n);
    RUN(CPU.add_backward(k, DA, DB, DO, n));
}

static int add_broadcast_forward(kern *k, void *out, const void *a, const void *p, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    float *O = IO(out, n), *A = IN(a, n), *P = IN(p, (size_t)T * C);
    RUN(CPU.add_broadcast_forward(k, O, A, P, B, T, C));
}

static int add_broadcast_backward(kern *k, void *da, void *dp, const void *dout, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    float *DA = IO(da, n), *DP = k->dw32 ? dp : IO(dp, (size_t)T * C), *DO = IN(dout, n); /* (dw32: fp32) */
    RUN(CPU.add_broadcast_backward(k, DA, DP, DO, B, T, C));
}

static int layernorm_forward(kern *k, void *out, float *mean, float *rstd, const void *x, const void *w,
                             const void *b, int rows, int C, float eps)
{
    size_t n = (size_t)rows * C;
    float *O = IO(out, n), *X = IN(x, n), *W = IN(w, C), *B = IN(b, C);
    RUN(CPU.layernorm_forward(k, O, mean, rstd, X, W, B, rows, C, eps));
}

/* (the norm reads the sum as stored: rounded first, as the GPU's kernel does) */
static int add_norm_forward(kern *k, void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                            const void *w, const void *bias, int rows, int C, float eps, int rms)
{
    size_t n = (size_t)rows * C;
    float *R = IO(res, n), *O = IO(out, n), *A = IN(a, n), *B = IN(b, n), *W = IN(w, C), *BI = IN(bias, C);
    if (self(k)->failed) RUN(-1);
    CPU.add_forward(k, R, A, B, n);
    kcpu_round(R, n, prec(k));
    if (rms) RUN(CPU.rmsnorm_forward(k, O, rstd, R, W, rows, C, eps));
    RUN(CPU.layernorm_forward(k, O, mean, rstd, R, W, BI, rows, C, eps));
}

static int layernorm_backward(kern *k, void *dx, void *dw, void *db, const void *dout, const void *x, const void *w,
                              const float *mean, const float *rstd, int rows, int C)
{
    size_t n = (size_t)rows * C;
    float *DX = IO(dx, n), *DO = IN(dout, n), *X = IN(x, n), *W = IN(w, C);
    float *DW = k->dw32 ? dw : IO(dw, C), *DB = k->dw32 ? db : IO(db, C); /* (dw32: fp32) */
    RUN(CPU.layernorm_backward(k, DX, DW, DB, DO, X, W, mean, rstd, rows, C));
}

static int rmsnorm_forward(kern *k, void *out, float *rstd, const void *x, const void *w, int rows, int C, float eps)
{
    size_t n = (size_t)rows * C;
    float *O = IO(out, n), *X = IN(x, n), *W = IN(w, C);
    RUN(CPU.rmsnorm_forward(k, O, rstd, X, W, rows, C, eps));
}

static int rmsnorm_backward(kern *k, void *dx, void *dw, const void *dout, const void *x, const void *w,
                            const float *rstd, int rows, int C)
{
    size_t n = (size_t)rows * C;
    float *DX = IO(dx, n), *DO = IN(dout, n), *X = IN(x, n), *W = IN(w, C);
    float *DW = k->dw32 ? dw : IO(dw, C); /* (dw32: fp32) */
    RUN(CPU.rmsnorm_backward(k, DX, DW, DO, X, W, rstd, rows, C));
}

static int attention_forward(kern *k, void *out, float *lse, const void *q, const void *kk, const void *v, int B,
                             int T, int H, int KV, int d, int causal)
{
    size_t nq = (size_t)B * T * H * d, nk = (size_t)B * T * KV * d;
    float *O = IO(out, nq), *Q = IN(q, nq), *Kk = IN(kk, nk), *V = IN(v, nk);
    RUN(CPU.attention_forward(k, O, lse, Q, Kk, V, B, T, H, KV, d, causal));
}

static int attention_backward(kern *k, void *dq, void *dk, void *dv, const void *dout, const void *out,
                              const float *lse, const void *q, const void *kk, const void *v, int B, int T, int H,
                              int KV, int d, int causal)
{
    size_t nq = (size_t)B * T * H * d, nk = (size_t)B * T * KV * d;
    float *DQ = IO(dq, nq), *DK = IO(dk, nk), *DV = IO(dv, nk), *DO = IN(dout, nq), *O = IN(out, nq);
    float *Q = IN(q, nq), *Kk = IN(kk, nk), *V = IN(v, nk);
    RUN(CPU.attention_backward(k, DQ, DK, DV, DO, O, lse, Q, Kk, V, B, T, H, KV, d, causal));
}

static int attention_qkv_forward(kern *k, void *out, float *lse, const void *qkv, int B, int T, int H, int KV,
                                 int d, int causal)
{
    float *O = IO(out, (size_t)B * T * H * d), *QKV = IN(qkv, (size_t)B * T * (H + 2 * KV) * d);
    RUN(CPU.attention_qkv_forward(k, O, lse, QKV, B, T, H, KV, d, causal));
}

static int attention_qkv_backward(kern *k, void *dqkv, const void *dout, const void *out, const float *lse,
                                  const void *qkv, int B, int T, int H, int KV, int d, int causal)
{
    size_t nq = (size_t)B * T * H * d, n3 = (size_t)B * T * (H + 2 * KV) * d;
    float *D = IO(dqkv, n3), *DO = IN(dout, nq), *O = IN(out, nq), *QKV = IN(qkv, n3);
    RUN(CPU.attention_qkv_backward(k, D, DO, O, lse, QKV, B, T, H, KV, d, causal));
}

static int rope_forward(kern *k, void *out, const void *x, int B, int T, int H, int d, float theta)
{
    size_t n = (size_t)B * T * H * d;
    float *O = IO(out, n), *X = IN(x, n);
    RUN(CPU.rope_forward(k, O, X, B, T, H, d, theta));
}

static int rope_backward(kern *k, void *dx, const void *dout, int B, int T, int H, int d, float theta)
{
    size_t n = (size_t)B * T * H * d;
    float *DX = IO(dx, n), *DO = IN(dout, n);
    RUN(CPU.rope_backward(k, DX, DO, B, T, H, d, theta));
}

static int gelu_forward(kern *k, void *out, const void *x, size_t n)
{
    float *O = IO(out, n), *X = IN(x, n);
    RUN(CPU.gelu_forward(k, O, X, n));
}

static int gelu_backward(kern *k, void *dx, const void *x, const void *dout, size_t n)
{
    float *DX = IO(dx, n), *X = IN(x, n), *DO = IN(dout, n);
    RUN(CPU.gelu_backward(k, DX, X, DO, n));
}

static int silu_forward(kern *k, void *out, const void *x, size_t n)
{
    float *O = IO(out, n), *X = IN(x, n);
    RUN(CPU.silu_forward(k, O, X, n));
}

static int silu_backward(kern *k, void *dx, const void *x, const void *dout, size_t n)
{
    float *DX = IO(dx, n), *X = IN(x, n), *DO = IN(dout, n);
    RUN(CPU.silu_backward(k, DX, X, DO, n));
}

static int swiglu_forward(kern *k, void *out, const void *gate, const void *up, size_t n)
{
    float *O = IO(out, n), *G = IN(gate, n), *U = IN(up, n);
    RUN(CPU.swiglu_forward(k, O, G, U, n));
}

static int swiglu_backward(kern *k, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                           size_t n)
{
    float *DG = IO(dgate, n), *DU = IO(dup, n), *DO = IN(dout, n), *G = IN(gate, n), *U = IN(up, n);
    RUN(CPU.swiglu_backward(k, DG, DU, DO, G, U, n));
}

static int crossentropy_forward(kern *k, float *mean, float *losses, float *rowmax, float *lse, const void *logits,
                                const int32_t *targets, void *dlogits, float dloss, int N, int V, int Vp)
{
    /* (in place, dlogits == logits: one copy, written back) */
    float *D = dlogits ? IO(dlogits, (size_t)N * Vp) : NULL, *L = IN(logits, (size_t)N * Vp);
    RUN(CPU.crossentropy_forward(k, mean, losses, rowmax, lse, L, targets, D, dloss, N, V, Vp));
}

static int crossentropy_shard_max(kern *k, float *rowmax, float *target_logit, const void *logits,
                                  const int32_t *targets, int N, int col0, int W, int V)
{
    float *L = IN(logits, (size_t)N * W);
    RUN(CPU.crossentropy_shard_max(k, rowmax, target_logit, L, targets, N, col0, W, V));
}

static int crossentropy_shard_sumexp(kern *k, double *x, const float *target_logit, const void *logits,
                                     const float *rowmax, int N, int col0, int W, int V)
{
    float *L = IN(logits, (size_t)N * W);
    RUN(CPU.crossentropy_shard_sumexp(k, x, target_logit, L, rowmax, N, col0, W, V));
}

/* (fp32 and double statistics: nothing stored in 2 bytes) */
static int crossentropy_shard_rowmax(kern *k, float *rowmax, const float *all, int N, int P)
{
    RUN(CPU.crossentropy_shard_rowmax(k, rowmax, all, N, P));
}

static int crossentropy_shard_finish(kern *k, float *mean, float *losses, float *lse, double *all,
                                     const float *rowmax, int N, int P)
{
    RUN(CPU.crossentropy_shard_finish(k, mean, losses, lse, all, rowmax, N, P));
}

static int crossentropy_shard_backward(kern *k, void *dlogits, const void *logits, const int32_t *targets,
                                       const float *rowmax, const float *lse, float dloss, int N, int col0, int W,
                                       int V)
{
    float *D = IO(dlogits, (size_t)N * W), *L = IN(logits, (size_t)N * W);
    RUN(CPU.crossentropy_shard_backward(k, D, L, targets, rowmax, lse, dloss, N, col0, W, V));
}

/* One buffer at a time: each widened, its sum taken (fp32 gradients,
 * grad32: as they are). */
static int sum_squares(kern *k, double *ss, void *const *bufs, const size_t *n, int nbufs)
{
    if (k->grad32) return CPU.sum_squares(k, ss, bufs, n, nbufs);
    for (int b = 0; b < nbufs; b++) {
        float *X = IN(bufs[b], n[b]);
        void *x = X;
        if (end(k, self(k)->failed ? -1 : CPU.sum_squares(k, ss + b, &x, &n[b], 1)) != 0) return -1;
    }
    return 0;
}

/* 2-byte gradients: scaled in place first (rounded to 2 bytes, as the
 * GPU takes them), then widened; fp32 ones (grad32) scaled as read. */
static int adamw_step(kern *k, float *params, void *params_lp, const void *grads, double gscale, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t)
{
    if (!k->grad32 && gscale != 1.0) {
        float *X = IO((void *)(uintptr_t)grads, n);
        if (X) kcpu_scale_buffers(&X, &n, 1, gscale);
        if (end(k, 0) != 0) return -1;
        gscale = 1.0;
    }
    float *LP = IO(params_lp, n), *G = k->grad32 ? (float *)(uintptr_t)grads : IN(grads, n);
    RUN(CPU.adamw_step(k, params, LP, G, gscale, m, v, n, lr, beta1, beta2, eps, weight_decay, t));
}

static int accumulate(kern *k, float *y, const void *x, size_t n, int x_f32)
{
    float *X = x_f32 ? (float *)(uintptr_t)x : IN(x, n);
    RUN(CPU.accumulate(k, y, X, n, 1));
}

/* ---- mixture of experts: the routing is the CPU's (fp32) ---- */

static size_t moe_route_bytes(int N, int E, int K, int C) { return CPU.moe_route_bytes(N, E, K, C); }
static int *moe_route_count(void *route, const kern_moe_dims *g) { return CPU.moe_route_count(route, g); }

static int moe_route_forward(kern *k, void *route, float *aux, const void *x, const void *router,
                             const kern_moe_dims *g)
{
    float *X = IN(x, (size_t)g->N * g->D), *R = IN(router, (size_t)g->D * g->E);
    RUN(CPU.moe_route_forward(k, route, aux, X, R, g));
}

static int moe_route_backward(kern *k, void *dx, void *drouter, float *scratch, const float *dweight, float aux_coef,
                              const void *route, const void *x, const void *router, const kern_moe_dims *g)
{
    size_t nd = (size_t)g->N * g->D, de = (size_t)g->D * g->E;
    float *DX = IO(dx, nd), *DR = IO(drouter, de), *X = IN(x, nd), *R = IN(router, de);
    RUN(CPU.moe_route_backward(k, DX, DR, scratch, dweight, aux_coef, route, X, R, g));
}

static int moe_dispatch_forward(kern *k, void *xe, const void *x, const void *route, const kern_moe_dims *g)
{
    float *XE = IO(xe, (size_t)g->E * g->C * g->D), *X = IN(x, (size_t)g->N * g->D);
    RUN(CPU.moe_dispatch_forward(k, XE, X, route, g));
}

static int moe_dispatch_backward(kern *k, void *dx, const void *dxe, const void *route, const kern_moe_dims *g)
{
    float *DX = IO(dx, (size_t)g->N * g->D), *DXE = IN(dxe, (size_t)g->E * g->C * g->D);
    RUN(CPU.moe_dispatch_backward(k, DX, DXE, route, g));
}

static int moe_combine_forward(kern *k, void *y, const void *ye, const void *route, const kern_moe_dims *g)
{
    float *Y = IO(y, (size_t)g->N * g->D), *YE = IN(ye, (size_t)g->E * g->C * g->D);
    RUN(CPU.moe_combine_forward(k, Y, YE, route, g));
}

static int moe_combine_backward(kern *k, void *dye, float *dweight, const void *dy, const void *ye, const void *route,
                                const kern_moe_dims *g)
{
    size_t ecd = (size_t)g->E * g->C * g->D;
    float *DYE = IO(dye, ecd), *DY = IN(dy, (size_t)g->N * g->D), *YE = IN(ye, ecd);
    RUN(CPU.moe_combine_backward(k, DYE, dweight, DY, YE, route, g));
}

static int moe_expert_forward(kern *k, void *ye, void *hg, void *hu, void *act, const void *xe, const void *w_gate,
                              const void *w_up, const void *w_down, const int *count, int E, int C, int D, int Fh)
{
    size_t ecd = (size_t)E * C * D, ecf = (size_t)E * C * Fh, edf = (size_t)E * D * Fh;
    float *YE = IO(ye, ecd), *HG = IO(hg, ecf), *HU = IO(hu, ecf), *ACT = IO(act, ecf), *XE = IN(xe, ecd);
    float *WG = IN(w_gate, edf), *WU = IN(w_up, edf), *WD = IN(w_down, edf);
    RUN(CPU.moe_expert_forward(k, YE, HG, HU, ACT, XE, WG, WU, WD, count, E, C, D, Fh));
}

static int moe_expert_backward(kern *k, void *dxe, void *dw_gate, void *dw_up, void *dw_down, float *scratch,
                               const void *dye, const void *hg, const void *hu, const void *act, const void *xe,
                               const void *w_gate, const void *w_up, const void *w_down, const int *count, int E,
                               int C, int D, int Fh)
{
    size_t ecd = (size_t)E * C * D, ecf = (size_t)E * C * Fh, edf = (size_t)E * D * Fh;
    float *DXE = IO(dxe, ecd), *DWG = IO(dw_gate, edf), *DWU = IO(dw_up, edf), *DWD = IO(dw_down, edf);
    float *DYE = IN(dye, ecd), *HG = IN(hg, ecf), *HU = IN(hu, ecf), *ACT = IN(act, ecf), *XE = IN(xe, ecd);
    float *WG = IN(w_gate, edf), *WU = IN(w_up, edf), *WD = IN(w_down, edf);
    RUN(CPU.moe_expert_backward(k, DXE, DWG, DWU, DWD, scratch, DYE, HG, HU, ACT, XE, WG, WU, WD, count, E, C, D,
                                Fh));
}

const kern_vtbl kern_cpu16_vtbl = {"cpu16", c16_open, c16_close, KERN_ENTRIES, NULL, NULL};
