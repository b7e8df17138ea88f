/*
 * gpu_tests_harness.c: the op tests' harness (gpu_tests.h): the case in
 * hand, host and device buffers freed after each case, random inputs and
 * 2-byte rounding on the host, and the checks of the GPU's results against
 * the CPU reference's (errors, tolerances, bits).
 */
#include <math.h>   /* defines: fabs, isnan */
#include <stdlib.h> /* defines: malloc, free, exit */
#include <string.h> /* defines: memcpy, memcmp, strstr */

#include "gpu_tests.h"

/* ---- the current case -------------------------------------------------- */

int cur_bad;
double cur_err;
double cur_tol;
double cur_floor;
char cur_shape[160];
kcuda_ctx *ctx;

double tol_of(kcuda_dtype dt)
{
    return dt == KCUDA_BF16 ? TOL_BF16 : dt == KCUDA_F16 ? TOL_F16 : TOL_F32;
}

/* kcpu's name for a 2-byte dtype's rounding. */
kcpu_precision prec_of(kcuda_dtype dt)
{
    return dt == KCUDA_F16 ? KCPU_FP16 : KCPU_BF16;
}

/* The same for a CUDA runtime call; exits on failure (setup only). */
void cuda_or_die(cudaError_t e, const char *what)
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

void *hmem(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || nh == MAX_BUFS) {
        fprintf(stderr, "# out of host buffers\n");
        exit(1);
    }
    hbufs[nh++] = p;
    return p;
}

float *hf(size_t n)
{
    return hmem(n * sizeof(float));
}

void *dmem(size_t bytes)
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

void free_all(void)
{
    while (nh > 0)
        free(hbufs[--nh]);
    while (nd > 0)
        cudaFree(dbufs[--nd]);
}

/* ---- random numbers and bf16 on the host -------------------------------- */

static uint64_t rng = 88172645463325252ull;

/* xorshift64*: uniform in [-1, 1). */
float frand(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    uint64_t r = rng * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

int irand(int n)
{
    float u = (frand() + 1.0f) * 0.5f;
    int k = (int)(u * (float)n);
    return k < 0 ? 0 : k >= n ? n - 1 : k;
}

/* x[n] uniform in [-scale, scale), rounded to dt's precision. */
float *rnd(size_t n, float scale, kcuda_dtype dt)
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
void *up(const float *x, size_t n, kcuda_dtype dt)
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

void *up_i32(const int32_t *x, size_t n)
{
    void *d = dmem(n * sizeof *x);
    cuda_or_die(cudaMemcpy(d, x, n * sizeof *x, cudaMemcpyHostToDevice),
                "upload");
    return d;
}

/* The device tensor d[n] (in dt) as floats; waits for the device. */
float *down(const void *d, size_t n, kcuda_dtype dt)
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

void *down_raw(const void *d, size_t bytes)
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

void note(double e)
{
    if (e > cur_err || isnan(e))
        cur_err = e;
}

/* got[n] against want[n] within the case's tolerance. */
void expect(const char *what, const float *got, const float *want,
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
void expect_dev(const char *what, const void *d, const float *want,
                       size_t n, kcuda_dtype dt)
{
    expect(what, down(d, n, dt), want, n);
}

/* Bit for bit. */
void expect_bits(const char *what, const void *got, const void *want,
                        size_t bytes)
{
    if (memcmp(got, want, bytes) != 0) {
        cur_bad = 1;
        fprintf(stderr, "# %s%s: not the same bits\n", cur_shape, what);
    }
}

void expect_ints(const char *what, const int *got, const int *want,
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
void *snapshot(const void *d, size_t n, kcuda_dtype dt)
{
    return down_raw(d, n * kcuda_dtype_size(dt));
}

/* 1 on the CPU emulation (tests/gpu/emu), whose cuBLASLt offers known
 * algorithms. */
int emulated(void)
{
    struct cudaDeviceProp prop;
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess &&
           strstr(prop.name, "CPU emulation") != NULL;
}
