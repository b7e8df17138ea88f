/* exec.c — the plan interpreter on one CPU rank (exec.h). */
#include "exec.h"

#include <math.h>   /* cos, isfinite */
#include <stdarg.h> /* va_list */
#include <stdio.h>  /* vsnprintf */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memset, strstr */

#include <stdint.h> /* SIZE_MAX */

#include "init.h" /* mesh__init_* */
#include "kcpu.h" /* kcpu_* */

/* What one moe layer's iteration keeps for its backward. */
typedef struct ex_moe {
    kcpu_moe_route *route;
    float *xe, *ye;        /* [E, C, D] dispatched tokens, expert outputs */
    float *hg, *hu, *act;  /* [E, C, F] the experts' hidden layers */
} ex_moe;

/* A moe node's geometry and scratch (shared by its iterations). */
typedef struct ex_moe_node {
    int N, D, E, K, C, F;
    ex_moe *it;            /* per iteration */
    float *dxe, *dye;      /* [E, C, D] */
    float *dweight;        /* [N, K] */
    float *scratch;        /* max([N, E], [2, C, F]) */
} ex_moe_node;

struct mesh__exec {
    const plan *p;
    int n;              /* tensors */
    size_t *numel;      /* per tensor: elements of one iteration's value */
    int *iters;         /* per tensor: iterations of its region (1 outside) */
    float **val;        /* per tensor: iters x numel (int32 for i32 tensors) */
    float **grad;       /* per f32 tensor: iters x numel, NULL for i32 */
    float **aux;        /* per tensor: iters x aux_len, what its backward needs */
    size_t *aux_len;
    float **m, **v;     /* AdamW moments, params only */
    int *params;        /* tensor ids of the params */
    int n_params;
    char ***names;      /* per param tensor: its iterations' global names */
    float **gbufs;      /* per param tensor: its gradient, for the global norm */
    size_t *gsizes;     /* and its elements, all iterations */
    int tokens_in, targets_in; /* the input tensors */
    double dloss;       /* seed of the backward: 1 / micro-batches */
    ex_moe_node **moe;  /* per tensor: moe layers' state, NULL for others */
    long long adam_t;   /* AdamW steps taken */
    size_t bytes;       /* allocated for the model's state and activations */
    mesh_alloc_fn alloc; /* the context's allocator hook */
    void *ud;
};

/* Zeroed memory from the context's allocator, counted in ex->bytes. The
 * block's size is kept in a header before it, for the hook's old_size. */
enum { EX_HEADER = 16 };

static void *ex_calloc(mesh__exec *ex, size_t n, size_t size)
{
    if (n && size > (SIZE_MAX - EX_HEADER) / n) return NULL;
    size_t bytes = n * size;
    unsigned char *base = ex->alloc(ex->ud, NULL, 0, bytes + EX_HEADER);
    if (!base) return NULL;
    memcpy(base, &bytes, sizeof bytes);
    memset(base + EX_HEADER, 0, bytes);
    ex->bytes += bytes;
    return base + EX_HEADER;
}

static void ex_free(mesh__exec *ex, void *p)
{
    if (!p) return;
    unsigned char *base = (unsigned char *)p - EX_HEADER;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    ex->alloc(ex->ud, base, bytes + EX_HEADER, 0);
}

static void set_err(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && n) vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

static size_t numel_of(const plan_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= (size_t)t->dims[d];
    return n;
}

static int64_t last_dim(const plan_tensor *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

/* ---- where a tensor's value lives, seen from a consumer ---------------- */

/* Value (or gradient) of tensor id for a consumer in region r at iteration
 * it: inside the same region, that iteration; a carried entry, the
 * previous iteration's exit (the entry itself at iteration 0); a region's
 * tensor seen from outside, its last iteration. */
static float *at(const mesh__exec *ex, float **bufs, int id, int r, int it)
{
    const plan *p = ex->p;
    int tr = p->tensors[id].region;
    if (!bufs[id]) return NULL;
    if (tr >= 0 && tr == r) return bufs[id] + (size_t)it * ex->numel[id];
    if (tr < 0 && r >= 0) {
        const plan_region *g = &p->regions[r];
        for (int c = 0; c < g->n_carry; c++)
            if (g->carry[c].entry == id && it > 0)
                return bufs[g->carry[c].exit] + (size_t)(it - 1) * ex->numel[g->carry[c].exit];
        return bufs[id];
    }
    if (tr >= 0) return bufs[id] + (size_t)(ex->iters[id] - 1) * ex->numel[id];
    return bufs[id];
}

#define IN(k) at(ex, ex->val, t->in[k], t->region, it)
#define DIN(k) at(ex, ex->grad, t->in[k], t->region, it)
#define OUT (ex->val[id] + (size_t)it * ex->numel[id])
#define DOUT (ex->grad[id] + (size_t)it * ex->numel[id])
#define AUX (ex->aux[id] + (size_t)it * ex->aux_len[id])
#define I32(x) ((int32_t *)(void *)(x))

/* Broadcast add: the smaller operand's elements repeat over the larger's. */
static void add_forward(float *out, const float *a, size_t na, const float *b, size_t nb)
{
    if (na == nb) kcpu_add_forward(out, a, b, na);
    else if (na > nb) kcpu_add_broadcast_forward(out, a, b, (int)(na / nb), 1, (int)nb);
    else kcpu_add_broadcast_forward(out, b, a, (int)(nb / na), 1, (int)na);
}

static void add_backward(float *da, size_t na, float *db, size_t nb, const float *dout)
{
    if (na == nb) kcpu_add_backward(da, db, dout, na);
    else if (na > nb) kcpu_add_broadcast_backward(da, db, dout, (int)(na / nb), 1, (int)nb);
    else kcpu_add_broadcast_backward(db, da, dout, (int)(nb / na), 1, (int)na);
}

/* Attention geometry: qkv [B, T, (H + 2 KV) d] -> out [B, T, H d]. */
static void attn_dims(const plan_tensor *t, int *B, int *T, int *H, int *KV, int *d)
{
    *H = (int)t->heads;
    *KV = (int)(t->kv_heads ? t->kv_heads : t->heads);
    *d = (int)(last_dim(t) / *H);
    *T = (int)t->dims[t->rank - 2];
    *B = (int)(numel_of(t) / ((size_t)*T * (size_t)*H * (size_t)*d));
}

static void forward_node(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *a = t->n_in > 0 ? &ex->p->tensors[t->in[0]] : NULL;
    const plan_tensor *b = t->n_in > 1 ? &ex->p->tensors[t->in[1]] : NULL;
    size_t n = ex->numel[id];
    switch (t->op) {
    case G_EMBED:
        kcpu_embedding_forward(OUT, I32(IN(0)), IN(1), (int)ex->numel[t->in[0]], (int)b->dims[0],
                               (int)b->dims[1]);
        break;
    case G_ARANGE:
        for (size_t k = 0; k < n; k++) I32(OUT)[k] = (int32_t)k;
        break;
    case G_MATMUL: {
        int K = (int)last_dim(a), N = (int)last_dim(t), M = (int)(n / (size_t)N);
        if (b->op == G_TRANSPOSE) /* x @ transpose(w): w stored [N, K] */
            kcpu_matmul_wt_forward(OUT, IN(0), at(ex, ex->val, b->in[0], t->region, it), NULL, M, K, N);
        else
            kcpu_matmul_forward(OUT, IN(0), IN(1), NULL, M, K, N);
        break;
    }
    case G_TRANSPOSE: /* only read through the matmul that uses it */
        break;
    case G_BIAS_ADD:
    case G_ADD:
        add_forward(OUT, IN(0), ex->numel[t->in[0]], IN(1), ex->numel[t->in[1]]);
        break;
    case G_LAYERNORM: {
        int C = (int)last_dim(t), rows = (int)(n / (size_t)C);
        kcpu_layernorm_forward(OUT, AUX, AUX + rows, IN(0), IN(1), t->n_in > 2 ? IN(2) : NULL, rows,
                               C, (float)t->eps);
        break;
    }
    case G_RMSNORM: {
        int C = (int)last_dim(t), rows = (int)(n / (size_t)C);
        kcpu_rmsnorm_forward(OUT, AUX, IN(0), IN(1), rows, C, (float)t->eps);
        break;
    }
    case G_ATTENTION: {
        int B, T, H, KV, d;
        attn_dims(t, &B, &T, &H, &KV, &d);
        if (t->n_in == 1) /* packed [q | k | v] */
            kcpu_attention_qkv_forward(OUT, AUX, IN(0), B, T, H, KV, d, t->causal);
        else
            kcpu_attention_forward(OUT, AUX, IN(0), IN(1), IN(2), B, T, H, KV, d, t->causal);
        break;
    }
    case G_ROPE: {
        int B, T, H, KV, d;
        attn_dims(t, &B, &T, &H, &KV, &d);
        kcpu_rope_forward(OUT, IN(0), B, T, H, d, (float)t->theta, 0);
        break;
    }
    case G_GELU: kcpu_gelu_forward(OUT, IN(0), n); break;
    case G_SILU: kcpu_silu_forward(OUT, IN(0), n); break;
    case G_SWIGLU: kcpu_swiglu_forward(OUT, IN(0), IN(1), n); break;
    case G_CROSS_ENTROPY: {
        int Vp = (int)last_dim(a), N = (int)ex->numel[t->in[1]];
        int V = t->vocab > 0 ? (int)t->vocab : Vp;
        OUT[0] = kcpu_crossentropy_forward(AUX, AUX + N, AUX + 2 * N, IN(0), I32(IN(1)), N, V, Vp);
        break;
    }
    case G_MOE: {
        ex_moe_node *g = ex->moe[id];
        ex_moe *m = &g->it[it];
        kcpu_moe_route_forward(m->route, IN(0), IN(1), g->D);
        kcpu_moe_dispatch_forward(m->xe, IN(0), m->route, g->D);
        kcpu_moe_expert_forward(m->ye, m->hg, m->hu, m->act, m->xe, IN(2), IN(3), IN(4), m->route->count,
                                g->E, g->C, g->D, g->F);
        kcpu_moe_combine_forward(OUT, m->ye, m->route, g->D);
        break;
    }
    default: /* inputs and params are filled elsewhere; others refused at create */
        break;
    }
}

static void backward_node(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *a = t->n_in > 0 ? &ex->p->tensors[t->in[0]] : NULL;
    const plan_tensor *b = t->n_in > 1 ? &ex->p->tensors[t->in[1]] : NULL;
    size_t n = ex->numel[id];
    switch (t->op) {
    case G_EMBED:
        kcpu_embedding_backward(DIN(1), DOUT, I32(IN(0)), (int)ex->numel[t->in[0]], (int)b->dims[0],
                                (int)b->dims[1]);
        break;
    case G_MATMUL: {
        int K = (int)last_dim(a), N = (int)last_dim(t), M = (int)(n / (size_t)N);
        if (b->op == G_TRANSPOSE)
            kcpu_matmul_wt_backward(DIN(0), at(ex, ex->grad, b->in[0], t->region, it), NULL, DOUT,
                                    IN(0), at(ex, ex->val, b->in[0], t->region, it), M, K, N);
        else
            kcpu_matmul_backward(DIN(0), DIN(1), NULL, DOUT, IN(0), IN(1), M, K, N);
        break;
    }
    case G_BIAS_ADD:
    case G_ADD:
        add_backward(DIN(0), ex->numel[t->in[0]], DIN(1), ex->numel[t->in[1]], DOUT);
        break;
    case G_LAYERNORM: {
        int C = (int)last_dim(t), rows = (int)(n / (size_t)C);
        kcpu_layernorm_backward(DIN(0), DIN(1), t->n_in > 2 ? DIN(2) : NULL, DOUT, IN(0), IN(1), AUX,
                                AUX + rows, rows, C);
        break;
    }
    case G_RMSNORM: {
        int C = (int)last_dim(t), rows = (int)(n / (size_t)C);
        kcpu_rmsnorm_backward(DIN(0), DIN(1), DOUT, IN(0), IN(1), AUX, rows, C);
        break;
    }
    case G_ATTENTION: {
        int B, T, H, KV, d;
        attn_dims(t, &B, &T, &H, &KV, &d);
        if (t->n_in == 1)
            kcpu_attention_qkv_backward(DIN(0), DOUT, OUT, AUX, IN(0), B, T, H, KV, d, t->causal);
        else
            kcpu_attention_backward(DIN(0), DIN(1), DIN(2), DOUT, OUT, AUX, IN(0), IN(1), IN(2), B, T,
                                    H, KV, d, t->causal);
        break;
    }
    case G_ROPE: {
        int B, T, H, KV, d;
        attn_dims(t, &B, &T, &H, &KV, &d);
        kcpu_rope_backward(DIN(0), DOUT, B, T, H, d, (float)t->theta, 0);
        break;
    }
    case G_GELU: kcpu_gelu_backward(DIN(0), IN(0), DOUT, n); break;
    case G_SILU: kcpu_silu_backward(DIN(0), IN(0), DOUT, n); break;
    case G_SWIGLU: kcpu_swiglu_backward(DIN(0), DIN(1), DOUT, IN(0), IN(1), n); break;
    case G_CROSS_ENTROPY: {
        int Vp = (int)last_dim(a), N = (int)ex->numel[t->in[1]];
        int V = t->vocab > 0 ? (int)t->vocab : Vp;
        kcpu_crossentropy_backward(DIN(0), IN(0), I32(IN(1)), AUX + N, AUX + 2 * N, DOUT[0], N, V, Vp);
        break;
    }
    case G_MOE: {
        ex_moe_node *g = ex->moe[id];
        ex_moe *m = &g->it[it];
        size_t ecd = (size_t)g->E * (size_t)g->C * (size_t)g->D;
        memset(g->dye, 0, ecd * sizeof(float));
        memset(g->dxe, 0, ecd * sizeof(float));
        memset(g->dweight, 0, (size_t)g->N * (size_t)g->K * sizeof(float));
        kcpu_moe_combine_backward(g->dye, g->dweight, DOUT, m->ye, m->route, g->D);
        kcpu_moe_expert_backward(g->dxe, DIN(2), DIN(3), DIN(4), g->scratch, g->dye, m->hg, m->hu, m->act,
                                 m->xe, IN(2), IN(3), IN(4), m->route->count, g->E, g->C, g->D, g->F);
        kcpu_moe_dispatch_backward(DIN(0), g->dxe, m->route, g->D);
        /* the load-balancing loss is part of the loss: its gradient scales
         * with the seed of the backward, as the cross-entropy's does */
        kcpu_moe_route_backward(DIN(0), DIN(1), g->scratch, g->dweight, (float)(t->aux_loss * ex->dloss),
                                m->route, IN(0), IN(1), g->D);
        break;
    }
    default:
        break;
    }
}

/* ---- running the program ---------------------------------------------- */

/* Runs the program's compute steps of one phase; a run of consecutive
 * steps in a region repeats per iteration (backward: last to first). */
static void run_phase(mesh__exec *ex, plan_phase phase)
{
    const plan *p = ex->p;
    int back = phase == PLAN_BACKWARD;
    for (int s = 0; s < p->n_steps;) {
        const plan_step *st = &p->steps[s];
        if (st->phase != phase || st->kind != STEP_COMPUTE) { s++; continue; }
        int e = s + 1;
        if (st->region >= 0)
            while (e < p->n_steps && p->steps[e].phase == phase && p->steps[e].region == st->region) e++;
        int count = st->region >= 0 ? (int)p->regions[st->region].count : 1;
        for (int k = 0; k < count; k++) {
            int it = back ? count - 1 - k : k;
            for (int q = s; q < e; q++) {
                if (p->steps[q].kind != STEP_COMPUTE) continue;
                if (back) backward_node(ex, p->steps[q].node, it);
                else forward_node(ex, p->steps[q].node, it);
            }
        }
        s = e;
    }
}

static void load_batch(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    size_t n = ex->numel[ex->tokens_in];
    memcpy(ex->val[ex->tokens_in], inputs, n * sizeof *inputs);
    memcpy(ex->val[ex->targets_in], targets, n * sizeof *targets);
}

size_t mesh__exec_batch_tokens(const mesh__exec *ex) { return ex->numel[ex->tokens_in]; }

double mesh__exec_loss(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    load_batch(ex, inputs, targets);
    run_phase(ex, PLAN_FORWARD);
    double loss = ex->val[ex->p->loss][0];
    for (int id = 0; id < ex->n; id++) /* moe's load-balancing losses */
        for (int it = 0; ex->moe[id] && it < ex->iters[id]; it++)
            loss += ex->p->tensors[id].aux_loss * (double)ex->moe[id]->it[it].route->aux;
    return loss;
}

/* Forward and backward of one micro-batch, adding to the params' grads. */
static double micro_step(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    double loss = mesh__exec_loss(ex, inputs, targets);
    for (int id = 0; id < ex->n; id++)
        if (ex->grad[id] && ex->p->tensors[id].op != G_PARAM)
            memset(ex->grad[id], 0, (size_t)ex->iters[id] * ex->numel[id] * sizeof(float));
    ex->grad[ex->p->loss][0] = (float)ex->dloss;
    run_phase(ex, PLAN_BACKWARD);
    return loss;
}

static void zero_param_grads(mesh__exec *ex)
{
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        memset(ex->grad[id], 0, (size_t)ex->iters[id] * ex->numel[id] * sizeof(float));
    }
}

double mesh__exec_grad(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    zero_param_grads(ex);
    double saved = ex->dloss;
    ex->dloss = 1.0;
    double loss = micro_step(ex, inputs, targets);
    ex->dloss = saved;
    return loss;
}

double mesh__exec_lr(const plan *p, long long step)
{
    const fe_setup *s = &p->setup;
    if (s->warmup > 0 && step <= s->warmup) return s->lr * (double)step / (double)s->warmup;
    if (s->lr_schedule == 0 || s->steps <= s->warmup) return s->lr;
    double frac = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    if (frac > 1) frac = 1;
    double shape = s->lr_schedule == 1 ? 0.5 * (1 + cos(3.14159265358979323846 * frac)) : 1 - frac;
    return s->min_lr + (s->lr - s->min_lr) * shape;
}

int mesh__exec_train_step(mesh__exec *ex, long long step, const int32_t *inputs,
                          const int32_t *targets, mesh__step_stats *st)
{
    const fe_setup *s = &ex->p->setup;
    int m = (int)(s->micro_batches > 0 ? s->micro_batches : 1);
    size_t bt = mesh__exec_batch_tokens(ex);
    zero_param_grads(ex);
    double loss = 0;
    for (int k = 0; k < m; k++) loss += micro_step(ex, inputs + (size_t)k * bt, targets + (size_t)k * bt);
    loss /= m;
    double norm = s->clip > 0 ? kcpu_clip_global_norm(ex->gbufs, ex->gsizes, ex->n_params, (float)s->clip)
                              : kcpu_global_norm((const float *const *)ex->gbufs, ex->gsizes, ex->n_params);
    double lr = mesh__exec_lr(ex->p, step);
    st->loss = loss;
    st->norm = norm;
    st->lr = lr;
    if (!isfinite(loss) || !isfinite(norm)) return -1;
    ex->adam_t++;
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        const plan_tensor *t = &ex->p->tensors[id];
        /* decay matrices and embeddings, not gains and biases (GPT-2, llm.c) */
        float wd = t->rank >= 2 ? (float)s->weight_decay : 0.0f;
        kcpu_adamw_step(ex->val[id], ex->grad[id], ex->m[id], ex->v[id],
                        (size_t)ex->iters[id] * ex->numel[id], (float)lr, (float)s->beta1,
                        (float)s->beta2, (float)s->eps, wd, (int)ex->adam_t);
    }
    return 0;
}

/* ---- setup ------------------------------------------------------------- */

/* The global name of a param at iteration it: "h.{0..1}.x" -> "h.1.x". */
static char *iter_name(mesh__exec *ex, const char *name, int it)
{
    const char *open = strstr(name, "{0..");
    const char *close = open ? strchr(open, '}') : NULL;
    size_t len = strlen(name) + 24;
    char *out = ex_calloc(ex, len, 1);
    if (!out) return NULL;
    if (!close) snprintf(out, len, "%s", name);
    else snprintf(out, len, "%.*s%d%s", (int)(open - name), name, it, close + 1);
    return out;
}

/* Why the executor cannot run this plan yet, or NULL. */
static const char *refusal(const plan *p, char *buf, size_t n)
{
    if (p->setup.world != 1) return "this runtime runs one-rank plans so far (mesh 1x1x1x1)";
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].kind != STEP_COMPUTE) return "the plan has collectives; one rank needs none";
    for (int r = 0; r < p->n_regions; r++)
        if (p->regions[r].parent >= 0) return "nested repeats are not run yet";
    if (p->loss < 0) return "the plan has no loss";
    for (int id = 0; id < p->n_tensors; id++) {
        const plan_tensor *t = &p->tensors[id];
        int ok = 1;
        switch (t->op) {
        case G_SUB: case G_MUL: case G_SCALE: ok = 0; break;
        case G_MOE: ok = !t->act_gelu; break; /* SwiGLU experts */
        case G_ATTENTION: ok = t->n_in == 1 || t->n_in == 3; break; /* packed qkv, or q, k, v */
        case G_TRANSPOSE:
            for (int c = id + 1; c < p->n_tensors; c++)
                for (int k = 0; k < p->tensors[c].n_in; k++)
                    if (p->tensors[c].in[k] == id && !(p->tensors[c].op == G_MATMUL && k == 1)) ok = 0;
            break;
        default: break;
        }
        if (!ok) {
            snprintf(buf, n, "op '%s' (tensor %d) is not run by the CPU executor yet",
                     graph_op_name(t->op), id);
            return buf;
        }
    }
    return NULL;
}

/* Extra floats an op saves per iteration for its backward. */
static size_t aux_floats(const plan *p, const plan_tensor *t, size_t n)
{
    switch (t->op) {
    case G_LAYERNORM: return 2 * (n / (size_t)last_dim(t));
    case G_RMSNORM: return n / (size_t)last_dim(t);
    case G_ATTENTION: return n / (size_t)(last_dim(t) / t->heads);
    case G_CROSS_ENTROPY: return 3 * numel_of(&p->tensors[t->in[1]]);
    default: return 0;
    }
}

/* Allocates a moe node's routing state and buffers for each iteration. */
static int moe_alloc(mesh__exec *ex, int id, int iters)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *wg = &ex->p->tensors[t->in[2]];
    ex_moe_node *g = calloc(1, sizeof *g);
    if (!g) return -1;
    ex->moe[id] = g;
    g->D = (int)last_dim(t);
    g->N = (int)(ex->numel[id] / (size_t)g->D);
    g->E = (int)wg->dims[0];
    g->F = (int)wg->dims[2];
    g->K = (int)t->top_k;
    g->C = kcpu_moe_capacity(g->N, g->E, g->K, t->capacity);
    size_t ecd = (size_t)g->E * (size_t)g->C * (size_t)g->D, ecf = (size_t)g->E * (size_t)g->C * (size_t)g->F;
    size_t scratch = (size_t)g->N * (size_t)g->E;
    if (scratch < 2 * (size_t)g->C * (size_t)g->F) scratch = 2 * (size_t)g->C * (size_t)g->F;
    g->it = ex_calloc(ex, (size_t)iters, sizeof *g->it);
    g->dxe = ex_calloc(ex, ecd, sizeof(float));
    g->dye = ex_calloc(ex, ecd, sizeof(float));
    g->dweight = ex_calloc(ex, (size_t)g->N * (size_t)g->K, sizeof(float));
    g->scratch = ex_calloc(ex, scratch, sizeof(float));
    if (!g->it || !g->dxe || !g->dye || !g->dweight || !g->scratch) return -1;
    for (int it = 0; it < iters; it++) {
        ex_moe *m = &g->it[it];
        m->route = kcpu_moe_route_alloc(g->N, g->E, g->K, g->C);
        m->xe = ex_calloc(ex, ecd, sizeof(float));
        m->ye = ex_calloc(ex, ecd, sizeof(float));
        m->hg = ex_calloc(ex, ecf, sizeof(float));
        m->hu = ex_calloc(ex, ecf, sizeof(float));
        m->act = ex_calloc(ex, ecf, sizeof(float));
        if (!m->route || !m->xe || !m->ye || !m->hg || !m->hu || !m->act) return -1;
    }
    return 0;
}

static void moe_free(mesh__exec *ex, ex_moe_node *g, int iters)
{
    if (!g) return;
    for (int it = 0; g->it && it < iters; it++) {
        ex_moe *m = &g->it[it];
        kcpu_moe_route_free(m->route);
        ex_free(ex, m->xe);
        ex_free(ex, m->ye);
        ex_free(ex, m->hg);
        ex_free(ex, m->hu);
        ex_free(ex, m->act);
    }
    ex_free(ex, g->it);
    ex_free(ex, g->dxe);
    ex_free(ex, g->dye);
    ex_free(ex, g->dweight);
    ex_free(ex, g->scratch);
    free(g);
}

mesh__exec *mesh__exec_create(const plan *p, mesh_alloc_fn alloc, void *ud, char *err, size_t errn)
{
    char why[160];
    const char *no = refusal(p, why, sizeof why);
    if (no) {
        set_err(err, errn, "%s", no);
        return NULL;
    }
    mesh__exec *ex = calloc(1, sizeof *ex);
    int n = p->n_tensors;
    if (!ex) goto oom;
    ex->p = p;
    ex->n = n;
    ex->alloc = alloc ? alloc : mesh_alloc_default;
    ex->ud = ud;
    ex->numel = ex_calloc(ex, (size_t)n, sizeof *ex->numel);
    ex->iters = ex_calloc(ex, (size_t)n, sizeof *ex->iters);
    ex->val = ex_calloc(ex, (size_t)n, sizeof *ex->val);
    ex->grad = ex_calloc(ex, (size_t)n, sizeof *ex->grad);
    ex->aux = ex_calloc(ex, (size_t)n, sizeof *ex->aux);
    ex->aux_len = ex_calloc(ex, (size_t)n, sizeof *ex->aux_len);
    ex->m = ex_calloc(ex, (size_t)n, sizeof *ex->m);
    ex->v = ex_calloc(ex, (size_t)n, sizeof *ex->v);
    ex->params = ex_calloc(ex, (size_t)n, sizeof *ex->params);
    ex->names = ex_calloc(ex, (size_t)n, sizeof *ex->names);
    ex->moe = ex_calloc(ex, (size_t)n, sizeof *ex->moe);
    if (!ex->numel || !ex->iters || !ex->val || !ex->grad || !ex->aux || !ex->aux_len || !ex->m
        || !ex->v || !ex->params || !ex->names || !ex->moe)
        goto oom;
    ex->tokens_in = ex->targets_in = -1;
    ex->dloss = 1.0 / (double)(p->setup.micro_batches > 0 ? p->setup.micro_batches : 1);
    for (int id = 0; id < n; id++) {
        const plan_tensor *t = &p->tensors[id];
        size_t ne = numel_of(t);
        int iters = t->region >= 0 ? (int)p->regions[t->region].count : 1;
        ex->numel[id] = ne;
        ex->iters[id] = iters;
        if (t->op == G_TRANSPOSE) continue;
        ex->val[id] = ex_calloc(ex, (size_t)iters * ne, sizeof(float));
        if (!ex->val[id]) goto oom;
        if (t->dtype == PLAN_DTYPE_F32) {
            ex->grad[id] = ex_calloc(ex, (size_t)iters * ne, sizeof(float));
            if (!ex->grad[id]) goto oom;
        }
        ex->aux_len[id] = aux_floats(p, t, ne);
        if (ex->aux_len[id]) {
            ex->aux[id] = ex_calloc(ex, (size_t)iters * ex->aux_len[id], sizeof(float));
            if (!ex->aux[id]) goto oom;
        }
        if (t->op == G_MOE && moe_alloc(ex, id, iters) != 0) goto oom;
        if (t->op == G_INPUT) {
            if (ex->tokens_in < 0) ex->tokens_in = id;
            else ex->targets_in = id;
        }
        if (t->op != G_PARAM) continue;
        ex->params[ex->n_params++] = id;
        ex->m[id] = ex_calloc(ex, (size_t)iters * ne, sizeof(float));
        ex->v[id] = ex_calloc(ex, (size_t)iters * ne, sizeof(float));
        ex->names[id] = ex_calloc(ex, (size_t)iters, sizeof *ex->names[id]);
        if (!ex->m[id] || !ex->v[id] || !ex->names[id]) goto oom;
        for (int it = 0; it < iters; it++) {
            char *name = iter_name(ex, t->name ? t->name : "?", it);
            if (!name) goto oom;
            ex->names[id][it] = name;
            float *w = ex->val[id] + (size_t)it * ne;
            if (t->init == GRAPH_INIT_NORMAL)
                mesh__init_normal(w, ne, 0, mesh__init_key((uint64_t)p->setup.seed, name),
                                  (float)t->init_std);
            else
                mesh__init_fill(w, ne, t->init == GRAPH_INIT_ONES ? 1.0f : 0.0f);
        }
    }
    ex->gbufs = ex_calloc(ex, (size_t)ex->n_params + 1, sizeof *ex->gbufs);
    ex->gsizes = ex_calloc(ex, (size_t)ex->n_params + 1, sizeof *ex->gsizes);
    if (!ex->gbufs || !ex->gsizes) goto oom;
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        ex->gbufs[k] = ex->grad[id];
        ex->gsizes[k] = (size_t)ex->iters[id] * ex->numel[id];
    }
    if (ex->tokens_in < 0 || ex->targets_in < 0) {
        set_err(err, errn, "the model needs two inputs (tokens and targets)");
        mesh__exec_free(ex);
        return NULL;
    }
    return ex;
oom:
    set_err(err, errn, "out of memory");
    mesh__exec_free(ex);
    return NULL;
}

/* Parameter k (each iteration's copy counted separately): its tensor id
 * and iteration; -1 past the last. */
static int param_at(const mesh__exec *ex, int k, int *it)
{
    for (int q = 0; k >= 0 && q < ex->n_params; q++) {
        int id = ex->params[q];
        if (k < ex->iters[id]) {
            *it = k;
            return id;
        }
        k -= ex->iters[id];
    }
    return -1;
}

int mesh__exec_param(mesh__exec *ex, int k, const char **name, size_t *n, float **value, float **grad)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    *name = ex->names[id][it];
    *n = ex->numel[id];
    *value = ex->val[id] + (size_t)it * ex->numel[id];
    *grad = ex->grad[id] + (size_t)it * ex->numel[id];
    return 0;
}

int mesh__exec_moments(mesh__exec *ex, int k, float **m, float **v)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    *m = ex->m[id] + (size_t)it * ex->numel[id];
    *v = ex->v[id] + (size_t)it * ex->numel[id];
    return 0;
}

int mesh__exec_param_dims(const mesh__exec *ex, int k, const int64_t **dims, int *rank)
{
    int it, id = param_at(ex, k, &it);
    if (id < 0) return -1;
    *dims = ex->p->tensors[id].dims;
    *rank = ex->p->tensors[id].rank;
    return 0;
}

long long *mesh__exec_adam_steps(mesh__exec *ex) { return &ex->adam_t; }

size_t mesh__exec_bytes(const mesh__exec *ex) { return ex->bytes; }

const float *mesh__exec_logits(const mesh__exec *ex, int *vocab_padded)
{
    int id = ex->p->tensors[ex->p->loss].in[0];
    *vocab_padded = (int)last_dim(&ex->p->tensors[id]);
    return at(ex, ex->val, id, -1, 0);
}

void mesh__exec_free(mesh__exec *ex)
{
    if (!ex) return;
    for (int id = 0; id < ex->n; id++) {
        if (ex->val) ex_free(ex, ex->val[id]);
        if (ex->grad) ex_free(ex, ex->grad[id]);
        if (ex->aux) ex_free(ex, ex->aux[id]);
        if (ex->m) ex_free(ex, ex->m[id]);
        if (ex->v) ex_free(ex, ex->v[id]);
        for (int it = 0; ex->names && ex->names[id] && it < ex->iters[id]; it++) ex_free(ex, ex->names[id][it]);
        if (ex->names) ex_free(ex, ex->names[id]);
        if (ex->moe) moe_free(ex, ex->moe[id], ex->iters ? ex->iters[id] : 0);
    }
    ex_free(ex, ex->moe);
    ex_free(ex, ex->numel);
    ex_free(ex, ex->iters);
    ex_free(ex, ex->val);
    ex_free(ex, ex->grad);
    ex_free(ex, ex->aux);
    ex_free(ex, ex->aux_len);
    ex_free(ex, ex->m);
    ex_free(ex, ex->v);
    ex_free(ex, ex->params);
    ex_free(ex, ex->names);
    ex_free(ex, ex->gbufs);
    ex_free(ex, ex->gsizes);
    free(ex);
}
