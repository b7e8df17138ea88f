/* attention_cudnn_graph.cu — internal to kernels/cuda: the attention's operation
 * graphs described through cuDNN's backend API (cudnn_api.h), and their
 * plans; attention_cudnn.cu (which loads the library, keeps a context's
 * plans and runs them) says which graphs and why. Each call on a graph
 * after its first failure does nothing: the first failure is kept, in
 * cuDNN's words.
 */
#include <stdio.h>  /* defines: snprintf */
#include <string.h> /* defines: memset */

#include "attention_cudnn_graph.h"

typedef kcuda__cudnn_graph gb;
static kcdnn_api &cd = kcuda__cdnn;

void kcuda__cudnn_graph_free(kcuda__cudnn_graph *g)
{
    if (g->plan)
        cd.BackendDestroyDescriptor(g->plan);
    for (int j = g->nkeep - 1; j >= 0; j--)
        cd.BackendDestroyDescriptor(g->keep[j]);
    memset(g, 0, sizeof *g);
}

static void gb_fail(gb *g, kcdnn_status s, const char *what)
{
    if (g->why[0])
        return;
    char last[160] = "";
    cd.GetLastErrorString(last, sizeof last);
    snprintf(g->why, sizeof g->why, "%s: %s%s%s", what, cd.GetErrorString(s), last[0] ? ": " : "", last);
}

kcdnn_desc kcuda__cudnn_new(gb *g, int type)
{
    kcdnn_desc d = NULL;
    if (g->why[0])
        return NULL;
    if (g->nkeep == KCUDA__CUDNN_GRAPH_DESCS) {
        snprintf(g->why, sizeof g->why, "more than %d descriptors", KCUDA__CUDNN_GRAPH_DESCS);
        return NULL;
    }
    kcdnn_status s = cd.BackendCreateDescriptor(type, &d);
    if (s != KCDNN_STATUS_SUCCESS) {
        gb_fail(g, s, "cudnnBackendCreateDescriptor");
        return NULL;
    }
    g->keep[g->nkeep++] = d;
    return d;
}

void kcuda__cudnn_set(gb *g, kcdnn_desc d, int name, int type, int64_t n, const void *v)
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
    kcuda__cudnn_set(g, d, name, KCDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static void gb_int(gb *g, kcdnn_desc d, int name, int type, int v)
{
    kcuda__cudnn_set(g, d, name, type, 1, &v);
}

void kcuda__cudnn_fin(gb *g, kcdnn_desc d, const char *what)
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
    kcdnn_desc t = kcuda__cudnn_new(g, KCDNN_TENSOR_DESCRIPTOR);
    gb_int(g, t, KCDNN_ATTR_TENSOR_DATA_TYPE, KCDNN_TYPE_DATA_TYPE, dt);
    kcuda__cudnn_set(g, t, KCDNN_ATTR_TENSOR_DIMENSIONS, KCDNN_TYPE_INT64, 4, dims);
    kcuda__cudnn_set(g, t, KCDNN_ATTR_TENSOR_STRIDES, KCDNN_TYPE_INT64, 4, strides);
    kcuda__cudnn_set(g, t, KCDNN_ATTR_TENSOR_UNIQUE_ID, KCDNN_TYPE_INT64, 1, &uid);
    kcuda__cudnn_set(g, t, KCDNN_ATTR_TENSOR_BYTE_ALIGNMENT, KCDNN_TYPE_INT64, 1, &align);
    if (virt)
        kcuda__cudnn_set(g, t, KCDNN_ATTR_TENSOR_IS_VIRTUAL, KCDNN_TYPE_BOOLEAN, 1, &yes);
    if (by_value)
        kcuda__cudnn_set(g, t, KCDNN_ATTR_TENSOR_IS_BY_VALUE, KCDNN_TYPE_BOOLEAN, 1, &yes);
    kcuda__cudnn_fin(g, t, "a tensor");
    return t;
}

typedef kcuda__cudnn_shape gshape;

/* A by-value fp32 scalar (the scale, the mask's fill, one). */
static kcdnn_desc gb_scalar(gb *g, int64_t uid)
{
    return gb_tensor(g, uid, KCDNN_DATA_FLOAT, 1, 1, 1, 1, 1, 1, 1, 1, true);
}

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
    kcdnn_desc pw = kcuda__cudnn_new(g, KCDNN_POINTWISE_DESCRIPTOR);
    gb_int(g, pw, KCDNN_ATTR_POINTWISE_MODE, KCDNN_TYPE_POINTWISE_MODE, mode);
    gb_int(g, pw, KCDNN_ATTR_POINTWISE_MATH_PREC, KCDNN_TYPE_DATA_TYPE, prec);
    if (axis >= 0) {
        int64_t a = axis;
        kcuda__cudnn_set(g, pw, KCDNN_ATTR_POINTWISE_AXIS, KCDNN_TYPE_INT64, 1, &a);
    }
    kcuda__cudnn_fin(g, pw, "a pointwise descriptor");
    kcdnn_desc op = kcuda__cudnn_new(g, KCDNN_OPERATION_POINTWISE_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b)
        gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t)
        gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    const float one = 1.0f;
    kcuda__cudnn_set(g, op, KCDNN_ATTR_OPERATION_POINTWISE_ALPHA1, KCDNN_TYPE_FLOAT, 1, &one);
    kcuda__cudnn_set(g, op, KCDNN_ATTR_OPERATION_POINTWISE_ALPHA2, KCDNN_TYPE_FLOAT, 1, &one);
    kcuda__cudnn_fin(g, op, "a pointwise operation");
    ops[(*n)++] = op;
}

/* c = a b (batched over the first two dimensions, fp32 sums). */
static void gb_mm(gb *g, kcdnn_desc *ops, int *n, kcdnn_desc a, kcdnn_desc b, kcdnn_desc c)
{
    kcdnn_desc mm = kcuda__cudnn_new(g, KCDNN_MATMUL_DESCRIPTOR);
    gb_int(g, mm, KCDNN_ATTR_MATMUL_COMP_TYPE, KCDNN_TYPE_DATA_TYPE, KCDNN_DATA_FLOAT);
    kcuda__cudnn_fin(g, mm, "a matmul descriptor");
    kcdnn_desc op = kcuda__cudnn_new(g, KCDNN_OPERATION_MATMUL_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    kcuda__cudnn_fin(g, op, "a matmul operation");
    ops[(*n)++] = op;
}

/* y = x reduced (ADD or MAX) over the dimensions where y is smaller. */
static void gb_red(gb *g, kcdnn_desc *ops, int *n, int red, kcdnn_desc x, kcdnn_desc y)
{
    kcdnn_desc r = kcuda__cudnn_new(g, KCDNN_REDUCTION_DESCRIPTOR);
    gb_int(g, r, KCDNN_ATTR_REDUCTION_COMP_TYPE, KCDNN_TYPE_DATA_TYPE, KCDNN_DATA_FLOAT);
    gb_int(g, r, KCDNN_ATTR_REDUCTION_OPERATOR, KCDNN_TYPE_REDUCTION_OPERATOR_TYPE, red);
    kcuda__cudnn_fin(g, r, "a reduction descriptor");
    kcdnn_desc op = kcuda__cudnn_new(g, KCDNN_OPERATION_REDUCTION_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    kcuda__cudnn_fin(g, op, "a reduction operation");
    ops[(*n)++] = op;
}

/* y = x read through y's dimensions and strides (a transpose, as a view). */
static void gb_view(gb *g, kcdnn_desc *ops, int *n, kcdnn_desc x, kcdnn_desc y)
{
    kcdnn_desc op = kcuda__cudnn_new(g, KCDNN_OPERATION_RESHAPE_DESCRIPTOR);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    gb_desc(g, op, KCDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    kcuda__cudnn_fin(g, op, "a reshape operation");
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

/* The causal attention's forward (the binding's ids: Q, K, V, O, STATS,
 * SCALE, NEG_INF) into ops; returns how many. */
static int forward_graph(gb *g, const gshape &s, kcdnn_desc *ops)
{
    int n = 0, F = KCDNN_DATA_FLOAT;
    kcdnn_desc q = gb_q(g, s, KCUDA__CUDNN_UID_Q, s.qs), kt = gb_keys_t(g, s, KCUDA__CUDNN_UID_K);
    kcdnn_desc v = gb_kv(g, s, KCUDA__CUDNN_UID_V, s.io);
    kcdnn_desc o = gb_q(g, s, KCUDA__CUDNN_UID_O, s.H * s.d), lse = gb_rows(g, s, KCUDA__CUDNN_UID_STATS);
    kcdnn_desc scale = gb_scalar(g, KCUDA__CUDNN_UID_SCALE);
    kcdnn_desc fill = gb_scalar(g, KCUDA__CUDNN_UID_NEG_INF);
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

/* Its backward (Q, K, V, O, DO, STATS, DQ, DK, DV, SCALE, NEG_INF, ONE,
 * D, and DQ_ACC unless det) into ops; returns how many. */
static int backward_graph(gb *g, const gshape &s, bool det, kcdnn_desc *ops)
{
    int n = 0, F = KCDNN_DATA_FLOAT;
    kcdnn_desc q = gb_q(g, s, KCUDA__CUDNN_UID_Q, s.qs), kt = gb_keys_t(g, s, KCUDA__CUDNN_UID_K);
    kcdnn_desc vt = gb_keys_t(g, s, KCUDA__CUDNN_UID_V);
    kcdnn_desc o = gb_q(g, s, KCUDA__CUDNN_UID_O, s.H * s.d), dout = gb_q(g, s, KCUDA__CUDNN_UID_DO, s.H * s.d);
    kcdnn_desc lse = gb_rows(g, s, KCUDA__CUDNN_UID_STATS), D = gb_rows(g, s, KCUDA__CUDNN_UID_D);
    kcdnn_desc scale = gb_scalar(g, KCUDA__CUDNN_UID_SCALE);
    kcdnn_desc fill = gb_scalar(g, KCUDA__CUDNN_UID_NEG_INF);
    kcdnn_desc one = gb_scalar(g, KCUDA__CUDNN_UID_ONE);
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
    gb_grad_kv(g, ops, &n, s, pt, dout, KCUDA__CUDNN_UID_DV);
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
    gb_grad_kv(g, ops, &n, s, dst, q, KCUDA__CUDNN_UID_DK);
    /* dQ = dS K: into dQ (deterministic), or through fp32 */
    kcdnn_desc kn = gb_kv(g, s, 0, F);
    gb_view(g, ops, &n, kt, kn);
    kcdnn_desc dq = gb_q(g, s, KCUDA__CUDNN_UID_DQ, s.qs);
    if (det) {
        gb_mm(g, ops, &n, ds, kn, dq);
    } else {
        kcdnn_desc acc =
            gb_tensor(g, KCUDA__CUDNN_UID_DQ_ACC, F, s.B, s.H, s.T, s.d, s.H * s.T * s.d, s.T * s.d, s.d, 1);
        gb_mm(g, ops, &n, ds, kn, acc);
        gb_pw(g, ops, &n, KCDNN_POINTWISE_IDENTITY, F, acc, NULL, NULL, dq);
    }
    return n;
}

/* g's plan for ops: the heuristic's (mode A) first engine that builds. */
static void plan_of(gb *g, kcdnn_handle h, kcdnn_desc dev, kcdnn_desc *ops, int n)
{
    kcdnn_desc graph = kcuda__cudnn_new(g, KCDNN_OPERATIONGRAPH_DESCRIPTOR);
    kcuda__cudnn_set(g, graph, KCDNN_ATTR_OPERATIONGRAPH_OPS, KCDNN_TYPE_BACKEND_DESCRIPTOR, n, ops);
    if (h)
        kcuda__cudnn_set(g, graph, KCDNN_ATTR_OPERATIONGRAPH_HANDLE, KCDNN_TYPE_HANDLE, 1, &h);
    kcuda__cudnn_fin(g, graph, "the operation graph");
    kcdnn_desc heur = kcuda__cudnn_new(g, KCDNN_ENGINEHEUR_DESCRIPTOR);
    gb_desc(g, heur, KCDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    gb_int(g, heur, KCDNN_ATTR_ENGINEHEUR_MODE, KCDNN_TYPE_HEUR_MODE, KCDNN_HEUR_MODE_A);
    if (!h)
        gb_desc(g, heur, KCDNN_ATTR_ENGINEHEUR_DEVICEPROP, dev);
    kcuda__cudnn_fin(g, heur, "the heuristic");
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
        cfg[i] = kcuda__cudnn_new(g, KCDNN_ENGINECFG_DESCRIPTOR);
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
                                        &g->workspace);
        if (st == KCDNN_STATUS_SUCCESS) {
            g->plan = plan;
            return;
        }
        if (!h && st == KCDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER) { /* (no GPU to load it onto) */
            g->compiled = 1; /* (the workspace its engine config asks for) */
            if (cd.BackendGetAttribute(cfg[i], KCDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, KCDNN_TYPE_INT64, 1, &one,
                                       &g->workspace) != KCDNN_STATUS_SUCCESS)
                g->workspace = -1;
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

void kcuda__cudnn_build(kcuda__cudnn_graph *g, const kcuda__cudnn_shape &s, int bwd, bool det, kcdnn_handle h,
                        kcdnn_desc dev)
{
    g->uid = KCUDA__CUDNN_UID_VIRTUAL;
    kcdnn_desc ops[32];
    int n = bwd ? backward_graph(g, s, det, ops) : forward_graph(g, s, ops);
    plan_of(g, h, dev, ops, n);
}
