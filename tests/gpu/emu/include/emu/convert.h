/* emu/convert.h (CPU emulation, tests/gpu/emu): the bit-exact conversions
 * between binary32 and the 2-byte floating-point types, as the GPU's
 * cvt.rn instructions do them: round to nearest, ties to even, subnormals
 * kept, overflow to infinity, and a NaN becomes the canonical NaN 0x7fff.
 * C and C++. */
#ifndef EMU_CONVERT_H
#define EMU_CONVERT_H

#include <stdint.h> /* uint16_t, uint32_t */
#include <string.h> /* memcpy */

static inline uint32_t emu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float emu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* binary32 -> bfloat16 (its top 16 bits, rounded). */
static inline uint16_t emu_f32_to_bf16(float f)
{
    uint32_t u = emu_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float emu_bf16_to_f32(uint16_t h)
{
    return emu_bits_f32((uint32_t)h << 16);
}

/* binary32 -> binary16. */
static inline uint16_t emu_f32_to_f16(float f)
{
    uint32_t u = emu_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t r, rem, half, sh;
    if (a > 0x7f800000u)
        return 0x7fffu;
    if (a >= 0x477ff000u) /* 65520 and up (the tie rounds up): infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal: 2^-14 and up */
        r = (a - 0x38000000u) >> 13;
        rem = a & 0x1fffu;
        r += rem > 0x1000u || (rem == 0x1000u && (r & 1u));
        return (uint16_t)(sign | r);
    }
    if (a <= 0x33000000u) /* 2^-25 and below (the tie rounds to 0) */
        return (uint16_t)sign;
    /* subnormal: a = m 2^(e - 150), in units of 2^-24 m >> (126 - e) */
    sh = 126u - (a >> 23);
    r = ((a & 0x7fffffu) | 0x800000u) >> sh;
    rem = ((a & 0x7fffffu) | 0x800000u) & ((1u << sh) - 1u);
    half = 1u << (sh - 1u);
    r += rem > half || (rem == half && (r & 1u));
    return (uint16_t)(sign | r);
}

static inline float emu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return emu_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return emu_bits_f32(sign);
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        return emu_bits_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
    }
    return emu_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif
