/*
 * gpu_tests_attention.c: the attention (kcuda_attention_*) against
 * kcpu's: forward and backward, causal or not, grouped-query heads, the
 * packed qkv, every layout and determinism mode (dq by its own kernel, by
 * atomics in any order or in turns; Hopper's wgmma where the GPU has it),
 * TF32 in fp32, and cuDNN's fused kernels (kcuda_ctx_set_attention_cudnn).
 */
#include <math.h>   /* defines: fabs, INFINITY */
#include <stdlib.h> /* defines: setenv, unsetenv */
#include <string.h> /* defines: memcpy, memcmp, strstr */

#include "gpu_tests.h"

/* ---- cases: attention ----------------------------------------------------- */

/* The context's kcuda_ctx_set_deterministic mode (attention_mode). */
static int attn_mode = 1;

/* The forward on the GPU into out and lse: from the packed qkv, or
 * (qkv NULL) from q, k and v. */
static void attn_fwd_on_gpu(void *out, float *lse, const void *qkv, const void *q, const void *k,
                            const void *v, int B, int T, int H, int KV, int d, int causal, kcuda_dtype dt)
{
    if (qkv)
        KC(kcuda_attention_qkv_forward(ctx, out, lse, qkv, B, T, H, KV, d, causal, dt, NULL));
    else
        KC(kcuda_attention_forward(ctx, out, lse, q, k, v, B, T, H, KV, d, causal, dt, NULL));
}

static void attn_case_checks(kcuda_dtype dt, int B, int T, int H, int KV, int d, int causal, int packed);

/* The attention's checks on a shape (attn_case_checks), rel_err's floor
 * put back after them. */
void attn_case(kcuda_dtype dt, int B, int T, int H, int KV, int d,
                      int causal, int packed)
{
    attn_case_checks(dt, B, T, H, KV, d, causal, packed);
    cur_floor = 0.0;
}

static void attn_case_checks(kcuda_dtype dt, int B, int T, int H, int KV, int d, int causal, int packed)
{
    size_t nq = (size_t)B * T * H * d, nkv = (size_t)B * T * KV * d;
    size_t nl = (size_t)B * H * T, row = (size_t)(H + 2 * KV) * d;
    size_t nqkv = (size_t)B * T * row;
    const float in_scale = 1.5f, dout_scale = 1.0f; /* q, k, v's and dout's bounds */
    float *qkv = rnd(nqkv, in_scale, dt);
    float *q = hf(nq), *k = hf(nkv), *v = hf(nkv);
    for (size_t bt = 0; bt < (size_t)B * T; bt++) { /* the three slices */
        memcpy(q + bt * H * d, qkv + bt * row, (size_t)H * d * 4);
        memcpy(k + bt * KV * d, qkv + bt * row + (size_t)H * d, (size_t)KV * d * 4);
        memcpy(v + bt * KV * d, qkv + bt * row + (size_t)(H + KV) * d,
               (size_t)KV * d * 4);
    }
    float *out = hf(nq), *lse = hf(nl);
    void *dq = up(q, nq, dt), *dk = up(k, nkv, dt), *dv = up(v, nkv, dt);
    void *dqkv = up(qkv, nqkv, dt), *dout = dmem(nq * 4);
    float *dlse = dmem(nl * 4);
    if (packed) {
        KC(kcuda_attention_qkv_forward(ctx, dout, dlse, dqkv, B, T, H, KV, d,
                                       causal, dt, NULL));
        kcpu_attention_qkv_forward(out, lse, qkv, B, T, H, KV, d, causal);
    } else {
        KC(kcuda_attention_forward(ctx, dout, dlse, dq, dk, dv, B, T, H, KV, d,
                                   causal, dt, NULL));
        kcpu_attention_forward(out, lse, q, k, v, B, T, H, KV, d, causal);
    }
    expect_dev("out", dout, out, nq, dt);
    expect_dev("lse", dlse, lse, nl, KCUDA_F32);
    /* 2-byte types: blocks of 64 and of 128 query rows give the same bits
     * (kcuda_attention_forward_rows) */
    for (int rows = 64; dt != KCUDA_F32 && rows <= 128; rows += 64) {
        void *o2 = dmem(nq * 4);
        float *l2 = dmem(nl * 4);
        kcuda_attention_forward_rows(rows);
        attn_fwd_on_gpu(o2, l2, packed ? dqkv : NULL, dq, dk, dv, B, T, H, KV, d, causal, dt);
        kcuda_attention_forward_rows(0);
        if (cur_bad)
            return;
        expect_bits(rows == 64 ? "out, 64 rows a block" : "out, 128 rows a block",
                    snapshot(o2, nq, dt), snapshot(dout, nq, dt),
                    nq * kcuda_dtype_size(dt));
        expect_bits("lse, either block", snapshot(l2, nl, KCUDA_F32),
                    snapshot(dlse, nl, KCUDA_F32), nl * 4);
    }
    /* 2-byte types: the forward on warpgroup products (kcuda_attention_wgmma),
     * within the same tolerance of the CPU (its products' internal order
     * may differ from mma.sync's) */
    if (dt != KCUDA_F32 && kcuda_attention_wgmma(1)) {
        void *o3 = dmem(nq * 4);
        float *l3 = dmem(nl * 4);
        attn_fwd_on_gpu(o3, l3, packed ? dqkv : NULL, dq, dk, dv, B, T, H, KV, d, causal, dt);
        kcuda_attention_wgmma(0);
        if (cur_bad)
            return;
        expect_dev("out, wgmma", o3, out, nq, dt);
        expect_dev("lse, wgmma", l3, lse, nl, KCUDA_F32);
        /* the emulation sums a warpgroup's product in mma.sync's order,
         * so there the bits are the default's: a tile's P V added to the
         * wrong tile's rows, or rescaled on the wrong side of the next
         * tile's max, shows here even where it stays within tolerance */
        if (emulated()) {
            expect_bits("out, wgmma = mma.sync (emulation)", snapshot(o3, nq, dt), snapshot(dout, nq, dt),
                        nq * kcuda_dtype_size(dt));
            expect_bits("lse, wgmma = mma.sync (emulation)", snapshot(l3, nl, KCUDA_F32),
                        snapshot(dlse, nl, KCUDA_F32), nl * 4);
        }
    }
    kcuda_attention_wgmma(0);
    /* backward: each side from its own forward. dq and dk are sums of
     * terms p (dp - D) k scale that cancel where a row sees few keys (at
     * T 1, to 0 but for rounding: 1e-8 on the CPU, other 1e-8 here): their
     * error is against the terms' scale, |dout| |v| |k|, a thousandth of
     * it, where the result is smaller (cur_floor) */
    float *g = rnd(nq, dout_scale, dt);
    cur_floor = 1e-3 * dout_scale * in_scale * in_scale;
    void *dg = up(g, nq, dt);
    if (packed) {
        float *gqkv = rnd(nqkv, 0.5f, dt);
        void *dgqkv = up(gqkv, nqkv, dt);
        void *g0 = snapshot(dgqkv, nqkv, dt);
        KC(kcuda_attention_qkv_backward(ctx, dgqkv, dg, dout, dlse, dqkv, B, T,
                                        H, KV, d, causal, 0, dt, NULL));
        kcpu_attention_qkv_backward(gqkv, g, out, lse, qkv, B, T, H, KV, d,
                                    causal);
        expect_dev("dqkv", dgqkv, gqkv, nqkv, dt);
        /* overwritten (assign), from NaN: every element written once */
        float *zq = hf(nqkv);
        void *dset = dmem(nqkv * kcuda_dtype_size(dt));
        cuda_or_die(cudaMemset(dset, 0xff, nqkv * kcuda_dtype_size(dt)), "cudaMemset");
        KC(kcuda_attention_qkv_backward(ctx, dset, dg, dout, dlse, dqkv, B, T,
                                        H, KV, d, causal, 1, dt, NULL));
        kcpu_attention_qkv_backward(zq, g, out, lse, qkv, B, T, H, KV, d,
                                    causal);
        expect_dev("dqkv assigned", dset, zq, nqkv, dt);
        void *first = snapshot(dgqkv, nqkv, dt);
        cuda_or_die(cudaMemcpy(dgqkv, g0, nqkv * kcuda_dtype_size(dt),
                               cudaMemcpyHostToDevice), "upload");
        KC(kcuda_attention_qkv_backward(ctx, dgqkv, dg, dout, dlse, dqkv, B, T,
                                        H, KV, d, causal, 0, dt, NULL));
        expect_bits("dqkv twice", snapshot(dgqkv, nqkv, dt), first,
                    nqkv * kcuda_dtype_size(dt));
        return;
    }
    float *gq = rnd(nq, 0.5f, dt), *gk = rnd(nkv, 0.5f, dt);
    float *gv = rnd(nkv, 0.5f, dt);
    void *dgq = up(gq, nq, dt), *dgk = up(gk, nkv, dt), *dgv = up(gv, nkv, dt);
    /* added to; then (assign bit 1) dk overwritten, from NaN, and dq, dv
     * added to again; then, with three key tiles or more (before, any
     * order of the sums over them gives the same bits), that call again
     * on the same dq: the same bits (in turns, or dq's own kernel) */
    void *q0 = NULL;
    for (int assign = 0; assign <= 2; assign += 2) {
        if (assign) {
            cuda_or_die(cudaMemset(dgk, 0xff, nkv * kcuda_dtype_size(dt)), "cudaMemset");
            memset(gk, 0, nkv * sizeof *gk);
            q0 = snapshot(dgq, nq, dt);
        }
        KC(kcuda_attention_backward(ctx, dgq, dgk, dgv, dg, dout, dlse, dq, dk,
                                    dv, B, T, H, KV, d, causal, assign, dt,
                                    NULL));
        kcpu_attention_backward(gq, gk, gv, g, out, lse, q, k, v, B, T, H, KV,
                                d, causal);
        expect_dev("dq", dgq, gq, nq, dt);
        expect_dev(assign ? "dk assigned" : "dk", dgk, gk, nkv, dt);
        expect_dev("dv", dgv, gv, nkv, dt);
    }
    if (attn_mode != 0 && T > 128) {
        void *first = snapshot(dgq, nq, dt);
        cuda_or_die(cudaMemcpy(dgq, q0, nq * kcuda_dtype_size(dt), cudaMemcpyHostToDevice), "upload");
        KC(kcuda_attention_backward(ctx, dgq, dgk, dgv, dg, dout, dlse, dq, dk, dv, B, T, H, KV, d, causal, 2,
                                    dt, NULL));
        expect_bits("dq twice", snapshot(dgq, nq, dt), first, nq * kcuda_dtype_size(dt));
    }
    /* 2-byte types at head sizes 33 to 64, the default mode: the kernels
     * compiled for more blocks an SM (kcuda_attention_backward_blocks)
     * give the same bits, dq, dk and dv overwritten */
    if (dt != KCUDA_F32 && d > 32 && d <= 64 && attn_mode == 1) {
        size_t es = kcuda_dtype_size(dt), n[3] = {nq, nkv, nkv};
        void *got[2][3];
        for (int more = 0; more < 2; more++) {
            for (int i = 0; i < 3; i++)
                got[more][i] = dmem(n[i] * es);
            kcuda_attention_backward_blocks(more);
            KC(kcuda_attention_backward(ctx, got[more][0], got[more][1], got[more][2], dg, dout, dlse, dq, dk, dv, B,
                                        T, H, KV, d, causal, 7, dt, NULL));
        }
        kcuda_attention_backward_blocks(0);
        static const char *what[3] = {"dq, more blocks an SM", "dk, more blocks an SM", "dv, more blocks an SM"};
        for (int i = 0; i < 3; i++)
            expect_bits(what[i], snapshot(got[1][i], n[i], dt), snapshot(got[0][i], n[i], dt), n[i] * es);
    }
    /* 2-byte types, the default mode: the backward on warpgroup products
     * (kcuda_attention_wgmma), dq, dk and dv overwritten from NaN bytes,
     * within the tolerance of the CPU (from zero) */
    if (dt != KCUDA_F32 && attn_mode == 1 && kcuda_attention_wgmma(1)) {
        size_t es = kcuda_dtype_size(dt), n[3] = {nq, nkv, nkv};
        void *got[3];
        float *ref[3];
        for (int i = 0; i < 3; i++) {
            got[i] = dmem(n[i] * es);
            ref[i] = hf(n[i]);
            cuda_or_die(cudaMemset(got[i], 0xff, n[i] * es), "cudaMemset");
        }
        int rc = kcuda_attention_backward(ctx, got[0], got[1], got[2], dg, dout, dlse, dq, dk, dv, B, T, H, KV, d,
                                          causal, 7, dt, NULL);
        kcuda_attention_wgmma(0);
        KC(rc);
        kcpu_attention_backward(ref[0], ref[1], ref[2], g, out, lse, q, k, v, B, T, H, KV, d, causal);
        expect_dev("dq, wgmma", got[0], ref[0], nq, dt);
        expect_dev("dk, wgmma", got[1], ref[1], nkv, dt);
        expect_dev("dv, wgmma", got[2], ref[2], nkv, dt);
        if (emulated()) { /* the default's bits there, as the forward's */
            static const char *what[3] = {"dq, wgmma = mma.sync (emulation)", "dk, wgmma = mma.sync (emulation)",
                                          "dv, wgmma = mma.sync (emulation)"};
            void *def[3];
            for (int i = 0; i < 3; i++)
                def[i] = dmem(n[i] * es);
            KC(kcuda_attention_backward(ctx, def[0], def[1], def[2], dg, dout, dlse, dq, dk, dv, B, T, H, KV, d,
                                        causal, 7, dt, NULL));
            for (int i = 0; i < 3; i++)
                expect_bits(what[i], snapshot(got[i], n[i], dt), snapshot(def[i], n[i], dt), n[i] * es);
        }
    }
    kcuda_attention_wgmma(0);
    /* the default mode: each main kernel alone (kcuda_attention_backward_only,
     * the benchmark's) writes its outputs' bits and leaves the others'
     * (NaN bytes) as they were */
    if (attn_mode == 1) {
        size_t es = kcuda_dtype_size(dt), n[3] = {nq, nkv, nkv};
        void *all[3], *got[3];
        for (int i = 0; i < 3; i++)
            all[i] = dmem(n[i] * es);
        KC(kcuda_attention_backward(ctx, all[0], all[1], all[2], dg, dout, dlse, dq, dk, dv, B, T, H, KV, d,
                                    causal, 7, dt, NULL));
        for (int only = 1; only <= 2; only++) {
            for (int i = 0; i < 3; i++) {
                got[i] = dmem(n[i] * es);
                cuda_or_die(cudaMemset(got[i], 0xff, n[i] * es), "cudaMemset");
            }
            void *nan = snapshot(got[0], n[0], dt), *nankv = snapshot(got[1], n[1], dt);
            kcuda_attention_backward_only(only);
            KC(kcuda_attention_backward(ctx, got[0], got[1], got[2], dg, dout, dlse, dq, dk, dv, B, T, H, KV, d,
                                        causal, 7, dt, NULL));
            kcuda_attention_backward_only(0);
            for (int i = 0; i < 3; i++) {
                int ran = only == 1 ? i > 0 : i == 0;
                static const char *what[2][3] = {{"dq, left alone", "dk, left alone", "dv, left alone"},
                                                 {"dq, dq's kernel alone", "dk, the dk/dv kernel alone",
                                                  "dv, the dk/dv kernel alone"}};
                expect_bits(what[ran][i], snapshot(got[i], n[i], dt),
                            ran ? snapshot(all[i], n[i], dt) : i ? nankv : nan, n[i] * es);
            }
        }
    }
}

void t_attention(kcuda_dtype dt)
{
    attn_case(dt, 2, 100, 4, 2, 16, 1, 0);  /* GQA, ragged last tile */
    attn_case(dt, 1, 130, 2, 2, 64, 0, 0);  /* not causal */
    attn_case(dt, 2, 150, 4, 2, 64, 1, 0);  /* GPT-2's head size, GQA */
    attn_case(dt, 1, 64, 3, 1, 80, 1, 0);   /* d padded to 128, MQA */
    attn_case(dt, 2, 70, 2, 1, 18, 1, 0);   /* d not in packs */
    attn_case(dt, 1, 200, 2, 2, 128, 1, 0); /* four key tiles */
    attn_case(dt, 1, 300, 1, 1, 16, 1, 0);  /* five */
    /* B*H past the grid's rows (65535; 3 here): the pairs in z slices,
     * the last one part padding */
    kcuda_attention_grid_rows(3);
    attn_case(dt, 2, 100, 4, 2, 16, 1, 0);
    attn_case(dt, 1, 130, 5, 5, 32, 0, 0);
    kcuda_attention_grid_rows(0);
}

/* The attention backward's other modes (kcuda_ctx_set_deterministic; the
 * default, dq by its own kernel, is t_attention's and t_attention_qkv's,
 * whose cases of three key tiles or more check dq's bits twice): the
 * dk/dv kernel's atomics as they come (0) and in turns (2), 2-byte types
 * only (fp32 takes the default's path in every mode), on cases like
 * t_attention's of each padded head size (32, 64, 128), grouped-query and
 * multi-query heads, causal or not, ragged tiles, and for each head size
 * a tile with no entry masked (the tile math without the mask's
 * compares): within the same tolerances. In turns, also five key tiles:
 * more than the emulator's runners (4), so that a block waiting for one
 * not yet started would never get its turn; and dq's bits twice. */
static void attention_mode(kcuda_dtype dt, int mode)
{
    kcuda_ctx_set_deterministic(ctx, attn_mode = mode);
    attn_case(dt, 2, 130, 4, 2, 16, 1, 0);
    attn_case(dt, 1, 130, 2, 2, 64, 0, 0);
    attn_case(dt, 1, 128, 3, 1, 80, 1, 0);
    if (mode == 2)
        attn_case(dt, 1, 300, 1, 1, 16, 1, 0);
    kcuda_ctx_set_deterministic(ctx, attn_mode = 1);
}

void t_attention_atomic_dq(kcuda_dtype dt)
{
    attention_mode(dt, 0);
}

void t_attention_dq_turns(kcuda_dtype dt)
{
    attention_mode(dt, 2);
}

void t_attention_qkv(kcuda_dtype dt)
{
    attn_case(dt, 2, 70, 4, 2, 32, 1, 1);
    attn_case(dt, 1, 65, 2, 2, 64, 0, 1);
}

/* The attention's tile products on TF32 tensor cores (the forward, the
 * dk/dv kernel and dq's, mma.sync m16n8k8): t_attention's and
 * t_attention_qkv's cases, every padded head size, masked and full tiles,
 * operands in packs and not. */
static void attention_tf32_cases(kcuda_dtype dt)
{
    t_attention(dt);
    t_attention_qkv(dt);
}

void t_attention_tf32(kcuda_dtype dt)
{
    (void)dt;
    on_tf32("attention", attention_tf32_cases);
}

/* ---- cases: the attention on cuDNN (kcuda_ctx_set_attention_cudnn) -------- */

/* Context c's cuDNN counters now. */
static kcuda_attention_cudnn_stats cudnn_stats(kcuda_ctx *c)
{
    kcuda_attention_cudnn_stats st;
    kcuda_ctx_attention_cudnn(c, &st);
    return st;
}

/* One causal shape through context c (its attention on cuDNN), against the
 * CPU: the forward (out and lse), the backward overwriting dq, dk and dv
 * (from NaN bytes), again to the same bits where c is deterministic; then
 * a backward that adds to its gradients, which cuDNN declines: this
 * file's kernels run it, from cuDNN's lse. `on` says whether cuDNN is
 * expected to take the calls (the counters say whether it did; -1: not
 * known yet). */
static void cudnn_case(kcuda_ctx *c, int on, int det, kcuda_dtype dt, int B, int T, int H, int KV, int d)
{
    size_t nq = (size_t)B * T * H * d, nkv = (size_t)B * T * KV * d, nl = (size_t)B * H * T;
    size_t es = kcuda_dtype_size(dt), n[3] = {nq, nkv, nkv};
    float *q = rnd(nq, 1.5f, dt), *k = rnd(nkv, 1.5f, dt), *v = rnd(nkv, 1.5f, dt), *g = rnd(nq, 1.0f, dt);
    float *out = hf(nq), *lse = hf(nl), *ref[3] = {hf(nq), hf(nkv), hf(nkv)};
    void *dq = up(q, nq, dt), *dk = up(k, nkv, dt), *dv = up(v, nkv, dt), *dg = up(g, nq, dt);
    void *dout = dmem(nq * es);
    float *dlse = dmem(nl * 4);
    snprintf(cur_shape, sizeof cur_shape, "cuDNN B %d T %d H %d KV %d d %d%s: ", B, T, H, KV, d,
             det ? "" : ", dq in any order");
    kcuda_attention_cudnn_stats before = cudnn_stats(c);
    KC(kcuda_attention_forward(c, dout, dlse, dq, dk, dv, B, T, H, KV, d, 1, dt, NULL));
    kcpu_attention_forward(out, lse, q, k, v, B, T, H, KV, d, 1);
    expect_dev("out, cuDNN", dout, out, nq, dt);
    expect_dev("lse, cuDNN", dlse, lse, nl, KCUDA_F32);
    kcpu_attention_backward(ref[0], ref[1], ref[2], g, out, lse, q, k, v, B, T, H, KV, d, 1);
    void *got[2][3];
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < 3; i++) {
            got[run][i] = dmem(n[i] * es);
            cuda_or_die(cudaMemset(got[run][i], 0xff, n[i] * es), "cudaMemset");
        }
        KC(kcuda_attention_backward(c, got[run][0], got[run][1], got[run][2], dg, dout, dlse, dq, dk, dv, B, T, H,
                                    KV, d, 1, 7, dt, NULL));
    }
    expect_dev("dq, cuDNN", got[0][0], ref[0], nq, dt);
    expect_dev("dk, cuDNN", got[0][1], ref[1], nkv, dt);
    expect_dev("dv, cuDNN", got[0][2], ref[2], nkv, dt);
    static const char *twice[3] = {"dq, cuDNN twice", "dk, cuDNN twice", "dv, cuDNN twice"};
    for (int i = 0; det && i < 3; i++)
        expect_bits(twice[i], snapshot(got[1][i], n[i], dt), snapshot(got[0][i], n[i], dt), n[i] * es);
    kcuda_attention_cudnn_stats mid = cudnn_stats(c);
    /* added to (from zero): declined, ours from cuDNN's forward */
    void *add[3];
    for (int i = 0; i < 3; i++)
        add[i] = dmem(n[i] * es);
    KC(kcuda_attention_backward(c, add[0], add[1], add[2], dg, dout, dlse, dq, dk, dv, B, T, H, KV, d, 1, 0, dt,
                                NULL));
    expect_dev("dq, added to (ours after cuDNN's forward)", add[0], ref[0], nq, dt);
    expect_dev("dk, added to", add[1], ref[1], nkv, dt);
    expect_dev("dv, added to", add[2], ref[2], nkv, dt);
    kcuda_attention_cudnn_stats after = cudnn_stats(c);
    long want[2] = {on ? 1 : 0, on == 1 ? 2 : 0}; /* (on 2: the forward only) */
    for (int i = 0; i < 2 && on >= 0; i++)
        if (mid.calls[i] - before.calls[i] != want[i]) {
            cur_bad = 1;
            fprintf(stderr, "# %s calls on cuDNN: %ld, want %ld (%s)\n", i ? "backward" : "forward",
                    mid.calls[i] - before.calls[i], want[i], mid.why[0] ? mid.why : mid.why_declined);
        }
    if (on >= 0 && (after.declined[1] != mid.declined[1] + 1 || after.calls[1] != mid.calls[1])) {
        cur_bad = 1;
        fprintf(stderr, "# the backward that adds: not declined (%s)\n", after.why_declined);
    }
    cur_shape[0] = '\0';
}

/* One of GPT-2's shapes on a new context's cuDNN (the emulation's) told
 * EMU_CUDNN_REFUSE=refuse: its counters (the calls on ours) in *st. */
static void cudnn_refused_case(kcuda_dtype dt, const char *refuse, kcuda_attention_cudnn_stats *st)
{
    kcuda_ctx *c = NULL;
    memset(st, 0, sizeof *st);
    setenv("EMU_CUDNN_REFUSE", refuse, 1);
    KC(kcuda_ctx_create(&c));
    kcuda_ctx_set_attention_cudnn(c, 1);
    cudnn_case(c, 0, 1, dt, 1, 64, 2, 2, 64);
    unsetenv("EMU_CUDNN_REFUSE");
    *st = cudnn_stats(c);
    kcuda_ctx_free(c);
}

/* The attention on cuDNN where it is there (the emulation's own library,
 * tests/gpu/emu/cudnn.cpp, always): causal shapes of GPT-2's head size
 * (one key tile, two), grouped-query heads with a ragged last tile, d
 * 32 and 128; the backward deterministic (the default) and with dq's sums
 * in any order (kcuda_ctx_set_deterministic 0); the packed layout; the
 * forward only (kcuda_ctx_set_attention_cudnn 2: ours backward); and,
 * on the emulation, a graph cuDNN refuses (EMU_CUDNN_REFUSE: the
 * heuristic offers no engine; =plan: its engine's plan refuses), which
 * runs on this file's kernels with the refusal kept, and an execution
 * that fails (EMU_CUDNN_FAIL_EXECUTE): the call's error names the
 * attention and says cuDNN's words. Without cuDNN (a GPU machine without the library)
 * the cases run on this file's kernels, one line says so, and the
 * counters must show every call declined. */
void t_attention_cudnn(kcuda_dtype dt)
{
    kcuda_ctx *c = NULL;
    KC(kcuda_ctx_create(&c));
    kcuda_ctx_set_attention_cudnn(c, 1);
    /* a first call loads the library (not T 2, d 8: with so few terms, bf16's
     * rounding of out alone puts dk past the tolerance, on this file's
     * kernels too, whichever inputs the cases before it leave) */
    cudnn_case(c, -1, 1, dt, 1, 64, 2, 2, 64);
    kcuda_attention_cudnn_stats st = cudnn_stats(c);
    int on = st.version != 0;
    if (!on && emulated()) {
        cur_bad = 1;
        fprintf(stderr, "# the emulated cuDNN did not load: %s\n", st.why_declined);
    }
    if (!on)
        printf("# no cuDNN (%s): the cases ran on this file's kernels\n", st.why_declined);
    cudnn_case(c, on, 1, dt, 2, 64, 2, 2, 64);
    cudnn_case(c, on, 1, dt, 1, 128, 2, 2, 64);
    cudnn_case(c, on, 1, dt, 2, 72, 4, 2, 32);
    cudnn_case(c, on, 1, dt, 1, 64, 1, 1, 128);
    kcuda_ctx_set_deterministic(c, 0);
    cudnn_case(c, on, 0, dt, 2, 72, 4, 2, 32);
    kcuda_ctx_set_deterministic(c, 1);
    /* the packed layout: forward and backward (overwriting) on cuDNN */
    {
        int B = 2, T = 64, H = 2, d = 64;
        size_t row = (size_t)3 * H * d, n = (size_t)B * T * row, nq = (size_t)B * T * H * d;
        float *qkv = rnd(n, 1.5f, dt), *g = rnd(nq, 1.0f, dt), *out = hf(nq), *lse = hf((size_t)B * H * T);
        float *gqkv = hf(n);
        void *dqkv = up(qkv, n, dt), *dg = up(g, nq, dt), *dout = dmem(nq * kcuda_dtype_size(dt));
        void *dgrad = dmem(n * kcuda_dtype_size(dt));
        float *dlse = dmem((size_t)B * H * T * 4);
        kcuda_attention_cudnn_stats b = cudnn_stats(c);
        KC(kcuda_attention_qkv_forward(c, dout, dlse, dqkv, B, T, H, H, d, 1, dt, NULL));
        KC(kcuda_attention_qkv_backward(c, dgrad, dg, dout, dlse, dqkv, B, T, H, H, d, 1, 1, dt, NULL));
        kcpu_attention_qkv_forward(out, lse, qkv, B, T, H, H, d, 1);
        kcpu_attention_qkv_backward(gqkv, g, out, lse, qkv, B, T, H, H, d, 1);
        expect_dev("out, packed, cuDNN", dout, out, nq, dt);
        expect_dev("dqkv, packed, cuDNN", dgrad, gqkv, n, dt);
        kcuda_attention_cudnn_stats a = cudnn_stats(c);
        if (on && (a.calls[0] != b.calls[0] + 1 || a.calls[1] != b.calls[1] + 1)) {
            cur_bad = 1;
            fprintf(stderr, "# packed: not on cuDNN (%s)\n", a.why[0] ? a.why : a.why_declined);
        }
    }
    st = cudnn_stats(c);
    if (on && (st.refused != 0 || st.plans < 2)) {
        cur_bad = 1;
        fprintf(stderr, "# %d plans built, %d refused: %s\n", st.plans, st.refused, st.why);
    }
    kcuda_ctx_free(c);
    /* the forward only (2): the backward on ours, from cuDNN's lse */
    KC(kcuda_ctx_create(&c));
    kcuda_ctx_set_attention_cudnn(c, 2);
    cudnn_case(c, on ? 2 : 0, 1, dt, 2, 72, 4, 2, 32);
    st = cudnn_stats(c);
    /* (its 2 runs, and the one that adds) */
    if (on && (st.declined[1] != 3 || !strstr(st.why_declined, "the forward only"))) {
        cur_bad = 1;
        fprintf(stderr, "# the forward only: %ld backward calls declined: %s\n", st.declined[1], st.why_declined);
    }
    kcuda_ctx_free(c);
    if (!emulated())
        return;
    /* refused: ours run, the refusal kept */
    cudnn_refused_case(dt, "1", &st);
    if (st.refused != 2 || !strstr(st.why, "no engine")) {
        cur_bad = 1;
        fprintf(stderr, "# refused: %d graphs, why \"%s\"\n", st.refused, st.why);
    }
    char line[600];
    kcuda_attention_cudnn_describe(&st, line, sizeof line);
    if (!strstr(line, "cuDNN 9.19.0: 0 forward and 0 backward calls on it")) {
        cur_bad = 1;
        fprintf(stderr, "# described as: %s\n", line);
    }
    /* the engine offered, its plan refused: ours run, cuDNN's words kept */
    cudnn_refused_case(dt, "plan", &st);
    if (st.refused != 2 || !strstr(st.why, "no engine of 1 builds a plan") ||
        !strstr(st.why, "CUDNN_STATUS_NOT_SUPPORTED") || !strstr(st.why, "EMU_CUDNN_REFUSE=plan")) {
        cur_bad = 1;
        fprintf(stderr, "# plan refused: %d graphs, why \"%s\"\n", st.refused, st.why);
    }
    /* an execution that fails: the call fails, naming the attention and
     * the shape, in cuDNN's words */
    {
        int B = 1, T = 64, H = 2, d = 64;
        size_t nq = (size_t)B * T * H * d;
        float *q = rnd(nq, 1.0f, dt);
        void *dq = up(q, nq, dt), *dout = dmem(nq * kcuda_dtype_size(dt));
        float *dlse = dmem((size_t)B * H * T * 4);
        KC(kcuda_ctx_create(&c));
        kcuda_ctx_set_attention_cudnn(c, 1);
        setenv("EMU_CUDNN_FAIL_EXECUTE", "1", 1);
        int rc = kcuda_attention_forward(c, dout, dlse, dq, dq, dq, B, T, H, H, d, 1, dt, NULL);
        unsetenv("EMU_CUDNN_FAIL_EXECUTE");
        const char *why = kcuda_last_error();
        if (rc == 0 || !strstr(why, "cuDNN's attention forward (B=1 T=64 H=2)") ||
            !strstr(why, "CUDNN_STATUS_EXECUTION_FAILED") || !strstr(why, "EMU_CUDNN_FAIL_EXECUTE")) {
            cur_bad = 1;
            fprintf(stderr, "# a failed execution: rc %d, \"%s\"\n", rc, why);
        }
        cuda_or_die(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        kcuda_ctx_free(c);
    }
}
