/* api.c — the public plan and context API of mesh.h, over the plan reader
 * (compiler/plan.h), the interpreter (exec.h) and checkpoints. */
#include <stdarg.h> /* va_list */
#include <stdio.h>  /* FILE, vsnprintf */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* strcmp, memcpy */

#include "checkpoint.h" /* mesh__ckpt_* */
#include "exec.h"       /* mesh__exec_* */
#include "file.h"       /* mesh__read_file */
#include "mesh.h"
#include "plan.h"       /* plan_read */

_Static_assert(sizeof(int) == sizeof(int32_t), "token ids are passed as int");

struct mesh_plan {
    plan p;
};

struct mesh_context {
    const mesh_plan *plan;
    mesh__exec *ex;
    long long step;
};

static _Thread_local char last_error[1024];

const char *mesh_last_error(void) { return last_error; }

static mesh_status fail(mesh_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

/* Reads and checks plan text; name prefixes the error ("NAME:LINE:COL: ..."). */
static mesh_status read_plan_text(const char *name, const char *text, size_t len, mesh_plan **out)
{
    mesh_plan *mp = calloc(1, sizeof *mp);
    if (!mp) return fail(MESH_ERR_NOMEM, "out of memory");
    char err[1024];
    if (plan_read(&mp->p, text ? text : "", len, err, sizeof err) != 0) {
        free(mp);
        return fail(MESH_ERR_PARSE, "%s:%s", name, err);
    }
    *out = mp;
    return MESH_OK;
}

mesh_status mesh_plan_from_memory(const char *text, size_t len, mesh_plan **out)
{
    if (!out || (!text && len)) return fail(MESH_ERR_INVALID_ARG, "mesh_plan_from_memory: NULL argument");
    *out = NULL;
    return read_plan_text("plan", text, len, out);
}

mesh_status mesh_plan_load(const char *path, mesh_plan **out)
{
    if (!path || !out) return fail(MESH_ERR_INVALID_ARG, "mesh_plan_load: NULL argument");
    *out = NULL;
    size_t len = 0;
    char err[1200];
    char *text = mesh__read_file(path, &len, err, sizeof err);
    if (!text) return fail(strstr(err, "memory") ? MESH_ERR_NOMEM : MESH_ERR_IO, "%s", err);
    mesh_status st = read_plan_text(path, text, len, out);
    free(text);
    return st;
}

void mesh_plan_free(mesh_plan *mp)
{
    if (!mp) return;
    plan_free(&mp->p);
    free(mp);
}

mesh_status mesh_plan_batch(const mesh_plan *mp, int *micro_batch, int *micro_batches, int *seq_len,
                            int *vocab)
{
    if (!mp) return fail(MESH_ERR_INVALID_ARG, "mesh_plan_batch: NULL plan");
    const plan *p = &mp->p;
    const fe_setup *s = &p->setup;
    long long dp = s->dp * s->ep > 0 ? s->dp * s->ep : 1;
    long long m = s->micro_batches > 0 ? s->micro_batches : 1;
    if (micro_batch) *micro_batch = (int)(s->global_batch / dp / m);
    if (micro_batches) *micro_batches = (int)m;
    if (seq_len) *seq_len = (int)s->seq_len;
    if (vocab) {
        *vocab = 0;
        for (int id = 0; id < p->n_tensors; id++)
            if (p->tensors[id].op == G_EMBED && p->tensors[p->tensors[id].in[0]].op == G_INPUT)
                *vocab = (int)p->tensors[p->tensors[id].in[1]].dims[0];
    }
    return MESH_OK;
}

mesh_status mesh_context_create(const mesh_plan *mp, int rank, mesh_context **out)
{
    return mesh_context_create_with(mp, rank, NULL, NULL, out);
}

mesh_status mesh_context_create_with(const mesh_plan *mp, int rank, mesh_alloc_fn alloc, void *ud,
                                     mesh_context **out)
{
    if (!mp || !out) return fail(MESH_ERR_INVALID_ARG, "mesh_context_create: NULL argument");
    *out = NULL;
    if (rank < 0 || rank >= mp->p.setup.world)
        return fail(MESH_ERR_INVALID_ARG, "rank %d is not in the plan's world of %lld", rank,
                    mp->p.setup.world);
    mesh_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fail(MESH_ERR_NOMEM, "out of memory");
    char err[512];
    ctx->plan = mp;
    ctx->ex = mesh__exec_create(&mp->p, alloc, ud, err, sizeof err);
    if (!ctx->ex) {
        free(ctx);
        return fail(strstr(err, "memory") ? MESH_ERR_NOMEM : MESH_ERR_UNSUPPORTED, "%s", err);
    }
    *out = ctx;
    return MESH_OK;
}

void mesh_context_free(mesh_context *ctx)
{
    if (!ctx) return;
    mesh__exec_free(ctx->ex);
    free(ctx);
}

mesh_status mesh_train_step(mesh_context *ctx, const int *inputs, const int *targets,
                            mesh_step_stats *stats)
{
    if (!ctx || !inputs || !targets) return fail(MESH_ERR_INVALID_ARG, "mesh_train_step: NULL argument");
    mesh__step_stats st;
    int rc = mesh__exec_train_step(ctx->ex, ctx->step + 1, inputs, targets, &st);
    if (rc == 0) ctx->step++;
    if (stats) *stats = (mesh_step_stats){st.loss, st.norm, st.lr, ctx->step};
    if (rc != 0)
        return fail(MESH_ERR_CHECK, "step %lld: the loss (%g) or the gradient norm (%g) is not finite; "
                    "the parameters are unchanged", ctx->step + 1, st.loss, st.norm);
    return MESH_OK;
}

mesh_status mesh_forward(mesh_context *ctx, const int *inputs, const int *targets, double *loss,
                         float *logits, size_t n)
{
    if (!ctx || !inputs || !targets) return fail(MESH_ERR_INVALID_ARG, "mesh_forward: NULL argument");
    double l = mesh__exec_loss(ctx->ex, inputs, targets);
    if (loss) *loss = l;
    if (!logits) return MESH_OK;
    int vp, vocab;
    const float *lg = mesh__exec_logits(ctx->ex, &vp);
    const plan_tensor *ce = &ctx->plan->p.tensors[ctx->plan->p.loss];
    vocab = ce->vocab > 0 ? (int)ce->vocab : vp;
    size_t rows = mesh__exec_batch_tokens(ctx->ex);
    if (n != rows * (size_t)vocab)
        return fail(MESH_ERR_INVALID_ARG, "mesh_forward: logits need %zu floats (%zu rows x %d), not %zu",
                    rows * (size_t)vocab, rows, vocab, n);
    for (size_t r = 0; r < rows; r++) memcpy(logits + r * (size_t)vocab, lg + r * (size_t)vp, (size_t)vocab * sizeof *lg);
    return MESH_OK;
}

mesh_status mesh_param_info(const mesh_context *ctx, int index, const char **name, size_t *n)
{
    float *w, *g;
    if (!ctx || !name || !n) return fail(MESH_ERR_INVALID_ARG, "mesh_param_info: NULL argument");
    if (index < 0 || mesh__exec_param(ctx->ex, index, name, n, &w, &g) != 0)
        return fail(MESH_ERR_INVALID_ARG, "no parameter %d", index);
    return MESH_OK;
}

/* The value buffer of the parameter called name, checking its size. */
static mesh_status find_param(mesh_context *ctx, const char *name, size_t n, float **value)
{
    const char *pn;
    size_t pnum;
    float *g;
    if (!ctx || !name) return fail(MESH_ERR_INVALID_ARG, "NULL argument");
    for (int k = 0; mesh__exec_param(ctx->ex, k, &pn, &pnum, value, &g) == 0; k++) {
        if (strcmp(pn, name) != 0) continue;
        if (pnum != n) return fail(MESH_ERR_INVALID_ARG, "parameter '%s' has %zu elements, not %zu", name, pnum, n);
        return MESH_OK;
    }
    return fail(MESH_ERR_INVALID_ARG, "no parameter '%s'", name);
}

mesh_status mesh_param_read(mesh_context *ctx, const char *name, float *out, size_t n)
{
    float *w;
    mesh_status st = find_param(ctx, name, n, &w);
    if (st == MESH_OK && out) memcpy(out, w, n * sizeof *w);
    return st;
}

mesh_status mesh_param_write(mesh_context *ctx, const char *name, const float *in, size_t n)
{
    float *w;
    mesh_status st = find_param(ctx, name, n, &w);
    if (st == MESH_OK && in) memcpy(w, in, n * sizeof *w);
    return st;
}

mesh_status mesh_checkpoint_save(mesh_context *ctx, const char *dir)
{
    char err[512];
    if (!ctx || !dir) return fail(MESH_ERR_INVALID_ARG, "mesh_checkpoint_save: NULL argument");
    if (mesh__ckpt_save(ctx->ex, dir, ctx->step, err, sizeof err) != 0) return fail(MESH_ERR_IO, "%s", err);
    return MESH_OK;
}

mesh_status mesh_checkpoint_load(mesh_context *ctx, const char *path)
{
    char err[512];
    long long step = 0;
    if (!ctx || !path) return fail(MESH_ERR_INVALID_ARG, "mesh_checkpoint_load: NULL argument");
    if (mesh__ckpt_load(ctx->ex, path, 1, &step, err, sizeof err) != 0) return fail(MESH_ERR_IO, "%s", err);
    ctx->step = step;
    return MESH_OK;
}
