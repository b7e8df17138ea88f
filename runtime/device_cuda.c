/* device_cuda.c — the CUDA device (device.h), and the GPU probe.
 *
 * Built for real with make CUDA=1 (MESH_CUDA=1): buffers from cudaMalloc,
 * copies and memsets enqueued on a stream (cudaMemcpyAsync,
 * cudaMemsetAsync), non-blocking CUDA streams, events without timing.
 * Each call first makes the handle's device the thread's current one
 * (cudaSetDevice, when it is not already), so ranks as threads of one
 * process may each hold their own GPU. Every CUDA error becomes a status
 * and a message naming the device and the call: "cuda:0 (NVIDIA H200):
 * cudaMemcpyAsync: invalid argument (cudaErrorInvalidValue)";
 * cudaErrorMemoryAllocation is MESH_ERR_NOMEM, a missing driver or device
 * MESH_ERR_UNSUPPORTED, anything else MESH_ERR_INTERNAL.
 *
 * The probe (dev_cuda_probe) never crashes without a driver: it asks
 * dlopen for libcuda.so.1 (0.2 ms when there is none) before the CUDA
 * runtime, whose cudaGetDeviceCount says the rest (docs/runtime.md,
 * "Devices"). With CUDA=0 the probe and dev_open say "this libmesh was
 * built without CUDA (make CUDA=1)".
 */
#include "device.h"

#include <stdio.h> /* snprintf */

#define NO_CUDA "this libmesh was built without CUDA (make CUDA=1)"

/* Clears out and says nothing; the probe's outputs may be NULL. */
static void clear(char *s, size_t n)
{
    if (s && n) s[0] = '\0';
}

#if MESH_CUDA

#include <cuda_runtime.h> /* cudaMalloc, cudaMemcpyAsync, cudaStream_t, cudaEvent_t */
#include "kcuda.h"        /* kcuda_fault_hint */
#include <dlfcn.h>        /* dlopen: the driver probe */
#include <pthread.h>      /* pthread_once: the driver probed once */
#include <string.h>       /* memset */

/* Whether the driver loads, asked once a process (ranks as threads probe
 * together: their dlopen and dlclose would each take the loader's lock for
 * nothing): "" if it does, else why not. */
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static char driver_why[256];

static void driver_probe(void)
{
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
        const char *e = dlerror();
        snprintf(driver_why, sizeof driver_why, "no CUDA driver (%s)", e ? e : "libcuda.so.1 not found");
        return;
    }
    dlclose(driver);
}

int dev_cuda_probe(char *why, size_t n, char *name, size_t name_n)
{
    int count = 0;
    char none[1];
    clear(name, name_n);
    if (!why || n == 0) why = none, n = sizeof none;
    why[0] = '\0';
    /* the cheapest probe: without the driver, cudart would say the same,
     * more slowly */
    pthread_once(&driver_once, driver_probe);
    if (driver_why[0]) {
        snprintf(why, n, "%s", driver_why);
        return 0;
    }
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) { /* 35: no driver, 34: the stub as the driver, 100: no device */
        (void)cudaGetLastError();
        snprintf(why, n, "cudaGetDeviceCount: %s (%s, %d)", cudaGetErrorString(rc), cudaGetErrorName(rc), (int)rc);
        return 0;
    }
    if (count <= 0) {
        snprintf(why, n, "no CUDA device (cudaGetDeviceCount found none)");
        return 0;
    }
    if (name && name_n) {
        struct cudaDeviceProp prop;
        rc = cudaGetDeviceProperties(&prop, 0);
        if (rc == cudaSuccess) {
            snprintf(name, name_n, "%s", prop.name);
        } else {
            (void)cudaGetLastError();
            snprintf(name, name_n, "GPU 0");
        }
    }
    return 1;
}

int dev_cuda_count(void)
{
    int count = 0;
    if (!dev_cuda_probe(NULL, 0, NULL, 0)) return 0;
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : ((void)cudaGetLastError(), 0);
}

/* The status and message of a failed CUDA call; the error is cleared
 * (a sticky one stays: the device is then unusable, as CUDA says). */
static mesh_status cuda_fail(dev *d, const char *call, cudaError_t rc)
{
    (void)cudaGetLastError();
    mesh_status st = rc == cudaErrorMemoryAllocation ? MESH_ERR_NOMEM
                   : rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver || rc == cudaErrorStubLibrary ||
                             rc == cudaErrorInvalidDevice
                       ? MESH_ERR_UNSUPPORTED
                       : MESH_ERR_INTERNAL;
    return dev_fail(d, st, "%s: %s (%s)%s", call, cudaGetErrorString(rc), cudaGetErrorName(rc),
                    kcuda_fault_hint((int)rc));
}

/* Returns the status of a failed CUDA call, named `name`. */
#define CUDA_CHECK(d, name, expr)                                           \
    do {                                                                    \
        cudaError_t cuda_rc_ = (expr);                                      \
        if (cuda_rc_ != cudaSuccess) return cuda_fail(d, name, cuda_rc_); \
    } while (0)

/* Makes d's device this thread's current one. */
static mesh_status use(dev *d)
{
    int cur = -1;
    cudaError_t rc = cudaGetDevice(&cur);
    if (rc == cudaSuccess && cur == d->index) return MESH_OK;
    if (rc != cudaSuccess) (void)cudaGetLastError();
    CUDA_CHECK(d, "cudaSetDevice", cudaSetDevice(d->index));
    return MESH_OK;
}

/* Returns the status of use(d) when it fails. */
#define USE(d)                                      \
    do {                                            \
        mesh_status use_st_ = use(d);               \
        if (use_st_ != MESH_OK) return use_st_;     \
    } while (0)

static cudaStream_t stream_of(dev_stream *s) { return (cudaStream_t)s; }
static cudaEvent_t event_of(dev_event *e) { return (cudaEvent_t)e; }

static mesh_status cuda_open(dev *d)
{
    char why[320], gpu[256];
    int count = 0;
    snprintf(d->name, sizeof d->name, "cuda:%d", d->index);
    if (!dev_cuda_probe(why, sizeof why, gpu, sizeof gpu)) return dev_fail(d, MESH_ERR_UNSUPPORTED, "no GPU (%s)", why);
    CUDA_CHECK(d, "cudaGetDeviceCount", cudaGetDeviceCount(&count));
    if (d->index >= count)
        return dev_fail(d, MESH_ERR_UNSUPPORTED, "no such device: this process sees %d GPU%s (CUDA_VISIBLE_DEVICES)",
                        count, count == 1 ? "" : "s");
    CUDA_CHECK(d, "cudaSetDevice", cudaSetDevice(d->index));
    struct cudaDeviceProp prop;
    CUDA_CHECK(d, "cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, d->index));
    snprintf(d->name, sizeof d->name, "cuda:%d (%.100s)", d->index, prop.name);
    return MESH_OK;
}

static mesh_status cuda_alloc(dev *d, void **p, size_t bytes)
{
    USE(d);
    cudaError_t rc = cudaMalloc(p, bytes);
    if (rc == cudaErrorMemoryAllocation) {
        /* the stream-ordered pool (kcuda_alloc) keeps what was freed into
         * it: give back what no queued work still uses, then try again */
        cudaMemPool_t pool;
        (void)cudaGetLastError();
        if (cudaDeviceGetDefaultMemPool(&pool, d->index) == cudaSuccess && cudaMemPoolTrimTo(pool, 0) == cudaSuccess)
            rc = cudaMalloc(p, bytes);
    }
    if (rc == cudaSuccess) return MESH_OK;
    *p = NULL;
    if (rc != cudaErrorMemoryAllocation) return cuda_fail(d, "cudaMalloc", rc);
    (void)cudaGetLastError(); /* not sticky: device.c says how full the device is */
    return MESH_ERR_NOMEM;
}

/* cudaFree waits for the device; an error it reports is an earlier
 * call's, which that call (or the next) reports. */
static void cuda_free(dev *d, void *p)
{
    if (use(d) != MESH_OK) return;
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

static mesh_status cuda_copy(dev *d, void *dst, const void *src, size_t bytes, dev_copy_kind kind, dev_stream *s)
{
    static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                cudaMemcpyDeviceToDevice};
    USE(d);
    CUDA_CHECK(d, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, bytes, kinds[kind], stream_of(s)));
    return MESH_OK;
}

static mesh_status cuda_host_alloc(dev *d, void **p, size_t bytes)
{
    USE(d);
    CUDA_CHECK(d, "cudaMallocHost", cudaMallocHost(p, bytes));
    return MESH_OK;
}

static void cuda_host_free(dev *d, void *p)
{
    if (use(d) == MESH_OK && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

static mesh_status cuda_memset(dev *d, void *p, int byte, size_t bytes, dev_stream *s)
{
    USE(d);
    CUDA_CHECK(d, "cudaMemsetAsync", cudaMemsetAsync(p, byte, bytes, stream_of(s)));
    return MESH_OK;
}

static mesh_status cuda_stream_create(dev *d, dev_stream **s)
{
    cudaStream_t cs = NULL;
    USE(d);
    CUDA_CHECK(d, "cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    *s = (dev_stream *)cs;
    return MESH_OK;
}

static void cuda_stream_destroy(dev *d, dev_stream *s)
{
    if (use(d) == MESH_OK && cudaStreamDestroy(stream_of(s)) != cudaSuccess) (void)cudaGetLastError();
}

static mesh_status cuda_stream_sync(dev *d, dev_stream *s)
{
    USE(d);
    CUDA_CHECK(d, "cudaStreamSynchronize", cudaStreamSynchronize(stream_of(s)));
    return MESH_OK;
}

static mesh_status cuda_event_create(dev *d, dev_event **e, int timed)
{
    cudaEvent_t ev = NULL;
    USE(d);
    CUDA_CHECK(d, "cudaEventCreateWithFlags",
               cudaEventCreateWithFlags(&ev, timed ? cudaEventDefault : cudaEventDisableTiming));
    *e = (dev_event *)ev;
    return MESH_OK;
}

static void cuda_event_destroy(dev *d, dev_event *e)
{
    if (use(d) == MESH_OK && cudaEventDestroy(event_of(e)) != cudaSuccess) (void)cudaGetLastError();
}

static mesh_status cuda_event_record(dev *d, dev_event *e, dev_stream *s)
{
    USE(d);
    CUDA_CHECK(d, "cudaEventRecord", cudaEventRecord(event_of(e), stream_of(s)));
    return MESH_OK;
}

static mesh_status cuda_event_query(dev *d, dev_event *e, int *done)
{
    USE(d);
    cudaError_t rc = cudaEventQuery(event_of(e));
    if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* (not an error: never left for a kernel launch's check to find) */
        *done = 0;
        return MESH_OK;
    }
    CUDA_CHECK(d, "cudaEventQuery", rc);
    *done = 1;
    return MESH_OK;
}

static mesh_status cuda_event_wait(dev *d, dev_stream *s, dev_event *e)
{
    USE(d);
    CUDA_CHECK(d, "cudaStreamWaitEvent", cudaStreamWaitEvent(stream_of(s), event_of(e), 0));
    return MESH_OK;
}

static mesh_status cuda_event_elapsed(dev *d, dev_event *from, dev_event *to, double *ms)
{
    float f = 0;
    USE(d);
    CUDA_CHECK(d, "cudaEventElapsedTime", cudaEventElapsedTime(&f, event_of(from), event_of(to)));
    *ms = f;
    return MESH_OK;
}

static mesh_status cuda_mem_info(dev *d, size_t *free_bytes, size_t *total_bytes)
{
    USE(d);
    CUDA_CHECK(d, "cudaMemGetInfo", cudaMemGetInfo(free_bytes, total_bytes));
    return MESH_OK;
}

/* Device memory of d's GPU (cudaPointerGetAttributes; a host pointer it
 * does not know is an error it clears). Its last byte is checked too. */
static int cuda_owns(dev *d, const void *p, size_t bytes)
{
    const char *at[2] = {p, (const char *)p + (bytes ? bytes - 1 : 0)};
    for (int i = 0; i < 2; i++) {
        struct cudaPointerAttributes a;
        memset(&a, 0, sizeof a);
        if (cudaPointerGetAttributes(&a, at[i]) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        if (a.type != cudaMemoryTypeDevice || a.device != d->index) return 0;
    }
    return 1;
}

const dev_vtbl dev_cuda_vtbl = {
    "cuda", "cudaMalloc", cuda_open, NULL, cuda_alloc, cuda_free, cuda_copy, cuda_memset,
    cuda_stream_create, cuda_stream_destroy, cuda_stream_sync, cuda_event_create, cuda_event_destroy,
    cuda_event_record, cuda_event_query, cuda_event_wait, cuda_event_elapsed, cuda_mem_info, cuda_owns,
    cuda_host_alloc, cuda_host_free,
};

#else /* no CUDA in this build: the probe and dev_open say so */

int dev_cuda_probe(char *why, size_t n, char *name, size_t name_n)
{
    clear(name, name_n);
    if (why && n) snprintf(why, n, "%s", NO_CUDA);
    return 0;
}

int dev_cuda_count(void) { return 0; }

static mesh_status nocuda_open(dev *d)
{
    snprintf(d->name, sizeof d->name, "cuda:%d", d->index);
    return dev_fail(d, MESH_ERR_UNSUPPORTED, "no GPU (%s)", NO_CUDA);
}

/* dev_open never hands out a handle of this table: only open is called. */
const dev_vtbl dev_cuda_vtbl = {
    "cuda", "cudaMalloc", nocuda_open, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL,
};

#endif
