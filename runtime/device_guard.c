/* device_guard.c — the guarded CPU device (device.h), for tests: the CPU's
 * memory made to behave like a GPU's for the host.
 *
 * Its buffers come from mmap and cannot be touched except while one of the
 * device's own calls (a copy, a memset) or a kernel (between dev_guard(d,
 * 1) and dev_guard(d, 0), which the executor's kernel table brackets every
 * kernel with) runs. Host code that reads or writes such a buffer any
 * other way faults at once: the test that an executor moves everything
 * between the host and its arena by explicit copies, as a GPU needs,
 * while computing with the CPU kernels, so that the results can be
 * compared to the bit.
 *
 * Where the CPU and kernel have memory protection keys (x86's PKU), the
 * buffers carry one key of the process's, shared by every guarded device,
 * and opening or closing is a change of the calling thread's rights to it
 * (pkey_set: an instruction, no system call), nested per thread: a thread
 * touches a guarded buffer only between its own dev_guard(d, 1) and
 * dev_guard(d, 0), or in a copy or memset it makes; a thread that never
 * opened (another rank's host code, a pool's worker) faults. Freed buffers
 * are PROT_NONE until they are handed out again.
 *
 * Without keys, opening and closing are mprotect calls, and the memory is
 * open to every thread while any has it open. The buffers are carved, in
 * order, out of one reserved region (1 GiB of address space, nothing
 * committed until touched), so that opening or closing is one mprotect
 * over the region's used part, not one per buffer (each is a system call
 * and a TLB shootdown across the process's threads, made twice per
 * kernel). A buffer that does not fit gets an mmap of its own.
 * MESH_GUARD_NO_PKEYS=1 makes a process use mprotect where it has keys.
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS, pkey_alloc, pkey_mprotect, pkey_set */
#include "device.h"

#include <errno.h>    /* errno */
#include <pthread.h>  /* pthread_mutex_t */
#include <stdint.h>   /* uintptr_t */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* calloc, realloc, free */
#include <string.h>   /* memcpy, memset, strerror */
#include <sys/mman.h> /* mmap, mprotect, munmap */
#include <unistd.h>   /* sysconf */

typedef struct guard_buf {
    void *p;
    size_t len; /* whole pages */
    int own;    /* an mmap of its own (else a part of the region) */
} guard_buf;

enum { GUARD_REGION_LOG2 = 30 }; /* the region's address space: 1 GiB */

typedef struct guard_state {
    guard_buf *b;
    int n, cap;
    pthread_mutex_t mu; /* dev_guard's: the rank's thread and its communication queue's */
    int open;   /* nesting of dev_guard(d, 1), over both threads */
    int failed; /* an mprotect failed (d->error says why): every later copy fails */
    char *base; /* the region (NULL if it could not be reserved) */
    size_t top; /* its bytes handed out: [base, base + top) */
} guard_state;

static guard_state *state(dev *d) { return d->impl; }

/* The process's protection key for guarded memory, or -1 (mprotect). */
static int guard_key = -1;
static pthread_once_t guard_key_once = PTHREAD_ONCE_INIT;
static _Thread_local int guard_depth; /* this thread's nesting of opens (with a key) */

static void guard_key_alloc(void)
{
    const char *off = getenv("MESH_GUARD_NO_PKEYS");
    if (off && *off && strcmp(off, "0") != 0) return;
    /* (this thread's rights: none; a new thread starts with its maker's,
     * and one that existed before the key has none) */
    guard_key = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    if (guard_key < 0) guard_key = -1; /* no PKU, or no keys left: mprotect */
}

/* mprotect, or pkey_mprotect with the key: prot applies only while the
 * thread's rights to the key allow. */
static int guard_mprotect(void *p, size_t len, int prot)
{
    return guard_key >= 0 ? pkey_mprotect(p, len, prot, guard_key) : mprotect(p, len, prot);
}

static void protect_range(dev *d, guard_state *g, void *p, size_t len, int prot)
{
    if (len && guard_mprotect(p, len, prot) != 0 && !g->failed) {
        g->failed = 1;
        dev_fail(d, MESH_ERR_INTERNAL, "mprotect: %s", strerror(errno));
    }
}

static void protect(dev *d, guard_state *g, int prot)
{
    protect_range(d, g, g->base, g->top, prot);
    for (int i = 0; i < g->n; i++)
        if (g->b[i].own) protect_range(d, g, g->b[i].p, g->b[i].len, prot);
}

void dev_guard(dev *d, int open)
{
    guard_state *g = d && d->v == &dev_cpu_guarded_vtbl ? state(d) : NULL;
    if (!g) return;
    if (guard_key >= 0) { /* this thread's rights only */
        if (open && guard_depth++ == 0) pkey_set(guard_key, 0);
        if (!open && guard_depth > 0 && --guard_depth == 0) pkey_set(guard_key, PKEY_DISABLE_ACCESS);
        return;
    }
    pthread_mutex_lock(&g->mu);
    if (open && g->open++ == 0) protect(d, g, PROT_READ | PROT_WRITE);
    if (!open && g->open > 0 && --g->open == 0) protect(d, g, PROT_NONE);
    pthread_mutex_unlock(&g->mu);
}

int dev_guard_keyed(void) { return guard_key >= 0; }

int dev_guard_owns(dev *d, const void *p, size_t bytes)
{
    guard_state *g = d && d->v == &dev_cpu_guarded_vtbl ? state(d) : NULL;
    int in = 0;
    if (!g) return 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n && !in; i++) {
        uintptr_t b = (uintptr_t)g->b[i].p, q = (uintptr_t)p;
        in = q >= b && bytes <= g->b[i].len && q - b <= g->b[i].len - bytes;
    }
    pthread_mutex_unlock(&g->mu);
    return in;
}

static mesh_status guard_open(dev *d)
{
    snprintf(d->name, sizeof d->name, "cpu (guarded)");
    pthread_once(&guard_key_once, guard_key_alloc);
    guard_state *g = calloc(1, sizeof *g);
    if (!g) return dev_fail(d, MESH_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&g->mu, NULL);
    void *r = mmap(NULL, (size_t)1 << GUARD_REGION_LOG2, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    g->base = r == MAP_FAILED ? NULL : r; /* (without it, every buffer is its own mmap) */
    d->impl = g;
    return MESH_OK;
}

static void guard_close(dev *d)
{
    guard_state *g = state(d);
    for (int i = 0; g && i < g->n; i++)
        if (g->b[i].own) munmap(g->b[i].p, g->b[i].len);
    if (g && g->base) munmap(g->base, (size_t)1 << GUARD_REGION_LOG2);
    if (g) {
        free(g->b);
        pthread_mutex_destroy(&g->mu);
    }
    free(g);
    d->impl = NULL;
}

static mesh_status guard_alloc(dev *d, void **p, size_t bytes)
{
    guard_state *g = state(d);
    long page = sysconf(_SC_PAGESIZE);
    size_t len = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 8;
        guard_buf *b = realloc(g->b, (size_t)cap * sizeof *b);
        if (!b) return MESH_ERR_NOMEM;
        g->b = b;
        g->cap = cap;
    }
    int prot = g->open || guard_key >= 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    if (g->base && len <= ((size_t)1 << GUARD_REGION_LOG2) - g->top) { /* the next part of the region */
        void *m = g->base + g->top;
        protect_range(d, g, m, len, prot); /* (its pages were left PROT_NONE) */
        g->top += len;
        g->b[g->n++] = (guard_buf){m, len, 0};
        *p = m;
        return MESH_OK;
    }
    void *m = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        *p = NULL;
        return errno == ENOMEM ? MESH_ERR_NOMEM : dev_fail(d, MESH_ERR_INTERNAL, "mmap(%zu): %s", len, strerror(errno));
    }
    if (guard_key >= 0) protect_range(d, g, m, len, prot); /* (its key) */
    g->b[g->n++] = (guard_buf){m, len, 1};
    *p = m;
    return MESH_OK;
}

static void guard_free(dev *d, void *p)
{
    guard_state *g = state(d);
    for (int i = 0; i < g->n; i++)
        if (g->b[i].p == p) {
            guard_buf b = g->b[i];
            g->b[i] = g->b[--g->n];
            if (b.own) {
                munmap(p, b.len);
                return;
            }
            /* a part of the region: its pages dropped and closed for good
             * (the region's top comes down when it was the last part) */
            protect_range(d, g, p, b.len, PROT_NONE);
            (void)madvise(p, b.len, MADV_DONTNEED);
            if ((char *)p + b.len == g->base + g->top) g->top -= b.len;
            return;
        }
}

static mesh_status guard_copy(dev *d, void *dst, const void *src, size_t bytes, dev_copy_kind kind, dev_stream *s)
{
    (void)kind;
    (void)s;
    dev_guard(d, 1);
    memcpy(dst, src, bytes);
    dev_guard(d, 0);
    return state(d)->failed ? MESH_ERR_INTERNAL : MESH_OK;
}

static mesh_status guard_memset(dev *d, void *p, int byte, size_t bytes, dev_stream *s)
{
    (void)s;
    dev_guard(d, 1);
    memset(p, byte, bytes);
    dev_guard(d, 0);
    return state(d)->failed ? MESH_ERR_INTERNAL : MESH_OK;
}

static mesh_status guard_mem_info(dev *d, size_t *free_bytes, size_t *total_bytes)
{
    return dev_cpu_vtbl.mem_info(d, free_bytes, total_bytes);
}

const dev_vtbl dev_cpu_guarded_vtbl = {
    "cpu", "mmap", guard_open, guard_close, guard_alloc, guard_free, guard_copy, guard_memset,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, /* synchronous: streams and events are tokens */
    guard_mem_info, dev_guard_owns, NULL, NULL,
};
