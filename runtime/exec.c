/* exec.c — the executor's life (exec.h): checking a plan, laying its arena
 * out, joining the mesh's groups, initialising the params, freeing. */
#include "exec_impl.h"

#include <stdarg.h> /* va_list, va_start, va_end */
#include <stdint.h> /* SIZE_MAX */
#include <stdio.h>  /* snprintf, vsnprintf */
#include <stdlib.h> /* calloc, malloc, free */
#include <string.h> /* memcpy, memset, strchr, strlen, strstr */

#include "init.h" /* mesh__init_* */

/* Zeroed memory from the context's allocator. The block's size is kept in
 * a header before it, for the hook's old_size. */
enum { EX_HEADER = 16 };

static void *ex_calloc(mesh__exec *ex, size_t n, size_t size)
{
    if (n && size > (SIZE_MAX - EX_HEADER) / n) return NULL;
    size_t bytes = n * size;
    unsigned char *base = ex->alloc(ex->ud, NULL, 0, bytes + EX_HEADER);
    if (!base) return NULL;
    memcpy(base, &bytes, sizeof bytes);
    memset(base + EX_HEADER, 0, bytes);
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

/* Bookkeeping: counted apart from the arena. */
void *exec__host_calloc(mesh__exec *ex, size_t n, size_t size)
{
    void *p = ex_calloc(ex, n, size);
    if (p) ex->host_bytes += n * size;
    return p;
}

void exec__host_free(mesh__exec *ex, void *p, size_t bytes)
{
    if (!p) return;
    ex->host_bytes -= bytes;
    ex_free(ex, p);
}

static void set_err(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && n) vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

const char *mesh__exec_error(const mesh__exec *ex) { return ex->error; }

int mesh__exec_failed(const mesh__exec *ex) { return ex->failed || ex->dev_failed; }

void mesh__exec_data_rank(const mesh__exec *ex, int *data_rank, int *data_ranks)
{
    *data_rank = ex->coord[0] * (int)ex->p->setup.ep + ex->coord[3];
    *data_ranks = ex->data_ranks;
}

/* The global name of a param at iteration it: "h.{0..1}.x" -> "h.1.x". */
static char *iter_name(mesh__exec *ex, const char *name, int it)
{
    const char *open = strstr(name, "{0..");
    const char *close = open ? strchr(open, '}') : NULL;
    size_t len = strlen(name) + 24;
    char *out = exec__host_calloc(ex, len, 1);
    if (!out) return NULL;
    if (!close) snprintf(out, len, "%s", name);
    else snprintf(out, len, "%.*s%d%s", (int)(open - name), name, it, close + 1);
    return out;
}

/* Why the executor cannot run this plan yet, or NULL. */
static const char *refusal(const plan *p, char *buf, size_t n)
{
    for (int k = 0; k < p->n_steps; k++) {
        const plan_step *st = &p->steps[k];
        int param = p->tensors[st->node].op == G_PARAM && st->axis == 0;
        /* ZeRO: gradients reduce-scattered once per step (1) or per micro-batch (2, 3);
         * params gathered after the optimizer (1, 2) or before use (3) */
        int sync = st->kind == STEP_REDUCE_SCATTER && (st->phase == PLAN_GRAD_SYNC || param);
        int moe = st->kind == STEP_ALL_TO_ALL && p->tensors[st->node].op == G_MOE;
        int gather = st->kind == STEP_ALL_GATHER && (st->phase == PLAN_AFTER_OPTIMIZER || param);
        /* sequence parallelism: an activation or its gradient converted over tp, in place */
        int tpconv = st->axis == 1 && p->tensors[st->node].op != G_PARAM &&
                     (st->kind == STEP_REDUCE_SCATTER || st->kind == STEP_ALL_GATHER || st->kind == STEP_SLICE) &&
                     (st->phase == PLAN_FORWARD || st->phase == PLAN_BACKWARD);
        for (int j = 0; tpconv && st->phase == PLAN_FORWARD && j < k; j++)
            if (p->steps[j].phase == PLAN_FORWARD && p->steps[j].node == st->node && p->steps[j].axis == 1 &&
                p->steps[j].kind != STEP_ALL_REDUCE && p->steps[j].kind != STEP_COMPUTE) {
                snprintf(buf, n, "tensor %d is converted over tp twice in the forward: not run yet", st->node);
                return buf;
            }
        if (tpconv) continue;
        if (st->kind != STEP_COMPUTE && st->kind != STEP_ALL_REDUCE && !sync && !gather && !moe) {
            snprintf(buf, n, "the plan's %s steps over %s are not run yet", plan_phase_name(st->phase),
                     plan__axis_name(st->axis));
            return buf;
        }
    }
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
            ok = ok && p->tensors[t->in[0]].op == G_PARAM;
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

/* A moe node's geometry; -2 if the device's routing layout does not fit
 * in the memory plan's room, -3 for an ep group over 64 ranks. */
static int moe_setup(mesh__exec *ex, int id)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const plan_tensor *wg = &ex->p->tensors[t->in[2]];
    ex_moe *m = exec__host_calloc(ex, 1, sizeof *m);
    if (!m) return -1;
    ex->moe[id] = m;
    kern_moe_dims *g = &m->g;
    g->D = (int)exec__last_dim(t);
    g->N = (int)(ex->numel[id] / (size_t)g->D);
    g->E = (int)wg->dims[0];
    m->F = (int)ex->ld[t->in[2]][2]; /* the experts' hidden width on this rank (split over tp) */
    g->K = (int)t->top_k;
    m->P = wg->pl.kind[3] == PL_SPLIT ? (int)ex->p->setup.ep : 1;
    m->El = g->E / m->P;
    g->C = (int)memplan_moe_capacity(g->N, g->E, g->K, t->capacity);
    m->route_bytes = (size_t)memplan_moe_route_bytes(g->N, g->E, g->K, g->C);
    if (m->P > 64) return -3; /* the exchange's counts */
    size_t need = ex->kern.v->moe_route_bytes(g->N, g->E, g->K, g->C);
    return need > 0 && need <= m->route_bytes ? 0 : -2;
}

static int partial(const plan_tensor *t)
{
    for (int a = 0; a < SHARD_AXES; a++)
        if (t->pl.kind[a] == PL_PARTIAL) return 1;
    return 0;
}

/* The ops that read tensor id (an op reading it twice counts twice). */
static int readers(const plan *p, int id)
{
    int n = 0;
    for (int t = 0; t < p->n_tensors; t++)
        for (int k = 0; k < p->tensors[t].n_in; k++) n += p->tensors[t].in[k] == id;
    return n;
}

/* Is the loss a sum of cross-entropies (one, or a tree of adds over them,
 * each read once), every cross-entropy of the plan among them? Then each
 * one's fp32 mean is a term of the loss (exec_loss.c), and the loss is
 * their sum in double, not the value the adds store (in a 2-byte plan,
 * rounded to 2 bytes). */
static int loss_of_terms(const plan *p)
{
    enum { DEPTH = 64 };
    int stack[DEPTH], top = 0, ces = 0, leaves = 0;
    if (p->loss < 0) return 0;
    for (int id = 0; id < p->n_tensors; id++) ces += p->tensors[id].op == G_CROSS_ENTROPY;
    stack[top++] = p->loss;
    while (top > 0) {
        const plan_tensor *t = &p->tensors[stack[--top]];
        if (t->op == G_CROSS_ENTROPY) {
            leaves++;
            continue;
        }
        if (t->op != G_ADD || t->n_in != 2 || t->in[0] == t->in[1] || top + 2 > DEPTH) return 0;
        for (int k = 0; k < 2; k++) {
            if (readers(p, t->in[k]) != 1) return 0;
            stack[top++] = t->in[k];
        }
    }
    return leaves == ces;
}

/* Is step s a forward computation of an op `op` in `region`? Its node, else -1. */
static int forward_op(const plan *p, int s, g_op op, int region)
{
    if (s >= p->n_steps) return -1;
    const plan_step *st = &p->steps[s];
    if (st->phase != PLAN_FORWARD || st->kind != STEP_COMPUTE || st->region != region) return -1;
    return p->tensors[st->node].op == op ? st->node : -1;
}

/* Is step s a backward computation (not a recomputation) of an op `op`
 * in `region`? Its node, else -1. */
static int backward_op(const plan *p, int s, g_op op, int region)
{
    if (s >= p->n_steps) return -1;
    const plan_step *st = &p->steps[s];
    if (st->phase != PLAN_BACKWARD || st->kind != STEP_COMPUTE || st->recompute || st->region != region) return -1;
    return p->tensors[st->node].op == op ? st->node : -1;
}

/* A backward fusion (ex_fuse.dgelu): the matmul m = g @ w (w not
 * transposed) at backward step s and the GELU g at step s + 1, g's
 * gradient in its input's buffer (memplan's grad_alias: g's value read by
 * m alone, so g's gradient is m's product, all of it; the input read by g
 * alone, of g's shape; the buffer live from m's backward on, apart from
 * m's output gradient, which the fused kernel reads while it writes), and
 * the input's gradient started by g's backward, overwritten whole. */
static int dgelu_fusable(const mesh__exec *ex, int s)
{
    const plan *p = ex->p;
    int m = backward_op(p, s, G_MATMUL, p->steps[s].region);
    int g = m >= 0 ? backward_op(p, s + 1, G_GELU, p->steps[s].region) : -1;
    if (g < 0) return 0;
    const plan_tensor *tm = &p->tensors[m], *tg = &p->tensors[g];
    int pre = tg->in[0];
    return tm->in[0] == g && p->tensors[tm->in[1]].op != G_TRANSPOSE && g != p->loss &&
           exec__buf_of(ex, g)->grad_alias == pre && ex->zero_by[g] == m && ex->zero_by[pre] == g &&
           exec__assigns(ex, g, 0) && ex->step_part[s] == ex->step_part[s + 1];
}

/* A forward fusion (ex_fuse.norm): the residual add a = x + y at step s
 * (no broadcast, its value whole on the rank) and a layernorm or rmsnorm
 * of a over its last dim at step s + 1, whose output (and statistics) has
 * a slot of its own, so that writing it while the add's inputs are read
 * overwrites none of them (a workspace buffer might be one of theirs). */
static int add_norm_fusable(const mesh__exec *ex, int s)
{
    const plan *p = ex->p;
    int r = p->steps[s].region, a = forward_op(p, s, G_ADD, r);
    int n = a < 0 ? -1 : forward_op(p, s + 1, G_LAYERNORM, r) >= 0 ? p->steps[s + 1].node
                                                                   : forward_op(p, s + 1, G_RMSNORM, r);
    if (n < 0) return 0;
    const plan_tensor *ta = &p->tensors[a], *tn = &p->tensors[n];
    return tn->in[0] == a && a != p->loss && !partial(ta) && ex->cnumel[ta->in[0]] == ex->numel[a] &&
           ex->cnumel[ta->in[1]] == ex->numel[a] && ex->numel[n] == ex->numel[a] &&
           exec__buf_of(ex, n)->region == MEM_SLOT && exec__buf_of(ex, a)->part == exec__buf_of(ex, n)->part;
}

/* Which ops run as one kernel (ex_fuse): a matmul (x @ w, w not
 * transposed) whose value is whole on the rank (not a partial sum that a
 * collective completes) and read only by the bias add of the next step,
 * over its last dim; and a GELU of that bias add at the step after; a
 * residual add and the norm after it (add_norm_fusable); in the
 * backward, a matmul's and the GELU's before it (dgelu_fusable). Not
 * where a bf16 or fp16 plan's values are fp32 words (the CPU), rounded
 * after each op as a GPU stores them: one kernel rounds once. */
static void find_fusions(mesh__exec *ex, unsigned flags)
{
    const plan *p = ex->p;
    for (int id = 0; id < ex->n; id++)
        ex->fuse[id].into = ex->fuse[id].gelu = ex->fuse[id].dgelu = ex->fuse[id].dgelu_by = ex->fuse[id].norm = -1;
    if ((flags & MESH__EXEC_NO_FUSE) || (ex->esize == 4 && ex->prec != KCPU_FP32)) return;
    for (int s = 0; s + 1 < p->n_steps; s++) {
        int m = forward_op(p, s, G_MATMUL, p->steps[s].region);
        int b = m >= 0 ? forward_op(p, s + 1, G_BIAS_ADD, p->steps[s].region) : -1;
        if (b < 0) continue;
        const plan_tensor *tm = &p->tensors[m], *tb = &p->tensors[b];
        if (readers(p, m) != 1 || tb->in[0] != m || m == p->loss || partial(tm) || p->tensors[tm->in[1]].op == G_TRANSPOSE ||
            exec__buf_of(ex, m)->part != exec__buf_of(ex, b)->part || ex->cnumel[m] != ex->numel[b] ||
            ex->cnumel[tb->in[1]] != (size_t)exec__lastd(ex, m))
            continue;
        ex->fuse[m].into = b;
        ex->n_fused++;
        int g = forward_op(p, s + 2, G_GELU, p->steps[s].region);
        if (g >= 0 && p->tensors[g].in[0] == b && ex->numel[g] == ex->numel[b]) {
            ex->fuse[b].gelu = g;
            ex->fuse[g].into = b;
        }
    }
    for (int s = 0; s + 1 < p->n_steps; s++) { /* x at step s, y at the next */
        int x = p->steps[s].node, y = p->steps[s + 1].node;
        if (add_norm_fusable(ex, s)) { /* the add x computes the norm y */
            ex->fuse[x].norm = y;
            ex->fuse[y].into = x;
            ex->n_fused++;
        } else if (dgelu_fusable(ex, s)) { /* the matmul x runs the GELU y's backward */
            ex->fuse[x].dgelu = y;
            ex->fuse[y].dgelu_by = x;
            ex->n_fused++;
        }
    }
}

/* The node whose backward starts each tensor's gradient: its last
 * consumer in its segment; itself when none (the loss); -1 for tensors
 * without a gradient in the shared workspace. */
static void find_zero_by(mesh__exec *ex)
{
    const plan *p = ex->p;
    for (int id = 0; id < ex->n; id++) ex->zero_by[id] = id;
    for (int c = 0; c < ex->n; c++)
        for (int k = 0; k < p->tensors[c].n_in; k++) {
            int in = p->tensors[c].in[k];
            if (exec__buf_of(ex, c)->part == exec__buf_of(ex, in)->part) ex->zero_by[in] = c;
        }
    for (int id = 0; id < ex->n; id++) {
        const mem_buf *b = exec__buf_of(ex, id);
        if (b->grad_alias >= 0 && b->grad_alias < id) /* a GELU's, in its input's buffer: its reader starts it */
            b = exec__buf_of(ex, b->grad_alias);
        if (b->grad_region != MEM_WORKSPACE) ex->zero_by[id] = -1;
    }
}

/* Lays the arena out by the memory plan and checks that it is the plan's. */
static int layout(mesh__exec *ex, unsigned flags, char *err, size_t errn)
{
    const plan *p = ex->p;
    int no_reuse = (flags & MESH__EXEC_NO_REUSE) != 0;
    /* the CPU keeps a bf16 or fp16 plan's values in 4-byte words, with the
     * masters; a GPU keeps bf16 in 2 bytes: the plan's own layout */
    unsigned mf = (no_reuse ? MEMPLAN_NO_REUSE : 0) | (p->setup.precision != 0 && ex->esize == 4 ? MEMPLAN_MASTERS : 0);
    if (memplan_build(&ex->mp, p, ex->esize, mf) != 0) return -1;
    if (ex->mp.unsupported) {
        set_err(err, errn, "the plan has %s: not run yet", ex->mp.unsupported);
        return -2;
    }
    const mem_stage *ms = ex->ms = &ex->mp.stage[ex->stage];
    const mem_stage *pm = p->memory ? &p->memory[ex->stage] : NULL;
    if ((p->setup.precision == 0 || ex->esize == 2) && pm && !no_reuse &&
        (pm->total != ms->total || pm->params != ms->params || pm->grads != ms->grads || pm->optim != ms->optim ||
         pm->slot_bytes != ms->slot_bytes || pm->slots != ms->slots || pm->workspace != ms->workspace)) {
        set_err(err, errn, "the plan's memory plan (%lld bytes) is not the layout this runtime computes from it "
                           "(%lld bytes): compile it again with this version's meshc",
                (long long)pm->total, (long long)ms->total);
        return -2;
    }
    ex->grads_at = ms->params;
    ex->optim_at = ex->grads_at + ms->grads;
    ex->slots_at = ex->optim_at + ms->optim;
    ex->pinned_at = ex->slots_at + ms->slot_bytes * ms->slots;
    ex->shared_at = ex->pinned_at + ms->pinned;
    ex->recompute_at = ex->shared_at + ms->shared;
    ex->gathered_at = ex->recompute_at + ms->recompute;
    ex->gstage_at = ex->gathered_at + ms->gathered;
    ex->comm_at = ex->gstage_at + ms->gstage;
    /* a slot: the part before the stack (a later stage: what it receives), its layers, the part after */
    exec__set_chunk(ex, ex->stage); /* the stage's first chunk */
    if ((uint64_t)ms->total > SIZE_MAX - EX_HEADER) return -1;
    if (!ex->host_arena) { /* device memory, zeroed; a full device says how full, with the plan's bytes */
        void *a = NULL;
        dev_set_planned(ex->dev, (size_t)ms->total);
        if (dev_alloc(ex->dev, &a, (size_t)ms->total) != MESH_OK) {
            set_err(err, errn, "rank %d: %s", ex->rank, dev_last_error(ex->dev));
            return -2;
        }
        ex->arena = a;
        return exec__fill(ex, a, 0, (size_t)ms->total) == 0 ? 0 : (set_err(err, errn, "%s", ex->error), -2);
    }
    ex->arena = ex_calloc(ex, (size_t)ms->total, 1);
    return ex->arena ? 0 : -1;
}

int mesh__exec_gpu_supported(const plan *p, char *err, size_t errn)
{
    return mesh__exec_supported(p, err, errn); /* everything the CPU runs (the CUDA table has every op) */
}

int mesh__exec_supported(const plan *p, char *err, size_t errn)
{
    char why[160];
    const char *no = refusal(p, why, sizeof why);
    if (no) set_err(err, errn, "%s", no);
    return no ? -1 : 0;
}

mesh__exec *mesh__exec_create(const plan *p, mesh_alloc_fn alloc, void *ud, char *err, size_t errn)
{
    return mesh__exec_create_rank(p, 0, NULL, NULL, 0, alloc, ud, 0, err, errn);
}

mesh__exec *mesh__exec_create_flags(const plan *p, mesh_alloc_fn alloc, void *ud, unsigned flags, char *err,
                                    size_t errn)
{
    return mesh__exec_create_rank(p, 0, NULL, NULL, 0, alloc, ud, flags, err, errn);
}

/* The mesh's axes (dp, tp, pp, ep): their sizes, and the distance in
 * ranks between neighbours on each (tp fastest, then ep, dp, pp). */
static void axis_strides(const fe_setup *s, long long size[4], long long stride[4])
{
    size[0] = s->dp, size[1] = s->tp, size[2] = s->pp, size[3] = s->ep;
    stride[1] = 1;
    stride[3] = s->tp;
    stride[0] = s->tp * s->ep;
    stride[2] = s->tp * s->ep * s->dp;
}

/* This rank's groups split from world: on each axis of size > 1
 * (axis[a]), dp x ep (*data; axis[0] when ep = 1), and with pp > 1 the
 * first and the last stage (*tied; NULL elsewhere). */
static int split_groups(mesh__exec *ex, comm *world, comm **axis, comm **data, comm **tied, char *err, size_t errn)
{
    const fe_setup *s = &ex->p->setup;
    long long size[4], stride[4];
    axis_strides(s, size, stride);
    for (int a = 0; a < 4; a++) {
        if (size[a] == 1) continue;
        int color = (int)(ex->rank - ex->coord[a] * stride[a]);
        if (comm_split(world, color, ex->coord[a], &axis[a]) != 0) {
            set_err(err, errn, "rank %d: making the %s groups: %s", ex->rank, plan__axis_name(a), world->error);
            return -1;
        }
    }
    *data = axis[0];
    if (s->ep > 1) { /* dp x ep: the ranks that share pp and tp */
        int color = (int)(ex->rank - ex->coord[0] * stride[0] - ex->coord[3] * stride[3]);
        if (comm_split(world, color, (int)(ex->coord[0] * s->ep + ex->coord[3]), data) != 0) {
            set_err(err, errn, "rank %d: making the dp x ep groups: %s", ex->rank, world->error);
            return -1;
        }
    }
    int stage = ex->coord[2], last = (int)ex->p->pp - 1;
    if (ex->p->pp > 1 && comm_split(axis[2], stage == 0 || stage == last ? 0 : -1, stage, tied) != 0) {
        set_err(err, errn, "rank %d: making the tied-param groups: %s", ex->rank, axis[2]->error);
        return -1;
    }
    return 0;
}

/* Is [p, p + bytes) the device's memory? (the checked world's test) */
static int on_device(void *ud, const void *p, size_t bytes) { return dev_owns(ud, p, bytes); }

/* This rank's coordinates (tp fastest, then ep, dp, pp: docs/language.md)
 * and its groups, from dworld (device buffers) and world (host buffers;
 * one set of groups when they are one world). Without dworld, the guarded
 * device and GPUs sharing a host world (MESH_GPU_SHARED) make theirs a
 * checked world over world, staged through host memory: it takes the
 * device's memory only, and world never touches it. */
static int join_axes(mesh__exec *ex, comm *world, comm *dworld, unsigned flags, char *err, size_t errn)
{
    long long size[4], stride[4];
    axis_strides(&ex->p->setup, size, stride);
    for (int a = 0; a < 4; a++) ex->coord[a] = (int)(ex->rank / stride[a] % size[a]);
    if (!dworld && ((flags & MESH__EXEC_GUARD) || ex->gpu)) {
        if (!(ex->checked = comm_checked_new(world, 0, on_device, ex->dev))) {
            set_err(err, errn, "rank %d: out of memory", ex->rank);
            return -1;
        }
        if (comm_checked_stage(ex->checked, ex->dev) != 0) {
            set_err(err, errn, "rank %d: %s", ex->rank, ex->checked->error);
            return -1;
        }
        if (ex->esize == 2) /* as NCCL's on a GPU: the plan's 2-byte type */
            comm_checked_set_elements(ex->checked, ex->p->setup.precision == 1 ? COMM_BF16 : COMM_F16);
        dworld = ex->checked;
    }
    ex->world = dworld ? dworld : world;
    ex->hworld = world;
    if (split_groups(ex, ex->world, ex->axis, &ex->data, &ex->tied, err, errn) != 0) return -1;
    /* over NCCL, the pipeline's transfers on channels of their own: as
     * eager as the other backends', which the interleaved order needs */
    if (ex->p->pp > 1 && comm_nccl_channels(ex->axis[2], ex->p->setup.schedule == SCHED_KIND_INTERLEAVED) != 0) {
        set_err(err, errn, "rank %d: making the pipeline's channels: %s", ex->rank, ex->axis[2]->error);
        return -1;
    }
    ex->host_own = ex->world != world;
    if (!ex->host_own) {
        memcpy(ex->haxis, ex->axis, sizeof ex->haxis);
        ex->hdata = ex->data;
        ex->htied = ex->tied;
        return 0;
    }
    return split_groups(ex, world, ex->haxis, &ex->hdata, &ex->htied, err, errn);
}

comm *exec__host_comm(const mesh__exec *ex, comm *c)
{
    if (!c || !ex->host_own) return c;
    for (int a = 0; a < 4; a++)
        if (c == ex->axis[a]) return ex->haxis[a];
    return c == ex->data ? ex->hdata : c == ex->tied ? ex->htied : c == ex->world ? ex->hworld : c;
}

/* A GPU rank's NCCL calls ordered on its compute stream (comm_nccl_order)
 * and its waits for the GPU watching the NCCL world (comm_nccl_watch: a
 * failed rank, an NCCL error or the timeout ends them, naming the last
 * call); with MESH_NCCL_BLOCKING=1 the host waits for the kernels before
 * each call and for the call instead (slower: for comparison, and to see
 * which call a failure came from for sure). */
static int order_nccl(mesh__exec *ex, comm *dworld, char *err, size_t errn)
{
    const char *blocking = getenv("MESH_NCCL_BLOCKING");
    if (!ex->gpu || !dworld || strcmp(dworld->v->name, "nccl") != 0 || (blocking && strcmp(blocking, "1") == 0))
        return 0;
    if (comm_nccl_order(dworld, ex->kern.stream) != 0) {
        set_err(err, errn, "rank %d: %s", ex->rank, dworld->error);
        return -1;
    }
    dev_set_watch(ex->dev, comm_nccl_watch, dworld);
    ex->ordered = 1;
    return 0;
}

mesh__exec *mesh__exec_create_rank(const plan *p, int rank, comm *world, comm *dworld, int gpu, mesh_alloc_fn alloc,
                                   void *ud, unsigned flags, char *err, size_t errn)
{
    char why[160];
    const char *no = refusal(p, why, sizeof why);
    if (!no && p->setup.world > 1 &&
        (!world || world->size != p->setup.world || (dworld && dworld->size != p->setup.world)))
        no = "a plan of more than one rank runs on a communicator of its world's size";
    if (!no && (rank < 0 || rank >= p->setup.world)) no = "the rank is not in the plan's world";
    if (no) {
        set_err(err, errn, "%s", no);
        return NULL;
    }
    mesh__exec *ex = calloc(1, sizeof *ex);
    int n = p->n_tensors;
    if (!ex) goto oom;
    ex->p = p;
    ex->n = n;
    ex->rank = rank;
    ex->alloc = alloc ? alloc : mesh_alloc_default;
    ex->ud = ud;
    ex->data_ranks = (int)(p->setup.dp * p->setup.ep);
    /* the device and its kernels */
    ex->gpu = (flags & MESH__EXEC_CUDA) != 0;
    ex->host_arena = !ex->gpu && !(flags & MESH__EXEC_GUARD);
    ex->esize = (ex->gpu || (flags & MESH__EXEC_CPU16)) && p->setup.precision != 0 ? 2 : 4;
    ex->prec = p->setup.precision == 1 ? KCPU_BF16 : p->setup.precision == 2 ? KCPU_FP16 : KCPU_FP32;
    char derr[400];
    mesh_status dst = flags & MESH__EXEC_GUARD ? dev_open_guarded(&ex->dev, derr, sizeof derr)
                    : dev_open(ex->gpu ? MESH_DEVICE_CUDA : MESH_DEVICE_CPU, ex->gpu ? gpu : 0, &ex->dev, derr, sizeof derr);
    int half = ex->esize == 4 ? 0 : p->setup.precision == 1 ? KERN_BF16 : KERN_FP16;
    if (dst != MESH_OK || kern_open(&ex->kern, ex->dev, half, derr, sizeof derr) != 0) {
        set_err(err, errn, "rank %d: %s", rank, derr);
        goto fail;
    }
    ex->kern.grad32 = ex->prec != KCPU_FP32; /* mixed precision: fp32 main gradients (memplan.h) */
    if (p->setup.world > 1 && (join_axes(ex, world, dworld, flags, err, errn) != 0 ||
                               order_nccl(ex, dworld, err, errn) != 0))
        goto fail;
    /* this rank's pipeline stage: its chunk's layers of the stack */
    ex->stack = -1;
    for (int r = 0; r < p->n_regions; r++)
        if (p->regions[r].is_stack && ex->stack < 0) ex->stack = r;
    ex->stage = ex->coord[2];
    ex->last_stage = p->pp - 1;
    ex->chunks = (int)(p->pp * p->v);
    int lay = layout(ex, flags, err, errn);
    if (lay == -2) goto fail;
    if (lay != 0) goto oom;
    int slots = ex->ms->slots > 0 ? ex->ms->slots : 1;
    ex->numel = exec__host_calloc(ex, (size_t)n, sizeof *ex->numel);
    ex->copies = exec__host_calloc(ex, (size_t)n, sizeof *ex->copies);
    ex->ld = exec__host_calloc(ex, (size_t)n, sizeof *ex->ld);
    ex->iters = exec__host_calloc(ex, (size_t)n, sizeof *ex->iters);
    ex->zero_by = exec__host_calloc(ex, (size_t)n, sizeof *ex->zero_by);
    ex->fuse = exec__host_calloc(ex, (size_t)n, sizeof *ex->fuse);
    ex->cnumel = exec__host_calloc(ex, (size_t)n, sizeof *ex->cnumel);
    ex->params = exec__host_calloc(ex, (size_t)n, sizeof *ex->params);
    ex->names = exec__host_calloc(ex, (size_t)n, sizeof *ex->names);
    ex->moe = exec__host_calloc(ex, (size_t)n, sizeof *ex->moe);
    ex->slot_of = exec__host_calloc(ex, (size_t)(p->m > 0 ? p->m : 1) * (size_t)(p->pp * p->v), sizeof *ex->slot_of);
    ex->slot_busy = exec__host_calloc(ex, (size_t)slots, 1);
    if (!ex->numel || !ex->cnumel || !ex->copies || !ex->ld || !ex->iters || !ex->zero_by || !ex->fuse ||
        !ex->params || !ex->names || !ex->moe || !ex->slot_of ||
        !ex->slot_busy)
        goto oom;
    find_zero_by(ex);
    int parts = exec__step_parts(ex);
    if (parts == -2) {
        set_err(err, errn, "the plan's layer-stack backward is not one run of steps: zero %d not run on it",
                (int)p->setup.zero);
        goto fail;
    }
    if (parts != 0) goto oom;
    ex->tokens_in = ex->targets_in = -1;
    /* the gradient of the mean loss over every micro-batch of every rank */
    ex->dloss = 1.0 / ((double)(p->setup.micro_batches > 0 ? p->setup.micro_batches : 1) * ex->data_ranks);
    ex->loss_scale = 1.0;
    if (ex->prec == KCPU_FP16) { /* PyTorch's GradScaler's defaults */
        ex->scale_dynamic = !(p->setup.loss_scale > 0);
        ex->loss_scale = ex->scale_dynamic ? 65536.0 : p->setup.loss_scale;
        ex->scale_interval = 2000;
    }
    for (int id = 0; id < n; id++) {
        const plan_tensor *t = &p->tensors[id];
        size_t ne = 1;
        for (int d = 0; d < t->rank; d++) {
            int64_t split = t->pl.kind[1] == PL_SPLIT && t->pl.dim[1] == d ? p->setup.tp : 1;
            if (t->op == G_PARAM && t->pl.kind[3] == PL_SPLIT && t->pl.dim[3] == d) split *= p->setup.ep;
            ex->ld[id][d] = t->dims[d] / split;
            ne *= (size_t)ex->ld[id][d];
        }
        /* as consumers read it: split or made whole over tp by its forward conversion */
        ex->cnumel[id] = ne;
        for (int k = 0; k < p->n_steps; k++) {
            const plan_step *st = &p->steps[k];
            if (st->node != id || st->phase != PLAN_FORWARD || st->axis != 1 || t->op == G_PARAM) continue;
            if (st->kind == STEP_ALL_GATHER) ex->cnumel[id] = ne * (size_t)p->setup.tp;
            if (st->kind == STEP_REDUCE_SCATTER || st->kind == STEP_SLICE) ex->cnumel[id] = ne / (size_t)p->setup.tp;
        }
        size_t room = ex->cnumel[id] > ne ? ex->cnumel[id] : ne; /* an all-gather's room */
        int64_t want = (int64_t)(room * (t->dtype == PLAN_DTYPE_I32 ? 4 : (size_t)ex->esize));
        if (t->op != G_PARAM) want = memplan_round(&ex->mp, want); /* an activation's room */
        if (t->op != G_TRANSPOSE && want != exec__buf_of(ex, id)->bytes) {
            set_err(err, errn, "tensor %d: %zu elements on this rank, not the memory plan's", id, ne);
            goto fail;
        }
        int iters = t->region >= 0 ? (int)p->regions[t->region].count : 1;
        ex->numel[id] = ne;
        ex->iters[id] = iters;
        if (t->op == G_MOE) {
            int rc = moe_setup(ex, id);
            if (rc == -2 || rc == -3) {
                set_err(err, errn,
                        rc == -2 ? "moe tensor %d: the %s kernels' routing does not fit in the memory plan's room"
                                 : "moe tensor %d: an expert-parallel group of more than 64 ranks (%s)",
                        id, ex->kern.v->name);
                goto fail;
            }
            if (rc != 0) goto oom;
        }
        if (t->op == G_INPUT) {
            if (ex->tokens_in < 0) ex->tokens_in = id;
            else ex->targets_in = id;
        }
        if (t->op != G_PARAM || exec__buf_of(ex, id)->region != MEM_PERSISTENT) continue; /* held on another stage */
        ex->params[ex->n_params++] = id;
        ex->copies[id] = iters;
        if (exec__in_stack(ex, id)) { /* the layers of the stage's chunks */
            ex->copies[id] = 0;
            for (int c = ex->stage; c < ex->chunks; c += (int)p->pp) ex->copies[id] += (int)p->chunk_layers[c];
        }
        ex->names[id] = exec__host_calloc(ex, (size_t)ex->copies[id] + 1, sizeof *ex->names[id]);
        if (!ex->names[id]) goto oom;
        for (int c = 0; c < ex->copies[id]; c++) {
            int it = exec__copy_it(ex, id, c);
            char *name = iter_name(ex, t->name ? t->name : "?", it);
            if (!name) goto oom;
            ex->names[id][c] = name;
        }
    }
    /* deterministic: only where the gradients are whole (no ZeRO) and the
     * ranks differ only in their data */
    ex->chain = (flags & MESH__EXEC_DETERMINISTIC) && ex->data && p->setup.zero == 0;
    if (exec__check_kernels(ex, err, errn) != 0) goto fail;
    find_fusions(ex, flags);
    ex->loss_read = p->loss >= 0 && readers(p, p->loss) > 0;
    ex->loss_terms = loss_of_terms(p);
    int lo = exec__loss_open(ex);
    if (lo == -2) {
        set_err(err, errn, "%s", ex->error);
        goto fail;
    }
    if (lo != 0) goto oom;
    int shards = exec__optimizer_shards(ex);
    if (shards == -2) {
        set_err(err, errn, "rank %d: the optimizer's shards are not the memory plan's", rank);
        goto fail;
    }
    int init = shards == 0 ? exec__init_params(ex) : -1;
    if (init == -2) { /* a device call failed */
        set_err(err, errn, "%s", ex->error);
        goto fail;
    }
    if (init != 0) goto oom;
    int ov = exec__overlap_init(ex, flags);
    if (ov == -2) {
        set_err(err, errn, "%s", ex->error);
        goto fail;
    }
    if (ov != 0) goto oom;
    if (exec__turns_init(ex) != 0) {
        set_err(err, errn, "%s", ex->error);
        goto fail;
    }
    ex->prof.on = (flags & MESH__EXEC_PROFILE) != 0;
    if (exec__prof_init(ex) != 0) {
        set_err(err, errn, "%s", ex->error);
        goto fail;
    }
    if (ex->tokens_in < 0 || ex->targets_in < 0) {
        set_err(err, errn, "the model needs two inputs (tokens and targets)");
        goto fail;
    }
    return ex;
oom:
    set_err(err, errn, "rank %d: out of memory", rank);
fail:
    if (world && p->setup.world > 1) comm_abort(world, err); /* the others stop rather than wait */
    mesh__exec_free(ex);
    return NULL;
}

int mesh__exec_rank(const mesh__exec *ex) { return ex->rank; }

int mesh__exec_ordered(const mesh__exec *ex) { return ex->ordered; }

int mesh__exec_fused(const mesh__exec *ex) { return ex->n_fused; }

long long mesh__exec_host_reads(const mesh__exec *ex) { return ex->dev->to_host; }

long long mesh__exec_gpu_waits(const mesh__exec *ex) { return ex->dev->waits; }

void *mesh__exec_stream(const mesh__exec *ex) { return ex->kern.stream; }

long long mesh__exec_queue_ahead(const mesh__exec *ex, long long *waits)
{
    if (waits) *waits = ex->ov_mark[0].joins + ex->ov_mark[1].joins;
    return ex->ov_mark[0].ahead + ex->ov_mark[1].ahead;
}

int mesh__exec_stage(const mesh__exec *ex) { return ex->stage; }

comm *mesh__exec_host_world(const mesh__exec *ex) { return ex->hworld; }

comm *mesh__exec_pipeline(const mesh__exec *ex, int *stage, int *lead)
{
    *stage = ex->stage;
    *lead = ex->coord[0] == 0 && ex->coord[1] == 0 && ex->coord[3] == 0;
    return ex->haxis[2];
}

size_t mesh__exec_bytes(const mesh__exec *ex) { return (size_t)ex->ms->total; }

size_t mesh__exec_kernel_bytes(const mesh__exec *ex) { return ex->dev ? ex->dev->held : 0; /* (a CPU's: 0) */ }

int mesh__exec_gpu(const mesh__exec *ex) { return ex->gpu; }

size_t mesh__exec_host_bytes(const mesh__exec *ex) { return ex->host_bytes; }

const float *mesh__exec_logits(mesh__exec *ex, int *vocab_padded)
{
    int id = ex->p->tensors[ex->p->loss].in[0];
    *vocab_padded = (int)exec__last_dim(&ex->p->tensors[id]);
    const float *lg = exec__val_in(ex, id, -1, 0);
    if (ex->host_arena) return lg;
    size_t n = ex->numel[id];
    if (!ex->logits_host) ex->logits_host = exec__host_calloc(ex, n, sizeof *ex->logits_host);
    if (!ex->logits_host || exec__floats_to_host(ex, ex->logits_host, lg, n) != 0) return NULL;
    return ex->logits_host;
}

void mesh__exec_free(mesh__exec *ex)
{
    if (!ex) return;
    if (ex->ordered) { /* the NCCL work on the compute stream ends (or its world fails) before anything is freed */
        (void)dev_stream_sync(ex->dev, (dev_stream *)ex->kern.stream);
        dev_set_watch(ex->dev, NULL, NULL);
    }
    for (int id = 0; id < ex->n; id++) {
        for (int c = 0; ex->names && ex->names[id] && c < ex->copies[id]; c++) ex_free(ex, ex->names[id][c]);
        if (ex->names) ex_free(ex, ex->names[id]);
        if (ex->moe) ex_free(ex, ex->moe[id]);
    }
    exec__overlap_free(ex); /* its queues use the arena and the groups */
    exec__turns_free(ex);
    exec__prof_free(ex);
    if (ex->data != ex->axis[0]) comm_free(ex->data);
    for (int a = 0; a < 4; a++) comm_free(ex->axis[a]);
    comm_free(ex->tied);
    if (ex->host_own) {
        if (ex->hdata != ex->haxis[0]) comm_free(ex->hdata);
        for (int a = 0; a < 4; a++) comm_free(ex->haxis[a]);
        comm_free(ex->htied);
    }
    comm_free(ex->checked);
    exec__loss_close(ex);
    if (!ex->host_arena) dev_free(ex->dev, ex->arena);
    else ex_free(ex, ex->arena);
    kern_close(&ex->kern);
    dev_close(ex->dev);
    ex_free(ex, ex->logits_host);
    ex_free(ex, ex->moe);
    ex_free(ex, ex->numel);
    ex_free(ex, ex->cnumel);
    ex_free(ex, ex->copies);
    ex_free(ex, ex->ld);
    ex_free(ex, ex->iters);
    ex_free(ex, ex->zero_by);
    ex_free(ex, ex->fuse);
    ex_free(ex, ex->params);
    ex_free(ex, ex->names);
    ex_free(ex, ex->gbufs);
    ex_free(ex, ex->gsizes);
    ex_free(ex, ex->gsplit);
    ex_free(ex, ex->gss);
    ex_free(ex, ex->adam);
    ex_free(ex, ex->shard);
    ex_free(ex, ex->opt_at);
    ex_free(ex, ex->slot_of);
    ex_free(ex, ex->slot_busy);
    ex_free(ex, ex->step_part);
    memplan_free(&ex->mp);
    free(ex);
}
