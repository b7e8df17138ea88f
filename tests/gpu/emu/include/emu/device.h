/* emu/device.h (CPU emulation, tests/gpu/emu): the device side of CUDA C++
 * as kernels/cuda uses it, for g++. Included by cuda_runtime.h in C++.
 *
 * Execution model (exec.cpp): a block runs on one OS thread, each of its
 * CUDA threads a fiber of its own (own stack, own registers); barriers and
 * warp-synchronous operations really wait for the threads they name.
 * Blocks run concurrently on a few OS threads. So a block's __shared__
 * variables are thread_local (one copy per block being run), and the
 * dynamic shared memory is the thread_local array `smem` (the name
 * kernels/cuda gives it). Under ThreadSanitizer every CUDA thread is a
 * TSan fiber, and the only happens-before edges are the ones CUDA
 * promises: __syncthreads, __syncwarp, kernel start and end.
 */
#ifndef EMU_DEVICE_H
#define EMU_DEVICE_H

#include <math.h>   /* expf, ... (libm: not the GPU's ulp errors) */
#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */
#include <string.h> /* memcpy */

#include <functional>  /* std::function: work for a stream */
#include <tuple>       /* std::tuple, std::apply */
#include <type_traits> /* std::is_same */
#include <utility>     /* std::forward */

#include "../cuda_runtime_api.h"

/* ---- execution-space keywords ------------------------------------------ */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* one copy per block being run (a block runs on one OS thread); also
 * legal as `extern __shared__ T smem[]` */
#define __shared__ thread_local

/* ---- vector types ------------------------------------------------------- */

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1,
                   unsigned int vz = 1)
        : x(vx), y(vy), z(vz)
    {
    }
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

/* ---- the emulator's interface (exec.cpp) -------------------------------- */

namespace emu {

/* What the built-in variables of the running CUDA thread read. */
struct Thread {
    uint3 tid, bid;
    dim3 bdim, gdim;
    unsigned lane; /* linear thread index % 32 */
};

/* The running CUDA thread (set by the block's runner at each switch). */
extern __thread Thread *tls_thread;

__attribute__((always_inline)) inline const Thread &self()
{
    return *tls_thread;
}

/* Warp-synchronous operations: every thread named in mask posts one and
 * waits until all of them have; the emulator checks that they agree. */
enum {
    OP_SYNCWARP = 1,
    OP_SHFL_IDX,
    OP_SHFL_UP,
    OP_SHFL_DOWN,
    OP_SHFL_XOR,
    OP_MMA_M16N8K16, /* emu/ptx.h */
    OP_LDMATRIX_X4,
    OP_MMA_M16N8K8, /* emu/ptx.h: TF32 */
    OP_WGMMA_WAIT
};

/* Element types of mma's inputs: m16n8k16's bf16 and f16, m16n8k8's tf32. */
enum { ELEM_BF16 = 1, ELEM_F16 = 2, ELEM_TF32 = 3 };

struct WarpOp {
    int kind;
    unsigned mask;
    /* shuffles */
    uint64_t value, result;
    int size, arg, width;
    /* ldmatrix: the lane's row, and 1 for .trans */
    const void *ptr;
    int trans;
    /* mma.m16n8k16: ELEM_* */
    int elem;
    /* mma.m16n8k16: the lane's registers (a[4], b[2], c and d float[4]);
     * ldmatrix: d is r[4] */
    void *d;
    const void *a, *b, *c;
    /* ldmatrix: where each of the lane's 8 elements (r[i]'s low half at
     * 2i, high half at 2i + 1) was read; set by the emulator */
    const void *src[8];
};

/* A wgmma operand in shared memory queued by a thread (emu/ptx.h): B
 * [16 x n] (or A [64 x 16], as K-major with m for n): its start, n,
 * offsets and majorness. */
struct WgmmaB {
    const unsigned char *b;
    unsigned n, lbo, sbo;
    int trans;
};

/* The byte offset of element (k, n) of such an operand, by the canonical
 * layout without swizzling: K-major (trans 0) or N-major. */
inline unsigned wgmma_offset(const WgmmaB &o, unsigned k, unsigned n)
{
    return o.trans ? 2 * (n % 8) + o.sbo * (n / 8) + 16 * (k % 8) + o.lbo * (k / 8)
                   : 16 * (n % 8) + o.sbo * (n / 8) + 2 * (k % 8) + o.lbo * (k / 8);
}

void warp_op(WarpOp *op);
void syncthreads();

/* Stops the kernel with a CUDA error (a sticky one, as a GPU fault is)
 * and a message naming the block and thread. */
[[noreturn]] void trap(cudaError_t err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of the last kernel that stopped (a trap, or a check the
 * emulator made; "" before any): for the self-tests, which check why. */
const char *last_failure();

template <class T>
inline T shfl(int kind, unsigned mask, T var, int arg, int width)
{
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    WarpOp op = {};
    op.kind = kind;
    op.mask = mask;
    memcpy(&op.value, &var, sizeof var);
    op.size = (int)sizeof var;
    op.arg = arg;
    op.width = width;
    warp_op(&op);
    T r;
    memcpy(&r, &op.result, sizeof r);
    return r;
}

/* ---- launches ------------------------------------------------------------ */

struct LaunchDesc {
    const void *func;
    const char *name, *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    void (*entry)(const void *state); /* runs the kernel for one thread */
    const void *state;
};

/* Checks the launch (its error, for cudaGetLastError, is recorded at
 * once) and runs every block in the stream's order (stream_run); then (or
 * at once, if refused) drop(d.state) frees the arguments. */
void launch(const LaunchDesc &d, void (*drop)(const void *state));

/* Runs fn in s's order, as the device runs a kernel, copy or set
 * (runtime.cpp). Asynchronous (the default; EMU_ASYNC=0 turns it off): fn
 * is queued and the call returns at once; one of EMU_WORKERS worker
 * threads (default 4) runs it once every earlier item of s's queue is
 * done, EMU_LAG_US microseconds late (default 0), so that the device lags
 * behind the host as a GPU's does. Synchronous: the calling thread waits
 * for s's earlier work and runs fn itself. */
void stream_run(cudaStream_t s, std::function<void()> fn);

/* A kernel's pointer argument into another GPU's memory than the launch's
 * (runtime.cpp): its device, or -1 (the launch's GPU's memory, the host's,
 * a null or an end pointer: not judged here). */
int foreign_device(const void *p);
/* The launch refused as the kernel would fault on such an argument (sticky
 * cudaErrorIllegalAddress, with a diagnostic naming it). */
void foreign_fault(const LaunchDesc &d, int index, const void *p, int device);

/* Pointer arguments checked by foreign_device: the first bad one's
 * index in *bad, the pointer in *at and its device in *dev. */
template <class T> inline void check_arg(const T &, int, int *, const void **, int *) {}
template <class T> inline void check_arg(T *const &p, int i, int *bad, const void **at, int *dev)
{
    if (*bad < 0 && (*dev = foreign_device((const void *)p)) >= 0) {
        *bad = i;
        *at = (const void *)p;
    }
}

template <class... P> struct KernelCall {
    void (*kernel)(P...);
    std::tuple<P...> args; /* converted to the parameter types, once */
};

template <class... P> void kernel_drop(const void *state)
{
    delete static_cast<const KernelCall<P...> *>(state);
}

/* Each thread gets its own copies of the arguments. */
template <class... P> void kernel_entry(const void *state)
{
    const KernelCall<P...> *c = static_cast<const KernelCall<P...> *>(state);
    std::apply(c->kernel, c->args);
}

template <class... P> struct Launcher {
    void (*kernel)(P...);
    const char *name, *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    template <class... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P),
                      "kernel launched with the wrong number of arguments");
        const KernelCall<P...> *call =
            new KernelCall<P...>{kernel, std::tuple<P...>(std::forward<A>(a)...)};
        LaunchDesc d = {reinterpret_cast<const void *>(kernel),
                        name,
                        file,
                        line,
                        grid,
                        block,
                        smem,
                        stream,
                        &kernel_entry<P...>,
                        call};
        int bad = -1, i = 0, dev = -1;
        const void *at = nullptr;
        std::apply([&](const auto &...x) { (check_arg(x, i++, &bad, &at, &dev), ...); }, call->args);
        if (bad >= 0) {
            foreign_fault(d, bad, at, dev);
            kernel_drop<P...>(call);
            return;
        }
        launch(d, &kernel_drop<P...>);
    }
};

/* `k<<<grid, block, smem, stream>>>(args)` is rewritten at build time
 * (launch_rewrite.py) into
 * `::emu::launcher(k, "k", __FILE__, __LINE__, grid, block, smem, stream)(args)`. */
template <class... P>
inline Launcher<P...> launcher(void (*kernel)(P...), const char *name,
                               const char *file, int line, dim3 grid,
                               dim3 block, size_t smem = 0,
                               cudaStream_t stream = 0)
{
    return Launcher<P...>{kernel, name, file, line, grid, block, smem, stream};
}

} /* namespace emu */

/* ---- built-in variables -------------------------------------------------- */

#define threadIdx (::emu::self().tid)
#define blockIdx (::emu::self().bid)
#define blockDim (::emu::self().bdim)
#define gridDim (::emu::self().gdim)
static constexpr int warpSize = 32;

/* ---- synchronization and warp intrinsics --------------------------------- */

static inline void __syncthreads()
{
    ::emu::syncthreads();
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    ::emu::WarpOp op = {};
    op.kind = ::emu::OP_SYNCWARP;
    op.mask = mask;
    ::emu::warp_op(&op);
}

/* CUDA's overloads, one set per type (cuda_fp16.h and cuda_bf16.h add
 * theirs). */
#define EMU_SHFL_OVERLOADS(T)                                                  \
    static inline T __shfl_sync(unsigned mask, T var, int srcLane,             \
                                int width = warpSize)                          \
    {                                                                          \
        return ::emu::shfl<T>(::emu::OP_SHFL_IDX, mask, var, srcLane, width);  \
    }                                                                          \
    static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta,       \
                                   int width = warpSize)                       \
    {                                                                          \
        return ::emu::shfl<T>(::emu::OP_SHFL_UP, mask, var, (int)delta,        \
                              width);                                          \
    }                                                                          \
    static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta,     \
                                     int width = warpSize)                     \
    {                                                                          \
        return ::emu::shfl<T>(::emu::OP_SHFL_DOWN, mask, var, (int)delta,      \
                              width);                                          \
    }                                                                          \
    static inline T __shfl_xor_sync(unsigned mask, T var, int laneMask,        \
                                    int width = warpSize)                      \
    {                                                                          \
        return ::emu::shfl<T>(::emu::OP_SHFL_XOR, mask, var, laneMask, width); \
    }

EMU_SHFL_OVERLOADS(int)
EMU_SHFL_OVERLOADS(unsigned int)
EMU_SHFL_OVERLOADS(long)
EMU_SHFL_OVERLOADS(unsigned long)
EMU_SHFL_OVERLOADS(long long)
EMU_SHFL_OVERLOADS(unsigned long long)
EMU_SHFL_OVERLOADS(float)
EMU_SHFL_OVERLOADS(double)

/* ---- atomics ---------------------------------------------------------------- */

/* atomicAdd on a float of global (or shared) memory: *address += val,
 * the old value returned; the blocks of a launch run on several runner
 * threads at once, so it is a compare-and-swap loop on the float's bits
 * (ThreadSanitizer sees atomic accesses). The sum's order is the threads'
 * arrival order, as on a GPU: not fixed. */
static inline float atomicAdd(float *address, float val)
{
    unsigned *p = reinterpret_cast<unsigned *>(address);
    unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED), next;
    float f;
    do {
        memcpy(&f, &old, sizeof f);
        float sum = f + val;
        memcpy(&next, &sum, sizeof next);
    } while (!__atomic_compare_exchange_n(p, &old, next, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return f;
}

/* A fence at the GPU's scope: the thread's writes before it (its atomics
 * included) are seen before those after it. */
static inline void __threadfence()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* ---- arithmetic ------------------------------------------------------------ */

/* Round-to-nearest operations nvcc never fuses into an FMA. The default
 * build fuses nothing anywhere (-ffp-contract=off); `make gpu-emu-fma`
 * fuses where g++ chooses (-mfma -ffp-contract=fast), as nvcc does where
 * it chooses, and these must stay apart there too: their operands and
 * result pass through an empty asm, which g++ cannot see through, so
 * no multiply is fused into an add across it. */
#if defined(__x86_64__) || defined(__i386__)
#define EMU_FP_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define EMU_FP_OPAQUE(v) __asm__("" : "+w"(v))
#else
#define EMU_FP_OPAQUE(v) __asm__("" : "+m"(v))
#endif
#define EMU_FP_RN(name, expr)                                                  \
    static inline float name(float a, float b)                                 \
    {                                                                          \
        EMU_FP_OPAQUE(a);                                                      \
        EMU_FP_OPAQUE(b);                                                      \
        float r = (expr);                                                      \
        EMU_FP_OPAQUE(r);                                                      \
        return r;                                                              \
    }
EMU_FP_RN(__fadd_rn, a + b)
EMU_FP_RN(__fsub_rn, a - b)
EMU_FP_RN(__fmul_rn, a * b)
EMU_FP_RN(__fdiv_rn, a / b)
#undef EMU_FP_RN
static inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}
/* a b + c rounded once, as the GPU's FFMA: the C library's fmaf. */
static inline float __fmaf_rn(float a, float b, float c)
{
    return fmaf(a, b, c);
}

/* CUDA's min and max overloads. */
#define EMU_MINMAX(T)                                                          \
    static inline T min(T a, T b)                                              \
    {                                                                          \
        return a < b ? a : b;                                                  \
    }                                                                          \
    static inline T max(T a, T b)                                              \
    {                                                                          \
        return a > b ? a : b;                                                  \
    }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
static inline float min(float a, float b)
{
    return fminf(a, b);
}
static inline float max(float a, float b)
{
    return fmaxf(a, b);
}
static inline double min(double a, double b)
{
    return fmin(a, b);
}
static inline double max(double a, double b)
{
    return fmax(a, b);
}

#endif
