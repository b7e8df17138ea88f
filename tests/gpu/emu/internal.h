/* internal.h (CPU emulation, tests/gpu/emu): what the emulator's own files
 * share (runtime.cpp, exec.cpp, cublaslt.cpp). */
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <cuda_runtime.h>
#include <stddef.h>

namespace emu {

/* The device's limits (an H200, sm_90). */
enum : size_t {
    SMEM_DEFAULT = 48 * 1024,  /* dynamic shared memory without opting in */
    SMEM_OPTIN = 227 * 1024,   /* the most a kernel may opt in to */
    MAX_THREADS = 1024
};

/* The sticky error (a fault in a kernel), cudaSuccess if none. Once set,
 * every later call fails with it, as after a GPU fault. */
cudaError_t sticky_error();
void set_sticky(cudaError_t e);

/* Records e as the calling thread's last error (unless cudaSuccess) and
 * returns it. */
cudaError_t record(cudaError_t e);

/* The API's error check on entry: the sticky error, recorded, if any. */
cudaError_t api_enter();

/* The opt-in of cudaFuncSetAttribute(MaxDynamicSharedMemorySize), 0 if
 * none. */
size_t func_max_dynamic_smem(const void *func);

/* 1 for the streams this runtime knows: 0 (the legacy default stream),
 * cudaStreamLegacy, cudaStreamPerThread. */
bool stream_ok(cudaStream_t s);

/* 1 when [p, p + bytes) lies inside one live device allocation. */
bool device_range(const void *p, size_t bytes);

/* "emu: ..." on stderr. */
void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

} /* namespace emu */

#endif
