/* kern_cpu.c — the executor's kernels on the CPU (kern.h): the reference
 * kernels (kcpu.h), each call finished when it returns; none fails. And
 * kern_open, which picks a table by the device's kind.
 */
#include "kern.h"

#include <stdint.h> /* uintptr_t */
#include <stdio.h>  /* snprintf */
#include <string.h> /* strcmp, memset */

#include "kcpu.h" /* kcpu_* */

#define F(x) ((float *)(x))
#define CF(x) ((const float *)(x))

static int cpu_open(kern *k)
{
    (void)k;
    return 0;
}

static void cpu_close(kern *k) { (void)k; }

static int matmul_forward(kern *k, void *y, const void *x, const void *w, int M, int K, int N)
{
    (void)k;
    kcpu_matmul_forward(F(y), CF(x), CF(w), NULL, M, K, N);
    return 0;
}

/* kern.assign's bit `bit`: that input gradient of the call is overwritten:
 * zeroed first (the CPU's kernels add; 0 + x is x, so the bits are those
 * of a zeroed buffer) */
static void assigned(const kern *k, int bit, void *g, size_t n)
{
    if ((k->assign >> bit & 1) && g) memset(g, 0, n * sizeof(float));
}

static int matmul_backward(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M, int K,
                           int N)
{
    assigned(k, 0, dx, (size_t)M * (size_t)K);
    kcpu_matmul_backward(F(dx), F(dw), NULL, CF(dy), CF(x), CF(w), M, K, N);
    return 0;
}

/* The product and its bias as the separate ops make them (the same bits). */
static int matmul_bias_forward(kern *k, void *y, void *pre, const void *x, const void *w, const void *bias, int M,
                               int K, int N, int gelu)
{
    (void)k;
    kcpu_matmul_forward(F(gelu ? pre : y), CF(x), CF(w), CF(bias), M, K, N);
    if (gelu) kcpu_gelu_forward(F(y), CF(pre), (size_t)M * (size_t)N);
    return 0;
}

/* The product's backward and then the GELU's, in place (the same bits as
 * the two ops at their nodes). */
static int matmul_gelu_backward(kern *k, void *dpre, void *dw, const void *dy, const void *x, const void *w,
                                const void *pre, int M, int K, int N)
{
    (void)k;
    size_t n = (size_t)M * (size_t)K;
    memset(dpre, 0, n * sizeof(float));
    kcpu_matmul_backward(F(dpre), F(dw), NULL, CF(dy), CF(x), CF(w), M, K, N);
    kcpu_gelu_backward_inplace(F(dpre), CF(pre), n);
    return 0;
}

static int matmul_wt_forward(kern *k, void *y, const void *x, const void *w, int M, int K, int N)
{
    (void)k;
    kcpu_matmul_wt_forward(F(y), CF(x), CF(w), NULL, M, K, N);
    return 0;
}

static int matmul_wt_backward(kern *k, void *dx, void *dw, const void *dy, const void *x, const void *w, int M,
                              int K, int N)
{
    assigned(k, 0, dx, (size_t)M * (size_t)K);
    kcpu_matmul_wt_backward(F(dx), F(dw), NULL, CF(dy), CF(x), CF(w), M, K, N);
    return 0;
}

static int embedding_rows_forward(kern *k, void *out, const int32_t *ids, const void *table, int n, int row0,
                                  int rows, int C)
{
    (void)k;
    kcpu_embedding_rows_forward(F(out), ids, CF(table), n, row0, rows, C);
    return 0;
}

static int embedding_rows_backward(kern *k, void *dtable, const void *dout, const int32_t *ids, int n, int row0,
                                   int rows, int C)
{
    (void)k;
    kcpu_embedding_rows_backward(F(dtable), CF(dout), ids, n, row0, rows, C);
    return 0;
}

static int arange(kern *k, int32_t *out, size_t n)
{
    (void)k;
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)i;
    return 0;
}

static int add_forward(kern *k, void *out, const void *a, const void *b, size_t n)
{
    (void)k;
    kcpu_add_forward(F(out), CF(a), CF(b), n);
    return 0;
}

static int add_backward(kern *k, void *da, void *db, const void *dout, size_t n)
{
    assigned(k, 0, da, n);
    if (db != da) assigned(k, 1, db, n);
    kcpu_add_backward(F(da), F(db), CF(dout), n);
    return 0;
}

static int add_broadcast_forward(kern *k, void *out, const void *a, const void *p, int B, int T, int C)
{
    (void)k;
    kcpu_add_broadcast_forward(F(out), CF(a), CF(p), B, T, C);
    return 0;
}

static int add_broadcast_backward(kern *k, void *da, void *dp, const void *dout, int B, int T, int C)
{
    assigned(k, 0, da, (size_t)B * (size_t)T * (size_t)C);
    kcpu_add_broadcast_backward(F(da), F(dp), CF(dout), B, T, C);
    return 0;
}

static int layernorm_forward(kern *k, void *out, float *mean, float *rstd, const void *x, const void *w,
                             const void *b, int rows, int C, float eps)
{
    (void)k;
    kcpu_layernorm_forward(F(out), mean, rstd, CF(x), CF(w), CF(b), rows, C, eps);
    return 0;
}

static int add_norm_forward(kern *k, void *res, void *out, float *mean, float *rstd, const void *a, const void *b,
                            const void *w, const void *bias, int rows, int C, float eps, int rms)
{
    (void)k;
    kcpu_add_forward(F(res), CF(a), CF(b), (size_t)rows * (size_t)C);
    if (rms) kcpu_rmsnorm_forward(F(out), rstd, F(res), CF(w), rows, C, eps);
    else kcpu_layernorm_forward(F(out), mean, rstd, F(res), CF(w), CF(bias), rows, C, eps);
    return 0;
}

static int layernorm_backward(kern *k, void *dx, void *dw, void *db, const void *dout, const void *x, const void *w,
                              const float *mean, const float *rstd, int rows, int C)
{
    (void)k;
    kcpu_layernorm_backward(F(dx), F(dw), F(db), CF(dout), CF(x), CF(w), mean, rstd, rows, C);
    return 0;
}

static int rmsnorm_forward(kern *k, void *out, float *rstd, const void *x, const void *w, int rows, int C,
                           float eps)
{
    (void)k;
    kcpu_rmsnorm_forward(F(out), rstd, CF(x), CF(w), rows, C, eps);
    return 0;
}

static int rmsnorm_backward(kern *k, void *dx, void *dw, const void *dout, const void *x, const void *w,
                            const float *rstd, int rows, int C)
{
    (void)k;
    kcpu_rmsnorm_backward(F(dx), F(dw), CF(dout), CF(x), CF(w), rstd, rows, C);
    return 0;
}

static int attention_forward(kern *k, void *out, float *lse, const void *q, const void *kk, const void *v, int B,
                             int T, int H, int KV, int d, int causal)
{
    (void)k;
    kcpu_attention_forward(F(out), lse, CF(q), CF(kk), CF(v), B, T, H, KV, d, causal);
    return 0;
}

static int attention_backward(kern *k, void *dq, void *dk, void *dv, const void *dout, const void *out,
                              const float *lse, const void *q, const void *kk, const void *v, int B, int T, int H,
                              int KV, int d, int causal)
{
    size_t nq = (size_t)B * (size_t)T * (size_t)H * (size_t)d, nkv = (size_t)B * (size_t)T * (size_t)KV * (size_t)d;
    assigned(k, 0, dq, nq);
    assigned(k, 1, dk, nkv);
    assigned(k, 2, dv, nkv);
    kcpu_attention_backward(F(dq), F(dk), F(dv), CF(dout), CF(out), lse, CF(q), CF(kk), CF(v), B, T, H, KV, d,
                            causal);
    return 0;
}

static int attention_qkv_forward(kern *k, void *out, float *lse, const void *qkv, int B, int T, int H, int KV,
                                 int d, int causal)
{
    (void)k;
    kcpu_attention_qkv_forward(F(out), lse, CF(qkv), B, T, H, KV, d, causal);
    return 0;
}

static int attention_qkv_backward(kern *k, void *dqkv, const void *dout, const void *out, const float *lse,
                                  const void *qkv, int B, int T, int H, int KV, int d, int causal)
{
    assigned(k, 0, dqkv, (size_t)B * (size_t)T * (size_t)(H + 2 * KV) * (size_t)d);
    kcpu_attention_qkv_backward(F(dqkv), CF(dout), CF(out), lse, CF(qkv), B, T, H, KV, d, causal);
    return 0;
}

static int rope_forward(kern *k, void *out, const void *x, int B, int T, int H, int d, float theta)
{
    (void)k;
    kcpu_rope_forward(F(out), CF(x), B, T, H, d, theta, 0);
    return 0;
}

static int rope_backward(kern *k, void *dx, const void *dout, int B, int T, int H, int d, float theta)
{
    (void)k;
    kcpu_rope_backward(F(dx), CF(dout), B, T, H, d, theta, 0);
    return 0;
}

static int gelu_forward(kern *k, void *out, const void *x, size_t n)
{
    (void)k;
    kcpu_gelu_forward(F(out), CF(x), n);
    return 0;
}

static int gelu_backward(kern *k, void *dx, const void *x, const void *dout, size_t n)
{
    if (dx == dout) { /* in place (one gradient buffer: memplan's grad_alias), overwritten */
        kcpu_gelu_backward_inplace(F(dx), CF(x), n);
        return 0;
    }
    assigned(k, 0, dx, n);
    kcpu_gelu_backward(F(dx), CF(x), CF(dout), n);
    return 0;
}

static int silu_forward(kern *k, void *out, const void *x, size_t n)
{
    (void)k;
    kcpu_silu_forward(F(out), CF(x), n);
    return 0;
}

static int silu_backward(kern *k, void *dx, const void *x, const void *dout, size_t n)
{
    assigned(k, 0, dx, n);
    kcpu_silu_backward(F(dx), CF(x), CF(dout), n);
    return 0;
}

static int swiglu_forward(kern *k, void *out, const void *gate, const void *up, size_t n)
{
    (void)k;
    kcpu_swiglu_forward(F(out), CF(gate), CF(up), n);
    return 0;
}

static int swiglu_backward(kern *k, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                           size_t n)
{
    (void)k;
    kcpu_swiglu_backward(F(dgate), F(dup), CF(dout), CF(gate), CF(up), n);
    return 0;
}

static int crossentropy_forward(kern *k, float *mean, float *losses, float *rowmax, float *lse, const void *logits,
                                const int32_t *targets, void *dlogits, float dloss, int N, int V, int Vp)
{
    (void)k;
    *mean = kcpu_crossentropy_forward(losses, rowmax, lse, CF(logits), targets, N, V, Vp);
    if (dlogits) { /* overwritten (in place: over the logits) */
        if (dlogits != logits) memset(dlogits, 0, (size_t)N * (size_t)Vp * sizeof(float));
        kcpu_crossentropy_shard_backward(F(dlogits), CF(logits), targets, rowmax, lse, dloss, N, 0, Vp, V);
    }
    return 0;
}

static int crossentropy_shard_max(kern *k, float *rowmax, float *target_logit, const void *logits,
                                  const int32_t *targets, int N, int col0, int W, int V)
{
    (void)k;
    kcpu_crossentropy_shard_max(rowmax, target_logit, CF(logits), targets, N, col0, W, V);
    return 0;
}

static int crossentropy_shard_sumexp(kern *k, double *x, const float *target_logit, const void *logits,
                                     const float *rowmax, int N, int col0, int W, int V)
{
    (void)k;
    kcpu_crossentropy_shard_sumexp(x, target_logit, CF(logits), rowmax, N, col0, W, V);
    return 0;
}

static int crossentropy_shard_rowmax(kern *k, float *rowmax, const float *all, int N, int P)
{
    (void)k;
    kcpu_crossentropy_shard_rowmax(rowmax, all, N, P);
    return 0;
}

static int crossentropy_shard_finish(kern *k, float *mean, float *losses, float *lse, double *all,
                                     const float *rowmax, int N, int P)
{
    (void)k;
    *mean = kcpu_crossentropy_shard_finish(losses, lse, all, rowmax, N, P);
    return 0;
}

static int crossentropy_shard_backward(kern *k, void *dlogits, const void *logits, const int32_t *targets,
                                       const float *rowmax, const float *lse, float dloss, int N, int col0, int W,
                                       int V)
{
    if (dlogits != logits) assigned(k, 0, dlogits, (size_t)N * (size_t)W); /* (in place: overwritten) */
    kcpu_crossentropy_shard_backward(F(dlogits), CF(logits), targets, rowmax, lse, dloss, N, col0, W, V);
    return 0;
}

static int sum_squares(kern *k, double *ss, void *const *bufs, const size_t *n, int nbufs)
{
    (void)k;
    for (int b = 0; b < nbufs; b++) ss[b] = kcpu_sum_squares((const float *const *)&bufs[b], &n[b], 1);
    return 0;
}

static int adamw_step(kern *k, float *params, void *params_lp, const void *grads, double gscale, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int t)
{
    (void)k;
    kcpu_adamw_step(params, CF(grads), gscale, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
    if (params_lp) memcpy(params_lp, params, n * sizeof *params); /* the CPU's copy is fp32 words */
    return 0;
}

static int accumulate(kern *k, float *y, const void *x, size_t n, int x_f32)
{
    (void)k;
    (void)x_f32; /* (the CPU's tensors are fp32 words) */
    kcpu_add_forward(y, y, CF(x), n);
    return 0;
}

/* ---- mixture of experts: the routing arrays bound in the route memory
 * at each call (binding touches no memory) ---- */

static size_t moe_route_bytes(int N, int E, int K, int C) { return kcpu_moe_route_bytes(N, E, K, C); }

static kcpu_moe_route moe_bind(const void *route, const kern_moe_dims *g)
{
    kcpu_moe_route r;
    memset(&r, 0, sizeof r);
    kcpu_moe_route_bind(&r, (void *)(uintptr_t)route, g->N, g->E, g->K, g->C);
    return r;
}

static int *moe_route_count(void *route, const kern_moe_dims *g) { return moe_bind(route, g).count; }

static int moe_route_forward(kern *k, void *route, float *aux, const void *x, const void *router,
                             const kern_moe_dims *g)
{
    (void)k;
    kcpu_moe_route r = moe_bind(route, g);
    kcpu_moe_route_forward(&r, CF(x), CF(router), g->D);
    *aux = r.aux;
    return 0;
}

static int moe_route_backward(kern *k, void *dx, void *drouter, float *scratch, const float *dweight, float aux_coef,
                              const void *route, const void *x, const void *router, const kern_moe_dims *g)
{
    (void)k;
    kcpu_moe_route r = moe_bind(route, g);
    kcpu_moe_route_backward(F(dx), F(drouter), scratch, dweight, aux_coef, &r, CF(x), CF(router), g->D);
    return 0;
}

static int moe_dispatch_forward(kern *k, void *xe, const void *x, const void *route, const kern_moe_dims *g)
{
    (void)k;
    kcpu_moe_route r = moe_bind(route, g);
    kcpu_moe_dispatch_forward(F(xe), CF(x), &r, g->D);
    return 0;
}

static int moe_dispatch_backward(kern *k, void *dx, const void *dxe, const void *route, const kern_moe_dims *g)
{
    (void)k;
    kcpu_moe_route r = moe_bind(route, g);
    kcpu_moe_dispatch_backward(F(dx), CF(dxe), &r, g->D);
    return 0;
}

static int moe_combine_forward(kern *k, void *y, const void *ye, const void *route, const kern_moe_dims *g)
{
    (void)k;
    kcpu_moe_route r = moe_bind(route, g);
    kcpu_moe_combine_forward(F(y), CF(ye), &r, g->D);
    return 0;
}

static int moe_combine_backward(kern *k, void *dye, float *dweight, const void *dy, const void *ye, const void *route,
                                const kern_moe_dims *g)
{
    (void)k;
    kcpu_moe_route r = moe_bind(route, g);
    kcpu_moe_combine_backward(F(dye), dweight, CF(dy), CF(ye), &r, g->D);
    return 0;
}

static int moe_expert_forward(kern *k, void *ye, void *hg, void *hu, void *act, const void *xe, const void *w_gate,
                              const void *w_up, const void *w_down, const int *count, int E, int C, int D, int Fh)
{
    (void)k;
    kcpu_moe_expert_forward(F(ye), F(hg), F(hu), F(act), CF(xe), CF(w_gate), CF(w_up), CF(w_down), count, E, C, D, Fh);
    return 0;
}

static int moe_expert_backward(kern *k, void *dxe, void *dw_gate, void *dw_up, void *dw_down, float *scratch,
                               const void *dye, const void *hg, const void *hu, const void *act, const void *xe,
                               const void *w_gate, const void *w_up, const void *w_down, const int *count, int E,
                               int C, int D, int Fh)
{
    (void)k;
    kcpu_moe_expert_backward(F(dxe), F(dw_gate), F(dw_up), F(dw_down), scratch, CF(dye), CF(hg), CF(hu), CF(act),
                             CF(xe), CF(w_gate), CF(w_up), CF(w_down), count, E, C, D, Fh);
    return 0;
}

const kern_vtbl kern_cpu_vtbl = {"cpu", cpu_open, cpu_close, KERN_ENTRIES, NULL, NULL};

int kern_open(kern *k, dev *d, int half, char *err, size_t n)
{
    memset(k, 0, sizeof *k);
    k->d = d;
    k->half = half;
    k->v = strcmp(d->v->name, "cuda") == 0 ? &kern_cuda_vtbl : half ? &kern_cpu16_vtbl : &kern_cpu_vtbl;
    if (k->v->open(k) == 0) return 0;
    snprintf(err, n, "%s", k->error);
    return -1;
}

void kern_close(kern *k)
{
    if (k && k->v) k->v->close(k);
    if (k) k->v = NULL;
}
