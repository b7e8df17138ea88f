/*
 * gpu_tests.c: every CUDA kernel (kernels/cuda, kcuda.h) against the CPU
 * reference (kernels/cpu, kcpu.h) on the same random inputs, forward and
 * backward, in fp32, bf16 and fp16.
 *
 * usage: gpu_tests [SUBSTRING...]   (no arguments: every case, in order)
 * GPU_TESTS_SKIP="SUBSTRING..." skips the cases whose names contain one
 * (each reported `ok N - name # SKIP GPU_TESTS_SKIP`, counted as passed:
 * the emulation's ThreadSanitizer run leaves out the fp16 cases, the bf16
 * ones' code with another type). GPU_TESTS_AFTER=NAME runs only the
 * cases after the one named NAME (exactly), in order: what a device error
 * or a crash in NAME left unrun (tests/gpu/run.sh's gpu_tests step runs
 * them so, in a new process). GPU_TESTS_ABORT=NAME aborts the process as
 * the case NAME starts (a test of that step's recovery, as a crash).
 *
 * Output is TAP-like, as the unit tests': `ok N - name (err E, tol T)` or
 * `not ok N - name ...` (details on stderr, prefixed "# "), each case
 * announced first by `# case NAME` (so that a crash or a hang names it),
 * then `# N passed, N failed`; after a device error, which is sticky,
 * the cases left are not run and count as failed, said first by
 * `# stopped after NAME: ...`. The error of a tensor is its largest absolute
 * difference over its largest reference magnitude; the tolerance is 1e-5
 * in fp32, 2e-2 in bf16 and 5e-3 in fp16 (where the inputs are rounded to
 * the 2-byte type first and the CPU runs on the rounded values), 0 where
 * the GPU promises the CPU's
 * bits (AdamW, integer routing arrays). Cases that promise determinism run
 * twice and compare the bits.
 *
 * Without a usable GPU (no driver, no device: kcuda_available says why) it
 * prints `SKIP gpu: no GPU (<reason>)` and exits 0. Exit status: 0 when all
 * passed, 1 if any failed.
 */
#include <math.h>   /* defines: fabs, isnan, INFINITY */
#include <stdint.h> /* defines: uint16_t, uint32_t, uint64_t, int32_t */
#include <stdio.h>  /* defines: printf, fprintf, sscanf */
#include <stdlib.h> /* defines: malloc, free, exit, getenv */
#include <string.h> /* defines: memcpy, memcmp, strstr */

#include <cuda_runtime_api.h> /* defines: cudaMalloc, cudaMemcpy, cudaFree */

#include "kcpu.h"  /* defines: kcpu_* (the reference) */
#include "kcuda.h" /* defines: kcuda_* */

/* ---- the current case -------------------------------------------------- */

static int cur_bad;          /* a check or a call failed */
static double cur_err;       /* the largest error seen */
static double cur_tol;       /* the case's tolerance */
static double cur_floor;     /* rel_err's least magnitude: where a result is a
                              * cancellation (the attention's dq and dk at
                              * T 1 are 0 but for rounding), the scale of its
                              * terms, not of the noise left */
static char cur_shape[160];  /* the sweep's shape in hand ("" elsewhere) */
static kcuda_ctx *ctx;       /* one context for every case */
static int emulated(void);

#define TOL_F32 1e-5
#define TOL_BF16 2e-2
#define TOL_F16 5e-3 /* 3 more mantissa bits than bf16 */
#define TOL_TF32 TOL_F16 /* fp32 products of TF32 operands: fp16's mantissa */

static double tol_of(kcuda_dtype dt)
{
    return dt == KCUDA_BF16 ? TOL_BF16 : dt == KCUDA_F16 ? TOL_F16 : TOL_F32;
}

/* kcpu's name for a 2-byte dtype's rounding. */
static kcpu_precision prec_of(kcuda_dtype dt)
{
    return dt == KCUDA_F16 ? KCPU_FP16 : KCPU_BF16;
}

/* Fail the case when a kcuda call returns non-zero (and leave it). */
#define KC(call)                                                               \
    do {                                                                       \
        int kc_rc_ = (call);                                                   \
        if (kc_rc_ != 0) {                                                     \
            fprintf(stderr, "# %s:%d: %s%s returned %d: %s\n", __FILE__,       \
                    __LINE__, cur_shape, #call, kc_rc_, kcuda_last_error());   \
            cur_bad = 1;                                                       \
            return;                                                            \
        }                                                                      \
    } while (0)

/* The same for a CUDA runtime call; exits on failure (setup only). */
static void cuda_or_die(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "# %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* ---- host and device buffers, freed after each case --------------------- */

enum { MAX_BUFS = 2048 };
static void *hbufs[MAX_BUFS], *dbufs[MAX_BUFS];
static int nh, nd;

static void *hmem(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || nh == MAX_BUFS) {
        fprintf(stderr, "# out of host buffers\n");
        exit(1);
    }
    hbufs[nh++] = p;
    return p;
}

static float *hf(size_t n)
{
    return hmem(n * sizeof(float));
}

static void *dmem(size_t bytes)
{
    void *p = NULL;
    cuda_or_die(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    cuda_or_die(cudaMemset(p, 0, bytes ? bytes : 1), "cudaMemset");
    if (nd == MAX_BUFS) {
        fprintf(stderr, "# out of device buffers\n");
        exit(1);
    }
    dbufs[nd++] = p;
    return p;
}

static void free_all(void)
{
    while (nh > 0)
        free(hbufs[--nh]);
    while (nd > 0)
        cudaFree(dbufs[--nd]);
}

/* ---- random numbers and bf16 on the host -------------------------------- */

static uint64_t rng = 88172645463325252ull;

/* xorshift64*: uniform in [-1, 1). */
static float frand(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    uint64_t r = rng * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static int irand(int n)
{
    float u = (frand() + 1.0f) * 0.5f;
    int k = (int)(u * (float)n);
    return k < 0 ? 0 : k >= n ? n - 1 : k;
}

/* x[n] uniform in [-scale, scale), rounded to dt's precision. */
static float *rnd(size_t n, float scale, kcuda_dtype dt)
{
    float *x = hf(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = frand() * scale;
        if (dt != KCUDA_F32)
            kcpu_round(&x[i], 1, prec_of(dt));
    }
    return x;
}

/* A device copy of x[n] stored in dt. */
static void *up(const float *x, size_t n, kcuda_dtype dt)
{
    void *d = dmem(n * kcuda_dtype_size(dt));
    if (dt != KCUDA_F32) {
        uint16_t *h = hmem(n * sizeof *h);
        kcpu_pack16(h, x, n, prec_of(dt));
        cuda_or_die(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice), "upload");
    } else {
        cuda_or_die(cudaMemcpy(d, x, n * 4, cudaMemcpyHostToDevice), "upload");
    }
    return d;
}

static void *up_i32(const int32_t *x, size_t n)
{
    void *d = dmem(n * sizeof *x);
    cuda_or_die(cudaMemcpy(d, x, n * sizeof *x, cudaMemcpyHostToDevice),
                "upload");
    return d;
}

/* The device tensor d[n] (in dt) as floats; waits for the device. */
static float *down(const void *d, size_t n, kcuda_dtype dt)
{
    float *x = hf(n);
    cuda_or_die(cudaDeviceSynchronize(), "kernel");
    if (dt != KCUDA_F32) {
        uint16_t *h = hmem(n * sizeof *h);
        cuda_or_die(cudaMemcpy(h, d, n * 2, cudaMemcpyDeviceToHost), "download");
        kcpu_unpack16(x, h, n, prec_of(dt));
    } else {
        cuda_or_die(cudaMemcpy(x, d, n * 4, cudaMemcpyDeviceToHost), "download");
    }
    return x;
}

static void *down_raw(const void *d, size_t bytes)
{
    void *h = hmem(bytes);
    cuda_or_die(cudaDeviceSynchronize(), "kernel");
    cuda_or_die(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "download");
    return h;
}

/* ---- checks ------------------------------------------------------------- */

/* max |got - want| / max |want| (0 for an all-zero want equal to got). */
static double rel_err(const float *got, const float *want, size_t n)
{
    double diff = 0.0, mag = 0.0;
    for (size_t i = 0; i < n; i++) {
        double dd = fabs((double)got[i] - (double)want[i]);
        if (isnan(got[i]) != isnan(want[i]) || isnan(dd))
            return INFINITY;
        diff = dd > diff ? dd : diff;
        mag = fabs((double)want[i]) > mag ? fabs((double)want[i]) : mag;
    }
    if (diff == 0.0)
        return 0.0;
    if (mag < cur_floor)
        mag = cur_floor;
    return mag > 0.0 ? diff / mag : INFINITY;
}

static void note(double e)
{
    if (e > cur_err || isnan(e))
        cur_err = e;
}

/* got[n] against want[n] within the case's tolerance. */
static void expect(const char *what, const float *got, const float *want,
                   size_t n)
{
    double e = rel_err(got, want, n);
    note(e);
    if (!(e <= cur_tol)) {
        cur_bad = 1;
        fprintf(stderr, "# %s%s: error %.3g over tolerance %.3g\n", cur_shape,
                what, e, cur_tol);
        for (size_t i = 0, shown = 0; i < n && shown < 3; i++)
            if (fabs((double)got[i] - want[i]) > cur_tol * fabs((double)want[i]) + 1e-30) {
                fprintf(stderr, "#   [%zu] got %.8g want %.8g\n", i, got[i],
                        want[i]);
                shown++;
            }
    }
}

/* The device tensor d against want. */
static void expect_dev(const char *what, const void *d, const float *want,
                       size_t n, kcuda_dtype dt)
{
    expect(what, down(d, n, dt), want, n);
}

/* Bit for bit. */
static void expect_bits(const char *what, const void *got, const void *want,
                        size_t bytes)
{
    if (memcmp(got, want, bytes) != 0) {
        cur_bad = 1;
        fprintf(stderr, "# %s%s: not the same bits\n", cur_shape, what);
    }
}

static void expect_ints(const char *what, const int *got, const int *want,
                        size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            cur_bad = 1;
            fprintf(stderr, "# %s: [%zu] got %d want %d\n", what, i, got[i],
                    want[i]);
            return;
        }
}

/* A device copy of the device tensor d (n elements of dt) taken now. */
static void *snapshot(const void *d, size_t n, kcuda_dtype dt)
{
    return down_raw(d, n * kcuda_dtype_size(dt));
}

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

static void matmul_case(kcuda_dtype dt, int M, int K, int N, int wt,
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

static void t_matmul(kcuda_dtype dt)
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
static void t_bias_backward(kcuda_dtype dt)
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
static void t_matmul_assign(kcuda_dtype dt)
{
    int shapes[3][3] = {{67, 45, 33}, {64, 96, 128}, {300, 64, 40}};
    for (int i = 0; i < 3; i++)
        for (int wt = 0; wt < 2; wt++)
            matmul_bwd_case(dt, dt, shapes[i][0], shapes[i][1], shapes[i][2], wt, 1);
}

/* A weight gradient in fp32 beside 2-byte tensors (an fp32 main gradient
 * the product is added to in fp32): within fp32's tolerance of the CPU's
 * fp32 sums of the same (2-byte) inputs; dx stays 2-byte. */
static void t_matmul_f32_dw(kcuda_dtype dt)
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

static void t_matmul_gelu(kcuda_dtype dt)
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
static void on_tf32(const char *what, void (*body)(kcuda_dtype))
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

static void t_matmul_tf32(kcuda_dtype dt)
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
static void t_matmul_refused(kcuda_dtype dt)
{
    setenv("EMU_CUBLASLT_REFUSE_EPILOGUE", "1", 1);
    for (int again = 0; again < 2; again++) {
        matmul_case(dt, 56, 24, 88, 0, 1, 1);
        matmul_case(dt, 56, 24, 88, 0, 1, 0);
        matmul_gelu_bwd_case(dt, dt, 56, 24, 88);
    }
    unsetenv("EMU_CUBLASLT_REFUSE_EPILOGUE");
}

/* 1 on the CPU emulation (tests/gpu/emu), whose cuBLASLt offers known
 * algorithms. */
static int emulated(void)
{
    struct cudaDeviceProp prop;
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess &&
           strstr(prop.name, "CPU emulation") != NULL;
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

static void t_matmul_tuned(kcuda_dtype dt)
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

static void t_matmul_wt(kcuda_dtype dt)
{
    matmul_case(dt, 67, 45, 33, 1, 1, 0);
    matmul_case(dt, 64, 96, 128, 1, 0, 0);
}

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
static void norm_case(kcuda_dtype dt, kcuda_dtype wdt, int rows, int C,
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

static void t_layernorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 0, 0);
    norm_case(dt, dt, 300, 75, 0, 0); /* rows not in packs; two row chunks */
    norm_case(dt, dt, 130, 2048, 0, 0); /* three warps a block, three chunks */
    norm_case(dt, dt, 5, 6200, 0, 0);   /* too wide: dw, db in a pass of their own */
}

static void t_rmsnorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 1, 0);
    norm_case(dt, dt, 300, 75, 1, 0);
    norm_case(dt, dt, 5, 6200, 1, 0); /* one warp a block */
    norm_case(dt, dt, 3, 12400, 1, 0); /* too wide: dw in a pass of its own */
}

/* 2-byte tensors with fp32 weight gradients (fp32 main gradients) */
static void t_norm_f32_grads(kcuda_dtype dt)
{
    norm_case(dt, KCUDA_F32, 300, 75, 0, 0);
    norm_case(dt, KCUDA_F32, 700, 96, 1, 0); /* three row chunks */
}

static void t_add_layernorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 0, 1);
    norm_case(dt, dt, 9, 75, 0, 1);
    norm_case(dt, dt, 9, 96, 0, 2);
}

static void t_add_rmsnorm(kcuda_dtype dt)
{
    norm_case(dt, dt, 37, 96, 1, 1);
    norm_case(dt, dt, 9, 75, 1, 1);
    norm_case(dt, dt, 9, 96, 1, 2);
}

/* ---- cases: elementwise ------------------------------------------------- */

enum { ACT_GELU, ACT_SILU, ACT_SWIGLU };

static void act_case(kcuda_dtype dt, int kind, size_t n, float scale)
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

static void t_gelu(kcuda_dtype dt)
{
    act_case(dt, ACT_GELU, 1003, 4.0f);
    act_case(dt, ACT_GELU, 8, 4.0f);
    /* the far tails: below x = -10.07 e^(-2u) overflows fp32 (the
     * backward's e s must stay 1, not inf * 0) */
    act_case(dt, ACT_GELU, 1003, 40.0f);
}

static void t_silu(kcuda_dtype dt)
{
    act_case(dt, ACT_SILU, 1003, 4.0f);
    act_case(dt, ACT_SILU, 1003, 200.0f); /* e^-x overflows below -88 */
}

static void t_swiglu(kcuda_dtype dt)
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

static void t_add(kcuda_dtype dt)
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
static void t_bcast_f32_grads(kcuda_dtype dt)
{
    bcast_case(dt, KCUDA_F32, 3, 5, 7);
    bcast_case(dt, KCUDA_F32, 600, 1, 37);
}

/* ---- cases: rope -------------------------------------------------------- */

static void t_rope(kcuda_dtype dt)
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
static void embed_case(kcuda_dtype dt, kcuda_dtype tdt, int n, int V, int C,
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

static void t_embedding_f32_grads(kcuda_dtype dt)
{
    embed_case(dt, KCUDA_F32, 300, 40, 13, 0, 40);
    embed_case(dt, KCUDA_F32, 64, 30, 16, 8, 10);
    embed_case(dt, KCUDA_F32, 600, 5, 64, 0, 5); /* long runs, in packs: the CPU's bits */
}

static void t_embedding(kcuda_dtype dt)
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

/* ---- cases: cross-entropy ----------------------------------------------- */

/* fused: 0 the two calls (the backward adds), 1 the fused kernel (it
 * overwrites dlogits), 2 the fused kernel with dlogits the logits; ninf:
 * the first ninf logits of every other row are -inf (masked: their
 * probabilities 0; the running maximum starts at -inf over them), the
 * target past them */
static void ce_case(kcuda_dtype dt, int N, int V, int Vp, int fused, int ninf)
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

static void t_crossentropy(kcuda_dtype dt)
{
    ce_case(dt, 13, 1000, 1024, 0, 0);
    ce_case(dt, 5, 77, 77, 0, 0); /* rows not in packs */
    ce_case(dt, 7, 1000, 1024, 0, 333); /* -inf logits, in packs and apart */
    ce_case(dt, 4, 77, 77, 0, 50);
}

static void t_crossentropy_fused(kcuda_dtype dt)
{
    for (int fused = 1; fused <= 2; fused++) { /* apart, then in place */
        ce_case(dt, 13, 1000, 1024, fused, 0);
        ce_case(dt, 5, 77, 80, fused, 0);
        ce_case(dt, 4, 77, 77, fused, 50);
    }
}

static void t_crossentropy_shard(kcuda_dtype dt)
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

static void t_crossentropy_exchange(kcuda_dtype dt)
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

static void t_adamw(kcuda_dtype dt)
{
    adamw_case(dt, dt);
}

/* fp32 main gradients beside 2-byte weights (the executor's mixed
 * precision); and an op's 2-byte contribution accumulated into them */
static void t_adamw_f32_grads(kcuda_dtype dt)
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

static void t_global_norm(kcuda_dtype dt)
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

/* The context's kcuda_ctx_set_deterministic mode (attention_mode). */
static int attn_mode = 1;

/* ---- cases: attention ----------------------------------------------------- */

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
static void attn_case(kcuda_dtype dt, int B, int T, int H, int KV, int d,
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

static void t_attention(kcuda_dtype dt)
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

static void t_attention_atomic_dq(kcuda_dtype dt)
{
    attention_mode(dt, 0);
}

static void t_attention_dq_turns(kcuda_dtype dt)
{
    attention_mode(dt, 2);
}

static void t_attention_qkv(kcuda_dtype dt)
{
    attn_case(dt, 2, 70, 4, 2, 32, 1, 1);
    attn_case(dt, 1, 65, 2, 2, 64, 0, 1);
}

/* kcuda_sum_squares_many against a kcuda_sum_squares call a buffer, to
 * the bit: 70 buffers (two launches of 64 and 6), sizes from 0 and 1 to
 * past the fixed grid's 1024 x 256 elements, the large ones in both
 * launches; each buffer's sum into its own double, added to what was
 * there. */
static void t_sum_squares_many(kcuda_dtype dt)
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
static void t_adamw_many(kcuda_dtype dt)
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

/* The attention's tile products on TF32 tensor cores (the forward, the
 * dk/dv kernel and dq's, mma.sync m16n8k8): t_attention's and
 * t_attention_qkv's cases, every padded head size, masked and full tiles,
 * operands in packs and not. */
static void attention_tf32_cases(kcuda_dtype dt)
{
    t_attention(dt);
    t_attention_qkv(dt);
}

static void t_attention_tf32(kcuda_dtype dt)
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
static void t_attention_cudnn(kcuda_dtype dt)
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

/* ---- cases: random shapes ---------------------------------------------- */

/* A uniform integer in [lo, hi]. */
static int pick(int lo, int hi)
{
    return lo + irand(hi - lo + 1);
}

/* The fixed cases above pick their shapes; this one draws them, from the
 * tests' fixed seed (the same shapes every run): GPU_TESTS_SWEEP shapes
 * (default 30) of matmuls (plain, with the transposed weight, with bias
 * and GELU), norms (with the residual add), attention (packed or not,
 * grouped-query, causal or not, any head size up to 128), embeddings (a
 * vocabulary shard), cross-entropy (fused or not, padded vocabularies)
 * and the activations, each from 1 element up, checked as their cases
 * are. A failure names its shape. */
static void t_sweep(kcuda_dtype dt)
{
    const char *env = getenv("GPU_TESTS_SWEEP");
    int n = env ? atoi(env) : 30;
    for (int i = 0; i < n && !cur_bad; i++) {
        int kind = i % 6;
        if (kind == 0) {
            int M = pick(1, 96), K = pick(1, 96), N = pick(1, 96);
            int wt = irand(2), bias = irand(2), gelu = !wt && irand(3) == 0;
            snprintf(cur_shape, sizeof cur_shape,
                     "matmul M %d K %d N %d%s%s%s: ", M, K, N,
                     wt ? " wt" : "", bias ? " bias" : "", gelu ? " gelu" : "");
            matmul_case(dt, M, K, N, wt, bias || gelu, gelu);
        } else if (kind == 1) {
            int rows = pick(1, 70), C = pick(1, 300), rms = irand(2);
            int add = irand(2);
            kcuda_dtype wdt = dt != KCUDA_F32 && irand(2) ? KCUDA_F32 : dt;
            snprintf(cur_shape, sizeof cur_shape, "norm rows %d C %d%s%s%s: ",
                     rows, C, rms ? " rms" : "", add ? " add" : "",
                     wdt != dt ? " fp32 dw" : "");
            norm_case(dt, wdt, rows, C, rms, add);
        } else if (kind == 2) {
            int KV = pick(1, 3), H = KV * pick(1, 3), B = pick(1, 2);
            int T = pick(1, 90), d = pick(1, 128), causal = irand(4) != 0;
            int packed = irand(2);
            snprintf(cur_shape, sizeof cur_shape,
                     "attention B %d T %d H %d KV %d d %d%s%s: ", B, T, H, KV,
                     d, causal ? " causal" : "", packed ? " packed" : "");
            attn_case(dt, B, T, H, KV, d, causal, packed);
        } else if (kind == 3) {
            int V = pick(1, 60), C = pick(1, 40), row0 = irand(V);
            int rows = pick(1, V - row0), tokens = pick(1, 200);
            snprintf(cur_shape, sizeof cur_shape,
                     "embedding n %d V %d C %d rows %d..%d: ", tokens, V, C,
                     row0, row0 + rows);
            embed_case(dt, dt, tokens, V, C, row0, rows);
        } else if (kind == 4) {
            int N = pick(1, 24), V = pick(1, 1200), Vp = V + irand(40);
            int fused = irand(2);
            snprintf(cur_shape, sizeof cur_shape,
                     "crossentropy N %d V %d Vp %d%s: ", N, V, Vp,
                     fused ? " fused" : "");
            ce_case(dt, N, V, Vp, fused, 0);
        } else {
            int act = irand(3), len = pick(1, 5000);
            snprintf(cur_shape, sizeof cur_shape, "%s n %d: ",
                     act == ACT_GELU ? "gelu" : act == ACT_SILU ? "silu"
                                                                : "swiglu",
                     len);
            act_case(dt, act, (size_t)len, 6.0f);
        }
        if (cudaDeviceSynchronize() != cudaSuccess)
            break; /* (main reports the device's error) */
        free_all();
    }
    if (!cur_bad)
        cur_shape[0] = 0;
}

/* ---- cases: mixture of experts -------------------------------------------- */

static void t_moe(kcuda_dtype dt)
{
    int N = 40, E = 6, K = 2, D = 16, F = 24;
    int C = kcpu_moe_capacity(N, E, K, 1.0);
    double keep = cur_tol;
    /* routing is fp32 */
    cur_tol = TOL_F32;
    float *x = rnd((size_t)N * D, 1.0f, dt), *router = rnd((size_t)D * E, 1.0f,
                                                           KCUDA_F32);
    kcpu_moe_route *cr = kcpu_moe_route_alloc(N, E, K, C);
    if (!cr) {
        cur_bad = 1;
        fprintf(stderr, "# kcpu_moe_route_alloc failed\n");
        return;
    }
    kcpu_moe_route_forward(cr, x, router, D);
    kcuda_moe_route gr;
    void *mem = dmem(kcuda_moe_route_bytes(N, E, K, C));
    KC(kcuda_moe_route_bind(&gr, mem, N, E, K, C));
    float *dx32 = up(x, (size_t)N * D, KCUDA_F32);
    float *drouter = up(router, (size_t)D * E, KCUDA_F32);
    KC(kcuda_moe_route_forward(ctx, &gr, dx32, drouter, D, NULL));
    expect_dev("probs", gr.probs, cr->probs, (size_t)N * E, KCUDA_F32);
    expect_dev("weight", gr.weight, cr->weight, (size_t)N * K, KCUDA_F32);
    expect_ints("expert", down_raw(gr.expert, (size_t)N * K * 4), cr->expert,
                (size_t)N * K);
    expect_ints("slot", down_raw(gr.slot, (size_t)N * K * 4), cr->slot,
                (size_t)N * K);
    expect_ints("token", down_raw(gr.token, (size_t)E * C * 4), cr->token,
                (size_t)E * C);
    expect_ints("count", down_raw(gr.count, (size_t)E * 4), cr->count,
                (size_t)E);
    expect_ints("chosen", down_raw(gr.chosen, (size_t)E * 4), cr->chosen,
                (size_t)E);
    expect_ints("dropped", down_raw(gr.dropped, 4), &cr->dropped, 1);
    expect_dev("aux", gr.aux, &cr->aux, 1, KCUDA_F32);
    /* routing backward */
    float *dwt = rnd((size_t)N * K, 1.0f, KCUDA_F32);
    float *gx = rnd((size_t)N * D, 0.5f, KCUDA_F32);
    float *grt = rnd((size_t)D * E, 0.5f, KCUDA_F32);
    float *scratch = hf((size_t)N * E);
    float *ddwt = up(dwt, (size_t)N * K, KCUDA_F32);
    float *dgx = up(gx, (size_t)N * D, KCUDA_F32);
    float *dgrt = up(grt, (size_t)D * E, KCUDA_F32);
    float *dscr = dmem((size_t)N * E * 4);
    kcpu_moe_route_backward(gx, grt, scratch, dwt, 0.01f, cr, x, router, D);
    KC(kcuda_moe_route_backward(ctx, dgx, dgrt, dscr, ddwt, 0.01f, &gr, dx32,
                                drouter, D, NULL));
    expect_dev("route dx", dgx, gx, (size_t)N * D, KCUDA_F32);
    expect_dev("route drouter", dgrt, grt, (size_t)D * E, KCUDA_F32);
    cur_tol = keep;

    /* dispatch, experts, combine, and back */
    size_t ecd = (size_t)E * C * D, ecf = (size_t)E * C * F;
    float *xe = hf(ecd), *ye = hf(ecd), *y = hf((size_t)N * D);
    float *hg = hf(ecf), *hu = hf(ecf), *act = hf(ecf);
    float *wg = rnd((size_t)E * D * F, 0.5f, dt), *wu = rnd((size_t)E * D * F, 0.5f, dt);
    float *wd = rnd((size_t)E * F * D, 0.5f, dt);
    void *dxd = up(x, (size_t)N * D, dt), *dxe = dmem(ecd * 4);
    void *dye = dmem(ecd * 4), *dy = dmem((size_t)N * D * 4);
    void *dhg = dmem(ecf * 4), *dhu = dmem(ecf * 4), *dact = dmem(ecf * 4);
    void *dwg = up(wg, (size_t)E * D * F, dt), *dwu = up(wu, (size_t)E * D * F, dt);
    void *dwd = up(wd, (size_t)E * F * D, dt);
    kcpu_moe_dispatch_forward(xe, x, cr, D);
    KC(kcuda_moe_dispatch_forward(dxe, dxd, &gr, D, dt, NULL));
    expect_dev("xe", dxe, xe, ecd, dt);
    kcpu_moe_expert_forward(ye, hg, hu, act, xe, wg, wu, wd, cr->count, E, C,
                            D, F);
    KC(kcuda_moe_expert_forward(ctx, dye, dhg, dhu, dact, dxe, dwg, dwu, dwd,
                                gr.count, E, C, D, F, dt, NULL));
    expect_dev("ye", dye, ye, ecd, dt);
    { /* hg, hu, act on the rows the CPU computes */
        float *g_hg = down(dhg, ecf, dt), *g_act = down(dact, ecf, dt);
        for (int e = 0; e < E; e++) {
            size_t o = (size_t)e * C * F, len = (size_t)cr->count[e] * F;
            expect("hg", g_hg + o, hg + o, len);
            expect("act", g_act + o, act + o, len);
        }
    }
    if (dt != KCUDA_F32)
        kcpu_round(ye, ecd, prec_of(dt)); /* the combine reads the stored ye */
    kcpu_moe_combine_forward(y, ye, cr, D);
    KC(kcuda_moe_combine_forward(dy, dye, &gr, D, dt, NULL));
    expect_dev("y", dy, y, (size_t)N * D, dt);

    float *gy = rnd((size_t)N * D, 1.0f, dt), *gye = rnd(ecd, 0.5f, dt);
    float *gw = rnd((size_t)N * K, 0.5f, KCUDA_F32);
    void *dgy = up(gy, (size_t)N * D, dt), *dgye = up(gye, ecd, dt);
    float *dgw = up(gw, (size_t)N * K, KCUDA_F32);
    kcpu_moe_combine_backward(gye, gw, gy, ye, cr, D);
    KC(kcuda_moe_combine_backward(dgye, dgw, dgy, dye, &gr, D, dt, NULL));
    expect_dev("dye", dgye, gye, ecd, dt);
    expect_dev("dweight", dgw, gw, (size_t)N * K, KCUDA_F32);

    float *gxe = rnd(ecd, 0.5f, dt), *gwg = rnd((size_t)E * D * F, 0.5f, dt);
    float *gwu = rnd((size_t)E * D * F, 0.5f, dt), *gwd = rnd((size_t)E * F * D, 0.5f, dt);
    float *escr = hf((size_t)2 * C * F);
    void *dgxe = up(gxe, ecd, dt), *dgwg = up(gwg, (size_t)E * D * F, dt);
    void *dgwu = up(gwu, (size_t)E * D * F, dt), *dgwd = up(gwd, (size_t)E * F * D, dt);
    /* the backward reads the device's dye (rounded in bf16) and the
     * forward's saved tensors; give the CPU the same */
    float *gye_dev = down(dgye, ecd, dt);
    float *hg_dev = down(dhg, ecf, dt), *hu_dev = down(dhu, ecf, dt);
    float *act_dev = down(dact, ecf, dt), *xe_dev = down(dxe, ecd, dt);
    kcpu_moe_expert_backward(gxe, gwg, gwu, gwd, escr, gye_dev, hg_dev, hu_dev,
                             act_dev, xe_dev, wg, wu, wd, cr->count, E, C, D,
                             F);
    KC(kcuda_moe_expert_backward(ctx, dgxe, dgwg, dgwu, dgwd, dgye, dhg, dhu,
                                 dact, dxe, dwg, dwu, dwd, gr.count, E, C, D,
                                 F, dt, NULL));
    expect_dev("dxe", dgxe, gxe, ecd, dt);
    expect_dev("dw_gate", dgwg, gwg, (size_t)E * D * F, dt);
    expect_dev("dw_up", dgwu, gwu, (size_t)E * D * F, dt);
    expect_dev("dw_down", dgwd, gwd, (size_t)E * F * D, dt);

    float *gx2 = rnd((size_t)N * D, 0.5f, dt);
    void *dgx2 = up(gx2, (size_t)N * D, dt);
    float *gxe_dev = down(dgxe, ecd, dt);
    kcpu_moe_dispatch_backward(gx2, gxe_dev, cr, D);
    KC(kcuda_moe_dispatch_backward(dgx2, dgxe, &gr, D, dt, NULL));
    expect_dev("dispatch dx", dgx2, gx2, (size_t)N * D, dt);
    kcpu_moe_route_free(cr);
}

/* ---- cases: conversion ---------------------------------------------------- */

static void t_convert(kcuda_dtype dt)
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
static void t_arange(kcuda_dtype dt)
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

/* ---- the runner ----------------------------------------------------------- */

typedef struct gpu_case {
    const char *name;
    void (*fn)(kcuda_dtype);
    kcuda_dtype dt;
} gpu_case;

static const gpu_case cases[] = {
    {"convert", t_convert, KCUDA_F32},
    {"arange", t_arange, KCUDA_F32},
    {"matmul_f32", t_matmul, KCUDA_F32},
    {"matmul_bf16", t_matmul, KCUDA_BF16},
    {"matmul_f16", t_matmul, KCUDA_F16},
    {"bias_backward_f32", t_bias_backward, KCUDA_F32},
    {"bias_backward_bf16", t_bias_backward, KCUDA_BF16},
    {"bias_backward_f16", t_bias_backward, KCUDA_F16},
    {"matmul_f32_dw_bf16", t_matmul_f32_dw, KCUDA_BF16},
    {"matmul_f32_dw_f16", t_matmul_f32_dw, KCUDA_F16},
    {"matmul_gelu_f32", t_matmul_gelu, KCUDA_F32},
    {"matmul_gelu_bf16", t_matmul_gelu, KCUDA_BF16},
    {"matmul_gelu_f16", t_matmul_gelu, KCUDA_F16},
    {"matmul_refused_bf16", t_matmul_refused, KCUDA_BF16},
    {"matmul_assign_f32", t_matmul_assign, KCUDA_F32},
    {"matmul_assign_bf16", t_matmul_assign, KCUDA_BF16},
    {"matmul_refused_f32", t_matmul_refused, KCUDA_F32},
    {"matmul_tuned_f32", t_matmul_tuned, KCUDA_F32},
    {"matmul_tuned_bf16", t_matmul_tuned, KCUDA_BF16},
    {"matmul_tuned_f16", t_matmul_tuned, KCUDA_F16},
    {"matmul_wt_f32", t_matmul_wt, KCUDA_F32},
    {"matmul_wt_bf16", t_matmul_wt, KCUDA_BF16},
    {"matmul_wt_f16", t_matmul_wt, KCUDA_F16},
    {"layernorm_f32", t_layernorm, KCUDA_F32},
    {"layernorm_bf16", t_layernorm, KCUDA_BF16},
    {"layernorm_f16", t_layernorm, KCUDA_F16},
    {"rmsnorm_f32", t_rmsnorm, KCUDA_F32},
    {"rmsnorm_bf16", t_rmsnorm, KCUDA_BF16},
    {"rmsnorm_f16", t_rmsnorm, KCUDA_F16},
    {"norm_f32_grads_bf16", t_norm_f32_grads, KCUDA_BF16},
    {"norm_f32_grads_f16", t_norm_f32_grads, KCUDA_F16},
    {"add_layernorm_f32", t_add_layernorm, KCUDA_F32},
    {"add_layernorm_bf16", t_add_layernorm, KCUDA_BF16},
    {"add_layernorm_f16", t_add_layernorm, KCUDA_F16},
    {"add_rmsnorm_f32", t_add_rmsnorm, KCUDA_F32},
    {"add_rmsnorm_bf16", t_add_rmsnorm, KCUDA_BF16},
    {"add_rmsnorm_f16", t_add_rmsnorm, KCUDA_F16},
    {"gelu_f32", t_gelu, KCUDA_F32},
    {"gelu_bf16", t_gelu, KCUDA_BF16},
    {"gelu_f16", t_gelu, KCUDA_F16},
    {"silu_f32", t_silu, KCUDA_F32},
    {"silu_bf16", t_silu, KCUDA_BF16},
    {"silu_f16", t_silu, KCUDA_F16},
    {"swiglu_f32", t_swiglu, KCUDA_F32},
    {"swiglu_bf16", t_swiglu, KCUDA_BF16},
    {"swiglu_f16", t_swiglu, KCUDA_F16},
    {"add_f32", t_add, KCUDA_F32},
    {"add_bf16", t_add, KCUDA_BF16},
    {"add_f16", t_add, KCUDA_F16},
    {"add_broadcast_f32_grads_bf16", t_bcast_f32_grads, KCUDA_BF16},
    {"add_broadcast_f32_grads_f16", t_bcast_f32_grads, KCUDA_F16},
    {"rope_f32", t_rope, KCUDA_F32},
    {"rope_bf16", t_rope, KCUDA_BF16},
    {"rope_f16", t_rope, KCUDA_F16},
    {"embedding_f32", t_embedding, KCUDA_F32},
    {"embedding_bf16", t_embedding, KCUDA_BF16},
    {"embedding_f16", t_embedding, KCUDA_F16},
    {"embedding_f32_grads_bf16", t_embedding_f32_grads, KCUDA_BF16},
    {"embedding_f32_grads_f16", t_embedding_f32_grads, KCUDA_F16},
    {"crossentropy_f32", t_crossentropy, KCUDA_F32},
    {"crossentropy_bf16", t_crossentropy, KCUDA_BF16},
    {"crossentropy_f16", t_crossentropy, KCUDA_F16},
    {"crossentropy_fused_f32", t_crossentropy_fused, KCUDA_F32},
    {"crossentropy_fused_bf16", t_crossentropy_fused, KCUDA_BF16},
    {"crossentropy_fused_f16", t_crossentropy_fused, KCUDA_F16},
    {"crossentropy_shard_f32", t_crossentropy_shard, KCUDA_F32},
    {"crossentropy_shard_bf16", t_crossentropy_shard, KCUDA_BF16},
    {"crossentropy_shard_f16", t_crossentropy_shard, KCUDA_F16},
    {"crossentropy_exchange", t_crossentropy_exchange, KCUDA_F32},
    {"adamw_f32", t_adamw, KCUDA_F32},
    {"adamw_bf16_grads", t_adamw, KCUDA_BF16},
    {"adamw_f16_grads", t_adamw, KCUDA_F16},
    {"adamw_f32_grads_bf16_weights", t_adamw_f32_grads, KCUDA_BF16},
    {"adamw_f32_grads_f16_weights", t_adamw_f32_grads, KCUDA_F16},
    {"global_norm_f32", t_global_norm, KCUDA_F32},
    {"global_norm_bf16", t_global_norm, KCUDA_BF16},
    {"global_norm_f16", t_global_norm, KCUDA_F16},
    {"attention_f32", t_attention, KCUDA_F32},
    {"attention_bf16", t_attention, KCUDA_BF16},
    {"attention_f16", t_attention, KCUDA_F16},
    {"attention_atomic_dq_bf16", t_attention_atomic_dq, KCUDA_BF16},
    {"attention_atomic_dq_f16", t_attention_atomic_dq, KCUDA_F16},
    {"attention_dq_turns_bf16", t_attention_dq_turns, KCUDA_BF16},
    {"attention_dq_turns_f16", t_attention_dq_turns, KCUDA_F16},
    {"attention_qkv_f32", t_attention_qkv, KCUDA_F32},
    {"attention_qkv_bf16", t_attention_qkv, KCUDA_BF16},
    {"attention_qkv_f16", t_attention_qkv, KCUDA_F16},
    {"attention_cudnn_bf16", t_attention_cudnn, KCUDA_BF16},
    {"attention_cudnn_f16", t_attention_cudnn, KCUDA_F16},
    {"moe_f32", t_moe, KCUDA_F32},
    {"moe_bf16", t_moe, KCUDA_BF16},
    {"moe_f16", t_moe, KCUDA_F16},
    {"sweep_f32", t_sweep, KCUDA_F32},
    {"sweep_bf16", t_sweep, KCUDA_BF16},
    {"sweep_f16", t_sweep, KCUDA_F16},
    /* (after the sweeps: their shapes are drawn from the same sequence) */
    {"matmul_tf32", t_matmul_tf32, KCUDA_F32},
    {"attention_tf32", t_attention_tf32, KCUDA_F32},
    {"sum_squares_many_f32", t_sum_squares_many, KCUDA_F32},
    {"sum_squares_many_bf16", t_sum_squares_many, KCUDA_BF16},
    {"sum_squares_many_f16", t_sum_squares_many, KCUDA_F16},
    {"adamw_many_f32", t_adamw_many, KCUDA_F32},
    {"adamw_many_bf16", t_adamw_many, KCUDA_BF16},
    {"adamw_many_f16", t_adamw_many, KCUDA_F16},
};

enum { NCASES = sizeof cases / sizeof cases[0] };

/* 1 when no filter is given or the name contains one of them. */
static int selected(const char *name, int argc, char **argv)
{
    if (argc < 2)
        return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i]))
            return 1;
    return 0;
}

/* 1 when the name contains one of GPU_TESTS_SKIP's words. */
static int skipped(const char *name)
{
    const char *s = getenv("GPU_TESTS_SKIP");
    char word[64];
    int len;
    while (s && sscanf(s, " %63s%n", word, &len) == 1) {
        if (strstr(name, word))
            return 1;
        s += len;
    }
    return 0;
}

int main(int argc, char **argv)
{
    char why[256];
    int passed = 0, failed = 0, n = 0, planned = 0;
    if (!kcuda_available(why, sizeof why)) {
        printf("SKIP gpu: no GPU (%s)\n", why);
        return 0;
    }
    if (kcuda_ctx_create(&ctx) != 0) {
        printf("not ok 1 - kcuda_ctx_create: %s\n# 0 passed, 1 failed\n",
               kcuda_last_error());
        return 1;
    }
    {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            printf("# device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major,
                   prop.minor, prop.multiProcessorCount);
    }
    kcpu_set_threads(1);
    /* (GPU_TESTS_AFTER: the cases up to it are not run, nor planned) */
    const char *after = getenv("GPU_TESTS_AFTER"), *crash = getenv("GPU_TESTS_ABORT");
    int first = 0;
    if (after && *after) {
        while (first < NCASES && strcmp(cases[first].name, after) != 0)
            first++;
        if (first == NCASES) {
            printf("GPU_TESTS_AFTER=%s: no case of that name\n# 0 passed, 1 failed\n", after);
            kcuda_ctx_free(ctx);
            return 2;
        }
        first++;
    }
    for (int i = first; i < NCASES; i++)
        planned += selected(cases[i].name, argc, argv);
    printf("1..%d\n", planned);
    for (int i = first; i < NCASES; i++) {
        if (!selected(cases[i].name, argc, argv))
            continue;
        n++;
        if (skipped(cases[i].name)) {
            printf("ok %d - %s # SKIP GPU_TESTS_SKIP\n", n, cases[i].name);
            passed++;
            continue;
        }
        printf("# case %s\n", cases[i].name);
        fflush(stdout);
        if (crash && strcmp(crash, cases[i].name) == 0)
            abort();
        cur_bad = 0;
        cur_err = 0.0;
        cur_floor = 0.0;
        cur_tol = tol_of(cases[i].dt);
        cases[i].fn(cases[i].dt);
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            fprintf(stderr, "# %s: %sthe device reports: %s\n",
                    cases[i].name, cur_shape, cudaGetErrorString(e));
            cur_bad = 1;
        }
        free_all();
        cur_shape[0] = 0;
        if (cur_bad)
            failed++;
        else
            passed++;
        printf("%sok %d - %s (err %.2g, tol %.0e)\n", cur_bad ? "not " : "", n,
               cases[i].name, cur_err, cur_tol);
        fflush(stdout);
        if (e != cudaSuccess) { /* a sticky error: later cases cannot run */
            printf("# stopped after %s: the device's error is sticky; %d cases not run\n",
                   cases[i].name, planned - n);
            break;
        }
    }
    kcuda_ctx_free(ctx);
    printf("# %d passed, %d failed\n", passed, failed + (planned - n));
    return failed || n < planned ? 1 : 0;
}
