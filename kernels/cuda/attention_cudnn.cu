/* attention_cudnn.cu — the causal attention through cuDNN's fused flash
 * attention (host code only), where kcuda_ctx_set_attention_cudnn asks:
 * the same calls as attention.cu's kernels, the same layouts, the same lse.
 *
 * cuDNN is loaded at the context's first attention (dlopen: MESH_CUDNN_LIB,
 * else libcudnn.so.9; cudnn_api.h says why it is not linked). Each shape
 * gets its operation graph (attention_cudnn_graph.cu), described through the backend API as
 * cuDNN's own frontend describes scaled dot-product attention for a
 * causal mask on cuDNN 9 (its "composite" graphs, the ones every 9.x
 * takes):
 *   forward  S = Q K^T, times the scale, the keys after each query set to
 *            -inf (two index generators, a compare, a select), the row's
 *            max, exp(S - max), its sum, lse = max + log(sum) (our lse:
 *            [B,H,T] fp32), P = exp / sum rounded to 2 bytes, O = P V;
 *   backward D = rowsum(dO * O) (fp32, ours), P again from S and lse,
 *            dV = P^T dO, dP = dO V^T, dS = P (dP - D) scale, dK = dS^T Q,
 *            dQ = dS K: into an fp32 buffer then rounded (its sum in any
 *            order: MESH_DETERMINISTIC=0), or, by default, straight into
 *            dQ, which is how that frontend asks cuDNN for its
 *            deterministic algorithm. Grouped-query heads: dK and dV per
 *            query head, then summed over each group.
 * The heuristic's first engine that builds a plan is kept, with the plan,
 * per shape (KCUDA__CUDNN_PLANS of them, round-robin). Without a GPU,
 * kcuda_attention_cudnn_check asks cuDNN for the plans of a described
 * device.
 *
 * What cuDNN does not take, this file declines and attention.cu runs its
 * own kernels: fp32, a head size not a multiple of 8 or above 128, a
 * mask other than causal, rows not in 16-byte packs, T of 1, a backward
 * that adds to dq, dk or dv (cuDNN's overwrites them), cuDNN older than
 * 9.0 or one that its frontend refuses for this (9.10.0 and 9.10.1; up
 * to 9.15, a backward whose T is not a multiple of 128), and a shape
 * whose graph cuDNN refused (its words kept for kcuda_ctx_attention_cudnn).
 */
#include <dlfcn.h>   /* defines: dlopen, dlsym, dlerror */
#include <math.h>    /* defines: INFINITY, sqrtf */
#include <pthread.h> /* defines: pthread_once */
#include <stdio.h>   /* defines: snprintf */
#include <stdlib.h>  /* defines: getenv, calloc, free */
#include <string.h>  /* defines: memset, strcmp */

#include "attention_cudnn_graph.h" /* defines: kcuda__cudnn_graph, the graphs and their plans */
#include "attention_impl.h" /* defines: attn_args, kcuda__cudnn_forward, kcuda__cudnn_backward */
#include "kcuda_impl.h"

/* ---- the library, loaded once per process ----------------------------------- */

kcdnn_api kcuda__cdnn;
static kcdnn_api &cd = kcuda__cdnn;
static size_t cd_version;    /* cudnnGetVersion(): 91900 for 9.19.0 */
static char cd_missing[320]; /* why it did not load ("" if it did) */
static pthread_once_t cd_once = PTHREAD_ONCE_INIT;

static void cd_load(void)
{
    const char *env = getenv("MESH_CUDNN_LIB");
    const char *names[2] = {env && *env ? env : "libcudnn.so.9", "libcudnn_graph.so.9"};
    void *lib = NULL;
    char err[200] = "";
    for (int i = 0; i < (env && *env ? 1 : 2) && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && i == 0)
            snprintf(err, sizeof err, "%s", dlerror());
    }
    if (!lib) {
        snprintf(cd_missing, sizeof cd_missing, "no cuDNN (%s)", err);
        return;
    }
    static const char *const names_api[] = {KCDNN_NAMES};
    void **slot = (void **)&cd;
    for (size_t i = 0; i < sizeof names_api / sizeof *names_api; i++) {
        slot[i] = dlsym(lib, names_api[i]);
        if (!slot[i]) {
            snprintf(cd_missing, sizeof cd_missing, "cuDNN without %s (%s)", names_api[i], names[0]);
            return;
        }
    }
    cd_version = cd.GetVersion();
    if (cd_version < 90000 || cd_version >= 100000)
        snprintf(cd_missing, sizeof cd_missing, "cuDNN %zu: the graphs here are cuDNN 9's", cd_version);
    else if (cd_version == 91000 || cd_version == 91001)
        snprintf(cd_missing, sizeof cd_missing,
                 "cuDNN %zu.%zu.%zu: its attention has known bugs (9.10.0, 9.10.1)",
                 cd_version / 10000, cd_version / 100 % 100, cd_version % 100);
}

/* ---- a context's plans ------------------------------------------------------- */

#define KCUDA__CUDNN_PLANS 8

typedef struct cd_key {
    int bwd, dt, B, T, H, KV, d, det;
    long long qs, kvs;
} cd_key;

typedef struct cd_plan {
    cd_key key;
    int used;
    kcuda__cudnn_graph g; /* its plan: NULL if refused (why) */
    float scale, neg_inf, one; /* by value: read at execution */
} cd_plan;

struct kcuda__cudnn {
    kcdnn_handle h;
    cd_plan plans[KCUDA__CUDNN_PLANS];
    int next;
    kcuda_attention_cudnn_stats st;
};

void kcuda__cudnn_free(kcuda__cudnn *c)
{
    if (!c)
        return;
    for (int i = 0; i < KCUDA__CUDNN_PLANS; i++)
        kcuda__cudnn_graph_free(&c->plans[i].g);
    if (c->h)
        cd.Destroy(c->h);
    free(c);
}

/* ---- the context's side ---------------------------------------------------- */

void kcuda_ctx_set_attention_cudnn(kcuda_ctx *ctx, int on)
{
    if (ctx)
        ctx->attn_cudnn = on == 1 || on == 2 ? on : 0;
}

/* The context's cuDNN state, made (and the library loaded) at the first
 * use; its handle NULL, and why said, where there is no cuDNN. */
static kcuda__cudnn *cd_state(kcuda_ctx *ctx)
{
    pthread_once(&cd_once, cd_load);
    if (!ctx->cudnn) {
        kcuda__cudnn *c = (kcuda__cudnn *)calloc(1, sizeof *c);
        if (!c)
            return NULL;
        ctx->cudnn = c;
        kcdnn_status s = KCDNN_STATUS_SUCCESS;
        if (cd_missing[0])
            snprintf(c->st.why_declined, sizeof c->st.why_declined, "%s", cd_missing);
        else if ((s = cd.Create(&c->h)) != KCDNN_STATUS_SUCCESS) {
            c->h = NULL;
            snprintf(c->st.why_declined, sizeof c->st.why_declined, "cudnnCreate: %s", cd.GetErrorString(s));
        } else
            c->st.version = cd_version;
    }
    return ctx->cudnn;
}

static cd_plan *cd_build(kcuda__cudnn *c, const cd_key *k);

/* The plan for key k (built at its first use); NULL, the call counted as
 * declined, if cuDNN refused it. */
static cd_plan *cd_plan_for(kcuda__cudnn *c, const cd_key *k)
{
    cd_plan *p = NULL;
    for (int i = 0; i < KCUDA__CUDNN_PLANS && !p; i++)
        if (c->plans[i].used && memcmp(&c->plans[i].key, k, sizeof *k) == 0)
            p = &c->plans[i];
    if (!p)
        p = cd_build(c, k);
    if (!p || !p->g.plan) {
        c->st.declined[k->bwd]++;
        return NULL;
    }
    return p;
}

/* Builds key k's graph and plan into the next slot (its plan NULL and the
 * refusal kept if cuDNN refused it). */
static cd_plan *cd_build(kcuda__cudnn *c, const cd_key *k)
{
    kcuda__cudnn_shape s = {k->B, k->H, k->KV, k->T, k->d, k->qs, k->kvs,
                            k->dt == KCUDA_BF16 ? KCDNN_DATA_BFLOAT16 : KCDNN_DATA_HALF};
    cd_plan *p = &c->plans[c->next];
    c->next = (c->next + 1) % KCUDA__CUDNN_PLANS;
    if (p->used) /* evicted: the GPU may still run it */
        (void)cudaDeviceSynchronize();
    kcuda__cudnn_graph_free(&p->g);
    memset(p, 0, sizeof *p);
    p->used = 1;
    p->key = *k;
    p->scale = 1.0f / sqrtf((float)k->d); /* (attn_setup's a.scale) */
    p->neg_inf = cd_version >= 91000 ? -INFINITY : -FLT_MAX;
    p->one = 1.0f;
    kcuda__cudnn_graph *g = &p->g;
    kcuda__cudnn_build(g, s, k->bwd, k->det != 0, c->h, NULL);
    if (!g->plan) {
        c->st.refused++;
        snprintf(c->st.why, sizeof c->st.why, "%s %s B=%d T=%d H=%d KV=%d d=%d: %s",
                 k->bwd ? "backward" : "forward", k->dt == KCUDA_BF16 ? "bf16" : "fp16", k->B, k->T, k->H,
                 k->KV, k->d, g->why);
        return p;
    }
    c->st.plans++;
    return p;
}

/* Executes plan p on `stream` with the variant pack's n pointers (uids[i]
 * at ptrs[i]) and the plan's workspace. */
static int cd_run(kcuda__cudnn *c, cd_plan *p, int64_t *uids, void **ptrs, int n,
                  void *workspace, cudaStream_t stream)
{
    kcdnn_status s = cd.SetStream(c->h, stream);
    kcdnn_desc pack = NULL;
    if (s == KCDNN_STATUS_SUCCESS)
        s = cd.BackendCreateDescriptor(KCDNN_VARIANT_PACK_DESCRIPTOR, &pack);
    if (s == KCDNN_STATUS_SUCCESS)
        s = cd.BackendSetAttribute(pack, KCDNN_ATTR_VARIANT_PACK_WORKSPACE, KCDNN_TYPE_VOID_PTR, 1, &workspace);
    if (s == KCDNN_STATUS_SUCCESS)
        s = cd.BackendSetAttribute(pack, KCDNN_ATTR_VARIANT_PACK_DATA_POINTERS, KCDNN_TYPE_VOID_PTR, n, ptrs);
    if (s == KCDNN_STATUS_SUCCESS)
        s = cd.BackendSetAttribute(pack, KCDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, KCDNN_TYPE_INT64, n, uids);
    if (s == KCDNN_STATUS_SUCCESS)
        s = cd.BackendFinalize(pack);
    if (s == KCDNN_STATUS_SUCCESS)
        s = cd.BackendExecute(c->h, p->g.plan, pack);
    if (pack)
        cd.BackendDestroyDescriptor(pack);
    if (s != KCDNN_STATUS_SUCCESS) {
        char last[160] = "", fault[200] = "";
        cd.GetLastErrorString(last, sizeof last);
        return kcuda__fail(KCUDA_ERR_BLAS, __FILE__, __LINE__, "cuDNN's attention %s (B=%d T=%d H=%d): %s%s%s%s",
                           p->key.bwd ? "backward" : "forward", p->key.B, p->key.T, p->key.H, cd.GetErrorString(s),
                           last[0] ? ": " : "", last, kcuda__gpu_fault(stream, fault, sizeof fault));
    }
    return 0;
}

/* The context's cuDNN state when cuDNN may take a's call (bwd: the
 * backward's); else NULL, the call counted as declined and why kept. */
static kcuda__cudnn *cd_takes(kcuda_ctx *ctx, int bwd, const attn_args &a, kcuda_dtype dt)
{
    if (!ctx || !ctx->attn_cudnn)
        return NULL;
    kcuda__cudnn *c = cd_state(ctx);
    if (!c)
        return NULL;
    /* (a.vec: d, the rows and q, k, v and dout in 16-byte packs) */
    bool packs = a.vec && kcuda__aligned16(a.o, a.lse, a.dq, a.dk, a.dv) && kcuda__aligned16(a.out, a.lse_in);
    const char *no = !c->h                                     ? c->st.why_declined /* no cuDNN: it says why */
                     : dt == KCUDA_F32                         ? "fp32"
                     : a.d % 8 != 0 || a.d > 128               ? "a head size not a multiple of 8 up to 128"
                     : !a.causal                               ? "not causal"
                     : a.T < 2                                 ? "T below 2"
                     : !packs                                  ? "rows not in 16-byte packs"
                     : bwd && ctx->attn_cudnn == 2             ? "the forward only (the backward on ours)"
                     : bwd && a.assign != 7                    ? "a backward that adds to its gradients"
                     : bwd && cd_version <= 91500 && a.T % 128 ? "cuDNN up to 9.15: T not a multiple of 128"
                                                               : NULL;
    if (no) {
        c->st.declined[bwd]++;
        if (no != c->st.why_declined)
            snprintf(c->st.why_declined, sizeof c->st.why_declined, "%s", no);
        return NULL;
    }
    return c;
}

/* Key bwd's plan for a (det: the deterministic backward's). */
static cd_plan *cd_plan_of(kcuda__cudnn *c, int bwd, int det, const attn_args &a, kcuda_dtype dt)
{
    cd_key key = {bwd, (int)dt, a.B, a.T, a.H, a.KV, a.d, det, a.qs, a.ks};
    return cd_plan_for(c, &key);
}

int kcuda__cudnn_forward(kcuda_ctx *ctx, const attn_args &a, kcuda_dtype dt, cudaStream_t stream, int *taken)
{
    *taken = 0;
    kcuda__cudnn *c = cd_takes(ctx, 0, a, dt);
    cd_plan *p = c ? cd_plan_of(c, 0, 0, a, dt) : NULL;
    if (!p)
        return 0;
    void *ws = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, (size_t)p->g.workspace, &ws, stream));
    int64_t uids[] = {KCUDA__CUDNN_UID_Q,     KCUDA__CUDNN_UID_K,     KCUDA__CUDNN_UID_V,      KCUDA__CUDNN_UID_O,
                      KCUDA__CUDNN_UID_STATS, KCUDA__CUDNN_UID_SCALE, KCUDA__CUDNN_UID_NEG_INF};
    void *ptrs[] = {(void *)a.q, (void *)a.k, (void *)a.v, a.o, a.lse, &p->scale, &p->neg_inf};
    KCUDA_TRY(cd_run(c, p, uids, ptrs, 7, ws, stream));
    c->st.calls[0]++;
    *taken = 1;
    return 0;
}

int kcuda__cudnn_backward(kcuda_ctx *ctx, const attn_args &a, kcuda_dtype dt, cudaStream_t stream, int *taken)
{
    *taken = 0;
    kcuda__cudnn *c = cd_takes(ctx, 1, a, dt);
    /* deterministic unless the context allows dq's sums in any order */
    int det = ctx && ctx->dq_atomics != 1;
    cd_plan *p = c ? cd_plan_of(c, 1, det, a, dt) : NULL;
    if (!p)
        return 0;
    /* D [B, H, T] and (not det) dq's fp32 sums, then the plan's workspace */
    size_t dbytes = kcuda__round256((size_t)a.B * a.H * a.T * sizeof(float));
    size_t abytes = det ? 0 : kcuda__round256((size_t)a.B * a.H * a.T * a.d * sizeof(float));
    void *scratch = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, dbytes + abytes + (size_t)p->g.workspace, &scratch, stream));
    char *base = (char *)scratch;
    if (!det) /* (cuDNN 9.6 on is said to clear it itself; cheap either way) */
        KCUDA_CHECK(cudaMemsetAsync(base + dbytes, 0, abytes, stream));
    int64_t uids[] = {KCUDA__CUDNN_UID_Q,   KCUDA__CUDNN_UID_K,     KCUDA__CUDNN_UID_V,       KCUDA__CUDNN_UID_O,
                      KCUDA__CUDNN_UID_DO,  KCUDA__CUDNN_UID_STATS, KCUDA__CUDNN_UID_DQ,      KCUDA__CUDNN_UID_DK,
                      KCUDA__CUDNN_UID_DV,  KCUDA__CUDNN_UID_SCALE, KCUDA__CUDNN_UID_NEG_INF, KCUDA__CUDNN_UID_ONE,
                      KCUDA__CUDNN_UID_D,   KCUDA__CUDNN_UID_DQ_ACC};
    void *ptrs[] = {(void *)a.q, (void *)a.k, (void *)a.v, (void *)a.out, (void *)a.dout, (void *)a.lse_in,
                    a.dq, a.dk, a.dv, &p->scale, &p->neg_inf, &p->one, base, base + dbytes};
    KCUDA_TRY(cd_run(c, p, uids, ptrs, det ? 13 : 14, base + dbytes + abytes, stream));
    c->st.calls[1]++;
    *taken = 1;
    return 0;
}

/* kcuda_attention_cudnn_check's one graph (bwd: the backward's) on the
 * device that device_json describes: whether it built (or compiled and
 * failed only to load), its workspace, and else why. */
static int cd_check_one(const char *device_json, const kcuda__cudnn_shape &s, int bwd, bool det,
                        long long *workspace, char *why, size_t n)
{
    kcuda__cudnn_graph *g = (kcuda__cudnn_graph *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(why, n, "out of host memory");
        return 0;
    }
    kcdnn_desc dev = kcuda__cudnn_new(g, KCDNN_DEVICEPROP_DESCRIPTOR);
    kcuda__cudnn_set(g, dev, KCDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, KCDNN_TYPE_CHAR,
                     (int64_t)strlen(device_json) + 1, device_json);
    kcuda__cudnn_fin(g, dev, "the device's properties");
    kcuda__cudnn_build(g, s, bwd, det, NULL, dev);
    int ok = g->plan != NULL || g->compiled;
    *workspace = ok ? (long long)g->workspace : -1;
    if (!ok)
        snprintf(why, n, "%s: %s", bwd ? "backward" : "forward", g->why);
    kcuda__cudnn_graph_free(g);
    free(g);
    return ok;
}

int kcuda_attention_cudnn_check(const char *device_json, kcuda_dtype dt, int B, int T, int H, int KV, int d,
                                int deterministic, long long workspace[2], char *why, size_t n)
{
    char none[8];
    long long ws[2];
    if (!why || n == 0) {
        why = none;
        n = sizeof none;
    }
    why[0] = '\0';
    pthread_once(&cd_once, cd_load);
    if (cd_missing[0]) {
        snprintf(why, n, "%s", cd_missing);
        return -1;
    }
    if (dt == KCUDA_F32 || !device_json || B < 1 || T < 2 || H < 1 || KV < 1 || H % KV || d % 8 || d > 128) {
        snprintf(why, n, "not a shape the attention takes to cuDNN");
        return 0;
    }
    long long qs = (long long)(H + 2 * KV) * d; /* the packed layout's rows, the executor's */
    kcuda__cudnn_shape s = {B, H, KV, T, d, qs, qs, dt == KCUDA_BF16 ? KCDNN_DATA_BFLOAT16 : KCDNN_DATA_HALF};
    int built = cd_check_one(device_json, s, 0, false, &ws[0], why, n) &&
                cd_check_one(device_json, s, 1, deterministic != 0, &ws[1], why, n);
    if (workspace) {
        workspace[0] = ws[0];
        workspace[1] = built ? ws[1] : -1;
    }
    return built;
}

int kcuda_ctx_attention_cudnn(kcuda_ctx *ctx, kcuda_attention_cudnn_stats *st)
{
    if (!ctx || !st)
        return 0;
    memset(st, 0, sizeof *st);
    if (ctx->cudnn)
        *st = ctx->cudnn->st;
    return ctx->attn_cudnn;
}

void kcuda_attention_cudnn_describe(const kcuda_attention_cudnn_stats *st, char *buf, size_t n)
{
    if (!buf || n == 0)
        return;
    char ver[32] = "no cuDNN";
    if (st->version)
        snprintf(ver, sizeof ver, "cuDNN %zu.%zu.%zu", st->version / 10000, st->version / 100 % 100,
                 st->version % 100);
    int w = snprintf(buf, n,
                     "%s: %ld forward and %ld backward calls on it, %ld and %ld on ours; %d plans built, %d refused",
                     ver, st->calls[0], st->calls[1], st->declined[0], st->declined[1], st->plans, st->refused);
    if (w >= 0 && (size_t)w < n && st->why_declined[0])
        w += snprintf(buf + w, n - (size_t)w, "; ours because: %s", st->why_declined);
    if (w >= 0 && (size_t)w < n && st->why[0])
        snprintf(buf + w, n - (size_t)w, "; refused: %s", st->why);
}
