/* sched.c — pipeline schedules (see sched.h): GPipe, 1F1B and Megatron's
 * interleaved 1F1B, their sends/receives, a cost simulation and a dump.
 *
 * Each stage's order is built in two passes: first the compute order (the
 * forward and backward units, which is what the published schedules
 * specify), then each unit is wrapped in its communication: a receive right
 * before the unit that consumes the data, a send right after the unit that
 * produces it. Sends are buffered, so only receives can wait, and a receive
 * waits exactly as long as the data dependency requires.
 */
#include "sched.h"

#include <limits.h> /* INT_MAX */
#include <stdarg.h> /* va_list */
#include <stdlib.h> /* malloc, calloc, free */
#include <string.h> /* memset */

typedef struct step {
    sched_op op; /* SCHED_FWD or SCHED_BWD */
    int micro, chunk;
} step;

static void sched_err(char *err, int n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void sched_err(char *err, int n, const char *fmt, ...) {
    if (!err || n <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)n, fmt, ap);
    va_end(ap);
}

static const char *kind_name(sched_kind k) {
    switch (k) {
    case SCHED_KIND_GPIPE: return "gpipe";
    case SCHED_KIND_1F1B: return "1f1b";
    case SCHED_KIND_INTERLEAVED: return "interleaved";
    }
    return "?";
}

/* GPipe (PyTorch's ScheduleGPipe order): every forward, then every
 * backward, both in micro-batch order. */
static int order_gpipe(step *o, int stage, int m) {
    int n = 0;
    for (int i = 0; i < m; i++) o[n++] = (step){SCHED_FWD, i, stage};
    for (int i = 0; i < m; i++) o[n++] = (step){SCHED_BWD, i, stage};
    return n;
}

/* 1F1B (PipeDream-flush; Narayanan et al. 2021 fig. 4 top; Megatron's
 * forward_backward_pipelining_without_interleaving): pp-stage-1 warm-up
 * forwards, then alternate one forward and one backward, then the
 * cool-down backwards. */
static int order_1f1b(step *o, int stage, int pp, int m) {
    int warm = pp - stage - 1 < m ? pp - stage - 1 : m, n = 0;
    for (int i = 0; i < warm; i++) o[n++] = (step){SCHED_FWD, i, stage};
    for (int i = 0; i < m - warm; i++) {
        o[n++] = (step){SCHED_FWD, warm + i, stage};
        o[n++] = (step){SCHED_BWD, i, stage};
    }
    for (int i = m - warm; i < m; i++) o[n++] = (step){SCHED_BWD, i, stage};
    return n;
}

/* The k-th forward (or backward) of the interleaved schedule on `stage`:
 * virtual micro-batches go in groups of pp micro-batches per local chunk,
 * chunks ascending for forwards and descending for backwards (Megatron's
 * get_schedule_table with microbatch_group_size_per_vp_stage = pp). */
static step interleaved_step(int k, int fwd, int stage, int pp, int v) {
    int group = k / (pp * v), in_group = k % (pp * v);
    int local = in_group / pp;
    if (!fwd) local = v - 1 - local;
    int micro = group * pp + in_group % pp;
    return (step){fwd ? SCHED_FWD : SCHED_BWD, micro, local * pp + stage};
}

/* Interleaved 1F1B (Narayanan et al. 2021 §2.2.2, fig. 4 bottom;
 * Megatron-core forward_backward_pipelining_with_interleaving):
 * (pp-stage-1)*2 + (v-1)*pp warm-up forwards (at most m*v), then one
 * forward and one backward at a time, then the cool-down backwards. */
static int order_interleaved(step *o, int stage, int pp, int m, int v) {
    int total = m * v, n = 0;
    long long w = (long long)(pp - stage - 1) * 2 + (long long)(v - 1) * pp;
    int warm = w < total ? (int)w : total;
    for (int k = 0; k < warm; k++) o[n++] = interleaved_step(k, 1, stage, pp, v);
    for (int k = 0; k < total - warm; k++) {
        o[n++] = interleaved_step(warm + k, 1, stage, pp, v);
        o[n++] = interleaved_step(k, 0, stage, pp, v);
    }
    for (int k = total - warm; k < total; k++) o[n++] = interleaved_step(k, 0, stage, pp, v);
    return n;
}

/* Wraps each compute step in its receive and send; transfers between two
 * chunks on the same stage (pp = 1) stay local and need none. Returns the
 * unit count. */
static int expand(sched_unit *u, const step *o, int n_steps, int stage, int pp, int n_chunks) {
    int n = 0;
    for (int i = 0; i < n_steps; i++) {
        int c = o[i].chunk, mb = o[i].micro;
        int prev = c > 0 && (c - 1) % pp != stage ? (c - 1) % pp : -1;
        int next = c < n_chunks - 1 && (c + 1) % pp != stage ? (c + 1) % pp : -1;
        if (o[i].op == SCHED_FWD) {
            if (prev >= 0) u[n++] = (sched_unit){SCHED_RECV_ACT, mb, c, prev};
            u[n++] = (sched_unit){SCHED_FWD, mb, c, -1};
            if (next >= 0) u[n++] = (sched_unit){SCHED_SEND_ACT, mb, c, next};
        } else {
            if (next >= 0) u[n++] = (sched_unit){SCHED_RECV_GRAD, mb, c, next};
            u[n++] = (sched_unit){SCHED_BWD, mb, c, -1};
            if (prev >= 0) u[n++] = (sched_unit){SCHED_SEND_GRAD, mb, c, prev};
        }
    }
    return n;
}

static int check_params(sched_kind kind, int pp, int m, int v, char *err, int n) {
    if (kind != SCHED_KIND_GPIPE && kind != SCHED_KIND_1F1B && kind != SCHED_KIND_INTERLEAVED) {
        sched_err(err, n, "unknown schedule kind %d", (int)kind);
        return -1;
    }
    if (pp < 1 || m < 1 || v < 1) {
        sched_err(err, n, "%s schedule needs pp, m and v >= 1 (got pp=%d, m=%d, v=%d)",
                  kind_name(kind), pp, m, v);
        return -1;
    }
    /* Each stage has at most 6*m*v units; chunk ids go up to pp*v. */
    if ((long long)m * v > INT_MAX / 8 || (long long)pp * v > INT_MAX / 8 ||
        (long long)m * pp * v > INT_MAX / 4) {
        sched_err(err, n, "%s schedule too large (pp=%d, m=%d, v=%d)", kind_name(kind), pp, m, v);
        return -1;
    }
    if (v > 1 && kind != SCHED_KIND_INTERLEAVED) {
        sched_err(err, n, "%s schedule has one chunk per stage (v=%d needs the interleaved schedule)",
                  kind_name(kind), v);
        return -1;
    }
    if (kind != SCHED_KIND_GPIPE && m < pp) {
        sched_err(err, n, "%s schedule needs at least pp=%d micro-batches (m=%d)", kind_name(kind), pp, m);
        return -1;
    }
    if (kind == SCHED_KIND_INTERLEAVED && m % pp != 0) {
        sched_err(err, n, "interleaved schedule needs m=%d to be a multiple of pp=%d", m, pp);
        return -1;
    }
    return 0;
}

int sched_build(sched *out, sched_kind kind, int pp, int m, int v, char *err, int n) {
    if (!out) {
        sched_err(err, n, "no schedule to build into");
        return -1;
    }
    memset(out, 0, sizeof *out);
    if (check_params(kind, pp, m, v, err, n) != 0) return -1;
    int n_steps = 2 * m * v, n_chunks = pp * v;
    step *o = malloc((size_t)n_steps * sizeof *o);
    out->stages = calloc((size_t)pp, sizeof *out->stages);
    if (!o || !out->stages) goto oom;
    out->kind = kind;
    out->pp = pp;
    out->m = m;
    out->v = v;
    for (int s = 0; s < pp; s++) {
        int k = kind == SCHED_KIND_GPIPE ? order_gpipe(o, s, m)
                : kind == SCHED_KIND_1F1B ? order_1f1b(o, s, pp, m)
                                          : order_interleaved(o, s, pp, m, v);
        sched_unit *u = malloc((size_t)(3 * k) * sizeof *u);
        if (!u) goto oom;
        out->stages[s].units = u;
        out->stages[s].n_units = expand(u, o, k, s, pp, n_chunks);
    }
    free(o);
    return 0;
oom:
    free(o);
    sched_free(out);
    sched_err(err, n, "out of memory building the %s schedule (pp=%d, m=%d, v=%d)", kind_name(kind),
              pp, m, v);
    return -1;
}

long long sched_chunk_layers(const sched *s, int chunk, long long total) {
    int chunks = s->pp * s->v;
    if (s->chunk_layers) return s->chunk_layers[chunk];
    return chunks > 0 ? total / chunks : 0;
}

void sched_free(sched *s) {
    if (!s) return;
    free(s->chunk_layers);
    if (s->stages)
        for (int i = 0; i < s->pp; i++) free(s->stages[i].units);
    free(s->stages);
    memset(s, 0, sizeof *s);
}

/* Index of the data slot a send fills or a receive reads: activations into
 * chunk c and gradients into chunk c (the chunk that consumes them), per
 * micro-batch; -1 when the unit names no valid transfer. */
static long long slot_of(const sched *s, const sched_unit *u) {
    int n_chunks = s->pp * s->v, c;
    switch (u->op) {
    case SCHED_SEND_ACT: c = u->chunk + 1; break;
    case SCHED_RECV_ACT: c = u->chunk; break;
    case SCHED_SEND_GRAD: c = u->chunk - 1; break;
    case SCHED_RECV_GRAD: c = u->chunk; break;
    default: return -1;
    }
    if (u->micro < 0 || u->micro >= s->m || c < 0 || c >= n_chunks) return -1;
    long long slot = (long long)u->micro * n_chunks + c;
    return u->op == SCHED_SEND_ACT || u->op == SCHED_RECV_ACT ? slot : slot + (long long)s->m * n_chunks;
}

/* Runs every stage as far as it can, sweeping until all are done or none
 * moves. ready[slot] is the time the slot's send was issued, or -1. */
static double simulate(const sched *s, double tf, double tb, double *const *start, double *const *end,
                       double *busy_max) {
    long long n_slots = 2LL * s->m * s->pp * s->v;
    double *ready = malloc((size_t)n_slots * sizeof *ready);
    int *pc = calloc((size_t)s->pp, sizeof *pc);
    double *t = calloc((size_t)s->pp, sizeof *t), *busy = calloc((size_t)s->pp, sizeof *busy);
    double makespan = -1;
    if (!ready || !pc || !t || !busy) goto done;
    for (long long i = 0; i < n_slots; i++) ready[i] = -1;
    for (int moved = 1, left = 1; left && moved;) {
        moved = left = 0;
        for (int st = 0; st < s->pp; st++) {
            const sched_stage *g = &s->stages[st];
            for (; pc[st] < g->n_units; pc[st]++) {
                const sched_unit *u = &g->units[pc[st]];
                double t0 = t[st];
                long long slot = slot_of(s, u);
                if (u->op == SCHED_FWD || u->op == SCHED_BWD) {
                    double c = u->op == SCHED_FWD ? tf : tb;
                    t[st] += c;
                    busy[st] += c;
                } else if (slot < 0) {
                    goto done; /* a malformed transfer can never complete */
                } else if (u->op == SCHED_SEND_ACT || u->op == SCHED_SEND_GRAD) {
                    ready[slot] = t[st];
                } else if (ready[slot] < 0) {
                    break; /* the receive waits */
                } else if (ready[slot] > t[st]) {
                    t[st] = ready[slot];
                }
                if (start) start[st][pc[st]] = t0;
                if (end) end[st][pc[st]] = t[st];
                moved = 1;
            }
            if (pc[st] < g->n_units) left = 1;
        }
        if (!left) {
            makespan = 0;
            *busy_max = 0;
            for (int st = 0; st < s->pp; st++) {
                if (t[st] > makespan) makespan = t[st];
                if (busy[st] > *busy_max) *busy_max = busy[st];
            }
        }
    }
done:
    free(ready);
    free(pc);
    free(t);
    free(busy);
    return makespan;
}

double sched_simulate_units(const sched *s, double tf, double tb, double *const *start, double *const *end,
                            double *bubble) {
    double busy = 0, makespan = s && s->stages ? simulate(s, tf, tb, start, end, &busy) : -1;
    if (bubble) *bubble = makespan > 0 ? (makespan - busy) / makespan : makespan < 0 ? -1 : 0;
    return makespan;
}

double sched_simulate(const sched *s, double tf, double tb, double *bubble) {
    return sched_simulate_units(s, tf, tb, NULL, NULL, bubble);
}

int sched_units_peak_inflight(const sched_unit *units, int n) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (units[i].op == SCHED_FWD && ++live > peak) peak = live;
        if (units[i].op == SCHED_BWD) live--;
    }
    return peak;
}

int sched_peak_inflight(const sched *s, int stage) {
    if (!s || !s->stages || stage < 0 || stage >= s->pp) return -1;
    return sched_units_peak_inflight(s->stages[stage].units, s->stages[stage].n_units);
}

void sched_unit_str(const sched_unit *u, char *buf, size_t n) {
    static const char *const prefix[] = {"F", "B", ">a", "<a", ">g", "<g"};
    int op = (int)u->op;
    const char *p = op >= 0 && op < 6 ? prefix[op] : "?";
    if (u->op == SCHED_FWD || u->op == SCHED_BWD)
        snprintf(buf, n, "%s%d.%d", p, u->micro, u->chunk);
    else
        snprintf(buf, n, "%s%d.%d@%d", p, u->micro, u->chunk, u->peer);
}

void sched_dump(const sched *s, FILE *out) {
    char buf[64];
    if (!s || !s->stages) return;
    for (int st = 0; st < s->pp; st++) {
        fprintf(out, "stage %d:", st);
        for (int i = 0; i < s->stages[st].n_units; i++) {
            sched_unit_str(&s->stages[st].units[i], buf, sizeof buf);
            fprintf(out, " %s", buf);
        }
        fputc('\n', out);
    }
}

const char *sched_kind_name(sched_kind kind) {
    return kind_name(kind);
}
