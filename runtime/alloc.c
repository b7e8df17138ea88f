/*
 * alloc.c: the default allocator hook, mesh_alloc_default.
 *
 * It follows the mesh_alloc_fn contract in mesh.h: new_size 0 frees, and a
 * failed resize leaves the old block valid (which realloc guarantees).
 */
#include <stdlib.h> /* defines: realloc, free */

#include "mesh.h" /* defines: mesh_alloc_default */

void *mesh_alloc_default(void *ud, void *ptr, size_t old_size, size_t new_size)
{
    (void)ud;
    (void)old_size;
    if (new_size == 0) {
        /* realloc(ptr, 0) is implementation-defined; free explicitly. */
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}
