/* plan.c — the plan (see plan.h): made from a compiled model, freed, and
 * written as YAML with libyaml's emitter. plan_read.c reads it back.
 *
 * The writer's output is a pure function of the plan: keys in one fixed
 * order, integers in decimal, floats in the shortest "%.Ng" (N = 15..17)
 * that reads back to the same double, with a ".0" added where needed so
 * that YAML 1.1 readers see a float; strings that would read as another
 * type (true, 12, ~) double-quoted. Maps are block style, except one
 * program step per line; shapes, inputs, placements and units are flow
 * sequences.
 */
#include "plan.h"

#include "ranks.h" /* rank_progs */

#include <math.h>   /* isfinite */
#include <stdarg.h> /* va_list */
#include <stdlib.h> /* calloc, free, strtod */
#include <string.h> /* memset, strlen, strdup */

#include <yaml.h> /* yaml_emitter_*, yaml_*_event_initialize */

#include "mesh.h" /* mesh_version */

/* ---- Names ---------------------------------------------------------- */

const char *plan_phase_name(plan_phase ph) {
    static const char *const n[] = {"forward", "backward", "grad-sync", "after-optimizer"};
    return ph >= PLAN_FORWARD && ph <= PLAN_AFTER_OPTIMIZER ? n[ph] : "?";
}

const char *plan__attr_name(plan_attr a) {
    static const char *const n[PLAN_ATTR_COUNT] = {"heads", "kv_heads", "causal", "theta", "eps", "top_k",
                                                   "capacity", "act", "aux_loss", "vocab", "scale"};
    return a >= 0 && a < PLAN_ATTR_COUNT ? n[a] : "?";
}

#define BIT(a) (1u << (a))

unsigned plan__op_attrs(g_op op) {
    switch (op) {
    case G_ATTENTION: return BIT(PLAN_ATTR_HEADS) | BIT(PLAN_ATTR_KV_HEADS) | BIT(PLAN_ATTR_CAUSAL);
    case G_ROPE: return BIT(PLAN_ATTR_HEADS) | BIT(PLAN_ATTR_THETA);
    case G_LAYERNORM:
    case G_RMSNORM: return BIT(PLAN_ATTR_EPS);
    case G_MOE:
        return BIT(PLAN_ATTR_TOP_K) | BIT(PLAN_ATTR_CAPACITY) | BIT(PLAN_ATTR_ACT) | BIT(PLAN_ATTR_AUX_LOSS);
    case G_CROSS_ENTROPY: return BIT(PLAN_ATTR_VOCAB);
    case G_SCALE: return BIT(PLAN_ATTR_SCALE);
    default: return 0;
    }
}

const char *plan__dtype_name(plan_dtype d) {
    return d == PLAN_DTYPE_F32 ? "f32" : d == PLAN_DTYPE_I32 ? "i32" : "?";
}

const char *plan__unit_name(sched_op op) {
    static const char *const n[] = {"fwd", "bwd", "send_act", "recv_act", "send_grad", "recv_grad"};
    return op >= SCHED_FWD && op <= SCHED_RECV_GRAD ? n[op] : "?";
}

const char *plan__precision_name(int precision) {
    static const char *const n[] = {"fp32", "bf16", "fp16"};
    return precision >= 0 && precision <= 2 ? n[precision] : "?";
}

const char *plan__axis_name(int axis) {
    static const char *const n[SHARD_AXES] = {"dp", "tp", "pp", "ep"};
    return axis >= 0 && axis < SHARD_AXES ? n[axis] : "?";
}

/* ---- From a compiled model ------------------------------------------ */

void plan_free(plan *p) {
    if (!p) return;
    free(p->chunk_layers);
    free(p->data);
    free(p->val_data);
    free(p->checkpoint_dir);
    free(p->memory);
    free(p->traffic);
    free(p->meshc);
    free(p->source);
    for (int i = 0; i < p->n_tensors; i++) free(p->tensors[i].name);
    free(p->tensors);
    for (int i = 0; i < p->n_regions; i++) free(p->regions[i].label);
    free(p->regions);
    for (int i = 0; i < p->n_steps; i++) free(p->steps[i].why);
    free(p->steps);
    for (int i = 0; p->stages && i < p->pp; i++) free(p->stages[i].units);
    free(p->stages);
    memset(p, 0, sizeof *p);
}

static int from_fail(plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int from_fail(plan *p, const char *fmt, ...) {
    char msg[sizeof p->error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    plan_free(p);
    memcpy(p->error, msg, sizeof msg);
    return -1;
}

/* strdup that keeps NULL as NULL; *bad is set when memory runs out. */
static char *dup_or_null(const char *s, int *bad) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *bad = 1;
    return d;
}

static void copy_tensor(plan_tensor *t, const g_node *n, shard_pl pl, int *bad) {
    t->op = n->op;
    t->name = dup_or_null(n->name, bad);
    t->rank = n->rank;
    memcpy(t->dims, n->dims, sizeof t->dims);
    t->dtype = n->is_int ? PLAN_DTYPE_I32 : PLAN_DTYPE_F32;
    t->n_in = n->n_in;
    memcpy(t->in, n->in, sizeof t->in);
    t->region = n->region;
    t->pl = pl;
    /* only the attributes the file carries for this op, so that a plan read
     * back compares equal field by field */
    unsigned a = plan__op_attrs(n->op);
    if (a & BIT(PLAN_ATTR_HEADS)) t->heads = n->heads;
    if (a & BIT(PLAN_ATTR_KV_HEADS)) t->kv_heads = n->kv_heads;
    if (a & BIT(PLAN_ATTR_CAUSAL)) t->causal = n->causal;
    if (a & BIT(PLAN_ATTR_THETA)) t->theta = n->theta;
    if (a & BIT(PLAN_ATTR_EPS)) t->eps = n->eps;
    if (a & BIT(PLAN_ATTR_TOP_K)) t->top_k = n->top_k;
    if (a & BIT(PLAN_ATTR_CAPACITY)) t->capacity = n->capacity;
    if (a & BIT(PLAN_ATTR_ACT)) t->act_gelu = n->act_gelu;
    if (a & BIT(PLAN_ATTR_AUX_LOSS)) t->aux_loss = n->aux_loss;
    if (a & BIT(PLAN_ATTR_VOCAB)) t->vocab = n->vocab;
    if (a & BIT(PLAN_ATTR_SCALE)) t->scale = n->scale;
    if (n->op == G_PARAM) {
        t->init = n->init;
        t->init_std = n->init == GRAPH_INIT_NORMAL ? n->init_std : 0;
    }
}

static int copy_sched(plan *out, const sched *sc) {
    out->kind = sc->kind;
    out->pp = sc->pp;
    out->m = sc->m;
    out->v = sc->v;
    out->stages = calloc((size_t)sc->pp, sizeof *out->stages);
    if (!out->stages) return -1;
    for (int s = 0; s < sc->pp; s++) {
        const sched_stage *st = &sc->stages[s];
        if (st->n_units == 0) continue;
        out->stages[s].units = malloc((size_t)st->n_units * sizeof *st->units);
        if (!out->stages[s].units) return -1;
        memcpy(out->stages[s].units, st->units, (size_t)st->n_units * sizeof *st->units);
        out->stages[s].n_units = st->n_units;
    }
    return 0;
}

int plan_from(plan *out, const char *source, const fe_setup *s, const graph *g, const shard_prog *p,
              const sched *sc) {
    memset(out, 0, sizeof *out);
    if (!s || !g || !p || !p->pl || p->g != g) return from_fail(out, "plan_from: no compiled model given");
    if (s->pp > 1 && !sc) return from_fail(out, "plan_from: pp = %lld needs a pipeline schedule", s->pp);
    if (sc && (sc->pp != s->pp || sc->m != s->micro_batches || sc->v != s->virtual_stages ||
               (int)sc->kind != s->schedule))
        return from_fail(out, "plan_from: the schedule (%s, pp %d, m %d, v %d) does not match the settings "
                              "(%s, pp %lld, m %lld, v %d)", sched_kind_name(sc->kind), sc->pp, sc->m, sc->v,
                         sched_kind_name((sched_kind)s->schedule), s->pp, s->micro_batches, s->virtual_stages);
    int bad = 0;
    out->format = PLAN_FORMAT_VERSION;
    out->meshc = dup_or_null(mesh_version(), &bad);
    out->source = dup_or_null(source ? source : "", &bad);
    out->setup = *s;
    out->data = s->data ? dup_or_null(s->data, &bad) : NULL;
    out->val_data = s->val_data ? dup_or_null(s->val_data, &bad) : NULL;
    out->checkpoint_dir = s->checkpoint_dir ? dup_or_null(s->checkpoint_dir, &bad) : NULL;
    out->setup.data = out->data;
    out->setup.val_data = out->val_data;
    out->setup.checkpoint_dir = out->checkpoint_dir;
    out->setup.stage_layers = NULL; /* the split is pipeline.chunk_layers */
    out->setup.n_stage_layers = 0;
    out->loss = g->loss;
    out->tensors = calloc(g->n ? (size_t)g->n : 1, sizeof *out->tensors);
    out->regions = calloc(g->n_regions ? (size_t)g->n_regions : 1, sizeof *out->regions);
    out->steps = calloc(p->n_steps ? (size_t)p->n_steps : 1, sizeof *out->steps);
    if (bad || !out->tensors || !out->regions || !out->steps) return from_fail(out, "out of memory");
    for (int i = 0; i < g->n; i++, out->n_tensors++) copy_tensor(&out->tensors[i], &g->nodes[i], p->pl[i], &bad);
    int stack = -1;
    for (int i = 0; i < g->n_regions; i++, out->n_regions++) {
        const g_region *r = &g->regions[i];
        plan_region *o = &out->regions[i];
        o->first = r->first;
        o->end = r->end;
        o->count = r->count;
        o->parent = r->parent;
        o->is_stack = r->is_stack;
        o->label = dup_or_null(r->label ? r->label : "", &bad);
        o->n_carry = r->n_carry;
        memcpy(o->carry, r->carry, sizeof o->carry);
        if (r->is_stack && stack < 0) stack = i;
    }
    for (int i = 0; i < p->n_steps; i++, out->n_steps++) {
        const shard_step *st = &p->steps[i];
        plan_step *o = &out->steps[i];
        o->phase = (plan_phase)st->backward;
        o->recompute = st->recompute;
        o->bucket = st->bucket;
        o->kind = st->kind;
        o->node = st->node;
        o->region = st->region;
        o->axis = o->dim = -1;
        if (st->kind != STEP_COMPUTE) { /* compute steps carry no collective fields */
            o->axis = st->axis;
            o->dim = st->dim;
            o->elems = st->elems;
            o->why = dup_or_null(st->why ? st->why : "", &bad);
        }
    }
    if (bad) return from_fail(out, "out of memory");
    /* the layer count is the stack's, as plan_read derives it */
    out->setup.layers = stack >= 0 ? g->regions[stack].count : 0;
    sched one;
    memset(&one, 0, sizeof one);
    if (!sc) { /* pp == 1: one stage running the micro-batches in order */
        char err[200];
        if (sched_build(&one, (sched_kind)s->schedule, 1, (int)s->micro_batches, s->virtual_stages, err,
                        (int)sizeof err) < 0)
            return from_fail(out, "plan_from: %s", err);
    }
    const sched *use = sc ? sc : &one;
    int rc = copy_sched(out, use);
    sched_free(&one);
    if (rc < 0) return from_fail(out, "out of memory");
    int64_t chunks = (int64_t)out->pp * out->v, total = stack >= 0 ? g->regions[stack].count : 0;
    out->chunk_layers = calloc((size_t)(chunks > 0 ? chunks : 1), sizeof *out->chunk_layers);
    if (!out->chunk_layers) return from_fail(out, "out of memory");
    for (int64_t i = 0; i < chunks; i++)
        out->chunk_layers[i] = sc ? sched_chunk_layers(sc, (int)i, total) : total / chunks;
    /* the memory plan, laid out from the plan itself (the runtime does the same) */
    memplan mem;
    if (memplan_build(&mem, out, 0, 0) != 0) return from_fail(out, "out of memory");
    out->memory = calloc((size_t)out->pp, sizeof *out->memory);
    if (out->memory) memcpy(out->memory, mem.stage, (size_t)out->pp * sizeof *out->memory);
    memplan_free(&mem);
    if (!out->memory) return from_fail(out, "out of memory");
    return 0;
}

int plan_set_traffic(plan *p, const rank_progs *r) {
    free(p->traffic);
    p->traffic = calloc((size_t)p->pp, sizeof *p->traffic);
    if (!p->traffic) return -1;
    for (int s = 0; s < p->pp; s++) {
        int rank = (int)(s * (p->setup.world / p->pp)); /* the stage's first */
        plan_traffic *t = &p->traffic[s];
        for (int k = 0; rank < r->world && k < r->n_ops[rank]; k++) {
            const verify_op *op = &r->ops[rank][k];
            int kind = op->coll / SHARD_AXES, axis = op->coll % SHARD_AXES;
            if (op->kind == VERIFY_SEND) t->send += op->bytes;
            else if (op->kind == VERIFY_COLL && kind >= 0 && kind < STEP_SLICE) t->coll[kind][axis] += op->bytes;
        }
    }
    return 0;
}

/* ---- Writer --------------------------------------------------------- */

typedef struct wr {
    yaml_emitter_t em;
    int ok;
    char msg[200]; /* the first problem found here, before libyaml's */
} wr;

static void wr_fail(wr *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void wr_fail(wr *w, const char *fmt, ...) {
    if (w->ok) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->msg, sizeof w->msg, fmt, ap);
        va_end(ap);
    }
    w->ok = 0;
}

/* Emits an event made by one of the yaml_*_event_initialize calls. */
static void put(wr *w, yaml_event_t *ev, int made) {
    if (!made) {
        wr_fail(w, "out of memory");
        return;
    }
    if (!w->ok) {
        yaml_event_delete(ev);
        return;
    }
    if (!yaml_emitter_emit(&w->em, ev)) w->ok = 0; /* the emitter deletes the event either way */
}

static int utf8_ok(const unsigned char *s) {
    while (*s) {
        int n = *s < 0x80 ? 0 : (*s & 0xE0) == 0xC0 ? 1 : (*s & 0xF0) == 0xE0 ? 2 : (*s & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0 || (n == 1 && *s < 0xC2)) return 0;
        s++;
        for (int i = 0; i < n; i++, s++)
            if ((*s & 0xC0) != 0x80) return 0;
    }
    return 1;
}

static void scalar(wr *w, const char *s, yaml_scalar_style_t style) {
    yaml_event_t ev;
    put(w, &ev, yaml_scalar_event_initialize(&ev, NULL, NULL, (const yaml_char_t *)s, (int)strlen(s), 1, 1,
                                             style));
}

static int same_word(const char *a, const char *b) { /* ASCII, ignoring case */
    for (; *a && *b; a++, b++) {
        char x = *a >= 'A' && *a <= 'Z' ? (char)(*a - 'A' + 'a') : *a;
        if (x != *b) return 0;
    }
    return *a == *b;
}

/* A string that a YAML 1.1 reader could take for a number, bool or null if
 * it were written plain (true, y, ~, 12, 0.1.0, .inf, nan, -5). */
static int looks_typed(const char *s) {
    static const char *const words[] = {"~", "null", "true", "false", "yes", "no", "on", "off", "y", "n"};
    if (!*s || strchr("0123456789.-+", s[0])) return 1;
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (same_word(s, words[i])) return 1;
    char *end;
    strtod(s, &end);
    return *end == '\0';
}

static void str(wr *w, const char *s, const char *what) {
    if (!s) s = "";
    if (!utf8_ok((const unsigned char *)s)) {
        wr_fail(w, "%s is not valid UTF-8", what);
        return;
    }
    scalar(w, s, looks_typed(s) ? YAML_DOUBLE_QUOTED_SCALAR_STYLE : YAML_ANY_SCALAR_STYLE);
}

static void num(wr *w, long long v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", v);
    scalar(w, b, YAML_PLAIN_SCALAR_STYLE);
}

/* The shortest of %.15g, %.16g, %.17g that reads back equal, always with a
 * '.' so that YAML 1.1 readers take it for a float (1 -> 1.0, 1e-05 ->
 * 1.0e-05). */
static void flt(wr *w, double v, const char *what) {
    if (!isfinite(v)) {
        wr_fail(w, "%s is not a finite number", what);
        return;
    }
    char b[40], o[48];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v) break;
    }
    char *e = strchr(b, 'e');
    if (strchr(b, '.')) snprintf(o, sizeof o, "%s", b);
    else if (e) snprintf(o, sizeof o, "%.*s.0%s", (int)(e - b), b, e);
    else snprintf(o, sizeof o, "%s.0", b);
    scalar(w, o, YAML_PLAIN_SCALAR_STYLE);
}

static void boolean(wr *w, int v) { scalar(w, v ? "true" : "false", YAML_PLAIN_SCALAR_STYLE); }

static void key(wr *w, const char *k) { scalar(w, k, YAML_PLAIN_SCALAR_STYLE); }

static void map_begin(wr *w, int flow) {
    yaml_event_t ev;
    put(w, &ev, yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
                                                    flow ? YAML_FLOW_MAPPING_STYLE : YAML_BLOCK_MAPPING_STYLE));
}

static void map_end(wr *w) {
    yaml_event_t ev;
    put(w, &ev, yaml_mapping_end_event_initialize(&ev));
}

static void seq_begin(wr *w, int flow) {
    yaml_event_t ev;
    put(w, &ev, yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                     flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE));
}

static void seq_end(wr *w) {
    yaml_event_t ev;
    put(w, &ev, yaml_sequence_end_event_initialize(&ev));
}

static void kv_num(wr *w, const char *k, long long v) {
    key(w, k);
    num(w, v);
}

static void kv_name(wr *w, const char *k, const char *v) { /* a name from a fixed table: plain */
    key(w, k);
    scalar(w, v, YAML_PLAIN_SCALAR_STYLE);
}

static void kv_bool(wr *w, const char *k, int v) {
    key(w, k);
    boolean(w, v);
}

static void write_settings(wr *w, const plan *p) {
    const fe_setup *s = &p->setup;
    key(w, "mesh");
    map_begin(w, 0);
    kv_num(w, "dp", s->dp);
    kv_num(w, "tp", s->tp);
    kv_num(w, "pp", s->pp);
    kv_num(w, "ep", s->ep);
    kv_num(w, "world", s->world);
    map_end(w);
    key(w, "train");
    map_begin(w, 0);
    kv_num(w, "global_batch", s->global_batch);
    kv_num(w, "micro_batch", s->micro_batch);
    kv_num(w, "seq_len", s->seq_len);
    kv_num(w, "steps", s->steps);
    kv_num(w, "micro_batches", s->micro_batches);
    kv_name(w, "schedule", sched_kind_name((sched_kind)s->schedule));
    kv_num(w, "virtual_stages", s->virtual_stages);
    kv_num(w, "zero", s->zero);
    kv_num(w, "bucket_size", s->bucket_size);
    kv_name(w, "precision", plan__precision_name(s->precision));
    if (s->precision == 2 && s->loss_scale > 0) {
        key(w, "loss_scale");
        flt(w, s->loss_scale, "train.loss_scale");
    } else if (s->precision == 2) {
        kv_name(w, "loss_scale", "dynamic");
    }
    kv_bool(w, "recompute", s->recompute);
    kv_bool(w, "sequence_parallel", s->sequence_parallel);
    static const char *const schedules[] = {"constant", "cosine", "linear"};
    key(w, "optimizer");
    map_begin(w, 1);
    kv_name(w, "kind", "adamw");
    key(w, "lr");
    flt(w, s->lr, "train.optimizer.lr");
    key(w, "beta1");
    flt(w, s->beta1, "train.optimizer.beta1");
    key(w, "beta2");
    flt(w, s->beta2, "train.optimizer.beta2");
    key(w, "eps");
    flt(w, s->eps, "train.optimizer.eps");
    key(w, "weight_decay");
    flt(w, s->weight_decay, "train.optimizer.weight_decay");
    key(w, "clip");
    flt(w, s->clip, "train.optimizer.clip");
    map_end(w);
    key(w, "lr_schedule");
    map_begin(w, 1);
    kv_name(w, "kind", schedules[s->lr_schedule >= 0 && s->lr_schedule < 3 ? s->lr_schedule : 0]);
    kv_num(w, "warmup", s->warmup);
    key(w, "min_lr");
    flt(w, s->min_lr, "train.lr_schedule.min_lr");
    map_end(w);
    kv_num(w, "seed", s->seed);
    kv_num(w, "log_every", s->log_every);
    kv_num(w, "eval_every", s->eval_every);
    kv_num(w, "checkpoint_every", s->checkpoint_every);
    key(w, "data");
    str(w, s->data ? s->data : "", "train.data");
    key(w, "val_data");
    str(w, s->val_data ? s->val_data : "", "train.val_data");
    key(w, "checkpoint_dir");
    str(w, s->checkpoint_dir ? s->checkpoint_dir : "", "train.checkpoint_dir");
    map_end(w);
}

static void write_attrs(wr *w, const plan_tensor *t, const char *what) {
    unsigned a = plan__op_attrs(t->op);
    if (!a) return;
    key(w, "attrs");
    map_begin(w, 0);
    for (int k = 0; k < PLAN_ATTR_COUNT; k++) {
        if (!(a & BIT(k))) continue;
        key(w, plan__attr_name((plan_attr)k));
        switch ((plan_attr)k) {
        case PLAN_ATTR_HEADS: num(w, t->heads); break;
        case PLAN_ATTR_KV_HEADS: num(w, t->kv_heads); break;
        case PLAN_ATTR_CAUSAL: boolean(w, t->causal); break;
        case PLAN_ATTR_THETA: flt(w, t->theta, what); break;
        case PLAN_ATTR_EPS: flt(w, t->eps, what); break;
        case PLAN_ATTR_TOP_K: num(w, t->top_k); break;
        case PLAN_ATTR_CAPACITY: flt(w, t->capacity, what); break;
        case PLAN_ATTR_ACT: scalar(w, t->act_gelu ? "gelu" : "swiglu", YAML_PLAIN_SCALAR_STYLE); break;
        case PLAN_ATTR_AUX_LOSS: flt(w, t->aux_loss, what); break;
        case PLAN_ATTR_VOCAB: num(w, t->vocab); break;
        case PLAN_ATTR_SCALE: flt(w, t->scale, what); break;
        case PLAN_ATTR_COUNT: break;
        }
    }
    map_end(w);
}

/* R, P or S<dim> */
static void placement(wr *w, shard_pl pl) {
    seq_begin(w, 1);
    for (int a = 0; a < SHARD_AXES; a++) {
        char b[16];
        if (pl.kind[a] == PL_SPLIT) snprintf(b, sizeof b, "S%d", pl.dim[a]);
        else snprintf(b, sizeof b, "%s", pl.kind[a] == PL_PARTIAL ? "P" : pl.kind[a] == PL_REP ? "R" : "?");
        scalar(w, b, YAML_PLAIN_SCALAR_STYLE);
    }
    seq_end(w);
}

static void write_tensor(wr *w, const plan *p, int id) {
    const plan_tensor *t = &p->tensors[id];
    char what[64];
    snprintf(what, sizeof what, "tensor %d", id);
    map_begin(w, 0);
    kv_num(w, "id", id);
    kv_name(w, "op", graph_op_name(t->op));
    if (t->name) {
        key(w, "name");
        str(w, t->name, what);
    }
    key(w, "shape");
    seq_begin(w, 1);
    for (int d = 0; d < t->rank && d < GRAPH_MAX_RANK; d++) num(w, t->dims[d]);
    seq_end(w);
    kv_name(w, "dtype", plan__dtype_name(t->dtype));
    key(w, "in");
    seq_begin(w, 1);
    for (int k = 0; k < t->n_in && k < GRAPH_MAX_IN; k++) num(w, t->in[k]);
    seq_end(w);
    write_attrs(w, t, what);
    if (t->op == G_PARAM) {
        static const char *const inits[] = {"normal", "zeros", "ones"};
        kv_name(w, "init", inits[t->init >= 0 && t->init < 3 ? t->init : 0]);
        if (t->init == GRAPH_INIT_NORMAL) {
            key(w, "std");
            flt(w, t->init_std, what);
        }
    }
    kv_num(w, "region", t->region);
    key(w, "placement");
    placement(w, t->pl);
    map_end(w);
}

static void write_region(wr *w, const plan *p, int id) {
    const plan_region *r = &p->regions[id];
    char what[64];
    snprintf(what, sizeof what, "the label of region %d", id);
    map_begin(w, 0);
    kv_num(w, "id", id);
    kv_num(w, "first", r->first);
    kv_num(w, "end", r->end);
    kv_num(w, "count", r->count);
    kv_num(w, "parent", r->parent);
    kv_bool(w, "is_stack", r->is_stack);
    key(w, "label");
    str(w, r->label, what);
    key(w, "carries");
    seq_begin(w, 1);
    for (int k = 0; k < r->n_carry && k < GRAPH_MAX_CARRY; k++) {
        seq_begin(w, 1);
        num(w, r->carry[k].entry);
        num(w, r->carry[k].exit);
        seq_end(w);
    }
    seq_end(w);
    map_end(w);
}

static void write_step(wr *w, const plan_step *s, int i) {
    map_begin(w, 1);
    kv_name(w, "phase", plan_phase_name(s->phase));
    kv_name(w, "kind", shard_step_name(s->kind));
    kv_num(w, "node", s->node);
    if (s->kind != STEP_COMPUTE) {
        kv_name(w, "axis", plan__axis_name(s->axis));
        kv_num(w, "dim", s->dim);
        kv_num(w, "elems", s->elems);
    }
    kv_num(w, "region", s->region);
    if (s->recompute) kv_name(w, "recompute", "true");
    if (s->bucket) kv_num(w, "bucket", s->bucket);
    if (s->kind != STEP_COMPUTE) {
        char what[64];
        snprintf(what, sizeof what, "the reason of step %d", i);
        key(w, "why");
        str(w, s->why, what);
    }
    map_end(w);
}

/* The memory plan's sizes per stage, in bytes per rank. */
static void write_memory(wr *w, const plan *p) {
    key(w, "memory");
    seq_begin(w, 0);
    for (int s = 0; p->memory && s < p->pp; s++) {
        const mem_stage *m = &p->memory[s];
        map_begin(w, 1);
        kv_num(w, "stage", s);
        kv_num(w, "params", m->params);
        kv_num(w, "grads", m->grads);
        kv_num(w, "optim", m->optim);
        kv_num(w, "slot_bytes", m->slot_bytes);
        kv_num(w, "slots", m->slots);
        kv_num(w, "layer_stride", m->layer_stride);
        kv_num(w, "workspace", m->workspace);
        kv_num(w, "comm", m->comm);
        kv_num(w, "total", m->total);
        const plan_traffic *t = p->traffic ? &p->traffic[s] : NULL;
        int any = t && t->send;
        for (int k = STEP_ALL_REDUCE; t && k < STEP_SLICE; k++)
            for (int a = 0; a < SHARD_AXES; a++) any |= t->coll[k][a] != 0;
        if (any) { /* bytes sent per step */
            key(w, "sent");
            map_begin(w, 1);
            for (int k = STEP_ALL_REDUCE; k < STEP_SLICE; k++)
                for (int a = 0; a < SHARD_AXES; a++)
                    if (t->coll[k][a]) {
                        char name[48];
                        snprintf(name, sizeof name, "%s(%s)", shard_step_name((shard_step_kind)k), plan__axis_name(a));
                        kv_num(w, name, t->coll[k][a]);
                    }
            if (t->send) kv_num(w, "send", t->send);
            map_end(w);
        }
        map_end(w);
    }
    seq_end(w);
}

static void write_pipeline(wr *w, const plan *p) {
    key(w, "pipeline");
    map_begin(w, 0);
    kv_name(w, "kind", sched_kind_name(p->kind));
    kv_num(w, "pp", p->pp);
    kv_num(w, "m", p->m);
    kv_num(w, "v", p->v);
    key(w, "chunk_layers");
    seq_begin(w, 1);
    for (int64_t i = 0; p->chunk_layers && i < (int64_t)p->pp * p->v; i++) num(w, p->chunk_layers[i]);
    seq_end(w);
    key(w, "stages");
    seq_begin(w, 0);
    for (int s = 0; p->stages && s < p->pp; s++) {
        map_begin(w, 0);
        kv_num(w, "stage", s);
        key(w, "units");
        seq_begin(w, 0);
        for (int u = 0; u < p->stages[s].n_units; u++) {
            const sched_unit *un = &p->stages[s].units[u];
            seq_begin(w, 1);
            scalar(w, plan__unit_name(un->op), YAML_PLAIN_SCALAR_STYLE);
            num(w, un->micro);
            num(w, un->chunk);
            num(w, un->peer);
            seq_end(w);
        }
        seq_end(w);
        map_end(w);
    }
    seq_end(w);
    map_end(w);
}

static void write_plan(wr *w, const plan *p) {
    yaml_event_t ev;
    put(w, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
    put(w, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
    map_begin(w, 0);
    kv_name(w, "magic", PLAN_MAGIC);
    kv_num(w, "format", p->format);
    key(w, "meshc");
    str(w, p->meshc, "the meshc version");
    key(w, "source");
    str(w, p->source, "the source file name");
    write_settings(w, p);
    kv_num(w, "loss", p->loss);
    key(w, "tensors");
    seq_begin(w, 0);
    for (int i = 0; i < p->n_tensors; i++) write_tensor(w, p, i);
    seq_end(w);
    key(w, "regions");
    seq_begin(w, 0);
    for (int i = 0; i < p->n_regions; i++) write_region(w, p, i);
    seq_end(w);
    key(w, "program");
    seq_begin(w, 0);
    for (int i = 0; i < p->n_steps; i++) write_step(w, &p->steps[i], i);
    seq_end(w);
    write_pipeline(w, p);
    write_memory(w, p);
    kv_name(w, "end", PLAN_MAGIC); /* last: a file cut short lacks it */
    map_end(w);
    put(w, &ev, yaml_document_end_event_initialize(&ev, 1));
    put(w, &ev, yaml_stream_end_event_initialize(&ev));
}

int plan_write(const plan *p, FILE *out, char *err, size_t n) {
    wr w;
    memset(&w, 0, sizeof w);
    if (!yaml_emitter_initialize(&w.em)) {
        if (err && n) snprintf(err, n, "out of memory");
        return -1;
    }
    w.ok = 1;
    yaml_emitter_set_output_file(&w.em, out);
    yaml_emitter_set_width(&w.em, -1); /* never fold long lines */
    yaml_emitter_set_unicode(&w.em, 1);
    yaml_emitter_set_indent(&w.em, 2);
    fprintf(out, "# mesh plan, format %d: written by meshc, loaded by meshrun (docs/plan.md, \"The plan file\")\n",
            PLAN_FORMAT_VERSION);
    write_plan(&w, p);
    if (w.ok && !yaml_emitter_flush(&w.em)) w.ok = 0;
    int rc = 0;
    if (!w.ok) {
        if (err && n) snprintf(err, n, "cannot write the plan: %s", w.msg[0] ? w.msg
                                      : w.em.problem ? w.em.problem : "libyaml emitter error");
        rc = -1;
    }
    yaml_emitter_delete(&w.em);
    if (rc == 0 && (fflush(out) != 0 || ferror(out))) {
        if (err && n) snprintf(err, n, "cannot write the plan: output error");
        rc = -1;
    }
    return rc;
}
