/* fault.cpp (CPU emulation, tests/gpu/emu): failures injected on purpose
 * (EMU_FAIL), so that the runtime's error paths run as they would on a
 * GPU that fails: faults.sh sweeps them over a training run.
 *
 * EMU_FAIL=KIND:N makes the N-th call (from 1, counted over the process)
 * of one kind fail as a GPU's or NCCL's would:
 *   malloc  cudaMalloc, cudaMallocAsync, cudaMallocHost: out of memory
 *           (cudaErrorMemoryAllocation), nothing else harmed;
 *   create  cudaStreamCreateWithFlags, cudaEventCreateWithFlags (out of
 *           memory), ncclCommInitRankConfig and ncclCommSplit
 *           (ncclSystemError; the world's other ranks wait for this one);
 *   launch  a kernel launch: the kernel faults when its stream reaches it
 *           (it runs nothing; its device's sticky cudaErrorIllegalAddress,
 *           seen by every later call on that device, as after a real
 *           fault);
 *   matmul  cublasLtMatmul: CUBLAS_STATUS_EXECUTION_FAILED, nothing run;
 *   nccl    an NCCL collective, send or receive: its communicator fails
 *           (ncclSystemError, as after a network failure) and the
 *           operation never ends, so neither do its peers' nor the work
 *           queued behind it on its stream, until the communicator is
 *           aborted or destroyed.
 * EMU_FAIL=KIND:N+ fails the N-th call and every later one of its kind:
 * for malloc, a device that stays full (the runtime tries an allocation
 * again after freeing what it can, which a single failure would let pass).
 * Each injected failure is said on stderr ("emu: EMU_FAIL=KIND:N: ...").
 * EMU_FAIL=count fails nothing and says at exit how many calls of each
 * kind the process made ("emu: EMU_FAIL counts: malloc A create B ...").
 */
#include <atomic>  /* std::atomic */
#include <cstdio>  /* fprintf */
#include <cstdlib> /* getenv, strtoull */
#include <cstring> /* strncmp, strlen */

#include "internal.h"

namespace emu {

namespace {

const char *const kind_name[FAULT_KINDS] = {"malloc", "create", "launch", "matmul", "nccl"};

struct Plan {
    bool count = false;        /* EMU_FAIL=count */
    int kind = -1;             /* the kind to fail, -1 for none */
    unsigned long long at = 0; /* its call to fail */
    bool on = false;           /* and every later one (KIND:N+) */
};

std::atomic<unsigned long long> g_calls[FAULT_KINDS];

const Plan &plan()
{
    static const Plan p = [] {
        Plan q;
        const char *e = getenv("EMU_FAIL");
        if (!e || !*e)
            return q;
        if (strcmp(e, "count") == 0) {
            q.count = true;
            return q;
        }
        for (int k = 0; k < FAULT_KINDS; k++) {
            size_t n = strlen(kind_name[k]);
            if (strncmp(e, kind_name[k], n) != 0 || e[n] != ':')
                continue;
            char *end = nullptr;
            unsigned long long at = strtoull(e + n + 1, &end, 10);
            bool on = end != e + n + 1 && *end == '+';
            if (end != e + n + 1 && !end[on] && at > 0) {
                q.kind = k;
                q.at = at;
                q.on = on;
                return q;
            }
        }
        fprintf(stderr, "emu: EMU_FAIL=%s: not KIND:N or KIND:N+ (KIND malloc, create, launch, matmul or nccl; "
                        "N from 1) nor count\n", e);
        abort(); /* a test's mistake: it would test nothing */
    }();
    return p;
}

struct CountReport {
    ~CountReport()
    {
        if (!plan().count)
            return;
        fprintf(stderr, "emu: EMU_FAIL counts:");
        for (int k = 0; k < FAULT_KINDS; k++)
            fprintf(stderr, " %s %llu", kind_name[k], g_calls[k].load());
        fprintf(stderr, "\n");
    }
} g_count_report;

} /* namespace */

bool fault_here(FaultKind k, const char *what)
{
    const Plan &p = plan();
    unsigned long long n = ++g_calls[k];
    if (p.kind != (int)k || n < p.at || (n > p.at && !p.on))
        return false;
    diag("EMU_FAIL=%s:%llu: %s fails on device %d", kind_name[k], n, what, current_device());
    return true;
}

} /* namespace emu */
