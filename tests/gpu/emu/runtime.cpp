/* runtime.cpp (CPU emulation, tests/gpu/emu): the CUDA runtime API calls
 * kernels/cuda and tests/gpu/gpu_tests.c make, on one emulated H200.
 *
 * Device memory is host memory, each allocation exactly its size
 * (posix_memalign, 256-byte aligned as cudaMalloc's: AddressSanitizer
 * would see an overrun), recorded so that copies and sets check that the
 * device side lies inside one live allocation. Streams run behind the
 * host, as a GPU's do: kernels, copies, sets, cuBLASLt products and sorts
 * are queued on their stream and run by worker threads in each stream's
 * order (EMU_ASYNC=0: by the caller, once the stream's earlier work is
 * done), beside the emulated NCCL's work (nccl.cpp); events,
 * cudaStreamWaitEvent and the legacy stream's implicit waits order the
 * streams as CUDA's do, and nothing else does. MESH_EMU_GPUS GPUs
 * (default 1) share the memory, as on one machine with peer access, each
 * with its own legacy stream. Errors are CUDA's: a per-thread last error
 * (cudaGetLastError returns and clears it) and a sticky one after a kernel
 * fault (every later call returns it).
 */
#include <cuda_runtime.h>

#include <atomic>  /* std::atomic */
#include <chrono>  /* std::chrono::microseconds: EMU_LAG_US */
#include <condition_variable> /* std::condition_variable: waits for a stream */
#include <cstdarg> /* va_list */
#include <cstdio>  /* fprintf */
#include <cstdlib> /* posix_memalign, free */
#include <cstring> /* memcpy, memmove, memset */
#include <deque>   /* std::deque: a stream's queue */
#include <map>     /* std::map */
#include <memory>  /* std::shared_ptr */
#include <mutex>   /* std::mutex */
#include <set>     /* std::set */
#include <thread>  /* std::thread: the device's workers */
#include <vector>  /* std::vector */

#include <cub/device/device_radix_sort.cuh>

#include "internal.h"

namespace emu {

namespace {

std::atomic<int> g_sticky[8]; /* each device's (cudaSuccess is 0) */
thread_local cudaError_t t_last = cudaSuccess;

std::mutex g_mem_mutex;
std::map<uintptr_t, size_t> g_allocs; /* base -> bytes */
std::map<uintptr_t, int> g_alloc_dev; /* base -> its device */
std::map<uintptr_t, size_t> g_host;   /* cudaMallocHost's: base -> bytes */
size_t g_dev_bytes[8]; /* allocated on each device */

/* Each device's memory: EMU_GPU_MEM_MB MiB (default an H200's 143771). */
size_t device_memory()
{
    static const size_t bytes = [] {
        const char *e = getenv("EMU_GPU_MEM_MB");
        char *end = nullptr;
        unsigned long long mb = e ? strtoull(e, &end, 10) : 0;
        if (!e || end == e || *end || mb == 0)
            mb = 143771;
        return (size_t)mb << 20;
    }();
    return bytes;
}

std::mutex g_handle_mutex; /* the streams and events made and not destroyed */
std::set<const void *> g_streams, g_events;
std::map<const void *, int> g_handle_device; /* a stream's or event's device */

std::mutex g_func_mutex;
std::map<const void *, size_t> g_func_smem;

struct CUmemPoolHandle_st_ {
    int device;
} g_pool;

/* Whether one allocation of `in` (base -> bytes) holds [p, p + bytes);
 * its base in *base if so. */
bool find_range(const std::map<uintptr_t, size_t> &in, uintptr_t p, size_t bytes, uintptr_t *base = nullptr)
{
    auto it = in.upper_bound(p);
    if (it == in.begin())
        return false;
    --it;
    if (base)
        *base = it->first;
    return p >= it->first && bytes <= it->second && p - it->first <= it->second - bytes;
}

struct LeakReport {
    ~LeakReport()
    {
        size_t bytes = 0;
        for (size_t b : g_dev_bytes)
            bytes += b;
        bool faulted = false;
        for (auto &e : g_sticky)
            faulted |= e.load() != cudaSuccess;
        if (!g_allocs.empty() && !faulted)
            fprintf(stderr, "emu: %zu device allocations (%zu bytes) never freed\n", g_allocs.size(), bytes);
    }
} g_leak_report;

} /* namespace */

cudaError_t sticky_error(int device)
{
    return (cudaError_t)g_sticky[device < 0 ? current_device() : device].load();
}

void set_sticky(cudaError_t e, int device)
{
    int none = cudaSuccess;
    g_sticky[device < 0 ? current_device() : device].compare_exchange_strong(none, (int)e);
}

cudaError_t record(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

cudaError_t api_enter()
{
    return record(sticky_error());
}

size_t func_max_dynamic_smem(const void *func)
{
    std::lock_guard<std::mutex> lk(g_func_mutex);
    auto it = g_func_smem.find(func);
    return it == g_func_smem.end() ? 0 : it->second;
}

bool stream_ok(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return true;
    std::lock_guard<std::mutex> lk(g_handle_mutex);
    return g_streams.count(s) != 0;
}

int stream_device(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return current_device(); /* the current device's legacy stream */
    std::lock_guard<std::mutex> lk(g_handle_mutex);
    auto it = g_handle_device.find(s);
    return it == g_handle_device.end() ? -1 : it->second;
}

static bool event_ok(cudaEvent_t e)
{
    std::lock_guard<std::mutex> lk(g_handle_mutex);
    return g_events.count(e) != 0;
}

bool device_range(const void *p, size_t bytes)
{
    return device_of(p, bytes) >= 0;
}

int device_of(const void *p, size_t bytes)
{
    std::lock_guard<std::mutex> lk(g_mem_mutex);
    uintptr_t base = 0;
    return find_range(g_allocs, (uintptr_t)p, bytes, &base) ? g_alloc_dev[base] : -1;
}

int foreign_device(const void *p)
{
    int d = p ? device_of(p, 1) : -1;
    return d >= 0 && d != current_device() ? d : -1;
}

void foreign_fault(const LaunchDesc &d, int index, const void *p, int device)
{
    diag("kernel %s (%s:%d) launched on device %d: its argument %d (%p) is memory of device %d, which the "
         "kernel cannot reach (no peer access): it faults",
         d.name, d.file, d.line, current_device(), index, p, device);
    set_sticky(cudaErrorIllegalAddress);
}

void diag(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "emu: %s\n", buf);
}

} /* namespace emu */

using namespace emu;

#define API_ENTER()                                                            \
    do {                                                                       \
        cudaError_t api_e_ = api_enter();                                      \
        if (api_e_ != cudaSuccess)                                             \
            return api_e_;                                                     \
    } while (0)

/* ---- device ---------------------------------------------------------------- */

namespace {
thread_local int t_device = 0;
}

int emu::current_device()
{
    return t_device;
}

int emu::device_count()
{
    static const int n = [] {
        const char *e = getenv("MESH_EMU_GPUS");
        int v = e ? atoi(e) : 1;
        return v < 1 ? 1 : v > 8 ? 8 : v;
    }();
    return n;
}

extern "C" cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return record(cudaErrorInvalidValue);
    *count = device_count();
    return cudaSuccess;
}

/* The thread's current device is the thread's own: choosing or reading it
 * answers no device's sticky error (a fault on device 0 stops neither a
 * new thread, whose current device is 0 until it chooses, from choosing
 * device 1, nor its calls there); cudaSetDevice answers the chosen
 * device's, as its later calls would. */
extern "C" cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return record(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= device_count())
        return record(cudaErrorInvalidDevice);
    t_device = device;
    return record(sticky_error(device));
}

extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    API_ENTER();
    if (!prop)
        return record(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count())
        return record(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "NVIDIA H200 (CPU emulation, tests/gpu/emu)");
    prop->totalGlobalMem = device_memory();
    prop->sharedMemPerBlock = SMEM_DEFAULT;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = MAX_THREADS;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 65536;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->l2CacheSize = 50 << 20;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->sharedMemPerMultiprocessor = 228 * 1024;
    prop->sharedMemPerBlockOptin = SMEM_OPTIN;
    prop->memoryBusWidth = 6144;
    return cudaSuccess;
}

/* ---- streams and events ------------------------------------------------------ */

/* Every stream is a queue of items (internal.h: Async); each device has a
 * legacy stream of its own. An event records how many items its stream had
 * been given; it is complete once that many are done. Items of
 * stream_run (kernels, copies, sets, products, sorts) are run by worker
 * threads, or by their caller (EMU_ASYNC=0); waits between streams are
 * items that end when what they wait for is done. */
namespace {
struct StreamQ {
    std::deque<Async *> items;
    unsigned long long given = 0, done = 0;
    cudaStream_t key = nullptr;
    int device = 0;
    bool legacy = false;
    bool blocking = true; /* not cudaStreamNonBlocking: ordered with the legacy stream */
    bool pumping = false;
};

struct EventRec {
    std::shared_ptr<StreamQ> q; /* none: never recorded */
    unsigned long long ticket = 0;
    /* a timed event's: the host clock's seconds when its stream reached
     * the record (< 0 until then), written by its Stamp */
    std::shared_ptr<double> at;
};

std::mutex g_async;
std::condition_variable g_async_cv;
std::map<cudaStream_t, std::shared_ptr<StreamQ>> g_queues; /* under g_async */
std::map<cudaEvent_t, EventRec> g_event_recs;              /* under g_async */
std::set<cudaEvent_t> g_timed;                             /* under g_async: events with timing */

char g_legacy_tag[8]; /* device d's legacy stream is &g_legacy_tag[d] in g_queues */

bool async_mode()
{
    static const bool on = [] {
        const char *e = getenv("EMU_ASYNC");
        return !e || strcmp(e, "0") != 0;
    }();
    return on;
}

/* The legacy stream's three names are the calling thread's device's one. */
cudaStream_t canon(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return reinterpret_cast<cudaStream_t>(&g_legacy_tag[current_device()]);
    return s;
}

std::shared_ptr<StreamQ> &queue_of(cudaStream_t s)
{
    cudaStream_t k = canon(s);
    auto &q = g_queues[k];
    if (!q) {
        const char *p = reinterpret_cast<const char *>(k);
        q = std::make_shared<StreamQ>();
        q->key = k;
        q->legacy = p >= g_legacy_tag && p < g_legacy_tag + sizeof g_legacy_tag;
        q->device = q->legacy ? (int)(p - g_legacy_tag) : current_device();
    }
    return q;
}

/* Starts the queue's first items while they finish as they start. */
void pump(StreamQ &q)
{
    if (q.pumping)
        return;
    q.pumping = true;
    while (!q.items.empty() && !q.items.front()->started) {
        Async *h = q.items.front();
        h->started = true;
        h->start(); /* may finish (and delete) h at once */
    }
    q.pumping = false;
}

void push(StreamQ &q, Async *a)
{
    a->key = q.key;
    q.items.push_back(a);
    q.given++;
    pump(q);
}

bool idle(cudaStream_t s)
{
    auto it = g_queues.find(canon(s));
    return it == g_queues.end() || it->second->items.empty();
}

bool device_idle(int device)
{
    for (auto &kv : g_queues)
        if (kv.second->device == device && !kv.second->items.empty())
            return false;
    return true;
}

bool event_done(const EventRec &r)
{
    return !r.q || r.q->done >= r.ticket;
}

/* Not under g_async: waits until the event is complete. */
void event_wait(cudaEvent_t e)
{
    std::unique_lock<std::mutex> lk(g_async);
    g_async_cv.wait(lk, [e] {
        auto it = g_event_recs.find(e);
        return it == g_event_recs.end() || event_done(it->second);
    });
}

/* A wait between streams: done once each queue has done its ticket's
 * items. */
struct Wait : Async {
    std::vector<EventRec> on;
    bool met() const
    {
        for (const EventRec &r : on)
            if (!event_done(r))
                return false;
        return true;
    }
    void start() override;
};
std::vector<Wait *> g_waiting; /* started, not yet met */

void Wait::start()
{
    if (met())
        async_done(this);
    else
        g_waiting.push_back(this);
}

/* The waits some item's end may have met. */
void wake_waits()
{
    for (size_t i = 0; i < g_waiting.size();) {
        Wait *w = g_waiting[i];
        if (!w->met()) {
            i++;
            continue;
        }
        g_waiting.erase(g_waiting.begin() + (long)i);
        async_done(w); /* may change g_waiting: look again from the start */
        i = 0;
    }
}

/* A timed event's record: an item of its stream that notes the time
 * when the items before it are done. */
struct Stamp : Async {
    std::shared_ptr<double> at;
    void start() override
    {
        *at = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        async_done(this);
    }
};

/* Work of stream_run: run by a worker (queued on g_ready) or by its caller
 * (sync: told by `ready`). */
struct Work : Async {
    std::function<void()> fn;
    int device = 0;
    bool sync = false, ready = false;
    void start() override;
};
std::deque<Work *> g_ready;
/* never destroyed: the workers wait on it to the end (glibc's destructor
 * would wait for them at exit) */
std::condition_variable &g_work_cv = *new std::condition_variable;

void Work::start()
{
    if (sync) {
        ready = true;
        g_async_cv.notify_all();
    } else {
        g_ready.push_back(this);
        g_work_cv.notify_one();
    }
}

/* Under g_async: the process exits (workers_exit), and the workers running
 * work (a faulted GPU's, say, that nobody waited for) */
bool g_exiting;
int g_busy;

void worker_main(unsigned lag_us)
{
    std::unique_lock<std::mutex> lk(g_async);
    for (;;) {
        g_work_cv.wait(lk, [] { return !g_ready.empty() || g_exiting; });
        if (g_exiting)
            break;
        Work *w = g_ready.front();
        g_ready.pop_front();
        std::function<void()> fn = std::move(w->fn);
        g_busy++;
        lk.unlock();
        if (lag_us)
            std::this_thread::sleep_for(std::chrono::microseconds(lag_us));
        t_device = w->device;
        fn();
        fn = nullptr; /* its captures (a kernel's arguments) go before it is done */
        lk.lock();
        g_busy--;
        if (g_exiting) {
            g_async_cv.notify_all();
            break;
        }
        async_done(w);
    }
    /* the process exits: touch none of the objects its exit destroys */
    for (;;)
        g_work_cv.wait(lk);
}

/* At exit, before this file's objects are destroyed (registered after
 * them): the workers stop, those in the middle of work once it is done
 * (given up after 1 s), so that none finishes work into a destroyed
 * queue (a crash at exit after a GPU faulted with work in flight). */
void workers_exit()
{
    std::unique_lock<std::mutex> lk(g_async);
    g_exiting = true;
    g_work_cv.notify_all();
    g_async_cv.wait_for(lk, std::chrono::seconds(1), [] { return g_busy == 0; });
}

/* Under g_async: the worker threads (EMU_WORKERS, default 4), once. */
void start_workers()
{
    static bool started;
    if (started)
        return;
    started = true;
    const char *e = getenv("EMU_WORKERS");
    const char *l = getenv("EMU_LAG_US");
    int n = e ? atoi(e) : 4;
    long lag = l ? atol(l) : 0;
    n = n < 1 ? 1 : n > 16 ? 16 : n;
    lag = lag < 0 ? 0 : lag > 100000 ? 100000 : lag;
    atexit(workers_exit);
    for (int i = 0; i < n; i++)
        std::thread(worker_main, (unsigned)lag).detach();
}
} /* namespace */

std::mutex &emu::async_mutex()
{
    return g_async;
}

namespace {
/* after_us's timer: what is due when, run by one thread (never destroyed:
 * the thread waits on it to the end) */
struct Timer {
    std::mutex mu;
    std::condition_variable cv;
    std::multimap<std::chrono::steady_clock::time_point, std::function<void()>> due;
    bool started = false;
};
Timer &g_timer = *new Timer;

void timer_main()
{
    std::unique_lock<std::mutex> lk(g_timer.mu);
    for (;;) {
        if (g_timer.due.empty()) {
            g_timer.cv.wait(lk);
            continue;
        }
        auto first = g_timer.due.begin();
        if (std::chrono::steady_clock::now() < first->first) {
            g_timer.cv.wait_until(lk, first->first);
            continue;
        }
        std::function<void()> fn = std::move(first->second);
        g_timer.due.erase(first);
        lk.unlock(); /* (after_us may be called under g_async: never hold both) */
        {
            std::lock_guard<std::mutex> alk(g_async);
            fn();
        }
        lk.lock();
    }
}
} /* namespace */

void emu::after_us(long us, std::function<void()> fn)
{
    std::lock_guard<std::mutex> lk(g_timer.mu);
    if (!g_timer.started) {
        g_timer.started = true;
        std::thread(timer_main).detach();
    }
    g_timer.due.emplace(std::chrono::steady_clock::now() + std::chrono::microseconds(us), std::move(fn));
    g_timer.cv.notify_one();
}

void emu::async_enqueue(cudaStream_t s, Async *a)
{
    std::shared_ptr<StreamQ> q = queue_of(s);
    Wait *w = new Wait;
    if (q->legacy) { /* after every blocking stream's earlier work */
        for (auto &kv : g_queues) {
            StreamQ &o = *kv.second;
            if (!o.legacy && o.blocking && o.device == q->device && o.done < o.given)
                w->on.push_back(EventRec{kv.second, o.given, nullptr});
        }
    } else if (q->blocking) { /* after the legacy stream's */
        std::shared_ptr<StreamQ> l = queue_of(reinterpret_cast<cudaStream_t>(&g_legacy_tag[q->device]));
        if (l->done < l->given)
            w->on.push_back(EventRec{l, l->given, nullptr});
    }
    if (w->on.empty())
        delete w;
    else
        push(*q, w);
    push(*q, a);
}

void emu::async_done(Async *a)
{
    auto it = g_queues.find(a->key);
    if (it == g_queues.end() || it->second->items.empty() || it->second->items.front() != a) {
        diag("internal: an asynchronous operation finished out of its stream's order");
        abort();
    }
    std::shared_ptr<StreamQ> q = it->second;
    q->items.pop_front();
    q->done++;
    delete a;
    pump(*q);
    wake_waits();
    g_async_cv.notify_all();
}

void emu::stream_run(cudaStream_t s, std::function<void()> fn)
{
    Work *w = new Work;
    w->fn = std::move(fn);
    w->device = current_device();
    w->sync = !async_mode();
    std::unique_lock<std::mutex> lk(g_async);
    if (!w->sync)
        start_workers();
    async_enqueue(s, w);
    if (!w->sync)
        return;
    g_async_cv.wait(lk, [w] { return w->ready; });
    lk.unlock();
    w->fn();
    w->fn = nullptr;
    lk.lock();
    async_done(w);
}

void emu::stream_wait_idle(cudaStream_t s)
{
    std::unique_lock<std::mutex> lk(g_async);
    g_async_cv.wait(lk, [s] { return idle(s); });
}

/* Not under g_async: waits until no stream of the calling thread's device
 * holds work (cudaDeviceSynchronize, cudaFree). */
static void device_wait_idle()
{
    int d = current_device();
    std::unique_lock<std::mutex> lk(g_async);
    g_async_cv.wait(lk, [d] { return device_idle(d); });
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
    API_ENTER();
    device_wait_idle();
    return api_enter(); /* a fault of the work it waited for */
}

namespace {
/* A new handle (a byte of its own: each a distinct pointer), recorded in set. */
template <class H> H make_handle(std::set<const void *> &set)
{
    H h = reinterpret_cast<H>(new char);
    std::lock_guard<std::mutex> lk(g_handle_mutex);
    set.insert(h);
    g_handle_device[h] = current_device();
    return h;
}

bool drop_handle(std::set<const void *> &set, const void *h)
{
    std::lock_guard<std::mutex> lk(g_handle_mutex);
    if (!set.erase(h))
        return false;
    g_handle_device.erase(h);
    delete reinterpret_cast<const char *>(h);
    return true;
}
} /* namespace */

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    API_ENTER();
    if (!stream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return record(cudaErrorInvalidValue);
    if (fault_here(FAULT_CREATE, "cudaStreamCreateWithFlags"))
        return record(cudaErrorMemoryAllocation);
    *stream = make_handle<cudaStream_t>(g_streams);
    std::lock_guard<std::mutex> lk(g_async);
    queue_of(*stream)->blocking = !(flags & cudaStreamNonBlocking);
    return cudaSuccess;
}

/* CUDA lets a stream go with work queued (its resources are released once
 * the work is done); here the call waits for that work. */
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    API_ENTER();
    if (!stream || !stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    stream_wait_idle(stream);
    {
        std::lock_guard<std::mutex> lk(g_async);
        g_queues.erase(stream);
    }
    return drop_handle(g_streams, stream) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    API_ENTER();
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    stream_wait_idle(stream);
    return api_enter();
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    API_ENTER();
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lk(g_async);
    return idle(stream) ? api_enter() : cudaErrorNotReady; /* (not an error: not recorded) */
}

/* The stream's later work waits for the event (a wait in its queue). */
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    API_ENTER();
    if (!stream_ok(stream) || !event_ok(event))
        return record(cudaErrorInvalidResourceHandle);
    if (flags != 0)
        return record(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_async);
    auto it = g_event_recs.find(event);
    if (it == g_event_recs.end() || event_done(it->second))
        return cudaSuccess;
    Wait *w = new Wait;
    w->on.push_back(it->second);
    async_enqueue(stream, w);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    API_ENTER();
    if (!event || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming)))
        return record(cudaErrorInvalidValue);
    if (fault_here(FAULT_CREATE, "cudaEventCreateWithFlags"))
        return record(cudaErrorMemoryAllocation);
    *event = make_handle<cudaEvent_t>(g_events);
    if (!(flags & cudaEventDisableTiming)) {
        std::lock_guard<std::mutex> lk(g_async);
        g_timed.insert(*event);
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    API_ENTER();
    if (!event || !drop_handle(g_events, event))
        return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lk(g_async);
    g_event_recs.erase(event);
    g_timed.erase(event);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    API_ENTER();
    if (!event_ok(event) || !stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    int ed = stream_device(reinterpret_cast<cudaStream_t>(event)), sd = stream_device(stream);
    if (ed != sd) { /* CUDA: "event and stream must be on the same device" */
        diag("cudaEventRecord: an event of device %d on a stream of device %d", ed, sd);
        return record(cudaErrorInvalidResourceHandle);
    }
    std::lock_guard<std::mutex> lk(g_async);
    EventRec &r = g_event_recs[event];
    r.q = queue_of(stream);
    r.at = nullptr;
    if (g_timed.count(event)) { /* a new clock (a stamp of an earlier record may be pending) */
        Stamp *st = new Stamp;
        st->at = r.at = std::make_shared<double>(-1.0);
        push(*r.q, st); /* (may run at once) */
    }
    r.ticket = r.q->given;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t event)
{
    API_ENTER();
    if (!event_ok(event))
        return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lk(g_async);
    auto it = g_event_recs.find(event);
    return it == g_event_recs.end() || event_done(it->second) ? cudaSuccess : cudaErrorNotReady;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    API_ENTER();
    if (!event_ok(event))
        return record(cudaErrorInvalidResourceHandle);
    event_wait(event);
    return api_enter(); /* a fault of the work it waited for */
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    API_ENTER();
    if (!ms)
        return record(cudaErrorInvalidValue);
    if (!event_ok(start) || !event_ok(end))
        return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> lk(g_async);
    auto a = g_event_recs.find(start), b = g_event_recs.find(end);
    /* CUDA: an event without timing, or never recorded, is an invalid handle here (no clock) */
    if (a == g_event_recs.end() || b == g_event_recs.end() || !a->second.at || !b->second.at)
        return record(cudaErrorInvalidResourceHandle);
    if (!event_done(a->second) || !event_done(b->second))
        return cudaErrorNotReady; /* (not an error: not recorded) */
    *ms = (float)(1e3 * (*b->second.at - *a->second.at));
    return cudaSuccess;
}

/* ---- errors ---------------------------------------------------------------- */

extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t s = sticky_error();
    if (s != cudaSuccess)
        return s;
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void)
{
    cudaError_t s = sticky_error();
    return s != cudaSuccess ? s : t_last;
}

namespace {
struct ErrorText {
    cudaError_t e;
    const char *name, *text;
};
const ErrorText g_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout",
     "the launch timed out and was terminated"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction",
     "an illegal instruction was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace",
     "operation not supported on global/shared address space"},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid program counter"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};
const ErrorText *error_text(cudaError_t e)
{
    for (const ErrorText &t : g_errors)
        if (t.e == e)
            return &t;
    return nullptr;
}
} /* namespace */

extern "C" const char *cudaGetErrorString(cudaError_t error)
{
    const ErrorText *t = error_text(error);
    return t ? t->text : "unrecognized error code";
}

extern "C" const char *cudaGetErrorName(cudaError_t error)
{
    const ErrorText *t = error_text(error);
    return t ? t->name : "cudaErrorUnknown";
}

/* ---- memory ---------------------------------------------------------------- */

extern "C" cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    API_ENTER();
    if (!devPtr)
        return record(cudaErrorInvalidValue);
    *devPtr = nullptr;
    if (size == 0)
        return cudaSuccess; /* CUDA: a null pointer, no error */
    if (fault_here(FAULT_MALLOC, "cudaMalloc"))
        return record(cudaErrorMemoryAllocation);
    int dev = current_device();
    {
        std::lock_guard<std::mutex> lk(g_mem_mutex);
        if (size > device_memory() - g_dev_bytes[dev])
            return record(cudaErrorMemoryAllocation);
        g_dev_bytes[dev] += size; /* (held while the host allocates) */
    }
    void *p = nullptr;
    if (posix_memalign(&p, 256, size) != 0) {
        std::lock_guard<std::mutex> lk(g_mem_mutex);
        g_dev_bytes[dev] -= size;
        return record(cudaErrorMemoryAllocation);
    }
    memset(p, 0xff, size); /* cudaMalloc's memory is not zeroed */
    std::lock_guard<std::mutex> lk(g_mem_mutex);
    g_allocs[(uintptr_t)p] = size;
    g_alloc_dev[(uintptr_t)p] = dev;
    *devPtr = p;
    return cudaSuccess;
}

namespace {
/* Whether p is a live device allocation; taken out of the record if take. */
bool live_allocation(void *p, bool take, const char *who)
{
    std::lock_guard<std::mutex> lk(g_mem_mutex);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) {
        diag("%s(%p): not a live device allocation", who, p);
        return false;
    }
    if (take) {
        g_dev_bytes[g_alloc_dev[(uintptr_t)p]] -= it->second;
        g_alloc_dev.erase((uintptr_t)p);
        g_allocs.erase(it);
    }
    return true;
}
} /* namespace */

/* As CUDA's, it waits for the device first (work still queued may use the
 * memory). */
extern "C" cudaError_t cudaFree(void *devPtr)
{
    API_ENTER();
    if (!devPtr)
        return cudaSuccess;
    if (!live_allocation(devPtr, false, "cudaFree"))
        return record(cudaErrorInvalidValue);
    device_wait_idle();
    if (!live_allocation(devPtr, true, "cudaFree"))
        return record(cudaErrorInvalidValue);
    free(devPtr);
    return cudaSuccess;
}

/* Page-locked host memory: malloc's, recorded so that
 * cudaPointerGetAttributes calls it host memory CUDA knows. */
extern "C" cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    API_ENTER();
    if (!ptr)
        return record(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (size == 0)
        return cudaSuccess;
    void *p = fault_here(FAULT_MALLOC, "cudaMallocHost") ? nullptr : malloc(size);
    if (!p)
        return record(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(g_mem_mutex);
    g_host[(uintptr_t)p] = size;
    *ptr = p;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFreeHost(void *ptr)
{
    API_ENTER();
    if (!ptr)
        return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mem_mutex);
        if (!g_host.erase((uintptr_t)ptr)) {
            diag("cudaFreeHost(%p): not from cudaMallocHost", ptr);
            return record(cudaErrorInvalidValue);
        }
    }
    device_wait_idle(); /* as CUDA's: a queued copy may use it */
    free(ptr);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    API_ENTER();
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    if (size == 0) /* unlike cudaMalloc, stream-ordered allocation refuses 0 */
        return record(cudaErrorInvalidValue);
    return cudaMalloc(devPtr, size);
}

extern "C" cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    API_ENTER();
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    if (!devPtr) /* CUDA refuses a null pointer here */
        return record(cudaErrorInvalidValue);
    if (!live_allocation(devPtr, false, "cudaFreeAsync"))
        return record(cudaErrorInvalidValue);
    stream_run(stream, [devPtr] { /* in the stream's order */
        if (live_allocation(devPtr, true, "cudaFreeAsync"))
            free(devPtr);
    });
    return cudaSuccess;
}

namespace {
/* The device sides of a copy of count bytes: inside live allocations. */
cudaError_t copy_check(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                       const char *what, bool &dst_dev, bool &src_dev)
{
    switch (kind) {
    case cudaMemcpyHostToHost: dst_dev = src_dev = false; break;
    case cudaMemcpyHostToDevice: dst_dev = true, src_dev = false; break;
    case cudaMemcpyDeviceToHost: dst_dev = false, src_dev = true; break;
    case cudaMemcpyDeviceToDevice: dst_dev = src_dev = true; break;
    case cudaMemcpyDefault:
        dst_dev = device_range(dst, 1);
        src_dev = device_range(src, 1);
        break;
    default: return record(cudaErrorInvalidMemcpyDirection);
    }
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return record(cudaErrorInvalidValue);
    if (dst_dev && !device_range(dst, count)) {
        diag("%s: destination [%p, +%zu) is not inside a device allocation", what, dst, count);
        return record(cudaErrorInvalidValue);
    }
    if (src_dev && !device_range(src, count)) {
        diag("%s: source [%p, +%zu) is not inside a device allocation", what, src, count);
        return record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
} /* namespace */

/* Whether [p, p + bytes) is page-locked host memory (cudaMallocHost). */
static bool pinned(const void *p, size_t bytes)
{
    std::lock_guard<std::mutex> lk(g_mem_mutex);
    return find_range(g_host, (uintptr_t)p, bytes);
}

/* Synchronous: on the legacy stream, after its earlier work (and the
 * blocking streams'), done when the call returns. */
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                                  enum cudaMemcpyKind kind)
{
    API_ENTER();
    bool dd, sd;
    cudaError_t e = copy_check(dst, src, count, kind, "cudaMemcpy", dd, sd);
    if (e != cudaSuccess || count == 0)
        return e;
    stream_run(nullptr, [dst, src, count] { memmove(dst, src, count); });
    stream_wait_idle(nullptr);
    return api_enter();
}

/* In the stream's order (CUDA's "API synchronization behavior"): a copy
 * from pageable host memory takes the source when called (staged), one
 * between host buffers is done when the call returns, every other one
 * (from or to page-locked memory, to pageable memory, between device
 * buffers) happens when the stream gets to it: the host must not read its
 * destination or reuse a page-locked source before synchronising. */
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                       enum cudaMemcpyKind kind, cudaStream_t stream)
{
    API_ENTER();
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    bool dd, sd;
    cudaError_t e = copy_check(dst, src, count, kind, "cudaMemcpyAsync", dd, sd);
    if (e != cudaSuccess || count == 0)
        return e;
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d < s + count && s < d + count) { /* CUDA: "may not overlap" */
        diag("cudaMemcpyAsync(%p, %p, %zu): the memory areas overlap", dst, src, count);
        return record(cudaErrorInvalidValue);
    }
    if (!sd && !dd) {
        stream_run(stream, [dst, src, count] { memcpy(dst, src, count); });
        stream_wait_idle(stream);
    } else if (!sd && !pinned(src, count)) {
        auto *staged = new std::vector<unsigned char>((const unsigned char *)src,
                                                      (const unsigned char *)src + count);
        stream_run(stream, [dst, staged] { /* run once: the copy frees its stage */
            memcpy(dst, staged->data(), staged->size());
            delete staged;
        });
    } else {
        stream_run(stream, [dst, src, count] { memcpy(dst, src, count); });
    }
    return cudaSuccess;
}

/* Asynchronous for device memory (CUDA's "API synchronization
 * behavior"), on the legacy stream. */
extern "C" cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    API_ENTER();
    if (count == 0)
        return cudaSuccess;
    if (!device_range(devPtr, count)) {
        diag("cudaMemset: [%p, +%zu) is not inside a device allocation", devPtr, count);
        return record(cudaErrorInvalidValue);
    }
    stream_run(nullptr, [devPtr, value, count] { memset(devPtr, value, count); });
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
                                       cudaStream_t stream)
{
    API_ENTER();
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    if (count == 0)
        return cudaSuccess;
    if (!device_range(devPtr, count)) {
        diag("cudaMemsetAsync: [%p, +%zu) is not inside a device allocation", devPtr, count);
        return record(cudaErrorInvalidValue);
    }
    stream_run(stream, [devPtr, value, count] { memset(devPtr, value, count); });
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    API_ENTER();
    if (!free_bytes || !total)
        return record(cudaErrorInvalidValue);
    *total = device_memory(); /* cudaGetDeviceProperties' totalGlobalMem */
    std::lock_guard<std::mutex> lk(g_mem_mutex);
    *free_bytes = *total - g_dev_bytes[current_device()];
    return cudaSuccess;
}

/* Device memory for a pointer inside a live allocation; any other is host
 * memory CUDA does not know (cudaMemoryTypeUnregistered, and no error, as
 * from CUDA 11 on). */
extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    API_ENTER();
    if (!attributes)
        return record(cudaErrorInvalidValue);
    memset(attributes, 0, sizeof *attributes);
    bool pinned = false;
    {
        std::lock_guard<std::mutex> lk(g_mem_mutex);
        pinned = find_range(g_host, (uintptr_t)ptr, 1);
    }
    int device = ptr ? device_of(ptr, 1) : -1; /* the device it was allocated on */
    if (device >= 0) {
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = device;
        attributes->devicePointer = const_cast<void *>(ptr);
    } else if (ptr && pinned) {
        attributes->type = cudaMemoryTypeHost;
        attributes->hostPointer = const_cast<void *>(ptr);
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
    }
    return cudaSuccess;
}

/* ---- the default memory pool ------------------------------------------------ */

extern "C" cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    API_ENTER();
    if (!memPool)
        return record(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count())
        return record(cudaErrorInvalidDevice);
    *memPool = reinterpret_cast<cudaMemPool_t>(&g_pool);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                               void *value)
{
    API_ENTER();
    if (memPool != reinterpret_cast<cudaMemPool_t>(&g_pool) || !value)
        return record(cudaErrorInvalidValue);
    switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
    case cudaMemPoolAttrReleaseThreshold:
        return cudaSuccess; /* the pool is malloc's: nothing to tune */
    }
    return record(cudaErrorInvalidValue);
}

extern "C" cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t)
{
    API_ENTER();
    if (memPool != reinterpret_cast<cudaMemPool_t>(&g_pool))
        return record(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* ---- kernels ----------------------------------------------------------------- */

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
                                            int value)
{
    API_ENTER();
    if (!func)
        return record(cudaErrorInvalidDeviceFunction);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || (size_t)value > SMEM_OPTIN)
            return record(cudaErrorInvalidValue);
        {
            std::lock_guard<std::mutex> lk(g_func_mutex);
            g_func_smem[func] = (size_t)value;
        }
        return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        return value >= -1 && value <= 100 ? cudaSuccess : record(cudaErrorInvalidValue);
    }
    return record(cudaErrorInvalidValue);
}

/* ---- cub (include/cub/device/device_radix_sort.cuh) ------------------------- */

cudaError_t emu::cub_enter(cudaStream_t stream)
{
    API_ENTER();
    if (!stream_ok(stream))
        return record(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

bool emu::cub_device(const void *p, size_t bytes, const char *what)
{
    if (device_range(p, bytes))
        return true;
    diag("cub::DeviceRadixSort::SortPairs: %s [%p, +%zu) is not device memory: the "
         "kernel faults",
         what, p, bytes);
    set_sticky(cudaErrorIllegalAddress);
    return false;
}

bool emu::cub_disjoint(const void *a, size_t an, const void *b, size_t bn, const char *what)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    if (x < y + bn && y < x + an) {
        diag("cub::DeviceRadixSort::SortPairs: %s overlap (CUB requires them apart)", what);
        return false;
    }
    return true;
}
