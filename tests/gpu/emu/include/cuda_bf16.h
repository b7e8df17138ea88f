/* cuda_bf16.h (CPU emulation, tests/gpu/emu): __nv_bfloat16 as 16 bits of
 * storage, and CUDA's conversions, bit-exact (emu/convert.h). No implicit
 * conversions or operators: code that would need them fails to compile
 * here instead of computing in another precision than on the GPU. */
#ifndef EMU_CUDA_BF16_H
#define EMU_CUDA_BF16_H

#include "emu/convert.h"

#ifdef __cplusplus
#include "cuda_runtime.h"

struct __nv_bfloat16 {
    unsigned short __x;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    __nv_bfloat16 r;
    r.__x = emu_f32_to_bf16(f);
    return r;
}

static inline __nv_bfloat16 __float2bfloat16(float f)
{
    return __float2bfloat16_rn(f);
}

static inline float __bfloat162float(__nv_bfloat16 h)
{
    return emu_bf16_to_f32(h.__x);
}

EMU_SHFL_OVERLOADS(__nv_bfloat16)
#endif

#endif
