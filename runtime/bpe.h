/* bpe.h — GPT-2's byte-level BPE tokenizer (internal to libmesh).
 *
 * Reads OpenAI's two files: `encoder.json` (a JSON object mapping each
 * token's text to its id; 50,257 tokens, `<|endoftext|>` = 50256) and
 * `vocab.bpe` (`#version: 0.2`, then one merge `a b` per line in rank
 * order). Token texts are written in GPT-2's byte-level alphabet, where
 * every byte is one printable code point (space is U+0120 'Ġ'); the loader
 * turns them back into raw bytes, so the tokenizer works on bytes and ids.
 *
 * Encoding: the text (UTF-8) is split by GPT-2's pre-tokenizer pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2 with Unicode properties); each piece starts as one token per byte
 * and the adjacent pair with the lowest merge rank is merged until no pair
 * has a rank. Decoding concatenates the tokens' bytes.
 */
#ifndef MESH_BPE_H
#define MESH_BPE_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

typedef struct mesh__bpe mesh__bpe;

/* Loads encoder.json and vocab.bpe. On failure returns NULL with a message
 * naming the file (and line:col for a syntax error) in err. */
mesh__bpe *mesh__bpe_load(const char *encoder_path, const char *merges_path, char *err,
                          size_t errn);

/* The same from memory; the names are used in messages only. */
mesh__bpe *mesh__bpe_load_mem(const char *encoder, size_t encoder_len, const char *encoder_name,
                              const char *merges, size_t merges_len, const char *merges_name,
                              char *err, size_t errn);

void mesh__bpe_free(mesh__bpe *bpe);

/* Number of ids (largest id + 1). */
int mesh__bpe_vocab(const mesh__bpe *bpe);

/* Id of a token given by its raw bytes, or -1 (e.g. "<|endoftext|>"). */
int mesh__bpe_id(const mesh__bpe *bpe, const char *bytes, size_t len);

/* Encodes text, appending ids to *ids (grown with realloc; *n ids used of
 * *cap). Returns 0, or -1 with a message in err: text that is not valid
 * UTF-8 (naming the byte offset), or out of memory. */
int mesh__bpe_encode(const mesh__bpe *bpe, const char *text, size_t len, int32_t **ids,
                     size_t *n, size_t *cap, char *err, size_t errn);

/* Writes the bytes of ids[0..n) to out (at most cap bytes) and returns the
 * full length; ids outside the vocabulary decode to nothing. */
size_t mesh__bpe_decode(const mesh__bpe *bpe, const int32_t *ids, size_t n, char *out,
                        size_t cap);

#endif
