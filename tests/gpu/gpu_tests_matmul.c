/*
 * gpu_tests_matmul.c: the products (kcuda_matmul_*) against kcpu's:
 * forward and backward, with cuBLASLt's epilogues (bias, GELU, DGELU),
 * fp32 weight gradients, TF32, a refused epilogue's fallback, and the
 * tuned algorithms' bits (MESH_GEMM_TUNE).
 */
#include <stdlib.h> /* defines: setenv, unsetenv */
#include <string.h> /* defines: memcpy, memcmp, strstr */

#include "gpu_tests.h"

/* ---- cases: matmul -------------------------------------------------------- */

/* The backward of x @ w (wt: x @ w^T, w stored [N, K]) on the host's x, w
 * and the device's dx, dw, into gradients that already hold values (dx
 * with assign: NaN, overwritten): dw and the bias gradient of wdt (dt, or
 * fp32 beside 2-byte tensors: checked to fp32's tolerance). */
static void matmul_backward_case(kcuda_dtype dt, kcuda_dtype wdt,
                                 const float *x, const float *w,
                                 const void *dx, const void *dw, int M, int K,
                                 int N, int wt, int assign)
{
    float *g = rnd((size_t)M * N, 1.0f, dt);
    float *gx = rnd((size_t)M * K, 0.5f, dt), *gw = rnd((size_t)K * N, 0.5f, wdt);
    float *gb = rnd((size_t)N, 0.5f, wdt);
    void *dg = up(g, (size_t)M * N, dt), *dgx = up(gx, (size_t)M * K, dt);
    void *dgw = up(gw, (size_t)K * N, wdt), *dgb = up(gb, (size_t)N, wdt);
    if (assign) { /* dx overwritten: its old contents (NaN here) never read */
        cuda_or_die(cudaMemset(dgx, 0xff, (size_t)M * K * kcuda_dtype_size(dt)),
                    "cudaMemset");
        memset(gx, 0, (size_t)M * K * sizeof *gx);
    }
    if (wt) {
        KC(kcuda_matmul_wt_backward(ctx, dgx, dgw, dgb, dg, dx, dw, M, K, N,
                                    dt, wdt, assign, NULL));
        kcpu_matmul_wt_backward(gx, gw, gb, g, x, w, M, K, N);
    } else {
        KC(kcuda_matmul_backward(ctx, dgx, dgw, dgb, dg, dx, dw, M, K, N, dt,
                                 wdt, assign, NULL));
        kcpu_matmul_backward(gx, gw, gb, g, x, w, M, K, N);
    }
    expect_dev("dx", dgx, gx, (size_t)M * K, dt);
    double keep = cur_tol;
    if (wdt != dt) /* (the case's own otherwise: TF32's, t_matmul_tf32) */
        cur_tol = tol_of(wdt);
    expect_dev("dbias", dgb, gb, (size_t)N, wdt);
    expect_dev("dw", dgw, gw, (size_t)K * N, wdt);
    cur_tol = keep;
}

void matmul_case(kcuda_dtype dt, int M, int K, int N, int wt,
                        int bias, int gelu)
{
    float *x = rnd((size_t)M * K, 1.0f, dt), *w = rnd((size_t)K * N, 0.5f, dt);
    float *b = bias ? rnd((size_t)N, 0.5f, dt) : NULL;
    float *y = hf((size_t)M * N), *pre = hf((size_t)M * N);
    void *dx = up(x, (size_t)M * K, dt), *dw = up(w, (size_t)K * N, dt);
    void *db = bias ? up(b, (size_t)N, dt) : NULL;
    void *dy = dmem((size_t)M * N * 4), *dpre = dmem((size_t)M * N * 4);
    if (wt) {
        KC(kcuda_matmul_wt_forward(ctx, dy, dx, dw, db, M, K, N, dt, NULL));
        kcpu_matmul_wt_forward(y, x, w, b, M, K, N);
    } else {
        KC(kcuda_matmul_forward(ctx, dy, dpre, dx, dw, db, M, K, N,
                                gelu ? KCUDA_EPI_GELU : KCUDA_EPI_NONE, dt,
                                NULL));
        kcpu_matmul_forward(pre, x, w, b, M, K, N);
        if (gelu) {
            expect_dev("pre", dpre, pre, (size_t)M * N, dt);
            kcpu_gelu_forward(y, pre, (size_t)M * N);
        } else {
            memcpy(y, pre, (size_t)M * N * sizeof *y);
        }
    }
    expect_dev("y", dy, y, (size_t)M * N, dt);
    if (!gelu)
        matmul_backward_case(dt, dt, x, w, dx, dw, M, K, N, wt, 0);
}

void t_matmul(kcuda_dtype dt)
{
    matmul_case(dt, 67, 45, 33, 0, 1, 0);
    matmul_case(dt, 64, 96, 128, 0, 0, 0);
    matmul_case(dt, 300, 64, 40, 0, 1, 0); /* dbias over two row chunks */
}

/* A bias's gradient (colsum.cu): the column sums of dy[M, N] over chunks
 * of rows, against the CPU's, and the same bits from the pack path (N a
 * multiple of the 16-byte pack's width, dy aligned) as from the
 * element-by-element one (the same dy one element further on, so
 * misaligned): both add each column's rows in one order. M: four row
 * chunks, the last one short; N: 97 packs of 2-byte types, 4 blocks of 32
 * packs, the last one partial. */
void t_bias_backward(kcuda_dtype dt)
{
    int M = 1000, N = 776;
    size_t n = (size_t)M * N, es = kcuda_dtype_size(dt);
    float *g = rnd(n, 1.0f, dt), *want = rnd((size_t)N, 0.5f, dt);
    void *dg = up(g, n, dt);
    /* the same rows one element on: dmem's buffers are aligned, so +es is not */
    void *dg1 = dmem((n + 1) * es);
    cuda_or_die(cudaMemcpy((char *)dg1 + es, dg, n * es, cudaMemcpyDeviceToDevice), "copy");
    void *db = up(want, (size_t)N, dt), *db1 = up(want, (size_t)N, dt);
    KC(kcuda_bias_backward(ctx, db, dg, M, N, dt, NULL));
    KC(kcuda_bias_backward(ctx, db1, (char *)dg1 + es, M, N, dt, NULL));
    kcpu_matmul_backward(NULL, NULL, want, g, NULL, NULL, M, 1, N);
    expect_dev("dbias", db, want, (size_t)N, dt);
    expect_bits("dbias packs against elements", down_raw(db, (size_t)N * es),
                down_raw(db1, (size_t)N * es), (size_t)N * es);
}

/* The backward alone, on fresh inputs (matmul_backward_case). */
static void matmul_bwd_case(kcuda_dtype dt, kcuda_dtype wdt, int M, int K,
                            int N, int wt, int assign)
{
    float *x = rnd((size_t)M * K, 1.0f, dt), *w = rnd((size_t)K * N, 0.5f, dt);
    void *dx = up(x, (size_t)M * K, dt), *dw = up(w, (size_t)K * N, dt);
    matmul_backward_case(dt, wdt, x, w, dx, dw, M, K, N, wt, assign);
}

/* dx overwritten (the executor's first write of an activation's gradient,
 * not zeroed before): a NaN-filled dx gives the product alone */
void t_matmul_assign(kcuda_dtype dt)
{
    int shapes[3][3] = {{67, 45, 33}, {64, 96, 128}, {300, 64, 40}};
    for (int i = 0; i < 3; i++)
        for (int wt = 0; wt < 2; wt++)
            matmul_bwd_case(dt, dt, shapes[i][0], shapes[i][1], shapes[i][2], wt, 1);
}

/* A weight gradient in fp32 beside 2-byte tensors (an fp32 main gradient
 * the product is added to in fp32): within fp32's tolerance of the CPU's
 * fp32 sums of the same (2-byte) inputs; dx stays 2-byte. */
void t_matmul_f32_dw(kcuda_dtype dt)
{
    matmul_bwd_case(dt, KCUDA_F32, 67, 45, 33, 0, 0);
    matmul_bwd_case(dt, KCUDA_F32, 64, 96, 128, 0, 0);
    matmul_bwd_case(dt, KCUDA_F32, 67, 45, 33, 1, 0);
    matmul_bwd_case(dt, KCUDA_F32, 300, 64, 40, 1, 0);
}

/* The backward of y = gelu(pre) @ w with the GELU's
 * (kcuda_matmul_gelu_backward): dpre overwritten (NaN before), dw (of wdt)
 * added to, against the CPU's product into a zeroed dx and then the GELU's
 * backward in place (kern_cpu.c's form of the fusion). */
static void matmul_gelu_bwd_case(kcuda_dtype dt, kcuda_dtype wdt, int M,
                                 int K, int N)
{
    size_t mk = (size_t)M * K, kn = (size_t)K * N;
    float *pre = rnd(mk, 2.0f, dt), *x = hf(mk), *w = rnd(kn, 0.5f, dt);
    float *g = rnd((size_t)M * N, 1.0f, dt), *gw = rnd(kn, 0.5f, wdt);
    float *gp = hf(mk);
    kcpu_gelu_forward(x, pre, mk);
    if (dt != KCUDA_F32)
        kcpu_round(x, mk, prec_of(dt));
    void *dpre = up(pre, mk, dt), *dx = up(x, mk, dt), *dw = up(w, kn, dt);
    void *dg = up(g, (size_t)M * N, dt), *dgw = up(gw, kn, wdt);
    void *dgp = dmem(mk * kcuda_dtype_size(dt));
    cuda_or_die(cudaMemset(dgp, 0xff, mk * kcuda_dtype_size(dt)), "cudaMemset");
    KC(kcuda_matmul_gelu_backward(ctx, dgp, dgw, dg, dx, dw, dpre, M, K, N, dt,
                                  wdt, NULL));
    kcpu_matmul_backward(gp, gw, NULL, g, x, w, M, K, N);
    kcpu_gelu_backward_inplace(gp, pre, mk);
    expect_dev("dpre", dgp, gp, mk, dt);
    double keep = cur_tol;
    if (wdt != dt)
        cur_tol = tol_of(wdt);
    expect_dev("dw", dgw, gw, kn, wdt);
    cur_tol = keep;
}

void t_matmul_gelu(kcuda_dtype dt)
{
    matmul_case(dt, 64, 96, 128, 0, 1, 1); /* cuBLASLt's fused epilogue */
    matmul_case(dt, 37, 20, 33, 0, 1, 1);  /* N % 8 != 0: the fallback */
    matmul_case(dt, 32, 16, 64, 0, 0, 1);
    /* the backward: cuBLASLt's DGELU epilogue (2-byte types; fp32 takes the
     * product and the GELU kernel), and K % 8 != 0 (the two kernels) */
    matmul_gelu_bwd_case(dt, dt, 64, 96, 128);
    matmul_gelu_bwd_case(dt, dt, 37, 20, 33);
    if (dt != KCUDA_F32) /* an fp32 main gradient */
        matmul_gelu_bwd_case(dt, KCUDA_F32, 67, 48, 40);
}

/* body's cases on TF32 tensor cores (kcuda_ctx_set_tf32), in a context
 * of their own, to TF32's tolerance (operands of fp16's mantissa). The
 * largest error must be past fp32's tolerance, else the products were not
 * on TF32: required on the emulation, whose cuBLASLt rounds the operands
 * as PTX's cvt.rna does and whose mma.m16n8k8 reads them as TF32; on a
 * GPU said, not required (cuBLASLt may keep a product off the tensor
 * cores). The default context's products stay fp32 (to 1e-5). */
void on_tf32(const char *what, void (*body)(kcuda_dtype))
{
    kcuda_ctx *keep = ctx, *tc = NULL;
    if (kcuda_ctx_create(&tc) != 0) {
        fprintf(stderr, "# kcuda_ctx_create: %s\n", kcuda_last_error());
        cur_bad = 1;
        return;
    }
    kcuda_ctx_set_tf32(tc, 1);
    ctx = tc;
    cur_tol = TOL_TF32;
    body(KCUDA_F32);
    ctx = keep;
    kcuda_ctx_free(tc);
    int seen = cur_err > TOL_F32;
    printf("# TF32 %s (%s): the largest error %.2g, fp32's tolerance %.0e\n", seen ? "in effect" : "not seen", what,
           cur_err, TOL_F32);
    if (!seen && emulated()) {
        fprintf(stderr, "# the %s's errors are fp32's: were they on TF32?\n", what);
        cur_bad = 1;
    }
}

/* The matmuls: t_matmul's cases, the tied head's and the GELU's (its
 * product and bias in the epilogue, then the kernel; the backward's
 * product, then the GELU's). */
static void matmul_tf32_cases(kcuda_dtype dt)
{
    t_matmul(dt);
    matmul_case(dt, 64, 96, 128, 1, 1, 0);
    matmul_case(dt, 64, 96, 128, 0, 1, 1);
    matmul_gelu_bwd_case(dt, dt, 64, 96, 128);
}

void t_matmul_tf32(kcuda_dtype dt)
{
    (void)dt;
    on_tf32("products", matmul_tf32_cases);
}

/* cuBLASLt refusing at the call the fused algorithm its heuristic chose
 * (the emulation's EMU_CUBLASLT_REFUSE_EPILOGUE; on a GPU, the cases run
 * as they are): the product falls back to the kernel's bias and GELU (the
 * backward's to the GELU's backward kernel), and
 * the refused algorithm is not kept, so the next call falls back too.
 * (Shapes no other case uses: none cached yet.) */
void t_matmul_refused(kcuda_dtype dt)
{
    setenv("EMU_CUBLASLT_REFUSE_EPILOGUE", "1", 1);
    for (int again = 0; again < 2; again++) {
        matmul_case(dt, 56, 24, 88, 0, 1, 1);
        matmul_case(dt, 56, 24, 88, 0, 1, 0);
        matmul_gelu_bwd_case(dt, dt, 56, 24, 88);
    }
    unsetenv("EMU_CUBLASLT_REFUSE_EPILOGUE");
}

/* The products of one context, for t_matmul_tuned: a forward with bias
 * and the GELU epilogue (pre and y), the tied head's forward, the
 * backward adding into gradients (dx, dw, dbias: C restored between the
 * tuning's candidates, else they would hold the product several times),
 * a weight gradient in fp32 beside 2-byte tensors, and the DGELU
 * epilogue's dpre; into out[0..8), device buffers of n[i] bytes. */
static void tuned_products(kcuda_ctx *c, kcuda_dtype dt, int M, int K, int N,
                           const float *const in[7], void *out[8],
                           size_t n[8])
{
    size_t es = kcuda_dtype_size(dt), mn = (size_t)M * N, mk = (size_t)M * K,
           kn = (size_t)K * N;
    kcuda_dtype wdt = KCUDA_F32;
    void *x = up(in[0], mk, dt), *w = up(in[1], kn, dt), *b = up(in[2], N, dt);
    void *g = up(in[3], mn, dt);
    n[0] = n[1] = n[2] = mn * es;
    n[3] = mk * es, n[4] = kn * es, n[5] = N * es;
    n[6] = kn * kcuda_dtype_size(wdt), n[7] = mk * es;
    out[0] = dmem(n[0]), out[1] = dmem(n[1]), out[2] = dmem(n[2]);
    out[3] = up(in[4], mk, dt), out[4] = up(in[5], kn, dt);
    out[5] = up(in[6], N, dt), out[6] = up(in[5], kn, wdt);
    out[7] = dmem(n[7]);
    KC(kcuda_matmul_forward(c, out[0], out[1], x, w, b, M, K, N, KCUDA_EPI_GELU,
                            dt, NULL));
    KC(kcuda_matmul_wt_forward(c, out[2], x, w, NULL, M, K, N, dt, NULL));
    KC(kcuda_matmul_backward(c, out[3], out[4], out[5], g, x, w, M, K, N, dt,
                             dt, 0, NULL));
    KC(kcuda_matmul_backward(c, NULL, out[6], NULL, g, x, w, M, K, N, dt, wdt,
                             0, NULL));
    KC(kcuda_matmul_gelu_backward(c, out[7], out[4], g, x, w, x, M, K, N, dt,
                                  dt, NULL));
}

/* A context that times cuBLASLt's algorithms (kcuda_ctx_set_gemm_tune)
 * gives the default context's bits in every kind of product. On the
 * emulation, whose heuristic offers (besides the first and the first in
 * another tile) an algorithm that splits the sum over k, another kernel
 * and, with EMU_CUBLASLT_ROTATED, one that sums in another order than
 * its configuration says, each
 * tuned shape sets aside the first two unrun and the third by its output
 * when it has other bits: always in an fp32 output; a 2-byte output's
 * rounding may hide the order on so small a product (the fp32 weight
 * gradient beside 2-byte tensors shows it); and with its fused epilogues
 * refused at the call, the first candidate refused leaves the product to
 * its fallback, as without the tuning. */
/* A context in tuning mode `mode` (with the emulation's rotated
 * algorithm offered when `rotated`) runs tuned_products on `in`: each
 * product must give want's bits; *st what the tuning did (printed). The
 * context, for more products, or NULL if it could not be made. */
static kcuda_ctx *tuned_run(int mode, int rotated, kcuda_dtype dt, int M, int K, int N, const float *const in[7],
                            void *const want[8], const size_t n[8], kcuda_gemm_tune_stats *st)
{
    static const char *const what[8] = {"y (bias, GELU)", "pre", "y (tied head)", "dx",
                                        "dw", "dbias", "dw (fp32)", "dpre (DGELU)"};
    kcuda_ctx *tc = NULL;
    void *got[8];
    size_t gn[8];
    char words[256];
    memset(st, 0, sizeof *st);
    if (kcuda_ctx_create(&tc) != 0) {
        fprintf(stderr, "# kcuda_ctx_create: %s\n", kcuda_last_error());
        cur_bad = 1;
        return NULL;
    }
    kcuda_ctx_set_gemm_tune(tc, mode);
    if (rotated)
        setenv("EMU_CUBLASLT_ROTATED", "1", 1);
    tuned_products(tc, dt, M, K, N, in, got, gn);
    unsetenv("EMU_CUBLASLT_ROTATED");
    for (int i = 0; i < 8 && !cur_bad; i++)
        expect_bits(what[i], down_raw(got[i], n[i]), down_raw(want[i], n[i]), n[i]);
    kcuda_ctx_gemm_tune_stats(tc, st);
    kcuda_gemm_tune_describe(st, words, sizeof words);
    printf("# mode %d: %s\n", mode, words);
    return tc;
}

void t_matmul_tuned(kcuda_dtype dt)
{
    int M = 72, K = 40, N = 56;
    size_t mn = (size_t)M * N, mk = (size_t)M * K, kn = (size_t)K * N;
    const float *in[7] = {rnd(mk, 1.0f, dt), rnd(kn, 0.5f, dt), rnd(N, 0.5f, dt),
                          rnd(mn, 1.0f, dt), rnd(mk, 0.5f, dt), rnd(kn, 0.5f, dt),
                          rnd(N, 0.5f, dt)};
    void *want[8];
    size_t n[8];
    kcuda_gemm_tune_stats st;
    tuned_products(ctx, dt, M, K, N, in, want, n);
    if (cur_bad)
        return;
    /* mode 2: these small products too, the rotated algorithm offered */
    kcuda_ctx *tc = tuned_run(2, 1, dt, M, K, N, in, want, n, &st);
    if (!tc)
        return;
    if (emulated() && !cur_bad) {
        /* 6 shapes in 2-byte types, 5 in fp32 (its dw is the fp32 dw) */
        int s = dt == KCUDA_F32 ? 5 : 6;
        int bits_ok = dt == KCUDA_F32 ? st.other_bits == s
                                      : st.other_bits >= 1 && st.other_bits <= s;
        if (st.shapes != s || st.split != s || st.other_kernel != s ||
            !bits_ok || st.timed != 3 * s - st.other_bits || st.refused != 0) {
            cur_bad = 1;
            fprintf(stderr, "# tuning: expected %d shapes, each with its "
                            "split, its other kernel and (in fp32) its "
                            "other order set aside\n",
                    s);
        }
        setenv("EMU_CUBLASLT_REFUSE_EPILOGUE", "1", 1);
        void *y0 = dmem(mn * 4), *y1 = dmem(mn * 4), *p0 = dmem(mn * 4),
             *p1 = dmem(mn * 4);
        void *x = up(in[0], mk, dt), *w = up(in[1], kn, dt), *b = up(in[2], N, dt);
        int rc0 = kcuda_matmul_forward(ctx, y0, p0, x, w, b, M - 8, K, N,
                                       KCUDA_EPI_GELU, dt, NULL);
        int rc1 = kcuda_matmul_forward(tc, y1, p1, x, w, b, M - 8, K, N,
                                       KCUDA_EPI_GELU, dt, NULL);
        unsetenv("EMU_CUBLASLT_REFUSE_EPILOGUE");
        kcuda_ctx_gemm_tune_stats(tc, &st);
        size_t bytes = (size_t)(M - 8) * N * kcuda_dtype_size(dt);
        if (rc0 != 0 || rc1 != 0 || st.refused != 1) {
            cur_bad = 1;
            fprintf(stderr, "# refused epilogue: %d, %d, %d refused: %s\n",
                    rc0, rc1, st.refused, kcuda_last_error());
        } else {
            expect_bits("y (refused epilogue)", down_raw(y1, bytes),
                        down_raw(y0, bytes), bytes);
        }
    }
    kcuda_ctx_free(tc);
    /* mode 1: of these small products only those with an fp32 output
     * (every one in fp32, the fp32 dw beside 2-byte tensors) are tuned;
     * the default's bits all the same */
    tc = tuned_run(1, 0, dt, M, K, N, in, want, n, &st);
    if (emulated() && !cur_bad &&
        (dt == KCUDA_F32 ? st.shapes != 5 || st.small != 0
                         : st.shapes != 1 || st.small != 5)) {
        cur_bad = 1;
        fprintf(stderr, "# mode 1 tuned %d shapes and left %d for their "
                        "size\n", st.shapes, st.small);
    }
    kcuda_ctx_free(tc);
}

void t_matmul_wt(kcuda_dtype dt)
{
    matmul_case(dt, 67, 45, 33, 1, 1, 0);
    matmul_case(dt, 64, 96, 128, 1, 0, 0);
}
