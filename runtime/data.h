/* data.h — token shards in llm.c's format (internal to libmesh; the public
 * streams over them are mesh_data_* in mesh.h, implemented in data.c).
 *
 * A shard is a 1024-byte header of 256 little-endian int32 (magic 20240520,
 * version 1, token count) followed by the tokens as uint16. Shards are
 * read with mmap and validated (magic, version, exact size, every token
 * below the model's vocabulary).
 */
#ifndef MESH_DATA_H
#define MESH_DATA_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint16_t, int32_t */

#include "mesh.h" /* mesh_status */

enum { MESH_SHARD_MAGIC = 20240520, MESH_SHARD_VERSION = 1, MESH_SHARD_HEADER_INTS = 256 };

typedef struct mesh__shard {
    const uint16_t *tokens;
    size_t n;            /* tokens */
    void *map;           /* the mapping, for munmap */
    size_t map_len;
} mesh__shard;

/* Opens and validates a shard; tokens must be < vocab (0: not checked).
 * On failure returns MESH_ERR_IO (cannot open or map), MESH_ERR_PARSE (not
 * a shard: magic, version, size) or MESH_ERR_CHECK (a token outside the
 * vocabulary), with a message naming the file in err. */
mesh_status mesh__shard_open(mesh__shard *s, const char *path, int vocab, char *err, size_t n);
void mesh__shard_close(mesh__shard *s);

/* Writes ids (each in 0..65535) as a shard, through a temporary file
 * renamed into place. Returns MESH_OK, MESH_ERR_INVALID_ARG (an id out of
 * range, too many ids) or MESH_ERR_IO, with a message in err. */
mesh_status mesh__shard_write(const char *path, const int32_t *ids, size_t n, char *err, size_t errn);

#endif
