/* api.c — the public plan and context API of mesh.h, over the plan reader
 * (compiler/plan.h), the interpreter (exec.h), checkpoints and sampling.
 * Token streams are in data.c, tokenizers in tokenizer.c. */
#include <math.h>    /* NAN: mesh_forward's loss when it failed */
#include <pthread.h> /* pthread_mutex_t: the process's device */
#include <stdarg.h>  /* va_list */
#include <stdio.h>   /* FILE, vsnprintf */
#include <stdlib.h>  /* malloc, free */
#include <string.h>  /* strcmp, memcpy */

#include "api_impl.h"   /* struct mesh_plan, struct mesh_context, mesh__fail */
#include "checkpoint.h" /* mesh__ckpt_* */
#include "device.h"     /* dev_cuda_probe, dev_choose */
#include "exec.h"       /* mesh__exec_* */
#include "kern.h"       /* KERN_REPORT_*: what mesh__exec_kernels_report speaks of */
#include "file.h"       /* mesh__read_file */
#include "init.h"       /* mesh__init_key */
#include "kcpu.h"       /* kcpu_set_threads */
#include "sample.h"     /* mesh__next_logits, mesh__sample_draw */

_Static_assert(sizeof(int) == sizeof(int32_t), "token ids are passed as int");

static _Thread_local char last_error[2048];

const char *mesh_last_error(void) { return last_error; }

mesh_status mesh__fail(mesh_status st, const char *fmt, ...)
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
    if (!mp) return mesh__fail(MESH_ERR_NOMEM, "out of memory");
    char err[1024];
    if (plan_read(&mp->p, text ? text : "", len, err, sizeof err) != 0) {
        free(mp);
        return mesh__fail(MESH_ERR_PARSE, "%s:%s", name, err);
    }
    *out = mp;
    return MESH_OK;
}

mesh_status mesh_plan_from_memory(const char *text, size_t len, mesh_plan **out)
{
    if (!out || (!text && len)) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_plan_from_memory: NULL argument");
    *out = NULL;
    return read_plan_text("plan", text, len, out);
}

mesh_status mesh_plan_load(const char *path, mesh_plan **out)
{
    if (!path || !out) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_plan_load: NULL argument");
    *out = NULL;
    size_t len = 0;
    char err[1200];
    char *text = mesh__read_file(path, &len, err, sizeof err);
    if (!text) return mesh__fail(strstr(err, "memory") ? MESH_ERR_NOMEM : MESH_ERR_IO, "%s", err);
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
    if (!mp) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_plan_batch: NULL plan");
    const plan *p = &mp->p;
    const fe_setup *s = &p->setup;
    long long dp = s->dp * s->ep > 0 ? s->dp * s->ep : 1;
    long long m = s->micro_batches > 0 ? s->micro_batches : 1;
    if (micro_batch) *micro_batch = (int)(s->global_batch / dp / m);
    if (micro_batches) *micro_batches = (int)m;
    if (seq_len) *seq_len = (int)s->seq_len;
    if (vocab) *vocab = mesh__plan_vocab(p);
    return MESH_OK;
}

/* A cross-entropy's classes: its vocab attribute, else the logits' last dimension. */
static int ce_vocab(const plan *p, const plan_tensor *ce)
{
    const plan_tensor *logits = &p->tensors[ce->in[0]];
    return ce->vocab > 0 ? (int)ce->vocab : logits->rank > 0 ? (int)logits->dims[logits->rank - 1] : 0;
}

/* The fewest classes of any cross-entropy (the loss's, in a plan meshc
 * wrote) and rows of any embedding of the inputs: the ids every op takes. */
int mesh__plan_vocab(const plan *p)
{
    int vocab = 0;
    for (int id = 0; id < p->n_tensors; id++) {
        const plan_tensor *t = &p->tensors[id];
        int v = t->op == G_CROSS_ENTROPY ? ce_vocab(p, t)
                : t->op == G_EMBED && p->tensors[t->in[0]].op == G_INPUT ? (int)p->tensors[t->in[1]].dims[0]
                                                                         : 0;
        if (v > 0 && (vocab <= 0 || v < vocab)) vocab = v;
    }
    return vocab;
}

mesh_status mesh__check_ids(const plan *p, const int *ids, size_t n, const char *who, const char *what)
{
    int vocab = mesh__plan_vocab(p);
    if (vocab <= 0) return MESH_OK;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return mesh__fail(MESH_ERR_INVALID_ARG, "%s: %s[%zu] = %d is not a token of the model's vocabulary "
                              "(0 to %d)", who, what, i, ids[i], vocab - 1);
    return MESH_OK;
}

mesh_status mesh_plan_get_info(const mesh_plan *mp, size_t size, mesh_plan_info *info)
{
    static const char *const schedules[] = {"constant", "cosine", "linear"};
    static const char *const precisions[] = {"fp32", "bf16", "fp16"};
    if (!mp || !info) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_plan_get_info: NULL argument");
    /* the struct grows only at its end; this is its first layout */
    if (size < sizeof(mesh_plan_info))
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_plan_get_info: size %zu is not a mesh_plan_info's", size);
    const plan *p = &mp->p;
    const fe_setup *s = &p->setup;
    mesh_plan_info all;
    memset(&all, 0, sizeof all);
    all.source = p->source ? p->source : "";
    all.world = (int)s->world;
    all.dp = (int)s->dp;
    all.tp = (int)s->tp;
    all.pp = (int)s->pp;
    all.ep = (int)s->ep;
    all.global_batch = (int)s->global_batch;
    mesh_plan_batch(mp, &all.micro_batch, &all.micro_batches, &all.seq_len, &all.vocab);
    all.steps = s->steps;
    all.lr = s->lr;
    all.min_lr = s->min_lr;
    all.warmup = s->warmup;
    all.lr_schedule = s->lr_schedule >= 0 && s->lr_schedule <= 2 ? schedules[s->lr_schedule] : "?";
    all.precision = s->precision >= 0 && s->precision <= 2 ? precisions[s->precision] : "?";
    all.seed = s->seed;
    all.log_every = s->log_every;
    all.eval_every = s->eval_every;
    all.checkpoint_every = s->checkpoint_every;
    all.data = p->data;
    all.val_data = p->val_data;
    all.checkpoint_dir = p->checkpoint_dir;
    memcpy(info, &all, size < sizeof all ? size : sizeof all);
    return MESH_OK;
}

mesh_status mesh_context_create(const mesh_plan *mp, int rank, mesh_context **out)
{
    return mesh_context_create_with(mp, rank, NULL, NULL, out);
}

mesh_status mesh_context_create_with(const mesh_plan *mp, int rank, mesh_alloc_fn alloc, void *ud,
                                     mesh_context **out)
{
    if (!mp || !out) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_create: NULL argument");
    *out = NULL;
    if (rank < 0 || rank >= mp->p.setup.world)
        return mesh__fail(MESH_ERR_INVALID_ARG, "rank %d is not in the plan's world of %lld", rank,
                          mp->p.setup.world);
    if (mp->p.setup.world > 1)
        return mesh__fail(MESH_ERR_UNSUPPORTED, "a plan of %lld ranks runs its ranks together: mesh_run_ranks, "
                          "or meshrun", mp->p.setup.world);
    return mesh__context_create(mp, rank, NULL, alloc, ud, out);
}

static int deterministic; /* mesh_set_deterministic */
static int no_overlap;    /* mesh_set_overlap(0) */
static int profile;       /* mesh_set_profile */
static unsigned extra_flags; /* mesh__set_exec_flags */

void mesh__set_exec_flags(unsigned flags) { extra_flags = flags; }

mesh_status mesh_set_overlap(int on)
{
    no_overlap = on == 0;
    return MESH_OK;
}

mesh_status mesh_set_profile(int on)
{
    profile = on != 0;
    return MESH_OK;
}

mesh_status mesh_set_deterministic(int on)
{
    deterministic = on != 0;
    return MESH_OK;
}

/* The process's device (settling MESH_DEVICE_AUTO's choice if nothing
 * has) in *kind, its reason in why; 1 when it is AUTO's choice. */
static int device_of(mesh_device_kind *kind, char *why, size_t n);

/* MESH_GPU_SHARED=1: ranks as threads of one process share its GPUs. */
static int gpus_shared(void)
{
    const char *s = getenv("MESH_GPU_SHARED");
    return s && !strcmp(s, "1");
}

/* Whether world's ranks are threads of this process. */
static int threads_world(comm *world)
{
    return !strcmp(comm_checked_inner(world)->v->name, "threads");
}

/* Ranks as threads of one process, more of them than its GPUs, not
 * shared (MESH_GPU_SHARED): why they cannot each have a GPU, in err
 * (-1), else 0. */
static int too_few_gpus(comm *world, char *err, size_t n)
{
    int count = dev_cuda_count();
    if (!world || world->size <= 1 || !threads_world(world) || (gpus_shared() && count > 0) || count >= world->size)
        return 0;
    snprintf(err, n, "%d ranks as threads of one process need a GPU each, and this process sees %d", world->size,
             count);
    return -1;
}

/* Several ranks on GPUs: this rank's GPU (ranks as threads of one
 * process: GPU rank, one each; one rank per process: its local rank's,
 * modulo the GPUs it sees, docs/conventions) in *gpu, and the NCCL world
 * of their device buffers in ctx->nccl, bootstrapped over world.
 * MESH_GPU_SHARED=1 with ranks as threads: GPU rank modulo the GPUs, and
 * no NCCL world (the executor stages its collectives through the threads
 * world: a mesh tested on fewer GPUs than ranks, slowly). Collective; on
 * failure the world is aborted and err says why. */
static int join_gpus(mesh_context *ctx, comm *world, int *gpu, char *err, size_t n)
{
    int threads = threads_world(world), count = dev_cuda_count();
    if (threads && gpus_shared() && count > 0) {
        *gpu = ctx->rank % count;
        return 0;
    }
    if (too_few_gpus(world, err, n) != 0) {
        size_t used = strlen(err);
        snprintf(err + used, n - used, " (run one rank per process: mpirun, srun or torchrun; or, to test a mesh "
                 "on fewer GPUs, MESH_GPU_SHARED=1)");
        comm_abort(world, err);
        return -1;
    }
    int local = threads ? ctx->rank : mesh__job_local_rank();
    *gpu = (local >= 0 ? local : ctx->rank) % (count > 0 ? count : 1);
    ctx->nccl = comm_nccl_world_mpi(world, *gpu, 0, err, n);
    /* a bf16 or fp16 plan's tensors are 2-byte on the GPU: so are its collectives' elements */
    int prec = ctx->plan->p.setup.precision;
    if (ctx->nccl && prec != 0) comm_nccl_set_elements(ctx->nccl, prec == 1 ? COMM_BF16 : COMM_F16);
    if (ctx->nccl) return 0;
    comm_abort(world, err);
    return -1;
}

mesh_status mesh__context_create(const mesh_plan *mp, int rank, comm *world, mesh_alloc_fn alloc, void *ud,
                                 mesh_context **out)
{
    *out = NULL;
    mesh_context *ctx = calloc(1, sizeof *ctx);
    char err[512];
    if (!ctx) {
        snprintf(err, sizeof err, "rank %d: out of memory", rank);
        if (world) comm_abort(world, err);
        return mesh__fail(MESH_ERR_NOMEM, "%s", err);
    }
    ctx->plan = mp;
    ctx->rank = rank;
    int by_auto = device_of(&ctx->device, ctx->device_why, sizeof ctx->device_why);
    /* MESH_DEVICE_AUTO's GPU, where this plan's ranks (threads of this
     * process) cannot each have one: the CPU, every rank alike, saying why */
    if (ctx->device == MESH_DEVICE_CUDA && by_auto && too_few_gpus(world, err, sizeof err) != 0) {
        ctx->device = MESH_DEVICE_CPU;
        snprintf(ctx->device_why, sizeof ctx->device_why, "%s: running on the CPU (--device cuda with "
                 "MESH_GPU_SHARED=1 shares the GPUs)", err);
    }
    unsigned flags = (deterministic ? MESH__EXEC_DETERMINISTIC : 0) | (no_overlap ? MESH__EXEC_NO_OVERLAP : 0) |
                     (profile ? MESH__EXEC_PROFILE : 0) | (ctx->device == MESH_DEVICE_CUDA ? MESH__EXEC_CUDA : 0) |
                     extra_flags;
    if (ctx->device == MESH_DEVICE_CUDA && mesh__exec_gpu_supported(&mp->p, err, sizeof err) != 0) {
        char why[600];
        snprintf(why, sizeof why, "the GPU executor does not train this plan yet: %s (train it on the CPU: "
                 "--device cpu)", err);
        free(ctx);
        if (world) comm_abort(world, why); /* every rank refuses alike; none waits */
        return mesh__fail(MESH_ERR_UNSUPPORTED, "%s", why);
    }
    int gpu = 0;
    if (ctx->device == MESH_DEVICE_CUDA && world && world->size > 1 &&
        join_gpus(ctx, world, &gpu, err, sizeof err) != 0) {
        free(ctx);
        return mesh__fail(MESH_ERR_UNSUPPORTED, "%s", err);
    }
    ctx->ex = mesh__exec_create_rank(&mp->p, rank, world, ctx->nccl, gpu, alloc, ud, flags, err, sizeof err);
    if (!ctx->ex) {
        comm_free(ctx->nccl);
        free(ctx);
        mesh_status st = strstr(err, "memory") ? MESH_ERR_NOMEM
                       : strstr(err, "failed:") || strstr(err, "waited") ? MESH_ERR_RANK
                                                                       : MESH_ERR_UNSUPPORTED;
        return mesh__fail(st, "%s", err);
    }
    *out = ctx;
    return MESH_OK;
}

mesh_status mesh_context_sent(const mesh_context *ctx, int index, char *what, size_t n, double *bytes,
                              double *planned)
{
    if (!ctx || !what || !n || !bytes || !planned)
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_sent: NULL argument");
    if (index < 0 || mesh__exec_sent(ctx->ex, index, what, n, bytes, planned) != 0)
        return mesh__fail(MESH_ERR_INVALID_ARG, "no entry %d of the bytes sent", index);
    return MESH_OK;
}

mesh_status mesh_context_comm_ms(mesh_context *ctx, int index, double *ms, double *calls, long long *untimed)
{
    long long u = 0;
    double n = 0;
    if (!ctx || !ms) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_comm_ms: NULL argument");
    if (index < 0 || mesh__exec_comm_ms(ctx->ex, index, ms, &n, &u) != 0)
        return mesh__fail(MESH_ERR_INVALID_ARG, "no entry %d of the bytes sent", index);
    if (calls) *calls = n;
    if (untimed) *untimed = u;
    return MESH_OK;
}

mesh_status mesh_context_overlap_ms(mesh_context *ctx, int index, double *ms, double *calls)
{
    double n = 0;
    if (!ctx || !ms) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_overlap_ms: NULL argument");
    if (index < 0 || mesh__exec_overlap_ms(ctx->ex, index, ms, &n) != 0)
        return mesh__fail(MESH_ERR_INVALID_ARG, "no entry %d of the bytes sent", index);
    if (calls) *calls = n;
    return MESH_OK;
}

/* What = KERN_REPORT_*: the kernels' words for one of their options into
 * buf; fn and none name the call and what an off option lacks. */
static mesh_status kernels_report(mesh_context *ctx, int what, const char *fn, const char *none, char *buf, size_t n)
{
    if (!ctx || !buf || n == 0) return mesh__fail(MESH_ERR_INVALID_ARG, "%s: NULL argument or n 0", fn);
    buf[0] = 0;
    if (mesh__exec_kernels_report(ctx->ex, what, buf, n) != 0)
        return mesh__fail(MESH_ERR_UNSUPPORTED, "no %s on this rank", none);
    return MESH_OK;
}

mesh_status mesh_context_gemm_tuning(mesh_context *ctx, char *buf, size_t n)
{
    return kernels_report(ctx, KERN_REPORT_GEMM_TUNING, "mesh_context_gemm_tuning",
                          "matmul tuning (MESH_GEMM_TUNE=1, on a GPU)", buf, n);
}

mesh_status mesh_context_attention_cudnn(mesh_context *ctx, char *buf, size_t n)
{
    return kernels_report(ctx, KERN_REPORT_ATTENTION_CUDNN, "mesh_context_attention_cudnn",
                          "attention on cuDNN (MESH_ATTN_CUDNN=1 or fwd, on a GPU)", buf, n);
}

mesh_status mesh_context_profile(mesh_context *ctx, int index, size_t size, mesh_profile_entry *entry)
{
    if (!ctx || !entry) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_profile: NULL argument");
    /* the struct grows only at its end; this is its first layout */
    if (size < sizeof(mesh_profile_entry))
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_profile: size %zu is not a mesh_profile_entry's", size);
    mesh_profile_entry e;
    memset(&e, 0, sizeof e);
    if (index < 0 || mesh__exec_profile(ctx->ex, index, e.what, sizeof e.what, &e.ms, &e.calls, &e.gflop, &e.steps,
                                        &e.untimed) != 0)
        return mesh__fail(MESH_ERR_INVALID_ARG, "no entry %d of the profile (mesh_set_profile before the context; "
                          "a step after the first)", index);
    *entry = e;
    return MESH_OK;
}

mesh_status mesh_context_times_on_gpu(const mesh_context *ctx, int *on_gpu)
{
    if (!ctx || !on_gpu) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_times_on_gpu: NULL argument");
    *on_gpu = mesh__exec_ordered(ctx->ex);
    return MESH_OK;
}

mesh_status mesh_context_rank(const mesh_context *ctx, int *rank, int *data_rank, int *data_ranks)
{
    if (!ctx) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_rank: NULL context");
    int dr, drs;
    mesh__exec_data_rank(ctx->ex, &dr, &drs);
    if (rank) *rank = ctx->rank;
    if (data_rank) *data_rank = dr;
    if (data_ranks) *data_ranks = drs;
    return MESH_OK;
}

void mesh_context_free(mesh_context *ctx)
{
    if (!ctx) return;
    mesh__exec_free(ctx->ex);
    comm_free(ctx->nccl);
    mesh__ckpt_unlock(&ctx->ckpt_lock);
    free(ctx);
}

mesh_status mesh_train_step(mesh_context *ctx, const int *inputs, const int *targets,
                            mesh_step_stats *stats)
{
    if (!ctx || !inputs || !targets) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_train_step: NULL argument");
    int mb = 0, m = 0, seq = 0;
    mesh_plan_batch(ctx->plan, &mb, &m, &seq, NULL);
    size_t n = (size_t)mb * (size_t)m * (size_t)seq;
    mesh_status bad = mesh__check_ids(&ctx->plan->p, inputs, n, "mesh_train_step", "inputs");
    if (bad == MESH_OK) bad = mesh__check_ids(&ctx->plan->p, targets, n, "mesh_train_step", "targets");
    if (bad != MESH_OK) return bad; /* (before any collective: the launcher stops the other ranks) */
    mesh__step_stats st = {0};
    int rc = mesh__exec_train_step(ctx->ex, ctx->step + 1, inputs, targets, &st);
    ctx->step++; /* a skipped step counts too: the schedule and the data move on */
    if (stats) *stats = (mesh_step_stats){st.loss, st.norm, st.lr, ctx->step, st.loss_scale, st.skipped,
                                          st.overlapped, st.overlap_ms, st.wait_ms, st.comm_ms, st.flops};
    if (rc == -2) return mesh__fail(MESH_ERR_RANK, "step %lld: %s", ctx->step, mesh__exec_error(ctx->ex));
    if (rc != 0)
        return mesh__fail(MESH_ERR_CHECK, "step %lld: the loss (%g) or the gradient norm (%g) is not finite; "
                          "the parameters are unchanged", ctx->step, st.loss, st.norm);
    return MESH_OK;
}

mesh_status mesh_context_step(const mesh_context *ctx, long long *step)
{
    if (!ctx || !step) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_step: NULL argument");
    *step = ctx->step;
    return MESH_OK;
}

mesh_status mesh_context_memory(const mesh_context *ctx, size_t *allocated, size_t *planned)
{
    if (!ctx) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_memory: NULL context");
    const plan *p = &ctx->plan->p;
    if (allocated) *allocated = mesh__exec_bytes(ctx->ex);
    int stage = mesh__exec_stage(ctx->ex);
    if (planned) *planned = p->memory && p->memory[stage].total > 0 ? (size_t)p->memory[stage].total : 0;
    return MESH_OK;
}

mesh_status mesh_context_kernel_memory(const mesh_context *ctx, size_t *bytes)
{
    if (!ctx || !bytes) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_kernel_memory: NULL argument");
    *bytes = mesh__exec_kernel_bytes(ctx->ex);
    return MESH_OK;
}

/* Logits asked of a tensor-parallel context, which holds a slice of them. */
static mesh_status split_logits(const char *who)
{
    return mesh__fail(MESH_ERR_UNSUPPORTED, "%s: with tp > 1 each rank holds a slice of the logits; sample from a "
                      "plan of this model with tp = 1 (checkpoints hold whole parameters, so any mesh's loads "
                      "into any other)", who);
}

mesh_status mesh_forward(mesh_context *ctx, const int *inputs, const int *targets, double *loss,
                         float *logits, size_t n)
{
    if (!ctx || !inputs || !targets) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_forward: NULL argument");
    if (logits && ctx->plan->p.setup.tp > 1) return split_logits("mesh_forward");
    size_t bt = mesh__exec_batch_tokens(ctx->ex);
    mesh_status bad = mesh__check_ids(&ctx->plan->p, inputs, bt, "mesh_forward", "inputs");
    if (bad == MESH_OK) bad = mesh__check_ids(&ctx->plan->p, targets, bt, "mesh_forward", "targets");
    if (bad != MESH_OK) return bad;
    double l = NAN;
    int rc = mesh__exec_forward(ctx->ex, inputs, targets, &l);
    if (loss) *loss = rc == 0 ? l : NAN;
    if (rc != 0) return mesh__fail(MESH_ERR_RANK, "mesh_forward: %s", mesh__exec_error(ctx->ex));
    if (!logits) return MESH_OK;
    int vp, vocab;
    const float *lg = mesh__exec_logits(ctx->ex, &vp);
    if (!lg) return mesh__fail(MESH_ERR_RANK, "mesh_forward: %s", mesh__exec_error(ctx->ex));
    const plan_tensor *ce = &ctx->plan->p.tensors[ctx->plan->p.loss];
    vocab = ce->vocab > 0 ? (int)ce->vocab : vp;
    size_t rows = mesh__exec_batch_tokens(ctx->ex);
    if (n != rows * (size_t)vocab)
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_forward: logits need %zu floats (%zu rows x %d), not %zu",
                          rows * (size_t)vocab, rows, vocab, n);
    for (size_t r = 0; r < rows; r++) memcpy(logits + r * (size_t)vocab, lg + r * (size_t)vp, (size_t)vocab * sizeof *lg);
    return MESH_OK;
}

mesh_status mesh_param_info(const mesh_context *ctx, int index, const char **name, size_t *n)
{
    float *w, *g;
    if (!ctx || !name || !n) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_param_info: NULL argument");
    if (index < 0 || mesh__exec_param(ctx->ex, index, name, n, &w, &g) != 0)
        return mesh__fail(MESH_ERR_INVALID_ARG, "no parameter %d", index);
    *n = mesh__exec_param_numel(ctx->ex, index); /* the whole param's */
    return MESH_OK;
}

/* The index of the parameter called name, checking its (whole) size. */
static mesh_status find_param(mesh_context *ctx, const char *name, size_t n, int *index)
{
    const char *pn;
    size_t pnum;
    float *w, *g;
    if (!ctx || !name) return mesh__fail(MESH_ERR_INVALID_ARG, "NULL argument");
    for (int k = 0; mesh__exec_param(ctx->ex, k, &pn, &pnum, &w, &g) == 0; k++) {
        if (strcmp(pn, name) != 0) continue;
        pnum = mesh__exec_param_numel(ctx->ex, k);
        if (pnum != n)
            return mesh__fail(MESH_ERR_INVALID_ARG, "parameter '%s' has %zu elements, not %zu", name, pnum, n);
        *index = k;
        return MESH_OK;
    }
    return mesh__fail(MESH_ERR_INVALID_ARG, "no parameter '%s'", name);
}

mesh_status mesh_param_read(mesh_context *ctx, const char *name, float *out, size_t n)
{
    int k;
    mesh_status st = find_param(ctx, name, n, &k);
    if (st == MESH_OK && out && mesh__exec_param_get(ctx->ex, k, out) != 0)
        return mesh__fail(MESH_ERR_RANK, "%s", mesh__exec_error(ctx->ex));
    return st;
}

mesh_status mesh_param_write(mesh_context *ctx, const char *name, const float *in, size_t n)
{
    int k;
    mesh_status st = find_param(ctx, name, n, &k);
    if (st == MESH_OK && in) mesh__exec_param_set(ctx->ex, k, in);
    return st;
}

mesh_status mesh_checkpoint_save(mesh_context *ctx, const char *dir)
{
    return mesh_checkpoint_save_with(ctx, dir, NULL);
}

mesh_status mesh_checkpoint_save_with(mesh_context *ctx, const char *dir, const mesh_data *data)
{
    char err[600];
    uint64_t pos = 0;
    if (!ctx || !dir) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_checkpoint_save: NULL argument");
    if (data) mesh_data_tell(data, &pos);
    int rc = mesh__ckpt_save(ctx->ex, dir, ctx->step, data ? &pos : NULL, &ctx->ckpt_lock, err, sizeof err);
    if (rc != 0) return mesh__fail(rc == -2 ? MESH_ERR_RANK : MESH_ERR_IO, "%s", err);
    return MESH_OK;
}

mesh_status mesh_checkpoint_claim(mesh_context *ctx, const char *dir)
{
    char err[600];
    if (!ctx || !dir) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_checkpoint_claim: NULL argument");
    int rc = mesh__ckpt_claim(ctx->ex, dir, &ctx->ckpt_lock, err, sizeof err);
    if (rc != 0) return mesh__fail(rc == -2 ? MESH_ERR_RANK : MESH_ERR_IO, "%s", err);
    return MESH_OK;
}

mesh_status mesh_checkpoint_load(mesh_context *ctx, const char *path)
{
    return mesh_checkpoint_load_with(ctx, path, NULL);
}

mesh_status mesh_checkpoint_load_with(mesh_context *ctx, const char *path, mesh_data *data)
{
    char err[512];
    long long step = 0;
    uint64_t pos = 0;
    if (!ctx || !path) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_checkpoint_load: NULL argument");
    if (mesh__ckpt_load(ctx->ex, path, 1, &step, &pos, err, sizeof err) != 0)
        return mesh__fail(MESH_ERR_IO, "%s", err);
    ctx->step = step;
    if (data && pos == UINT64_MAX) { /* saved without a cursor: where `step` steps from the start are */
        const fe_setup *s = &ctx->plan->p.setup;
        pos = (uint64_t)step * (uint64_t)s->global_batch;
    }
    if (data) mesh_data_seek(data, pos);
    return MESH_OK;
}

mesh_status mesh_checkpoint_load_params(mesh_context *ctx, const char *path)
{
    char err[512];
    long long step = 0;
    if (!ctx || !path) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_checkpoint_load_params: NULL argument");
    if (mesh__ckpt_load(ctx->ex, path, 0, &step, NULL, err, sizeof err) != 0)
        return mesh__fail(MESH_ERR_IO, "%s", err);
    return MESH_OK;
}

/* ---- Sampling ----------------------------------------------------------- */

/* The logits after ids[0..n), in the executor's buffers (*row), and how
 * many of them are the model's vocabulary (*vocab). */
static mesh_status next_row(mesh_context *ctx, const int *ids, size_t n, const char *who, const float **row,
                            int *vocab)
{
    if (!ctx || !ids || n == 0) return mesh__fail(MESH_ERR_INVALID_ARG, "%s: NULL argument or no ids", who);
    if (ctx->plan->p.setup.tp > 1) return split_logits(who);
    mesh_status bad = mesh__check_ids(&ctx->plan->p, ids, n, who, "ids");
    if (bad != MESH_OK) return bad;
    size_t bt = mesh__exec_batch_tokens(ctx->ex);
    int32_t *in = malloc(bt * sizeof *in), *tg = malloc(bt * sizeof *tg);
    int vp = 0;
    int seq = (int)ctx->plan->p.setup.seq_len;
    if (in && tg) *row = mesh__next_logits(ctx->ex, (const int32_t *)ids, n, seq, in, tg, &vp);
    free(in);
    free(tg);
    if (!in || !tg) return mesh__fail(MESH_ERR_NOMEM, "out of memory");
    if (!*row) return mesh__fail(MESH_ERR_RANK, "%s: %s", who, mesh__exec_error(ctx->ex));
    *vocab = mesh__plan_vocab(&ctx->plan->p);
    if (*vocab <= 0 || *vocab > vp) *vocab = vp;
    return MESH_OK;
}

mesh_status mesh_next_logits(mesh_context *ctx, const int *ids, size_t n, float *logits, size_t vocab)
{
    const float *row;
    int real;
    if (!logits) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_next_logits: NULL argument");
    mesh_status st = next_row(ctx, ids, n, "mesh_next_logits", &row, &real);
    if (st != MESH_OK) return st;
    if (vocab != (size_t)real)
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_next_logits: the logits are %d floats, not %zu", real,
                          vocab);
    memcpy(logits, row, vocab * sizeof *logits);
    return MESH_OK;
}

mesh_status mesh_sample_next(mesh_context *ctx, const int *ids, size_t n, double temperature, uint64_t seed,
                             int *next)
{
    const float *row;
    int vocab;
    if (!next || !(temperature >= 0))
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_sample_next: NULL argument or a temperature below 0");
    mesh_status st = next_row(ctx, ids, n, "mesh_sample_next", &row, &vocab);
    if (st != MESH_OK) return st;
    /* one Philox draw per position, so a seed repeats its text */
    *next = mesh__sample_draw(row, vocab, temperature, mesh__init_key(seed, "meshrun sample"), n);
    return MESH_OK;
}

/* ---- Process settings --------------------------------------------------- */

static int threads_set; /* mesh_set_threads was called */

mesh_status mesh_set_threads(int n)
{
    if (n < 0) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_set_threads: %d threads", n);
    kcpu_set_threads(n);
    threads_set = 1;
    return MESH_OK;
}

void mesh__share_threads(int ranks)
{
    if (threads_set || ranks <= 1) return;
    int n = kcpu_threads_available() / ranks;
    kcpu_set_threads(n > 0 ? n : 1);
}

/* ---- The device --------------------------------------------------------- */

/* The process's device: settled by mesh_set_device, or by the first
 * mesh_device_info (a context's creation) as MESH_DEVICE_AUTO. */
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;
static int device_settled;
static mesh_device_kind device_chosen = MESH_DEVICE_CPU;
static char device_why[400]; /* mesh_device_info's reason */
static int device_auto;        /* the choice is MESH_DEVICE_AUTO's */

/* What `kind` gives: the GPU probe, then the choice (device.c); the
 * reason or the error in why. Called under device_lock. */
static mesh_status choose_device(mesh_device_kind kind, mesh_device_kind *chosen, char *why, size_t n)
{
    char reason[320] = "", name[256] = "";
    int gpu = 0;
    if (kind != MESH_DEVICE_CPU) gpu = dev_cuda_probe(reason, sizeof reason, name, sizeof name);
    return dev_choose(kind, gpu, gpu ? name : reason, chosen, why, n);
}

mesh_status mesh_set_device(mesh_device_kind kind)
{
    char why[sizeof device_why];
    mesh_device_kind chosen = MESH_DEVICE_CPU;
    pthread_mutex_lock(&device_lock);
    mesh_status st = choose_device(kind, &chosen, why, sizeof why);
    if (st == MESH_OK) {
        memcpy(device_why, why, sizeof why);
        device_chosen = chosen;
        device_auto = kind == MESH_DEVICE_AUTO;
        device_settled = 1;
    }
    pthread_mutex_unlock(&device_lock);
    return st == MESH_OK ? MESH_OK : mesh__fail(st, "%s", why);
}

/* Settles MESH_DEVICE_AUTO's choice if nothing has. Called under
 * device_lock. */
static void settle_device(void)
{
    if (device_settled) return;
    choose_device(MESH_DEVICE_AUTO, &device_chosen, device_why, sizeof device_why); /* (cannot fail) */
    device_auto = 1;
    device_settled = 1;
}

mesh_status mesh_device_info(mesh_device_kind *chosen, const char **why)
{
    pthread_mutex_lock(&device_lock);
    settle_device();
    if (chosen) *chosen = device_chosen;
    if (why) *why = device_why;
    pthread_mutex_unlock(&device_lock);
    return MESH_OK;
}

static int device_of(mesh_device_kind *kind, char *why, size_t n)
{
    pthread_mutex_lock(&device_lock);
    settle_device();
    *kind = device_chosen;
    snprintf(why, n, "%s", device_why);
    int by_auto = device_auto;
    pthread_mutex_unlock(&device_lock);
    return by_auto;
}

mesh_status mesh_context_device(const mesh_context *ctx, mesh_device_kind *kind, const char **why)
{
    if (!ctx) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_context_device: NULL context");
    if (kind) *kind = ctx->device;
    if (why) *why = ctx->device_why;
    return MESH_OK;
}
