/*
 * gpu_bench.c: how fast the CUDA kernels run, next to what the hardware
 * and NVIDIA's libraries give on the same shapes in the same run:
 *
 *  - GEMM, bf16 (fp32 accumulation): kcuda_matmul_forward, by default and
 *    with its algorithms timed (kcuda_ctx_set_gemm_tune, MESH_GEMM_TUNE=1),
 *    next to a raw cublasLtMatmul (its heuristic's first algorithm, chosen
 *    once) and cublasGemmEx, on 4096^3 and GPT-2 124M's shapes (B*T = 8192
 *    rows); and the layers' backward (dx and dw) by default and tuned,
 *    with what the tuning set aside and changed; and fp32 products in
 *    fp32 and on TF32 tensor cores (kcuda_ctx_set_tf32, MESH_TF32=1);
 *  - a linear layer's bias and GELU (GPT-2's fc): in cuBLASLt's epilogue,
 *    as the executor fuses them, next to a product and two kernels after;
 *    and in the backward, the proj product's dx with the GELU's backward
 *    (cuBLASLt's DGELU epilogue) next to the product and the GELU kernel;
 *  - causal attention, bf16, B=8 T=1024 H=12 d=64: forward and backward
 *    (the backward in each of its modes: dq by its own kernel, the
 *    default; by the dk/dv kernel's atomics in any order,
 *    MESH_DETERMINISTIC=0; the same in turns, 2), and in fp32, on FMAs
 *    and on TF32 tensor cores (MESH_TF32=1);
 *    TFLOP/s, counted as FlashAttention does (4 B H T^2 d / 2 forward,
 *    2.5 times that backward; ours does that work in 2-byte types, and
 *    3.5 times it with dq's own kernel, which recomputes the scores);
 *    and the default backward's two main kernels each alone, in TFLOP/s
 *    of their own products (the split a profiler would show);
 *  - memory-bound kernels over about 100M elements (layernorm, GELU,
 *    AdamW, the fused cross-entropy) in GB/s of the bytes they must move,
 *    next to a device-to-device cudaMemcpy (read + write).
 *
 * usage: gpu_bench [--json FILE] [--quick] [--tiny] [--only PART]
 * Prints a table, then one line `JSON {...}` with the summary (also written
 * to FILE). Each time is the best, over 3 runs, of the mean over a batch of
 * launches timed with CUDA events. Without a GPU: `SKIP gpu: no GPU (...)`,
 * exit 0. --tiny: every size cut by 16 (the GEMMs' by 32; attention to
 * B=1 T=128 H=2; the cross-entropy's rows, not the vocabulary), one
 * timed launch each: a
 * rehearsal of the program on the CPU emulation of CUDA (gpu_bench_emu,
 * tests/gpu/run.sh with MESH_GPU_REHEARSE=1), its figures no measure of
 * anything. --only PART: that part alone (gemm, epilogue, dgelu, attention
 * or memory) and no JSON, for a profiler (tests/gpu/run.sh's ncu step).
 */
#include <stdarg.h> /* defines: va_list */
#include <stdint.h> /* defines: uint64_t, int32_t */
#include <stdio.h>  /* defines: printf, fprintf, FILE */
#include <stdlib.h> /* defines: malloc, free, exit */
#include <string.h> /* defines: strcmp, memset */

#include <cublasLt.h>         /* defines: cublasLt* (the raw comparison) */
#include <cublas_v2.h>        /* defines: cublasGemmEx */
#include <cuda_runtime_api.h> /* defines: cudaMalloc, cudaEvent_t */

#include "kcuda.h" /* defines: kcuda_* */

static int quick, tiny;
static kcuda_ctx *ctx;
static kcuda_ctx *cctx; /* the same with its attention on cuDNN where it
                          * takes it (kcuda_ctx_set_attention_cudnn) */
static kcuda_ctx *tctx; /* the same with its products' algorithms timed
                           (kcuda_ctx_set_gemm_tune) */
static kcuda_ctx *fctx; /* the same with its fp32 products on TF32 tensor
                           cores (kcuda_ctx_set_tf32, MESH_TF32=1) */

/* n, or n / 16 with --tiny */
static int cut(int n)
{
    return tiny ? n / 16 : n;
}

/* The GEMM part's sizes: with --tiny, cut by 32 (the emulation's products
 * are a CPU's loops, and the tuning runs each shape some 10 times). */
static int gcut(int n)
{
    return tiny ? n / 32 : n;
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "gpu_bench: %s: %s\n", what, msg);
    exit(1);
}

static void cuda(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        die(what, cudaGetErrorString(e));
}

static void kc(int rc, const char *what)
{
    if (rc != 0)
        die(what, kcuda_last_error());
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
}

/* ---- random device data ------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    uint64_t r = rng * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* n elements of dt, uniform in [-scale, scale): a random block of up to 1M
 * elements made on the host, repeated over the buffer. */
static void *drand(size_t n, float scale, kcuda_dtype dt)
{
    size_t es = kcuda_dtype_size(dt), blk = n < (1u << 20) ? n : (1u << 20);
    float *h = malloc(blk * sizeof *h);
    void *d = dalloc(n * es), *tmp = dalloc(blk * 4);
    if (!h)
        die("malloc", "out of memory");
    for (size_t i = 0; i < blk; i++)
        h[i] = frand() * scale;
    cuda(cudaMemcpy(tmp, h, blk * 4, cudaMemcpyHostToDevice), "upload");
    for (size_t i = 0; i < n; i += blk) {
        size_t len = n - i < blk ? n - i : blk;
        kc(kcuda_convert((char *)d + i * es, dt, tmp, KCUDA_F32, len, NULL),
           "kcuda_convert");
    }
    cuda(cudaDeviceSynchronize(), "fill");
    cudaFree(tmp);
    free(h);
    return d;
}

/* ---- timing ------------------------------------------------------------- */

typedef void (*bench_fn)(void *arg);

/* Milliseconds per call: the best over 3 runs of the mean over `reps`
 * calls, after warm-up calls. */
static double time_ms(bench_fn fn, void *arg, int reps)
{
    cudaEvent_t a, b;
    double best = 1e30;
    cuda(cudaEventCreate(&a), "cudaEventCreate");
    cuda(cudaEventCreate(&b), "cudaEventCreate");
    if (tiny)
        reps = 1;
    for (int i = 0; i < (tiny ? 1 : 2); i++)
        fn(arg);
    cuda(cudaDeviceSynchronize(), "warm-up");
    for (int run = 0; run < (tiny ? 1 : 3); run++) {
        float ms = 0.0f;
        cuda(cudaEventRecord(a, NULL), "cudaEventRecord");
        for (int i = 0; i < reps; i++)
            fn(arg);
        cuda(cudaEventRecord(b, NULL), "cudaEventRecord");
        cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
        cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
        if (ms / reps < best)
            best = ms / reps;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

/* ---- the JSON summary, built as we go ------------------------------------ */

static char json[16384];
static size_t jlen;

static void jcat(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void jcat(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(json + jlen, sizeof json - jlen, fmt, ap);
    va_end(ap);
    if (k > 0 && (size_t)k < sizeof json - jlen)
        jlen += (size_t)k;
}

/* ---- GEMM ----------------------------------------------------------------- */

typedef struct gemm_shape {
    const char *name;
    int M, K, N, wt; /* y[M,N] = x[M,K] @ w ([K,N], or [N,K] when wt) */
} gemm_shape;

typedef struct gemm_arg {
    const gemm_shape *s;
    void *x, *w, *y;
    void *dx, *dw; /* the backward's gradients */
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    size_t ws_bytes;
    int f32; /* the operands fp32 (else bf16) */
} gemm_arg;

static void kcuda_gemm_on(kcuda_ctx *c, gemm_arg *g)
{
    const gemm_shape *s = g->s;
    kcuda_dtype dt = g->f32 ? KCUDA_F32 : KCUDA_BF16;
    if (s->wt)
        kc(kcuda_matmul_wt_forward(c, g->y, g->x, g->w, NULL, s->M, s->K,
                                   s->N, dt, NULL),
           "kcuda_matmul_wt_forward");
    else
        kc(kcuda_matmul_forward(c, g->y, NULL, g->x, g->w, NULL, s->M, s->K,
                                s->N, KCUDA_EPI_NONE, dt, NULL),
           "kcuda_matmul_forward");
}

static void run_kcuda_gemm(void *p)
{
    kcuda_gemm_on(ctx, p);
}

static void run_tuned_gemm(void *p)
{
    kcuda_gemm_on(tctx, p);
}

static void run_tf32_gemm(void *p)
{
    kcuda_gemm_on(fctx, p);
}

/* A layer's backward, both products (dx and dw, added to; bf16 dw). */
static void kcuda_gemm_bwd_on(kcuda_ctx *c, gemm_arg *g)
{
    const gemm_shape *s = g->s;
    if (s->wt)
        kc(kcuda_matmul_wt_backward(c, g->dx, g->dw, NULL, g->y, g->x, g->w,
                                    s->M, s->K, s->N, KCUDA_BF16, KCUDA_BF16,
                                    0, NULL),
           "kcuda_matmul_wt_backward");
    else
        kc(kcuda_matmul_backward(c, g->dx, g->dw, NULL, g->y, g->x, g->w, s->M,
                                 s->K, s->N, KCUDA_BF16, KCUDA_BF16, 0, NULL),
           "kcuda_matmul_backward");
}

static void run_kcuda_gemm_bwd(void *p)
{
    kcuda_gemm_bwd_on(ctx, p);
}

static void run_tuned_gemm_bwd(void *p)
{
    kcuda_gemm_bwd_on(tctx, p);
}

static void run_cublas_gemm(void *p)
{
    gemm_arg *g = p;
    const gemm_shape *s = g->s;
    float one = 1.0f, zero = 0.0f;
    /* row-major y = x w is column-major y^T = w^T x^T */
    cublasStatus_t st = cublasGemmEx(
        g->blas, s->wt ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, s->N, s->M,
        s->K, &one, g->w, CUDA_R_16BF, s->wt ? s->K : s->N, g->x, CUDA_R_16BF,
        s->K, &zero, g->y, CUDA_R_16BF, s->N, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        die("cublasGemmEx", cublasGetStatusString(st));
}

static void run_lt_gemm(void *p)
{
    gemm_arg *g = p;
    float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasLtMatmul(g->lt, g->desc, &one, g->w, g->la, g->x,
                                       g->lb, &zero, g->y, g->lc, g->y, g->lc,
                                       &g->algo, g->ws, g->ws_bytes, NULL);
    if (st != CUBLAS_STATUS_SUCCESS)
        die("cublasLtMatmul", cublasLtGetStatusString(st));
}

static void lt_check(cublasStatus_t st, const char *what)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        die(what, cublasLtGetStatusString(st));
}

/* The raw cuBLASLt call of a shape: descriptors and the heuristic's first
 * algorithm, made once. */
static void lt_setup(gemm_arg *g)
{
    const gemm_shape *s = g->s;
    cublasOperation_t ta = s->wt ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    lt_check(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
             "cublasLtMatmulDescCreate");
    lt_check(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                            &ta, sizeof ta), "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                            &tb, sizeof tb), "TRANSB");
    lt_check(cublasLtMatrixLayoutCreate(&g->la, CUDA_R_16BF, s->wt ? s->K : s->N,
                                        s->wt ? s->N : s->K, s->wt ? s->K : s->N),
             "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&g->lb, CUDA_R_16BF, s->K, s->M, s->K),
             "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&g->lc, CUDA_R_16BF, s->N, s->M, s->N),
             "layout C");
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    lt_check(cublasLtMatmulPreferenceSetAttribute(
                 pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->ws_bytes,
                 sizeof g->ws_bytes), "workspace");
    lt_check(cublasLtMatmulAlgoGetHeuristic(g->lt, g->desc, g->la, g->lb, g->lc,
                                            g->lc, pref, 1, &res, &found),
             "heuristic");
    if (found < 1)
        die("cublasLtMatmulAlgoGetHeuristic", "no algorithm");
    g->algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
}

static void lt_teardown(gemm_arg *g)
{
    cublasLtMatrixLayoutDestroy(g->la);
    cublasLtMatrixLayoutDestroy(g->lb);
    cublasLtMatrixLayoutDestroy(g->lc);
    cublasLtMatmulDescDestroy(g->desc);
}

static void bench_gemm(void)
{
    static const gemm_shape shapes[] = {
        {"square 4096^3", 4096, 4096, 4096, 0},
        {"gpt2 qkv 8192x768x2304", 8192, 768, 2304, 0},
        {"gpt2 attn-proj 8192x768x768", 8192, 768, 768, 0},
        {"gpt2 fc 8192x768x3072", 8192, 768, 3072, 0},
        {"gpt2 fc-proj 8192x3072x768", 8192, 3072, 768, 0},
        {"gpt2 lm-head 8192x768x50304 (w^T)", 8192, 768, 50304, 1},
    };
    gemm_arg g;
    memset(&g, 0, sizeof g);
    if (cublasCreate(&g.blas) != CUBLAS_STATUS_SUCCESS)
        die("cublasCreate", "failed");
    lt_check(cublasLtCreate(&g.lt), "cublasLtCreate");
    g.ws_bytes = 32u << 20;
    g.ws = dalloc(g.ws_bytes);
    printf("\n%-36s %10s %10s %10s %10s %10s\n", "GEMM bf16 (TFLOP/s)", "kcuda",
           "tuned", "cublasLt", "cublas", "kcuda/lt");
    jcat("\"gemm\":[");
    int nsh = quick ? 2 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int i = 0; i < nsh; i++) {
        gemm_shape cs = {shapes[i].name, gcut(shapes[i].M), gcut(shapes[i].K), gcut(shapes[i].N), shapes[i].wt};
        const gemm_shape *s = &cs;
        double flop = 2.0 * s->M * s->N * (double)s->K;
        g.s = s;
        g.x = drand((size_t)s->M * s->K, 1.0f, KCUDA_BF16);
        g.w = drand((size_t)s->K * s->N, 1.0f, KCUDA_BF16);
        g.y = dalloc((size_t)s->M * s->N * 2);
        lt_setup(&g);
        int reps = flop > 1e11 ? 20 : 50;
        double tk = time_ms(run_kcuda_gemm, &g, reps);
        double tt = time_ms(run_tuned_gemm, &g, reps);
        double tl = time_ms(run_lt_gemm, &g, reps);
        double tb = time_ms(run_cublas_gemm, &g, reps);
        double fk = flop / tk / 1e9, ft = flop / tt / 1e9, fl = flop / tl / 1e9,
               fb = flop / tb / 1e9;
        printf("%-36s %10.1f %10.1f %10.1f %10.1f %9.0f%%\n", s->name, fk, ft, fl,
               fb, 100.0 * fk / fl);
        jcat("%s{\"name\":\"%s\",\"M\":%d,\"K\":%d,\"N\":%d,\"kcuda_tflops\":%.1f,"
             "\"tuned_tflops\":%.1f,\"cublaslt_tflops\":%.1f,\"cublas_tflops\":%.1f}",
             i ? "," : "", s->name, s->M, s->K, s->N, fk, ft, fl, fb);
        lt_teardown(&g);
        cudaFree(g.x);
        cudaFree(g.w);
        cudaFree(g.y);
    }
    jcat("],");
    /* the backward of GPT-2's layers (dx and dw: 2 products), the step's
     * larger share of the products' time, by default and tuned */
    printf("\n%-36s %10s %10s %10s\n", "GEMM bf16 backward dx+dw (TFLOP/s)",
           "kcuda", "tuned", "tuned/kcuda");
    jcat("\"gemm_bwd\":[");
    for (int i = 1, n = 0; i < (quick ? 2 : (int)(sizeof shapes / sizeof shapes[0])); i++, n++) {
        gemm_shape cs = {shapes[i].name, gcut(shapes[i].M), gcut(shapes[i].K), gcut(shapes[i].N), shapes[i].wt};
        const gemm_shape *s = &cs;
        double flop = 4.0 * s->M * s->N * (double)s->K;
        size_t mk = (size_t)s->M * s->K, kn = (size_t)s->K * s->N;
        g.s = s;
        g.x = drand(mk, 1.0f, KCUDA_BF16);
        g.w = drand(kn, 1.0f, KCUDA_BF16);
        g.y = drand((size_t)s->M * s->N, 1.0f, KCUDA_BF16); /* dy */
        g.dx = drand(mk, 0.0f, KCUDA_BF16);
        g.dw = drand(kn, 0.0f, KCUDA_BF16);
        int reps = flop > 2e11 ? 10 : 25;
        double tk = time_ms(run_kcuda_gemm_bwd, &g, reps);
        double tt = time_ms(run_tuned_gemm_bwd, &g, reps);
        double fk = flop / tk / 1e9, ft = flop / tt / 1e9;
        printf("%-36s %10.1f %10.1f %10.2f\n", s->name, fk, ft, ft / fk);
        jcat("%s{\"name\":\"%s\",\"kcuda_tflops\":%.1f,\"tuned_tflops\":%.1f}",
             n ? "," : "", s->name, fk, ft);
        cudaFree(g.x);
        cudaFree(g.w);
        cudaFree(g.y);
        cudaFree(g.dx);
        cudaFree(g.dw);
    }
    kcuda_gemm_tune_stats st;
    char words[256];
    kcuda_ctx_gemm_tune_stats(tctx, &st);
    kcuda_gemm_tune_describe(&st, words, sizeof words);
    printf("tuning: %s\n", words);
    jcat("],\"gemm_tune\":{\"shapes\":%d,\"timed\":%d,\"split\":%d,"
         "\"other_kernel\":%d,\"other_bits\":%d,\"refused\":%d,\"changed\":%d,"
         "\"no_memory\":%d,\"small\":%d},",
         st.shapes, st.timed, st.split, st.other_kernel, st.other_bits,
         st.refused, st.changed, st.no_memory, st.small);
    /* fp32 products (an fp32 run's), in fp32 and on TF32 tensor cores */
    printf("\n%-36s %10s %10s %10s\n", "GEMM fp32 (TFLOP/s)", "fp32", "TF32", "tf32/fp32");
    jcat("\"gemm_fp32\":[");
    static const int f32_shapes[] = {0, 3}; /* 4096^3, GPT-2's fc */
    for (int n = 0; n < (quick ? 1 : 2); n++) {
        const gemm_shape *sh = &shapes[f32_shapes[n]];
        gemm_shape cs = {sh->name, gcut(sh->M), gcut(sh->K), gcut(sh->N), 0};
        double flop = 2.0 * cs.M * cs.N * (double)cs.K;
        g.s = &cs;
        g.f32 = 1;
        g.x = drand((size_t)cs.M * cs.K, 1.0f, KCUDA_F32);
        g.w = drand((size_t)cs.K * cs.N, 1.0f, KCUDA_F32);
        g.y = dalloc((size_t)cs.M * cs.N * 4);
        double t32 = time_ms(run_kcuda_gemm, &g, 5), ttf = time_ms(run_tf32_gemm, &g, 10);
        double f32 = flop / t32 / 1e9, ftf = flop / ttf / 1e9;
        printf("%-36s %10.1f %10.1f %10.2f\n", cs.name, f32, ftf, ftf / f32);
        jcat("%s{\"name\":\"%s\",\"fp32_tflops\":%.1f,\"tf32_tflops\":%.1f}", n ? "," : "", cs.name, f32, ftf);
        g.f32 = 0;
        cudaFree(g.x);
        cudaFree(g.w);
        cudaFree(g.y);
    }
    jcat("],");
    cudaFree(g.ws);
    cublasLtDestroy(g.lt);
    cublasDestroy(g.blas);
}

/* ---- a linear layer's bias and GELU: in the epilogue, or kernels after --- */

typedef struct epi_arg {
    int M, K, N;
    void *x, *w, *bias, *pre, *y;
} epi_arg;

/* what the executor runs for matmul -> bias add -> gelu (find_fusions) */
static void run_epi_fused(void *p)
{
    epi_arg *e = p;
    kc(kcuda_matmul_forward(ctx, e->y, e->pre, e->x, e->w, e->bias, e->M, e->K,
                            e->N, KCUDA_EPI_GELU, KCUDA_BF16, NULL),
       "kcuda_matmul_forward (GELU epilogue)");
}

/* and each op at its own node */
static void run_epi_apart(void *p)
{
    epi_arg *e = p;
    kc(kcuda_matmul_forward(ctx, e->y, NULL, e->x, e->w, NULL, e->M, e->K,
                            e->N, KCUDA_EPI_NONE, KCUDA_BF16, NULL),
       "kcuda_matmul_forward");
    kc(kcuda_add_broadcast_forward(e->pre, e->y, e->bias, e->M, 1, e->N,
                                   KCUDA_BF16, NULL),
       "kcuda_add_broadcast_forward");
    kc(kcuda_gelu_forward(e->y, e->pre, (size_t)e->M * e->N, KCUDA_BF16,
                          NULL),
       "kcuda_gelu_forward");
}

/* the backward of the proj product and the GELU before it: what the
 * executor runs (find_fusions: cuBLASLt's DGELU epilogue), dx only */
static void run_dgelu_fused(void *p)
{
    epi_arg *e = p;
    kc(kcuda_matmul_gelu_backward(ctx, e->y, NULL, e->x, e->pre, e->w, e->pre,
                                  e->M, e->K, e->N, KCUDA_BF16, KCUDA_BF16,
                                  NULL),
       "kcuda_matmul_gelu_backward");
}

/* and each op at its own node: the product written, the GELU's backward
 * reading it */
static void run_dgelu_apart(void *p)
{
    epi_arg *e = p;
    kc(kcuda_matmul_backward(ctx, e->bias, NULL, NULL, e->x, e->pre, e->w,
                             e->M, e->K, e->N, KCUDA_BF16, KCUDA_BF16, 1,
                             NULL),
       "kcuda_matmul_backward");
    kc(kcuda_gelu_backward(e->y, e->pre, e->bias, (size_t)e->M * e->K, 1,
                           KCUDA_BF16, NULL),
       "kcuda_gelu_backward");
}

/* GPT-2's proj backward: dy [8192, 768], w [3072, 768], pre [8192, 3072] */
static void bench_dgelu(void)
{
    epi_arg e = {cut(8192), cut(3072), cut(768), NULL, NULL, NULL, NULL, NULL};
    size_t mk = (size_t)e.M * e.K;
    e.x = drand((size_t)e.M * e.N, 1.0f, KCUDA_BF16); /* dy */
    e.w = drand((size_t)e.K * e.N, 1.0f, KCUDA_BF16);
    e.pre = drand(mk, 2.0f, KCUDA_BF16);
    e.bias = dalloc(mk * 2); /* the product, apart */
    e.y = dalloc(mk * 2);    /* dpre */
    double tf = time_ms(run_dgelu_fused, &e, 50), ta = time_ms(run_dgelu_apart, &e, 50);
    printf("%-36s %10.3f %10.3f %10.2f\n", "gpt2 proj dx + GELU bwd 8192x3072x768",
           tf, ta, tf / ta);
    jcat("\"dgelu\":{\"name\":\"gpt2 proj dx + GELU bwd 8192x3072x768\","
         "\"fused_ms\":%.4f,\"apart_ms\":%.4f},", tf, ta);
    cudaFree(e.x);
    cudaFree(e.w);
    cudaFree(e.pre);
    cudaFree(e.bias);
    cudaFree(e.y);
}

static void bench_epilogue(void)
{
    epi_arg e = {cut(8192), cut(768), cut(3072), NULL, NULL, NULL, NULL, NULL};
    size_t mn = (size_t)e.M * e.N;
    e.x = drand((size_t)e.M * e.K, 1.0f, KCUDA_BF16);
    e.w = drand((size_t)e.K * e.N, 1.0f, KCUDA_BF16);
    e.bias = drand((size_t)e.N, 1.0f, KCUDA_BF16);
    e.pre = dalloc(mn * 2);
    e.y = dalloc(mn * 2);
    double tf = time_ms(run_epi_fused, &e, 50), ta = time_ms(run_epi_apart, &e, 50);
    printf("\n%-36s %10s %10s %10s\n", "linear + bias + GELU, bf16 (ms)", "epilogue",
           "apart", "ratio");
    printf("%-36s %10.3f %10.3f %10.2f\n", "gpt2 fc 8192x768x3072", tf, ta,
           tf / ta);
    jcat("\"epilogue\":{\"name\":\"gpt2 fc 8192x768x3072\",\"fused_ms\":%.4f,"
         "\"apart_ms\":%.4f},", tf, ta);
    cudaFree(e.x);
    cudaFree(e.w);
    cudaFree(e.bias);
    cudaFree(e.pre);
    cudaFree(e.y);
}

/* ---- attention -------------------------------------------------------------- */

enum { ATTN_ROWS = 18 };

typedef struct attn_arg {
    int B, T, H, d;
    kcuda_dtype dt;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
    kcuda_ctx *c; /* ctx, or cctx (cuDNN) */
} attn_arg;

static void run_attn_fwd(void *p)
{
    attn_arg *a = p;
    kc(kcuda_attention_forward(a->c, a->o, a->lse, a->q, a->k, a->v, a->B, a->T, a->H,
                               a->H, a->d, 1, a->dt, NULL),
       "kcuda_attention_forward");
}

static void run_attn_bwd(void *p)
{
    attn_arg *a = p;
    kc(kcuda_attention_backward(a->c, a->dq, a->dk, a->dv, a->dout, a->o, a->lse,
                                a->q, a->k, a->v, a->B, a->T, a->H, a->H, a->d,
                                1, 7, a->dt, NULL),
       "kcuda_attention_backward");
}

static void bench_attention(void)
{
    printf("\n%-42s %10s %10s %10s\n", "attention, causal (TFLOP/s)", "forward",
           "backward", "fwd ms");
    jcat("\"attention\":[");
    /* bf16 (dq by its own kernel, the default; the forward in blocks of
     * 64 query rows, the default at d 64); bf16 with dq by the dk/dv
     * kernel's atomics as they come (kcuda_ctx_set_deterministic 0) and in
     * turns (2); fp32, and fp32 with its tile products on TF32 tensor
     * cores (fctx: MESH_TF32=1); bf16 with the forward in blocks of 128 rows
     * (kcuda_attention_forward_rows); bf16 with the backward's kernels
     * compiled for more blocks an SM (kcuda_attention_backward_blocks);
     * the default backward's two main kernels each alone
     * (kcuda_attention_backward_only; no forward; TFLOP/s of the kernel's
     * own tile products: the dk/dv kernel's 4, twice the forward's
     * FLOPs, dq's 3, 1.5 times; each after the kernel computing D); at d
     * 128 (Llama's), the forward in blocks of 128 rows (the default
     * there) and of 64; at d 64 and 128, the kernels on warpgroup
     * products (kcuda_attention_wgmma; at d 64 also the backward's two
     * kernels alone; the name says so where the GPU cannot take them,
     * and the row is then mma.sync's); on cuDNN's fused kernels
     * (kcuda_ctx_set_attention_cudnn: its deterministic backward, and
     * with dq's sums in any order; at d 128; the name says so where cuDNN
     * did not take the calls, and the row is then this file's kernels') */
    static const struct {
        int mode, fp32, H, d, fwd_rows, more, only, wg, cudnn; /* fp32: 1, or 2 on TF32 */
        const char *name;
    } cfg[ATTN_ROWS] = {
        {1, 0, 12, 64, 0, 0, 0, 0, 0, "B8 T1024 H12 d64 bf16"},
        {0, 0, 12, 64, 0, 0, 0, 0, 0, "B8 T1024 H12 d64 bf16 dq atomics"},
        {2, 0, 12, 64, 0, 0, 0, 0, 0, "B8 T1024 H12 d64 bf16 dq in turns"},
        {1, 1, 12, 64, 0, 0, 0, 0, 0, "B8 T1024 H12 d64 fp32"},
        {1, 2, 12, 64, 0, 0, 0, 0, 0, "B8 T1024 H12 d64 fp32 TF32"},
        {1, 0, 12, 64, 128, 0, 0, 0, 0, "B8 T1024 H12 d64 bf16 fwd 128 rows"},
        {1, 0, 12, 64, 0, 1, 0, 0, 0, "B8 T1024 H12 d64 bf16 bwd occupancy"},
        {1, 0, 12, 64, 0, 0, 1, 0, 0, "B8 T1024 H12 d64 bf16 dk/dv kernel"},
        {1, 0, 12, 64, 0, 0, 2, 0, 0, "B8 T1024 H12 d64 bf16 dq kernel"},
        {1, 0, 6, 128, 0, 0, 0, 0, 0, "B8 T1024 H6 d128 bf16"},
        {1, 0, 6, 128, 64, 0, 0, 0, 0, "B8 T1024 H6 d128 bf16 fwd 64 rows"},
        {1, 0, 12, 64, 0, 0, 0, 1, 0, "B8 T1024 H12 d64 bf16 wgmma"},
        {1, 0, 12, 64, 0, 0, 1, 1, 0, "B8 T1024 H12 d64 bf16 wgmma dk/dv kernel"},
        {1, 0, 12, 64, 0, 0, 2, 1, 0, "B8 T1024 H12 d64 bf16 wgmma dq kernel"},
        {1, 0, 6, 128, 0, 0, 0, 1, 0, "B8 T1024 H6 d128 bf16 wgmma"},
        {1, 0, 12, 64, 0, 0, 0, 0, 1, "B8 T1024 H12 d64 bf16 cuDNN"},
        {0, 0, 12, 64, 0, 0, 0, 0, 1, "B8 T1024 H12 d64 bf16 cuDNN dq any order"},
        {1, 0, 6, 128, 0, 0, 0, 0, 1, "B8 T1024 H6 d128 bf16 cuDNN"},
    };
    for (int k = 0; k < ATTN_ROWS; k++) {
        attn_arg a = {tiny ? 1 : 8, tiny ? 128 : 1024, tiny ? 2 : cfg[k].H, cfg[k].d,
                      cfg[k].fp32 ? KCUDA_F32 : KCUDA_BF16,
                      NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                      cfg[k].cudnn ? cctx : cfg[k].fp32 == 2 ? fctx : ctx};
        size_t n = (size_t)a.B * a.T * a.H * a.d;
        a.q = drand(n, 1.0f, a.dt);
        a.k = drand(n, 1.0f, a.dt);
        a.v = drand(n, 1.0f, a.dt);
        a.dout = drand(n, 1.0f, a.dt);
        a.o = drand(n, 0.0f, a.dt);
        a.dq = drand(n, 0.0f, a.dt);
        a.dk = drand(n, 0.0f, a.dt);
        a.dv = drand(n, 0.0f, a.dt);
        a.lse = dalloc((size_t)a.B * a.H * a.T * 4);
        double fwd = 4.0 * a.B * a.H * (double)a.T * a.T * a.d / 2.0;
        kcuda_ctx_set_deterministic(a.c, cfg[k].mode);
        kcuda_attention_cudnn_stats st0, st1;
        kcuda_ctx_attention_cudnn(cctx, &st0);
        kcuda_attention_forward_rows(cfg[k].fwd_rows);
        kcuda_attention_backward_blocks(cfg[k].more);
        int wg_taken = cfg[k].wg ? kcuda_attention_wgmma(1) : 0;
        /* the backward's inputs (o, lse) from a forward: timed, or (a
         * backward kernel alone) run once */
        double tf = 0.0;
        if (cfg[k].only)
            run_attn_fwd(&a);
        else
            tf = time_ms(run_attn_fwd, &a, quick ? 5 : 20);
        kcuda_attention_backward_only(cfg[k].only);
        double tb = time_ms(run_attn_bwd, &a, quick ? 3 : 10);
        kcuda_attention_backward_only(0);
        kcuda_attention_backward_blocks(0);
        kcuda_attention_forward_rows(0);
        kcuda_attention_wgmma(0);
        kcuda_ctx_set_deterministic(a.c, 1);
        kcuda_ctx_attention_cudnn(cctx, &st1);
        int cudnn_taken = st1.calls[0] > st0.calls[0] && st1.calls[1] > st0.calls[1];
        char nm[96];
        snprintf(nm, sizeof nm, "%s%s", cfg[k].name,
                 cfg[k].wg && !wg_taken            ? " (not taken: mma.sync)"
                 : cfg[k].cudnn && !cudnn_taken ? " (not taken: ours)"
                                                : "");
        const char *name = nm;
        double bflops = (cfg[k].only == 1 ? 2.0 : cfg[k].only == 2 ? 1.5 : 2.5) * fwd;
        if (cfg[k].only)
            printf("%-42s %10s %10.1f %10s\n", name, "-", bflops / tb / 1e9, "-");
        else
            printf("%-42s %10.1f %10.1f %10.3f\n", name, fwd / tf / 1e9, bflops / tb / 1e9, tf);
        if (cfg[k].only) /* no forward timed: null */
            jcat("%s{\"name\":\"%s\",\"fwd_tflops\":null,\"bwd_tflops\":%.1f,\"fwd_ms\":null,\"bwd_ms\":%.3f}",
                 k ? "," : "", name, bflops / tb / 1e9, tb);
        else
            jcat("%s{\"name\":\"%s\",\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f}",
                 k ? "," : "", name, fwd / tf / 1e9, bflops / tb / 1e9, tf, tb);
        void *bufs[] = {a.q, a.k, a.v, a.o, a.dout, a.dq, a.dk, a.dv, a.lse};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            cudaFree(bufs[i]);
    }
    /* what cuDNN did: its version, plans, and why a call was not its */
    kcuda_attention_cudnn_stats st;
    char words[800];
    kcuda_ctx_attention_cudnn(cctx, &st);
    kcuda_attention_cudnn_describe(&st, words, sizeof words);
    printf("attention on cuDNN: %s\n", words);
    jcat("],\"attention_cudnn\":\"");
    for (const char *c = words; *c; c++) /* (a JSON string: no quotes, backslashes or controls) */
        jcat("%c", *c == '"' || *c == '\\' || (unsigned char)*c < 32 ? '\'' : *c);
    jcat("\",");
}

/* ---- memory-bound kernels ---------------------------------------------------- */

#define MEM_ROWS cut(131072) /* x 768 = 100.7M elements */
#define MEM_C 768

typedef struct mem_arg {
    size_t n;
    void *a, *b, *c, *d, *w, *bias;
    float *gw, *gb; /* fp32 main gradients [MEM_C] */
    float *mean, *rstd, *p, *m, *v;
    int32_t *targets;
    int N, V, Vp;
} mem_arg;

static void run_copy16(void *p)
{
    mem_arg *m = p;
    cuda(cudaMemcpyAsync(m->b, m->a, m->n * 2, cudaMemcpyDeviceToDevice, NULL),
         "cudaMemcpyAsync");
}

static void run_ln_fwd(void *p)
{
    mem_arg *m = p;
    kc(kcuda_layernorm_forward(m->b, m->mean, m->rstd, m->a, m->w, m->bias,
                               MEM_ROWS, MEM_C, 1e-5f, KCUDA_BF16, NULL),
       "kcuda_layernorm_forward");
}

/* the residual add and the norm after it: one kernel (the executor's
 * path, kern.add_norm_forward), or the two apart */
static void run_add_ln_fused(void *p)
{
    mem_arg *m = p;
    kc(kcuda_add_layernorm_forward(m->c, m->d, m->mean, m->rstd, m->a, m->b,
                                   m->w, m->bias, MEM_ROWS, MEM_C, 1e-5f,
                                   KCUDA_BF16, NULL),
       "kcuda_add_layernorm_forward");
}

static void run_add_ln_apart(void *p)
{
    mem_arg *m = p;
    kc(kcuda_add_forward(m->c, m->a, m->b, m->n, KCUDA_BF16, NULL),
       "kcuda_add_forward");
    kc(kcuda_layernorm_forward(m->d, m->mean, m->rstd, m->c, m->w, m->bias,
                               MEM_ROWS, MEM_C, 1e-5f, KCUDA_BF16, NULL),
       "kcuda_layernorm_forward");
}

static void run_ln_bwd(void *p)
{
    mem_arg *m = p;
    kc(kcuda_layernorm_backward(ctx, m->c, NULL, NULL, m->b, m->a, m->w,
                                m->mean, m->rstd, MEM_ROWS, MEM_C, KCUDA_BF16,
                                KCUDA_BF16, NULL),
       "kcuda_layernorm_backward");
}

static void run_ln_bwd_dw(void *p)
{
    mem_arg *m = p;
    kc(kcuda_layernorm_backward(ctx, NULL, m->gw, m->gb, m->b, m->a, m->w,
                                m->mean, m->rstd, MEM_ROWS, MEM_C, KCUDA_BF16,
                                KCUDA_F32, NULL),
       "kcuda_layernorm_backward");
}

/* what a training step calls: dx, dw and db in one pass */
static void run_ln_bwd_all(void *p)
{
    mem_arg *m = p;
    kc(kcuda_layernorm_backward(ctx, m->c, m->gw, m->gb, m->b, m->a, m->w,
                                m->mean, m->rstd, MEM_ROWS, MEM_C, KCUDA_BF16,
                                KCUDA_F32, NULL),
       "kcuda_layernorm_backward");
}

/* a bias's gradient: dout [rows, C] summed over the rows into fp32 */
static void run_bias_bwd(void *p)
{
    mem_arg *m = p;
    kc(kcuda_add_broadcast_backward(ctx, NULL, m->gb, m->b, MEM_ROWS, 1, MEM_C,
                                    KCUDA_BF16, KCUDA_F32, 0, NULL),
       "kcuda_add_broadcast_backward");
}

static void run_gelu_fwd(void *p)
{
    mem_arg *m = p;
    kc(kcuda_gelu_forward(m->b, m->a, m->n, KCUDA_BF16, NULL),
       "kcuda_gelu_forward");
}

static void run_gelu_bwd(void *p)
{
    mem_arg *m = p;
    kc(kcuda_gelu_backward(m->c, m->a, m->b, m->n, 1, KCUDA_BF16, NULL),
       "kcuda_gelu_backward");
}

static void run_adamw(void *p)
{
    mem_arg *m = p;
    /* a clipped step: the factor applied as the gradients are read */
    kc(kcuda_adamw_step(m->p, m->c, KCUDA_BF16, m->a, KCUDA_BF16, 0.5, m->m,
                        m->v, m->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 10, NULL),
       "kcuda_adamw_step");
}

static void run_ce(void *p)
{
    mem_arg *m = p;
    kc(kcuda_crossentropy_fused(m->mean, m->rstd, m->p, NULL, m->b, m->a,
                                m->targets, 1.0f, m->N, m->V, m->Vp,
                                KCUDA_BF16, NULL),
       "kcuda_crossentropy_fused");
}

static void mem_row(const char *name, bench_fn fn, mem_arg *m, double bytes,
                    double copy_gbps, int *first)
{
    double t = time_ms(fn, m, quick ? 3 : 10);
    double gbps = bytes / t / 1e6;
    printf("%-36s %10.3f %10.0f %9.0f%%\n", name, t, gbps,
           100.0 * gbps / copy_gbps);
    jcat("%s{\"name\":\"%s\",\"ms\":%.3f,\"gbps\":%.0f,\"of_copy\":%.2f}",
         *first ? "" : ",", name, t, gbps, gbps / copy_gbps);
    *first = 0;
}

static void bench_memory(void)
{
    mem_arg m;
    memset(&m, 0, sizeof m);
    m.n = (size_t)MEM_ROWS * MEM_C;
    m.a = drand(m.n, 2.0f, KCUDA_BF16);
    m.b = drand(m.n, 1.0f, KCUDA_BF16);
    m.c = drand(m.n, 0.1f, KCUDA_BF16);
    m.w = drand(MEM_C, 1.0f, KCUDA_BF16);
    m.bias = drand(MEM_C, 1.0f, KCUDA_BF16);
    m.mean = dalloc(MEM_ROWS * 4);
    m.rstd = dalloc(MEM_ROWS * 4);
    m.gw = drand(MEM_C, 0.0f, KCUDA_F32);
    m.gb = drand(MEM_C, 0.0f, KCUDA_F32);
    double n = (double)m.n;
    printf("\n%-36s %10s %10s %10s\n", "memory-bound, bf16, 100.7M elements",
           "ms", "GB/s", "of copy");
    double tc = time_ms(run_copy16, &m, quick ? 3 : 10);
    double copy_gbps = 2.0 * 2.0 * n / tc / 1e6;
    printf("%-36s %10.3f %10.0f %9.0f%%\n", "cudaMemcpy D2D (read + write)", tc,
           copy_gbps, 100.0);
    jcat("\"memcpy_gbps\":%.0f,\"memory\":[", copy_gbps);
    int first = 1;
    /* bytes each kernel must move */
    mem_row("layernorm fwd (x in, y out)", run_ln_fwd, &m, 4.0 * n, copy_gbps,
            &first);
    /* a and b in, the sum and the norm out: what either way must move */
    m.d = drand(m.n, 0.0f, KCUDA_BF16);
    mem_row("add + layernorm fwd, one kernel", run_add_ln_fused, &m, 8.0 * n,
            copy_gbps, &first);
    mem_row("add, then layernorm fwd (apart)", run_add_ln_apart, &m, 8.0 * n,
            copy_gbps, &first);
    cudaFree(m.d);
    mem_row("layernorm bwd dx (4 + 2 passes)", run_ln_bwd, &m, 12.0 * n,
            copy_gbps, &first);
    /* the weight gradients' column sums: x and dout read, [C] written */
    mem_row("layernorm bwd dw db (fp32 sums)", run_ln_bwd_dw, &m, 4.0 * n,
            copy_gbps, &first);
    /* a step's call: the two rows above in one pass over dout and x */
    mem_row("layernorm bwd dx dw db (one pass)", run_ln_bwd_all, &m, 12.0 * n,
            copy_gbps, &first);
    mem_row("bias grad (dout's column sums)", run_bias_bwd, &m, 2.0 * n,
            copy_gbps, &first);
    mem_row("gelu fwd", run_gelu_fwd, &m, 4.0 * n, copy_gbps, &first);
    mem_row("gelu bwd (x, dout in, dx out)", run_gelu_bwd, &m, 6.0 * n, copy_gbps,
            &first);
    /* AdamW over 100.7M parameters: p, m, v fp32 read+write, bf16 grads
     * read, bf16 weights written: 28 bytes each */
    m.p = drand(m.n, 1.0f, KCUDA_F32);
    m.m = drand(m.n, 0.01f, KCUDA_F32);
    m.v = drand(m.n, 0.0f, KCUDA_F32);
    mem_row("adamw (fp32 master, bf16 grads)", run_adamw, &m, 28.0 * n,
            copy_gbps, &first);
    cudaFree(m.p);
    cudaFree(m.m);
    cudaFree(m.v);
    /* fused cross-entropy: 8192 rows of GPT-2's padded vocabulary; logits
     * read twice (the second time mostly from L2), dlogits read + written */
    cudaFree(m.a);
    cudaFree(m.b);
    cudaFree(m.c);
    cudaFree(m.mean);
    cudaFree(m.rstd);
    cudaFree(m.gw);
    cudaFree(m.gb);
    m.N = cut(8192);
    m.V = 50257;
    m.Vp = 50304;
    {
        int32_t *t = malloc((size_t)m.N * sizeof *t);
        if (!t)
            die("malloc", "out of memory");
        for (int i = 0; i < m.N; i++)
            t[i] = (int32_t)((frand() + 1.0f) * 0.5f * (float)(m.V - 1));
        m.targets = dalloc((size_t)m.N * 4);
        cuda(cudaMemcpy(m.targets, t, (size_t)m.N * 4, cudaMemcpyHostToDevice),
             "upload");
        free(t);
        size_t cells = (size_t)m.N * m.Vp;
        m.a = drand(cells, 4.0f, KCUDA_BF16); /* logits */
        m.b = drand(cells, 0.0f, KCUDA_BF16); /* dlogits */
        m.mean = dalloc((size_t)m.N * 4);
        m.rstd = dalloc((size_t)m.N * 4);
        m.p = dalloc((size_t)m.N * 4);
        mem_row("crossentropy fused (8192 x 50304)", run_ce, &m,
                6.0 * (double)cells, copy_gbps, &first);
        cudaFree(m.a);
        cudaFree(m.b);
        cudaFree(m.mean);
        cudaFree(m.rstd);
        cudaFree(m.p);
        cudaFree(m.targets);
    }
    cudaFree(m.w);
    cudaFree(m.bias);
    jcat("]");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } parts[] = {{"gemm", bench_gemm},
                 {"epilogue", bench_epilogue},
                 {"dgelu", bench_dgelu},
                 {"attention", bench_attention},
                 {"memory", bench_memory}};
    enum { NPARTS = sizeof parts / sizeof parts[0] };
    char why[256];
    const char *json_path = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json_path = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--tiny") == 0)
            tiny = 1;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: gpu_bench [--json FILE] [--quick] [--tiny] [--only PART]\n");
            return 2;
        }
    }
    int known = !only;
    for (int k = 0; k < NPARTS; k++)
        known |= only && strcmp(only, parts[k].name) == 0;
    if (!known || (only && json_path)) {
        fprintf(stderr, known ? "gpu_bench: --only %s writes no JSON (--json)\n"
                              : "gpu_bench: --only %s: no such part (gemm, epilogue, dgelu, attention, memory)\n",
                only);
        return 2;
    }
    if (!kcuda_available(why, sizeof why)) {
        printf("SKIP gpu: no GPU (%s)\n", why);
        return 0;
    }
    kc(kcuda_ctx_create(&ctx), "kcuda_ctx_create");
    kc(kcuda_ctx_create(&tctx), "kcuda_ctx_create");
    kc(kcuda_ctx_create(&cctx), "kcuda_ctx_create");
    kc(kcuda_ctx_create(&fctx), "kcuda_ctx_create");
    kcuda_ctx_set_attention_cudnn(cctx, 1);
    kcuda_ctx_set_tf32(fctx, 1);
    kcuda_ctx_set_gemm_tune(tctx, tiny ? 2 : 1); /* (--tiny's small products too) */
    struct cudaDeviceProp prop;
    cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    printf("gpu_bench: %s, sm_%d%d, %d SMs, %.0f GiB\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1u << 30));
    if (tiny)
        printf("gpu_bench: --tiny: every size cut by 16 (the GEMMs' by 32), one launch timed: a rehearsal, not a measurement\n");
    jcat("{\"device\":\"%s\",\"sms\":%d,\"tiny\":%s,", prop.name, prop.multiProcessorCount,
         tiny ? "true" : "false");
    for (int k = 0; k < NPARTS; k++)
        if (!only || strcmp(only, parts[k].name) == 0)
            parts[k].run();
    jcat("}");
    if (only) {
        kcuda_ctx_free(fctx);
        kcuda_ctx_free(cctx);
        kcuda_ctx_free(tctx);
        kcuda_ctx_free(ctx);
        return 0;
    }
    printf("\nJSON %s\n", json);
    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f)
            die(json_path, "cannot write");
        fprintf(f, "%s\n", json);
        fclose(f);
    }
    kcuda_ctx_free(fctx);
    kcuda_ctx_free(cctx);
    kcuda_ctx_free(tctx);
    kcuda_ctx_free(ctx);
    return 0;
}
