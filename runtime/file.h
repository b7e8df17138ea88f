/* file.h — reading a whole file (internal to libmesh). */
#ifndef MESH_FILE_H
#define MESH_FILE_H

#include <stddef.h> /* size_t */

/* Reads the file at path into a malloc'd buffer (one spare byte, NUL) and
 * sets *len. On failure returns NULL with "cannot open 'PATH': why" or
 * "cannot read 'PATH'" (or "out of memory") in err. */
char *mesh__read_file(const char *path, size_t *len, char *err, size_t errn);

#endif
