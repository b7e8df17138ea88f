/* device.h — devices: where a rank's buffers live and its work runs
 * (internal to libmesh).
 *
 * A device is a small function table (dev_vtbl) and its state (dev), in
 * the style of comm.h's communicators. Two backends fill the table:
 *   - "cpu" (device_cpu.c): host memory from posix_memalign, memcpy and
 *     memset; every call is finished when it returns, so streams and
 *     events do nothing (a query is always done).
 *   - "cuda" (device_cuda.c, built for real with make CUDA=1): cudaMalloc,
 *     cudaMemcpyAsync and cudaMemsetAsync on a stream, CUDA streams and
 *     events. With CUDA=0 it only says "this libmesh was built without
 *     CUDA (make CUDA=1)".
 * device.c dispatches through the table, builds the out-of-memory message,
 * probes for a GPU (dev_cuda_probe, in device_cuda.c) and decides which
 * device a process trains on (dev_choose).
 *
 * Every fallible call returns a mesh_status, and on failure leaves the
 * message in dev_last_error(d), naming the device and the call: "cuda:0
 * (NVIDIA H200): cudaMemcpyAsync: an illegal memory access was encountered
 * (cudaErrorIllegalAddress)". A failed allocation (MESH_ERR_NOMEM) says
 * how much was asked, how much the plan predicts, and what the device has:
 * "cuda:0 (NVIDIA H200): cudaMalloc: out of device memory allocating N
 * bytes (the plan predicts P bytes per rank; the device has F free of T)".
 *
 * Buffers are aligned to DEV_ALIGN bytes. A stream of NULL is the
 * device's default stream. A copy or memset on a stream is finished once
 * the stream is synchronised (dev_stream_sync), or once an event recorded
 * after it reports done; on the CPU, at once. One thread uses a dev at a
 * time (its error text is per handle).
 *
 * Ownership: dev_open returns a handle the caller closes with dev_close;
 * buffers, streams and events are freed through the handle that made them,
 * before it is closed.
 */
#ifndef MESH_DEVICE_H
#define MESH_DEVICE_H

#include <stddef.h> /* size_t */

#include "mesh.h" /* mesh_status, mesh_device_kind */

enum { DEV_ALIGN = 256 }; /* bytes: every buffer's alignment (cudaMalloc's) */

typedef struct dev dev;
typedef struct dev_stream dev_stream; /* NULL: the device's default stream */
typedef struct dev_event dev_event;

typedef enum dev_copy_kind {
    DEV_HOST_TO_DEVICE,
    DEV_DEVICE_TO_HOST,
    DEV_DEVICE_TO_DEVICE
} dev_copy_kind;

/* A backend. Methods are called through device.c, which checks the
 * arguments (non-NULL handles, a non-zero size), so they need not. A
 * method that fails writes its message with dev_fail; but alloc, when the
 * device is full, just returns MESH_ERR_NOMEM: device.c writes the
 * message, with the sizes. */
typedef struct dev_vtbl {
    const char *name;       /* "cpu", "cuda" */
    const char *alloc_call; /* what alloc calls ("posix_memalign", "cudaMalloc"), for messages */
    /* sets d->name ("cpu", "cuda:0 (NVIDIA H200)") and makes d usable
     * (cudaSetDevice) */
    mesh_status (*open)(dev *d);
    void (*close)(dev *d); /* (optional; default: nothing) */
    mesh_status (*alloc)(dev *d, void **p, size_t bytes); /* bytes > 0 */
    void (*free)(dev *d, void *p);                        /* p != NULL */
    mesh_status (*copy)(dev *d, void *dst, const void *src, size_t bytes, dev_copy_kind kind, dev_stream *s);
    mesh_status (*memset)(dev *d, void *p, int byte, size_t bytes, dev_stream *s);
    /* streams and events: NULL for a synchronous device (the CPU), whose
     * streams and events are tokens, every event done at once */
    mesh_status (*stream_create)(dev *d, dev_stream **s);
    void (*stream_destroy)(dev *d, dev_stream *s); /* s != NULL */
    mesh_status (*stream_sync)(dev *d, dev_stream *s);
    /* timed: the event can be timed (event_elapsed), else lighter */
    mesh_status (*event_create)(dev *d, dev_event **e, int timed);
    void (*event_destroy)(dev *d, dev_event *e); /* e != NULL */
    /* e marks the point reached by the work enqueued on s so far */
    mesh_status (*event_record)(dev *d, dev_event *e, dev_stream *s);
    /* *done: 1 when the work before e's record has finished, else 0 */
    mesh_status (*event_query)(dev *d, dev_event *e, int *done);
    /* the work enqueued on s from now on waits for e (the host does not) */
    mesh_status (*event_wait)(dev *d, dev_stream *s, dev_event *e);
    /* *ms: milliseconds from the point `from` marks to the point `to`
     * marks, both timed events whose work has finished */
    mesh_status (*event_elapsed)(dev *d, dev_event *from, dev_event *to, double *ms);
    /* the device's free and total memory, in bytes */
    mesh_status (*mem_info)(dev *d, size_t *free_bytes, size_t *total_bytes);
    /* 1 if [p, p + bytes) is this device's memory, which the host cannot
     * touch (NULL: the host's own memory, never) */
    int (*owns)(dev *d, const void *p, size_t bytes);
    /* page-locked host memory, which copies to and from the device do not
     * wait behind (cudaMallocHost; NULL: the host's memory is as good) */
    mesh_status (*host_alloc)(dev *d, void **p, size_t bytes);
    void (*host_free)(dev *d, void *p);
} dev_vtbl;

struct dev {
    const dev_vtbl *v;
    int index;       /* the CUDA device number; 0 on the CPU */
    size_t planned;  /* bytes the plan predicts per rank (dev_set_planned; 0: unknown) */
    size_t held;     /* bytes the kernels hold beside the plan's (a GPU's cuBLASLt workspace) */
    int fail_alloc;  /* test hook (cpu): every alloc fails as if the memory were full */
    void *impl;      /* the backend's own state (the guarded CPU device's buffers) */
    _Atomic long long to_host; /* device-to-host copies made (on a GPU each is a wait for the device);
                                  atomic: a communication queue's staging copies count too */
    long long waits; /* the host's waits for a stream (dev_stream_sync on a GPU) */
    int (*watch)(void *ud, double waited_s, char *why, size_t n); /* dev_set_watch's check, or NULL */
    void *watch_ud;
    dev_event *watch_ev; /* the event a watched stream_sync polls */
    void *bounce;        /* a watched device's page-locked staging for copies to and from the host */
    dev_event *bounce_ev; /* recorded after the copy that last used it */
    int bounce_busy;     /* a host-to-device copy from it may still be reading it */
    char name[128];  /* "cpu", "cuda:0 (NVIDIA H200)": messages start with it */
    char error[1024]; /* why the last call failed */
};

extern const dev_vtbl dev_cpu_vtbl;
extern const dev_vtbl dev_cuda_vtbl; /* with CUDA=0, open says libmesh was built without it */
extern const dev_vtbl dev_cpu_guarded_vtbl; /* tests: device_guard.c */

/* ---- opening and the calls (device.c) ----------------------------------- */

/* Device `index` of `kind` (MESH_DEVICE_CPU or MESH_DEVICE_CUDA; the CPU
 * has index 0 only). On failure *out is NULL and err (n bytes) says why:
 * "cuda:1: no GPU (no CUDA driver (...))", "this libmesh was built without
 * CUDA (make CUDA=1)". */
mesh_status dev_open(mesh_device_kind kind, int index, dev **out, char *err, size_t n);
void dev_close(dev *d); /* NULL does nothing */

/* The guarded CPU device (device_guard.c, for tests): host memory the host
 * cannot touch but through the device's copies and memsets, or inside
 * dev_guard(d, 1) .. dev_guard(d, 0) (a kernel's run; calls nest). Its
 * name is "cpu": kernels run with the CPU's table. dev_guard does nothing
 * on any other device. */
mesh_status dev_open_guarded(dev **out, char *err, size_t n);
void dev_guard(dev *d, int open);
/* 1 if this process's guarded devices use a protection key (a thread
 * touches their memory only inside its own dev_guard brackets, copies and
 * memsets), 0 if mprotect (open to every thread while any has it open);
 * known once a guarded device was opened. */
int dev_guard_keyed(void);
/* 1 if [p, p + bytes) lies in one of the guarded device d's buffers, else
 * 0 (0 on any other device). */
int dev_guard_owns(dev *d, const void *p, size_t bytes);

const char *dev_last_error(const dev *d);

/* The bytes the plan predicts per rank (its memory plan's total for this
 * rank's stage), which an out-of-memory message quotes; 0: none. */
void dev_set_planned(dev *d, size_t bytes);

/* bytes == 0 gives *p = NULL and MESH_OK; dev_free(d, NULL) does nothing. */
mesh_status dev_alloc(dev *d, void **p, size_t bytes);
void dev_free(dev *d, void *p);
/* bytes == 0 does nothing; src and dst must not overlap */
mesh_status dev_copy(dev *d, void *dst, const void *src, size_t bytes, dev_copy_kind kind, dev_stream *s);
mesh_status dev_memset(dev *d, void *p, int byte, size_t bytes, dev_stream *s);
mesh_status dev_stream_create(dev *d, dev_stream **s);
void dev_stream_destroy(dev *d, dev_stream *s); /* NULL does nothing */
mesh_status dev_stream_sync(dev *d, dev_stream *s);
/* A check made while the host waits in dev_stream_sync or dev_event_sync
 * on a device with events (a GPU): about every millisecond of the wait,
 * and once when the work is done, watch(ud, seconds waited so far, why,
 * n) returns 0 to go on waiting (or end the wait), or -1 with why to end
 * it with MESH_ERR_RANK and that message. For
 * work the host cannot bound itself: NCCL's, ordered on the stream
 * (comm_nccl_order's comm_nccl_watch), which waits for other ranks that
 * may have failed. NULL: a plain wait. */
typedef int (*dev_watch_fn)(void *ud, double waited_s, char *why, size_t n);
void dev_set_watch(dev *d, dev_watch_fn watch, void *ud);
mesh_status dev_event_create(dev *d, dev_event **e);
/* An event that dev_event_elapsed can time (on a GPU a little dearer to
 * record than dev_event_create's). */
mesh_status dev_event_create_timed(dev *d, dev_event **e);
void dev_event_destroy(dev *d, dev_event *e); /* NULL does nothing */
mesh_status dev_event_record(dev *d, dev_event *e, dev_stream *s);
mesh_status dev_event_query(dev *d, dev_event *e, int *done);
mesh_status dev_event_wait(dev *d, dev_stream *s, dev_event *e);
/* *ms: the device's time in milliseconds from the point timed event
 * `from` marks to the point timed event `to` marks (may be < 0 if `to`
 * was reached first), once the work before both has finished
 * (dev_event_query); 0 on a synchronous device, whose events are done as
 * they are recorded. */
mesh_status dev_event_elapsed(dev *d, dev_event *from, dev_event *to, double *ms);
/* The host waits until the work before e's record is done (polling
 * dev_event_query: spinning briefly, then sleeping 20 us at a time), at
 * most timeout_s seconds when it is > 0 (then MESH_ERR_INTERNAL). */
mesh_status dev_event_sync(dev *d, dev_event *e, double timeout_s);
mesh_status dev_mem_info(dev *d, size_t *free_bytes, size_t *total_bytes);
/* 1 if [p, p + bytes) lies in device memory of d that the host may not
 * touch (a GPU's, by cudaPointerGetAttributes; the guarded device's
 * buffers), else 0 (always 0 on the CPU, whose memory is the host's). */
int dev_owns(dev *d, const void *p, size_t bytes);

/* For backends: writes "NAME: " and the formatted text into d->error;
 * returns st. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
mesh_status dev_fail(dev *d, mesh_status st, const char *fmt, ...);

/* The out-of-memory text (without the device's name): "CALL: out of
 * device memory allocating N bytes (the plan predicts P bytes per rank,
 * and the kernels hold H more; the device has F free of T)"; the
 * prediction is left out when planned is 0, the kernels' bytes when held
 * is 0, the free and total bytes when have_info is 0. */
void dev_oom_text(char *buf, size_t n, const char *call, size_t bytes, size_t planned, size_t held, int have_info,
                  size_t free_bytes, size_t total_bytes);

/* ---- the GPU probe and the choice of device ----------------------------- */

/* 1 if this process can use a CUDA GPU, with device 0's name in name
 * ("NVIDIA H200"; name_n bytes); else 0 with the reason in why: "no CUDA
 * driver (libcuda.so.1: cannot open shared object file: ...)", "no CUDA
 * device (cudaGetDeviceCount found none)", "cudaGetDeviceCount: ...",
 * "this libmesh was built without CUDA (make CUDA=1)". Asks dlopen for
 * the driver first, so it never crashes without one. why and name may be
 * NULL; each gets "" when it has nothing to say. (device_cuda.c) */
int dev_cuda_probe(char *why, size_t n, char *name, size_t name_n);
/* The GPUs this process may use (0 without a driver, a device, or CUDA). */
int dev_cuda_count(void);

/* What a process asking for `asked` trains on, given whether a GPU is
 * usable (gpu) and the probe's text (the GPU's name, else the reason):
 * MESH_OK with *chosen and the one-line reason in why, or
 * MESH_ERR_UNSUPPORTED (MESH_DEVICE_CUDA without a GPU) and
 * MESH_ERR_INVALID_ARG (not a kind) with the message in why.
 * MESH_DEVICE_AUTO gives MESH_DEVICE_CUDA when a GPU is usable, else the
 * CPU; MESH_DEVICE_CUDA with a GPU gives MESH_DEVICE_CUDA. (A context may
 * still run an AUTO choice on the CPU: mesh__context_create.) */
mesh_status dev_choose(mesh_device_kind asked, int gpu, const char *probe_text, mesh_device_kind *chosen,
                       char *why, size_t n);

#endif
