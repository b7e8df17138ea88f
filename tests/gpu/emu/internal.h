/* internal.h (CPU emulation, tests/gpu/emu): what the emulator's own files
 * share (runtime.cpp, exec.cpp, cublaslt.cpp). */
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <cuda_runtime.h>
#include <stddef.h>

#include <functional>
#include <mutex>

namespace emu {

/* The device's limits (an H200, sm_90). */
enum : size_t {
    SMEM_DEFAULT = 48 * 1024,  /* dynamic shared memory without opting in */
    SMEM_OPTIN = 227 * 1024,   /* the most a kernel may opt in to */
    MAX_THREADS = 1024
};

/* A device's sticky error (a fault in a kernel), cudaSuccess if none;
 * device -1 is the calling thread's current one. Once set, every later
 * call on that device fails with it, as after a GPU fault (a CUDA
 * context's: the process's other GPUs go on). */
cudaError_t sticky_error(int device = -1);
void set_sticky(cudaError_t e, int device = -1);

/* Failures injected on purpose (fault.cpp: EMU_FAIL=KIND:N). */
enum FaultKind { FAULT_MALLOC, FAULT_CREATE, FAULT_LAUNCH, FAULT_MATMUL, FAULT_NCCL, FAULT_KINDS };
/* Counts a call of kind k (what: the call, for the message); true when it
 * is the one EMU_FAIL names, which then fails as fault.cpp says. */
bool fault_here(FaultKind k, const char *what);

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

/* The device a stream (or, cast, an event) was made on; the legacy
 * stream's is the calling thread's current device; -1 if not alive. */
int stream_device(cudaStream_t s);

/* What a stream's queue holds (runtime.cpp): kernels, copies, sets,
 * cuBLASLt products and sorts (stream_run), the waits CUDA puts between
 * streams (cudaStreamWaitEvent; the legacy stream's implicit ones), and the
 * emulated NCCL's operations (nccl.cpp). An item starts once every earlier
 * item of its stream is done; until the queue is empty the stream is busy:
 * cudaStreamQuery says cudaErrorNotReady, and an event recorded after an
 * item is not complete before it. */
struct Async {
    virtual ~Async() {}
    /* Called under async_mutex() once it is the first of its stream's
     * queue; it, or whoever finishes it later, calls async_done. */
    virtual void start() = 0;
    bool started = false;
    cudaStream_t key = nullptr; /* its queue (async_enqueue sets it) */
};

/* The lock of the streams' queues, their events, and the NCCL
 * emulation's state. */
std::mutex &async_mutex();

/* Under async_mutex: appends a (owned from now on) to s's queue, after
 * the waits the legacy stream implies (a blocking stream's work waits for
 * the legacy stream's earlier work, the legacy stream's for every blocking
 * stream's of its device), starting it if it is first. */
void async_enqueue(cudaStream_t s, Async *a);

/* Under async_mutex: a, the first of its stream's queue, is done: it is
 * deleted, the next one started, and the threads waiting for the queue
 * woken. */
void async_done(Async *a);

/* fn runs, under async_mutex, on a timer thread once `us` microseconds
 * have passed (callable with async_mutex held or not). */
void after_us(long us, std::function<void()> fn);

/* stream_run (emu/device.h) puts its work in these queues. */

/* Not under async_mutex: blocks until s's queue is empty. */
void stream_wait_idle(cudaStream_t s);

/* The calling thread's device (cudaSetDevice), and how many there are
 * (MESH_EMU_GPUS, 1 to 8; default 1). */
int current_device();
int device_count();

/* 1 when [p, p + bytes) lies inside one live device allocation. */
bool device_range(const void *p, size_t bytes);
/* The device whose one allocation holds [p, p + bytes), or -1. */
int device_of(const void *p, size_t bytes);

/* "emu: ..." on stderr. */
void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

} /* namespace emu */

#endif
