/* exec_step.c — running a training step (exec.h): the program's phases,
 * the plan's collectives, pipeline transfers, the schedule's units, the
 * optimizer, and what a rank sends. */
#include "exec_impl.h"

#include <math.h>   /* cos, isfinite, log, sqrt */
#include <stdio.h>  /* snprintf */
#include <string.h> /* memcpy, memset */


/* Poisoning: the shared workspace and the recompute area hold nothing
 * live between ops' runs of forward and backward, nor a slot before its
 * unit's forward. */
static void poison_workspace(mesh__exec *ex)
{
    if (!ex->poison) return;
    exec__fill(ex, ex->arena + ex->shared_at, 0xff, (size_t)(ex->ms->shared + ex->ms->recompute));
    exec__fill(ex, ex->arena + ex->gstage_at, 0xff, (size_t)ex->ms->gstage); /* (zeroed before each use) */
}

void mesh__exec_set_poison(mesh__exec *ex, int on) { ex->poison = on; }

/* Does node c's backward overwrite input k's gradient (kern.assign), so
 * that it need not be zeroed first? A matmul's dx (the product written,
 * cuBLASLt's beta 0), the cross-entropy's dlogits, an add's larger (or
 * equal) side's (a copy of the output's gradient), attention's dq, dk, dv
 * (each element written by one block) and a GELU's or SiLU's dx, each the
 * whole of its buffer (no room past the tensor but the 16-byte rounding),
 * of an input that is not also another of c's. */
int exec__assigns(const mesh__exec *ex, int c, int k)
{
    const plan_tensor *t = &ex->p->tensors[c];
    int in = t->in[k];
    if (t->op == G_ADD || t->op == G_BIAS_ADD) {
        if (t->n_in != 2 || ex->cnumel[in] < ex->cnumel[t->in[1 - k]]) return 0;
    } else if (t->op != G_ATTENTION &&
               (k != 0 || (t->op != G_MATMUL && t->op != G_CROSS_ENTROPY && t->op != G_GELU && t->op != G_SILU))) {
        return 0;
    }
    for (int j = 0; j < t->n_in; j++)
        if (j != k && t->in[j] == in) return 0;
    size_t whole = ex->cnumel[in] * (size_t)ex->esize;
    return (size_t)exec__buf_of(ex, in)->bytes <= (whole + 15) / 16 * 16;
}

/* Before node c's backward: the gradients it starts (of inputs whose last
 * consumer it is, or its own when nothing consumes it) are zeroed, but
 * those its kernel overwrites: bit k of kern.assign for input k, which the
 * ops' backward kernels take in their inputs' order (run_phase clears it
 * after the node); the loss's is the seed. */
static void start_grads(mesh__exec *ex, int c, int it)
{
    const plan_tensor *t = &ex->p->tensors[c];
    ex->kern.assign = 0;
    for (int k = 0; k < t->n_in; k++) {
        int in = t->in[k], seen = 0;
        for (int j = 0; j < k; j++) seen |= t->in[j] == in;
        if (seen || ex->zero_by[in] != c) continue;
        /* (or c's own gradient is in that buffer, a GELU's: in place) */
        if (exec__assigns(ex, c, k) || exec__buf_of(ex, c)->grad_alias == in) {
            ex->kern.assign |= 1 << k;
            continue;
        }
        float *g = exec__grad_in(ex, in, t->region, it);
        if (g) exec__fill(ex, g, 0, (size_t)exec__buf_of(ex, in)->bytes);
    }
    if (ex->zero_by[c] != c) return;
    float *g = exec__gptr(ex, c, it), seed = (float)(ex->dloss * ex->loss_scale);
    if (!g) return;
    if (c == ex->p->loss) exec__floats_to_dev(ex, g, &seed, 1);
    else exec__fill(ex, g, 0, (size_t)exec__buf_of(ex, c)->bytes);
}

/* Before iteration it of the stack's backward: the buffer of each carried
 * value's pair that receives the gradient of the iteration's entry. */
static void start_carries(mesh__exec *ex, int r, int it)
{
    const plan_region *g = &ex->p->regions[r];
    for (int c = 0; c < g->n_carry; c++) {
        float *d = exec__gptr(ex, g->carry[c].exit, it - 1);
        if (d && exec__buf_of(ex, g->carry[c].exit)->carried) exec__fill(ex, d, 0, (size_t)exec__buf_of(ex, g->carry[c].exit)->bytes);
    }
}

/* Sequence parallelism: tensor st->node's value (forward, or a recomputed
 * forward) or gradient (backward) converted over tp along st->dim, in its
 * own buffer (the memory plan gives it room for the whole): reduce-scatter
 * (a partial sum's rank slice), all-gather (every rank's slice), slice (the
 * rank's part of a whole tensor). The rank's slice is at the buffer's start;
 * the exchanges pack it rank-major in the communication buffer. */
static int tp_convert(mesh__exec *ex, const plan_step *st, int it, comm *c)
{
    const plan_tensor *t = &ex->p->tensors[st->node];
    int value = st->phase == PLAN_FORWARD || st->recompute, d = st->dim, tp = c->size, r = c->rank;
    float *buf = value ? exec__vptr(ex, st->node, it) : exec__gptr(ex, st->node, it);
    const int64_t *ld = ex->ld[st->node];
    size_t outer = 1, inner = 1, L, Ll;
    for (int k = 0; k < d; k++) outer *= (size_t)ld[k];
    for (int k = d + 1; k < t->rank; k++) inner *= (size_t)ld[k];
    if (t->pl.kind[1] == PL_SPLIT && t->pl.dim[1] == d) { /* produced split: the whole is tp slices */
        Ll = (size_t)ld[d];
        L = Ll * (size_t)tp;
    } else {
        L = (size_t)ld[d];
        Ll = L / (size_t)tp;
    }
    size_t run = Ll * inner, chunk = outer * run, n = chunk * (size_t)tp, es = (size_t)ex->esize;
    float *pack = (size_t)ex->ms->comm >= n * es ? (float *)(void *)(ex->arena + ex->comm_at) : NULL;
    int rc = 0;
#define AT(p, k) exec__at(ex, (p), (k)) /* element k of p: the storage type's */
    switch (st->kind) {
    case STEP_REDUCE_SCATTER:
        if (pack) {
            for (int q = 0; q < tp; q++)
                for (size_t o = 0; rc == 0 && o < outer; o++)
                    rc = exec__dcopy(ex, AT(pack, ((size_t)q * outer + o) * run), AT(buf, (o * L + (size_t)q * Ll) * inner),
                                     run * es);
            if (rc == 0) rc = EXEC_COMM(ex, st->kind, st->axis, comm_reduce_scatter(c, pack, buf, chunk));
            break;
        }
        /* no room to pack: the whole sum, then the rank's slice */
        rc = EXEC_COMM(ex, st->kind, st->axis, comm_all_reduce(c, buf, n));
        /* fallthrough */
    case STEP_SLICE:
        for (size_t o = 0; rc == 0 && o < outer; o++)
            rc = exec__dmove(ex, AT(buf, o * run), AT(buf, (o * L + (size_t)r * Ll) * inner), run * es);
        break;
    case STEP_ALL_GATHER:
        if (!pack) return comm_fail(c, "all-gather", "the communication buffer holds %lld bytes, not %zu",
                                    (long long)ex->ms->comm, n * es);
        rc = EXEC_COMM(ex, st->kind, st->axis, comm_all_gather(c, buf, pack, chunk));
        for (int q = tp - 1; rc == 0 && q >= 0; q--)
            for (size_t o = outer; rc == 0 && o-- > 0;)
                rc = exec__dcopy(ex, AT(buf, (o * L + (size_t)q * Ll) * inner), AT(pack, ((size_t)q * outer + o) * run),
                                 run * es);
        break;
    default:
        return comm_fail(c, "convert", "not run yet");
    }
#undef AT
    return rc;
}

/* Is st the gradient's all-gather of a position embedding sliced over tp
 * (memplan_pos_sliced), which gathers its table's fp32 gradient rows? */
static int pos_gather_step(const mesh__exec *ex, const plan_step *st)
{
    return memplan_pos_gather_step(ex->p, (int)(st - ex->p->steps));
}

/* That all-gather: each rank has summed its slice's rows into the table's
 * fp32 gradient (exec_ops.c's add_grad); every rank's rows, in rank order,
 * are the embedding's. Gathered in fp32 through the communication buffer
 * (the memory plan gives it room) and copied back. */
static int pos_gather(mesh__exec *ex, const plan_step *st, int it, comm *c)
{
    const plan_tensor *t = &ex->p->tensors[st->node];
    float *g = exec__grad_in(ex, memplan_pos_table(ex->p, st->node), t->region, it);
    size_t chunk = ex->cnumel[st->node], bytes = chunk * (size_t)c->size * sizeof(float);
    if (!g) return comm_fail(c, "all-gather", "the position embedding's table has no gradient here");
    if ((size_t)ex->ms->comm < bytes)
        return comm_fail(c, "all-gather", "the communication buffer holds %lld bytes, not %zu",
                         (long long)ex->ms->comm, bytes);
    float *pack = (float *)(void *)(ex->arena + ex->comm_at);
    if (exec__grad_elements(ex, c, NULL, 1) != 0) return -1;
    int rc = EXEC_COMM(ex, st->kind, st->axis, comm_all_gather(c, g + (size_t)c->rank * chunk, pack, chunk));
    if (exec__grad_elements(ex, c, NULL, 0) != 0) rc = -1;
    return rc == 0 ? exec__dcopy(ex, g, pack, bytes) : rc;
}

/* The elements of tensor id's buffer (of the storage type). */
static size_t buf_elems(const mesh__exec *ex, int id)
{
    return (size_t)exec__buf_of(ex, id)->bytes / (size_t)ex->esize;
}

comm *exec__step_comm(const mesh__exec *ex, const plan_step *st)
{
    /* over pp: a tied param's two copies, on the first and the last stage;
     * over dp, a dense param's gradients: dp x ep */
    const plan_tensor *nt = &ex->p->tensors[st->node];
    if (st->axis == 0 && nt->op == G_PARAM && nt->pl.kind[3] != PL_SPLIT) return ex->data;
    return st->axis == 2 ? ex->tied : ex->axis[st->axis];
}

/* ZeRO's uneven gather: w[n] zeroed but for rank's shard of sh elements
 * (which a sum over the ranks then leaves whole). */
static void zero_around_shard(mesh__exec *ex, float *w, size_t n, size_t sh, int rank)
{
    size_t lo = (size_t)rank * sh, hi = lo + sh < n ? lo + sh : n, es = (size_t)ex->esize;
    exec__fill(ex, w, 0, (lo < n ? lo : n) * es);
    if (hi < n) exec__fill(ex, exec__at(ex, w, hi), 0, (n - hi) * es);
}

int exec__bucketed(const mesh__exec *ex, int s)
{
    const plan_step *st = &ex->p->steps[s];
    if (ex->no_buckets || st->bucket < 1 || st->axis != 0 || ex->p->tensors[st->node].op != G_PARAM ||
        !exec__step_comm(ex, st))
        return 0;
    if (st->phase == PLAN_AFTER_OPTIMIZER) return st->kind == STEP_ALL_GATHER;
    return st->phase == PLAN_GRAD_SYNC && ex->p->setup.zero <= 1 && !ex->chain &&
           (st->kind == STEP_ALL_REDUCE || st->kind == STEP_REDUCE_SCATTER);
}

int exec__bucket_end(const mesh__exec *ex, int q, int end)
{
    const plan_step *a = &ex->p->steps[q];
    int r = q + 1;
    while (r < end && exec__bucketed(ex, r) && ex->p->steps[r].bucket == a->bucket &&
           ex->p->steps[r].region == a->region && ex->p->steps[r].phase == a->phase &&
           exec__step_comm(ex, &ex->p->steps[r]) == exec__step_comm(ex, a))
        r++;
    return r;
}

/* Bytes of an element of step st's collective, as meshc counts them
 * (memplan_step_elem_bytes: whatever the CPU keeps them in) */
static double elem_bytes(const mesh__exec *ex, const plan_step *st)
{
    return memplan_step_elem_bytes(ex->p, (int)(st - ex->p->steps));
}

int exec__bucket_call(mesh__exec *ex, int q, int r, int it, comm_async *queue)
{
    const plan *p = ex->p;
    const plan_step *first = &p->steps[q];
    comm *c = exec__step_comm(ex, first);
    int kind = first->kind, a = 0, b = 0;
    /* even: the kind's own call (reduce-scatter, all-gather, all-reduce);
     * uneven shards: the whole sum (a gather's over zeros), as collective() */
    float **even = ex->bk_bufs, **uneven = ex->bk_bufs + p->n_steps;
    size_t *ne = ex->bk_n, *nu = ex->bk_n + p->n_steps;
    for (int s = q; s < r; s++) {
        const plan_step *st = &p->steps[s];
        if (ex->copies[st->node] == 0) continue; /* not held on this stage */
        if (!queue && exec__overlap_issued(ex, st, it)) continue; /* run (and counted) during backward */
        if (ex->counting && st->kind < STEP_SLICE) ex->sent[st->kind][st->axis] += (double)st->elems * elem_bytes(ex, st);
        size_t n = buf_elems(ex, st->node);
        float *x = kind == STEP_ALL_GATHER ? exec__vptr(ex, st->node, it) : exec__gptr(ex, st->node, it);
        if (kind != STEP_ALL_REDUCE && n % (size_t)c->size == 0) {
            even[a] = x, ne[a++] = n;
            continue;
        }
        if (kind == STEP_ALL_GATHER) zero_around_shard(ex, x, n, ex->shard[st->node], c->rank);
        uneven[b] = x, nu[b++] = n;
    }
    const char *what = kind == STEP_ALL_GATHER ? "all-gather" : kind == STEP_REDUCE_SCATTER ? "reduce-scatter"
                                                                                           : "all-reduce";
    int rc = 0, grads = kind != STEP_ALL_GATHER; /* the gradient sync's (fp32), or the params' values */
    if (queue) {
        exec__grad_elements(ex, NULL, queue, grads);
        exec__queue_entry(ex, queue, kind, first->axis);
        long t = !a ? 0
               : kind == STEP_REDUCE_SCATTER ? comm_async_reduce_scatter_v(queue, even, ne, a)
                                             : comm_async_all_gather_v(queue, even, ne, a);
        exec__queue_entry(ex, queue, kind, first->axis);
        if (t >= 0 && b) t = comm_async_all_reduce_v(queue, uneven, nu, b);
        exec__grad_elements(ex, NULL, queue, 0);
        if (t >= 0) return (a > 0) + (b > 0);
        snprintf(ex->error, sizeof ex->error, "rank %d: %s(dp) of bucket %d (%s, overlapped): %s", ex->rank, what,
                 first->bucket, plan_phase_name(first->phase), comm_async_error(queue));
        return -1;
    }
    if (exec__grad_elements(ex, c, NULL, grads) != 0) return -1;
    if (a)
        rc = EXEC_COMM(ex, kind, first->axis,
                       kind == STEP_REDUCE_SCATTER ? comm_reduce_scatter_v(c, even, ne, a)
                                                   : comm_all_gather_v(c, even, ne, a));
    if (rc == 0 && b) rc = EXEC_COMM(ex, kind, first->axis, comm_all_reduce_v(c, uneven, nu, b));
    if (exec__grad_elements(ex, c, NULL, 0) != 0) return -1;
    if (rc != 0)
        snprintf(ex->error, sizeof ex->error, "rank %d: %s(dp) of bucket %d (%d tensors, %s): %s", ex->rank, what,
                 first->bucket, a + b, plan_phase_name(first->phase), c->error);
    return rc ? -1 : (a > 0) + (b > 0);
}

long exec__zreduce(mesh__exec *ex, const plan_step *st, int it, comm_async *queue)
{
    comm *c = exec__step_comm(ex, st);
    float *g = exec__gptr(ex, st->node, it); /* (a param's: fp32) */
    size_t n = buf_elems(ex, st->node), part = n / (size_t)c->size;
    float *mine = g + (size_t)c->rank * part;
    long rc;
    if (exec__grad_elements(ex, queue ? NULL : c, queue, 1) != 0) return -1;
    exec__queue_entry(ex, queue, st->kind, st->axis);
    if (queue) /* uneven shards: the whole sum, of which the rank uses its part */
        rc = n % (size_t)c->size == 0 ? comm_async_reduce_scatter(queue, g, mine, part) : comm_async_all_reduce(queue, g, n);
    else if (n % (size_t)c->size == 0)
        rc = EXEC_COMM(ex, st->kind, st->axis, comm_reduce_scatter(c, g, mine, part));
    else
        rc = EXEC_COMM(ex, st->kind, st->axis, comm_all_reduce(c, g, n));
    return exec__grad_elements(ex, queue ? NULL : c, queue, 0) != 0 ? -1 : rc;
}

long exec__zgather(mesh__exec *ex, const plan_step *st, int it, int own, comm_async *queue)
{
    comm *c = exec__step_comm(ex, st);
    float *w = exec__vptr(ex, st->node, it);
    size_t n = buf_elems(ex, st->node), sh = ex->shard[st->node];
    size_t lo = (size_t)c->rank * sh, hi = lo + sh < n ? lo + sh : n;
    float *mine = exec__at(ex, w, lo);
    if (own && hi > lo && exec__dcopy(ex, mine, exec__pshard(ex, st->node, it), (hi - lo) * (size_t)ex->esize) != 0) {
        snprintf(c->error, sizeof c->error, "%.700s", ex->error);
        return -1;
    }
    exec__queue_entry(ex, queue, st->kind, st->axis);
    if (n % (size_t)c->size == 0)
        return queue ? comm_async_all_gather(queue, mine, w, sh)
                     : EXEC_COMM(ex, st->kind, st->axis, comm_all_gather(c, mine, w, sh));
    zero_around_shard(ex, w, n, sh, c->rank); /* uneven: a sum of the shards over zeros is the gather, exactly */
    return queue ? comm_async_all_reduce(queue, w, n)
                 : EXEC_COMM(ex, st->kind, st->axis, comm_all_reduce(c, w, n));
}

int exec__zshard_add(mesh__exec *ex, int id, int it)
{
    size_t lo, len;
    float *m, *v, *sh = exec__gshard(ex, id, it), *g = exec__gptr(ex, id, it);
    exec__shard_of(ex, id, it, &lo, &len, &m, &v);
    if (EXEC_KERN(ex, accumulate, sh, g + lo, len, 1) != 0) return exec__kern_failed(ex, "ZeRO's shard"); /* (fp32) */
    return 0;
}

/* A collective step of the program on the rank's group of its axis. */
static int collective(mesh__exec *ex, const plan_step *st, int it)
{
    comm *c = exec__step_comm(ex, st);
    const plan_tensor *nt = &ex->p->tensors[st->node];
    if (ex->chain && st->axis == 0 && st->kind == STEP_ALL_REDUCE) return 0; /* the chain summed them */
    if (exec__overlap_issued(ex, st, it)) return 0; /* run (and counted) during backward (exec_overlap.c) */
    if (c && ex->counting && st->kind < STEP_SLICE) ex->sent[st->kind][st->axis] += (double)st->elems * elem_bytes(ex, st);
    int pf = exec__prefetched(ex, st, it);          /* ZeRO-3: gathered while the layer before computed */
    if (pf != 0) return pf > 0 ? 0 : -1;
    if (st->kind == STEP_ALL_TO_ALL && nt->op == G_MOE) return 0; /* the op exchanges its rows itself */
    if (!c) return 0; /* a group of one */
    int rc = -1;
    const char *what = "?";
    size_t n = buf_elems(ex, st->node);
    int zparam = nt->op == G_PARAM && (st->phase == PLAN_FORWARD || st->phase == PLAN_BACKWARD);
    int value = st->phase == PLAN_FORWARD || st->recompute; /* a value (a recomputed forward's too), else a gradient */
    if (pos_gather_step(ex, st)) {
        what = "all-gather";
        rc = pos_gather(ex, st, it, c);
        goto done;
    }
    if (st->axis == 1 && nt->op != G_PARAM &&
        (st->kind == STEP_REDUCE_SCATTER || st->kind == STEP_ALL_GATHER || st->kind == STEP_SLICE)) {
        what = shard_step_name(st->kind);
        rc = tp_convert(ex, st, it, c);
        if (rc == 0) exec__round(ex, value ? exec__vptr(ex, st->node, it) : exec__gptr(ex, st->node, it), n);
        goto done;
    }
    switch (st->kind) {
    case STEP_ALL_REDUCE:
        what = "all-reduce";
        if (ex->p->tensors[st->node].op == G_CROSS_ENTROPY) return 0; /* the op exchanges its sums itself */
        if (nt->op == G_PARAM && st->phase == PLAN_GRAD_SYNC && ex->p->setup.zero >= 2) { /* a tied param's shards */
            rc = exec__grad_elements(ex, c, NULL, 1) != 0 ? -1
               : EXEC_COMM(ex, st->kind, st->axis,
                           comm_all_reduce(c, exec__gshard(ex, st->node, it), ex->shard[st->node]));
            if (exec__grad_elements(ex, c, NULL, 0) != 0) rc = -1;
            break;
        }
        /* forward: a partial sum of values; backward and the gradient sync: of gradients (a param's:
         * fp32, summed in fp32) */
        int grads = !value && nt->op == G_PARAM;
        float *x = value ? exec__vptr(ex, st->node, it) : exec__gptr(ex, st->node, it);
        rc = exec__grad_elements(ex, c, NULL, grads) != 0 ? -1 : EXEC_COMM(ex, st->kind, st->axis, comm_all_reduce(c, x, n));
        if (grads && exec__grad_elements(ex, c, NULL, 0) != 0) rc = -1;
        if (rc == 0 && !grads) exec__round(ex, x, n); /* a sum in fp32, stored in the plan's precision */
        break;
    case STEP_REDUCE_SCATTER: { /* ZeRO's gradient sync: this rank's shard summed, in place */
        what = "reduce-scatter";
        int queued = zparam ? exec__rs_issue(ex, st, it) : 0; /* zero 2/3: while backward goes on */
        if (queued != 0) return queued > 0 ? 0 : -1;
        rc = (int)exec__zreduce(ex, st, it, NULL);
        if (rc == 0 && zparam && exec__zshard_add(ex, st->node, it) != 0) return -1;
        break;
    }
    case STEP_ALL_GATHER: { /* ZeRO: every rank's shard, into the whole param */
        what = "all-gather";
        /* zero 3, before use: from the rank's shard; zero 1/2, after the optimizer: in place */
        rc = (int)exec__zgather(ex, st, it, zparam, NULL);
        break;
    }
    default:
        snprintf(c->error, sizeof c->error, "not run yet");
        break;
    }
done:
    if (rc != 0) { /* why: the communicator's, or the device's (a copy, a kernel: ex->error already) */
        char dev_why[sizeof ex->error], own[24];
        const char *why = c->error;
        if (ex->dev_failed) {
            size_t k = (size_t)snprintf(own, sizeof own, "rank %d: ", ex->rank);
            snprintf(dev_why, sizeof dev_why, "%s", strncmp(ex->error, own, k) ? ex->error : ex->error + k);
            why = dev_why;
        }
        snprintf(ex->error, sizeof ex->error, "rank %d: %s(%s) of tensor %d (%s): %.1200s", ex->rank, what,
                 plan__axis_name(st->axis), st->node, plan_phase_name(st->phase), why);
    }
    return rc;
}

int exec__step_parts(mesh__exec *ex)
{
    const plan *p = ex->p;
    ex->step_part = exec__host_calloc(ex, (size_t)(p->n_steps > 0 ? p->n_steps : 1), 1);
    if (!ex->step_part) return -1;
    for (int phase = PLAN_FORWARD; phase <= PLAN_BACKWARD; phase++) {
        int first = -1, last = -1, runs = 0;
        for (int k = 0; k < p->n_steps; k++)
            if (p->steps[k].phase == (plan_phase)phase && ex->stack >= 0 && p->steps[k].region == ex->stack) {
                if (first < 0) first = k;
                runs += last < 0 || last != k - 1;
                last = k;
            }
        /* zero >= 2: a layer's staged gradients live through one run of its
         * backward steps (run_phase zeroes them at each iteration's start) */
        if (phase == PLAN_BACKWARD && p->setup.zero >= 2 && runs > 1) return -2;
        for (int k = 0; k < p->n_steps; k++) {
            const plan_step *st = &p->steps[k];
            if (st->phase != (plan_phase)phase) continue;
            if (first < 0) /* no stack steps: by node */
                ex->step_part[k] = (signed char)(ex->stack < 0 || st->node < p->regions[ex->stack].first ? MEM_PART_PRE
                                                                                                        : MEM_PART_POST);
            else if (st->region == ex->stack) ex->step_part[k] = MEM_PART_LAYER;
            else ex->step_part[k] = (signed char)((phase == PLAN_BACKWARD ? k < first : k > last) ? MEM_PART_POST
                                                                                                   : MEM_PART_PRE);
        }
    }
    return 0;
}

/* Does step k run on this pipeline stage? A layer's on the stage of its
 * layers (run_phase picks the iterations), one of the part before the
 * stack on the first stage, of the part after it on the last (by its
 * place: exec__step_parts); a param's gradient sync and gather where the
 * param is held. */
static int step_here(const mesh__exec *ex, int k)
{
    if (ex->p->pp == 1) return 1;
    const plan_step *st = &ex->p->steps[k];
    if (st->phase == PLAN_GRAD_SYNC || st->phase == PLAN_AFTER_OPTIMIZER) return ex->copies[st->node] > 0;
    switch (ex->step_part[k]) {
    case MEM_PART_LAYER: return ex->n_layers > 0;
    case MEM_PART_PRE: return ex->chunk == 0;
    default: return ex->chunk == ex->chunks - 1;
    }
}

/* Pipeline transfers of the carried values (comm: the pp group, eager
 * sends): a stage after the first receives its first layer's input before
 * a forward, one before the last sends its last layer's output after it;
 * in the backward the gradients go the other way. */
static int pipe_transfer(mesh__exec *ex, int grad, int send)
{
    const plan_region *g = &ex->p->regions[ex->stack];
    comm *c = ex->axis[2];
    int pp = (int)ex->p->pp, peer = grad == send ? (ex->stage + pp - 1) % pp : (ex->stage + 1) % pp;
    int last_it = ex->first_layer + ex->n_layers - 1;
    for (int k = 0; k < g->n_carry; k++) {
        int exit = g->carry[k].exit, entry = g->carry[k].entry;
        size_t bytes = (size_t)exec__buf_of(ex, exit)->bytes;
        int rc;
        if (!grad && !send)
            rc = EXEC_COMM(ex, STEP_SLICE, 0, comm_recv(c, ex->arena + exec__recv_at(ex, k), bytes, peer));
        else if (!grad) rc = EXEC_COMM(ex, STEP_SLICE, 0, comm_send(c, exec__vptr(ex, exit, last_it), bytes, peer));
        else if (!send) rc = EXEC_COMM(ex, STEP_SLICE, 0, comm_recv(c, exec__gptr(ex, exit, last_it), bytes, peer));
        else rc = EXEC_COMM(ex, STEP_SLICE, 0, comm_send(c, exec__gptr(ex, entry, 0), bytes, peer));
        /* counted as meshc counts it: the room of the plan's precision (a
         * GPU's bytes; the CPU sends a bf16 plan's values in 4-byte words) */
        if (rc == 0 && send && ex->counting) ex->sent_p2p += (double)memplan_value_bytes(ex->p, exit);
        if (rc != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d (stage %d): %s %s %s stage %d: %s", ex->rank, ex->stage,
                     send ? "sending" : "receiving", grad ? "gradients" : "activations", send ? "to" : "from", peer,
                     c->error);
            return -1;
        }
    }
    return 0;
}

/* The stage's sends are done before what follows the schedule
 * (comm_nccl_flush): over NCCL, those on the pipeline's channels
 * (comm_nccl_channels, made by exec.c), which no other call waits for,
 * are waited for here (ordered: by the stream, watched), so that a send
 * never received ends in the timeout naming it; a send deferred to the
 * rank's next NCCL call goes out, as the next may be on the host world
 * (the loss's sum), which the receiver reaches only after receiving it.
 * Other backends' sends are eager. */
static int pipe_flush(mesh__exec *ex)
{
    if (ex->p->pp == 1 || !ex->axis[2] || EXEC_COMM(ex, STEP_SLICE, 0, comm_nccl_flush(ex->axis[2])) == 0) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d (stage %d): the schedule's last transfer: %s", ex->rank,
             ex->stage, ex->axis[2]->error);
    return -1;
}

/* Is an input's part (before or after the stack) run on this stage? */
static int part_here(const mesh__exec *ex, int id)
{
    int part = exec__buf_of(ex, id)->part;
    return part == MEM_PART_PRE ? ex->chunk == 0 : part == MEM_PART_POST ? ex->chunk == ex->chunks - 1 : 1;
}

/* Mixed precision: node id's value as computed, rounded to the plan's
 * precision (the loss, a view and integers excepted), and after its
 * backward the gradients it added to. */
static void round_value(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    if (ex->prec == KCPU_FP32 || t->dtype != PLAN_DTYPE_F32 || t->op == G_TRANSPOSE || t->op == G_CROSS_ENTROPY ||
        id == ex->p->loss)
        return;
    exec__round(ex, exec__vptr(ex, id, it), ex->numel[id]);
}

static void round_grads(mesh__exec *ex, int id, int it)
{
    const plan_tensor *t = &ex->p->tensors[id];
    if (ex->prec == KCPU_FP32) return;
    for (int k = 0; k < t->n_in; k++) {
        int in = t->in[k], w = memplan_grad_param(ex->p, id, k); /* (x @ transpose(w): w's gradient) */
        if (w >= 0 && !exec__gstage_staged(ex, w))
            continue; /* its fp32 gradient, added to in fp32 (a matmul's weight, a position embedding's table) */
        if (w >= 0) in = w;
        if (ex->p->tensors[in].dtype == PLAN_DTYPE_F32)
            exec__round(ex, exec__grad_in(ex, in, t->region, it), ex->cnumel[in]);
    }
}

/* The parts of the model (MEM_PART_* bits) whose backward steps from
 * step `from` on run in this unit (backward still adds to their params),
 * and in *here the parts the unit's chunk runs. */
static int parts_left(const mesh__exec *ex, int from, int *here)
{
    int left = 0;
    *here = (ex->chunk == 0) << MEM_PART_PRE | (ex->n_layers > 0) << MEM_PART_LAYER |
            (ex->chunk == ex->chunks - 1) << MEM_PART_POST;
    for (int q = from; q < ex->p->n_steps; q++)
        if (ex->p->steps[q].phase == PLAN_BACKWARD && ex->p->steps[q].kind == STEP_COMPUTE && step_here(ex, q))
            left |= 1 << ex->step_part[q];
    return left;
}

/* Plan step sq's node at iteration it: its forward, its backward (back),
 * or its recomputation in a backward; 0, or -1. */
static int node_step(mesh__exec *ex, const plan_step *sq, int it, int back)
{
    if (back && sq->recompute) {
        ex->recomputing = 1;
        int rc = exec__forward_node(ex, sq->node, it);
        ex->recomputing = 0;
        if (rc != 0) return -1;
        round_value(ex, sq->node, it);
    } else if (back) {
        start_grads(ex, sq->node, it);
        int bad = exec__gstage_begin(ex, sq->node, it) != 0 || exec__backward_node(ex, sq->node, it) != 0;
        ex->kern.assign = 0; /* (start_grads's, for this node's kernels only) */
        if (bad) {
            exec__gstage_drop(ex);
            return -1;
        }
        round_grads(ex, sq->node, it); /* (a param's: its staged contribution) */
        if (exec__gstage_end(ex) != 0) return -1;
    } else if (exec__forward_node(ex, sq->node, it) != 0) {
        return -1;
    } else {
        round_value(ex, sq->node, it);
    }
    return 0;
}

/* Runs the program's steps of one phase on this stage; a run of
 * consecutive steps in a region repeats per iteration (backward: last to
 * first, each iteration starting with the forward steps it recomputes).
 * Returns 0, or -1 when a collective or a transfer failed (ex->error). */
static int run_phase(mesh__exec *ex, plan_phase phase)
{
    const plan *p = ex->p;
    int back = phase == PLAN_BACKWARD;
    if (back) {
        poison_workspace(ex);
        exec__fill(ex, ex->arena + ex->pinned_at, 0, (size_t)ex->ms->pinned);
        /* zero >= 2: the staged gradients (fp32: 4 / esize times the values' bytes) */
        exec__fill(ex, ex->arena + ex->gathered_at, 0, (size_t)ex->ms->zfixed * (size_t)(4 / ex->esize));
        if (ex->chunk < ex->chunks - 1 && pipe_transfer(ex, 1, 0) != 0) return -1;
    } else if (phase == PLAN_FORWARD && ex->chunk > 0 && pipe_transfer(ex, 0, 0) != 0) {
        return -1;
    }
    if (phase == PLAN_GRAD_SYNC && exec__overlap_wait(ex) != 0) return -1;
    if (phase == PLAN_FORWARD && exec__gather_wait(ex, -2) != 0) return -1; /* ZeRO-1/2: the last step's params */
    int sync = phase == PLAN_GRAD_SYNC || phase == PLAN_AFTER_OPTIMIZER;
    for (int s = 0; s < p->n_steps;) {
        const plan_step *st = &p->steps[s];
        if (st->phase != phase) { s++; continue; }
        if (sync && st->region < 0 && exec__bucketed(ex, s)) { /* a bucket outside any region: one call */
            int r = exec__bucket_end(ex, s, p->n_steps);
            if (exec__bucket_call(ex, s, r, 0, NULL) < 0) return -1;
            s = r;
            continue;
        }
        int e = s + 1;
        if (st->region >= 0)
            while (e < p->n_steps && p->steps[e].phase == phase && p->steps[e].region == st->region) e++;
        int count = st->region >= 0 ? (int)p->regions[st->region].count : 1;
        int stack = st->region >= 0 && st->region == ex->stack;
        if (stack) count = sync ? ex->copies[st->node] : ex->n_layers; /* the unit's layers; a param's held copies */
        if (!step_here(ex, s)) count = 0;
        for (int k = 0; k < count; k++) {
            int it = stack && sync ? exec__copy_it(ex, st->node, k)
                   : stack         ? ex->first_layer + (back ? count - 1 - k : k)
                                   : back ? count - 1 - k : k;
            if (back && st->region >= 0) start_carries(ex, st->region, it);
            if (phase == PLAN_FORWARD && stack && exec__gather_wait(ex, (int)exec__param_copy(ex, st->node, it)) != 0)
                return -1; /* ZeRO-1/2: the layer's params, gathered since the last step's AdamW */
            if (stack && !sync && k + 1 < count && /* ZeRO-3: the next layer's params, gathered meanwhile */
                exec__prefetch(ex, s, e, ex->first_layer + (back ? count - 2 - k : k + 1)) != 0)
                return -1;
            if (back && stack && ex->ms->zlayer) { /* zero >= 2: the layer's gradients, staged (layers alternate
                                                      between two buffers: the one before's reduce-scatter may
                                                      still be running, the one two before's has to be done) */
                if (exec__rs_finish(ex, it % 2) != 0) return -1;
                int64_t r = 4 / ex->esize; /* (fp32 gradients) */
                exec__fill(ex, ex->arena + ex->gathered_at + r * (ex->ms->zfixed + (it % 2) * ex->ms->zlayer), 0,
                           (size_t)(r * ex->ms->zlayer));
            }
            for (int q = s; q < e; q++) {
                const plan_step *sq = &p->steps[q];
                if (sync && exec__bucketed(ex, q)) { /* a layer's bucket: one call */
                    int r = exec__bucket_end(ex, q, e);
                    if (exec__prof_begin(ex, EX_PROF_COMM) != 0 ||
                        exec__prof_end(ex, exec__bucket_call(ex, q, r, it, NULL) < 0 ? -1 : 0) != 0)
                        return -1;
                    q = r - 1;
                } else if (sq->kind != STEP_COMPUTE) {
                    if (exec__prof_begin(ex, EX_PROF_COMM) != 0 || exec__prof_end(ex, collective(ex, sq, it)) != 0)
                        return -1;
                } else if (exec__prof_begin_node(ex, sq->node, !back          ? EX_PROF_FWD
                                                               : sq->recompute ? EX_PROF_RECOMPUTE
                                                                               : EX_PROF_BWD) != 0) {
                    return -1;
                } else if (exec__prof_end(ex, node_step(ex, sq, it, back)) != 0) {
                    return -1;
                }
            }
            if (back && stack && exec__overlap_layer_done(ex, it) != 0) return -1;
        }
        int here, left = back && ex->ov_last ? parts_left(ex, e, &here) : 0;
        if (back && ex->ov_last && exec__overlap_parts_done(ex, here, left) != 0) return -1;
        s = e;
    }
    if (back && exec__rs_finish(ex, -1) != 0) return -1; /* zero >= 2: every shard has its sum */
    if (phase == PLAN_FORWARD && ex->chunk < ex->chunks - 1) return pipe_transfer(ex, 0, 1);
    if (back && ex->chunk > 0) return pipe_transfer(ex, 1, 1);
    return 0;
}

size_t mesh__exec_batch_tokens(const mesh__exec *ex) { return ex->numel[ex->tokens_in]; }

/* Forward of one micro-batch in the current slot: its loss's terms added
 * to the sum begun (exec__loss_begin); -1 if a collective failed
 * (ex->error). backward: its backward follows (the loss's cross-entropy
 * then writes the logits' gradient over them, ex->grads_follow). */
static int forward(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, int backward)
{
    ex->grads_follow = backward;
    if (ex->poison)
        exec__fill(ex, ex->arena + ex->slots_at + ex->slot * ex->ms->slot_bytes, 0xff, (size_t)ex->ms->slot_bytes);
    poison_workspace(ex);
    size_t n = ex->numel[ex->tokens_in];
    if (part_here(ex, ex->tokens_in)) exec__to_dev(ex, exec__vptr(ex, ex->tokens_in, 0), inputs, n * sizeof *inputs);
    if (part_here(ex, ex->targets_in))
        exec__to_dev(ex, exec__vptr(ex, ex->targets_in, 0), targets, n * sizeof *targets);
    int rc = run_phase(ex, PLAN_FORWARD);
    ex->grads_follow = 0;
    if (rc == 0) rc = exec__loss_micro_end(ex);
    return rc == 0 && !ex->dev_failed ? 0 : -1;
}

double mesh__exec_loss(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    double loss;
    return mesh__exec_forward(ex, inputs, targets, &loss) == 0 ? loss : NAN;
}

/* A rank whose step failed earlier (mesh__exec_failed) takes no more:
 * its worlds are aborted or its peers wait in a collective of the step
 * that failed, and what the failure abandoned (collectives in flight,
 * their buffers) is not to be touched again. -2, with ex->error still
 * naming the failure. */
static int failed_before(mesh__exec *ex)
{
    if (!mesh__exec_failed(ex)) return 0;
    static const char said[] = " (in an earlier step: this rank takes no more steps)";
    size_t n = strlen(ex->error);
    if (n < sizeof said - 1 || strcmp(ex->error + n - (sizeof said - 1), said) != 0)
        snprintf(ex->error + n, sizeof ex->error - n, "%s", said);
    return -2;
}

static int forward_pass(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, double *loss)
{
    ex->slot = 0;
    *loss = 0;
    if (failed_before(ex)) return -2;
    exec__loss_begin(ex, 0);
    for (int c = ex->stage; c < ex->chunks; c += (int)ex->p->pp) { /* the stage's chunks, in order */
        exec__set_chunk(ex, c);
        if (forward(ex, inputs, targets, 0) != 0) return -2;
    }
    exec__set_chunk(ex, ex->stage);
    if (pipe_flush(ex) != 0 || exec__loss_take(ex, loss) != 0) return -2;
    /* the last chunk has the loss: every stage gets it */
    return exec__sum_doubles(ex, ex->axis[2], loss, 1) == 0 ? 0 : -2;
}

int mesh__exec_forward(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, double *loss)
{
    int rc = forward_pass(ex, inputs, targets, loss);
    if (rc == -2) ex->failed = 1;
    return rc;
}

static void zero_param_grads(mesh__exec *ex)
{
    exec__fill(ex, ex->arena + ex->grads_at, 0, (size_t)ex->ms->grads);
}

double mesh__exec_grad(mesh__exec *ex, const int32_t *inputs, const int32_t *targets)
{
    zero_param_grads(ex);
    double saved = ex->dloss, scale = ex->loss_scale;
    ex->dloss = 1.0;
    ex->loss_scale = 1.0;
    ex->slot = 0;
    double loss;
    exec__loss_begin(ex, 0);
    if (forward(ex, inputs, targets, 1) != 0 || run_phase(ex, PLAN_BACKWARD) != 0 || exec__loss_take(ex, &loss) != 0)
        loss = NAN;
    ex->dloss = saved;
    ex->loss_scale = scale;
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

/* The micro-batches in the schedule's order: a forward takes a free slot,
 * its backward frees it. Sums the losses into *loss; -1 if a collective
 * failed. */
static int run_units(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, double *loss)
{
    const plan_stage *g = &ex->p->stages[ex->stage];
    size_t bt = mesh__exec_batch_tokens(ex);
    exec__loss_begin(ex, *loss); /* the terms read from the device once, at the end */
    for (int u = 0; u < g->n_units; u++) {
        const sched_unit *un = &g->units[u];
        int unit = un->micro * ex->chunks + un->chunk;
        if (un->op == SCHED_FWD || un->op == SCHED_BWD) exec__set_chunk(ex, un->chunk);
        if (un->op == SCHED_FWD) {
            int s = 0;
            while (ex->slot_busy[s]) s++; /* the memory plan has a slot for every unit in flight */
            ex->slot_busy[s] = 1;
            ex->slot_of[unit] = ex->slot = s;
            if (forward(ex, inputs + (size_t)un->micro * bt, targets + (size_t)un->micro * bt, 1) != 0) return -1;
        } else if (un->op == SCHED_BWD) {
            ex->slot = ex->slot_of[unit];
            /* the chunk's last backward this step: its gradients finish (exec_overlap.c) */
            ex->ov_last = 1;
            for (int v = u + 1; v < g->n_units; v++)
                ex->ov_last &= g->units[v].op != SCHED_BWD || g->units[v].chunk != un->chunk;
            int rc = run_phase(ex, PLAN_BACKWARD);
            ex->ov_last = 0;
            if (rc != 0) return -1;
            ex->slot_busy[ex->slot] = 0;
        }
    }
    return pipe_flush(ex) != 0 ? -1 : exec__loss_take(ex, loss);
}

/* x[k] <- the sum over the group's ranks q, in rank order, of the double
 * at all[(q n + k) x 2] (every rank's n doubles as 2 n floats each). */
static void sum_gathered(double *x, int n, int size, const float *all)
{
    for (int k = 0; k < n; k++) {
        double sum = 0, v;
        for (int q = 0; q < size; q++) {
            memcpy(&v, all + ((size_t)q * (size_t)n + (size_t)k) * 2, sizeof v);
            sum += v;
        }
        x[k] = sum;
    }
}

/* The sum over the group of x[0..n-1], in rank order, exactly (doubles
 * travel as bytes): a few numbers (the loss, the norm's squares), in host
 * memory on the stack. */
int exec__sum_doubles(mesh__exec *ex, comm *c, double *x, int n)
{
    enum { ON_STACK = 8192 };
    float stack[ON_STACK];
    c = exec__host_comm(ex, c);
    if (!c) return 0;
    size_t need = (size_t)(c->size + 1) * 2 * (size_t)n;
    if (need > ON_STACK) {
        snprintf(ex->error, sizeof ex->error, "rank %d: an exact sum of %d numbers over %d ranks needs %zu bytes, "
                 "more than its %zu", ex->rank, n, c->size, need * sizeof(float), sizeof stack);
        comm_abort(c, ex->error);
        return -1;
    }
    float *mine = stack, *all = stack + (size_t)n * 2;
    memcpy(mine, x, (size_t)n * sizeof *x);
    int rc = comm_all_gather(c, mine, all, (size_t)n * 2);
    if (rc == 0) sum_gathered(x, n, c->size, all);
    else snprintf(ex->error, sizeof ex->error, "rank %d: an all-gather of sums: %s", ex->rank, c->error);
    return rc;
}

/* The deterministic chain over the data-parallel ranks: before its
 * micro-batches (end = 0) rank d takes the gradients and the loss summed by
 * ranks 0 .. d - 1 (rank 0 starts from zeros); after them (end = 1) it
 * passes them on, and the last rank's sums, now the one-rank run's to the
 * bit, go to every rank. The ranks run one after another. */
static int chain_link(mesh__exec *ex, int end, double *loss)
{
    comm *c = ex->data, *h = exec__host_comm(ex, c); /* the gradients, the loss */
    int d = c->rank, last = c->size - 1, rc = 0;
    void *g = ex->arena + ex->grads_at;
    size_t bytes = (size_t)ex->ms->grads;
    if (!end && d == 0) {
        zero_param_grads(ex);
        *loss = 0;
    } else if (!end) {
        rc = EXEC_COMM(ex, -1, 0, comm_recv(c, g, bytes, d - 1)) | comm_recv(h, loss, sizeof *loss, d - 1);
    } else {
        if (d < last) rc = EXEC_COMM(ex, -1, 0, comm_send(c, g, bytes, d + 1)) | comm_send(h, loss, sizeof *loss, d + 1);
        if (rc == 0)
            rc = EXEC_COMM(ex, -1, 0, comm_broadcast(c, g, bytes, last)) | comm_broadcast(h, loss, sizeof *loss, last);
    }
    if (rc != 0)
        snprintf(ex->error, sizeof ex->error, "rank %d: the deterministic chain: %s", ex->rank,
                 c->error[0] ? c->error : h->error);
    return rc ? -1 : 0;
}

static int train_step(mesh__exec *ex, long long step, const int32_t *inputs, const int32_t *targets,
                      mesh__step_stats *st);

/* The step's overlapped collectives (the gathers after AdamW included, which
 * run into the next step's forward) and their times so far. */
static void overlap_stats(mesh__exec *ex, mesh__step_stats *st, double turns0)
{
    double busy, wait;
    st->comm_ms = exec__turns_total(ex) - turns0;
    st->flops = ex->flops;
    st->overlapped = ex->ov_step_calls + ex->pf_step_calls + ex->rs_step_calls + ex->ag_step_calls;
    exec__overlap_times(ex, &busy, &wait);
    st->overlap_ms = 1e3 * busy;
    st->wait_ms = 1e3 * wait;
}

/* AdamW on every param (ex->adam_t counted) at the factor gscale its
 * gradients are read with: one call for them all where the kernels have
 * one (a GPU's few launches), else a call each; 0, or -1 (ex->error). */
static int adamw_params(mesh__exec *ex, double gscale, double lr)
{
    const fe_setup *s = &ex->p->setup;
    int count = 0;
    for (int k = 0; k < ex->n_params; k++) {
        int id = ex->params[k];
        const plan_tensor *t = &ex->p->tensors[id];
        /* decay matrices and embeddings, not gains and biases (GPT-2, llm.c) */
        float wd = t->rank >= 2 ? (float)s->weight_decay : 0.0f;
        /* without ZeRO all copies at once (they follow one another), with it each copy's shard */
        int copies = ex->zero ? ex->copies[id] : 1;
        for (int c = 0; c < copies; c++) {
            int it = exec__copy_it(ex, id, c);
            size_t lo, len;
            kern_adamw *a = &ex->adam[count++];
            exec__shard_of(ex, id, it, &lo, &len, &a->m, &a->v);
            a->n = ex->zero ? len : (size_t)ex->copies[id] * ex->numel[id];
            /* mixed precision: the fp32 master updated, the weights its rounding
             * (the kernel writes them: bf16 on a GPU; fp32 words on the CPU,
             * rounded below) */
            float *w = exec__pshard(ex, id, it), *master = exec__master(ex, id, it);
            a->params = master ? master : w;
            a->params_lp = master ? w : NULL;
            a->grads = exec__gshard(ex, id, it);
            a->weight_decay = wd;
        }
    }
    float lr_f = (float)lr, b1 = (float)s->beta1, b2 = (float)s->beta2, eps = (float)s->eps;
    if (ex->kern.v->adamw_many) {
        if (EXEC_KERN(ex, adamw_many, ex->adam, count, gscale, lr_f, b1, b2, eps, (int)ex->adam_t) != 0)
            return exec__kern_failed(ex, "AdamW");
    } else {
        for (int b = 0; b < count; b++) {
            const kern_adamw *a = &ex->adam[b];
            if (EXEC_KERN(ex, adamw_step, a->params, a->params_lp, a->grads, gscale, a->m, a->v, a->n, lr_f, b1, b2,
                          eps, a->weight_decay, (int)ex->adam_t) != 0)
                return exec__kern_failed(ex, "AdamW");
        }
    }
    for (int b = 0; b < count; b++)
        exec__round(ex, ex->adam[b].params_lp, ex->adam[b].n);
    return 0;
}

int mesh__exec_train_step(mesh__exec *ex, long long step, const int32_t *inputs,
                          const int32_t *targets, mesh__step_stats *st)
{
    int rc = train_step(ex, step, inputs, targets, st);
    ex->ov_failed = rc == -2; /* its collectives in flight are abandoned (exec__overlap_free) */
    if (rc == -2) ex->failed = 1;
    return rc;
}

static int train_step(mesh__exec *ex, long long step, const int32_t *inputs, const int32_t *targets,
                      mesh__step_stats *st)
{
    const fe_setup *s = &ex->p->setup;
    int m = (int)(s->micro_batches > 0 ? s->micro_batches : 1);
    double loss = 0, turns0 = exec__turns_total(ex);
    if (failed_before(ex)) return -2;
    ex->counting = 1;
    ex->flops = 0;
    ex->steps++;
    exec__overlap_step_begin(ex);
    /* deterministic: data-parallel rank d starts from rank d - 1's sums */
    if (ex->chain ? chain_link(ex, 0, &loss) != 0 : (zero_param_grads(ex), 0)) return -2;
    /* the loss is the last stage's */
    if (run_units(ex, inputs, targets, &loss) != 0 || (ex->chain && chain_link(ex, 1, &loss) != 0) ||
        run_phase(ex, PLAN_GRAD_SYNC) != 0 || exec__sum_doubles(ex, ex->axis[2], &loss, 1) != 0 ||
        (!ex->chain && exec__sum_doubles(ex, ex->data, &loss, 1) != 0))
        return -2;
    loss /= (double)m * ex->data_ranks;
    /* (mixed precision: the gradients are fp32, summed in fp32.) With a
     * loss scale, the clipping below is of the unscaled norm */
    double S = ex->loss_scale, clip = S == 1.0 ? s->clip : 0.0, norm, scale = 1.0;
    /* each buffer's sum of squares, on its device (the profile's optimizer) */
    if (exec__prof_begin(ex, EX_PROF_OPTIMIZER) != 0) return -2;
    int ss_rc = EXEC_KERN(ex, sum_squares, ex->gss, (void *const *)ex->gbufs, ex->gsizes, ex->n_gbufs);
    if (exec__prof_end(ex, ss_rc != 0 ? exec__kern_failed(ex, "the gradient's norm") : 0) != 0) return -2;
    if (!ex->zero && s->tp == 1 && s->ep == 1 && ex->p->pp == 1) {
        double ss = 0;
        for (int b = 0; b < ex->n_gbufs; b++) ss += ex->gss[b];
        norm = (float)sqrt(ss); /* kcpu_clip_global_norm's arithmetic, to the bit */
        if (clip > 0) scale = (double)(float)clip / (norm + 1e-6);
    } else { /* the norm of the whole gradient: every rank's shards, a replicated param once */
        /* sums of squares of: dense params, dense split over tp, experts split
         * over tp, experts (whose ep ranks hold different ones); each summed
         * over the ranks holding other parts: ZeRO's shards (dp x ep for a
         * dense param, dp for an expert's), tp, ep, then the stages */
        double ss[4] = {0, 0, 0, 0};
        for (int b = 0; b < ex->n_gbufs; b++) /* a tied param counts on the first stage only */
            if (ex->gsplit[b] < 4) ss[(int)ex->gsplit[b]] += ex->gss[b];
        comm *zd = ex->zero ? ex->data : NULL, *ze = ex->zero ? ex->axis[0] : NULL;
        if (exec__sum_doubles(ex, zd, ss, 2) != 0 || exec__sum_doubles(ex, ze, ss + 2, 2) != 0 ||
            exec__sum_doubles(ex, ex->axis[1], ss + 1, 2) != 0 || exec__sum_doubles(ex, ex->axis[3], ss + 2, 2) != 0 ||
            exec__sum_doubles(ex, ex->axis[2], ss, 4) != 0)
            return -2;
        norm = (float)sqrt(ss[0] + ss[1] + ss[2] + ss[3]);
        if (clip > 0) scale = clip / (norm + 1e-6);
    }
    if (S != 1.0 && isfinite(norm)) { /* unscaled, then clipped: one factor */
        norm /= S;
        scale = 1.0 / S;
        if (s->clip > 0 && s->clip / (norm + 1e-6) < 1.0) scale *= s->clip / (norm + 1e-6);
    }
    /* the factor is AdamW's to apply as it reads the gradients (no pass of
     * its own; the same bits as scaling them first) */
    double gscale = scale < 1.0 || S != 1.0 ? scale : 1.0;
    double lr = mesh__exec_lr(ex->p, step);
    st->loss = loss;
    st->norm = norm;
    st->lr = lr;
    st->loss_scale = S;
    st->skipped = 0;
    if (!isfinite(loss)) return -1;
    if (!isfinite(norm)) { /* every rank has the same norm: they skip together */
        if (ex->prec != KCPU_FP16 || (ex->scale_dynamic && S <= 1.0)) return -1;
        st->skipped = 1; /* fp16 overflow: a lower scale next time (a fixed one stays) */
        if (ex->scale_dynamic) ex->loss_scale = S / 2 > 1.0 ? S / 2 : 1.0;
        ex->scale_good = 0;
        ex->counting = 0;
        overlap_stats(ex, st, turns0);
        return 0;
    }
    if (ex->scale_dynamic && ++ex->scale_good >= ex->scale_interval) {
        ex->loss_scale = S * 2;
        ex->scale_good = 0;
    }
    ex->adam_t++;
    if (exec__prof_begin(ex, EX_PROF_OPTIMIZER) != 0 || exec__prof_end(ex, adamw_params(ex, gscale, lr)) != 0)
        return -2;
    /* ZeRO-1/2: the updated params gathered, on the queue while the next
     * step's forward begins, else now */
    int queued = exec__gather_issue(ex);
    int rc = queued < 0 ? -2 : (queued || run_phase(ex, PLAN_AFTER_OPTIMIZER) == 0) && !ex->dev_failed ? 0 : -2;
    ex->counting = 0;
    overlap_stats(ex, st, turns0);
    return rc;
}

/* Entry k of the table of what the rank sent: its kind and axis (the
 * pipeline's transfers: STEP_SLICE, 0), those with bytes or the plan's
 * prediction in order; -1 past the last. */
static int sent_entry(const mesh__exec *ex, int k, int *kind_of, int *axis_of)
{
    const plan_traffic *t = ex->p->traffic ? &ex->p->traffic[ex->stage] : NULL;
    for (int kind = STEP_ALL_REDUCE; kind <= STEP_SLICE; kind++)
        for (int a = 0; a < 4; a++) {
            int p2p = kind == STEP_SLICE;
            if (p2p && a > 0) break;
            double got = p2p ? ex->sent_p2p : ex->sent[kind][a];
            double want = !t ? -1 : p2p ? (double)t->send : (double)t->coll[kind][a];
            if (got == 0 && want <= 0) continue;
            if (k-- > 0) continue;
            *kind_of = kind;
            *axis_of = a;
            return 0;
        }
    return -1;
}

int mesh__exec_sent(const mesh__exec *ex, int k, char *what, size_t n, double *bytes, double *planned)
{
    const plan_traffic *t = ex->p->traffic ? &ex->p->traffic[ex->stage] : NULL;
    double steps = ex->steps > 0 ? (double)ex->steps : 1;
    int kind, a;
    if (sent_entry(ex, k, &kind, &a) != 0) return -1;
    int p2p = kind == STEP_SLICE;
    if (p2p) snprintf(what, n, "send(pp)");
    else snprintf(what, n, "%s(%s)", shard_step_name((shard_step_kind)kind), plan__axis_name(a));
    *bytes = (p2p ? ex->sent_p2p : ex->sent[kind][a]) / steps;
    *planned = !t ? -1 : p2p ? (double)t->send : (double)t->coll[kind][a];
    return 0;
}

int mesh__exec_comm_ms(mesh__exec *ex, int k, double *ms, double *calls, long long *untimed)
{
    int kind, a;
    long long n;
    if (sent_entry(ex, k, &kind, &a) != 0) return -1;
    double steps = ex->steps > 0 ? (double)ex->steps : 1;
    *ms = exec__turns_ms(ex, kind, a, &n, untimed) / steps;
    *calls = (double)n / steps;
    return 0;
}

int mesh__exec_overlap_ms(mesh__exec *ex, int k, double *ms, double *calls)
{
    int kind, a;
    long long n;
    if (sent_entry(ex, k, &kind, &a) != 0) return -1;
    double steps = ex->steps > 0 ? (double)ex->steps : 1;
    *ms = exec__overlap_entry_ms(ex, kind, a, &n) / steps;
    *calls = (double)n / steps;
    return 0;
}

int mesh__exec_kernels_report(mesh__exec *ex, int what, char *buf, size_t n)
{
    if (!ex->kern.v->report) return -1;
    return ex->kern.v->report(&ex->kern, what, buf, n);
}

int mesh__exec_data_mean(mesh__exec *ex, double *x)
{
    if (exec__sum_doubles(ex, ex->data, x, 1) != 0) return -2;
    *x /= (double)ex->data_ranks;
    return 0;
}
