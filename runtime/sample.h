/* sample.h — generating tokens from a model (internal to libmesh; the
 * public calls are mesh_next_logits and mesh_sample_next in api.c).
 *
 * The plan's shapes are fixed ([micro_batch, seq_len] tokens), so a step
 * runs the forward on the last seq_len tokens in row 0 of the batch (the
 * other rows and the positions after the text are padding, which causal
 * attention never lets the text see) and reads the logits at the text's
 * last position.
 */
#ifndef MESH_SAMPLE_H
#define MESH_SAMPLE_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t, uint64_t */

#include "exec.h" /* mesh__exec */

/* The logits of the token after ids[0..n) (n >= 1), vocab_padded floats
 * (set) in the executor's buffers, valid until its next forward. in and
 * tg hold mesh__exec_batch_tokens(ex) ids of scratch each. */
const float *mesh__next_logits(mesh__exec *ex, const int32_t *ids, size_t n, int seq, int32_t *in,
                               int32_t *tg, int *vocab_padded);

/* A token drawn from row[0..vocab): softmax of the logits divided by
 * temperature (0: the most likely token), with a Philox uniform for
 * (key, counter). */
int32_t mesh__sample_draw(const float *row, int vocab, double temperature, uint64_t key, uint64_t counter);

#endif
