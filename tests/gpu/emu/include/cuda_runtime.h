/* cuda_runtime.h (CPU emulation, tests/gpu/emu): the runtime API, and in
 * C++ the device side of CUDA C++ that kernels/cuda uses (execution-space
 * keywords, built-in variables, barriers, warp intrinsics, <<<...>>>
 * launches). The build force-includes it into every .cu file, as nvcc
 * does. */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "emu/device.h"
#endif

#endif
