/* exec_comm.c — the collectives a rank makes in its own turn (EXEC_COMM,
 * exec_impl.h): ordered after the kernels before them, and timed.
 *
 * In turn means on the rank's path, not queued on a communication thread
 * (exec_overlap.c, exec_marks.c time those): tensor parallelism's sums and
 * conversions, the vocabulary-parallel cross-entropy's exchanges, moe's
 * all-to-alls, the pipeline's sends and receives, and the gradient sums,
 * reduce-scatters and gathers that are not overlapped. During a training
 * step each call's time is added to its entry of mesh_context_sent's
 * table (its kind and axis; the pipeline's transfers: send(pp)):
 *   - on a GPU whose NCCL calls are ordered on the compute stream
 *     (ex->ordered), the GPU's own time, from timed events recorded there
 *     around the call (the call's kernels, from the end of the kernels
 *     before them), in a ring of EX_TIMES pairs added in once the GPU has
 *     finished them (never waited for: a call that finds the ring full
 *     goes untimed). An NCCL send is issued with the rank's next call
 *     (comm_nccl_p2p.c), so its time counts in that call's;
 *   - else (the CPU, MESH_NCCL_BLOCKING=1, ranks sharing a GPU) the host's
 *     time in the call, after its wait for the kernels before it.
 * Either includes the time the call waits for the group's other ranks to
 * come to it (a pipeline's bubble, an uneven load). The op profile's
 * entry "collectives in turn" (exec_prof.c) brackets them too.
 */
#include "exec_impl.h"

#include <stdio.h> /* snprintf */

int exec__timed_pairs(mesh__exec *ex, dev_event **start, dev_event **end, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        if (dev_event_create_timed(ex->dev, &start[i]) == MESH_OK &&
            dev_event_create_timed(ex->dev, &end[i]) == MESH_OK)
            continue;
        snprintf(ex->error, sizeof ex->error, "rank %d: the events that time its %s: %.700s", ex->rank, what,
                 dev_last_error(ex->dev));
        return -2;
    }
    return 0;
}

void exec__timed_pairs_free(mesh__exec *ex, dev_event **start, dev_event **end, int n)
{
    for (int i = 0; i < n; i++) {
        dev_event_destroy(ex->dev, start[i]);
        dev_event_destroy(ex->dev, end[i]);
        start[i] = end[i] = NULL;
    }
}

int exec__turns_init(mesh__exec *ex)
{
    ex_turns *t = &ex->turns;
    t->slot = -1;
    t->kind = -1;
    return ex->ordered ? exec__timed_pairs(ex, t->start, t->end, EX_TIMES, "collectives") : 0;
}

void exec__turns_free(mesh__exec *ex)
{
    exec__timed_pairs_free(ex, ex->turns.start, ex->turns.end, EX_TIMES);
}

/* Adds in the times of the calls the GPU has finished, by entry. */
static void harvest(mesh__exec *ex)
{
    ex_turns *t = &ex->turns;
    exec__harvest_times(ex->dev, t->start, t->end, EX_TIMES, t->made, &t->timed, t->entry, t->ms, t->calls);
}

static int comm_begin(mesh__exec *ex, int kind, int axis)
{
    ex_turns *t = &ex->turns;
    if (ex->gpu && !ex->ordered && dev_stream_sync(ex->dev, (dev_stream *)ex->kern.stream) != MESH_OK) {
        if (!ex->dev_failed)
            snprintf(ex->error, sizeof ex->error, "rank %d: waiting for the GPU before a collective: %.700s", ex->rank,
                     dev_last_error(ex->dev));
        ex->dev_failed = 1;
        return -1;
    }
    t->kind = ex->counting && kind >= 0 ? kind : -1; /* timed in a training step only, as the bytes are counted */
    t->axis = axis;
    t->slot = -1;
    if (t->kind < 0) return 0;
    if (!ex->ordered) {
        t->t0 = comm_now();
        return 0;
    }
    harvest(ex);
    if (t->made - t->timed >= EX_TIMES) { /* the GPU is EX_TIMES calls behind: untimed, rather than wait */
        t->untimed++;
        t->kind = -1;
        return 0;
    }
    int slot = (int)(t->made % EX_TIMES);
    if (dev_event_record(ex->dev, t->start[slot], (dev_stream *)ex->kern.stream) != MESH_OK) {
        if (!ex->dev_failed)
            snprintf(ex->error, sizeof ex->error, "rank %d: timing a collective: %.700s", ex->rank,
                     dev_last_error(ex->dev));
        ex->dev_failed = 1;
        return -1;
    }
    t->slot = slot;
    return 0;
}

static int comm_end(mesh__exec *ex, int rc)
{
    ex_turns *t = &ex->turns;
    if (t->kind < 0) return rc;
    if (t->slot < 0) {
        t->ms[t->kind * 4 + t->axis] += 1e3 * (comm_now() - t->t0);
        t->calls[t->kind * 4 + t->axis]++;
    } else if (dev_event_record(ex->dev, t->end[t->slot], (dev_stream *)ex->kern.stream) == MESH_OK) {
        t->entry[t->slot] = (short)(t->kind * 4 + t->axis);
        t->made++;
    } else if (rc == 0) { /* (a failed call's own message comes first) */
        if (!ex->dev_failed)
            snprintf(ex->error, sizeof ex->error, "rank %d: timing a collective: %.700s", ex->rank,
                     dev_last_error(ex->dev));
        ex->dev_failed = 1;
        rc = -1;
    }
    t->kind = -1;
    t->slot = -1;
    return rc;
}

/* (the op profile's entry of collectives in turn too, exec_prof.c: nested
 * in an op, such as moe's all-to-alls, they count in the op's) */
int exec__comm_begin(mesh__exec *ex, int kind, int axis)
{
    if (comm_begin(ex, kind, axis) != 0) return -1;
    return exec__prof_begin(ex, kind >= 0 ? EX_PROF_COMM : -1);
}

int exec__comm_end(mesh__exec *ex, int rc)
{
    return exec__prof_end(ex, comm_end(ex, rc));
}

int exec__grad_elements(mesh__exec *ex, comm *c, comm_async *q, int grads)
{
    if (ex->esize != 2) return 0;
    int type = grads ? COMM_F32 : ex->p->setup.precision == 1 ? COMM_BF16 : COMM_F16;
    if (q) comm_async_set_elements(q, type);
    if (!c || comm_set_elements(c, type) == 0) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d: a group of 2-byte tensors cannot sum fp32 gradients", ex->rank);
    return -1;
}

double exec__turns_ms(mesh__exec *ex, int kind, int axis, long long *calls, long long *untimed)
{
    if (ex->ordered) harvest(ex);
    *calls = ex->turns.calls[kind * 4 + axis];
    *untimed = ex->turns.untimed;
    return ex->turns.ms[kind * 4 + axis];
}

double exec__turns_total(mesh__exec *ex)
{
    if (ex->ordered) harvest(ex);
    double ms = 0;
    for (int e = 0; e < (STEP_SLICE + 1) * 4; e++) ms += ex->turns.ms[e];
    return ms;
}
