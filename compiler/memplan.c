/* memplan.c — the static memory plan (memplan.h). */
#include "memplan.h"

#include <math.h>   /* ceil */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memset */

#include "plan.h"

enum { SEG_PRE = MEM_PART_PRE, SEG_LAYER = MEM_PART_LAYER, SEG_POST = MEM_PART_POST, SEG_COUNT };
enum { AX_DP, AX_TP, AX_PP, AX_EP };

typedef struct mp {
    const plan *p;
    memplan *m;
    int n;
    int stack;           /* the layer stack's region, -1 if none */
    int64_t layers;      /* its iterations */
    int fb;              /* bytes of a float element */
    int gb;              /* bytes of a param's gradient element: 4 (fp32 main gradients, memplan.h) */
    int no_reuse;        /* MEMPLAN_NO_REUSE */
    int masters;         /* the optimizer state has fp32 master params (fb 2, or MEMPLAN_MASTERS) */
    int *seg;            /* per tensor: SEG_* */
    int *last;           /* per tensor: last consumer in its segment, -1 if none */
    char *saved;         /* per tensor: its value is kept for backward */
    char *cross;         /* per tensor: used in another segment */
    mem_buf *b;          /* stage 0's buffers (the others differ in params only) */
} mp;

static int64_t numel(const plan_tensor *t) {
    int64_t e = 1;
    for (int d = 0; d < t->rank; d++) e *= t->dims[d];
    return e;
}

static int64_t last_dim(const plan_tensor *t) { return t->rank ? t->dims[t->rank - 1] : 1; }

static int in_region(const plan *p, int id, int r) {
    for (int q = p->tensors[id].region; q >= 0; q = p->regions[q].parent)
        if (q == r) return 1;
    return 0;
}

/* Copies of tensor id per run of its segment: the iterations of the
 * repeats around it other than the layer stack. */
static int64_t reps(const mp *x, int id) {
    int64_t c = 1;
    for (int r = x->p->tensors[id].region; r >= 0; r = x->p->regions[r].parent)
        if (r != x->stack) c *= x->p->regions[r].count;
    return c;
}

/* Is tensor id all-gathered over tp in place (sequence parallelism: a
 * norm's sequence-split output made whole for a column-parallel product)? */
static int gathered_over_tp(const plan *p, int id) {
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *st = &p->steps[i];
        if (st->node == id && st->phase == PLAN_FORWARD && st->kind == STEP_ALL_GATHER && st->axis == AX_TP) return 1;
    }
    return 0;
}

/* Elements of tensor id on one rank, as produced. */
static int64_t local_elems(const mp *x, int id) {
    const plan_tensor *t = &x->p->tensors[id];
    int64_t e = numel(t);
    if (t->pl.kind[AX_TP] == PL_SPLIT) e /= x->p->setup.tp;
    if (t->op == G_PARAM && t->pl.kind[AX_EP] == PL_SPLIT) e /= x->p->setup.ep;
    return e;
}

/* Bytes of tensor id's value (and gradient) on one rank: with room for the
 * whole over tp when it is all-gathered over tp in place (the runtime
 * converts a tensor's value and its gradient in their own buffers). */
/* Every activation's room, every slot entry and every region is rounded
 * up to 16 bytes, so that the fp32 statistics and int32 ids after bf16
 * values are aligned, and so is every buffer for a GPU's 16-byte loads.
 * In fp32 plans too: a GPU kernel that takes packs where its buffers allow
 * them (the norms', the cross-entropy's) sums in another order where they
 * do not, so a 4-byte loss placed before them made a plan with full
 * recomputation train other bits than the same plan without it (found by
 * tests/sweep/mesh_sweep.py's --deterministic runs on the emulated GPU);
 * the layout no longer decides a result's bits. */
static int64_t round16(int64_t bytes) { return (bytes + 15) & ~(int64_t)15; }

int64_t memplan_round(const memplan *m, int64_t bytes) {
    (void)m;
    return round16(bytes);
}

static int64_t local_bytes(const mp *x, int id) {
    const plan_tensor *t = &x->p->tensors[id];
    int64_t e = local_elems(x, id);
    if (t->pl.kind[AX_TP] == PL_SPLIT && gathered_over_tp(x->p, id)) e *= x->p->setup.tp;
    return round16(e * (t->dtype == PLAN_DTYPE_I32 ? 4 : x->fb));
}

/* A transpose of a param read only as a matmul's weight: the matmul reads
 * the param through it, so it takes no memory. */
static int is_view(const plan *p, int id) {
    const plan_tensor *t = &p->tensors[id];
    if (t->op != G_TRANSPOSE || p->tensors[t->in[0]].op != G_PARAM) return 0;
    for (int c = id + 1; c < p->n_tensors; c++)
        for (int k = 0; k < p->tensors[c].n_in; k++)
            if (p->tensors[c].in[k] == id && !(p->tensors[c].op == G_MATMUL && k == 1)) return 0;
    return 1;
}

/* Takes memory as an activation: computed per micro-batch. */
static int is_activation(const plan *p, int id) {
    return p->tensors[id].op != G_PARAM && !is_view(p, id);
}

/* (not a position embedding's: its add writes its table's gradient,
 * memplan_pos_table) */
static int has_grad(const plan *p, int id) {
    return is_activation(p, id) && p->tensors[id].dtype == PLAN_DTYPE_F32 && memplan_pos_table(p, id) < 0;
}

/* Does op c's backward read its input k (k >= 0), or its output (k = -1)? */
static int backward_reads(const plan_tensor *c, int k) {
    switch (c->op) {
    case G_MATMUL: return k >= 0;                     /* dW = x^T dy, dx = dy W^T */
    case G_LAYERNORM:
    case G_RMSNORM:
    case G_GELU:
    case G_SILU: return k == 0;
    case G_SWIGLU:
    case G_MUL: return k >= 0;
    case G_ATTENTION: return 1;                       /* q, k, v and the output */
    case G_EMBED: return k == 0;                      /* the ids */
    case G_CROSS_ENTROPY: return k >= 0;              /* logits and targets */
    case G_MOE: return k == 0;                        /* the rest is in its statistics */
    default: return 0;
    }
}

int64_t memplan_moe_capacity(int64_t N, int64_t E, int64_t K, double factor) {
    double c = factor * (double)N * (double)K / (double)E;
    double up = ceil(c - 1e-9 * c);
    if (N > 0 && up < 1.0) up = 1.0;
    return (int64_t)up;
}


static int64_t align256(int64_t n) { return (n + 255) & ~(int64_t)255; }

int64_t memplan_moe_route_bytes(int64_t N, int64_t E, int64_t K, int64_t C) {
    /* expert, weight, slot [N, K]; token [E, C]; count, chosen [E]; probs
     * [N, E]: the CPU's arrays; the GPU's, 256-byte aligned, also keep the
     * per-expert mean probabilities [E] (double) and two scalars (the
     * dropped pairs, the aux loss), 256 bytes each. Both fit in this. */
    return 3 * align256(N * K * 4) + align256(E * C * 4) + 2 * align256(E * 4) + align256(N * E * 4) +
           align256(E * 8) + 2 * 256;
}

/* A moe layer's shapes on one rank: its N tokens routed over all E
 * experts, each taking up to C of them (the capacity per source rank: with
 * ep an expert receives C rows from each rank of its ep group); the
 * experts' hidden width F split over tp. */
static void moe_dims(const mp *x, int id, int64_t *N, int64_t *E, int64_t *K, int64_t *C, int64_t *D, int64_t *F) {
    const plan_tensor *t = &x->p->tensors[id], *wg = &x->p->tensors[t->in[2]];
    *D = last_dim(t);
    *N = local_elems(x, id) / *D;
    *E = wg->dims[0];
    *F = wg->dims[2] / (wg->pl.kind[AX_TP] == PL_SPLIT ? x->p->setup.tp : 1);
    *K = t->top_k;
    *C = memplan_moe_capacity(*N, *E, *K, t->capacity);
}

/* Expert-parallel moe keeps both sides of its exchanges: the rows it sends
 * and receives, the outputs it computes and gets back (4 buffers of [E, C,
 * D], and the received counts); on one ep rank they are one pair. */
static int moe_ep(const mp *x, int id) {
    const plan_tensor *t = &x->p->tensors[id];
    return x->p->setup.ep > 1 && x->p->tensors[t->in[2]].pl.kind[AX_EP] == PL_SPLIT;
}

/* Bytes an op keeps for backward beyond tensors: row statistics, moe's
 * routing and expert buffers. */
static int64_t aux_bytes(const mp *x, int id) {
    const plan *p = x->p;
    const plan_tensor *t = &p->tensors[id];
    if (t->op == G_CROSS_ENTROPY) /* loss, max and sum per token */
        return 3 * local_elems(x, t->in[1]) * 4;
    if (t->rank == 0) return 0;
    int64_t rows = local_elems(x, id) / last_dim(t);
    switch (t->op) {
    case G_LAYERNORM: return rows * 2 * 4;              /* mean, 1/std in fp32 */
    case G_RMSNORM: return rows * 4;                    /* 1/rms */
    case G_ATTENTION: {                                 /* log-sum-exp per row and head */
        int64_t d = last_dim(t) / (t->heads > 0 ? t->heads : 1);
        return local_elems(x, id) / (d > 0 ? d : 1) * 4;
    }
    case G_MOE: {
        int64_t N, E, K, C, D, F;
        moe_dims(x, id, &N, &E, &K, &C, &D, &F);
        /* routing; xe, ye [E, C, D] (with ep also what is received, and
         * the received counts [E]); hg, hu, act [E, C, F] */
        int ep = moe_ep(x, id);
        return memplan_moe_route_bytes(N, E, K, C) + ((ep ? 4 : 2) * E * C * D + 3 * E * C * F + (ep ? E : 0)) * 4;
    }
    default: return 0;
    }
}

/* Scratch of an op's backward: moe's dxe, dye [E, C, D], dweight [N, K]
 * and max([N, E], [2, C, F]). */
static int64_t scratch_bytes(const mp *x, int id) {
    if (x->p->tensors[id].op != G_MOE) return 0;
    int64_t N, E, K, C, D, F;
    moe_dims(x, id, &N, &E, &K, &C, &D, &F);
    int64_t s = N * E > 2 * C * F ? N * E : 2 * C * F;
    return ((moe_ep(x, id) ? 4 : 2) * E * C * D + N * K + s) * 4;
}

/* ---- first fit over live intervals ------------------------------------- */

typedef struct block {
    int64_t off, size;
    int end;
} block;

typedef struct interval {
    int start, end;
    int64_t size;
    int64_t *off;        /* receives the offset */
} interval;

static int by_start(const void *a, const void *b) {
    const interval *x = a, *y = b;
    return x->start != y->start ? (x->start > y->start) - (x->start < y->start)
                                : (x->off > y->off) - (x->off < y->off); /* stable: creation order */
}

/* Places the intervals, lowest gap first (or each after the last, with
 * no_reuse), and returns the peak, or -1. */
static int64_t first_fit(interval *iv, int n, int no_reuse) {
    block *live = calloc((size_t)(n ? n : 1), sizeof *live);
    if (!live) return -1;
    qsort(iv, (size_t)n, sizeof *iv, by_start);
    int nl = 0;
    int64_t peak = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        for (int j = 0; j < nl; j++)
            if (live[j].end >= iv[i].start) live[k++] = live[j];
        nl = k;
        int64_t at = no_reuse ? peak : 0;
        for (int moved = !no_reuse; moved;) {
            moved = 0;
            for (int j = 0; j < nl; j++)
                if (at < live[j].off + live[j].size && live[j].off < at + iv[i].size) {
                    at = live[j].off + live[j].size;
                    moved = 1;
                }
        }
        *iv[i].off = at;
        live[nl++] = (block){at, iv[i].size, iv[i].end};
        if (at + iv[i].size > peak) peak = at + iv[i].size;
    }
    free(live);
    return peak;
}

/* The shared workspace of one segment: forward temporaries (pass 0) or
 * backward gradients and scratch (pass 1, in reverse node order; a bias
 * add's gradient until its matmul's backward, which reads it, and a GELU's
 * input's from the backward of the matmul that reads the GELU: grad_alias). */
static int64_t shared_peak(mp *x, int seg, int pass) {
    const plan *p = x->p;
    int n = x->n, cnt = 0;
    interval *iv = calloc((size_t)(2 * n + 1), sizeof *iv);
    int *until = malloc((size_t)(n ? n : 1) * sizeof *until), *from = malloc((size_t)(n ? n : 1) * sizeof *from);
    if (!iv || !until || !from) {
        free(iv);
        free(until);
        free(from);
        return -1;
    }
    for (int id = 0; id < n; id++) until[id] = id, from[id] = x->last[id] >= 0 ? x->last[id] : id;
    for (int id = 0; id < n; id++) {
        int a = x->b[id].grad_alias;
        if (a < 0) continue;
        if (id < a && id < until[a]) until[a] = id;                  /* a matmul's: until it reads it */
        if (id > a && from[id] > from[a]) from[a] = from[id];        /* a GELU's: from its reader's backward */
    }
    for (int id = 0; id < n; id++) {
        mem_buf *b = &x->b[id];
        if (x->seg[id] != seg || !is_activation(p, id)) continue;
        int last = x->last[id] >= 0 ? x->last[id] : id;
        if (pass == 0 && b->region == MEM_WORKSPACE) {
            iv[cnt++] = (interval){id, last, b->bytes * reps(x, id), &b->offset};
        } else if (pass == 1) {
            if (b->grad_region == MEM_WORKSPACE)
                iv[cnt++] = (interval){n - 1 - from[id], n - 1 - until[id], b->bytes * reps(x, id), &b->grad_offset};
            if (b->scratch) iv[cnt++] = (interval){n - 1 - id, n - 1 - id, b->scratch, &b->scratch_offset};
        }
    }
    /* creation order breaks ties: the offset fields are in tensor order */
    int64_t peak = first_fit(iv, cnt, x->no_reuse);
    free(iv);
    free(until);
    free(from);
    return peak;
}

/* ---- the plan ---------------------------------------------------------- */

/* Segments, last consumers, what is used across segments, and what the
 * runtime cannot follow. */
static void classify(mp *x) {
    const plan *p = x->p;
    for (int id = 0; id < x->n; id++) {
        x->seg[id] = x->stack >= 0 && in_region(p, id, x->stack) ? SEG_LAYER
                   : x->stack < 0 || id < p->regions[x->stack].first ? SEG_PRE : SEG_POST;
        x->last[id] = -1;
    }
    /* an input belongs to the segment of its first consumer */
    for (int id = 0; id < x->n; id++) {
        if (p->tensors[id].op != G_INPUT) continue;
        for (int c = id + 1, found = 0; c < x->n && !found; c++)
            for (int k = 0; k < p->tensors[c].n_in && !found; k++)
                if (p->tensors[c].in[k] == id) {
                    x->seg[id] = x->seg[c];
                    found = 1;
                }
    }
    for (int c = 0; c < x->n; c++)
        for (int k = 0; k < p->tensors[c].n_in; k++) {
            int id = p->tensors[c].in[k];
            if (x->seg[c] == x->seg[id]) x->last[id] = c;
            else x->cross[id] = 1;
        }
    for (int r = 0; r < p->n_regions; r++) {
        const plan_region *g = &p->regions[r];
        if (g->parent >= 0) x->m->unsupported = "nested repeats";
        if (r != x->stack && g->n_carry > 0) x->m->unsupported = "a repeat that carries values, other than the layer stack";
    }
    if (x->stack < 0) return;
    const plan_region *st = &p->regions[x->stack];
    for (int c = 0; c < st->n_carry; c++) {
        x->cross[st->carry[c].exit] = x->cross[st->carry[c].entry] = 1;
        for (int u = st->end; u < x->n; u++)
            for (int k = 0; k < p->tensors[u].n_in; k++)
                if (p->tensors[u].in[k] == st->carry[c].entry)
                    x->m->unsupported = "a value carried into the layer stack and also used after it";
    }
    for (int u = st->end; u < x->n; u++)
        for (int k = 0; k < p->tensors[u].n_in; k++) {
            int id = p->tensors[u].in[k], carried = 0;
            for (int c = 0; c < st->n_carry; c++) carried |= st->carry[c].exit == id;
            if (x->seg[id] == SEG_LAYER && !carried)
                x->m->unsupported = "a layer-stack value used after the stack other than the one it carries";
        }
}

static int is_carried(const mp *x, int id) {
    if (x->stack < 0) return 0;
    const plan_region *st = &x->p->regions[x->stack];
    for (int c = 0; c < st->n_carry; c++)
        if (st->carry[c].entry == id || st->carry[c].exit == id) return 1;
    return 0;
}

/* Values: which are kept, and their place in a slot (or the recompute
 * area); the parts' sizes. */
static void place_values(mp *x) {
    const plan *p = x->p;
    int recompute = p->setup.recompute && x->stack >= 0;
    for (int c = 0; c < x->n; c++) {
        const plan_tensor *t = &p->tensors[c];
        if (backward_reads(t, -1)) x->saved[c] = 1;
        for (int k = 0; k < t->n_in; k++)
            if (backward_reads(t, k) && is_activation(p, t->in[k])) x->saved[t->in[k]] = 1;
    }
    int64_t rec = 0;
    for (int id = 0; id < x->n; id++) {
        mem_buf *b = &x->b[id];
        b->part = (signed char)x->seg[id];
        b->carried = (signed char)is_carried(x, id);
        if (!is_activation(p, id)) continue;
        b->bytes = local_bytes(x, id);
        b->aux = aux_bytes(x, id);
        b->scratch = scratch_bytes(x, id);
        int64_t copies = reps(x, id);
        if (x->cross[id] || b->aux || p->tensors[id].op == G_INPUT) x->saved[id] = 1;
        if (!x->saved[id]) {
            b->region = MEM_WORKSPACE; /* placed by liveness below */
            b->stride = copies > 1 ? b->bytes : 0;
            continue;
        }
        int64_t one = round16(b->bytes + b->aux);
        if (recompute && x->seg[id] == SEG_LAYER && !b->carried) {
            b->region = MEM_RECOMPUTE;
            b->offset = rec;
            rec += one * copies;
        } else {
            b->region = MEM_SLOT;
            b->offset = x->m->part_bytes[x->seg[id]];
            x->m->part_bytes[x->seg[id]] += one * copies;
        }
        b->stride = copies > 1 ? one : 0;
    }
    for (int id = 0; id < x->n; id++)
        if (x->b[id].region == MEM_SLOT && x->seg[id] == SEG_LAYER) x->b[id].stride = x->m->part_bytes[SEG_LAYER];
    for (int s = 0; s < x->m->pp; s++) x->m->stage[s].recompute = rec;
}

/* The one op that reads id, and at which of its inputs (*k); -1 when
 * none does, or id is read twice. */
static int sole_reader(const plan *p, int id, int *k) {
    int reader = -1;
    for (int c = id + 1; c < p->n_tensors; c++)
        for (int j = 0; j < p->tensors[c].n_in; j++) {
            if (p->tensors[c].in[j] != id) continue;
            if (reader >= 0) return -1; /* read twice */
            reader = c;
            *k = j;
        }
    return reader;
}

/* Are a and b (a < b) in one region, with no repeat starting between
 * them (other segments, maybe other stages)? */
static int one_segment(const plan *p, int a, int b) {
    if (p->tensors[a].region != p->tensors[b].region) return 0;
    for (int r = 0; r < p->n_regions; r++)
        if (p->regions[r].first > a && p->regions[r].first < b) return 0;
    return 1;
}

/* Is a converted by a step (an all-reduce of a partial sum, a tp exchange)? */
static int converted(const plan *p, int a) {
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].node == a && p->steps[s].kind != STEP_COMPUTE) return 1;
    return 0;
}

/* one_segment, and a not converted. */
static int adjacent(const plan *p, int a, int b) { return one_segment(p, a, b) && !converted(p, a); }

/* Can a and b have one gradient buffer: both with a gradient, of one shape
 * and placement? */
static int same_layout(const plan *p, int a, int b) {
    const plan_tensor *ta = &p->tensors[a], *tb = &p->tensors[b];
    if (!has_grad(p, a) || !has_grad(p, b) || ta->rank != tb->rank) return 0;
    for (int d = 0; d < ta->rank; d++)
        if (ta->dims[d] != tb->dims[d]) return 0;
    for (int x = 0; x < SHARD_AXES; x++)
        if (ta->pl.kind[x] != tb->pl.kind[x] || (ta->pl.kind[x] == PL_SPLIT && ta->pl.dim[x] != tb->pl.dim[x]))
            return 0;
    return 1;
}

/* mem_buf.grad_alias's rules. A matmul read by a bias add alone (x @ w +
 * b): the bias add's gradient, which its backward passes on unchanged. A
 * GELU whose input it alone reads and whose value one matmul alone reads,
 * as x: its input's gradient, where that matmul's backward writes the
 * product and the GELU's backward then its own result over it, in place
 * (or the two in one kernel, which writes the input's gradient while the
 * matmul's output gradient is still read: exec.c, find_fusions). */
static int grad_alias(const mp *x, int id) {
    const plan *p = x->p;
    const plan_tensor *t = &p->tensors[id];
    int k = -1, reader = sole_reader(p, id, &k);
    if (reader < 0) return -1;
    const plan_tensor *b = &p->tensors[reader];
    if (t->op == G_MATMUL) {
        int ok = b->op == G_BIAS_ADD && b->n_in == 2 && k == 0 && b->in[1] != id && same_layout(p, id, reader) &&
                 adjacent(p, id, reader);
        return ok ? reader : -1;
    }
    int in = t->n_in == 1 ? t->in[0] : -1, j = -1;
    if (t->op != G_GELU || b->op != G_MATMUL || k != 0 || b->in[1] == id || in < 0 || sole_reader(p, in, &j) != id ||
        x->cross[in] || x->cross[id] || x->b[in].carried || x->b[id].carried || !same_layout(p, in, id) ||
        !adjacent(p, in, id) || !adjacent(p, id, reader))
        return -1;
    return in;
}

/* mem_buf.grad_in_value's rule: the logits of the loss's cross-entropy,
 * read by it alone, in its segment, kept in a slot (for its backward). */
static int grad_in_value(const mp *x, int id) {
    const plan *p = x->p;
    int ce = p->loss;
    if (ce < 0 || p->tensors[ce].op != G_CROSS_ENTROPY || p->tensors[ce].n_in < 1 ||
        p->tensors[ce].in[0] != id || !has_grad(p, id) || x->b[id].region != MEM_SLOT || x->b[id].carried ||
        x->cross[id] || x->seg[id] != x->seg[ce])
        return 0;
    for (int c = id + 1; c < p->n_tensors; c++)
        for (int k = 0; k < p->tensors[c].n_in; k++)
            if (p->tensors[c].in[k] == id && (c != ce || k != 0)) return 0;
    return 1;
}

/* Gradients of activations: pinned when used across segments (a carried
 * value's as a pair), else shared by liveness (none for a matmul's that is
 * its bias add's: grad_alias; the loss's logits' is their value's:
 * grad_in_value). */
static int64_t place_grads(mp *x) {
    const plan *p = x->p;
    int64_t pin = 0;
    for (int id = 0; id < x->n; id++) {
        mem_buf *b = &x->b[id];
        b->grad_alias = grad_alias(x, id);
        b->grad_in_value = (signed char)grad_in_value(x, id);
        if (b->grad_in_value) {
            b->grad_region = b->region;
            b->grad_offset = b->offset;
            b->grad_stride = b->stride;
        }
    }
    if (x->stack >= 0) { /* the stack's carries first: entry and exit share a pair */
        const plan_region *st = &p->regions[x->stack];
        for (int c = 0; c < st->n_carry; c++) {
            mem_buf *in = &x->b[st->carry[c].entry], *out = &x->b[st->carry[c].exit];
            if (!has_grad(p, st->carry[c].exit)) continue;
            /* two slots of the larger (under sequence parallelism an entry
             * reduce-scattered over tp has room for the whole) */
            int64_t slot = in->bytes > out->bytes ? in->bytes : out->bytes;
            in->grad_region = out->grad_region = MEM_PINNED;
            in->grad_offset = out->grad_offset = pin;
            in->grad_stride = out->grad_stride = slot;
            pin += 2 * slot;
        }
    }
    for (int id = 0; id < x->n; id++) {
        mem_buf *b = &x->b[id];
        if (!has_grad(p, id) || b->grad_region != MEM_NONE || b->grad_alias >= 0) continue;
        int64_t copies = reps(x, id);
        b->grad_stride = copies > 1 ? b->bytes : 0;
        if (x->cross[id]) {
            b->grad_region = MEM_PINNED;
            b->grad_offset = pin;
            pin += b->bytes * copies;
        } else {
            b->grad_region = MEM_WORKSPACE;
        }
    }
    return pin;
}

/* Is a position embedding id sliced over tp along its rows (sequence
 * parallelism's: the add's other side split over the sequence), every
 * step converting it that slice or its dual, the gradient's all-gather? */
static int pos_sliced(const plan *p, int id) {
    int sliced = 0;
    for (int s = 0; s < p->n_steps; s++) {
        const plan_step *st = &p->steps[s];
        if (st->node != id || st->kind == STEP_COMPUTE) continue;
        int fwd = st->phase == PLAN_FORWARD && st->kind == STEP_SLICE;
        int bwd = st->phase == PLAN_BACKWARD && st->kind == STEP_ALL_GATHER;
        if ((!fwd && !bwd) || st->axis != AX_TP || st->dim != 0 || st->recompute) return 0;
        sliced |= fwd;
    }
    return sliced;
}

int memplan_pos_table(const plan *p, int id) {
    if (id < 0 || p->setup.precision == 0) return -1;
    const plan_tensor *e = &p->tensors[id];
    if (e->op != G_EMBED || e->n_in != 2 || p->tensors[e->in[0]].op != G_ARANGE) return -1;
    int table = e->in[1], k = -1, add = sole_reader(p, id, &k);
    const plan_tensor *tb = &p->tensors[table];
    if (tb->op != G_PARAM || (tb->pl.kind[AX_TP] == PL_SPLIT && tb->pl.dim[AX_TP] == 0) ||
        (e->pl.kind[AX_TP] == PL_SPLIT && e->pl.dim[AX_TP] == 0) || add < 0 || p->tensors[add].op != G_ADD)
        return -1;
    if (!one_segment(p, id, add)) return -1;
    if (!converted(p, id)) return table;
    /* sliced: each rank sums its rows, which the all-gather then gathers
     * in the table's gradient itself; no other op may add to it there */
    return pos_sliced(p, id) && sole_reader(p, table, &k) == id ? table : -1;
}

int memplan_pos_sliced(const plan *p, int id) { return memplan_pos_table(p, id) >= 0 && converted(p, id); }

int memplan_pos_gather_step(const plan *p, int si) {
    const plan_step *st = &p->steps[si];
    return st->axis == AX_TP && st->kind == STEP_ALL_GATHER && st->phase == PLAN_BACKWARD &&
           p->tensors[st->node].op == G_EMBED && memplan_pos_sliced(p, st->node);
}

int memplan_step_elem_bytes(const plan *p, int si) {
    const plan_step *st = &p->steps[si];
    int grads = (st->phase == PLAN_BACKWARD || st->phase == PLAN_GRAD_SYNC) && !st->recompute &&
                st->kind != STEP_ALL_GATHER && p->tensors[st->node].op == G_PARAM;
    return grads || p->setup.precision == 0 || memplan_pos_gather_step(p, si) ? 4 : 2;
}

int64_t memplan_value_bytes(const plan *p, int id) {
    mp x = {0};
    x.p = p;
    x.fb = p->setup.precision == 0 ? 4 : 2;
    return local_bytes(&x, id);
}

/* The tensor whose gradient an op's backward adds to for its input id: a
 * param's for x @ transpose(w) and for a position embedding
 * (memplan_pos_table), else id's. */
static int param_of(const plan *p, int id) {
    if (id >= 0 && p->tensors[id].op == G_TRANSPOSE) return p->tensors[id].in[0];
    int table = memplan_pos_table(p, id);
    return table >= 0 ? table : id;
}

/* Where an op's kernel writes a param's gradient in fp32 itself (kern.h's
 * dw32): a matmul's w, an embedding's table, a norm's weight and bias (its
 * column sums), either side of an add (a bias's or a position embedding's
 * sums over the rows; the same-shaped side: an fp32 add). (moe's expert
 * weights are staged: the CPU's products added into fp32 in place differ in
 * their last bits with the buffers' alignment, which the 2-byte layout and
 * the CPU's fp32 words do not share, and their runs must give the same
 * bits.) */
static int fused_slot(const plan *p, const plan_tensor *t, int k) {
    /* (only a matmul reads through a transpose; an add, a position embedding) */
    if (t->op != G_MATMUL && p->tensors[t->in[k]].op != G_PARAM && memplan_pos_table(p, t->in[k]) < 0) return 0;
    switch (t->op) {
    case G_MATMUL:
    case G_EMBED:
    case G_RMSNORM: return k == 1;
    case G_LAYERNORM: return k == 1 || k == 2;
    case G_ADD:
    case G_BIAS_ADD: return k == 0 || k == 1;
    default: return 0;
    }
}

static int is_param(const plan *p, int id) { return id >= 0 && p->tensors[id].op == G_PARAM; }

int memplan_grad_param(const plan *p, int node, int k) {
    int in = param_of(p, p->tensors[node].in[k]);
    return is_param(p, in) ? in : -1;
}

int memplan_grad_fused(const plan *p, int node) {
    const plan_tensor *t = &p->tensors[node];
    int any = 0;
    for (int k = 0; k < t->n_in; k++) {
        int in = memplan_grad_param(p, node, k);
        if (!fused_slot(p, t, k) || in < 0) continue;
        any = 1;
        for (int j = 0; j < t->n_in; j++) /* the kernel also writes its gradient at another input's place */
            if (param_of(p, t->in[j]) == in && !fused_slot(p, t, j)) return 0;
    }
    return any;
}

int memplan_grad_fp32(const plan *p, int node, int k) {
    return memplan_grad_param(p, node, k) >= 0 && fused_slot(p, &p->tensors[node], k) && memplan_grad_fused(p, node);
}

int memplan_grad_staged(const plan *p, int node, int k) {
    const plan_tensor *t = &p->tensors[node];
    int in = memplan_grad_param(p, node, k);
    if (t->op == G_PARAM || t->op == G_TRANSPOSE || in < 0) return 0;
    for (int j = 0; j < k; j++)
        if (param_of(p, t->in[j]) == in) return 0; /* (staged once, at its first input) */
    return !memplan_grad_fp32(p, node, k);
}

/* Params, their gradients and AdamW's state on stage stg, and with
 * zero >= 2 their staging blocks. */
static int place_params(mp *x, int stg, mem_stage *ms) {
    const plan *p = x->p;
    const fe_setup *s = &p->setup;
    mem_buf *bufs = x->m->buf + (size_t)stg * (size_t)x->n;
    int chunks = p->pp * p->v;
    int64_t layers = 0;
    for (int c = stg; c < chunks; c += p->pp) layers += p->chunk_layers[c];
    double n_params = 0, sharded = 0;
    int64_t *held = calloc((size_t)(x->n ? x->n : 1), sizeof *held); /* per param: its copies on the stage */
    if (!held) return -1;
    for (int id = 0; id < x->n; id++) {
        const plan_tensor *t = &p->tensors[id];
        if (t->op != G_PARAM) continue;
        int tied = 0; /* used both before and after the stack: the pair of stages holds it */
        for (int c = 0; c < x->n && x->stack >= 0; c++)
            for (int k = 0; k < p->tensors[c].n_in; k++)
                if (p->tensors[c].in[k] == id) tied |= c >= p->regions[x->stack].end;
        int64_t copies = x->seg[id] == SEG_LAYER ? layers
                       : x->seg[id] == SEG_PRE ? (stg == 0 || (stg == p->pp - 1 && p->pp > 1 && tied))
                                               : stg == p->pp - 1;
        copies *= reps(x, id);
        int64_t e = local_elems(x, id);
        int64_t dp_group = t->pl.kind[AX_EP] == PL_SPLIT ? s->dp : s->dp * s->ep;
        mem_buf *b = &bufs[id];
        b->zoffset = -1;
        if (s->zero >= 2 && dp_group > 1 && copies > 0) { /* staged whole, per part */
            int64_t *blk = x->seg[id] == SEG_LAYER ? &ms->zlayer : &ms->zfixed;
            b->zoffset = *blk;
            *blk += e * x->fb * (x->seg[id] == SEG_LAYER ? reps(x, id) : copies);
        }
        b->bytes = e * x->fb;
        b->stride = copies > 1 ? b->bytes : 0;
        b->grad_stride = copies > 1 ? e * x->gb : 0;
        b->region = b->grad_region = copies > 0 ? MEM_PERSISTENT : MEM_NONE;
        b->offset = copies > 0 ? (int64_t)n_params * x->fb : 0;
        b->grad_offset = copies > 0 ? (int64_t)n_params * x->gb : 0;
        held[id] = copies;
        n_params += (double)(e * copies);
        /* ZeRO's shard of each copy: ceil(e / group) elements (rank r owns
         * [r s, (r + 1) s) of its flat elements, the last rank fewer) */
        sharded += (double)((e + dp_group - 1) / dp_group * copies);
    }
    ms->params = round16((int64_t)((s->zero == 3 ? sharded : n_params) * x->fb));
    ms->grads = round16((int64_t)((s->zero >= 2 ? sharded : n_params) * x->gb));
    ms->optim = round16((int64_t)((s->zero >= 1 ? sharded : n_params) * (x->masters ? 12 : 8)));
    ms->zfixed = round16(ms->zfixed);
    ms->zlayer = round16(ms->zlayer);
    /* mixed precision: the largest sum of the stage's param gradients one
     * op's backward writes, in the plan's precision (the op's contribution,
     * added to the fp32 gradients after it) */
    ms->gstage = 0;
    for (int c = 0; s->precision != 0 && c < x->n; c++) {
        const plan_tensor *t = &p->tensors[c];
        int64_t sum = 0;
        for (int k = 0; k < t->n_in; k++)
            if (memplan_grad_staged(p, c, k) && held[memplan_grad_param(p, c, k)] > 0)
                sum += round16(local_elems(x, memplan_grad_param(p, c, k)) * x->fb);
        if (sum > ms->gstage) ms->gstage = sum;
    }
    free(held);
    return 0;
}

/* The communication buffer: the largest collective output (dp's gradient
 * sync works in place), and the vocabulary-parallel cross-entropy's
 * exchange of its N rows' statistics (memplan.h), and a sliced position
 * embedding's gather of its table's fp32 gradient (memplan_pos_sliced). */
static int64_t comm_bytes(const mp *x) {
    const plan *p = x->p;
    int64_t comm = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const plan_step *st = &p->steps[i];
        if (st->kind == STEP_COMPUTE || st->kind == STEP_SLICE || st->axis == AX_DP) continue;
        int64_t e = st->elems, b;
        if (st->kind == STEP_REDUCE_SCATTER) e /= st->axis == AX_TP ? p->setup.tp : st->axis == AX_EP ? p->setup.ep : 1;
        b = e * x->fb;
        if (p->tensors[st->node].op == G_CROSS_ENTROPY && st->axis == AX_TP) b = memplan_ce_exchange_bytes(e, p->setup.tp);
        if (st->kind == STEP_ALL_GATHER && memplan_pos_sliced(p, st->node)) b = e * 4; /* its table's fp32 gradient */
        if (b > comm) comm = b;
    }
    return comm;
}

int64_t memplan_ce_exchange_bytes(int64_t N, int64_t tp) {
    /* the rank's sums and target logits (2 N doubles, at an 8-byte
     * boundary: up to 4 bytes of slack), then every rank's maxima (tp x N
     * floats), later every rank's sums and target logits (tp x 2 N
     * doubles) */
    return 8 + 16 * N + 16 * N * tp;
}

int memplan_build(memplan *m, const plan *p, int float_bytes, unsigned flags) {
    memset(m, 0, sizeof *m);
    int n = p->n_tensors;
    mp x = {p, m, n, -1, 0, float_bytes ? float_bytes : p->setup.precision == 0 ? 4 : 2, 4,
            (flags & MEMPLAN_NO_REUSE) != 0, 0, NULL, NULL, NULL, NULL, NULL};
    x.masters = x.fb == 2 || (flags & MEMPLAN_MASTERS) != 0;
    m->pp = p->pp;
    m->float_bytes = x.fb;
    m->n_tensors = n;
    for (int r = 0; r < p->n_regions; r++)
        if (p->regions[r].is_stack && x.stack < 0) x.stack = r;
    if (x.stack >= 0) x.layers = p->regions[x.stack].count;
    size_t nn = (size_t)(n ? n : 1);
    m->stage = calloc((size_t)(p->pp > 0 ? p->pp : 1), sizeof *m->stage);
    m->buf = calloc((size_t)(p->pp > 0 ? p->pp : 1) * nn, sizeof *m->buf);
    x.seg = calloc(nn, sizeof *x.seg);
    x.last = calloc(nn, sizeof *x.last);
    x.saved = calloc(nn, 1);
    x.cross = calloc(nn, 1);
    x.b = m->buf;
    int rc = -1;
    if (!m->stage || !m->buf || !x.seg || !x.last || !x.saved || !x.cross) goto done;

    classify(&x);
    place_values(&x);
    if (x.stack >= 0) /* what a pipeline chunk receives: the values carried into its first layer */
        for (int c = 0; c < p->regions[x.stack].n_carry; c++) m->recv_bytes += m->buf[p->regions[x.stack].carry[c].exit].bytes;
    int64_t pinned = place_grads(&x);
    int64_t shared = 0;
    for (int sg = 0; sg < SEG_COUNT; sg++)
        for (int pass = 0; pass < 2; pass++) {
            int64_t peak = shared_peak(&x, sg, pass);
            if (peak < 0) goto done;
            if (peak > shared) shared = peak;
        }
    int64_t comm = round16(comm_bytes(&x));
    int chunks = p->pp * p->v;
    for (int stg = 0; stg < p->pp; stg++) {
        mem_stage *ms = &m->stage[stg];
        if (stg > 0) memcpy(m->buf + (size_t)stg * nn, m->buf, nn * sizeof *m->buf);
        if (place_params(&x, stg, ms) != 0) goto done;
        ms->layer_stride = m->part_bytes[SEG_LAYER];
        for (int c = stg; c < chunks; c += p->pp) {
            /* chunk 0 starts with the part before the stack; a later chunk
             * with the activations it receives from the one before */
            int64_t unit = (c == 0 ? m->part_bytes[SEG_PRE] : m->recv_bytes) +
                           p->chunk_layers[c] * m->part_bytes[SEG_LAYER] + (c == chunks - 1 ? m->part_bytes[SEG_POST] : 0);
            if (unit > ms->slot_bytes) ms->slot_bytes = unit;
        }
        ms->slots = sched_units_peak_inflight(p->stages[stg].units, p->stages[stg].n_units);
        ms->pinned = pinned;
        ms->shared = shared;
        /* zero >= 2: full gradients staged before their reduce-scatter (the
         * params outside the stack, and two layers: the one in backward and
         * the one before it, whose reduce-scatter is still running); zero =
         * 3: the params' values gathered whole for use (outside the stack,
         * the layer in use and the one prefetched) */
        ms->gathered = (p->setup.zero >= 2 ? (ms->zfixed + 2 * ms->zlayer) * x.gb / x.fb : 0) +
                       (p->setup.zero == 3 ? ms->zfixed + 2 * ms->zlayer : 0);
        ms->workspace = ms->pinned + ms->shared + ms->recompute + ms->gathered + ms->gstage;
        ms->comm = comm;
        ms->total = ms->params + ms->grads + ms->optim + ms->slot_bytes * ms->slots + ms->workspace + ms->comm;
    }
    rc = 0;
done:
    free(x.seg);
    free(x.last);
    free(x.saved);
    free(x.cross);
    if (rc < 0) memplan_free(m);
    return rc;
}

const mem_buf *memplan_buf(const memplan *m, int stage, int id) {
    return &m->buf[(size_t)stage * (size_t)m->n_tensors + (size_t)id];
}

void memplan_free(memplan *m) {
    free(m->stage);
    free(m->buf);
    memset(m, 0, sizeof *m);
}

static void mib(FILE *out, const char *label, int64_t b) {
    fprintf(out, "%s%s %.2f MiB", *label ? " " : "", label, (double)b / 1048576.0);
}

void memplan_dump(const memplan *m, const plan *p, FILE *out) {
    static const char *const where[] = {"-", "persistent", "slot", "workspace", "pinned", "recompute"};
    static const char *const parts[] = {"first", "layer", "last"};
    fprintf(out, "# memory plan per rank, by pipeline stage\n");
    for (int s = 0; s < m->pp; s++) {
        const mem_stage *x = &m->stage[s];
        fprintf(out, "stage %d:", s);
        mib(out, "params", x->params);
        mib(out, "+ grads", x->grads);
        mib(out, "+ optimizer", x->optim);
        fprintf(out, " + %d slot%s x", x->slots, x->slots == 1 ? "" : "s");
        mib(out, "", x->slot_bytes);
        mib(out, "+ workspace", x->workspace);
        mib(out, "+ comm", x->comm);
        mib(out, "=", x->total);
        fputc('\n', out);
        fprintf(out, "  workspace: pinned %lld + shared %lld + recompute %lld + gathered %lld", (long long)x->pinned,
                (long long)x->shared, (long long)x->recompute, (long long)x->gathered);
        if (x->gstage) fprintf(out, " + gradient staging %lld", (long long)x->gstage);
        fputs(" bytes\n", out);
    }
    fprintf(out, "# slot parts: first %lld, each layer %lld, last %lld bytes\n", (long long)m->part_bytes[0],
            (long long)m->part_bytes[1], (long long)m->part_bytes[2]);
    fprintf(out, "# buffers of stage 0: node, op, bytes per rank, where[.part] offset [+aux] [stride], then the\n"
                 "# gradient's place, and the backward's scratch\n");
    for (int id = 0; id < p->n_tensors; id++) {
        const mem_buf *b = memplan_buf(m, 0, id);
        if (b->region == MEM_NONE && b->grad_region == MEM_NONE) continue;
        fprintf(out, "%%%d %s %lld %s", id, graph_op_name(p->tensors[id].op), (long long)b->bytes, where[b->region]);
        if (b->region == MEM_SLOT) fprintf(out, ".%s", parts[b->part]);
        fprintf(out, " %lld", (long long)b->offset);
        if (b->aux) fprintf(out, " +%lld", (long long)b->aux);
        if (b->stride) fprintf(out, " stride %lld", (long long)b->stride);
        if (b->grad_in_value) {
            fprintf(out, " | grad over the value");
        } else if (b->grad_region != MEM_NONE) {
            fprintf(out, " | grad %s %lld", where[b->grad_region], (long long)b->grad_offset);
            if (b->carried && b->grad_region == MEM_PINNED) fprintf(out, " (pair)");
        } else if (b->grad_alias >= 0) {
            fprintf(out, " | grad %%%d's", b->grad_alias);
        } else if (memplan_pos_table(p, id) >= 0) { /* (its add writes it into the table's gradient) */
            fprintf(out, " | grad into %%%d's", memplan_pos_table(p, id));
        }
        if (b->scratch) fprintf(out, " | scratch %lld at %lld", (long long)b->scratch, (long long)b->scratch_offset);
        if (p->tensors[id].op == G_PARAM && b->zoffset >= 0)
            fprintf(out, " | staged %s %lld", b->part == MEM_PART_LAYER ? "layer" : "fixed", (long long)b->zoffset);
        fputc('\n', out);
    }
}
