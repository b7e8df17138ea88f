/*
 * gpu_tests_layers.c: the ops around the products against kcpu's: the
 * norms (layernorm, rmsnorm, each fused with a residual add), the
 * activations (GELU, SiLU, SwiGLU), adds and their broadcasts, the rotary
 * embedding, the embeddings, and the conversions between types.
 */
#include <math.h>   /* defines: fabs */
#include <stdlib.h> /* defines: malloc, free */
#include <string.h> /* defines: memcpy, memcmp */

#include "gpu_tests.h"

/* ---- cases: norms ------------------------------------------------------- */

/* kcuda_rmsnorm_backward (rms; db and mean unused) or
 * kcuda_layernorm_backward, on the tests' context and the default stream. */
static void norm_bwd(int rms, void *dx, void *dw, void *db, const void *dout,
                     const void *x, const void *w, const float *mean,
                     const float *rstd, int rows, int C, kcuda_dtype dt,
                     kcuda_dtype wdt)
{
    if (rms)
        KC(kcuda_rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd, rows, C, dt,
                                  wdt, NULL));
    else
        KC(kcuda_layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd,
                                    rows, C, dt, wdt, NULL));
}

/* wdt: the type of the weight gradients (dt, or KCUDA_F32 beside 2-byte
 * tensors: fp32 main gradients). */
void norm_case(kcuda_dtype dt, kcuda_dtype wdt, int rows, int C,
                      int rms, int add)
{
    size_t n = (size_t)rows * C;
    float eps = 1e-5f;
    float *a = rnd(n, 2.0f, dt), *b = rnd(n, 1.0f, dt);
    float *w = rnd((size_t)C, 1.0f, dt), *bias = rnd((size_t)C, 0.5f, dt);
    float *x = a, *res = NULL;
    void *da = up(a, n, dt), *dbb = up(b, n, dt), *dw = up(w, (size_t)C, dt);
    void *dbias = up(bias, (size_t)C, dt), *dres = dmem(n * 4);
    if (add == 2) { /* a and b an element past a 16-byte boundary: loaded
                     * one by one, summed as with packs (the bits below) */
        float *a1 = hf(n + 1), *b1 = hf(n + 1);
        memcpy(a1 + 1, a, n * 4);
        memcpy(b1 + 1, b, n * 4);
        da = (char *)up(a1, n + 1, dt) + kcuda_dtype_size(dt);
        dbb = (char *)up(b1, n + 1, dt) + kcuda_dtype_size(dt);
    }
    void *dout = dmem(n * 4);
    float *dmean = dmem((size_t)rows * 4), *drstd = dmem((size_t)rows * 4);
    float *out = hf(n), *mean = hf((size_t)rows), *rstd = hf((size_t)rows);
    if (add) { /* the residual sum as stored */
        res = hf(n);
        kcpu_add_forward(res, a, b, n);
        if (dt != KCUDA_F32)
            kcpu_round(res, n, prec_of(dt));
        x = res;
    }
    if (rms) {
        if (add)
            KC(kcuda_add_rmsnorm_forward(dres, dout, drstd, da, dbb, dw, rows,
                                         C, eps, dt, NULL));
        else
            KC(kcuda_rmsnorm_forward(dout, drstd, da, dw, rows, C, eps, dt,
                                     NULL));
        kcpu_rmsnorm_forward(out, rstd, x, w, rows, C, eps);
    } else {
        if (add)
            KC(kcuda_add_layernorm_forward(dres, dout, dmean, drstd, da, dbb,
                                           dw, dbias, rows, C, eps, dt, NULL));
        else
            KC(kcuda_layernorm_forward(dout, dmean, drstd, da, dw, dbias, rows,
                                       C, eps, dt, NULL));
        kcpu_layernorm_forward(out, mean, rstd, x, w, bias, rows, C, eps);
        expect_dev("mean", dmean, mean, (size_t)rows, KCUDA_F32);
    }
    if (add)
        expect_dev("res", dres, res, n, dt);
    expect_dev("rstd", drstd, rstd, (size_t)rows, KCUDA_F32);
    expect_dev("out", dout, out, n, dt);
    if (add) { /* the bits of the add and the norm apart (the executor
                * fuses them: kern.add_norm_forward) */
        size_t es = kcuda_dtype_size(dt), rb = (size_t)rows * 4;
        void *sres = dmem(n * 4), *sout = dmem(n * 4);
        float *smean = dmem(rb), *srstd = dmem(rb);
        KC(kcuda_add_forward(sres, da, dbb, n, dt, NULL));
        if (rms)
            KC(kcuda_rmsnorm_forward(sout, srstd, sres, dw, rows, C, eps, dt,
                                     NULL));
        else
            KC(kcuda_layernorm_forward(sout, smean, srstd, sres, dw, dbias,
                                       rows, C, eps, dt, NULL));
        expect_bits("res, apart", snapshot(dres, n, dt),
                    snapshot(sres, n, dt), n * es);
        expect_bits("out, apart", snapshot(dout, n, dt),
                    snapshot(sout, n, dt), n * es);
        expect_bits("rstd, apart", snapshot(drstd, (size_t)rows, KCUDA_F32),
                    snapshot(srstd, (size_t)rows, KCUDA_F32), rb);
        if (!rms)
            expect_bits("mean, apart",
                        snapshot(dmean, (size_t)rows, KCUDA_F32),
                        snapshot(smean, (size_t)rows, KCUDA_F32), rb);
        return;
    }
    /* backward from the saved statistics, each implementation its own */
    float *g = rnd(n, 1.0f, dt), *gx = rnd(n, 0.5f, dt);
    float *gw = rnd((size_t)C, 0.5f, wdt), *gb = rnd((size_t)C, 0.5f, wdt);
    void *dg = up(g, n, dt), *dgx = up(gx, n, dt), *dgw = up(gw, (size_t)C, wdt);
    void *dgb = up(gb, (size_t)C, wdt);
    void *gw0 = snapshot(dgw, (size_t)C, wdt), *gx0 = snapshot(dgx, n, dt);
    norm_bwd(rms, dgx, dgw, dgb, dg, da, dw, dmean, drstd, rows, C, dt, wdt);
    if (cur_bad)
        return;
    if (rms)
        kcpu_rmsnorm_backward(gx, gw, g, x, w, rstd, rows, C);
    else
        kcpu_layernorm_backward(gx, gw, gb, g, x, w, mean, rstd, rows, C);
    expect_dev("dx", dgx, gx, n, dt);
    double keep = cur_tol;
    cur_tol = tol_of(wdt);
    if (!rms)
        expect_dev("db", dgb, gb, (size_t)C, wdt);
    expect_dev("dw", dgw, gw, (size_t)C, wdt);
    cur_tol = keep;
    /* the same call on the same inputs gives the same bits */
    void *first = snapshot(dgw, (size_t)C, wdt);
    cuda_or_die(cudaMemcpy(dgw, gw0, (size_t)C * kcuda_dtype_size(wdt),
                           cudaMemcpyHostToDevice), "upload");
    norm_bwd(rms, NULL, dgw, NULL, dg, da, dw, dmean, drstd, rows, C, dt, wdt);
    if (cur_bad)
        return;
    expect_bits("dw twice", snapshot(dgw, (size_t)C, wdt), first,
                (size_t)C * kcuda_dtype_size(wdt));
    /* dx alone, no weight gradient asked for (a kernel of its own) */
    cuda_or_die(cudaMemcpy(dgx, gx0, n * kcuda_dtype_size(dt),
                           cudaMemcpyHostToDevice), "upload");
    norm_bwd(rms, dgx, NULL, NULL, dg, da, dw, dmean, drstd, rows, C, dt, wdt);
    if (cur_bad)
        return;
    expect_dev("dx alone", dgx, gx, n, dt);
}

void t_layernorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 0, 0);
    norm_case(dt, dt, 300, 75, 0, 0); /* rows not in packs; two row chunks */
    norm_case(dt, dt, 130, 2048, 0, 0); /* three warps a block, three chunks */
    norm_case(dt, dt, 5, 6200, 0, 0);   /* too wide: dw, db in a pass of their own */
}

void t_rmsnorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 1, 0);
    norm_case(dt, dt, 300, 75, 1, 0);
    norm_case(dt, dt, 5, 6200, 1, 0); /* one warp a block */
    norm_case(dt, dt, 3, 12400, 1, 0); /* too wide: dw in a pass of its own */
}

/* 2-byte tensors with fp32 weight gradients (fp32 main gradients) */
void t_norm_f32_grads(kcuda_dtype dt)
{
    norm_case(dt, KCUDA_F32, 300, 75, 0, 0);
    norm_case(dt, KCUDA_F32, 700, 96, 1, 0); /* three row chunks */
}

void t_add_layernorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 0, 1);
    norm_case(dt, dt, 9, 75, 0, 1);
    norm_case(dt, dt, 9, 96, 0, 2);
}

void t_add_rmsnorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 1, 1);
    norm_case(dt, dt, 9, 75, 1, 1);
    norm_case(dt, dt, 9, 96, 1, 2);
}

/* ---- cases: elementwise ------------------------------------------------- */

void act_case(kcuda_dtype dt, int kind, size_t n, float scale)
{
    float *x = rnd(n, scale, dt), *u = rnd(n, 2.0f, dt), *y = hf(n);
    void *dx = up(x, n, dt), *du = up(u, n, dt), *dy = dmem(n * 4);
    if (kind == ACT_GELU) {
        KC(kcuda_gelu_forward(dy, dx, n, dt, NULL));
        kcpu_gelu_forward(y, x, n);
    } else if (kind == ACT_SILU) {
        KC(kcuda_silu_forward(dy, dx, n, dt, NULL));
        kcpu_silu_forward(y, x, n);
    } else {
        KC(kcuda_swiglu_forward(dy, dx, du, n, dt, NULL));
        kcpu_swiglu_forward(y, x, u, n);
    }
    expect_dev("out", dy, y, n, dt);
    float *g = rnd(n, 1.0f, dt), *gx = rnd(n, 0.5f, dt), *gu = rnd(n, 0.5f, dt);
    void *dg = up(g, n, dt), *dgx = up(gx, n, dt), *dgu = up(gu, n, dt);
    if (kind == ACT_GELU || kind == ACT_SILU) {
        /* added to; then overwritten (assign), from NaN: the gradient alone */
        for (int assign = 0; assign < 2; assign++) {
            if (assign) {
                expect_dev("dx", dgx, gx, n, dt);
                cuda_or_die(cudaMemset(dgx, 0xff, n * kcuda_dtype_size(dt)), "cudaMemset");
                memset(gx, 0, n * sizeof *gx);
            }
            if (kind == ACT_GELU)
                KC(kcuda_gelu_backward(dgx, dx, dg, n, assign, dt, NULL));
            else
                KC(kcuda_silu_backward(dgx, dx, dg, n, assign, dt, NULL));
            (kind == ACT_GELU ? kcpu_gelu_backward : kcpu_silu_backward)(gx, x, g, n);
        }
    } else {
        KC(kcuda_swiglu_backward(dgx, dgu, dg, dx, du, n, dt, NULL));
        kcpu_swiglu_backward(gx, gu, g, x, u, n);
        expect_dev("dup", dgu, gu, n, dt);
    }
    expect_dev("dx", dgx, gx, n, dt);
    /* in place: out aliases the input */
    KC(kcuda_gelu_forward(dx, dx, n, dt, NULL));
    kcpu_gelu_forward(x, x, n);
    expect_dev("in place", dx, x, n, dt);
}

void t_gelu(kcuda_dtype dt)
{
    act_case(dt, ACT_GELU, 1003, 4.0f);
    act_case(dt, ACT_GELU, 8, 4.0f);
    /* the far tails: below x = -10.07 e^(-2u) overflows fp32 (the
     * backward's e s must stay 1, not inf * 0) */
    act_case(dt, ACT_GELU, 1003, 40.0f);
}

void t_silu(kcuda_dtype dt)
{
    act_case(dt, ACT_SILU, 1003, 4.0f);
    act_case(dt, ACT_SILU, 1003, 200.0f); /* e^-x overflows below -88 */
}

void t_swiglu(kcuda_dtype dt)
{
    act_case(dt, ACT_SWIGLU, 1003, 4.0f);
    /* one gradient at a time */
    size_t n = 77;
    float *x = rnd(n, 3.0f, dt), *u = rnd(n, 2.0f, dt), *g = rnd(n, 1.0f, dt);
    float *gu = rnd(n, 0.5f, dt);
    void *dx = up(x, n, dt), *du = up(u, n, dt), *dg = up(g, n, dt);
    void *dgu = up(gu, n, dt);
    KC(kcuda_swiglu_backward(NULL, dgu, dg, dx, du, n, dt, NULL));
    kcpu_swiglu_backward(NULL, gu, g, x, u, n);
    expect_dev("dup only", dgu, gu, n, dt);
    float *gx = rnd(n, 0.5f, dt);
    void *dgx = up(gx, n, dt);
    KC(kcuda_swiglu_backward(dgx, NULL, dg, dx, du, n, dt, NULL));
    kcpu_swiglu_backward(gx, NULL, g, x, u, n);
    expect_dev("dgate only", dgx, gx, n, dt);
}

/* the broadcast add of p[T,C] onto x[B,T,C], forward and backward; pdt:
 * dp's type (dt, or KCUDA_F32 beside 2-byte tensors) */
static void bcast_case(kcuda_dtype dt, kcuda_dtype pdt, int B, int T, int C)
{
    size_t all = (size_t)B * T * C, tc = (size_t)T * C;
    float *x = rnd(all, 1.0f, dt), *p = rnd(tc, 1.0f, dt), *o = hf(all);
    void *dxx = up(x, all, dt), *dp = up(p, tc, dt), *dout = dmem(all * 4);
    KC(kcuda_add_broadcast_forward(dout, dxx, dp, B, T, C, dt, NULL));
    kcpu_add_broadcast_forward(o, x, p, B, T, C);
    expect_dev("broadcast out", dout, o, all, dt);
    float *gg = rnd(all, 1.0f, dt), *gx = rnd(all, 1.0f, dt);
    float *gp = rnd(tc, 1.0f, pdt);
    void *dgg = up(gg, all, dt), *dgx = up(gx, all, dt), *dgp = up(gp, tc, pdt);
    void *gp0 = snapshot(dgp, tc, pdt);
    KC(kcuda_add_broadcast_backward(ctx, dgx, dgp, dgg, B, T, C, dt, pdt, 0,
                                    NULL));
    kcpu_add_broadcast_backward(gx, gp, gg, B, T, C);
    expect_dev("broadcast da", dgx, gx, all, dt);
    /* da overwritten (assign): from NaN, dout itself */
    cuda_or_die(cudaMemset(dgx, 0xff, all * kcuda_dtype_size(dt)), "cudaMemset");
    KC(kcuda_add_broadcast_backward(ctx, dgx, NULL, dgg, B, T, C, dt, pdt, 1,
                                    NULL));
    expect_dev("broadcast da assigned", dgx, gg, all, dt);
    double keep = cur_tol;
    cur_tol = tol_of(pdt);
    expect_dev("broadcast dp", dgp, gp, tc, pdt);
    cur_tol = keep;
    /* the sums over b in a fixed order: the same bits again */
    void *first = snapshot(dgp, tc, pdt);
    cuda_or_die(cudaMemcpy(dgp, gp0, tc * kcuda_dtype_size(pdt),
                           cudaMemcpyHostToDevice), "upload");
    KC(kcuda_add_broadcast_backward(ctx, NULL, dgp, dgg, B, T, C, dt, pdt, 0,
                                    NULL));
    expect_bits("broadcast dp twice", snapshot(dgp, tc, pdt), first,
                tc * kcuda_dtype_size(pdt));
}

void t_add(kcuda_dtype dt)
{
    size_t n = 1003;
    float *a = rnd(n, 1.0f, dt), *b = rnd(n, 1.0f, dt), *y = hf(n);
    void *da = up(a, n, dt), *db = up(b, n, dt), *dy = dmem(n * 4);
    KC(kcuda_add_forward(dy, da, db, n, dt, NULL));
    kcpu_add_forward(y, a, b, n);
    expect_dev("out", dy, y, n, dt);
    float *g = rnd(n, 1.0f, dt), *ga = rnd(n, 1.0f, dt), *gb = rnd(n, 1.0f, dt);
    void *dg = up(g, n, dt), *dga = up(ga, n, dt), *dgb = up(gb, n, dt);
    KC(kcuda_add_backward(dga, dgb, dg, n, 0, dt, NULL));
    kcpu_add_backward(ga, gb, g, n);
    expect_dev("da", dga, ga, n, dt);
    expect_dev("db", dgb, gb, n, dt);
    /* one side overwritten (assign bit 0, then 1), from NaN: dout itself;
     * the other added to */
    for (int side = 0; side < 2; side++) {
        void *dset = side ? dgb : dga, *dadd = side ? dga : dgb;
        float *hadd = side ? ga : gb;
        cuda_or_die(cudaMemset(dset, 0xff, n * kcuda_dtype_size(dt)), "cudaMemset");
        KC(kcuda_add_backward(dga, dgb, dg, n, 1 << side, dt, NULL));
        kcpu_add_backward(hadd, NULL, g, n);
        expect_dev("assigned side", dset, g, n, dt);
        expect_dev("added side", dadd, hadd, n, dt);
        memcpy(side ? gb : ga, g, n * sizeof *g); /* (the device's, for the next side) */
    }
    /* both overwritten (assign 3), from NaN: dout itself in each */
    cuda_or_die(cudaMemset(dga, 0xff, n * kcuda_dtype_size(dt)), "cudaMemset");
    cuda_or_die(cudaMemset(dgb, 0xff, n * kcuda_dtype_size(dt)), "cudaMemset");
    KC(kcuda_add_backward(dga, dgb, dg, n, 3, dt, NULL));
    expect_dev("da, both assigned", dga, g, n, dt);
    expect_dev("db, both assigned", dgb, g, n, dt);
    /* broadcast (a position embedding; T = 1 is a bias) */
    bcast_case(dt, dt, 3, 5, 7);
    bcast_case(dt, dt, 3, 1, 7);
    bcast_case(dt, dt, 600, 1, 37); /* three row chunks of the bias's sums */
}

/* 2-byte tensors with an fp32 dp (a bias's or position embedding's fp32
 * main gradient) */
void t_bcast_f32_grads(kcuda_dtype dt)
{
    bcast_case(dt, KCUDA_F32, 3, 5, 7);
    bcast_case(dt, KCUDA_F32, 600, 1, 37);
}

/* ---- cases: rope -------------------------------------------------------- */

void t_rope(kcuda_dtype dt)
{
    int B = 2, T = 9, H = 3, d = 16, pos0 = 3;
    float theta = 10000.0f;
    size_t n = (size_t)B * T * H * d;
    float *x = rnd(n, 1.0f, dt), *y = hf(n);
    void *dx = up(x, n, dt), *dy = dmem(n * 4);
    KC(kcuda_rope_forward(dy, dx, B, T, H, d, theta, pos0, dt, NULL));
    kcpu_rope_forward(y, x, B, T, H, d, theta, pos0);
    expect_dev("out", dy, y, n, dt);
    float *g = rnd(n, 1.0f, dt), *gx = rnd(n, 1.0f, dt);
    void *dg = up(g, n, dt), *dgx = up(gx, n, dt);
    KC(kcuda_rope_backward(dgx, dg, B, T, H, d, theta, pos0, dt, NULL));
    kcpu_rope_backward(gx, g, B, T, H, d, theta, pos0);
    expect_dev("dx", dgx, gx, n, dt);
    KC(kcuda_rope_forward(dx, dx, B, T, H, d, theta, pos0, dt, NULL));
    expect_dev("in place", dx, y, n, dt);
}

/* ---- cases: embedding --------------------------------------------------- */

/* The table's gradient of tdt: dt, or fp32 beside 2-byte tensors (an fp32
 * main gradient: the CPU's bits, its sums in fp32 in the same order). */
void embed_case(kcuda_dtype dt, kcuda_dtype tdt, int n, int V, int C,
                       int row0, int rows)
{
    int32_t *ids = hmem((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++)
        ids[i] = i % 7 == 3 ? ids[i / 2] : irand(V); /* repeats */
    float *table = rnd((size_t)rows * C, 1.0f, dt), *out = hf((size_t)n * C);
    void *dids = up_i32(ids, (size_t)n), *dtab = up(table, (size_t)rows * C, dt);
    void *dout = dmem((size_t)n * C * 4);
    KC(kcuda_embedding_rows_forward(dout, dids, dtab, n, row0, rows, C, dt,
                                    NULL));
    kcpu_embedding_rows_forward(out, ids, table, n, row0, rows, C);
    expect_dev("out", dout, out, (size_t)n * C, dt);
    float *g = rnd((size_t)n * C, 1.0f, dt);
    float *gt = rnd((size_t)rows * C, 1.0f, tdt);
    void *dg = up(g, (size_t)n * C, dt), *dgt = up(gt, (size_t)rows * C, tdt);
    void *gt0 = snapshot(dgt, (size_t)rows * C, tdt);
    KC(kcuda_embedding_rows_backward(ctx, dgt, dg, dids, n, row0, rows, C, dt,
                                     tdt, NULL));
    kcpu_embedding_rows_backward(gt, g, ids, n, row0, rows, C);
    float *got = down(dgt, (size_t)rows * C, tdt);
    expect("dtable", got, gt, (size_t)rows * C);
    if (tdt == KCUDA_F32) /* the CPU's additions, in its order */
        expect_bits("dtable = kcpu's bits", got, gt, (size_t)rows * C * 4);
    void *first = snapshot(dgt, (size_t)rows * C, tdt);
    cuda_or_die(cudaMemcpy(dgt, gt0, (size_t)rows * C * kcuda_dtype_size(tdt),
                           cudaMemcpyHostToDevice), "upload");
    KC(kcuda_embedding_rows_backward(ctx, dgt, dg, dids, n, row0, rows, C, dt,
                                     tdt, NULL));
    expect_bits("dtable twice", snapshot(dgt, (size_t)rows * C, tdt), first,
                (size_t)rows * C * kcuda_dtype_size(tdt));
}

void t_embedding_f32_grads(kcuda_dtype dt)
{
    embed_case(dt, KCUDA_F32, 300, 40, 13, 0, 40);
    embed_case(dt, KCUDA_F32, 64, 30, 16, 8, 10);
    embed_case(dt, KCUDA_F32, 600, 5, 64, 0, 5); /* long runs, in packs: the CPU's bits */
}

void t_embedding(kcuda_dtype dt)
{
    embed_case(dt, dt, 50, 20, 24, 0, 20);
    embed_case(dt, dt, 300, 40, 13, 0, 40);
    embed_case(dt, dt, 64, 30, 16, 8, 10); /* a vocabulary shard */
    embed_case(dt, dt, 600, 5, 64, 0, 5);  /* long runs of one id, in packs */
    /* the plain entry points */
    int n = 33, V = 11, C = 8;
    int32_t *ids = hmem((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++)
        ids[i] = irand(V);
    float *table = rnd((size_t)V * C, 1.0f, dt), *out = hf((size_t)n * C);
    void *dids = up_i32(ids, (size_t)n), *dtab = up(table, (size_t)V * C, dt);
    void *dout = dmem((size_t)n * C * 4);
    KC(kcuda_embedding_forward(dout, dids, dtab, n, V, C, dt, NULL));
    kcpu_embedding_forward(out, ids, table, n, V, C);
    expect_dev("plain out", dout, out, (size_t)n * C, dt);
    float *g = rnd((size_t)n * C, 1.0f, dt), *gt = rnd((size_t)V * C, 1.0f, dt);
    void *dg = up(g, (size_t)n * C, dt), *dgt = up(gt, (size_t)V * C, dt);
    KC(kcuda_embedding_backward(ctx, dgt, dg, dids, n, V, C, dt, NULL));
    kcpu_embedding_backward(gt, g, ids, n, V, C);
    expect_dev("plain dtable", dgt, gt, (size_t)V * C, dt);
}

/* ---- cases: conversion ---------------------------------------------------- */

void t_convert(kcuda_dtype dt)
{
    (void)dt;
    size_t n = 1001;
    float *x = rnd(n, 3.0f, KCUDA_F32), *r = hf(n);
    memcpy(r, x, n * sizeof *r);
    kcpu_round(r, n, KCPU_BF16);
    void *d32 = up(x, n, KCUDA_F32), *d16 = dmem(n * 2), *back = dmem(n * 4);
    KC(kcuda_convert(d16, KCUDA_BF16, d32, KCUDA_F32, n, NULL));
    KC(kcuda_convert(back, KCUDA_F32, d16, KCUDA_BF16, n, NULL));
    expect_bits("fp32 -> bf16 -> fp32", down(back, n, KCUDA_F32), r, n * 4);
    /* fp16: kcpu_fp16_round's numbers (ties to even, subnormals, past 65504 infinity) */
    for (size_t i = 0; i < n; i++)
        x[i] *= i % 7 == 0 ? 3e4f : i % 7 == 1 ? 1e-6f : 1.0f;
    memcpy(r, x, n * sizeof *r);
    kcpu_round(r, n, KCPU_FP16);
    d32 = up(x, n, KCUDA_F32);
    KC(kcuda_convert(d16, KCUDA_F16, d32, KCUDA_F32, n, NULL));
    KC(kcuda_convert(back, KCUDA_F32, d16, KCUDA_F16, n, NULL));
    expect_bits("fp32 -> fp16 -> fp32", down(back, n, KCUDA_F32), r, n * 4);
}

/* kcuda_arange: the positions 0 .. n-1 an arange() gives (the executor's). */
void t_arange(kcuda_dtype dt)
{
    (void)dt;
    size_t n = 70001;
    int32_t *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++)
        want[i] = (int32_t)i;
    void *d = dmem(n * sizeof *want);
    KC(kcuda_arange((int32_t *)d, n, NULL));
    expect_bits("arange", down_raw(d, n * sizeof *want), want, n * sizeof *want);
    free(want);
}
