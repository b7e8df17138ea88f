/* attention_cudnn.cu — the causal attention through cuDNN's fused flash
 * attention (host code only), where kcuda_ctx_set_attention_cudnn asks:
 * the same calls as attention.cu's kernels, the same layouts, the same lse.
 *
 * cuDNN is loaded at the context's first attention (dlopen: MESH_CUDNN_LIB,
 * else libcudnn.so.9; cudnn_api.h says why it is not linked). Each shape
 * gets its operation graph, described through the backend API as
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
 * per shape (KCUDA__CUDNN_PLANS of them, round-robin).
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

#include "cudnn_api.h"
#include "kcuda_impl.h"

/* ---- the library, loaded once per process ----------------------------------- */

static kcdnn_api cd;
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
#define KCUDA__CUDNN_DESCS 112 /* descriptors a graph keeps: the backward's ~100 at most */

/* Unique ids of the tensors the caller binds (the rest, virtual, from 100). */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_SCALE, UID_NEG_INF, UID_ONE, UID_D, UID_DQ_ACC, UID_VIRTUAL = 100
};

typedef struct cd_key {
    int bwd, dt, B, T, H, KV, d, det;
    long long qs, kvs;
} cd_key;

typedef struct cd_plan {
    cd_key key;
    int used;
    kcdnn_desc plan; /* NULL: refused (why) */
    kcdnn_desc keep[KCUDA__CUDNN_DESCS];
    int nkeep;
    int64_t workspace; /* the plan's own */
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
    for (int i = 0; i < KCUDA__CUDNN_PLANS; i++) {
        cd_plan *p = &c->plans[i];
        if (p->plan)
            cd.BackendDestroyDescriptor(p->plan);
        for (int j = p->nkeep - 1; j >= 0; j--)
            cd.BackendDestroyDescriptor(p->keep[j]);
    }
    if (c->h)
        cd.Destroy(c->h);
    free(c);
}

/* ---- building a graph: every call's failure is the first one kept ------------ */

typedef struct gb {
    cd_plan *p;
    int64_t uid; /* the next virtual tensor's */
    char why[200];
    int compiled; /* device-less (gb_plan without a handle): an engine's
                     plan compiled and failed only to load, for want of a GPU */
} gb;

static void gb_fail(gb *g, kcdnn_status s, const char *what)
{
    if (g->why[0])
        return;
    char last[160] = "";
    cd.GetLastErrorString(last, sizeof last);
    snprintf(g->why, sizeof g->why, "%s: %s%s%s", what, cd.GetErrorString(s), last[0] ? ": " : "", last);
}

static kcdnn_desc gb_new(gb *g, int type)
{
    kcdnn_desc d = NULL;
    if (g->why[0])
        return NULL;
    if (g->p->nkeep == KCUDA__CUDNN_DESCS) {
        snprintf(g->why, sizeof g->why, "more than %d descriptors", KCUDA__CUDNN_DESCS);
        return NULL;
    }
    kcdnn_status s = cd.BackendCreateDescriptor(type, &d);
    if (s != KCDNN_STATUS_SUCCESS) {
        gb_fail(g, s, "cudnnBackendCreateDescriptor");
        return NULL;
    }
    g->p->keep[g->p->nkeep++] = d;
    return d;
}

static void gb_set(gb *g, kcdnn_desc d, int name, int type, int64_t n, const void *v)
{
    if (g->why[0])
        return;
    kcdnn_status s = cd.BackendSetAttribute(d, name, type, n, v);
    if (s != KCDNN_STATUS_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "cudnnBackendSetAttribute(%d)", name);
        gb_fail(g, s, what);
    }
}

static void gb_desc(gb *g, kcdnn_desc d, int name, kcdnn_desc v)
{
    gb_set(g, d, name, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static void gb_int(gb *g, kcdnn_desc d, int name, int type, int v)
{
    gb_set(g, d, name, type, 1, &v);
}

static void gb_fin(gb *g, kcdnn_desc d, const char *what)
{
    if (g->why[0])
        return;
    kcdnn_status s = cd.BackendFinalize(d);
    if (s != KCDNN_STATUS_SUCCESS)
        gb_fail(g, s, what);
}

/* A tensor [dims] with strides (elements); uid 0: a virtual one. */
static kcdnn_desc gb_tensor(gb *g, int64_t uid, int dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                            int64_t s0, int64_t s1, int64_t s2, int64_t s3, bool by_value = false)
{
    const int64_t dims[4] = {d0, d1, d2, d3}, strides[4] = {s0, s1, s2, s3}, align = 16;
    bool virt = uid == 0, yes = true;
    if (virt)
        uid = g->uid++;
    kcdnn_desc t = gb_new(g, KCDNN_TENSOR_DESCRIPTOR);
    gb_int(g, t, KCDNN_ATTR_TENSOR_DATA_TYPE, KCDNN_TYPE_DATA_TYPE, dt);
    gb_set(g, t, KCDNN_ATTR_TENSOR_DIMENSIONS, KCDNN_TYPE_INT64, 4, dims);
    gb_set(g, t, KCDNN_ATTR_TENSOR_STRIDES, KCDNN_TYPE_INT64, 4, strides);
    gb_set(g, t, KCDNN_ATTR_TENSOR_UNIQUE_ID, KCDNN_TYPE_INT64, 1, &uid);
    gb_set(g, t, KCDNN_ATTR_TENSOR_BYTE_ALIGNMENT, KCDNN_TYPE_INT64, 1, &align);
    if (virt)
        gb_set(g, t, KCDNN_ATTR_TENSOR_IS_VIRTUAL, KCDNN_TYPE_BOOLEAN, 1, &yes);
    if (by_value)
        gb_set(g, t, KCDNN_ATTR_TENSOR_IS_BY_VALUE, KCDNN_TYPE_BOOLEAN, 1, &yes);
    gb_fin(g, t, "a tensor");
    return t;
}

/* The shapes every graph uses. */
typedef struct gshape {
    int64_t B, H, KV, T, d, qs, kvs;
    int io; /* the 2-byte type */
} gshape;

/* A virtual [B, H, T, T] score-shaped tensor, or a row vector [B, H, T, 1]. */
static kcdnn_desc gb_scores(gb *g, const gshape &s, int dt)
{
    return gb_tensor(g, 0, dt, s.B, s.H, s.T, s.T, s.H * s.T * s.T, s.T * s.T, s.T, 1);
}

static kcdnn_desc gb_rows(gb *g, const gshape &s, int64_t uid)
{
    return gb_tensor(g, uid, KCDNN_DATA_FLOAT, s.B, s.H, s.T, 1, s.H * s.T, s.T, 1, 1);
}

/* Appends an operation: pointwise `mode` (y = x op b, or t ? x : b). */
static void gb_pw(gb *g, kcdnn_desc *ops, int *n, int mode, int prec, kcdnn_desc x, kcdnn_desc b,
                  kcdnn_desc t, kcdnn_desc y, int axis = -1)
{
    kcdnn_desc pw = gb_new(g, KCDNN_POINTWISE_DESCRIPTOR);
    gb_int(g, pw, KCDNN_ATTR_POINTWISE_MODE, KCDNN_TYPE_POINTWISE_MODE, mode);
    gb_int(g, pw, KCDNN_ATTR_POINTWISE_MATH_PREC, KCDNN_TYPE_DATA_TYPE, prec);
    if (axis >= 0) {
        int64_t a = axis;
        gb_set(g, pw, KCDNN_ATTR_POINTWISE_AXIS, KCDNN_TYPE_INT64, 1, &a);
    }
    gb_fin(g, pw, "a pointwise descriptor");
    kcdnn_desc op = gb_new(g, KCDNN_OPERATION_POINTWISE_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b)
        gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t)
        gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float one = 1.0f;
    gb_set(g, op, KCDNN_ATTR_OPERATION_POINTWISE_ALPHA1, KCDNN_TYPE_FLOAT, 1, &one);
    gb_set(g, op, KCDNN_ATTR_OPERATION_POINTWISE_ALPHA2, KCDNN_TYPE_FLOAT, 1, &one);
    gb_fin(g, op, "a pointwise operation");
    ops[(*n)++] = op;
}

/* c = a b (batched over the first two dimensions, fp32 sums). */
static void gb_mm(gb *g, kcdnn_desc *ops, int *n, kcdnn_desc a, kcdnn_desc b, kcdnn_desc c)
{
    kcdnn_desc mm = gb_new(g, KCDNN_MATMUL_DESCRIPTOR);
    gb_int(g, mm, KCDNN_ATTR_MATMUL_COMP_TYPE, KCDNN_TYPE_DATA_TYPE, KCDNN_DATA_FLOAT);
    gb_fin(g, mm, "a matmul descriptor");
    kcdnn_desc op = gb_new(g, KCDNN_OPERATION_MATMUL_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    gb_fin(g, op, "a matmul operation");
    ops[(*n)++] = op;
}

/* y = x reduced (ADD or MAX) over the dimensions where y is smaller. */
static void gb_red(gb *g, kcdnn_desc *ops, int *n, int red, kcdnn_desc x, kcdnn_desc y)
{
    kcdnn_desc r = gb_new(g, KCDNN_REDUCTION_DESCRIPTOR);
    gb_int(g, r, KCDNN_ATTR_REDUCTION_COMP_TYPE, KCDNN_TYPE_DATA_TYPE, KCDNN_DATA_FLOAT);
    gb_int(g, r, KCDNN_ATTR_REDUCTION_OPERATOR, KCDNN_TYPE_REDUCTION_OPERATOR_TYPE, red);
    gb_fin(g, r, "a reduction descriptor");
    kcdnn_desc op = gb_new(g, KCDNN_OPERATION_REDUCTION_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    gb_fin(g, op, "a reduction operation");
    ops[(*n)++] = op;
}

/* y = x read through y's dimensions and strides (a transpose, as a view). */
static void gb_view(gb *g, kcdnn_desc *ops, int *n, kcdnn_desc x, kcdnn_desc y)
{
    kcdnn_desc op = gb_new(g, KCDNN_OPERATION_RESHAPE_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    gb_fin(g, op, "a reshape operation");
    ops[(*n)++] = op;
}

/* The causal mask on scores x: y = x where the key is at or before the
 * query, else the fill (by value). */
static kcdnn_desc gb_causal(gb *g, kcdnn_desc *ops, int *n, const gshape &s, kcdnn_desc x, kcdnn_desc fill)
{
    kcdnn_desc row = gb_scores(g, s, KCDNN_DATA_INT32), col = gb_scores(g, s, KCDNN_DATA_INT32);
    kcdnn_desc keep = gb_scores(g, s, KCDNN_DATA_BOOLEAN), y = gb_scores(g, s, KCDNN_DATA_FLOAT);
    gb_pw(g, ops, n, KCDNN_POINTWISE_GEN_INDEX, KCDNN_DATA_FLOAT, x, NULL, NULL, row, 2);
    gb_pw(g, ops, n, KCDNN_POINTWISE_GEN_INDEX, KCDNN_DATA_FLOAT, x, NULL, NULL, col, 3);
    gb_pw(g, ops, n, KCDNN_POINTWISE_CMP_GE, KCDNN_DATA_BOOLEAN, row, col, NULL, keep);
    gb_pw(g, ops, n, KCDNN_POINTWISE_BINARY_SELECT, KCDNN_DATA_FLOAT, x, fill, keep, y);
    return y;
}

/* K^T (or V^T): the keys' [B, KV, d, T] view of their rows. */
static kcdnn_desc gb_keys_t(gb *g, const gshape &s, int64_t uid)
{
    return gb_tensor(g, uid, s.io, s.B, s.KV, s.d, s.T, s.T * s.kvs, s.d, 1, s.kvs);
}

/* Q, dQ ([B, H, T, d] in rows of qs), O, dO (rows of H d). */
static kcdnn_desc gb_q(gb *g, const gshape &s, int64_t uid, int64_t rs)
{
    return gb_tensor(g, uid, s.io, s.B, s.H, s.T, s.d, s.T * rs, s.d, rs, 1);
}

static kcdnn_desc gb_kv(gb *g, const gshape &s, int64_t uid, int dt)
{
    return gb_tensor(g, uid, dt, s.B, s.KV, s.T, s.d, s.T * s.kvs, s.d, s.kvs, 1);
}

static int gb_forward(gb *g, const gshape &s, kcdnn_desc *ops)
{
    int n = 0, F = KCDNN_DATA_FLOAT;
    kcdnn_desc q = gb_q(g, s, UID_Q, s.qs), kt = gb_keys_t(g, s, UID_K), v = gb_kv(g, s, UID_V, s.io);
    kcdnn_desc o = gb_q(g, s, UID_O, s.H * s.d), lse = gb_rows(g, s, UID_STATS);
    kcdnn_desc scale = gb_tensor(g, UID_SCALE, F, 1, 1, 1, 1, 1, 1, 1, 1, true);
    kcdnn_desc fill = gb_tensor(g, UID_NEG_INF, F, 1, 1, 1, 1, 1, 1, 1, 1, true);
    kcdnn_desc s0 = gb_scores(g, s, F), s1 = gb_scores(g, s, F);
    gb_mm(g, ops, &n, q, kt, s0);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_MUL, F, s0, scale, NULL, s1);
    kcdnn_desc s2 = gb_causal(g, ops, &n, s, s1, fill);
    kcdnn_desc m = gb_rows(g, s, 0), s3 = gb_scores(g, s, F), e = gb_scores(g, s, F);
    kcdnn_desc z = gb_rows(g, s, 0), lz = gb_rows(g, s, 0), p = gb_scores(g, s, s.io);
    gb_red(g, ops, &n, KCDNN_REDUCE_TENSOR_MAX, s2, m);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_SUB, F, s2, m, NULL, s3);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_EXP, F, s3, NULL, NULL, e);
    gb_red(g, ops, &n, KCDNN_REDUCE_TENSOR_ADD, e, z);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_LOG, F, z, NULL, NULL, lz);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_ADD, F, m, lz, NULL, lse);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_DIV, F, e, z, NULL, p);
    gb_mm(g, ops, &n, p, v, o);
    return n;
}

/* dK or dV = at b, summed over each group of query heads (KV < H). */
static void gb_grad_kv(gb *g, kcdnn_desc *ops, int *n, const gshape &s, kcdnn_desc at, kcdnn_desc b,
                       int64_t uid)
{
    kcdnn_desc out = gb_kv(g, s, uid, s.io);
    if (s.KV == s.H) {
        gb_mm(g, ops, n, at, b, out);
        return;
    }
    kcdnn_desc full = gb_tensor(g, 0, s.io, s.B, s.H, s.T, s.d, s.H * s.T * s.d, s.T * s.d, s.d, 1);
    gb_mm(g, ops, n, at, b, full);
    gb_red(g, ops, n, KCDNN_REDUCE_TENSOR_ADD, full, out);
}

static int gb_backward(gb *g, const gshape &s, bool det, kcdnn_desc *ops)
{
    int n = 0, F = KCDNN_DATA_FLOAT;
    kcdnn_desc q = gb_q(g, s, UID_Q, s.qs), kt = gb_keys_t(g, s, UID_K), vt = gb_keys_t(g, s, UID_V);
    kcdnn_desc o = gb_q(g, s, UID_O, s.H * s.d), dout = gb_q(g, s, UID_DO, s.H * s.d);
    kcdnn_desc lse = gb_rows(g, s, UID_STATS), D = gb_rows(g, s, UID_D);
    kcdnn_desc scale = gb_tensor(g, UID_SCALE, F, 1, 1, 1, 1, 1, 1, 1, 1, true);
    kcdnn_desc fill = gb_tensor(g, UID_NEG_INF, F, 1, 1, 1, 1, 1, 1, 1, 1, true);
    kcdnn_desc one = gb_tensor(g, UID_ONE, F, 1, 1, 1, 1, 1, 1, 1, 1, true);
    /* D = rowsum(dO * O) */
    kcdnn_desc doo = gb_tensor(g, 0, F, s.B, s.H, s.T, s.d, s.H * s.T * s.d, s.T * s.d, s.H * s.d, 1);
    kcdnn_desc rs = gb_rows(g, s, 0);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_MUL, F, dout, o, NULL, doo);
    gb_red(g, ops, &n, KCDNN_REDUCE_TENSOR_ADD, doo, rs);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_MUL, F, rs, one, NULL, D);
    /* P = exp(S scale - lse), masked */
    kcdnn_desc s0 = gb_scores(g, s, F), s1 = gb_scores(g, s, F), s2 = gb_scores(g, s, F);
    gb_mm(g, ops, &n, q, kt, s0);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_MUL, F, s0, scale, NULL, s1);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_SUB, F, s1, lse, NULL, s2);
    kcdnn_desc s3 = gb_causal(g, ops, &n, s, s2, fill), p = gb_scores(g, s, F);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_EXP, F, s3, NULL, NULL, p);
    /* dV = P^T dO */
    kcdnn_desc pt = gb_tensor(g, 0, s.io, s.B, s.H, s.T, s.T, s.H * s.T * s.T, s.T * s.T, 1, s.T);
    gb_view(g, ops, &n, p, pt);
    gb_grad_kv(g, ops, &n, s, pt, dout, UID_DV);
    /* dS = P (dO V^T - D) scale */
    kcdnn_desc dp = gb_scores(g, s, F), dp1 = gb_scores(g, s, F), ds0 = gb_scores(g, s, F);
    kcdnn_desc ds = gb_scores(g, s, F);
    gb_mm(g, ops, &n, dout, vt, dp);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_SUB, F, dp, D, NULL, dp1);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_MUL, F, dp1, p, NULL, ds0);
    gb_pw(g, ops, &n, KCDNN_POINTWISE_MUL, F, ds0, scale, NULL, ds);
    /* dK = dS^T Q */
    kcdnn_desc dst = gb_tensor(g, 0, s.io, s.B, s.H, s.T, s.T, s.H * s.T * s.T, s.T * s.T, 1, s.T);
    gb_view(g, ops, &n, ds, dst);
    gb_grad_kv(g, ops, &n, s, dst, q, UID_DK);
    /* dQ = dS K: into dQ (deterministic), or through fp32 */
    kcdnn_desc kn = gb_kv(g, s, 0, F);
    gb_view(g, ops, &n, kt, kn);
    kcdnn_desc dq = gb_q(g, s, UID_DQ, s.qs);
    if (det) {
        gb_mm(g, ops, &n, ds, kn, dq);
    } else {
        kcdnn_desc acc = gb_tensor(g, UID_DQ_ACC, F, s.B, s.H, s.T, s.d, s.H * s.T * s.d, s.T * s.d, s.d, 1);
        gb_mm(g, ops, &n, ds, kn, acc);
        gb_pw(g, ops, &n, KCDNN_POINTWISE_IDENTITY, F, acc, NULL, NULL, dq);
    }
    return n;
}

/* The graph's plan: the heuristic's (mode A) first engine that builds;
 * for handle h's GPU, or (h NULL) the device that the finalized device
 * properties dev describe (no GPU needed: kcuda_attention_cudnn_check). */
static void gb_plan(gb *g, kcdnn_handle h, kcdnn_desc dev, kcdnn_desc *ops, int n)
{
    kcdnn_desc graph = gb_new(g, KCDNN_OPERATIONGRAPH_DESCRIPTOR);
    gb_set(g, graph, KCDNN_ATTR_OPERATIONGRAPH_OPS, KCDNN_TYPE_BACKEND_DESCRIPTOR, n, ops);
    if (h)
        gb_set(g, graph, KCDNN_ATTR_OPERATIONGRAPH_HANDLE, KCDNN_TYPE_HANDLE, 1, &h);
    gb_fin(g, graph, "the operation graph");
    kcdnn_desc heur = gb_new(g, KCDNN_ENGINEHEUR_DESCRIPTOR);
    gb_desc(g, heur, KCDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    gb_int(g, heur, KCDNN_ATTR_ENGINEHEUR_MODE, KCDNN_TYPE_HEUR_MODE, KCDNN_HEUR_MODE_A);
    if (!h)
        gb_desc(g, heur, KCDNN_ATTR_ENGINEHEUR_DEVICEPROP, dev);
    gb_fin(g, heur, "the heuristic");
    if (g->why[0])
        return;
    int64_t count = 0;
    kcdnn_status st = cd.BackendGetAttribute(heur, KCDNN_ATTR_ENGINEHEUR_RESULTS, KCDNN_TYPE_BACKEND_DESCRIPTOR,
                                             0, &count, NULL);
    if (st != KCDNN_STATUS_SUCCESS) {
        gb_fail(g, st, "the heuristic's results");
        return;
    }
    if (count <= 0) {
        snprintf(g->why, sizeof g->why, "the heuristic offers no engine for the graph");
        return;
    }
    if (count > 8)
        count = 8;
    kcdnn_desc cfg[8];
    for (int64_t i = 0; i < count; i++)
        cfg[i] = gb_new(g, KCDNN_ENGINECFG_DESCRIPTOR);
    if (g->why[0])
        return;
    int64_t got = 0;
    st = cd.BackendGetAttribute(heur, KCDNN_ATTR_ENGINEHEUR_RESULTS, KCDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                cfg);
    if (st != KCDNN_STATUS_SUCCESS) {
        gb_fail(g, st, "the heuristic's results");
        return;
    }
    char first[200] = "";
    for (int64_t i = 0; i < got; i++) {
        kcdnn_desc plan = NULL;
        st = cd.BackendCreateDescriptor(KCDNN_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (st == KCDNN_STATUS_SUCCESS)
            st = h ? cd.BackendSetAttribute(plan, KCDNN_ATTR_EXECUTION_PLAN_HANDLE, KCDNN_TYPE_HANDLE, 1, &h)
                   : cd.BackendSetAttribute(plan, KCDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, KCDNN_TYPE_BACKEND_DESCRIPTOR,
                                            1, &dev);
        if (st == KCDNN_STATUS_SUCCESS)
            st = cd.BackendSetAttribute(plan, KCDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                        KCDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (st == KCDNN_STATUS_SUCCESS)
            st = cd.BackendFinalize(plan);
        int64_t one = 0;
        if (st == KCDNN_STATUS_SUCCESS)
            st = cd.BackendGetAttribute(plan, KCDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, KCDNN_TYPE_INT64, 1, &one,
                                        &g->p->workspace);
        if (st == KCDNN_STATUS_SUCCESS) {
            g->p->plan = plan;
            return;
        }
        if (!h && st == KCDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER) { /* (no GPU to load it onto) */
            g->compiled = 1; /* (the workspace its engine config asks for) */
            if (cd.BackendGetAttribute(cfg[i], KCDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, KCDNN_TYPE_INT64, 1, &one,
                                       &g->p->workspace) != KCDNN_STATUS_SUCCESS)
                g->p->workspace = -1;
            cd.BackendDestroyDescriptor(plan);
            return;
        }
        if (!first[0]) { /* the first engine's refusal says most */
            gb_fail(g, st, "the plan of the heuristic's first engine");
            snprintf(first, sizeof first, "%s", g->why);
            g->why[0] = '\0';
        }
        if (plan)
            cd.BackendDestroyDescriptor(plan);
    }
    snprintf(g->why, sizeof g->why, "no engine of %lld builds a plan; %s", (long long)got, first);
}

/* ---- the context's side ---------------------------------------------------- */

void kcuda_ctx_set_attention_cudnn(kcuda_ctx *ctx, int on)
{
    if (ctx)
        ctx->attn_cudnn = on == 1;
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

/* The plan for key k (built at its first use), its by-value scalars set;
 * NULL, the call counted as declined, if cuDNN refused it. */
static cd_plan *cd_plan_for(kcuda__cudnn *c, const cd_key *k)
{
    cd_plan *p = NULL;
    for (int i = 0; i < KCUDA__CUDNN_PLANS && !p; i++)
        if (c->plans[i].used && memcmp(&c->plans[i].key, k, sizeof *k) == 0)
            p = &c->plans[i];
    if (!p)
        p = cd_build(c, k);
    if (!p || !p->plan) {
        c->st.declined[k->bwd]++;
        return NULL;
    }
    p->scale = 1.0f / sqrtf((float)k->d);
    p->neg_inf = cd_version >= 91000 ? -INFINITY : -FLT_MAX;
    p->one = 1.0f;
    return p;
}

/* Builds key k's graph and plan into the next slot (p->plan NULL and the
 * refusal kept if cuDNN refused it). */
static cd_plan *cd_build(kcuda__cudnn *c, const cd_key *k)
{
    gshape s = {k->B, k->H, k->KV, k->T, k->d, k->qs, k->kvs,
                k->dt == KCUDA_BF16 ? KCDNN_DATA_BFLOAT16 : KCDNN_DATA_HALF};
    cd_plan *p = &c->plans[c->next];
    c->next = (c->next + 1) % KCUDA__CUDNN_PLANS;
    if (p->used) { /* evicted: the GPU may still run it */
        (void)cudaDeviceSynchronize();
        if (p->plan)
            cd.BackendDestroyDescriptor(p->plan);
        for (int j = p->nkeep - 1; j >= 0; j--)
            cd.BackendDestroyDescriptor(p->keep[j]);
    }
    memset(p, 0, sizeof *p);
    p->used = 1;
    p->key = *k;
    gb g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.uid = UID_VIRTUAL;
    kcdnn_desc ops[32];
    int n = k->bwd ? gb_backward(&g, s, k->det != 0, ops) : gb_forward(&g, s, ops);
    gb_plan(&g, c->h, NULL, ops, n);
    if (!p->plan) {
        c->st.refused++;
        snprintf(c->st.why, sizeof c->st.why, "%s %s B=%d T=%d H=%d KV=%d d=%d: %s",
                 k->bwd ? "backward" : "forward", k->dt == KCUDA_BF16 ? "bf16" : "fp16", k->B, k->T, k->H,
                 k->KV, k->d, g.why);
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
        s = cd.BackendExecute(c->h, p->plan, pack);
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

/* The context's cuDNN state when cuDNN may take the call; else NULL, the
 * call counted as declined and why kept. */
static kcuda__cudnn *cd_takes(kcuda_ctx *ctx, int bwd, int B, int T, int d, int causal, kcuda_dtype dt,
                              bool aligned, long long qs, long long kvs, int assign)
{
    if (!ctx || !ctx->attn_cudnn)
        return NULL;
    kcuda__cudnn *c = cd_state(ctx);
    if (!c)
        return NULL;
    const char *no = !c->h                                   ? NULL
                     : dt == KCUDA_F32                       ? "fp32"
                     : d % 8 != 0 || d > 128                 ? "a head size not a multiple of 8 up to 128"
                     : !causal                               ? "not causal"
                     : T < 2 || B < 1                        ? "T below 2"
                     : qs % 8 || kvs % 8 || !aligned         ? "rows not in 16-byte packs"
                     : bwd && assign != 7                    ? "a backward that adds to its gradients"
                     : bwd && cd_version <= 91500 && T % 128 ? "cuDNN up to 9.15: T not a multiple of 128"
                                                             : NULL;
    if (!c->h) { /* no cuDNN: why_declined says so */
        c->st.declined[bwd]++;
        return NULL;
    }
    if (no) {
        c->st.declined[bwd]++;
        snprintf(c->st.why_declined, sizeof c->st.why_declined, "%s", no);
        return NULL;
    }
    return c;
}

int kcuda__cudnn_forward(kcuda_ctx *ctx, int *taken, void *out, float *lse, const void *q, const void *k,
                         const void *v, long long qs, long long kvs, int B, int T, int H, int KV, int d,
                         int causal, kcuda_dtype dt, cudaStream_t stream)
{
    *taken = 0;
    kcuda__cudnn *c = cd_takes(ctx, 0, B, T, d, causal, dt, kcuda__aligned16(out, q, k, v), qs, kvs, 7);
    if (!c)
        return 0;
    cd_key key = {0, (int)dt, B, T, H, KV, d, 0, qs, kvs};
    cd_plan *p = cd_plan_for(c, &key);
    if (!p)
        return 0;
    void *ws = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, (size_t)p->workspace, &ws, stream));
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &p->scale, &p->neg_inf};
    KCUDA_TRY(cd_run(c, p, uids, ptrs, 7, ws, stream));
    c->st.calls[0]++;
    *taken = 1;
    return 0;
}

int kcuda__cudnn_backward(kcuda_ctx *ctx, int *taken, void *dq, void *dk, void *dv, const void *dout,
                          const void *out, const float *lse, const void *q, const void *k, const void *v,
                          long long qs, long long kvs, int B, int T, int H, int KV, int d, int causal,
                          int assign, kcuda_dtype dt, cudaStream_t stream)
{
    *taken = 0;
    bool al = kcuda__aligned16(dq, dk, dv, dout, out) && kcuda__aligned16(q, k, v, lse);
    kcuda__cudnn *c = cd_takes(ctx, 1, B, T, d, causal, dt, al, qs, kvs, assign);
    if (!c)
        return 0;
    /* deterministic unless the context allows dq's sums in any order */
    int det = ctx->dq_atomics != 1;
    cd_key key = {1, (int)dt, B, T, H, KV, d, det, qs, kvs};
    cd_plan *p = cd_plan_for(c, &key);
    if (!p)
        return 0;
    /* D [B, H, T] and (not det) dq's fp32 sums, then the plan's workspace */
    size_t dbytes = kcuda__round256((size_t)B * H * T * sizeof(float));
    size_t abytes = det ? 0 : kcuda__round256((size_t)B * H * T * d * sizeof(float));
    void *scratch = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, dbytes + abytes + (size_t)p->workspace, &scratch, stream));
    char *base = (char *)scratch;
    if (!det) /* (cuDNN 9.6 on is said to clear it itself; cheap either way) */
        KCUDA_CHECK(cudaMemsetAsync(base + dbytes, 0, abytes, stream));
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV,
                      UID_SCALE, UID_NEG_INF, UID_ONE, UID_D, UID_DQ_ACC};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, (void *)out, (void *)dout, (void *)lse, dq, dk, dv,
                    &p->scale, &p->neg_inf, &p->one, base, base + dbytes};
    KCUDA_TRY(cd_run(c, p, uids, ptrs, det ? 13 : 14, base + dbytes + abytes, stream));
    c->st.calls[1]++;
    *taken = 1;
    return 0;
}

/* Frees a plan slot's descriptors. */
static void cd_drop(cd_plan *p)
{
    if (p->plan)
        cd.BackendDestroyDescriptor(p->plan);
    for (int j = p->nkeep - 1; j >= 0; j--)
        cd.BackendDestroyDescriptor(p->keep[j]);
    memset(p, 0, sizeof *p);
}

int kcuda_attention_cudnn_check(const char *device_json, kcuda_dtype dt, int B, int T, int H, int KV, int d,
                                int deterministic, long long workspace[2], char *why, size_t n)
{
    pthread_once(&cd_once, cd_load);
    if (why && n)
        why[0] = '\0';
    if (cd_missing[0]) {
        if (why && n)
            snprintf(why, n, "%s", cd_missing);
        return -1;
    }
    if (dt == KCUDA_F32 || !device_json || B < 1 || T < 2 || H < 1 || KV < 1 || H % KV || d % 8 || d > 128) {
        if (why && n)
            snprintf(why, n, "not a shape the attention takes to cuDNN");
        return 0;
    }
    /* the device, from its description */
    cd_plan p;
    memset(&p, 0, sizeof p);
    gb g;
    memset(&g, 0, sizeof g);
    g.p = &p;
    g.uid = UID_VIRTUAL;
    kcdnn_desc dev = gb_new(&g, KCDNN_DEVICEPROP_DESCRIPTOR);
    gb_set(&g, dev, KCDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, KCDNN_TYPE_CHAR, (int64_t)strlen(device_json) + 1,
           device_json);
    gb_fin(&g, dev, "the device's properties");
    int built = 0;
    long long qs = (long long)(H + 2 * KV) * d; /* the packed layout's rows, the executor's */
    for (int bwd = 0; bwd < 2 && !g.why[0]; bwd++) {
        cd_key k = {bwd, (int)dt, B, T, H, KV, d, bwd && deterministic, qs, qs};
        gshape s = {B, H, KV, T, d, qs, qs, dt == KCUDA_BF16 ? KCDNN_DATA_BFLOAT16 : KCDNN_DATA_HALF};
        kcdnn_desc ops[32];
        int nops = bwd ? gb_backward(&g, s, k.det != 0, ops) : gb_forward(&g, s, ops);
        gb_plan(&g, NULL, dev, ops, nops);
        if (g.why[0] && why && n)
            snprintf(why, n, "%s: %s", bwd ? "backward" : "forward", g.why);
        built += p.plan != NULL || g.compiled;
        if (workspace)
            workspace[bwd] = p.plan || g.compiled ? (long long)p.workspace : -1;
        g.compiled = 0;
        if (p.plan) { /* (keep the device's descriptor, drop the rest) */
            cd.BackendDestroyDescriptor(p.plan);
            p.plan = NULL;
        }
        while (p.nkeep > 1)
            cd.BackendDestroyDescriptor(p.keep[--p.nkeep]);
    }
    cd_drop(&p);
    return built == 2;
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
    int w = snprintf(buf, n, "%s: %ld forward and %ld backward calls on it, %ld and %ld on ours; %d plans built, %d refused",
                     ver, st->calls[0], st->calls[1], st->declined[0], st->declined[1], st->plans, st->refused);
    if (w >= 0 && (size_t)w < n && st->why_declined[0])
        w += snprintf(buf + w, n - (size_t)w, "; ours because: %s", st->why_declined);
    if (w >= 0 && (size_t)w < n && st->why[0])
        snprintf(buf + w, n - (size_t)w, "; refused: %s", st->why);
}
