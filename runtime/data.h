/* data.h — token shards in llm.c's format, and the byte-level tokenizer
 * (internal to libmesh).
 *
 * A shard is a 1024-byte header of 256 little-endian int32 (magic 20240520,
 * version 1, token count) followed by the tokens as uint16. Shards are
 * read with mmap and validated (magic, version, exact size, every token
 * below the model's vocabulary). Each data-parallel rank reads its own
 * slice of every global batch, deterministically, from a cursor that a
 * checkpoint can save and restore.
 */
#ifndef MESH_DATA_H
#define MESH_DATA_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint16_t */

enum { MESH_SHARD_MAGIC = 20240520, MESH_SHARD_VERSION = 1, MESH_SHARD_HEADER_INTS = 256 };

typedef struct mesh__shard {
    const uint16_t *tokens;
    size_t n;            /* tokens */
    void *map;           /* the mapping, for munmap */
    size_t map_len;
} mesh__shard;

/* Opens and validates a shard; tokens must be < vocab (0: not checked). On
 * failure returns -1 with a message naming the file in err. */
int mesh__shard_open(mesh__shard *s, const char *path, int vocab, char *err, size_t n);
void mesh__shard_close(mesh__shard *s);

/* Writes tokens as a shard (through a temporary file renamed into place). */
int mesh__shard_write(const char *path, const uint16_t *tokens, size_t n, char *err, size_t errn);

/* Byte-level tokenizer: one token per byte (vocabulary 256). */
size_t mesh__tokenize_bytes(const char *text, size_t len, int32_t *out);

/* The part of global step `step`'s batch that data-parallel rank `rank` of
 * `ranks` reads: the shard is cut into windows of `seq` tokens (each with
 * the token after it as the last target); global sequence g of the step is
 * window (step x global + g) mod windows, and rank r takes sequences
 * r x per .. (r + 1) x per - 1, per = global / ranks. Writes
 * inputs[per x seq] and targets[per x seq] (the inputs shifted by one). */
void mesh__batch(const mesh__shard *s, long long step, int global, int ranks, int rank, int seq,
                 int32_t *inputs, int32_t *targets);

#endif
