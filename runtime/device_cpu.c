/* device_cpu.c — the CPU device (device.h): buffers in host memory from
 * posix_memalign, copies with memcpy, memset with memset.
 *
 * Every call has finished when it returns, so a stream or an event is a
 * token that does nothing: synchronising returns at once and a query is
 * always done. Memory info is the machine's (sysconf: free and total
 * physical pages).
 */
#include "device.h"

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* posix_memalign, free */
#include <string.h> /* memcpy, memset, strerror */
#include <unistd.h> /* sysconf */

/* The tokens handed out as streams and events; never dereferenced. */
struct dev_stream {
    int unused;
};
struct dev_event {
    int unused;
};
static struct dev_stream cpu_stream;
static struct dev_event cpu_event;

static mesh_status cpu_open(dev *d)
{
    snprintf(d->name, sizeof d->name, "cpu");
    return MESH_OK;
}

static mesh_status cpu_alloc(dev *d, void **p, size_t bytes)
{
    if (d->fail_alloc) return MESH_ERR_NOMEM; /* test hook */
    int rc = posix_memalign(p, DEV_ALIGN, bytes);
    if (rc == 0) return MESH_OK;
    *p = NULL;
    if (rc == ENOMEM) return MESH_ERR_NOMEM;
    return dev_fail(d, MESH_ERR_INTERNAL, "posix_memalign(%d, %zu): %s", (int)DEV_ALIGN, bytes, strerror(rc));
}

static void cpu_free(dev *d, void *p)
{
    (void)d;
    free(p);
}

static mesh_status cpu_copy(dev *d, void *dst, const void *src, size_t bytes, dev_copy_kind kind, dev_stream *s)
{
    (void)d;
    (void)kind;
    (void)s;
    memcpy(dst, src, bytes);
    return MESH_OK;
}

static mesh_status cpu_memset(dev *d, void *p, int byte, size_t bytes, dev_stream *s)
{
    (void)d;
    (void)s;
    memset(p, byte, bytes);
    return MESH_OK;
}

static mesh_status cpu_stream_create(dev *d, dev_stream **s)
{
    (void)d;
    *s = &cpu_stream;
    return MESH_OK;
}

static void cpu_stream_destroy(dev *d, dev_stream *s)
{
    (void)d;
    (void)s;
}

static mesh_status cpu_stream_sync(dev *d, dev_stream *s)
{
    (void)d;
    (void)s;
    return MESH_OK;
}

static mesh_status cpu_event_create(dev *d, dev_event **e)
{
    (void)d;
    *e = &cpu_event;
    return MESH_OK;
}

static void cpu_event_destroy(dev *d, dev_event *e)
{
    (void)d;
    (void)e;
}

static mesh_status cpu_event_record(dev *d, dev_event *e, dev_stream *s)
{
    (void)d;
    (void)e;
    (void)s;
    return MESH_OK;
}

static mesh_status cpu_event_query(dev *d, dev_event *e, int *done)
{
    (void)d;
    (void)e;
    *done = 1;
    return MESH_OK;
}

static mesh_status cpu_event_wait(dev *d, dev_stream *s, dev_event *e)
{
    (void)d;
    (void)s;
    (void)e;
    return MESH_OK;
}

static mesh_status cpu_mem_info(dev *d, size_t *free_bytes, size_t *total_bytes)
{
    long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || avail < 0 || total <= 0)
        return dev_fail(d, MESH_ERR_UNSUPPORTED, "sysconf: the machine's memory is unknown");
    *free_bytes = (size_t)avail * (size_t)page;
    *total_bytes = (size_t)total * (size_t)page;
    return MESH_OK;
}

const dev_vtbl dev_cpu_vtbl = {
    "cpu", "posix_memalign", cpu_open, NULL, cpu_alloc, cpu_free, cpu_copy, cpu_memset,
    cpu_stream_create, cpu_stream_destroy, cpu_stream_sync, cpu_event_create, cpu_event_destroy,
    cpu_event_record, cpu_event_query, cpu_event_wait, cpu_mem_info,
};
