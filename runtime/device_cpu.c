/* device_cpu.c — the CPU device (device.h): buffers in host memory from
 * posix_memalign, copies with memcpy, memset with memset.
 *
 * Every call has finished when it returns: the table has no stream or
 * event entries, so device.c hands out tokens (synchronising returns at
 * once, a query is always done). Memory info is the machine's (sysconf: free and total
 * physical pages).
 */
#include "device.h"

#include <errno.h>  /* ENOMEM */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* posix_memalign, free */
#include <string.h> /* memcpy, memset, strerror */
#include <unistd.h> /* sysconf */

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
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, /* synchronous: streams and events are tokens */
    cpu_mem_info,
    NULL, /* owns: the host's memory */
    NULL, NULL, /* host_alloc, host_free: the host's memory is the device's */
};
