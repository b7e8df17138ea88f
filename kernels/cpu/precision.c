/* precision.c — the storage precisions a mixed-precision run emulates on
 * the CPU: every value rounded to the nearest bf16 or fp16 number (ties to
 * even), kept in a float. The GPU stores the same numbers in 2 bytes
 * (kcuda_convert rounds the same way), so the CPU computes what the GPU
 * computes: fp32 arithmetic on low-precision inputs, each result rounded
 * once when stored.
 */
#include "kcpu_dense.h"

#include <math.h>   /* defines: isfinite, rintf, fabsf */
#include <stdint.h> /* defines: uint32_t */
#include <string.h> /* defines: memcpy */

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

float kcpu_bf16_round(float x)
{
    uint32_t u = bits_of(x);
    if (isnan(x)) return float_of((u | 0x00400000u) & 0xffff0000u); /* a quiet NaN */
    /* ties to even on the 16 bits dropped; a float past bf16's largest
     * number carries into the exponent and becomes infinity, as it should */
    u += 0x7fffu + ((u >> 16) & 1u);
    return float_of(u & 0xffff0000u);
}

float kcpu_fp16_round(float x)
{
    if (!isfinite(x)) return x;
    float a = fabsf(x);
    if (a < 0x1p-14f) /* subnormal: multiples of 2^-24 (rintf: ties to even) */
        return rintf(x * 0x1p24f) * 0x1p-24f;
    uint32_t u = bits_of(x);
    u += 0xfffu + ((u >> 13) & 1u); /* 10 mantissa bits kept, ties to even */
    float r = float_of(u & 0xffffe000u);
    return fabsf(r) > 65504.0f ? (x < 0 ? -INFINITY : INFINITY) : r;
}

void kcpu_round(float *x, size_t n, kcpu_precision p)
{
    if (p == KCPU_BF16)
        for (size_t i = 0; i < n; i++) x[i] = kcpu_bf16_round(x[i]);
    else if (p == KCPU_FP16)
        for (size_t i = 0; i < n; i++) x[i] = kcpu_fp16_round(x[i]);
}

/* The binary16 bits of r, a number kcpu_fp16_round gives (exact). */
static uint16_t fp16_bits(float r)
{
    uint32_t u = bits_of(r);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(r);
    if (isnan(r)) return (uint16_t)(sign | 0x7e00u);
    if (isinf(r)) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x1p-14f) return (uint16_t)(sign | (uint16_t)(a * 0x1p24f)); /* subnormal: m x 2^-24 */
    uint32_t e = ((u >> 23) & 0xffu) - 127u + 15u;
    return (uint16_t)(sign | (e << 10) | ((u >> 13) & 0x3ffu));
}

static float fp16_value(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return float_of(sign | bits_of((float)m * 0x1p-24f));
    if (e == 31) return float_of(sign | 0x7f800000u | (m << 13));
    return float_of(sign | ((e - 15u + 127u) << 23) | (m << 13));
}

void kcpu_pack16(uint16_t *dst, const float *src, size_t n, kcpu_precision p)
{
    if (p == KCPU_FP16)
        for (size_t i = 0; i < n; i++) dst[i] = fp16_bits(kcpu_fp16_round(src[i]));
    else
        for (size_t i = 0; i < n; i++) dst[i] = (uint16_t)(bits_of(kcpu_bf16_round(src[i])) >> 16);
}

void kcpu_unpack16(float *dst, const uint16_t *src, size_t n, kcpu_precision p)
{
    if (p == KCPU_FP16)
        for (size_t i = 0; i < n; i++) dst[i] = fp16_value(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = float_of((uint32_t)src[i] << 16);
}
