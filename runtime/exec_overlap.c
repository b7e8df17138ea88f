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
 * ZeRO-3 prefetch: a layer's params are gathered whole into one of two
 * buffers (iterations alternate); while iteration it of the stack computes,
 * in forward and in backward, the queue gathers the next iteration's into
 * the other, and the next iteration waits for them instead of gathering.
 * Within one unit's phase: the first layer a phase runs gathers as before.
 *
 * ZeRO-2/3's reduce-scatters of a layer's staged gradients (per
 * micro-batch, in backward) go on the queue too; the staging area has two
 * layers, iterations alternate, and a buffer's sums are waited for and
 * added to the shards before backward fills it again (exec__rs_finish;
 * all of them at the end of each backward).
 *
 * ZeRO-1/2's gathers of the updated params after AdamW go on the queue
 * (outside the stack first, then the layers in forward order) and run
 * into the next step: its forward waits for what is outside the stack at
 * its start and for each layer's before the layer (exec__gather_wait);
 * whatever reads or writes params otherwise (a checkpoint, mesh_param_*)
 * waits for all of them first (Megatron-LM's overlapped param gather).
 *
 * Tests: parallel_overlap_is_bit_identical, also with a queue that waits
 * 0.2 ms before each call (MESH__EXEC_SLOW_QUEUE), where any read before its
 * wait reads stale data and changes the losses.
 *
 * On a GPU the queue's thread runs NCCL calls on its own communicator (a
 * world of its own, comm_nccl_own_thread) and its stream, beside the
 * rank's kernels on the compute stream. A call is queued when the kernels
 * that write its buffers are enqueued, not run: the mark hook records an
 * event on the compute stream as the call is queued, and the queue's
 * thread waits for that event before the call (ex_marks; the same code
 * runs on the CPU, whose events are done at once). The rank's wait for a
 * ticket is the host's, so the kernels it enqueues after the wait (that
 * read the result or write the buffers again) come after the call.
 * With the rank's NCCL calls ordered on the compute stream (ex->ordered),
 * the queue is deferred (comm_async_hooks.deferred): its stream waits for
 * the mark on the GPU, its thread records a done event after each call
 * once NCCL has enqueued it, and the rank's wait for a ticket ends once
 * the call is enqueued, the compute stream waiting for that event
 * (joined): no host waits for the GPU, and the order on the GPU is the
 * same. Its thread watches the work in flight (comm_nccl_progress).
 *
 * Not overlapped: the deterministic chain, a backend that cannot take
 * calls from two threads (comm_async_supported), mesh_set_overlap(0), and
 * a GPU under CUDA_DEVICE_MAX_CONNECTIONS=1 (below).
 */
#include "exec_impl.h"

#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* getenv */
#include <string.h> /* memset, strcmp */

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

/* ZeRO-3: is step s a gather of a layer's param whose next iteration's
 * gather can be issued while this one computes (into the other of the
 * layer's two gathered buffers)? */
static int prefetch_step(const mesh__exec *ex, int s)
{
    const plan *p = ex->p;
    const plan_step *st = &p->steps[s];
    if ((st->phase != PLAN_FORWARD && st->phase != PLAN_BACKWARD) || st->kind != STEP_ALL_GATHER || st->axis != 0)
        return 0;
    return p->setup.zero == 3 && ex->stack >= 0 && st->region == ex->stack && p->tensors[st->node].op == G_PARAM &&
           exec__staged(ex, st->node) && exec__step_comm(ex, st) != NULL;
}

/* ZeRO-2/3: is step s a reduce-scatter of a param's staged gradient in
 * backward (per micro-batch), which the queue can run while backward goes
 * on? */
static int rs_step(const mesh__exec *ex, int s)
{
    const plan_step *st = &ex->p->steps[s];
    return st->phase == PLAN_BACKWARD && st->kind == STEP_REDUCE_SCATTER && st->axis == 0 &&
           ex->p->tensors[st->node].op == G_PARAM && exec__staged(ex, st->node) && exec__step_comm(ex, st) != NULL;
}

int exec__overlap_init(mesh__exec *ex, unsigned flags)
{
    const plan *p = ex->p;
    ex->no_buckets = (flags & MESH__EXEC_NO_BUCKETS) != 0;
    ex->bk_bufs = exec__host_calloc(ex, 2 * (size_t)p->n_steps, sizeof *ex->bk_bufs);
    ex->bk_n = exec__host_calloc(ex, 2 * (size_t)p->n_steps, sizeof *ex->bk_n);
    if (!ex->bk_bufs || !ex->bk_n) return -1;
    if ((flags & MESH__EXEC_NO_OVERLAP) || ex->chain) return 0;
    /* CUDA_DEVICE_MAX_CONNECTIONS=1 puts every stream's kernels in one
     * queue, in launch order: the queue's NCCL kernels and the rank's
     * (tp's, the pipeline's) would run in an order that differs between
     * ranks, and wait for each other. Then nothing overlaps. */
    const char *conn = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (ex->gpu && conn && strcmp(conn, "1") == 0) return 0;
    int any = 0;
    comm *groups[2] = {ex->data, ex->axis[0] != ex->data ? ex->axis[0] : NULL};
    for (int g = 0; g < 2; g++)
        if (groups[g] && !comm_async_supported(groups[g])) return 0;
    int rs = 0;
    for (int s = 0; s < p->n_steps; s++) {
        any |= (p->setup.zero <= 1 && early_step(ex, s)) || prefetch_step(ex, s);
        rs += rs_step(ex, s);
    }
    int ag = 0; /* ZeRO-1/2's gathers after AdamW, every one in a bucket the queue can take */
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].phase == PLAN_AFTER_OPTIMIZER) ag = ag >= 0 && exec__bucketed(ex, s) ? 1 : -1;
    any |= ag > 0;
    if (!any && !rs) return 0;
    if (ag > 0) { /* the gathers after AdamW: a ticket per layer copy */
        ex->ag_layers = 1;
        for (int s = 0; s < p->n_steps; s++)
            if (p->steps[s].phase == PLAN_AFTER_OPTIMIZER && ex->copies[p->steps[s].node] > ex->ag_layers)
                ex->ag_layers = ex->copies[p->steps[s].node];
        ex->ag_layer = exec__host_calloc(ex, (size_t)ex->ag_layers, sizeof *ex->ag_layer);
        if (!ex->ag_layer) return -1;
    }
    if (rs) { /* at most each once per layer in flight (two) and once outside the stack */
        ex->rs_cap = 2 * rs;
        ex->rs = exec__host_calloc(ex, (size_t)ex->rs_cap, sizeof *ex->rs);
        if (!ex->rs) return -1;
    }
    ex->ov_at = exec__host_calloc(ex, (size_t)p->n_steps, sizeof *ex->ov_at);
    ex->ov_parts = exec__host_calloc(ex, (size_t)p->n_steps, sizeof *ex->ov_parts);
    ex->pf_ticket = exec__host_calloc(ex, 2 * (size_t)p->n_steps, sizeof *ex->pf_ticket);
    ex->pf_it = exec__host_calloc(ex, 2 * (size_t)p->n_steps, sizeof *ex->pf_it);
    if (!ex->ov_at || !ex->ov_parts || !ex->pf_ticket || !ex->pf_it) return -1;
    size_t flags_n = 0;
    for (int s = 0; s < p->n_steps; s++) {
        ex->ov_at[s] = -1;
        ex->pf_it[2 * s] = ex->pf_it[2 * s + 1] = prefetch_step(ex, s) ? -1 : -2; /* -2: never prefetched */
        if (p->setup.zero >= 2 || !early_step(ex, s)) continue;
        ex->ov_at[s] = (int)flags_n;
        flags_n += (size_t)ex->copies[p->steps[s].node];
        if (p->steps[s].region != ex->stack || ex->stack < 0)
            ex->ov_parts[s] = (signed char)parts_using(ex, p->steps[s].node);
    }
    ex->ov_issued = exec__host_calloc(ex, flags_n, 1);
    ex->ov_n = flags_n;
    if (!ex->ov_issued) return -1;
    /* a queue per data-parallel group (collective over each, the same on every member) */
    for (int g = 0; g < 2; g++) {
        ex->ov_comm[g] = groups[g];
        comm_async_hooks hooks = exec__marks_hooks(&ex->ov_mark[g], ex->ordered);
        if (groups[g] && comm_async_new(groups[g], &hooks, &ex->ov_q[g]) != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d: %s", ex->rank, groups[g]->error);
            return -2;
        }
        if (ex->ov_q[g] && exec__marks_init(ex, &ex->ov_mark[g]) != 0) return -2; /* (after the split: collective) */
        /* (a GPU's staged copies on the queue's own handle; the guarded CPU
         * device's stay on the rank's, which opens and closes its memory) */
        if (ex->gpu && ex->ov_q[g] && comm_async_own_device(ex->ov_q[g], ex->ov_mark[g].dev) != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d: a communication queue: %s", ex->rank,
                     comm_async_error(ex->ov_q[g]));
            return -2;
        }
        if (ex->ov_q[g] && (flags & MESH__EXEC_SLOW_QUEUE)) comm_async_set_delay(ex->ov_q[g], 2e-4);
    }
    return 0;
}

void exec__overlap_free(mesh__exec *ex)
{
    for (int g = 0; g < 2; g++) {
        if (ex->ov_q[g] && ex->ov_failed && comm_async_pending(ex->ov_q[g]) > 0) /* its peers may never come */
            comm_async_abort(ex->ov_q[g], "its step failed with collectives in flight");
        comm_async_free(ex->ov_q[g]); /* (else the last step's gathers finish first) */
        ex->ov_q[g] = NULL;
        exec__marks_free(ex, &ex->ov_mark[g]);
    }
    exec__host_free(ex, ex->ag_layer, ex->ag_layer ? (size_t)ex->ag_layers * sizeof *ex->ag_layer : 0);
    ex->ag_layer = NULL;
    exec__host_free(ex, ex->ov_at, ex->ov_at ? (size_t)ex->p->n_steps * sizeof *ex->ov_at : 0);
    exec__host_free(ex, ex->ov_parts, ex->ov_parts ? (size_t)ex->p->n_steps : 0);
    exec__host_free(ex, ex->ov_issued, ex->ov_n);
    exec__host_free(ex, ex->rs, ex->rs ? (size_t)ex->rs_cap * sizeof *ex->rs : 0);
    ex->rs = NULL;
    exec__host_free(ex, ex->bk_bufs, ex->bk_bufs ? 2 * (size_t)ex->p->n_steps * sizeof *ex->bk_bufs : 0);
    exec__host_free(ex, ex->bk_n, ex->bk_n ? 2 * (size_t)ex->p->n_steps * sizeof *ex->bk_n : 0);
    ex->bk_bufs = NULL;
    ex->bk_n = NULL;
    exec__host_free(ex, ex->pf_ticket, ex->pf_ticket ? 2 * (size_t)ex->p->n_steps * sizeof *ex->pf_ticket : 0);
    exec__host_free(ex, ex->pf_it, ex->pf_it ? 2 * (size_t)ex->p->n_steps * sizeof *ex->pf_it : 0);
    ex->ov_at = NULL;
    ex->ov_parts = NULL;
    ex->ov_issued = NULL;
    ex->pf_ticket = NULL;
    ex->pf_it = NULL;
}

/* Waits for the queue's call `ticket` (and those before it), counting the
 * time the rank waited; 0, or -1 if the queue failed. */
static int wait_for(mesh__exec *ex, comm_async *q, long ticket)
{
    double t0 = comm_now();
    int rc = comm_async_wait(q, ticket);
    ex->ov_wait_s += comm_now() - t0;
    return rc;
}

/* Seconds the rank's queues have run calls, in all (exec__marks_busy);
 * *stall: their compute stream's seconds waiting for them on a GPU. */
static double queues_busy(mesh__exec *ex, double *stall)
{
    double busy = 0, st;
    *stall = 0;
    for (int g = 0; g < 2; g++) {
        if (!ex->ov_q[g]) continue;
        busy += exec__marks_busy(&ex->ov_mark[g], ex->ov_q[g], &st);
        *stall += st;
    }
    return busy;
}

static comm_async *queue_of(const mesh__exec *ex, const comm *c)
{
    return c == ex->ov_comm[0] ? ex->ov_q[0] : c == ex->ov_comm[1] ? ex->ov_q[1] : NULL;
}

/* Issues steps [q, r) of one bucket (early, finished, not yet issued) at
 * iteration it as one call, and marks them issued. */
static int issue(mesh__exec *ex, int q, int r, int it)
{
    comm_async *queue = queue_of(ex, exec__step_comm(ex, &ex->p->steps[q]));
    int calls = exec__bucket_call(ex, q, r, it, queue);
    if (calls < 0) return -1;
    ex->ov_step_calls += calls;
    for (int s = q; s < r; s++)
        if (ex->copies[ex->p->steps[s].node] > 0)
            ex->ov_issued[ex->ov_at[s] + exec__param_copy(ex, ex->p->steps[s].node, it)] = 1;
    return 0;
}

/* The end of the run from q of steps that ready() says may go now, in
 * q's bucket. */
static int ready_run(const mesh__exec *ex, int q, int (*ready)(const mesh__exec *, int, int), int arg)
{
    int r = q + 1, end = exec__bucket_end(ex, q, ex->p->n_steps);
    while (r < end && ready(ex, r, arg)) r++;
    return r;
}

/* A layer's step: early, in the stack, its copy of iteration it not issued. */
static int layer_ready(const mesh__exec *ex, int s, int it)
{
    const plan_step *st = &ex->p->steps[s];
    return ex->ov_at[s] >= 0 && st->region == ex->stack &&
           !ex->ov_issued[ex->ov_at[s] + exec__param_copy(ex, st->node, it)];
}

int exec__overlap_layer_done(mesh__exec *ex, int it)
{
    if (!ex->ov_last || !ex->ov_issued || ex->stack < 0) return 0;
    for (int s = 0; s < ex->p->n_steps; s++) {
        if (!layer_ready(ex, s, it)) continue;
        int r = ready_run(ex, s, layer_ready, it);
        if (issue(ex, s, r, it) != 0) return -1;
        s = r - 1;
    }
    return 0;
}

/* A step outside the stack: early, backward adds nothing more to its
 * param (arg: the parts it still adds in, in bits 0-2, and those the
 * unit's chunk runs, in bits 3-5), not issued. */
static int part_ready(const mesh__exec *ex, int s, int arg)
{
    int left = arg & 7, here = arg >> 3, parts = ex->ov_parts[s];
    if (ex->ov_at[s] < 0 || (ex->p->steps[s].region == ex->stack && ex->stack >= 0)) return 0;
    /* backward still adds to it: in this unit, or in another chunk's (the
     * part before the stack is chunk 0's, the part after the last's) */
    if ((parts & left) || (parts & ~here)) return 0;
    for (int k = 0; k < ex->copies[ex->p->steps[s].node]; k++)
        if (ex->ov_issued[ex->ov_at[s] + k]) return 0;
    return 1;
}

int exec__overlap_parts_done(mesh__exec *ex, int here, int left)
{
    if (!ex->ov_last || !ex->ov_issued) return 0;
    int arg = left | here << 3;
    for (int s = 0; s < ex->p->n_steps; s++) {
        if (!part_ready(ex, s, arg)) continue;
        int r = ready_run(ex, s, part_ready, arg);
        /* a step outside the stack has one copy, or a non-stack region's
         * (issued per iteration) */
        int copies = ex->p->steps[s].region >= 0 ? (int)ex->p->regions[ex->p->steps[s].region].count : 1;
        for (int k = 0; k < copies; k++)
            if (issue(ex, s, r, k) != 0) return -1;
        s = r - 1;
    }
    return 0;
}

int exec__overlap_wait(mesh__exec *ex)
{
    for (int g = 0; g < 2; g++) {
        if (!ex->ov_q[g]) continue;
        if (wait_for(ex, ex->ov_q[g], comm_async_last(ex->ov_q[g])) != 0) {
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
    ex->pf_step_calls = 0;
    ex->rs_step_calls = 0;
    ex->ag_step_calls = 0;
    ex->rs_n = 0; /* (left by a failed step: its queue failed too) */
    ex->ov_busy0 = queues_busy(ex, &ex->ov_stall0);
    ex->ov_wait_s = 0;
}

/* ---- ZeRO-3: the next layer's params gathered while this one computes -- */

int exec__prefetch(mesh__exec *ex, int from, int to, int it)
{
    if (!ex->pf_it) return 0;
    for (int s = from; s < to; s++) {
        int slot = 2 * s + it % 2; /* (the iteration before's may still be in flight: the other slot) */
        if (ex->pf_it[slot] == -2) continue;
        const plan_step *st = &ex->p->steps[s];
        if (ex->pf_it[slot] >= 0) { /* its gather would race this one into the same buffer */
            snprintf(ex->error, sizeof ex->error, "rank %d: tensor %d's gather for iteration %d is still in flight "
                     "when iteration %d's is issued", ex->rank, st->node, ex->pf_it[slot], it);
            return -1;
        }
        comm_async *q = queue_of(ex, exec__step_comm(ex, st));
        long t = exec__zgather(ex, st, it, 1, q);
        if (t < 0) { /* the queue failed, or copying the shard in did */
            const char *why = comm_async_error(q)[0] ? comm_async_error(q) : exec__step_comm(ex, st)->error;
            snprintf(ex->error, sizeof ex->error, "rank %d: all-gather(dp) of tensor %d (%s, prefetched): %s", ex->rank,
                     st->node, plan_phase_name(st->phase), why);
            return -1;
        }
        ex->pf_ticket[slot] = t;
        ex->pf_it[slot] = it;
        ex->pf_step_calls++;
    }
    return 0;
}

int exec__prefetched(mesh__exec *ex, const plan_step *st, int it)
{
    int slot = 2 * (int)(st - ex->p->steps) + it % 2;
    if (!ex->pf_it || ex->pf_it[slot] != it) return 0;
    comm_async *q = queue_of(ex, exec__step_comm(ex, st));
    ex->pf_it[slot] = -1;
    if (wait_for(ex, q, ex->pf_ticket[slot]) == 0) return 1;
    snprintf(ex->error, sizeof ex->error, "rank %d: all-gather(dp) of tensor %d (%s, prefetched): %s", ex->rank,
             st->node, plan_phase_name(st->phase), comm_async_error(q));
    return -1;
}

/* ---- ZeRO-2/3: a layer's reduce-scatters while the layer below runs --- */

int exec__rs_issue(mesh__exec *ex, const plan_step *st, int it)
{
    if (!ex->rs) return 0;
    comm_async *q = queue_of(ex, exec__step_comm(ex, st));
    if (!q) return 0;
    if (ex->rs_n == ex->rs_cap) { /* (cannot happen: the layers alternate) */
        snprintf(ex->error, sizeof ex->error, "rank %d: more than %d reduce-scatters in flight", ex->rank, ex->rs_cap);
        return -1;
    }
    long t = exec__zreduce(ex, st, it, q);
    if (t < 0) {
        snprintf(ex->error, sizeof ex->error, "rank %d: reduce-scatter(dp) of tensor %d (backward, overlapped): %s",
                 ex->rank, st->node, comm_async_error(q));
        return -1;
    }
    ex->rs[ex->rs_n++] = (struct ex_rs){st->node, it, t, q};
    ex->rs_step_calls++;
    return 1;
}

int exec__rs_finish(mesh__exec *ex, int parity)
{
    int kept = 0;
    for (int i = 0; i < ex->rs_n; i++) {
        struct ex_rs r = ex->rs[i];
        if (parity >= 0 && !(exec__in_stack(ex, r.node) && r.it % 2 == parity)) { /* the other buffer's: later */
            ex->rs[kept++] = r;
            continue;
        }
        if (wait_for(ex, r.queue, r.ticket) != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d: reduce-scatter(dp) of tensor %d (backward, overlapped): %s",
                     ex->rank, r.node, comm_async_error(r.queue));
            return -1;
        }
        if (exec__zshard_add(ex, r.node, r.it) != 0) return -1;
    }
    ex->rs_n = kept;
    return 0;
}

void exec__overlap_times(mesh__exec *ex, double *busy_s, double *wait_s)
{
    double stall;
    *busy_s = queues_busy(ex, &stall) - ex->ov_busy0;
    *wait_s = ex->ov_wait_s + (stall - ex->ov_stall0);
}

void exec__queue_entry(mesh__exec *ex, const comm_async *q, int kind, int axis)
{
    for (int g = 0; g < 2; g++)
        if (q && ex->ov_q[g] == q) ex->ov_mark[g].next_entry = (short)(ex->counting ? kind * 4 + axis : EX_ENTRIES);
}

double exec__overlap_entry_ms(mesh__exec *ex, int kind, int axis, long long *calls)
{
    double ms = 0;
    *calls = 0;
    for (int g = 0; g < 2; g++) {
        long long n = 0;
        if (ex->ov_q[g]) ms += exec__marks_entry_ms(&ex->ov_mark[g], kind * 4 + axis, &n);
        *calls += n;
    }
    return ms;
}

double mesh__exec_queue_stall_ms(mesh__exec *ex, long long *untimed)
{
    double stall;
    queues_busy(ex, &stall);
    *untimed = exec__marks_untimed(&ex->ov_mark[0]) + exec__marks_untimed(&ex->ov_mark[1]);
    return 1e3 * stall;
}

/* ---- ZeRO-1/2: the updated params gathered while the next forward runs - */

static void last_tickets(const mesh__exec *ex, long t[2])
{
    for (int g = 0; g < 2; g++) t[g] = ex->ov_q[g] ? comm_async_last(ex->ov_q[g]) : 0;
}

int exec__gather_issue(mesh__exec *ex)
{
    const plan *p = ex->p;
    if (!ex->ag_layer) return 0;
    /* outside the stack first (the embedding comes first in forward), then
     * the layers, first to last */
    for (int pass = 0; pass < 2; pass++) {
        int layers = pass ? ex->ag_layers : 1;
        for (int k = 0; k < layers; k++) {
            for (int s = 0; s < p->n_steps; s++) {
                const plan_step *st = &p->steps[s];
                int stack = ex->stack >= 0 && st->region == ex->stack;
                if (st->phase != PLAN_AFTER_OPTIMIZER || stack != pass) continue;
                int r = exec__bucket_end(ex, s, p->n_steps);
                int copies = !stack && st->region >= 0 ? (int)p->regions[st->region].count : 1;
                for (int c = 0; c < copies; c++) {
                    int it = stack ? exec__copy_it(ex, st->node, k) : c;
                    if (stack && k >= ex->copies[st->node]) break;
                    int calls = exec__bucket_call(ex, s, r, it, queue_of(ex, exec__step_comm(ex, st)));
                    if (calls < 0) return -1;
                    ex->ag_step_calls += calls;
                }
                s = r - 1;
            }
            if (pass) last_tickets(ex, ex->ag_layer[k]);
        }
        if (!pass) last_tickets(ex, ex->ag_fixed);
    }
    ex->ag_pending = 1;
    return 1;
}

static int wait_tickets(mesh__exec *ex, const long t[2])
{
    for (int g = 0; g < 2; g++) {
        if (!ex->ov_q[g] || t[g] <= 0) continue;
        if (wait_for(ex, ex->ov_q[g], t[g]) != 0) {
            snprintf(ex->error, sizeof ex->error, "rank %d: the updated params' gathers (overlapped): %s", ex->rank,
                     comm_async_error(ex->ov_q[g]));
            return -1;
        }
    }
    return 0;
}

int exec__gather_wait(mesh__exec *ex, int copy)
{
    if (!ex->ag_pending) return 0;
    if (wait_tickets(ex, ex->ag_fixed) != 0) return -1;
    if (copy == -2) return 0;
    if (copy >= 0 && copy < ex->ag_layers) return wait_tickets(ex, ex->ag_layer[copy]);
    if (wait_tickets(ex, ex->ag_layer[ex->ag_layers - 1]) != 0) return -1; /* the last issued: all */
    ex->ag_pending = 0;
    return 0;
}
