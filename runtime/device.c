/* device.c — the device calls (device.h): argument checks and dispatch
 * through the backend's table, the out-of-memory message, and which device
 * a process trains on.
 *
 * The backends are device_cpu.c and device_cuda.c; this file knows neither
 * malloc nor CUDA.
 */
#include "device.h"

#include "comm.h" /* comm_now: the monotonic clock */

#include <stdarg.h> /* va_list */
#include <stdio.h>  /* snprintf, vsnprintf */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memcpy */
#include <time.h>   /* nanosleep */

mesh_status dev_fail(dev *d, mesh_status st, const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(d->error, sizeof d->error, "%s: ", d->name[0] ? d->name : d->v->name);
    size_t at = k > 0 && (size_t)k < sizeof d->error ? (size_t)k : 0;
    va_start(ap, fmt);
    vsnprintf(d->error + at, sizeof d->error - at, fmt, ap);
    va_end(ap);
    return st;
}

static mesh_status open_with(const dev_vtbl *v, int index, dev **out, char *err, size_t n)
{
    dev *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, n, "out of memory");
        return MESH_ERR_NOMEM;
    }
    d->v = v;
    d->index = index;
    mesh_status st = v->open(d);
    if (st != MESH_OK) {
        snprintf(err, n, "%s", d->error);
        free(d);
        return st;
    }
    *out = d;
    return MESH_OK;
}

mesh_status dev_open(mesh_device_kind kind, int index, dev **out, char *err, size_t n)
{
    char none[1];
    if (!err || n == 0) err = none, n = sizeof none;
    err[0] = '\0';
    if (!out) return MESH_ERR_INVALID_ARG;
    *out = NULL;
    const dev_vtbl *v = kind == MESH_DEVICE_CPU ? &dev_cpu_vtbl : kind == MESH_DEVICE_CUDA ? &dev_cuda_vtbl : NULL;
    if (!v) {
        snprintf(err, n, "device kind %d is neither the CPU nor CUDA", (int)kind);
        return MESH_ERR_INVALID_ARG;
    }
    if (index < 0 || (kind == MESH_DEVICE_CPU && index != 0)) {
        snprintf(err, n, "%s: no device %d", v->name, index);
        return MESH_ERR_INVALID_ARG;
    }
    return open_with(v, index, out, err, n);
}

mesh_status dev_open_guarded(dev **out, char *err, size_t n)
{
    char none[1];
    if (!err || n == 0) err = none, n = sizeof none;
    err[0] = '\0';
    if (!out) return MESH_ERR_INVALID_ARG;
    *out = NULL;
    return open_with(&dev_cpu_guarded_vtbl, 0, out, err, n);
}

void dev_close(dev *d)
{
    if (!d) return;
    dev_event_destroy(d, d->watch_ev);
    dev_event_destroy(d, d->bounce_ev);
    if (d->bounce) d->v->host_free(d, d->bounce);
    if (d->v->close) d->v->close(d);
    free(d);
}

const char *dev_last_error(const dev *d) { return d ? d->error : "no device"; }

void dev_set_planned(dev *d, size_t bytes)
{
    if (d) d->planned = bytes;
}

void dev_oom_text(char *buf, size_t n, const char *call, size_t bytes, size_t planned, size_t held, int have_info,
                  size_t free_bytes, size_t total_bytes)
{
    char plan[144] = "", info[96] = "";
    if (planned > 0 && held > 0)
        snprintf(plan, sizeof plan, "the plan predicts %zu bytes per rank, and the kernels hold %zu more", planned,
                 held);
    else if (planned > 0)
        snprintf(plan, sizeof plan, "the plan predicts %zu bytes per rank", planned);
    else if (held > 0)
        snprintf(plan, sizeof plan, "the kernels hold %zu bytes", held);
    if (have_info) snprintf(info, sizeof info, "the device has %zu free of %zu", free_bytes, total_bytes);
    const char *open = plan[0] || info[0] ? " (" : "", *close = plan[0] || info[0] ? ")" : "";
    snprintf(buf, n, "%s%sout of device memory allocating %zu bytes%s%s%s%s%s", call ? call : "",
             call && call[0] ? ": " : "", bytes, open, plan, plan[0] && info[0] ? "; " : "", info, close);
}

mesh_status dev_alloc(dev *d, void **p, size_t bytes)
{
    if (!d || !p) return MESH_ERR_INVALID_ARG;
    *p = NULL;
    if (bytes == 0) return MESH_OK;
    mesh_status st = d->v->alloc(d, p, bytes);
    if (st != MESH_ERR_NOMEM) return st;
    /* the device is full: say how full, and what the plan expected */
    size_t free_bytes = 0, total_bytes = 0;
    int have_info = d->v->mem_info(d, &free_bytes, &total_bytes) == MESH_OK;
    char text[400];
    dev_oom_text(text, sizeof text, d->v->alloc_call, bytes, d->planned, d->held, have_info, free_bytes, total_bytes);
    *p = NULL;
    return dev_fail(d, MESH_ERR_NOMEM, "%s", text);
}

void dev_free(dev *d, void *p)
{
    if (d && p) d->v->free(d, p);
}

static mesh_status poll_event(dev *d, dev_event *e, double timeout_s, int watched);

enum { BOUNCE_BYTES = 4 << 20 }; /* a watched device's page-locked staging */

/* A watched device's copy between the host and the device, through its
 * page-locked staging: a copy to or from pageable memory may make the host
 * wait for the stream inside the CUDA call (the driver stages it itself),
 * where no watch runs, so a rank whose peer died would hang there. Here
 * the host waits in poll_event, watched: to the host, for each piece's
 * copy; to the device, before the staging is reused (the copy itself is
 * left running, as an asynchronous copy is). */
static mesh_status bounced_copy(dev *d, unsigned char *dst, const unsigned char *src, size_t bytes,
                                dev_copy_kind kind, dev_stream *s)
{
    mesh_status st = MESH_OK;
    if (!d->bounce) {
        if (!d->bounce_ev) st = dev_event_create(d, &d->bounce_ev);
        if (st == MESH_OK) st = d->v->host_alloc(d, &d->bounce, BOUNCE_BYTES);
        if (st != MESH_OK) return st;
    }
    for (size_t at = 0; at < bytes && st == MESH_OK; at += BOUNCE_BYTES) {
        size_t k = bytes - at < BOUNCE_BYTES ? bytes - at : BOUNCE_BYTES;
        if (d->bounce_busy) { /* the last copy to the device may still read it */
            if ((st = poll_event(d, d->bounce_ev, 0, 1)) != MESH_OK) return st;
            d->bounce_busy = 0;
        }
        if (kind == DEV_HOST_TO_DEVICE) {
            memcpy(d->bounce, src + at, k);
            st = d->v->copy(d, dst + at, d->bounce, k, kind, s);
            if (st == MESH_OK) st = dev_event_record(d, d->bounce_ev, s);
            d->bounce_busy = st == MESH_OK;
        } else {
            st = d->v->copy(d, d->bounce, src + at, k, kind, s);
            if (st == MESH_OK) st = dev_event_record(d, d->bounce_ev, s);
            if (st == MESH_OK) st = poll_event(d, d->bounce_ev, 0, 1);
            if (st == MESH_OK) memcpy(dst + at, d->bounce, k);
        }
    }
    return st;
}

mesh_status dev_copy(dev *d, void *dst, const void *src, size_t bytes, dev_copy_kind kind, dev_stream *s)
{
    if (!d) return MESH_ERR_INVALID_ARG;
    if (bytes == 0) return MESH_OK;
    if (!dst || !src) return dev_fail(d, MESH_ERR_INVALID_ARG, "copy of %zu bytes: NULL buffer", bytes);
    if (kind != DEV_HOST_TO_DEVICE && kind != DEV_DEVICE_TO_HOST && kind != DEV_DEVICE_TO_DEVICE)
        return dev_fail(d, MESH_ERR_INVALID_ARG, "copy of %zu bytes: kind %d is not a direction", bytes, (int)kind);
    d->to_host += kind == DEV_DEVICE_TO_HOST;
    if (kind != DEV_DEVICE_TO_DEVICE && d->watch && d->v->host_alloc && d->v->event_record)
        return bounced_copy(d, dst, src, bytes, kind, s);
    return d->v->copy(d, dst, src, bytes, kind, s);
}

mesh_status dev_memset(dev *d, void *p, int byte, size_t bytes, dev_stream *s)
{
    if (!d) return MESH_ERR_INVALID_ARG;
    if (bytes == 0) return MESH_OK;
    if (!p) return dev_fail(d, MESH_ERR_INVALID_ARG, "memset of %zu bytes: NULL buffer", bytes);
    return d->v->memset(d, p, byte, bytes, s);
}

/* A synchronous device's streams and events (its table has none): tokens. */
static char sync_stream, sync_event;

mesh_status dev_stream_create(dev *d, dev_stream **s)
{
    if (!d || !s) return MESH_ERR_INVALID_ARG;
    *s = NULL;
    if (!d->v->stream_create) {
        *s = (dev_stream *)(void *)&sync_stream;
        return MESH_OK;
    }
    return d->v->stream_create(d, s);
}

void dev_stream_destroy(dev *d, dev_stream *s)
{
    if (d && s && d->v->stream_destroy) d->v->stream_destroy(d, s);
}

void dev_set_watch(dev *d, dev_watch_fn watch, void *ud)
{
    if (!d) return;
    d->watch = watch;
    d->watch_ud = ud;
}

/* Waits for the work before e's record, polling (spinning briefly, then
 * sleeping 20 us at a time); with timeout_s > 0 at most that long, and
 * when watched, asking d's watch every 64th sleep, and once more when the
 * work is done (a failure that did not stop it, an NCCL error or an
 * all-to-all's counts that disagree, still fails the wait). */
static mesh_status poll_event(dev *d, dev_event *e, double timeout_s, int watched)
{
    double start = comm_now(), until = timeout_s > 0 ? start + timeout_s : 0;
    char why[400];
    for (int polls = 0;; polls++) {
        int done = 0;
        mesh_status st = dev_event_query(d, e, &done);
        if (st != MESH_OK) return st;
        if (done && watched && d->watch(d->watch_ud, comm_now() - start, why, sizeof why) != 0)
            return dev_fail(d, MESH_ERR_RANK, "%s", why);
        if (done) return MESH_OK;
        if (polls < 200) continue;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        if (until > 0 && comm_now() > until)
            return dev_fail(d, MESH_ERR_INTERNAL, "the work before an event did not end within %g s", timeout_s);
        if (watched && polls % 64 == 0 && d->watch(d->watch_ud, comm_now() - start, why, sizeof why) != 0)
            return dev_fail(d, MESH_ERR_RANK, "%s", why);
    }
}

mesh_status dev_stream_sync(dev *d, dev_stream *s)
{
    if (!d) return MESH_ERR_INVALID_ARG;
    if (!d->v->stream_sync) return MESH_OK; /* a synchronous device */
    d->waits++;
    if (!d->watch || !d->v->event_record) return d->v->stream_sync(d, s);
    mesh_status st = d->watch_ev ? MESH_OK : dev_event_create(d, &d->watch_ev);
    if (st == MESH_OK) st = dev_event_record(d, d->watch_ev, s);
    return st == MESH_OK ? poll_event(d, d->watch_ev, 0, 1) : st;
}

static mesh_status event_create(dev *d, dev_event **e, int timed)
{
    if (!d || !e) return MESH_ERR_INVALID_ARG;
    *e = NULL;
    if (!d->v->event_create) {
        *e = (dev_event *)(void *)&sync_event;
        return MESH_OK;
    }
    return d->v->event_create(d, e, timed);
}

mesh_status dev_event_create(dev *d, dev_event **e) { return event_create(d, e, 0); }

mesh_status dev_event_create_timed(dev *d, dev_event **e) { return event_create(d, e, 1); }

void dev_event_destroy(dev *d, dev_event *e)
{
    if (d && e && d->v->event_destroy) d->v->event_destroy(d, e);
}

mesh_status dev_event_record(dev *d, dev_event *e, dev_stream *s)
{
    if (!d) return MESH_ERR_INVALID_ARG;
    if (!e) return dev_fail(d, MESH_ERR_INVALID_ARG, "event record: NULL event");
    return d->v->event_record ? d->v->event_record(d, e, s) : MESH_OK;
}

mesh_status dev_event_query(dev *d, dev_event *e, int *done)
{
    if (!d || !done) return MESH_ERR_INVALID_ARG;
    *done = 0;
    if (!e) return dev_fail(d, MESH_ERR_INVALID_ARG, "event query: NULL event");
    if (!d->v->event_query) {
        *done = 1;
        return MESH_OK;
    }
    return d->v->event_query(d, e, done);
}

mesh_status dev_event_wait(dev *d, dev_stream *s, dev_event *e)
{
    if (!d) return MESH_ERR_INVALID_ARG;
    if (!e) return dev_fail(d, MESH_ERR_INVALID_ARG, "event wait: NULL event");
    return d->v->event_wait ? d->v->event_wait(d, s, e) : MESH_OK;
}

mesh_status dev_event_elapsed(dev *d, dev_event *from, dev_event *to, double *ms)
{
    if (!d || !ms) return MESH_ERR_INVALID_ARG;
    *ms = 0;
    if (!from || !to) return dev_fail(d, MESH_ERR_INVALID_ARG, "event elapsed time: NULL event");
    return d->v->event_elapsed ? d->v->event_elapsed(d, from, to, ms) : MESH_OK;
}

mesh_status dev_event_sync(dev *d, dev_event *e, double timeout_s)
{
    return poll_event(d, e, timeout_s, d && d->watch);
}

int dev_owns(dev *d, const void *p, size_t bytes)
{
    return d && p && d->v->owns ? d->v->owns(d, p, bytes) : 0;
}

mesh_status dev_mem_info(dev *d, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    if (!d) return MESH_ERR_INVALID_ARG;
    mesh_status st = d->v->mem_info(d, &f, &t);
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return st;
}

/* ---- the choice of device ----------------------------------------------- */

mesh_status dev_choose(mesh_device_kind asked, int gpu, const char *probe_text, mesh_device_kind *chosen,
                       char *why, size_t n)
{
    char none[1];
    const char *text = probe_text && probe_text[0] ? probe_text : "unknown";
    if (!why || n == 0) why = none, n = sizeof none;
    switch (asked) {
    case MESH_DEVICE_AUTO:
        if (gpu) {
            snprintf(why, n, "a GPU is present: running on %s (--device cpu trains on the CPU)", text);
            if (chosen) *chosen = MESH_DEVICE_CUDA;
            return MESH_OK;
        }
        snprintf(why, n, "no GPU (%s): running on the CPU", text);
        break;
    case MESH_DEVICE_CPU:
        snprintf(why, n, "the CPU was asked for: running on the CPU");
        break;
    case MESH_DEVICE_CUDA:
        if (!gpu) {
            snprintf(why, n, "--device cuda: no GPU (%s)", text);
            return MESH_ERR_UNSUPPORTED;
        }
        snprintf(why, n, "the GPU was asked for: running on %s", text);
        if (chosen) *chosen = MESH_DEVICE_CUDA;
        return MESH_OK;
    default:
        snprintf(why, n, "device kind %d is not one of MESH_DEVICE_AUTO, MESH_DEVICE_CPU, MESH_DEVICE_CUDA",
                 (int)asked);
        return MESH_ERR_INVALID_ARG;
    }
    if (chosen) *chosen = MESH_DEVICE_CPU;
    return MESH_OK;
}
