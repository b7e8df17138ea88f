/* kcpu_math_impl.h — internal to kernels/cpu: a branch-free expf and the
 * fixed-length chunk helpers that let gcc -O2 vectorise elementwise loops.
 * Not API; nothing outside kernels/cpu includes it.
 *
 * Why chunks: at -O2 gcc's vectoriser uses the "very cheap" cost model,
 * which refuses a loop whose trip count is unknown (it would need a scalar
 * epilogue) or whose pointers might alias (it would need a runtime check).
 * So the elementwise kernels copy KCPU_CHUNK elements at a time into local
 * arrays, run fixed-count loops over those (SIMD, and no aliasing question:
 * an output may alias an input), and copy the results out. The ragged last
 * chunk is padded (with zeros, or a value the kernel picks) and takes the
 * same path, so every element goes through the same arithmetic. Kernels
 * that walk rows instead use fixed inner loops of KCPU_LANES, with restrict
 * pointers where outputs cannot alias inputs.
 *
 * Libm's expf and tanhf are calls per element that never vectorise; they
 * were a third of a training step of the tiny GPT. kcpu__expf is written in
 * plain float arithmetic, within 2 ulp of e^x (see below), and identical in
 * its scalar and vector forms (no FMA contraction under -std=c11).
 */
#ifndef MESH_KCPU_MATH_IMPL_H
#define MESH_KCPU_MATH_IMPL_H

#include <stddef.h> /* defines: size_t */
#include <stdint.h> /* defines: uint32_t */
#include <string.h> /* defines: memcpy */

/* Elements per chunk: 64 floats, a quarter of a KiB per local array. */
#define KCPU_CHUNK 64

/* Width of the fixed inner loops that walk a row of unknown length in
 * groups (`for (u = 0; u < KCPU_LANES; u++)`), the rest done one by one;
 * also the number of partial sums that such loops keep, in a fixed order. */
#define KCPU_LANES 8

/* A float and its bits. */
typedef union kcpu__bits {
    float f;
    uint32_t u;
} kcpu__bits;

/* e^x in float, branch-free. x = n ln2 + r with n an integer and |r| <=
 * ln2/2; e^r from its Taylor series to r^7 (truncation < 6e-9 relative),
 * 2^n written straight into the exponent bits. Saturates rather than
 * overflows: x > 88 gives e^88 (about 1.65e38), and x < -87.3 gives 0,
 * exactly so for -INFINITY; a NaN stays NaN. Relative error under 2 ulp
 * elsewhere (tests/unit/test_kcpu_dense.c checks it against exp).
 *
 * The range checks pick bits with & and | masks, not with ?: on purpose:
 * gcc specialises the code after a ?: that yields a constant, and then will
 * not if-convert the float arithmetic left in the branches (it could trap,
 * under the default -ftrapping-math), so the caller's loop would not
 * vectorise. */
static inline float kcpu__expf(float x)
{
    const kcpu__bits hi = {88.0f}, lo = {-87.3f};
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f;    /* 9 bits: n * ln2_hi is exact */
    const float ln2_lo = -2.12194440e-4f; /* ln2 - ln2_hi */
    const float magic = 0x1.8p23f;        /* adding it rounds to integer */
    uint32_t big = -(uint32_t)(x > hi.f), small = -(uint32_t)(x < lo.f);
    kcpu__bits xc = {x};
    xc.u = (xc.u & ~big) | (hi.u & big); /* min(x, hi) */
    xc.u = (xc.u & ~small) | (lo.u & small); /* max(x, lo) */
    float t = xc.f * log2e + magic; /* n sits in t's low mantissa bits */
    float n = t - magic;
    float r = (xc.f - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    kcpu__bits two_n = {t};
    two_n.u = (two_n.u - 0x4B400000u + 127u) << 23; /* (n + 127) << 23 */
    kcpu__bits y = {p * two_n.f};
    y.u &= ~small; /* 0 below lo */
    return y.f;
}

/* Elements in the chunk that starts at i of an n-element array. */
static inline size_t kcpu__chunk_len(size_t i, size_t n)
{
    return n - i < KCPU_CHUNK ? n - i : KCPU_CHUNK;
}

/* dst[KCPU_CHUNK] = src[0..n), then fill; n <= KCPU_CHUNK. A whole chunk is
 * a fixed-count loop, which gcc turns into vector moves. */
static inline void kcpu__chunk_load_fill(float *dst, const float *src,
                                         size_t n, float fill)
{
    if (n == KCPU_CHUNK) {
        for (int i = 0; i < KCPU_CHUNK; i++)
            dst[i] = src[i];
        return;
    }
    for (size_t i = 0; i < KCPU_CHUNK; i++)
        dst[i] = i < n ? src[i] : fill;
}

/* dst[KCPU_CHUNK] = src[0..n), then zeros. */
static inline void kcpu__chunk_load(float *dst, const float *src, size_t n)
{
    kcpu__chunk_load_fill(dst, src, n, 0.0f);
}

/* dst[0..n) = src[0..n); n <= KCPU_CHUNK. */
static inline void kcpu__chunk_store(float *dst, const float *src, size_t n)
{
    if (n == KCPU_CHUNK) {
        for (int i = 0; i < KCPU_CHUNK; i++)
            dst[i] = src[i];
        return;
    }
    memcpy(dst, src, n * sizeof *dst);
}

/* y[n] += x[n]; y and x do not overlap. */
static inline void kcpu__add_into(float *restrict y, const float *restrict x,
                                  size_t n)
{
    size_t i = 0;
    for (; i + KCPU_LANES <= n; i += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            y[i + u] += x[i + u];
    for (; i < n; i++)
        y[i] += x[i];
}

#endif
