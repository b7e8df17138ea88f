/* arena.c — chunked bump allocator (see arena.h). */
#include "arena.h"

#include <stdarg.h> /* va_list */
#include <stdint.h> /* uintptr_t */
#include <stdio.h>  /* vsnprintf */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* memcpy, memset */

enum { ARENA_CHUNK = 64 * 1024, ARENA_ALIGN = 16 };

typedef struct chunk {
    struct chunk *prev;
    size_t size, used;
    /* data follows, aligned */
} chunk;

struct arena {
    chunk *top;
    size_t total;
    jmp_buf *oom;
};

static size_t chunk_header(void) {
    return (sizeof(chunk) + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

arena *arena_new(void) {
    arena *a = calloc(1, sizeof *a);
    return a;
}

void arena_free(arena *a) {
    if (!a) return;
    chunk *c = a->top;
    while (c) {
        chunk *p = c->prev;
        free(c);
        c = p;
    }
    free(a);
}

void *arena_alloc(arena *a, size_t n) {
    n = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (n == 0) n = ARENA_ALIGN;
    chunk *c = a->top;
    if (!c || c->size - c->used < n) {
        size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = malloc(chunk_header() + size);
        if (!c) {
            if (a->oom) longjmp(*a->oom, 1);
            return NULL;
        }
        c->prev = a->top;
        c->size = size;
        c->used = 0;
        a->top = c;
    }
    void *p = (char *)c + chunk_header() + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

char *arena_strndup(arena *a, const char *s, size_t n) {
    char *p = arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *arena_strdup(arena *a, const char *s) {
    return arena_strndup(a, s, strlen(s));
}

char *arena_printf(arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *p = arena_alloc(a, (size_t)n + 1);
    if (!p) return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void arena_on_oom(arena *a, jmp_buf *jb) { a->oom = jb; }

size_t arena_used(const arena *a) { return a->total; }
