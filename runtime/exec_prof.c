/* exec_prof.c — the op profile (MESH__EXEC_PROFILE: mesh_set_profile,
 * meshrun --profile): where a rank's training step spends its time, by
 * kind of work.
 *
 * run_phase (exec_step.c) brackets each node's kernels (forward, backward,
 * recomputation), each collective made in the rank's turn and each
 * pipeline transfer; train_step the optimizer (the gradient's norm and
 * AdamW). A bracket's time is added to its entry (ex_prof, exec_impl.h):
 *   - on a GPU, the compute stream's own time from a timed event recorded
 *     before the work to one after it, in a ring of EX_PROF_RING pairs
 *     added in once the GPU has finished them (never waited for during a
 *     step; mesh__exec_profile waits for the GPU once). The GPU runs the
 *     stream's work in order, so the pairs split its busy time by entry;
 *     the time it idles between them (the host behind, a wait for another
 *     stream) is in no entry;
 *   - else (the CPU's kernels run on the calling thread) the host's clock
 *     around the calls.
 * Work that another node's kernel does counts in that node's entry: a
 * matmul's bias add and GELU (cuBLASLt's epilogues) in the matmul's
 * forward, a GELU's backward in the matmul's (DGELU). The matmuls',
 * attention's and moe layers' timed brackets also add up their model
 * FLOPs (node_flops; a training step's total, profiled or not, too),
 * so that the table shows how near each comes to the GPU's peak. The first training
 * step of a context (its warm-up: the GPU's first launches, cuBLASLt's
 * choices) is left out. Tests: exec_profile_splits_the_step,
 * exec_cuda_profile_on_the_gpu.
 */
#include "exec_impl.h"

#include <stdio.h> /* snprintf */

int exec__prof_init(mesh__exec *ex)
{
    ex_prof *f = &ex->prof;
    f->entry = f->slot = -1;
    if (!f->on || !ex->gpu) return 0;
    f->start = exec__host_calloc(ex, EX_PROF_RING, sizeof *f->start);
    f->end = exec__host_calloc(ex, EX_PROF_RING, sizeof *f->end);
    f->at = exec__host_calloc(ex, EX_PROF_RING, sizeof *f->at);
    if (!f->start || !f->end || !f->at) {
        snprintf(ex->error, sizeof ex->error, "rank %d: out of memory (the profile's events)", ex->rank);
        return -2;
    }
    return exec__timed_pairs(ex, f->start, f->end, EX_PROF_RING, "ops");
}

void exec__prof_free(mesh__exec *ex)
{
    ex_prof *f = &ex->prof;
    if (f->start && f->end) exec__timed_pairs_free(ex, f->start, f->end, EX_PROF_RING);
    exec__host_free(ex, f->start, EX_PROF_RING * sizeof *f->start);
    exec__host_free(ex, f->end, EX_PROF_RING * sizeof *f->end);
    exec__host_free(ex, f->at, EX_PROF_RING * sizeof *f->at);
    f->start = f->end = NULL;
    f->at = NULL;
}

/* Adds in the pairs the GPU has finished. */
static void harvest(mesh__exec *ex)
{
    ex_prof *f = &ex->prof;
    exec__harvest_times(ex->dev, f->start, f->end, EX_PROF_RING, f->made, &f->timed, f->at, f->ms, f->calls);
}

static int timing_failed(mesh__exec *ex)
{
    if (!ex->dev_failed)
        snprintf(ex->error, sizeof ex->error, "rank %d: timing an op: %.700s", ex->rank, dev_last_error(ex->dev));
    ex->dev_failed = 1;
    return -1;
}

int exec__prof_begin(mesh__exec *ex, int entry)
{
    ex_prof *f = &ex->prof;
    if (!f->on || f->depth++ > 0) return 0;
    f->entry = ex->counting && ex->steps > 1 && entry >= 0 ? entry : -1;
    f->slot = -1;
    if (f->entry < 0) return 0;
    if (!f->start) {
        f->t0 = comm_now();
        return 0;
    }
    harvest(ex);
    if (f->made - f->timed >= EX_PROF_RING) { /* the GPU is a ring behind: untimed, rather than wait */
        f->untimed++;
        f->entry = -1;
        return 0;
    }
    int slot = (int)(f->made % EX_PROF_RING);
    if (dev_event_record(ex->dev, f->start[slot], (dev_stream *)ex->kern.stream) != MESH_OK) {
        f->depth--;
        f->entry = -1;
        return timing_failed(ex);
    }
    f->slot = slot;
    return 0;
}

int exec__prof_end(mesh__exec *ex, int rc)
{
    ex_prof *f = &ex->prof;
    if (!f->on || --f->depth > 0 || f->entry < 0) return rc;
    if (f->slot < 0) {
        f->ms[f->entry] += 1e3 * (comm_now() - f->t0);
        f->calls[f->entry]++;
    } else if (dev_event_record(ex->dev, f->end[f->slot], (dev_stream *)ex->kern.stream) == MESH_OK) {
        f->at[f->slot] = (short)f->entry;
        f->made++;
    } else if (rc == 0) { /* (a failed op's own message comes first) */
        rc = timing_failed(ex);
    }
    f->entry = f->slot = -1;
    return rc;
}

/* Node id's entry in a phase (exec__prof_begin_node), -1 for none. */
static int node_entry(const mesh__exec *ex, int id, int phase)
{
    const plan_tensor *t = &ex->p->tensors[id];
    const ex_fuse *fu = &ex->fuse[id];
    g_op op = t->op;
    if (op == G_TRANSPOSE) return -1; /* read through its matmul */
    if (phase == EX_PROF_BWD) {
        if (op == G_GELU && fu->dgelu_by >= 0) return -1; /* in the matmul's DGELU */
    } else {
        if (op == G_MATMUL && fu->into >= 0) return -1; /* at its bias add */
        if ((op == G_GELU || op == G_LAYERNORM || op == G_RMSNORM) && fu->into >= 0 && phase == EX_PROF_FWD)
            return -1; /* (recomputed at its own node) */
        if (op == G_ADD && fu->norm >= 0 && phase == EX_PROF_FWD) op = ex->p->tensors[fu->norm].op; /* the norm's kernel */
        if (op == G_BIAS_ADD && t->n_in > 0 && ex->fuse[t->in[0]].into == id) op = G_MATMUL;
    }
    return (int)op * 3 + phase;
}

/* Node id's model FLOPs in a phase (mesh_profile_entry's count, and a
 * training step's, mesh_step_stats.model_flops): a matmul's (or the bias
 * add's that computes it) 2 M K N forward, 4 M K N backward (dx and dw);
 * attention's 4 B H T^2 d forward, half of it causal, 2.5 times that
 * backward (FlashAttention's count); a moe layer's experts', each of its
 * N tokens through K experts of 2 (GELU) or 3 (SwiGLU) D x F products on
 * this rank, 2 D F each forward, twice that backward (meshc --stats's
 * count; the router's small product left out, as there); 0 for the
 * others. A product whose result is replicated over tp (not split, not
 * partial sums) is the same product on each of the tp ranks: each counts
 * its tp-th (tp_share), so that the ranks' counts add up to the model's on
 * any mesh. */
static double tp_share(const mesh__exec *ex, int id)
{
    return ex->p->tensors[id].pl.kind[1] == PL_REP ? 1.0 / (double)ex->p->setup.tp : 1.0;
}

static double node_flops(const mesh__exec *ex, int id, int phase)
{
    const plan_tensor *t = &ex->p->tensors[id];
    int m = t->op == G_MATMUL ? id : -1;
    if (t->op == G_BIAS_ADD && phase != EX_PROF_BWD && t->n_in > 0 && ex->fuse[t->in[0]].into == id) m = t->in[0];
    double back = phase == EX_PROF_BWD;
    if (m >= 0) {
        double K = exec__lastd(ex, ex->p->tensors[m].in[0]), N = exec__lastd(ex, m);
        double M = (double)ex->numel[m] / N;
        return (back ? 4.0 : 2.0) * M * K * N * tp_share(ex, m);
    }
    if (t->op == G_ATTENTION) {
        int B, T, H, KV, d;
        exec__attn_dims(ex, id, &B, &T, &H, &KV, &d);
        double f = 4.0 * B * H * (double)T * T * d * (t->causal ? 0.5 : 1.0) * tp_share(ex, id);
        return back ? 2.5 * f : f;
    }
    if (t->op == G_MOE && ex->moe[id]) {
        const ex_moe *mo = ex->moe[id];
        double f = (double)mo->g.N * mo->g.K * 2.0 * mo->g.D * mo->F * (t->act_gelu ? 2 : 3) * tp_share(ex, id);
        return back ? 2.0 * f : f;
    }
    return 0;
}

int exec__prof_begin_node(mesh__exec *ex, int id, int phase)
{
    ex_prof *f = &ex->prof;
    int e = node_entry(ex, id, phase);
    double fl = e >= 0 && (f->on || ex->counting) ? node_flops(ex, id, phase) : 0;
    /* the step's model FLOPs, profiled or not (a node another's kernel
     * computes counts there, as in the profile; recomputation is not the
     * model's) */
    if (phase != EX_PROF_RECOMPUTE && ex->counting) ex->flops += fl;
    if (!f->on) return 0;
    int rc = exec__prof_begin(ex, e);
    if (rc == 0 && f->depth == 1 && f->entry >= 0) f->flops[f->entry] += fl;
    return rc;
}

int mesh__exec_profile(mesh__exec *ex, int k, char *what, size_t n, double *ms, double *calls, double *gflop,
                       long long *steps, long long *untimed)
{
    ex_prof *f = &ex->prof;
    long long st = ex->steps - 1; /* (the first warms up) */
    if (!f->on || st < 1 || k < 0) return -1;
    if (f->start && f->timed < f->made) { /* the last pairs: once the GPU has run them */
        if (dev_stream_sync(ex->dev, (dev_stream *)ex->kern.stream) != MESH_OK) return -1;
        harvest(ex);
    }
    static const char *const phase[3] = {"forward", "backward", "recompute"};
    for (int e = 0; e < EX_PROF_ENTRIES; e++) {
        if (f->calls[e] == 0 || k-- > 0) continue;
        if (e == EX_PROF_OPTIMIZER) snprintf(what, n, "optimizer");
        else if (e == EX_PROF_COMM) snprintf(what, n, "collectives in turn");
        else snprintf(what, n, "%s %s", graph_op_name((g_op)(e / 3)), phase[e % 3]);
        *ms = f->ms[e] / (double)st;
        *calls = (double)f->calls[e] / (double)st;
        *gflop = f->flops[e] / 1e9 / (double)st;
        *steps = st;
        *untimed = f->untimed;
        return 0;
    }
    return -1;
}
