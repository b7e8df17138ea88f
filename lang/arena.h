/* arena.h — bump allocator for the front end.
 *
 * The AST, interned strings and checker values of one program live in one
 * arena and are freed at once (ggml_context style). Allocation failure is
 * reported by a NULL return; callers treat it as MESH out-of-memory.
 */
#ifndef MESH_ARENA_H
#define MESH_ARENA_H

#include <setjmp.h> /* jmp_buf */
#include <stddef.h> /* size_t */

typedef struct arena arena;

arena *arena_new(void);
void arena_free(arena *a);                 /* NULL is a no-op */
void arena_on_oom(arena *a, jmp_buf *jb);  /* NULL: return NULL instead */
void *arena_alloc(arena *a, size_t n);     /* zeroed, 16-byte aligned */
char *arena_strndup(arena *a, const char *s, size_t n);
char *arena_strdup(arena *a, const char *s);
char *arena_printf(arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
size_t arena_used(const arena *a);

#endif
