/* check_sections.c — the mesh and train sections, and the checks that need
 * the model, the mesh and the training recipe together. */
#include <string.h> /* strcmp */

#include "check.h"
#include "frontend.h"
#include "suggest.h"

/* The options of a section, in order, with --set overrides applied and
 * --set keys the file lacks appended. Reports unknown and duplicate keys. */
typedef struct opt_entry {
    const char *key;
    const ast_node *value;
    loc key_loc, where;
    int index;             /* into the section's option table */
} opt_entry;

/* Whether a --set after sets[i] names the same section and key. */
static int later_set(const checker *c, int i) {
    const set_item *it = &c->sets[i];
    for (int j = i + 1; j < c->n_sets; j++)
        if (c->sets[j].section && strcmp(c->sets[j].section, it->section) == 0 &&
            strcmp(c->sets[j].key, it->key) == 0)
            return 1;
    return 0;
}

/* `guessed[k]` is set when an unknown key was probably a misspelling of
 * key k, so that "missing k" is not reported on top of it. */
static int section_options(checker *c, const ast_node *sec, const char *secname, const char *const *keys,
                           int n_keys, opt_entry *out, int max, int *guessed) {
    int n = 0;
    const ast_node *first[64] = {0};
    for (const ast_node *o = sec->list.first; o; o = o->next) {
        int k = -1;
        for (int i = 0; i < n_keys; i++)
            if (strcmp(keys[i], o->name) == 0) k = i;
        if (k < 0) {
            char what[32];
            snprintf(what, sizeof what, "%s option", secname);
            if (strcmp(secname, "mesh") == 0) snprintf(what, sizeof what, "mesh axis");
            const char *best = check_unknown_name(c, o->name_loc, what, o->name, NULL, keys, n_keys);
            for (int i = 0; best && i < n_keys; i++)
                if (strcmp(keys[i], best) == 0) guessed[i] = 1;
            continue;
        }
        if (first[k]) {
            check_error(c, o->name_loc, "'%s' is set twice in the %s section", o->name, secname);
            check_note(c, first[k]->name_loc, "first set here");
            continue;
        }
        first[k] = o;
        if (n == max) break;
        const set_item *ov = check_find_set(c, secname, o->name);
        out[n++] = (opt_entry){o->name, ov ? ov->value : o->a, o->name_loc, ov ? ov->where : o->loc, k};
    }
    for (int i = 0; i < c->n_sets && n < max; i++) {
        set_item *it = &c->sets[i];
        if (!it->section || strcmp(it->section, secname) != 0 || it->used) continue;
        int k = -1;
        for (int j = 0; j < n_keys; j++)
            if (strcmp(keys[j], it->key) == 0) k = j;
        it->used = 1;
        if (later_set(c, i)) continue; /* a later --set of the same key wins */
        if (k < 0) {
            char what[32];
            snprintf(what, sizeof what, "%s", strcmp(secname, "mesh") == 0 ? "mesh axis" : "train option");
            check_unknown_name(c, it->where, what, it->key, NULL, keys, n_keys);
            continue;
        }
        if (first[k]) continue; /* the file sets it (and the last --set was taken above) */
        first[k] = it->value;
        out[n++] = (opt_entry){it->key, it->value, it->where, it->where, k};
    }
    return n;
}

/* ---- mesh ---- */

static const char *const mesh_keys[] = {"dp", "tp", "pp", "ep", "dp_replicate", "dp_shard"};

void check_mesh(checker *c) {
    for (int i = 0; i < AX_COUNT; i++) c->axis[i] = 1;
    opt_entry opts[16];
    int guessed[6] = {0};
    int n = section_options(c, c->mesh_node, "mesh", mesh_keys, 6, opts, 16, guessed);
    scope *ms = scope_new(c, c->globals);
    int64_t vals[6] = {1, 1, 1, 1, 0, 0};
    loc at[6];
    int given[6] = {0};
    for (int i = 0; i < n; i++) {
        value v = eval(c, ms, opts[i].value, EVAL_CONST);
        int64_t x;
        if (!value_as_int(c, &v, arena_printf(c->arena, "mesh axis '%s'", opts[i].key), &x)) continue;
        if (x < 1) {
            check_error(c, v.where, "mesh axis '%s' must be at least 1, not %lld", opts[i].key, (long long)x);
            continue;
        }
        vals[opts[i].index] = x;
        at[opts[i].index] = opts[i].where;
        given[opts[i].index] = 1;
        binding *b = scope_add(c, ms, opts[i].key, B_CONST, opts[i].key_loc);
        b->v = v;
    }
    if (given[4] || given[5]) {
        int64_t r = given[4] ? vals[4] : 1, s = given[5] ? vals[5] : 1, prod;
        if (__builtin_mul_overflow(r, s, &prod)) prod = -1;
        if (given[0] && vals[0] != prod) {
            check_error(c, at[0], "dp = %lld, but dp_replicate x dp_shard = %lld x %lld = %lld", (long long)vals[0],
                        (long long)r, (long long)s, (long long)prod);
        }
        vals[0] = prod > 0 ? prod : 1;
        c->dp_replicate = r;
        c->dp_shard = s;
    }
    for (int i = 0; i < AX_COUNT; i++) c->axis[i] = vals[i];
    c->world = 1;
    for (int i = 0; i < AX_COUNT; i++)
        if (__builtin_mul_overflow(c->world, c->axis[i], &c->world)) {
            check_error(c, c->mesh_node->loc, "the world size (dp x tp x pp x ep) overflows 64 bits");
            c->world = 1;
            break;
        }
}

/* ---- train ---- */

enum {
    T_GLOBAL_BATCH, T_MICRO_BATCH, T_SEQ_LEN, T_STEPS, T_SCHEDULE, T_VIRTUAL_STAGES, T_ZERO,
    T_PRECISION, T_LOSS_SCALE, T_RECOMPUTE, T_SEQUENCE_PARALLEL, T_OPTIMIZER, T_LR_SCHEDULE,
    T_SEED, T_DATA, T_VAL_DATA, T_EVAL_EVERY, T_LOG_EVERY, T_CHECKPOINT_DIR, T_CHECKPOINT_EVERY,
    T_MEMORY_LIMIT, T_STAGE_LAYERS, T_BUCKET_SIZE, T_COUNT
};

static const char *const train_keys[T_COUNT] = {
    "global_batch", "micro_batch", "seq_len", "steps", "schedule", "virtual_stages", "zero",
    "precision", "loss_scale", "recompute", "sequence_parallel", "optimizer", "lr_schedule",
    "seed", "data", "val_data", "eval_every", "log_every", "checkpoint_dir", "checkpoint_every",
    "memory_limit", "stage_layers", "bucket_size",
};

static const char *const schedules[] = {"gpipe", "1f1b", "interleaved"};
static const char *const precisions[] = {"fp32", "bf16", "fp16"};
static const char *const recomputes[] = {"none", "full"};

/* A word option: bare word or string, one of `words`. Returns its index. */
static int word_opt(checker *c, const value *v, const char *key, const char *const *words, int n) {
    const char *w = v->kind == V_WORD || v->kind == V_STR ? v->s : NULL;
    if (v->kind == V_ERR) return -1;
    for (int i = 0; w && i < n; i++)
        if (strcmp(w, words[i]) == 0) return i;
    char list[128] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? (i == n - 1 ? " or " : ", ") : "", words[i]);
    suggest sg;
    suggest_init(&sg, w ? w : "");
    for (int i = 0; w && i < n; i++) suggest_offer(&sg, words[i]);
    const char *best = w ? suggest_result(&sg) : NULL;
    if (best)
        check_error(c, v->where, "%s must be %s, not '%s'; did you mean '%s'?", key, list, w, best);
    else
        check_error(c, v->where, "%s must be %s, not %s", key, list, value_describe(c, v));
    return -1;
}

static int int_opt(checker *c, const value *v, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    if (!value_as_int(c, v, key, out)) return 0;
    if (*out < lo || *out > hi) {
        if (hi == INT64_MAX)
            check_error(c, v->where, "%s must be at least %lld, not %lld", key, (long long)lo, (long long)*out);
        else
            check_error(c, v->where, "%s must be between %lld and %lld, not %lld", key, (long long)lo,
                        (long long)hi, (long long)*out);
        return 0;
    }
    return 1;
}

/* Named arguments of an option constructor, checked against `names`. */
static int call_args(checker *c, const value *v, const char *const *names, int n, const value **out) {
    for (int i = 0; i < n; i++) out[i] = NULL;
    int ok = 1;
    for (int i = 0; i < v->n; i++) {
        if (!v->names[i]) {
            check_error(c, v->locs[i], "%s takes named arguments, e.g. %s(%s: ...)", v->s, v->s, names[0]);
            ok = 0;
            continue;
        }
        int k = -1;
        for (int j = 0; j < n; j++)
            if (strcmp(names[j], v->names[i]) == 0) k = j;
        if (k < 0) {
            suggest sg;
            suggest_init(&sg, v->names[i]);
            for (int j = 0; j < n; j++) suggest_offer(&sg, names[j]);
            const char *best = suggest_result(&sg);
            if (best)
                check_error(c, v->locs[i], "%s() has no argument '%s'; did you mean '%s'?", v->s, v->names[i], best);
            else
                check_error(c, v->locs[i], "%s() has no argument '%s'", v->s, v->names[i]);
            ok = 0;
            continue;
        }
        if (out[k]) {
            check_error(c, v->locs[i], "argument '%s' is given twice", v->names[i]);
            ok = 0;
            continue;
        }
        out[k] = &v->elems[i];
    }
    return ok;
}

static int num_arg(checker *c, const value *v, const char *what, double lo, int lo_open, double *out) {
    if (!v) return 1;
    if (!value_as_number(c, v, what, out)) return 0;
    if (*out < lo || (lo_open && *out == lo)) {
        check_error(c, v->where, "%s must be %s %g", what, lo_open ? "greater than" : "at least", lo);
        return 0;
    }
    return 1;
}

static void optimizer_opt(checker *c, const value *v) {
    train_cfg *t = &c->train;
    if (v->kind == V_ERR) return;
    if (v->kind == V_WORD && strcmp(v->s, "adamw") == 0) {
        check_error(c, v->where, "adamw needs a learning rate: adamw(lr: 3e-4)");
        return;
    }
    if (v->kind != V_CALL || strcmp(v->s, "adamw") != 0) {
        if (v->kind == V_CALL || v->kind == V_WORD) {
            static const char *const opts[] = {"adamw"};
            check_unknown_name(c, v->where, "optimizer", v->s, NULL, opts, 1);
        } else {
            check_error(c, v->where, "optimizer must be adamw(lr: ...), not %s", value_describe(c, v));
        }
        return;
    }
    static const char *const names[] = {"lr", "betas", "eps", "weight_decay", "clip"};
    const value *a[5];
    if (!call_args(c, v, names, 5, a)) return;
    if (!a[0]) {
        check_error(c, v->where, "adamw needs a learning rate: adamw(lr: 3e-4)");
        return;
    }
    num_arg(c, a[0], "lr", 0, 1, &t->lr);
    num_arg(c, a[2], "eps", 0, 1, &t->eps);
    num_arg(c, a[3], "weight_decay", 0, 0, &t->weight_decay);
    num_arg(c, a[4], "clip", 0, 0, &t->clip);
    if (a[1]) {
        const value *b = a[1];
        if (b->kind != V_TUPLE || b->n != 2) {
            check_error(c, b->where, "betas must be a pair, e.g. (0.9, 0.95)");
            return;
        }
        double x[2];
        for (int i = 0; i < 2; i++) {
            if (!value_as_number(c, &b->elems[i], "a beta", &x[i])) return;
            if (x[i] < 0 || x[i] >= 1) {
                check_error(c, b->elems[i].where, "betas must be in [0, 1), not %g", x[i]);
                return;
            }
        }
        t->beta1 = x[0];
        t->beta2 = x[1];
    }
}

static void lr_schedule_opt(checker *c, const value *v, loc *warmup_at) {
    train_cfg *t = &c->train;
    static const char *const kinds[] = {"constant", "cosine", "linear"};
    if (v->kind == V_ERR) return;
    const char *name = v->kind == V_CALL || v->kind == V_WORD ? v->s : NULL;
    int k = -1;
    for (int i = 0; name && i < 3; i++)
        if (strcmp(name, kinds[i]) == 0) k = i;
    if (k < 0) {
        if (name)
            check_unknown_name(c, v->where, "learning-rate schedule", name, NULL, kinds, 3);
        else
            check_error(c, v->where, "lr_schedule must be constant, cosine(...) or linear(...), not %s",
                        value_describe(c, v));
        return;
    }
    t->lr_schedule = kinds[k];
    if (v->kind == V_WORD) return;
    static const char *const names[] = {"warmup", "min_lr"};
    const value *a[2];
    if (!call_args(c, v, names, k == 0 ? 1 : 2, a)) return;
    if (a[0] && int_opt(c, a[0], "warmup", 0, INT64_MAX, &t->warmup)) *warmup_at = a[0]->where;
    num_arg(c, a[1], "min_lr", 0, 0, &t->min_lr);
}

/* stage_layers = balanced, or (n0, n1, ...): the layer stack's split over
 * the pipeline chunks; its length and sum are checked with the model. */
static int stage_layers_opt(checker *c, const value *v) {
    train_cfg *t = &c->train;
    t->stage_layers_at = v->where;
    if (v->kind == V_ERR) return 0;
    if ((v->kind == V_WORD || v->kind == V_STR) && strcmp(v->s, "balanced") == 0) {
        t->stage_mode = STAGE_BALANCED;
        return 1;
    }
    if (v->kind == V_INT) { /* one chunk: (12) is just 12 */
        t->stage_layers = arena_alloc(c->arena, sizeof *t->stage_layers);
        t->stage_layers[0] = v->i;
        t->n_stage_layers = 1;
    } else if (v->kind == V_TUPLE) {
        t->stage_layers = arena_alloc(c->arena, (size_t)v->n * sizeof *t->stage_layers);
        for (int i = 0; i < v->n; i++) {
            int64_t n;
            if (!value_as_int(c, &v->elems[i], "each entry of stage_layers", &n)) return 0;
            if (n < 1) {
                check_error(c, v->elems[i].where, "each pipeline chunk needs at least one layer, not %lld", (long long)n);
                return 0;
            }
            t->stage_layers[i] = n;
        }
        t->n_stage_layers = v->n;
    } else {
        check_error(c, v->where, "stage_layers must be balanced or a tuple of layer counts, one per pipeline "
                                 "chunk, e.g. (5, 7); not %s", value_describe(c, v));
        return 0;
    }
    t->stage_mode = STAGE_EXPLICIT;
    return 1;
}

void check_train(checker *c) {
    train_cfg *t = &c->train;
    *t = (train_cfg){0};
    t->schedule = SCHED_1F1B;
    t->virtual_stages = 1;
    t->bucket_size = FE_BUCKET_SIZE;
    t->beta1 = 0.9;
    t->beta2 = 0.999;
    t->eps = 1e-8;
    t->lr_schedule = "constant";
    t->seed = 1337;
    t->log_every = 1;
    opt_entry opts[64];
    int guessed[T_COUNT] = {0};
    int n = section_options(c, c->train_node, "train", train_keys, T_COUNT, opts, 64, guessed);
    scope *ts = scope_new(c, c->globals);
    int given[T_COUNT] = {0}, bad[T_COUNT] = {0};
    loc at[T_COUNT], warmup_at = LOC_NONE;
    for (int i = 0; i < T_COUNT; i++) at[i] = c->train_node->loc;
    int64_t x;
    for (int i = 0; i < n; i++) {
        int k = opts[i].index;
        value v = eval(c, ts, opts[i].value, EVAL_OPTION);
        given[k] = 1;
        at[k] = v.where;
        int w, ok = 1;
        switch (k) {
        case T_GLOBAL_BATCH: ok = int_opt(c, &v, "global_batch", 1, INT64_MAX, &t->global_batch); break;
        case T_MICRO_BATCH: ok = int_opt(c, &v, "micro_batch", 1, INT64_MAX, &t->micro_batch); break;
        case T_SEQ_LEN: ok = int_opt(c, &v, "seq_len", 1, INT64_MAX, &t->seq_len); break;
        case T_STEPS: ok = int_opt(c, &v, "steps", 1, INT64_MAX, &t->steps); break;
        case T_SEED: ok = int_opt(c, &v, "seed", 0, INT64_MAX, &t->seed); break;
        case T_EVAL_EVERY: ok = int_opt(c, &v, "eval_every", 0, INT64_MAX, &t->eval_every); break;
        case T_LOG_EVERY: ok = int_opt(c, &v, "log_every", 1, INT64_MAX, &t->log_every); break;
        case T_CHECKPOINT_EVERY: ok = int_opt(c, &v, "checkpoint_every", 0, INT64_MAX, &t->checkpoint_every); break;
        case T_BUCKET_SIZE: ok = int_opt(c, &v, "bucket_size", 1, INT64_MAX, &t->bucket_size); break;
        case T_VIRTUAL_STAGES:
            ok = int_opt(c, &v, "virtual_stages", 1, 1024, &x);
            if (ok) t->virtual_stages = (int)x;
            break;
        case T_ZERO:
            ok = int_opt(c, &v, "zero", 0, 3, &x);
            if (ok) t->zero = (int)x;
            break;
        case T_SCHEDULE:
            if ((w = word_opt(c, &v, "schedule", schedules, 3)) >= 0) t->schedule = w; else ok = 0;
            break;
        case T_PRECISION:
            if ((w = word_opt(c, &v, "precision", precisions, 3)) >= 0) t->precision = w; else ok = 0;
            break;
        case T_RECOMPUTE:
            if ((w = word_opt(c, &v, "recompute", recomputes, 2)) >= 0) t->recompute = w; else ok = 0;
            break;
        case T_SEQUENCE_PARALLEL:
            if (v.kind == V_BOOL) t->sequence_parallel = (int)v.i;
            else if (v.kind != V_ERR) {
                check_error(c, v.where, "sequence_parallel must be true or false, not %s", value_describe(c, &v));
                ok = 0;
            }
            break;
        case T_LOSS_SCALE:
            if (v.kind == V_WORD && strcmp(v.s, "dynamic") == 0) break;
            if ((v.kind == V_INT || v.kind == V_FLOAT) && (v.kind == V_INT ? (double)v.i : v.f) > 0) {
                t->loss_scale = v.kind == V_INT ? (double)v.i : v.f;
                break;
            }
            if (v.kind != V_ERR)
                check_error(c, v.where, "loss_scale must be dynamic or a positive number, not %s", value_describe(c, &v));
            ok = 0;
            break;
        case T_MEMORY_LIMIT:
            if (v.kind == V_INT && v.i > 0) {
                t->memory_limit = v.i;
            } else if (v.kind == V_STR && (t->memory_limit = fe_parse_bytes(v.s)) > 0) {
            } else if (v.kind != V_ERR) {
                check_error(c, v.where, "memory_limit must be a size per rank such as \"80GiB\" or a number of "
                                        "bytes, not %s", value_describe(c, &v));
                ok = 0;
            }
            t->memory_limit_at = v.where;
            break;
        case T_STAGE_LAYERS: ok = stage_layers_opt(c, &v); break;
        case T_OPTIMIZER: optimizer_opt(c, &v); break;
        case T_LR_SCHEDULE: lr_schedule_opt(c, &v, &warmup_at); break;
        case T_DATA:
        case T_VAL_DATA:
        case T_CHECKPOINT_DIR:
            if (v.kind == V_STR && v.s[0]) {
                const char **slot = k == T_DATA ? &t->data : k == T_VAL_DATA ? &t->val_data : &t->checkpoint_dir;
                *slot = v.s;
            } else if (v.kind != V_ERR) {
                check_error(c, v.where, "%s must be a non-empty string (a path), not %s", train_keys[k],
                            value_describe(c, &v));
                ok = 0;
            }
            break;
        default: break;
        }
        bad[k] = !ok;
        binding *b = scope_add(c, ts, opts[i].key, B_CONST, opts[i].key_loc);
        b->v = ok ? v : value_err();
    }
    loc sec = {c->train_node->loc.src, c->train_node->loc.start, c->train_node->loc.start + 5};
    static const int required[] = {T_GLOBAL_BATCH, T_SEQ_LEN, T_STEPS, T_OPTIMIZER};
    for (int i = 0; i < 4; i++)
        if (!given[required[i]] && !guessed[required[i]])
            check_error(c, sec, "the train section needs '%s'%s", train_keys[required[i]],
                        required[i] == T_OPTIMIZER ? ", e.g. optimizer = adamw(lr: 3e-4)" : "");
    if (bad[T_GLOBAL_BATCH] || bad[T_MICRO_BATCH] || bad[T_SEQ_LEN] || !given[T_GLOBAL_BATCH] || !given[T_SEQ_LEN])
        return;
    /* The data-parallel ranks of the dense layers are dp x ep: expert
     * parallelism splits the experts over ep, and the ep ranks of a dense
     * layer work on different sequences (as in Megatron-LM and DeepSpeed-MoE). */
    int64_t dp = c->axis[AX_DP] > 0 ? c->axis[AX_DP] : 1, pp = c->axis[AX_PP] > 0 ? c->axis[AX_PP] : 1;
    int64_t ep = c->axis[AX_EP] > 0 ? c->axis[AX_EP] : 1;
    const char *dpn = ep > 1 ? "dp x ep" : "dp";
    if (__builtin_mul_overflow(dp, ep, &dp)) dp = 1;
    if (!given[T_MICRO_BATCH]) {
        if (t->global_batch % dp != 0) {
            check_error(c, at[T_GLOBAL_BATCH], "global_batch = %lld is not divisible by %s = %lld",
                        (long long)t->global_batch, dpn, (long long)dp);
            return;
        }
        t->micro_batch = t->global_batch / dp;
    }
    int64_t per_step;
    if (__builtin_mul_overflow(dp, t->micro_batch, &per_step) || t->global_batch % per_step != 0) {
        check_error(c, at[T_GLOBAL_BATCH], "global_batch = %lld is not divisible by %s x micro_batch = %lld x %lld",
                    (long long)t->global_batch, dpn, (long long)dp, (long long)t->micro_batch);
        return;
    }
    t->ok = 1;
    int64_t m = t->global_batch / per_step;
    if (!given[T_VIRTUAL_STAGES] && t->schedule == SCHED_INTERLEAVED) t->virtual_stages = 2;
    if (t->schedule == SCHED_INTERLEAVED && pp == 1)
        check_error(c, at[T_SCHEDULE], "the interleaved schedule needs pipeline parallelism (pp > 1)");
    else if (t->schedule == SCHED_INTERLEAVED && t->virtual_stages < 2)
        check_error(c, at[T_VIRTUAL_STAGES], "the interleaved schedule needs virtual_stages of at least 2");
    else if (t->schedule != SCHED_INTERLEAVED && t->virtual_stages > 1)
        check_error(c, at[T_VIRTUAL_STAGES], "virtual_stages > 1 needs schedule = interleaved");
    if (pp > 1 && t->schedule != SCHED_GPIPE && m < pp)
        check_error(c, at[T_GLOBAL_BATCH],
                    "%s needs at least pp = %lld micro-batches per step, but global_batch / (%s x micro_batch) "
                    "= %lld / (%lld x %lld) = %lld", schedules[t->schedule], (long long)pp, dpn,
                    (long long)t->global_batch, (long long)dp, (long long)t->micro_batch, (long long)m);
    else if (pp > 1 && t->schedule == SCHED_INTERLEAVED && m % pp != 0)
        check_error(c, at[T_GLOBAL_BATCH], "the interleaved schedule needs a multiple of pp = %lld micro-batches "
                                           "per step, not %lld", (long long)pp, (long long)m);
    if (given[T_LOSS_SCALE] && t->precision != PREC_FP16)
        check_error(c, at[T_LOSS_SCALE], "loss_scale applies only to precision = fp16");
    if (t->checkpoint_every > 0 && !t->checkpoint_dir)
        check_error(c, at[T_CHECKPOINT_EVERY], "checkpoint_every needs checkpoint_dir");
    if (t->eval_every > 0 && !t->val_data)
        check_error(c, at[T_EVAL_EVERY], "eval_every needs val_data");
    if (given[T_STEPS] && !bad[T_STEPS] && t->warmup > t->steps)
        check_error(c, warmup_at, "warmup (%lld steps) is longer than the run (%lld steps)", (long long)t->warmup,
                    (long long)t->steps);
    if (t->lr > 0 && t->min_lr > t->lr)
        check_error(c, at[T_LR_SCHEDULE], "min_lr (%g) is larger than the learning rate (%g)", t->min_lr, t->lr);
    if (t->zero > 0 && dp == 1)
        check_warning(c, at[T_ZERO], "zero = %d has no effect with one data-parallel rank", t->zero);
}

/* ---- model x mesh x train ---- */

void check_layout(checker *c) {
    int64_t pp = c->axis[AX_PP], v = c->train.virtual_stages;
    if (pp > 1 && c->second_stack) {
        check_error(c, c->second_stack->loc.start >= 0 ? (loc){c->second_stack->loc.src, c->second_stack->loc.start,
                                                               c->second_stack->loc.start + 6} : c->second_stack->loc,
                    "pipeline parallelism (pp = %lld) splits one layer stack, but the model has a second top-level "
                    "repeat", (long long)pp);
        check_note(c, c->layers_node->a->loc, "the layer stack is this repeat");
    } else if (pp > 1 && c->train.stage_mode == STAGE_EXPLICIT) {
        int64_t sum = 0, chunks = pp * v;
        for (int i = 0; i < c->train.n_stage_layers; i++) sum += c->train.stage_layers[i];
        if (c->train.n_stage_layers != chunks)
            check_error(c, c->train.stage_layers_at, "stage_layers has %d entr%s; it needs one per pipeline chunk: "
                        "pp x virtual_stages = %lld", c->train.n_stage_layers, c->train.n_stage_layers == 1 ? "y" : "ies",
                        (long long)chunks);
        else if (!c->layers_node)
            check_error(c, c->train.stage_layers_at, "stage_layers splits a layer stack, but the model has none");
        else if (sum != c->layers)
            check_error(c, c->train.stage_layers_at, "stage_layers adds up to %lld layers, but the layer stack has "
                        "%lld", (long long)sum, (long long)c->layers);
    } else if (pp > 1 && c->train.stage_mode == STAGE_BALANCED) {
        if (!c->layers_node)
            check_error(c, c->model_node->name_loc, "pp = %lld needs a layer stack: a `repeat` in the model body",
                        (long long)pp);
        else if (c->layers < pp * v)
            check_error(c, c->layers_node->a->loc, "%lld layers are fewer than the %lld pipeline chunks "
                        "(pp x virtual_stages)", (long long)c->layers, (long long)(pp * v));
    } else if (pp > 1) {
        if (!c->layers_node) {
            check_error(c, c->model_node->name_loc, "pp = %lld needs a layer stack: a `repeat` in the model body",
                        (long long)pp);
        } else if (c->layers % (pp * v) != 0) {
            if (v > 1)
                check_error(c, c->layers_node->a->loc, "%lld layers cannot be split evenly over pp x virtual_stages "
                            "= %lld x %lld pipeline chunks", (long long)c->layers, (long long)pp, (long long)v);
            else
                check_error(c, c->layers_node->a->loc, "%lld layers cannot be split evenly over pp = %lld pipeline "
                            "stages", (long long)c->layers, (long long)pp);
        }
    }
    if (c->axis[AX_EP] > 1 && !c->has_moe) {
        check_warning(c, c->model_node->name_loc, "ep = %lld, but model '%s' has no moe layer; the ep ranks only "
                      "add data parallelism (use dp)", (long long)c->axis[AX_EP], c->model_node->name);
    }
    if (c->train.sequence_parallel && c->axis[AX_TP] == 1)
        check_warning(c, c->train_node->loc, "sequence_parallel has no effect with tp = 1");
}
