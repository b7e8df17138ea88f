/* exec_overlap.c — the gradient sync overlapped with backward: each
 * param's sum over its data-parallel group is issued to a communication
 * queue (comm_async.h) as soon as the last micro-batch's backward has
 * finished its gradient, and the queue runs it while backward goes on with
 * the layers below; the grad-sync phase waits for the queue and runs only
 * what was not issued (docs/parallelism.md, "Overlap").
 *
 * What is issued early: the program's gradient-sync all-reduces (zero 0)
 * and reduce-scatters (zero 1) over the data-parallel axis of a param whose
 * gradient no earlier sync step touches (a tied param's pipeline sum comes
 * first: it waits for the phase). A layer's params go once the layer's
 * backward iteration is done, in the program's order; the others once
 * backward has left every part of the model that uses them. The calls
 * are the same calls as the phase's, on a copy of the same group, so the
 * sums are the same bits (tests: parallel_overlap_is_bit_identical).
 *
 * Not overlapped: ZeRO-2/3 (their reduce-scatters are in backward already,
 * into staging reused per layer), the deterministic chain, a GPU (NCCL's
 * overlap is a stream of its own, not a thread), a backend that cannot
 * take calls from two threads (comm_async_supported), mesh_set_overlap(0).
 */
#include "exec_impl.h"

#include <stdio.h>  /* snprintf */
#include <string.h> /* memset */

/* Can step s be issued before the grad-sync phase? */
static int early_step(const mesh__exec *ex, int s)
{
    const plan *p = ex->p;
    const plan_step *st = &p->steps[s];
    if (st->phase != PLAN_GRAD_SYNC || st->axis != 0 || p->tensors[st->node].op != G_PARAM) return 0;
    if (st->kind != STEP_ALL_REDUCE && st->kind != STEP_REDUCE_SCATTER) return 0;
    if (!exec__step_comm(ex, st) || ex->copies[st->node] == 0) return 0;
    for (int q = 0; q < s; q++) /* a sync before it on the same gradient (a tied param's) */
        if (p->steps[q].phase == PLAN_GRAD_SYNC && p->steps[q].node == st->node) return 0;
    return 1;
}

/* The parts of the model (MEM_PART_* bits) whose backward adds to param
 * id's gradient. */
static int parts_using(const mesh__exec *ex, int id)
{
    const plan *p = ex->p;
    int mask = 0;
    for (int s = 0; s < p->n_steps; s++) {
        const plan_step *st = &p->steps[s];
        if (st->phase != PLAN_BACKWARD || st->kind != STEP_COMPUTE) continue;
        const plan_tensor *t = &p->tensors[st->node];
        for (int k = 0; k < t->n_in; k++) {
            int in = t->in[k];
            if (p->tensors[in].op == G_TRANSPOSE) in = p->tensors[in].in[0]; /* x @ transpose(w) */
            if (in == id) mask |= 1 << ex->step_part[s];
        }
    }
    return mask;
}

static void bracket(void *ud, int open) { dev_guard(((mesh__exec *)ud)->dev, open); }

int exec__overlap_init(mesh__exec *ex, unsigned flags)
{
    const plan *p = ex->p;
    if ((flags & MESH__EXEC_NO_OVERLAP) || ex->gpu || ex->chain || p->setup.zero >= 2) return 0;
    int any = 0;
    comm *groups[2] = {ex->data, ex->axis[0] != ex->data ? ex->axis[0] : NULL};
    for (int g = 0; g < 2; g++)
        if (groups[g] && !comm_async_supported(groups[g])) return 0;
    for (int s = 0; s < p->n_steps && !any; s++) any = early_step(ex, s);
    if (!any) return 0;
    ex->ov_at = exec__host_calloc(ex, (size_t)p->n_steps, sizeof *ex->ov_at);
    ex->ov_parts = exec__host_calloc(ex, (size_t)p->n_steps, sizeof *ex->ov_parts);
    if (!ex->ov_at || !ex->ov_parts) return -1;
    size_t flags_n = 0;
    for (int s = 0; s < p->n_steps; s++) {
        ex->ov_at[s] = -1;
        if (!early_step(ex, s)) continue;
        ex->ov_at[s] = (int)flags_n;
        flags_n += (size_t)ex->copies[p->steps[s].node];
        if (p->steps[s].region != ex->stack || ex->stack < 0) ex->ov_parts[s] = (signed char)parts_using(ex, p->steps[s].node);
    }
    ex->ov_issued = exec__host_calloc(ex, flags_n, 1);
    ex->ov_n = flags_n;
    if (!ex->ov_issued) return -1;
    /* a queue per data-parallel group (collective over each, the same on every member) */
    for (int g = 0; g < 2; g++) {
        ex->ov_comm[g] = groups[g];
        if (groups[g] && comm_async_new(groups[g], bracket, ex, &ex->ov_q[g]) != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d: %s", ex->rank, groups[g]->error);
            return -2;
        }
    }
    return 0;
}

void exec__overlap_free(mesh__exec *ex)
{
    for (int g = 0; g < 2; g++) {
        if (ex->ov_q[g] && comm_async_pending(ex->ov_q[g]) > 0) /* a failed step left sums in flight */
            comm_async_abort(ex->ov_q[g], "its step failed with gradient sums in flight");
        comm_async_free(ex->ov_q[g]);
        ex->ov_q[g] = NULL;
    }
    exec__host_free(ex, ex->ov_at, ex->ov_at ? (size_t)ex->p->n_steps * sizeof *ex->ov_at : 0);
    exec__host_free(ex, ex->ov_parts, ex->ov_parts ? (size_t)ex->p->n_steps : 0);
    exec__host_free(ex, ex->ov_issued, ex->ov_n);
    ex->ov_at = NULL;
    ex->ov_parts = NULL;
    ex->ov_issued = NULL;
}

static comm_async *queue_of(const mesh__exec *ex, const comm *c)
{
    return c == ex->ov_comm[0] ? ex->ov_q[0] : c == ex->ov_comm[1] ? ex->ov_q[1] : NULL;
}

/* Issues copy k of step s's sync. */
static int issue(mesh__exec *ex, int s, int k)
{
    const plan_step *st = &ex->p->steps[s];
    comm *c = exec__step_comm(ex, st);
    comm_async *q = queue_of(ex, c);
    int it = exec__copy_it(ex, st->node, k);
    float *g = exec__gptr(ex, st->node, it);
    size_t n = (size_t)(exec__buf_of(ex, st->node)->bytes / 4), part = n / (size_t)c->size;
    long t = st->kind == STEP_REDUCE_SCATTER && n % (size_t)c->size == 0
           ? comm_async_reduce_scatter(q, g, exec__at(ex, g, (size_t)c->rank * part), part)
           : comm_async_all_reduce(q, g, n); /* (uneven shards: the whole sum, as the phase does) */
    ex->ov_issued[ex->ov_at[s] + k] = 1;
    ex->ov_step_calls++;
    if (t > 0) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d: %s(dp) of tensor %d (grad-sync, overlapped): %s", ex->rank,
             st->kind == STEP_REDUCE_SCATTER ? "reduce-scatter" : "all-reduce", st->node, comm_async_error(q));
    return -1;
}

int exec__overlap_layer_done(mesh__exec *ex, int it)
{
    if (!ex->ov_last || !ex->ov_issued || ex->stack < 0) return 0;
    for (int s = 0; s < ex->p->n_steps; s++) {
        if (ex->ov_at[s] < 0 || ex->p->steps[s].region != ex->stack) continue;
        int k = (int)exec__param_copy(ex, ex->p->steps[s].node, it);
        if (!ex->ov_issued[ex->ov_at[s] + k] && issue(ex, s, k) != 0) return -1;
    }
    return 0;
}

int exec__overlap_parts_done(mesh__exec *ex, int here, int left)
{
    if (!ex->ov_last || !ex->ov_issued) return 0;
    for (int s = 0; s < ex->p->n_steps; s++) {
        if (ex->ov_at[s] < 0 || (ex->p->steps[s].region == ex->stack && ex->stack >= 0)) continue;
        /* backward still adds to it: in this unit, or in another chunk's
         * (the part before the stack is chunk 0's, the part after the last's) */
        if ((ex->ov_parts[s] & left) || (ex->ov_parts[s] & ~here)) continue;
        for (int k = 0; k < ex->copies[ex->p->steps[s].node]; k++)
            if (!ex->ov_issued[ex->ov_at[s] + k] && issue(ex, s, k) != 0) return -1;
    }
    return 0;
}

int exec__overlap_wait(mesh__exec *ex)
{
    for (int g = 0; g < 2; g++) {
        if (!ex->ov_q[g]) continue;
        if (comm_async_wait_all(ex->ov_q[g]) != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d: the overlapped gradient sync: %s", ex->rank,
                     comm_async_error(ex->ov_q[g]));
            return -1;
        }
    }
    return 0;
}

int exec__overlap_issued(const mesh__exec *ex, const plan_step *st, int it)
{
    int s = (int)(st - ex->p->steps);
    if (!ex->ov_issued || ex->ov_at[s] < 0) return 0;
    return ex->ov_issued[ex->ov_at[s] + exec__param_copy(ex, st->node, it)];
}

void exec__overlap_step_begin(mesh__exec *ex)
{
    if (ex->ov_issued) memset(ex->ov_issued, 0, ex->ov_n);
    ex->ov_step_calls = 0;
}
