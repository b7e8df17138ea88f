/* cuda_fp16.h (CPU emulation, tests/gpu/emu): __half as 16 bits of
 * storage, and CUDA's conversions, bit-exact (emu/convert.h). No implicit
 * conversions or operators (see cuda_bf16.h). */
#ifndef EMU_CUDA_FP16_H
#define EMU_CUDA_FP16_H

#include "emu/convert.h"

#ifdef __cplusplus
#include "cuda_runtime.h"

struct __half {
    unsigned short __x;
};
typedef __half half;

static inline __half __float2half_rn(float f)
{
    __half r;
    r.__x = emu_f32_to_f16(f);
    return r;
}

static inline __half __float2half(float f)
{
    return __float2half_rn(f);
}

static inline float __half2float(__half h)
{
    return emu_f16_to_f32(h.__x);
}

EMU_SHFL_OVERLOADS(__half)
#endif

#endif
