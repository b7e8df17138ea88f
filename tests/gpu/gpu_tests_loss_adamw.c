/*
 * gpu_tests_loss_adamw.c: the fused cross-entropy (whole, and
 * sharded over the vocabulary) and the optimizer's kernels (AdamW with
 * fp32 master weights, the gradient norm, clipping; one call over many
 * tensors) against kcpu's.
 */
#include <math.h>   /* defines: fabs, sqrt */
#include <string.h> /* defines: memcpy, memcmp */

#include "gpu_tests.h"

/* ---- cases: cross-entropy ----------------------------------------------- */

/* fused: 0 the two calls (the backward adds), 1 the fused kernel (it
 * overwrites dlogits), 2 the fused kernel with dlogits the logits; ninf:
 * the first ninf logits of every other row are -inf (masked: their
 * probabilities 0; the running maximum starts at -inf over them), the
 * target past them */
void ce_case(kcuda_dtype dt, int N, int V, int Vp, int fused, int ninf)
{
    size_t n = (size_t)N * Vp;
    float *logits = rnd(n, 6.0f, dt), dloss = 1.5f;
    int32_t *tg = hmem((size_t)N * sizeof *tg);
    for (int i = 0; i < N; i++) {
        int masked = i % 2 ? ninf : 0;
        tg[i] = masked + irand(V - masked);
        for (int c = 0; c < masked; c++)
            logits[(size_t)i * Vp + c] = -INFINITY;
    }
    float *loss = hf((size_t)N), *mx = hf((size_t)N), *lse = hf((size_t)N);
    float *gl = rnd(n, 0.01f, dt);
    void *dl = up(logits, n, dt), *dtg = up_i32(tg, (size_t)N);
    void *dgl = fused == 2 ? dl : up(gl, n, dt);
    if (fused)
        memset(gl, 0, n * sizeof *gl);
    float *dloss_v = dmem((size_t)N * 4), *dmx = dmem((size_t)N * 4);
    float *dlse = dmem((size_t)N * 4), *dmean = dmem(4);
    float mean = kcpu_crossentropy_forward(loss, mx, lse, logits, tg, N, V, Vp);
    kcpu_crossentropy_backward(gl, logits, tg, mx, lse, dloss, N, V, Vp);
    if (fused) {
        KC(kcuda_crossentropy_fused(dloss_v, dmx, dlse, dmean, dgl, dl, dtg,
                                    dloss, N, V, Vp, dt, NULL));
    } else {
        KC(kcuda_crossentropy_forward(dloss_v, dmx, dlse, dmean, dl, dtg, N, V,
                                      Vp, dt, NULL));
        KC(kcuda_crossentropy_backward(dgl, dl, dtg, dmx, dlse, dloss, N, V,
                                       Vp, dt, NULL));
    }
    double keep = cur_tol;
    cur_tol = TOL_F32; /* fp32 statistics of the same (rounded) logits */
    expect_dev("losses", dloss_v, loss, (size_t)N, KCUDA_F32);
    expect_dev("rowmax", dmx, mx, (size_t)N, KCUDA_F32);
    expect_dev("lse", dlse, lse, (size_t)N, KCUDA_F32);
    expect_dev("mean loss", dmean, &mean, 1, KCUDA_F32);
    cur_tol = keep;
    expect_dev("dlogits", dgl, gl, n, dt);
}

void t_crossentropy(kcuda_dtype dt)
{
    ce_case(dt, 13, 1000, 1024, 0, 0);
    ce_case(dt, 5, 77, 77, 0, 0); /* rows not in packs */
    ce_case(dt, 7, 1000, 1024, 0, 333); /* -inf logits, in packs and apart */
    ce_case(dt, 4, 77, 77, 0, 50);
}

void t_crossentropy_fused(kcuda_dtype dt)
{
    for (int fused = 1; fused <= 2; fused++) { /* apart, then in place */
        ce_case(dt, 13, 1000, 1024, fused, 0);
        ce_case(dt, 5, 77, 80, fused, 0);
        ce_case(dt, 4, 77, 77, fused, 50);
    }
}

void t_crossentropy_shard(kcuda_dtype dt)
{
    int N = 7, V = 1000, W = 512;
    for (int col0 = 0; col0 <= 1024; col0 += 512) { /* the last: padding */
        size_t n = (size_t)N * W;
        float *logits = rnd(n, 5.0f, dt);
        int32_t *tg = hmem((size_t)N * sizeof *tg);
        for (int i = 0; i < N; i++)
            tg[i] = irand(V);
        float *mx = hf((size_t)N), *tl = hf((size_t)N), *lse = hf((size_t)N);
        double *sums = hmem(2 * (size_t)N * sizeof *sums); /* then the target logits */
        void *dl = up(logits, n, dt), *dtg = up_i32(tg, (size_t)N);
        float *dmx = dmem((size_t)N * 4), *dtl = dmem((size_t)N * 4);
        double *dsums = dmem(2 * (size_t)N * 8);
        kcpu_crossentropy_shard_max(mx, tl, logits, tg, N, col0, W, V);
        KC(kcuda_crossentropy_shard_max(dmx, dtl, dl, dtg, N, col0, W, V, dt,
                                        NULL));
        double keep = cur_tol;
        cur_tol = TOL_F32;
        float *gmx = down(dmx, (size_t)N, KCUDA_F32);
        if (col0 < V)
            expect("rowmax", gmx, mx, (size_t)N);
        else
            for (int i = 0; i < N; i++)
                if (gmx[i] != -INFINITY) {
                    cur_bad = 1;
                    fprintf(stderr, "# padding shard: rowmax %g, not -inf\n",
                            gmx[i]);
                    break;
                }
        expect_dev("target logit", dtl, tl, (size_t)N, KCUDA_F32);
        /* the sums use a finite max, as after the exchange */
        for (int i = 0; i < N; i++)
            mx[i] = 1.0f;
        cuda_or_die(cudaMemcpy(dmx, mx, (size_t)N * 4, cudaMemcpyHostToDevice),
                    "upload");
        kcpu_crossentropy_shard_sumexp(sums, tl, logits, mx, N, col0, W, V);
        KC(kcuda_crossentropy_shard_sumexp(dsums, dtl, dl, dmx, N, col0, W, V,
                                           dt, NULL));
        double *gs = down_raw(dsums, 2 * (size_t)N * 8);
        expect_bits("target logits beside the sums", gs + N, sums + N,
                    (size_t)N * 8);
        float *fs = hf((size_t)N), *fw = hf((size_t)N);
        for (int i = 0; i < N; i++) {
            fs[i] = (float)gs[i];
            fw[i] = (float)sums[i];
            lse[i] = 2.0f + 0.1f * (float)i;
        }
        expect("sums", fs, fw, (size_t)N);
        cur_tol = keep;
        float *gl = rnd(n, 0.01f, dt);
        void *dgl = up(gl, n, dt), *dlse = up(lse, (size_t)N, KCUDA_F32);
        kcpu_crossentropy_shard_backward(gl, logits, tg, mx, lse, 1.0f, N, col0,
                                         W, V);
        KC(kcuda_crossentropy_shard_backward(dgl, dl, dtg, dmx, dlse, 1.0f, N,
                                             col0, W, V, 0, dt, NULL));
        expect_dev("dlogits", dgl, gl, n, dt);
        /* overwritten (assign): from NaN, the gradient alone, and zero on
         * the shard's columns past the vocabulary */
        cuda_or_die(cudaMemset(dgl, 0xff, n * kcuda_dtype_size(dt)), "cudaMemset");
        memset(gl, 0, n * sizeof *gl);
        kcpu_crossentropy_shard_backward(gl, logits, tg, mx, lse, 1.0f, N, col0,
                                         W, V);
        KC(kcuda_crossentropy_shard_backward(dgl, dl, dtg, dmx, dlse, 1.0f, N,
                                             col0, W, V, 1, dt, NULL));
        expect_dev("dlogits assigned", dgl, gl, n, dt);
    }
}

/* The pieces after the vocabulary-parallel exchanges (fp32 and double, the
 * logits' type aside): P shards' maxima (one of them padding, -inf), every
 * shard's sums and target logits, on N rows. */
static void ce_exchange_case(int N, int P)
{
    size_t n = (size_t)N, n2 = 2 * n;
    float *all = hf((size_t)P * n), *mx = hf(n);
    for (size_t k = 0; k < (size_t)P * n; k++) /* with 3 shards or more, shard 1 is padding */
        all[k] = k / n == 1 && P > 2 ? -INFINITY : 5.0f * frand();
    for (size_t i = 0; i < n; i += 3) /* ties between the first shard and the last */
        all[i] = all[(size_t)(P - 1) * n + i];
    kcpu_crossentropy_shard_rowmax(mx, all, N, P);
    float *dall = up(all, (size_t)P * n, KCUDA_F32), *dmx = dmem(n * 4);
    KC(kcuda_crossentropy_shard_rowmax(dmx, dall, N, P, NULL));
    expect_bits("rowmax", down(dmx, n, KCUDA_F32), mx, n * 4);

    double *ex = hmem((size_t)P * n2 * sizeof *ex), *dex = dmem((size_t)P * n2 * 8);
    for (size_t k = 0; k < (size_t)P * n2; k++) { /* sums in (0.01, 30), target logits in [-4, 4) */
        double u = 0.5 * (frand() + 1.0);
        ex[k] = k % n2 < n ? 0.01 + 30.0 * u * u : 4.0 * frand();
    }
    cuda_or_die(cudaMemcpy(dex, ex, (size_t)P * n2 * 8, cudaMemcpyHostToDevice), "upload");
    float *loss = hf(n), *lse = hf(n), *dloss = dmem(n * 4), *dlse = dmem(n * 4), *dmean = dmem(4);
    float mean = kcpu_crossentropy_shard_finish(loss, lse, ex, mx, N, P);
    KC(kcuda_crossentropy_shard_finish(dmean, dloss, dlse, dex, dmx, N, P, NULL));
    double keep = cur_tol;
    cur_tol = TOL_F32; /* the GPU's log may differ in its last bit; the mean's order is the GPU's */
    expect_dev("losses", dloss, loss, n, KCUDA_F32);
    expect_dev("lse", dlse, lse, n, KCUDA_F32);
    expect_dev("mean loss", dmean, &mean, 1, KCUDA_F32);
    cur_tol = keep;
}

void t_crossentropy_exchange(kcuda_dtype dt)
{
    (void)dt;
    ce_exchange_case(7, 2);
    ce_exchange_case(3000, 4); /* several blocks */
}

/* ---- cases: AdamW and norms ----------------------------------------------- */

/* AdamW on fp32 masters, the gradients in gdt, the 2-byte weights (if
 * any) in dt; steps 2 and 3 with a factor on the gradients (clipping, a
 * loss scale): 2-byte ones are taken as kcuda_scale leaves them, rounded
 * to gdt. */
static void adamw_case(kcuda_dtype dt, kcuda_dtype gdt)
{
    size_t n = 1003;
    float *p = rnd(n, 1.0f, KCUDA_F32), *m = rnd(n, 0.1f, KCUDA_F32);
    float *v = rnd(n, 0.1f, KCUDA_F32), *g = rnd(n, 1.0f, gdt);
    for (size_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    float *dp = up(p, n, KCUDA_F32), *dm = up(m, n, KCUDA_F32);
    float *dv = up(v, n, KCUDA_F32);
    void *dg = up(g, n, gdt), *dpb = dmem(n * 2);
    float *gs = hf(n);
    for (int t = 1; t <= 3; t++) {
        double scale = t == 1 ? 1.0 : t == 2 ? 0.3712345678901 : 1.0 / 1024;
        KC(kcuda_adamw_step(dp, dt != KCUDA_F32 ? dpb : NULL, dt, dg, gdt,
                            scale, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                            t, NULL));
        if (gdt == KCUDA_F32) {
            kcpu_adamw_step(p, g, scale, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                            0.1f, t);
            continue;
        }
        memcpy(gs, g, n * sizeof *gs);
        kcpu_scale_buffers(&gs, &n, 1, scale);
        kcpu_round(gs, n, prec_of(gdt));
        kcpu_adamw_step(p, gs, 1.0, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                        t);
    }
    /* the same operations in the same order: kcpu's bits */
    expect_bits("params", down(dp, n, KCUDA_F32), p, n * 4);
    expect_bits("m", down(dm, n, KCUDA_F32), m, n * 4);
    expect_bits("v", down(dv, n, KCUDA_F32), v, n * 4);
    if (dt != KCUDA_F32) {
        float *pb = hf(n);
        memcpy(pb, p, n * sizeof *pb);
        kcpu_round(pb, n, prec_of(dt));
        expect_bits("params_lp", down(dpb, n, dt), pb, n * 4);
    }
}

void t_adamw(kcuda_dtype dt)
{
    adamw_case(dt, dt);
}

/* fp32 main gradients beside 2-byte weights (the executor's mixed
 * precision); and an op's 2-byte contribution accumulated into them */
void t_adamw_f32_grads(kcuda_dtype dt)
{
    adamw_case(dt, KCUDA_F32);
    size_t n = 70001;
    float *y = rnd(n, 1.0f, KCUDA_F32), *x = rnd(n, 1.0f, dt);
    float *dy = up(y, n, KCUDA_F32);
    void *dx = up(x, n, dt);
    KC(kcuda_accumulate(dy, dx, dt, n, NULL));
    kcpu_add_forward(y, y, x, n); /* x holds the 2-byte values exactly */
    expect_bits("accumulated", down(dy, n, KCUDA_F32), y, n * 4);
}

void t_global_norm(kcuda_dtype dt)
{
    size_t sizes[2] = {1003, 70001};
    float *bufs[2];
    void *dbufs_[2];
    for (int k = 0; k < 2; k++) {
        bufs[k] = rnd(sizes[k], 1.0f, dt);
        dbufs_[k] = up(bufs[k], sizes[k], dt);
    }
    double *dss = dmem(8);
    for (int k = 0; k < 2; k++)
        KC(kcuda_sum_squares(ctx, dss, dbufs_[k], sizes[k], dt, NULL));
    double ss = kcpu_sum_squares((const float *const *)bufs, sizes, 2);
    double *got = down_raw(dss, 8);
    double e = fabs(*got - ss) / ss;
    note(e);
    if (!(e <= 1e-12)) {
        cur_bad = 1;
        fprintf(stderr, "# sum of squares %.17g, want %.17g\n", *got, ss);
    }
    /* clip to half the norm, on the device, and scale */
    float max_norm = (float)(0.5 * sqrt(ss));
    for (int k = 0; k < 2; k++)
        KC(kcuda_clip_scale(dbufs_[k], sizes[k], dss, max_norm, dt, NULL));
    kcpu_clip_global_norm(bufs, sizes, 2, max_norm);
    for (int k = 0; k < 2; k++)
        expect_dev("clipped", dbufs_[k], bufs[k], sizes[k], dt);
    KC(kcuda_scale(dbufs_[0], sizes[0], 0.25, dt, NULL));
    kcpu_scale_buffers(bufs, sizes, 1, 0.25);
    expect_dev("scaled", dbufs_[0], bufs[0], sizes[0], dt);
}

/* kcuda_sum_squares_many against a kcuda_sum_squares call a buffer, to
 * the bit: 70 buffers (two launches of 64 and 6), sizes from 0 and 1 to
 * past the fixed grid's 1024 x 256 elements, the large ones in both
 * launches; each buffer's sum into its own double, added to what was
 * there. */
void t_sum_squares_many(kcuda_dtype dt)
{
    enum { NB = 70 };
    static const size_t base[5] = {0, 1, 255, 256, 1003};
    size_t sizes[NB];
    const void *dbufs_[NB];
    for (int b = 0; b < NB; b++) {
        /* (the large ones once or twice in each launch: slow on the
         * emulation under TSan) */
        sizes[b] = b == 2 || b == 66 ? 1024 * 256 + 77 : b == 9 || b == 40 || b == 67 ? 70001 : base[(b * 3) % 5];
        sizes[b] += (size_t)(b % 5);
        float *h = rnd(sizes[b] ? sizes[b] : 1, 1.0f, dt);
        dbufs_[b] = up(h, sizes[b] ? sizes[b] : 1, dt);
    }
    double start[NB];
    for (int b = 0; b < NB; b++)
        start[b] = 0.5 * b;
    double *one = dmem(NB * sizeof(double)), *many = dmem(NB * sizeof(double));
    cuda_or_die(cudaMemcpy(one, start, sizeof start, cudaMemcpyHostToDevice), "upload");
    cuda_or_die(cudaMemcpy(many, start, sizeof start, cudaMemcpyHostToDevice), "upload");
    for (int b = 0; b < NB; b++)
        KC(kcuda_sum_squares(ctx, one + b, dbufs_[b], sizes[b], dt, NULL));
    KC(kcuda_sum_squares_many(ctx, many, dbufs_, sizes, NB, dt, NULL));
    expect_bits("each buffer's sum of squares", down_raw(many, NB * sizeof(double)),
                down_raw(one, NB * sizeof(double)), NB * sizeof(double));
}

/* kcuda_adamw_step_many against a kcuda_adamw_step call a tensor, to the
 * bit (params, m, v, and the 2-byte copy where a tensor has one): 30
 * tensors (two launches, of 24 and 6), sizes from 0 and 1 to past the
 * 2048 blocks a tensor gets, each its own weight decay; fp32 with fp32
 * gradients and no copy, 2-byte types with fp32 gradients (mixed
 * precision's) and the copy on every other tensor; two steps, the second
 * with a gradient factor. */
void t_adamw_many(kcuda_dtype dt)
{
    enum { NT = 30 };
    static const size_t base[3] = {0, 1, 1003};
    kcuda_adamw_tensor one[NT], many[NT];
    size_t n[NT];
    for (int b = 0; b < NT; b++) {
        /* (the large ones once or twice in each launch) */
        n[b] = b == 3 || b == 27 ? 2048 * 256 + 333 : b == 8 || b == 26 ? 70001 : base[(b * 2) % 3];
        n[b] += (size_t)(b % 3);
        size_t k = n[b] ? n[b] : 1;
        float *p = rnd(k, 1.0f, KCUDA_F32), *m = rnd(k, 0.1f, KCUDA_F32), *v = rnd(k, 0.1f, KCUDA_F32);
        float *g = rnd(k, 1.0f, KCUDA_F32);
        for (size_t i = 0; i < k; i++)
            v[i] = fabsf(v[i]);
        kcuda_adamw_tensor *x[2] = {&one[b], &many[b]};
        for (int w = 0; w < 2; w++)
            *x[w] = (kcuda_adamw_tensor){up(p, k, KCUDA_F32), dt != KCUDA_F32 && b % 2 ? dmem(k * 2) : NULL,
                                         up(g, k, KCUDA_F32), up(m, k, KCUDA_F32), up(v, k, KCUDA_F32), n[b],
                                         0.01f * (float)(b % 4)};
    }
    for (int t = 1; t <= 2; t++) {
        double scale = t == 1 ? 1.0 : 0.3712345678901;
        for (int b = 0; b < NT; b++)
            KC(kcuda_adamw_step(one[b].params, one[b].params_lp, dt, one[b].grads, KCUDA_F32, scale, one[b].m,
                                one[b].v, one[b].n, 1e-3f, 0.9f, 0.95f, 1e-8f, one[b].weight_decay, t, NULL));
        KC(kcuda_adamw_step_many(many, NT, dt, KCUDA_F32, scale, 1e-3f, 0.9f, 0.95f, 1e-8f, t, NULL));
    }
    for (int b = 0; b < NT; b++) {
        if (n[b] == 0)
            continue;
        size_t bytes = n[b] * 4;
        expect_bits("params", down_raw(many[b].params, bytes), down_raw(one[b].params, bytes), bytes);
        expect_bits("m", down_raw(many[b].m, bytes), down_raw(one[b].m, bytes), bytes);
        expect_bits("v", down_raw(many[b].v, bytes), down_raw(one[b].v, bytes), bytes);
        if (one[b].params_lp)
            expect_bits("params_lp", down_raw(many[b].params_lp, n[b] * 2), down_raw(one[b].params_lp, n[b] * 2),
                        n[b] * 2);
    }
}
