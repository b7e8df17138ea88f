/* exec.cpp (CPU emulation, tests/gpu/emu): running kernels.
 *
 * A launch's blocks are spread over R runner threads (EMU_RUNNERS; 4 by
 * default, 2 under ThreadSanitizer, whose cost grows with the number of
 * fibers): block i runs on runner i % R, the runners concurrently, each
 * running its blocks one after another. A block runs on its runner's OS
 * thread, each of its CUDA threads a fiber (its own stack, switched in
 * user space): a thread runs until it reaches __syncthreads, a
 * warp-synchronous operation (__syncwarp, a shuffle, an mma or ldmatrix
 * of emu/ptx.h) or its end; when no thread of the block can run, the
 * runner completes what can be completed (a warp operation whose threads
 * have all arrived, checked for agreement: those of every warp, or with
 * EMU_WARPS=serial those of the first warp that has one; else a
 * __syncthreads every thread has reached) and runs the threads again
 * (first to last, or last to first with EMU_ORDER=reverse). What cannot
 * be completed (a mask naming an exited thread, threads waiting at
 * different barriers) stops the kernel with a sticky error and a
 * message, as undefined behaviour should. cp.async copies (emu/ptx.h)
 * wait in their thread's queue until it waits for them (or, with
 * EMU_CP_ASYNC=early, land as issued).
 *
 * Why fibers, not one OS thread per CUDA thread: a block's __shared__
 * variables must be one object per block, and `extern __shared__` rules
 * out `static` (extern static is ill-formed), which leaves thread_local,
 * one copy per OS thread; and an OS thread per CUDA thread costs about
 * 3.5 us per thread per barrier on a 2-core machine (measured), over a
 * minute for gpu_tests' 1024-block reductions alone. Under
 * ThreadSanitizer (EMU_TSAN) every CUDA thread is a TSan fiber, switched
 * without synchronization, so TSan sees each as a thread of its own, and
 * the emulator adds exactly the happens-before edges CUDA promises:
 * kernel start (launch -> every thread), __syncthreads (the block),
 * __syncwarp (the threads of its mask), kernel end (every thread -> the
 * host). Shuffles, mma and ldmatrix calls order no memory. The blocks a
 * runner runs one after another are ordered too (its shared memory is
 * reused), so a race between blocks shows when they are on different
 * runners (blocks i and j with i - j not a multiple of R).
 *
 * A runner's thread-local storage is its block's shared memory: before
 * each block, the program's whole thread-local block on that OS thread
 * (the kernels' __shared__ variables, the emulator's one pointer) is
 * filled with 0xff bytes (NaN in every float type), and so are the
 * launch's dynamic shared memory bytes (and those past them that an
 * earlier block had), so that a read of shared memory no thread wrote
 * shows up; under AddressSanitizer the bytes past the launch's are
 * poisoned while a block runs (fill_shared).
 */
#include <cuda_runtime.h>

#include <link.h>     /* dl_iterate_phdr, PT_TLS */
#ifdef EMU_ASAN /* (this file is not instrumented: the kernels are, SAN=1) */
#include <sanitizer/asan_interface.h> /* __asan_poison_memory_region, __asan_unpoison_memory_region */
#endif
#include <sys/mman.h> /* mmap, mprotect */

#include <algorithm>          /* std::min, std::max */
#include <atomic>             /* std::atomic */
#include <chrono>             /* std::chrono: EMU_JITTER_US */
#include <condition_variable> /* std::condition_variable */
#include <cstdarg>            /* va_list */
#include <cstdio>             /* snprintf */
#include <cstdlib>            /* getenv, abort */
#include <cstring>            /* memset */
#include <mutex>              /* std::mutex */
#include <string>             /* std::string */
#include <thread>             /* std::thread */
#include <type_traits>        /* std::is_standard_layout */
#include <vector>             /* std::vector */

#include "emu/convert.h"
#include "internal.h"

#ifdef EMU_TSAN
#include <sanitizer/tsan_interface.h>
/* the runtime's, not in its public header */
extern "C" void __tsan_read_range(void *addr, unsigned long size);
extern "C" void __tsan_write_range(void *addr, unsigned long size);
#endif

#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
#include <ucontext.h>
#define EMU_USE_UCONTEXT 1
#endif

/* The kernels' dynamic shared memory: `extern __shared__ T smem[]`. */
alignas(256) thread_local unsigned char smem[emu::SMEM_OPTIN];

namespace emu {

__thread Thread *tls_thread;

namespace {

/* ---- fibers ------------------------------------------------------------ */

#ifdef EMU_USE_UCONTEXT
struct Ctx {
    ucontext_t uc;
};

/* makecontext passes ints: the function and its argument in halves */
void ucontext_entry(unsigned fhi, unsigned flo, unsigned ahi, unsigned alo)
{
    void (*fn)(void *) = (void (*)(void *))(((uintptr_t)fhi << 32) | flo);
    fn((void *)(((uintptr_t)ahi << 32) | alo));
}

void ctx_make(Ctx *c, char *stack, size_t size, void (*fn)(void *), void *arg)
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    uint64_t f = (uint64_t)(uintptr_t)fn, a = (uint64_t)(uintptr_t)arg;
    makecontext(&c->uc, (void (*)())ucontext_entry, 4, (unsigned)(f >> 32),
                (unsigned)(f & 0xffffffffu), (unsigned)(a >> 32), (unsigned)(a & 0xffffffffu));
}

inline void ctx_switch(Ctx *from, Ctx *to)
{
    swapcontext(&from->uc, &to->uc);
}
#else
/* x86-64: save the callee-saved registers, the SSE and x87 control words
 * and the stack pointer; load the other context's. A new context starts
 * in the trampoline, which calls r13(r12). */
extern "C" void emu_ctx_switch(void **save_sp, void *load_sp);
extern "C" void emu_ctx_trampoline();
asm(R"(
    .text
    .p2align 4
    .globl emu_ctx_switch
    .hidden emu_ctx_switch
    .type emu_ctx_switch, @function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch

    .p2align 4
    .globl emu_ctx_trampoline
    .hidden emu_ctx_trampoline
    .type emu_ctx_trampoline, @function
emu_ctx_trampoline:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size emu_ctx_trampoline, .-emu_ctx_trampoline
)");

struct Ctx {
    void *sp;
};

void ctx_make(Ctx *c, char *stack, size_t size, void (*fn)(void *), void *arg)
{
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    uint64_t *f = (uint64_t *)(top - 64);
    f[0] = 0x1f80u | ((uint64_t)0x037fu << 32); /* mxcsr, x87 control word */
    f[1] = 0;                                     /* r15 */
    f[2] = 0;                                     /* r14 */
    f[3] = (uint64_t)(uintptr_t)fn;               /* r13 */
    f[4] = (uint64_t)(uintptr_t)arg;              /* r12 */
    f[5] = 0;                                     /* rbx */
    f[6] = 0;                                     /* rbp */
    f[7] = (uint64_t)(uintptr_t)&emu_ctx_trampoline;
    c->sp = f;
}

inline void ctx_switch(Ctx *from, Ctx *to)
{
    emu_ctx_switch(&from->sp, to->sp);
}
#endif

/* ---- ThreadSanitizer's view ------------------------------------------------ */

#ifdef EMU_TSAN
inline void hb_release(void *a)
{
    __tsan_release(a);
}
inline void hb_acquire(void *a)
{
    __tsan_acquire(a);
}
/* This file is not instrumented: an access the emulator makes for the
 * running CUDA thread, shown to TSan as that thread's. */
inline void tsan_read(const void *p, size_t n)
{
    __tsan_read_range(const_cast<void *>(p), n);
}
inline void tsan_write(void *p, size_t n)
{
    __tsan_write_range(p, n);
}
#else
inline void hb_release(void *) {}
inline void hb_acquire(void *) {}
inline void tsan_read(const void *, size_t) {}
inline void tsan_write(void *, size_t) {}
#endif

/* ---- blocks, threads, runners --------------------------------------------- */

enum : uint8_t { READY, AT_WARP, AT_BLOCK, EXITED, TRAPPED };

enum { CP_MAX = 128 }; /* cp.async copies queued per thread (fp32 attention tiles at d 128: 80) */
enum { WG_MAX = 32 }; /* wgmma products queued per thread (the dq kernel at d 128: 20) */
enum { PEND = 32 };   /* copies a thread's fence.proxy.async finds without a scan */
enum { CHUNKS = SMEM_OPTIN / 16 };

const size_t STACK_BYTES = 256 * 1024; /* per CUDA thread, plus a guard page */

struct Runner;

struct Lane {
    Thread t; /* what tls_thread points to while this thread runs */
    Ctx ctx;
    Runner *runner;
    char *stack;
    uint8_t state;
    bool started;
    WarpOp *op;
    unsigned warp;
    unsigned bcount;      /* __syncthreads passed */
    unsigned wcount[32];  /* __syncwarp passed, per lowest lane of the mask */
#ifdef EMU_TSAN
    void *fiber;
#endif
    /* cp.async (emu/ptx.h): the copies not waited for yet, in the order
     * issued, each with its group (the commits so far + 1 while open);
     * dst null once landed (EMU_CP_ASYNC=early: at the issue) */
    struct Copy {
        unsigned char *dst;
        const unsigned char *src;
        unsigned bytes, group;
    } cp[CP_MAX];
    unsigned ncp, cp_commits;
    /* wgmma (emu/ptx.h): the products not waited for, in the order
     * issued, each with its group as the copies' */
    struct Wg {
        float *d;
        const uint32_t *a;     /* A in registers, or */
        const unsigned char *as; /* A in shared memory (K-major) */
        unsigned albo, asbo;
        const unsigned char *b;
        unsigned n, lbo, sbo, group;
        int trans, elem;
        bool acc;
    } wg[WG_MAX];
    unsigned nwg, wg_commits;
    /* wgmma.fence (the fences of warpgroup products, below): the
     * thread's stack from its last fence's frame up, as the fence left it
     * (snap_lo .. + snap_len; snap, of snap_cap bytes, kept from block to
     * block); fenced once it has had one */
    unsigned char *snap;
    size_t snap_cap, snap_len;
    uintptr_t snap_lo;
    bool fenced;
    /* fence.proxy.async (the same): the 16-byte chunks of the dynamic
     * shared memory its copies wrote since its last one, the first PEND of
     * them (pend_all: more) */
    uint16_t pend[PEND];
    unsigned npend;
    bool pend_all;
};

struct Job {
    const LaunchDesc *d;
    unsigned long long nblocks;
    unsigned stride; /* the runners used */
    std::atomic<bool> abort{false};
    std::mutex m;
    std::condition_variable cv;
    unsigned pending = 0;
    bool trapped = false;
    cudaError_t err = cudaSuccess;
    std::string msg;
};

struct Runner {
    unsigned id;
    unsigned rng = 0; /* EMU_JITTER_US's (jitter) */
    std::thread th;
    std::mutex m;
    std::condition_variable cv;
    Job *next = nullptr;
    /* the block being run */
    Job *job = nullptr;
    std::vector<Lane> lanes;
    unsigned nlanes = 0; /* lanes with a stack */
    unsigned nthreads = 0, nwarps = 0, nexited = 0;
    uint3 bid{};
    Ctx sched;
    bool trapped = false;
    cudaError_t trap_err = cudaSuccess;
    std::string trap_msg;
    /* this OS thread's copy of the program's thread-local block */
    unsigned char *tls_lo = nullptr, *tls_hi = nullptr;
    size_t smem_dirty = 0; /* the dynamic shared memory's bytes the last block had */
    /* the addresses ThreadSanitizer's happens-before edges hang on */
    char hb_block[2];
    char hb_warp[32][32][2];
    char hb_done;
    char hb_trap; /* a trapping thread's message -> the runner */
    /* which thread's cp.async wrote each 16-byte chunk of the dynamic
     * shared memory with no fence.proxy.async of its own after it (its
     * index + 1; 0: none), up to chunk proxy_hi (the fences of
     * warpgroup products, below) */
    uint16_t proxy[CHUNKS] = {};
    unsigned proxy_hi = 0;
#ifdef EMU_TSAN
    void *sched_fiber = nullptr;
#endif
};

std::mutex g_launch_mutex; /* one launch at a time */
std::vector<Runner *> g_runners;
unsigned g_nrunners;
bool g_reverse; /* EMU_ORDER=reverse: a block's threads run last to first */
bool g_cp_early; /* EMU_CP_ASYNC=early: cp.async copies land as issued */
bool g_serial_warps; /* EMU_WARPS=serial: a block's warps go on one at a time */
unsigned g_jitter_us; /* EMU_JITTER_US=N: each block starts after 0..N-1 us, at random */

const char *op_name(int kind)
{
    switch (kind) {
    case OP_SYNCWARP: return "__syncwarp";
    case OP_SHFL_IDX: return "__shfl_sync";
    case OP_SHFL_UP: return "__shfl_up_sync";
    case OP_SHFL_DOWN: return "__shfl_down_sync";
    case OP_SHFL_XOR: return "__shfl_xor_sync";
    case OP_MMA_M16N8K16: return "mma.sync.aligned.m16n8k16";
    case OP_LDMATRIX_X4: return "ldmatrix.sync.aligned.m8n8.x4";
    case OP_MMA_M16N8K8: return "mma.sync.aligned.m16n8k8";
    case OP_WGMMA_WAIT: return "wgmma.wait_group.sync.aligned";
    }
    return "?";
}

std::string vformat(const char *fmt, va_list ap)
{
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

/* The block-level failure: the block stops, the launch too. */
void block_fail(Runner *r, cudaError_t err, const std::string &msg)
{
    if (r->trapped)
        return;
    r->trapped = true;
    r->trap_err = err;
    r->trap_msg = format("block (%u,%u,%u): ", r->bid.x, r->bid.y, r->bid.z) + msg;
}

Lane *current()
{
    if (!tls_thread) {
        diag("a device function was called outside a kernel");
        abort();
    }
    return reinterpret_cast<Lane *>(tls_thread);
}

/* The running CUDA thread gives the runner its OS thread back; returns
 * when the runner resumes it. */
void yield(Lane *L)
{
    Runner *r = L->runner;
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(r->sched_fiber, __tsan_switch_to_fiber_no_sync);
#endif
    ctx_switch(&L->ctx, &r->sched);
}

void resume(Runner *r, Lane *L)
{
    tls_thread = &L->t;
#ifdef EMU_TSAN
    /* the first switch of the block carries the launch (and the shared
     * memory fill) into the thread; later ones carry nothing */
    __tsan_switch_to_fiber(L->fiber, L->started ? __tsan_switch_to_fiber_no_sync : 0);
#endif
    L->started = true;
    ctx_switch(&r->sched, &L->ctx);
    tls_thread = nullptr;
}

/* Writes a copy's 16 bytes: its source bytes, then zeros. Called in the
 * issuing thread's fiber, which TSan sees make the copy's accesses (here
 * memcpy and memset may be inlined, out of TSan's interceptors' sight). */
void proxy_mark(Lane *L, const unsigned char *dst);

void cp_write(Lane *L, const Lane::Copy &c)
{
    if (c.bytes)
        tsan_read(c.src, c.bytes);
    tsan_write(c.dst, 16);
    if (c.bytes)
        memcpy(c.dst, c.src, c.bytes);
    memset(c.dst + c.bytes, 0, 16 - c.bytes);
    proxy_mark(L, c.dst);
}

/* Lands the lane's queued copies of groups <= upto, in the order issued
 * (those not landed yet), and keeps the rest. */
void cp_land(Lane *L, unsigned upto)
{
    unsigned keep = 0;
    for (unsigned i = 0; i < L->ncp; i++) {
        const Lane::Copy &c = L->cp[i];
        if (c.group <= upto) {
            if (c.dst)
                cp_write(L, c);
        } else {
            L->cp[keep++] = c;
        }
    }
    L->ncp = keep;
}

/* ---- the fences of warpgroup products ------------------------------------- *
 *
 * On a GPU, wgmma.mma_async reads its registers (A, and D) and its
 * shared memory operands asynchronously, so two fences order what other
 * instructions did before it (PTX ISA, "Asynchronous Warpgroup Level
 * Matrix Instructions"); a missing one gives no error there, only, at
 * times, a product of stale values. The emulation completes a product at
 * its wait from what is there then, so it checks both at the issue:
 *
 * - wgmma.fence (kc_wgmma_fence): between another instruction's write
 *   of a product's registers and the product, and before a thread's first
 *   one. The fence keeps a copy of the thread's stack from its own frame
 *   up (where the kernel's arrays of registers live, their addresses
 *   having been given to the emulator); a product whose A or D bytes there
 *   differ from the copy was given registers written since the fence, and
 *   the block stops, saying so. (Completing a product at its wait updates
 *   the copy: the emulator's write is the product's, not another
 *   instruction's. A read since the fence, which the rule covers too, and
 *   registers in a frame the fence did not see are not checked.)
 * - fence.proxy.async (kc_fence_proxy_async): shared memory written by a
 *   thread's generic stores is seen by the tensor cores only after that
 *   thread's fence (then a barrier, for the other threads' products). Each
 *   cp.async marks its 16 bytes with its thread when it lands; the thread's
 *   fence clears its marks; a product (checked in lane 0 of each warp)
 *   whose shared operand has a marked chunk stops the block, naming the
 *   thread and the byte. Plain stores to shared memory are not seen.
 *
 * Copies and compares of a thread's stack here go through raw_copy and
 * raw_same, which no sanitizer's interceptor sees: ASan's memcpy would
 * find the kernels' poisoned redzones there, and TSan would take the
 * runner's updates of a copy for a race with the thread. */
void raw_copy(unsigned char *dst, const unsigned char *src, size_t n)
{
    if (((uintptr_t)dst | (uintptr_t)src | n) % 8 == 0) { /* (a fence's copy: in words) */
        const volatile uint64_t *s = reinterpret_cast<const uint64_t *>(src); /* (volatile: never memcpy) */
        uint64_t *d = reinterpret_cast<uint64_t *>(dst);
        for (size_t i = 0; i < n / 8; i++)
            d[i] = s[i];
        return;
    }
    const volatile unsigned char *s = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = s[i];
}

bool raw_same(const unsigned char *a, const unsigned char *b, size_t n)
{
    const volatile unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return false;
    return true;
}

unsigned lane_index(const Lane *L)
{
    return (unsigned)(L - L->runner->lanes.data());
}

void proxy_mark(Lane *L, const unsigned char *dst)
{
    if (dst < smem || dst >= smem + SMEM_OPTIN)
        return;
    Runner *r = L->runner;
    unsigned ch = (unsigned)((dst - smem) / 16);
    r->proxy[ch] = (uint16_t)(lane_index(L) + 1);
    r->proxy_hi = std::max(r->proxy_hi, ch + 1);
    if (L->npend < PEND)
        L->pend[L->npend++] = (uint16_t)ch;
    else
        L->pend_all = true;
}

/* A product's registers (`what`: "A" or "D", n bytes at p), at its issue:
 * fenced since another instruction last wrote them. */
void regs_fenced(Lane *L, const char *what, const void *p, size_t n)
{
    if (!L->fenced)
        trap(cudaErrorIllegalInstruction,
             "wgmma.mma_async with no wgmma.fence before it in this thread (kc_wgmma_fence: before its first "
             "product, and after other instructions write a product's registers)");
    uintptr_t a = (uintptr_t)p;
    if (a < L->snap_lo || a + n > L->snap_lo + L->snap_len)
        return; /* not in the frames the fence saw */
    if (!raw_same(L->snap + (a - L->snap_lo), static_cast<const unsigned char *>(p), n))
        trap(cudaErrorIllegalInstruction,
             "wgmma.mma_async: its %s registers were written after the last wgmma.fence (kc_wgmma_fence must "
             "come after other instructions write them)",
             what);
}

/* A product's shared operand (`what`), at its issue: no chunk of it
 * written by a cp.async without its thread's fence.proxy.async after it. */
void operand_fenced(Lane *L, const char *what, const WgmmaB &o)
{
    Runner *r = L->runner;
    if (o.b < smem || o.b >= smem + SMEM_OPTIN)
        return; /* (the wait says where it is) */
    size_t base = (size_t)(o.b - smem);
    for (unsigned k = 0; k < 16; k++)
        for (unsigned c = 0; c < o.n; c++) {
            size_t ch = (base + wgmma_offset(o, k, c)) / 16;
            if (ch < r->proxy_hi && r->proxy[ch])
                trap(cudaErrorIllegalInstruction,
                     "wgmma.mma_async reads %s at shared byte %zu, which thread %u's cp.async wrote with no "
                     "fence.proxy.async after it in that thread (kc_fence_proxy_async, then a barrier)",
                     what, 16 * ch, (unsigned)r->proxy[ch] - 1);
        }
}

/* A completed product's D (n bytes at p) into its thread's copy. */
void snap_update(Lane *L, const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    if (L->fenced && a >= L->snap_lo && a + n <= L->snap_lo + L->snap_len)
        raw_copy(L->snap + (a - L->snap_lo), static_cast<const unsigned char *>(p), n);
}

void lane_main(void *arg)
{
    Lane *L = static_cast<Lane *>(arg);
    Runner *r = L->runner;
    r->job->d->entry(r->job->d->state);
    cp_land(L, L->cp_commits + 1); /* what it never waited for lands too */
    if (L->nwg > 0) /* (its accumulators gone with the thread) */
        trap(cudaErrorIllegalInstruction, "exited with %u wgmma products not waited for (wgmma.wait_group)",
             L->nwg);
    L->state = EXITED;
    r->nexited++;
    hb_release(&r->hb_done);
    yield(L);
    abort(); /* an exited thread is never resumed */
}

/* ---- completing warp operations ------------------------------------------ */

/* The shuffles of the threads of mask (all posted, same kind and mask):
 * each thread's source lane as CUDA defines it for its width. */
bool do_shfl(Runner *r, Lane *w0, unsigned warp, unsigned mask, int kind)
{
    for (unsigned m = 0; m < 32; m++) {
        if (!((mask >> m) & 1u))
            continue;
        WarpOp *op = w0[m].op;
        unsigned w = (unsigned)op->width, d = (unsigned)op->arg;
        if (op->width < 1 || op->width > 32 || (w & (w - 1)) != 0) {
            block_fail(r, cudaErrorIllegalInstruction,
                       format("warp %u lane %u: %s with width %d (a power of 2 "
                              "in [1, 32] is required)",
                              warp, m, op_name(kind), op->width));
            return false;
        }
        long src = -1; /* -1: the thread's own value */
        switch (kind) {
        case OP_SHFL_IDX:
            src = (long)((m & ~(w - 1)) | (d & (w - 1)));
            break;
        case OP_SHFL_UP:
            if ((m & (w - 1)) >= d)
                src = (long)m - (long)d;
            break;
        case OP_SHFL_DOWN:
            if ((unsigned long)(m & (w - 1)) + d < w)
                src = (long)m + (long)d;
            break;
        case OP_SHFL_XOR: {
            unsigned s = m ^ d; /* a later group of width gives the own value */
            if (s < 32 && s / w <= m / w)
                src = (long)s;
            break;
        }
        }
        if (src < 0 || (unsigned)src == m) {
            op->result = op->value;
            continue;
        }
        if (!((mask >> src) & 1u)) {
            block_fail(r, cudaErrorIllegalInstruction,
                       format("warp %u lane %u: %s reads lane %ld, which is not in "
                              "the mask 0x%08x (its value is undefined)",
                              warp, m, op_name(kind), src, mask));
            return false;
        }
        const WarpOp *so = w0[src].op;
        if (so->size != op->size) {
            block_fail(r, cudaErrorIllegalInstruction,
                       format("warp %u: %s of a %d-byte value in lane %u, of a "
                              "%d-byte one in lane %ld",
                              warp, op_name(kind), op->size, m, so->size, src));
            return false;
        }
        op->result = so->value;
    }
    return true;
}

const char *elem_name(int e)
{
    return e == ELEM_BF16 ? "__nv_bfloat16" : e == ELEM_F16 ? "__half" : "tf32";
}

/* mma.sync.aligned.m16n8k16.row.col.f32 with bf16 or f16 inputs, or
 * m16n8k8 with tf32 ones, over the warp's registers (emu/ptx.h): lane m,
 * g = m / 4, t = m % 4, holds at k 16
 * A (row, k) (g, 2t..2t+1) in a[0], (g+8, 2t..) in a[1], (g, 2t+8..) in
 * a[2], (g+8, 2t+8..) in a[3]; B (k, n) (2t..2t+1, g) in b[0], (2t+8..,
 * g) in b[1], the lower-indexed element of a pair in a register's low
 * half; at k 8 (tf32, an element a register, its low 13 bits ignored)
 * A (g, t), (g+8, t), (g, t+4), (g+8, t+4) and B (t, g), (t+4, g); C and
 * D (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) in c[0..3] and d[0..3].
 * D = C + A B: exact products, fp32 sums in k order from C. c and d are
 * the same array: all of C is read first. */
bool do_mma(Runner *r, Lane *w0, unsigned warp)
{
    float A[16][16], B[16][8], C[16][8];
    int elem = w0[0].op->elem, K = elem == ELEM_TF32 ? 8 : 16;
    auto half = [elem](uint32_t reg, unsigned hi) {
        uint16_t h = (uint16_t)(hi ? reg >> 16 : reg & 0xffffu);
        return elem == ELEM_BF16 ? emu_bf16_to_f32(h) : emu_f16_to_f32(h);
    };
    auto tf32 = [](uint32_t reg) {
        reg &= ~0x1fffu;
        float v;
        memcpy(&v, &reg, sizeof v);
        return v;
    };
    for (unsigned m = 0; m < 32; m++) {
        const WarpOp *o = w0[m].op;
        if (o->elem != elem) {
            block_fail(r, cudaErrorIllegalInstruction,
                       format("warp %u: %s on %s in lane 0, on %s in lane %u (every lane "
                              "must run the same instruction)",
                              warp, op_name(o->kind), elem_name(elem), elem_name(o->elem), m));
            return false;
        }
        const uint32_t *a = static_cast<const uint32_t *>(o->a);
        const uint32_t *b = static_cast<const uint32_t *>(o->b);
        const float *c = static_cast<const float *>(o->c);
        unsigned g = m / 4, t = m % 4;
        if (K == 8) {
            A[g][t] = tf32(a[0]);
            A[g + 8][t] = tf32(a[1]);
            A[g][t + 4] = tf32(a[2]);
            A[g + 8][t + 4] = tf32(a[3]);
            B[t][g] = tf32(b[0]);
            B[t + 4][g] = tf32(b[1]);
        } else {
            for (unsigned h = 0; h < 2; h++) {
                A[g][2 * t + h] = half(a[0], h);
                A[g + 8][2 * t + h] = half(a[1], h);
                A[g][2 * t + 8 + h] = half(a[2], h);
                A[g + 8][2 * t + 8 + h] = half(a[3], h);
                B[2 * t + h][g] = half(b[0], h);
                B[2 * t + 8 + h][g] = half(b[1], h);
            }
        }
        for (unsigned h = 0; h < 2; h++) {
            C[g][2 * t + h] = c[h];
            C[g + 8][2 * t + h] = c[2 + h];
        }
    }
    float D[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float acc = C[i][j];
            for (int k = 0; k < K; k++)
                acc += A[i][k] * B[k][j]; /* exact products, fp32 sums */
            D[i][j] = acc;
        }
    for (unsigned m = 0; m < 32; m++) {
        float *d = static_cast<float *>(w0[m].op->d);
        unsigned g = m / 4, t = m % 4;
        d[0] = D[g][2 * t];
        d[1] = D[g][2 * t + 1];
        d[2] = D[g + 8][2 * t];
        d[3] = D[g + 8][2 * t + 1];
    }
    return true;
}

/* What is wrong with [p, p + n) as shared memory of the running block,
 * "" if nothing. A block's shared memory is its runner's copy of the
 * program's thread-local block (emu/device.h: __shared__ is thread_local,
 * the dynamic bytes the thread_local array smem), so an address outside
 * it (global memory, a thread's stack: its local memory) is refused, and
 * so are smem's bytes past the launch's dynamic size. The program's other
 * thread_local variables (none a kernel can name but its __shared__ ones)
 * share that block and cannot be told from shared memory. */
std::string shared_problem(Runner *r, const void *p, size_t n)
{
    uintptr_t q = (uintptr_t)p, lo = (uintptr_t)r->tls_lo, hi = (uintptr_t)r->tls_hi;
    uintptr_t s0 = (uintptr_t)smem, s1 = s0 + r->job->d->smem, s2 = s0 + SMEM_OPTIN;
    if (q < lo || q > hi || hi - q < n)
        return format("%p is not in the block's shared memory (a __shared__ variable or the "
                      "launch's dynamic shared memory)",
                      p);
    if (q < s2 && q + n > s0 && !(q >= s0 && q + n <= s1))
        return format("%p is past the launch's %zu bytes of dynamic shared memory "
                      "(smem + %ld)",
                      p, (size_t)(s1 - s0), (long)(q - s0));
    return "";
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (emu/ptx.h): lanes
 * 8i..8i+7 pass rows 0..7 of 8 x 8 matrix i, M_i[row][col] element col of
 * the row lane 8i + row passed; lane m, g = m / 4, t = m % 4, receives
 * r[i] = M_i[g][2t] | M_i[g][2t+1] << 16, or with .trans M_i[2t][g] |
 * M_i[2t+1][g] << 16. Every lane the same .trans; every row non-null,
 * 16-byte aligned, in shared memory. The rows are read here, at
 * completion; each lane's src[] says where its elements came from, for
 * the lane's own read that shows them to ThreadSanitizer (emu/ptx.h). */
bool do_ldmatrix(Runner *r, Lane *w0, unsigned warp)
{
    int trans = w0[0].op->trans;
    const unsigned char *row[32];
    for (unsigned m = 0; m < 32; m++) {
        const WarpOp *o = w0[m].op;
        if (o->trans != trans) {
            block_fail(r, cudaErrorIllegalInstruction,
                       format("warp %u: %s%s in lane 0, %s%s in lane %u (every lane must run "
                              "the same instruction)",
                              warp, op_name(o->kind), trans ? ".trans" : "", op_name(o->kind),
                              o->trans ? ".trans" : "", m));
            return false;
        }
        if (!o->ptr) {
            block_fail(r, cudaErrorIllegalAddress,
                       format("warp %u lane %u: %s of a null row", warp, m, op_name(o->kind)));
            return false;
        }
        if ((uintptr_t)o->ptr % 16 != 0) {
            block_fail(r, cudaErrorMisalignedAddress,
                       format("warp %u lane %u: %s: row %p is not 16-byte aligned", warp, m,
                              op_name(o->kind), o->ptr));
            return false;
        }
        std::string bad = shared_problem(r, o->ptr, 16);
        if (!bad.empty()) {
            block_fail(r, cudaErrorIllegalAddress,
                       format("warp %u lane %u: %s.shared: row ", warp, m, op_name(o->kind)) + bad);
            return false;
        }
        row[m] = static_cast<const unsigned char *>(o->ptr);
    }
    uint32_t out[32][4];
    const unsigned char *src[32][8];
    for (unsigned m = 0; m < 32; m++) {
        unsigned g = m / 4, t = m % 4;
        for (unsigned i = 0; i < 4; i++) {
            const unsigned char *lo, *hi;
            if (trans) { /* M_i[2t][g], M_i[2t+1][g] */
                lo = row[8 * i + 2 * t] + 2 * g;
                hi = row[8 * i + 2 * t + 1] + 2 * g;
            } else { /* M_i[g][2t], M_i[g][2t+1] */
                lo = row[8 * i + g] + 2 * (2 * t);
                hi = row[8 * i + g] + 2 * (2 * t + 1);
            }
            out[m][i] = (uint32_t)*reinterpret_cast<const uint16_t *>(lo) |
                        (uint32_t)*reinterpret_cast<const uint16_t *>(hi) << 16;
            src[m][2 * i] = lo;
            src[m][2 * i + 1] = hi;
        }
    }
    for (unsigned m = 0; m < 32; m++) { /* after every read: r might be anywhere */
        WarpOp *o = w0[m].op;
        uint32_t *d = static_cast<uint32_t *>(o->d);
        for (unsigned i = 0; i < 4; i++)
            d[i] = out[m][i];
        for (unsigned e = 0; e < 8; e++)
            o->src[e] = src[m][e];
    }
    return true;
}

/* Whether a wgmma operand in shared memory (`what`: "A" or "B") is
 * usable: its start and offsets multiples of 16, the offsets below 2^18
 * (the descriptor's encoding), every element in the block's shared
 * memory; else the block fails, naming it. */
bool wgmma_operand_ok(Runner *r, unsigned warp, const char *what, const WgmmaB &o)
{
    if ((uintptr_t)o.b % 16 != 0 || o.lbo % 16 != 0 || o.sbo % 16 != 0 || o.lbo >= (1u << 18) ||
        o.sbo >= (1u << 18)) {
        block_fail(r, cudaErrorMisalignedAddress,
                   format("warp %u: wgmma.mma_async: %s at %p, offsets %u and %u (each a multiple of 16, "
                          "the offsets below 2^18)",
                          warp, what, (const void *)o.b, o.lbo, o.sbo));
        return false;
    }
    size_t end = 0;
    for (unsigned k = 0; k < 16; k++)
        for (unsigned c = 0; c < o.n; c++)
            end = std::max(end, (size_t)wgmma_offset(o, k, c) + 2);
    std::string bad = shared_problem(r, o.b, end);
    if (!bad.empty()) {
        block_fail(r, cudaErrorIllegalAddress, format("warp %u: wgmma.mma_async: %s ", warp, what) + bad);
        return false;
    }
    return true;
}

/* wgmma.wait_group.sync.aligned N over a warp (emu/ptx.h): each lane's
 * queued products of groups up to its commits - N complete, in the order
 * issued. Every lane must have queued the same products and passed the
 * same N; the warp's warpgroup (warps 4 (w / 4) .. + 3) must exist. Warp
 * w's rows of D: A from its lanes' registers (mma.m16n8k16's layout), B
 * [16 x N] from shared memory by the canonical layout (trans: N-major),
 * C from d when acc; fp32 sums in k order, each product exact. */
bool do_wgmma_wait(Runner *r, Lane *w0, unsigned warp)
{
    int n = w0[0].op->arg;
    for (unsigned m = 1; m < 32; m++)
        if (w0[m].op->arg != n || w0[m].nwg != w0[0].nwg || w0[m].wg_commits != w0[0].wg_commits) {
            block_fail(r, cudaErrorIllegalInstruction,
                       format("warp %u: %s %d in lane 0 with %u products queued, %d in lane %u with %u "
                              "(every lane must run the same instructions)",
                              warp, op_name(OP_WGMMA_WAIT), n, w0[0].nwg, w0[m].op->arg, m, w0[m].nwg));
            return false;
        }
    if (n < 0) {
        block_fail(r, cudaErrorIllegalInstruction, format("warp %u: %s %d", warp, op_name(OP_WGMMA_WAIT), n));
        return false;
    }
    unsigned upto = w0[0].wg_commits > (unsigned)n ? w0[0].wg_commits - (unsigned)n : 0;
    if (w0[0].nwg > 0 && r->nthreads < (warp / 4 + 1) * 128) {
        block_fail(r, cudaErrorIllegalInstruction,
                   format("warp %u: wgmma.mma_async in a block of %u threads (its warpgroup, threads %u..%u, "
                          "must all run it)",
                          warp, r->nthreads, warp / 4 * 128, warp / 4 * 128 + 127));
        return false;
    }
    unsigned keep = 0;
    for (unsigned i = 0; i < w0[0].nwg; i++) {
        const Lane::Wg &o = w0[0].wg[i];
        if (o.group > upto) {
            for (unsigned m = 0; m < 32; m++)
                w0[m].wg[keep] = w0[m].wg[i];
            keep++;
            continue;
        }
        for (unsigned m = 1; m < 32; m++) {
            const Lane::Wg &q = w0[m].wg[i];
            if (q.n != o.n || q.b != o.b || q.lbo != o.lbo || q.sbo != o.sbo || q.trans != o.trans ||
                q.elem != o.elem || q.acc != o.acc || q.group != o.group || q.as != o.as || q.albo != o.albo ||
                q.asbo != o.asbo || !q.a != !o.a) {
                block_fail(r, cudaErrorIllegalInstruction,
                           format("warp %u: wgmma.mma_async %u differs between lane 0 and lane %u (every lane "
                                  "must run the same instruction)",
                                  warp, i, m));
                return false;
            }
        }
        WgmmaB bop{o.b, o.n, o.lbo, o.sbo, o.trans}, aop{o.as, 64, o.albo, o.asbo, 0};
        if (!wgmma_operand_ok(r, warp, "B", bop) || (o.as && !wgmma_operand_ok(r, warp, "A", aop)))
            return false;
        auto half = [&o](uint16_t h) { return o.elem == ELEM_BF16 ? emu_bf16_to_f32(h) : emu_f16_to_f32(h); };
        float A[16][16];
        if (o.as) /* the warp's 16 rows of the warpgroup's 64, K-major in shared memory */
            for (unsigned m = 0; m < 16; m++)
                for (unsigned k = 0; k < 16; k++)
                    A[m][k] = half(*reinterpret_cast<const uint16_t *>(o.as + wgmma_offset(aop, k, 16 * (warp % 4) + m)));
        for (unsigned m = 0; m < 32 && !o.as; m++) {
            const uint32_t *a = w0[m].wg[i].a;
            unsigned g = m / 4, t = m % 4;
            for (unsigned h = 0; h < 2; h++) {
                A[g][2 * t + h] = half((uint16_t)(a[0] >> (16 * h)));
                A[g + 8][2 * t + h] = half((uint16_t)(a[1] >> (16 * h)));
                A[g][2 * t + 8 + h] = half((uint16_t)(a[2] >> (16 * h)));
                A[g + 8][2 * t + 8 + h] = half((uint16_t)(a[3] >> (16 * h)));
            }
        }
        std::vector<float> B(16 * o.n), D(16 * o.n);
        for (unsigned k = 0; k < 16; k++)
            for (unsigned c = 0; c < o.n; c++)
                B[k * o.n + c] = half(*reinterpret_cast<const uint16_t *>(o.b + wgmma_offset(bop, k, c)));
        for (unsigned m = 0; m < 32; m++) { /* C: all of it read before any d is written */
            const float *d = w0[m].wg[i].d;
            unsigned g = m / 4, t = m % 4;
            for (unsigned j = 0; j < o.n / 8; j++)
                for (unsigned e = 0; e < 4; e++)
                    D[(g + 8 * (e / 2)) * o.n + 8 * j + 2 * t + e % 2] = o.acc ? d[4 * j + e] : 0.0f;
        }
        for (unsigned row = 0; row < 16; row++)
            for (unsigned c = 0; c < o.n; c++) {
                float acc = D[row * o.n + c];
                for (unsigned k = 0; k < 16; k++)
                    acc += A[row][k] * B[k * o.n + c]; /* exact products, fp32 sums */
                D[row * o.n + c] = acc;
            }
        for (unsigned m = 0; m < 32; m++) {
            float *d = w0[m].wg[i].d;
            unsigned g = m / 4, t = m % 4;
            for (unsigned j = 0; j < o.n / 8; j++)
                for (unsigned e = 0; e < 4; e++)
                    d[4 * j + e] = D[(g + 8 * (e / 2)) * o.n + 8 * j + 2 * t + e % 2];
            snap_update(&w0[m], d, o.n / 2 * sizeof *d);
        }
    }
    for (unsigned m = 0; m < 32; m++)
        w0[m].nwg = keep;
    return true;
}

/* Where each thread of the block waits, for a deadlock's message. */
std::string describe(Runner *r)
{
    std::string s;
    for (unsigned w = 0; w < r->nwarps; w++) {
        unsigned base = w * 32, cnt = std::min(32u, r->nthreads - base);
        s += format("%swarp %u:", w ? "; " : "", w);
        unsigned l = 0;
        while (l < cnt) {
            auto what = [&](unsigned i) {
                const Lane &L = r->lanes[base + i];
                switch (L.state) {
                case AT_WARP:
                    return format("at %s (mask 0x%08x)", op_name(L.op->kind), L.op->mask);
                case AT_BLOCK: return std::string("at __syncthreads()");
                case EXITED: return std::string("exited");
                default: return std::string("running");
                }
            };
            std::string a = what(l);
            unsigned e = l + 1;
            while (e < cnt && what(e) == a)
                e++;
            s += e - l > 1 ? format(" lanes %u-%u %s", l, e - 1, a.c_str())
                           : format(" lane %u %s", l, a.c_str());
            l = e;
            if (l < cnt)
                s += ",";
        }
        if (s.size() > 1500) {
            s += "; ...";
            break;
        }
    }
    return s;
}

/* Completes what can be completed when no thread can run: the warp
 * operations whose threads have all arrived, else a __syncthreads that
 * every thread of the block has reached. False (the block failed) when
 * nothing can. */
bool resolve(Runner *r)
{
    bool progress = false;
    unsigned n = r->nthreads;
    for (unsigned wi = 0; wi < r->nwarps; wi++) {
        /* one warp at a time: the first (last, reversed) that can go on
         * runs alone until it waits at a barrier */
        if (g_serial_warps && progress)
            break;
        unsigned w = g_reverse ? r->nwarps - 1 - wi : wi;
        Lane *w0 = &r->lanes[w * 32];
        unsigned cnt = std::min(32u, n - w * 32);
        for (unsigned l = 0; l < cnt; l++) {
            if (w0[l].state != AT_WARP)
                continue;
            const WarpOp *op = w0[l].op;
            unsigned mask = op->mask;
            bool complete = true;
            for (unsigned m = 0; m < 32 && complete; m++) {
                if (!((mask >> m) & 1u))
                    continue;
                if (m >= cnt) {
                    block_fail(r, cudaErrorIllegalInstruction,
                               format("warp %u lane %u: %s with mask 0x%08x names lane %u, "
                                      "which does not exist (the block has %u threads)",
                                      w, l, op_name(op->kind), mask, m, n));
                    return false;
                }
                const Lane &M = w0[m];
                if (M.state == EXITED) {
                    block_fail(r, cudaErrorIllegalInstruction,
                               format("warp %u lane %u: %s with mask 0x%08x names lane %u, "
                                      "which has exited",
                                      w, l, op_name(op->kind), mask, m));
                    return false;
                }
                complete = M.state == AT_WARP && M.op->kind == op->kind && M.op->mask == mask;
            }
            if (!complete)
                continue;
            int kind = op->kind;
            bool ok = true;
            if (kind >= OP_SHFL_IDX && kind <= OP_SHFL_XOR)
                ok = do_shfl(r, w0, w, mask, kind);
            else if (kind == OP_MMA_M16N8K16 || kind == OP_MMA_M16N8K8)
                ok = do_mma(r, w0, w);
            else if (kind == OP_LDMATRIX_X4)
                ok = do_ldmatrix(r, w0, w);
            else if (kind == OP_WGMMA_WAIT)
                ok = do_wgmma_wait(r, w0, w);
            if (!ok)
                return false;
            for (unsigned m = 0; m < 32; m++)
                if ((mask >> m) & 1u)
                    w0[m].state = READY;
            progress = true;
        }
    }
    if (progress)
        return true;
    unsigned at_block = 0;
    for (unsigned i = 0; i < n; i++)
        at_block += r->lanes[i].state == AT_BLOCK;
    if (at_block > 0 && at_block + r->nexited == n) {
        if (r->nexited > 0) {
            block_fail(r, cudaErrorIllegalInstruction,
                       format("__syncthreads() reached by %u threads while %u threads of "
                              "the block have exited (every thread of the block must "
                              "reach it)",
                              at_block, r->nexited));
            return false;
        }
        for (unsigned i = 0; i < n; i++)
            r->lanes[i].state = READY;
        return true;
    }
    block_fail(r, cudaErrorLaunchFailure,
               "deadlock: no thread can continue (" + describe(r) + ")");
    return false;
}

/* ---- running blocks ------------------------------------------------------- */

int tls_range(struct dl_phdr_info *info, size_t, void *data)
{
    Runner *r = static_cast<Runner *>(data);
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS) {
            r->tls_lo = static_cast<unsigned char *>(info->dlpi_tls_data);
            r->tls_hi = r->tls_lo + info->dlpi_phdr[i].p_memsz;
        }
    return 1; /* the program is the first object: stop there */
}

/* This OS thread's shared memory to 0xff: the program's thread-local
 * block, and of the dynamic shared memory the launch's bytes and any an
 * earlier block of this runner had (so that past the launch's bytes,
 * where a GPU has no memory for the block, a read finds 0xff too, not an
 * earlier launch's numbers). Under AddressSanitizer the bytes past the
 * launch's are poisoned while the block runs (end_shared lifts it): an
 * access there is reported where it is made, as compute-sanitizer's
 * memcheck would on a GPU. */
void fill_shared(Runner *r, size_t dyn)
{
    unsigned char *s0 = smem, *s2 = smem + SMEM_OPTIN;
    memset(r->tls_lo, 0xff, (size_t)(s0 - r->tls_lo));
    memset(s0, 0xff, std::max(dyn, r->smem_dirty));
    memset(s2, 0xff, (size_t)(r->tls_hi - s2));
    r->smem_dirty = dyn;
#ifdef EMU_ASAN
    __asan_poison_memory_region(s0 + dyn, SMEM_OPTIN - dyn);
#endif
}

void end_shared()
{
#ifdef EMU_ASAN
    __asan_unpoison_memory_region(smem, SMEM_OPTIN);
#endif
}

void ensure_lanes(Runner *r, unsigned n)
{
    static_assert(std::is_standard_layout<Lane>::value, "Lane starts with its Thread");
    if (r->lanes.empty())
        r->lanes.resize(MAX_THREADS);
    size_t page = 4096;
    for (unsigned i = r->nlanes; i < n; i++) {
        Lane &L = r->lanes[i];
        void *p = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED) {
            diag("cannot map a stack for a CUDA thread");
            abort();
        }
        mprotect(p, page, PROT_NONE); /* a guard page below the stack */
        L.stack = static_cast<char *>(p) + page;
        L.runner = r;
#ifdef EMU_TSAN
        L.fiber = __tsan_create_fiber(0);
        __tsan_set_fiber_name(L.fiber, "emu CUDA thread");
#endif
    }
    r->nlanes = std::max(r->nlanes, n);
}

void run_block(Runner *r, Job *j, unsigned long long b)
{
    const LaunchDesc &d = *j->d;
    unsigned bx = d.block.x, by = d.block.y, n = d.block.x * d.block.y * d.block.z;
    unsigned long long gx = d.grid.x, gy = d.grid.y;
    r->bid = uint3{(unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / (gx * gy))};
    fill_shared(r, d.smem);
    memset(r->proxy, 0, r->proxy_hi * sizeof r->proxy[0]);
    r->proxy_hi = 0;
    ensure_lanes(r, n);
    for (unsigned i = 0; i < n; i++) {
        Lane &L = r->lanes[i];
        L.t.tid = uint3{i % bx, i / bx % by, i / (bx * by)};
        L.t.bid = r->bid;
        L.t.bdim = d.block;
        L.t.gdim = d.grid;
        L.t.lane = i & 31;
        L.warp = i >> 5;
        L.state = READY;
        L.started = false;
        L.op = nullptr;
        L.bcount = 0;
        memset(L.wcount, 0, sizeof L.wcount);
        L.ncp = 0;
        L.cp_commits = 0;
        L.nwg = 0;
        L.wg_commits = 0;
        L.fenced = false;
        L.npend = 0;
        L.pend_all = false;
        ctx_make(&L.ctx, L.stack, STACK_BYTES, lane_main, &L);
    }
    r->nthreads = n;
    r->nwarps = (n + 31) / 32;
    r->nexited = 0;
    r->trapped = false;
    while (!r->trapped) {
        for (unsigned k = 0; k < n && !r->trapped; k++) {
            unsigned i = g_reverse ? n - 1 - k : k;
            if (r->lanes[i].state == READY)
                resume(r, &r->lanes[i]);
        }
        if (r->trapped || r->nexited == n || !resolve(r))
            break;
    }
    end_shared();
    hb_acquire(&r->hb_done); /* the block's threads -> its runner -> the host */
    if (r->trapped) {
        hb_acquire(&r->hb_trap);
        std::lock_guard<std::mutex> lk(j->m);
        if (!j->trapped) {
            j->trapped = true;
            j->err = r->trap_err;
            j->msg = r->trap_msg;
        }
        j->abort.store(true, std::memory_order_relaxed);
    }
}

/* A runner's next pseudo-random number (xorshift), seeded from the clock:
 * EMU_JITTER_US's delays differ from run to run. */
static unsigned jitter(Runner *r)
{
    if (!r->rng)
        r->rng = (unsigned)std::chrono::steady_clock::now().time_since_epoch().count() | 1u;
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 17;
    r->rng ^= r->rng << 5;
    return r->rng;
}

void runner_main(Runner *r)
{
    dl_iterate_phdr(tls_range, r);
    if (!r->tls_lo || !(r->tls_lo <= smem && smem + SMEM_OPTIN <= r->tls_hi) ||
        !(r->tls_lo <= (unsigned char *)&tls_thread &&
          (unsigned char *)(&tls_thread + 1) <= r->tls_hi)) {
        diag("the emulator's thread-local storage is not in the program's own "
             "(link tests/gpu/emu into the executable)");
        abort();
    }
#ifdef EMU_TSAN
    r->sched_fiber = __tsan_get_current_fiber();
#endif
    for (;;) {
        Job *j;
        {
            std::unique_lock<std::mutex> lk(r->m);
            r->cv.wait(lk, [r] { return r->next != nullptr; });
            j = r->next;
            r->next = nullptr;
        }
        r->job = j;
        for (unsigned long long b = r->id; b < j->nblocks; b += j->stride) {
            if (j->abort.load(std::memory_order_relaxed))
                break;
            if (g_jitter_us) /* the runners' blocks in a new interleaving each run */
                std::this_thread::sleep_for(std::chrono::microseconds(jitter(r) % g_jitter_us));
            run_block(r, j, b);
        }
        r->job = nullptr;
        std::lock_guard<std::mutex> lk(j->m);
        if (--j->pending == 0)
            j->cv.notify_one();
    }
}

void start_runners()
{
    if (!g_runners.empty())
        return;
#ifdef EMU_TSAN
    g_nrunners = 2; /* ThreadSanitizer's cost grows with the fibers */
#else
    g_nrunners = 4;
#endif
    if (const char *e = getenv("EMU_ORDER"))
        g_reverse = strcmp(e, "reverse") == 0;
    if (const char *e = getenv("EMU_WARPS"))
        g_serial_warps = strcmp(e, "serial") == 0;
    if (const char *e = getenv("EMU_CP_ASYNC"))
        g_cp_early = strcmp(e, "early") == 0;
    if (const char *e = getenv("EMU_JITTER_US")) {
        int v = atoi(e);
        g_jitter_us = v > 0 && v <= 100000 ? (unsigned)v : 0;
    }
    if (const char *e = getenv("EMU_RUNNERS")) {
        int v = atoi(e);
        if (v >= 1 && v <= 16)
            g_nrunners = (unsigned)v;
    }
    for (unsigned i = 0; i < g_nrunners; i++) {
        Runner *r = new Runner;
        r->id = i;
        g_runners.push_back(r);
        r->th = std::thread(runner_main, r);
        r->th.detach();
    }
}

cudaError_t check_config(const LaunchDesc &d)
{
    const dim3 &g = d.grid, &b = d.block;
    if (!g.x || !g.y || !g.z || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
        return cudaErrorInvalidConfiguration;
    if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 ||
        (unsigned long long)b.x * b.y * b.z > MAX_THREADS)
        return cudaErrorInvalidConfiguration;
    size_t limit = std::max((size_t)SMEM_DEFAULT, func_max_dynamic_smem(d.func));
    if (d.smem > limit)
        return cudaErrorInvalidValue;
    if (!stream_ok(d.stream))
        return cudaErrorInvalidResourceHandle;
    return cudaSuccess;
}

} /* namespace */

/* ---- the interface (emu/device.h) ------------------------------------------ */

namespace {
/* Runs a checked launch's blocks (in its stream's order); true unless
 * they faulted: then their threads never ended, and what they point at
 * (the arguments) must stay. A device stopped at an earlier fault runs
 * nothing. */
std::string g_last_failure; /* last_failure()'s, under g_launch_mutex */

bool run_launch(const LaunchDesc &d, int device, bool doomed)
{
    std::lock_guard<std::mutex> lk(g_launch_mutex);
    if (sticky_error(device) != cudaSuccess)
        return true; /* the device stopped at an earlier fault: nothing ran */
    if (doomed) { /* EMU_FAIL=launch:N (fault.cpp) */
        set_sticky(cudaErrorIllegalAddress, device);
        diag("kernel %s (%s:%d) faulted on device %d (EMU_FAIL) [cudaErrorIllegalAddress]", d.name, d.file, d.line,
             device);
        return true;
    }
    start_runners();
    Job j;
    j.d = &d;
    j.nblocks = (unsigned long long)d.grid.x * d.grid.y * d.grid.z;
    j.stride = (unsigned)std::min<unsigned long long>(g_nrunners, j.nblocks);
    j.pending = j.stride;
    for (unsigned i = 0; i < j.stride; i++) {
        Runner *r = g_runners[i];
        {
            std::lock_guard<std::mutex> rl(r->m);
            r->next = &j;
        }
        r->cv.notify_one();
    }
    {
        std::unique_lock<std::mutex> jl(j.m);
        j.cv.wait(jl, [&j] { return j.pending == 0; });
    }
    if (j.trapped) {
        g_last_failure = j.msg;
        set_sticky(j.err, device);
        diag("kernel %s (%s:%d) failed: %s [%s]", d.name, d.file, d.line, j.msg.c_str(),
             cudaGetErrorName(j.err));
    }
    return !j.trapped;
}
} /* namespace */

const char *last_failure()
{
    std::lock_guard<std::mutex> lk(g_launch_mutex);
    return g_last_failure.c_str();
}

void launch(const LaunchDesc &d, void (*drop)(const void *state))
{
    if (stream_ok(d.stream)) {
        int sd = stream_device(d.stream);
        if (sd != current_device()) { /* CUDA launches into the current device's streams only */
            diag("kernel %s (%s:%d) launched on device %d into a stream of device %d", d.name, d.file, d.line,
                 current_device(), sd);
            record(cudaErrorInvalidResourceHandle);
            drop(d.state);
            return;
        }
    }
    cudaError_t e = sticky_error() != cudaSuccess ? sticky_error() : check_config(d);
    if (e != cudaSuccess) {
        record(e);
        drop(d.state);
        return;
    }
    int device = current_device();
    bool doomed = fault_here(FAULT_LAUNCH, d.name);
    stream_run(d.stream, [d, drop, device, doomed] {
        if (run_launch(d, device, doomed))
            drop(d.state);
    });
}

void warp_op(WarpOp *op)
{
    Lane *L = current();
    if (!((op->mask >> L->t.lane) & 1u))
        trap(cudaErrorIllegalInstruction,
             "%s with mask 0x%08x, which does not name the calling thread (lane %u)",
             op_name(op->kind), op->mask, L->t.lane);
    Runner *r = L->runner;
    unsigned leader = 0, par = 0;
    if (op->kind == OP_SYNCWARP) {
        leader = (unsigned)__builtin_ctz(op->mask);
        par = L->wcount[leader] & 1;
        hb_release(&r->hb_warp[L->warp][leader][par]);
    }
    L->op = op;
    L->state = AT_WARP;
    yield(L);
    if (op->kind == OP_SYNCWARP) {
        hb_acquire(&r->hb_warp[L->warp][leader][par]);
        L->wcount[leader]++;
    }
}

/* cp.async (emu/ptx.h) */
void cp_async16(void *dst, const void *src, unsigned n)
{
    Lane *L = current();
    if (n > 16)
        trap(cudaErrorIllegalInstruction, "cp.async of %u source bytes into 16", n);
    if ((uintptr_t)dst % 16 != 0)
        trap(cudaErrorMisalignedAddress,
             "cp.async: shared destination %p is not 16-byte aligned", dst);
    std::string bad = shared_problem(L->runner, dst, 16);
    if (!bad.empty())
        trap(cudaErrorIllegalAddress, "cp.async: destination %s", bad.c_str());
    if (n > 0 && (!src || (uintptr_t)src % 16 != 0))
        trap(cudaErrorMisalignedAddress,
             "cp.async: global source %p is not 16-byte aligned", src);
    if (L->ncp == CP_MAX)
        trap(cudaErrorLaunchFailure,
             "more than %d cp.async copies queued in one thread (wait for some)",
             (int)CP_MAX);
    Lane::Copy c = {static_cast<unsigned char *>(dst), static_cast<const unsigned char *>(src),
                    n, L->cp_commits + 1};
    if (g_cp_early) { /* lands now, but stays queued (counted) until its wait */
        cp_write(L, c);
        c.dst = nullptr;
    }
    L->cp[L->ncp++] = c;
}

void cp_async_commit()
{
    current()->cp_commits++;
}

void cp_async_wait(int n)
{
    Lane *L = current();
    if (n < 0)
        trap(cudaErrorIllegalInstruction, "cp.async.wait_group %d", n);
    if (L->cp_commits > (unsigned)n)
        cp_land(L, L->cp_commits - (unsigned)n);
}

/* wgmma (emu/ptx.h) */
void wgmma_rs(float *d, int n, const uint32_t *a, const void *b, unsigned lbo, unsigned sbo, int trans,
              bool bf16, bool acc)
{
    Lane *L = current();
    if (n < 8 || n > 256 || n % 8 != 0)
        trap(cudaErrorIllegalInstruction, "wgmma.mma_async.m64n%dk16", n);
    if (L->nwg == WG_MAX)
        trap(cudaErrorLaunchFailure, "more than %d wgmma products queued in one thread (wait for some)",
             (int)WG_MAX);
    regs_fenced(L, "D", d, (size_t)n / 2 * sizeof *d);
    regs_fenced(L, "A", a, 4 * sizeof *a);
    if (L->t.lane == 0)
        operand_fenced(L, "B", WgmmaB{static_cast<const unsigned char *>(b), (unsigned)n, lbo, sbo, trans});
    L->wg[L->nwg++] = Lane::Wg{d, a, nullptr, 0, 0, static_cast<const unsigned char *>(b), (unsigned)n, lbo, sbo,
                               L->wg_commits + 1, trans, bf16 ? ELEM_BF16 : ELEM_F16, acc};
}

void wgmma_ss(float *d, int n, const void *a, unsigned albo, unsigned asbo, const void *b, unsigned lbo,
              unsigned sbo, int trans, bool bf16, bool acc)
{
    Lane *L = current();
    if (n != 64)
        trap(cudaErrorIllegalInstruction, "wgmma.mma_async.m64n%dk16 with A in shared memory (the kernels' "
             "wrapper takes n 64)", n);
    if (L->nwg == WG_MAX)
        trap(cudaErrorLaunchFailure, "more than %d wgmma products queued in one thread (wait for some)",
             (int)WG_MAX);
    regs_fenced(L, "D", d, (size_t)n / 2 * sizeof *d);
    if (L->t.lane == 0) {
        operand_fenced(L, "A", WgmmaB{static_cast<const unsigned char *>(a), 64, albo, asbo, 0});
        operand_fenced(L, "B", WgmmaB{static_cast<const unsigned char *>(b), (unsigned)n, lbo, sbo, trans});
    }
    L->wg[L->nwg++] = Lane::Wg{d, nullptr, static_cast<const unsigned char *>(a), albo, asbo,
                               static_cast<const unsigned char *>(b), (unsigned)n, lbo, sbo,
                               L->wg_commits + 1, trans, bf16 ? ELEM_BF16 : ELEM_F16, acc};
}

void wgmma_fence()
{
    Lane *L = current();
    unsigned char here = 0;
    uintptr_t lo = (uintptr_t)&here & ~(uintptr_t)63, hi = (uintptr_t)(L->stack + STACK_BYTES);
    size_t len = hi - lo;
    if (len > L->snap_cap) {
        free(L->snap);
        L->snap = static_cast<unsigned char *>(malloc(len));
        if (!L->snap) {
            diag("out of host memory for wgmma.fence's copy of a thread's registers");
            abort();
        }
        L->snap_cap = len;
    }
    raw_copy(L->snap, reinterpret_cast<const unsigned char *>(lo), len);
    L->snap_lo = lo;
    L->snap_len = len;
    L->fenced = true;
}

void fence_proxy_async()
{
    Lane *L = current();
    Runner *r = L->runner;
    uint16_t me = (uint16_t)(lane_index(L) + 1);
    for (unsigned i = 0; i < L->npend; i++)
        if (r->proxy[L->pend[i]] == me)
            r->proxy[L->pend[i]] = 0;
    if (L->pend_all)
        for (unsigned ch = 0; ch < r->proxy_hi; ch++)
            if (r->proxy[ch] == me)
                r->proxy[ch] = 0;
    L->npend = 0;
    L->pend_all = false;
}

void wgmma_commit()
{
    current()->wg_commits++;
}

int wgmma_due(int n, WgmmaB *out, int max)
{
    Lane *L = current();
    unsigned upto = L->wg_commits > (unsigned)(n < 0 ? 0 : n) ? L->wg_commits - (unsigned)n : 0;
    int k = 0;
    for (unsigned i = 0; i < L->nwg && k < max; i++)
        if (L->wg[i].group <= upto) {
            out[k++] = WgmmaB{L->wg[i].b, L->wg[i].n, L->wg[i].lbo, L->wg[i].sbo, L->wg[i].trans};
            if (L->wg[i].as && k < max)
                out[k++] = WgmmaB{L->wg[i].as, 64, L->wg[i].albo, L->wg[i].asbo, 0};
        }
    return k;
}

void syncthreads()
{
    Lane *L = current();
    Runner *r = L->runner;
    unsigned par = L->bcount & 1;
    hb_release(&r->hb_block[par]);
    L->state = AT_BLOCK;
    yield(L);
    hb_acquire(&r->hb_block[par]);
    L->bcount++;
}

void trap(cudaError_t err, const char *fmt, ...)
{
    Lane *L = current();
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vformat(fmt, ap);
    va_end(ap);
    block_fail(L->runner, err,
               format("thread (%u,%u,%u): ", L->t.tid.x, L->t.tid.y, L->t.tid.z) + msg);
    hb_release(&L->runner->hb_trap);
    L->state = TRAPPED;
    yield(L);
    abort(); /* a stopped thread is never resumed */
}

} /* namespace emu */
