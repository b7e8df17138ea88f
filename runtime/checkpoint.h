/* checkpoint.h — saving and restoring training state (internal to libmesh).
 *
 * A checkpoint is a folder DIR/step-NNNNNNNN holding two safetensors files
 * (8-byte little-endian header length, a JSON header, then the data):
 *   model.safetensors  every parameter, F32, by its global name
 *                      ("h.3.gpt2_block.w_qkv"), with its global shape;
 *   optim.safetensors  AdamW's moments "NAME.m" and "NAME.v", and in
 *                      __metadata__ the step, AdamW's step count and, when
 *                      the run reads a mesh_data stream, its cursor
 *                      ("data_position": global sequences read).
 * DIR/latest names the newest folder. A save writes a hidden temporary
 * folder, flushes it to disk, renames it into place and then rewrites
 * `latest` through a renamed temporary file, so a crash at any point
 * leaves the previous checkpoint whole and `latest` pointing at it.
 */
#ifndef MESH_CHECKPOINT_H
#define MESH_CHECKPOINT_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */

#include "exec.h" /* mesh__exec */

/* Saves the executor's parameters and optimizer state after `step` steps,
 * and the data cursor *data_pos unless data_pos is NULL. With several
 * ranks it is collective (ZeRO's shards of the optimizer state are
 * gathered) and rank 0 writes. Returns 0, or -1 with a message in err
 * (-2: a collective failed, or a step before did: mesh__exec_failed, and
 * nothing is written). */
int mesh__ckpt_save(mesh__exec *ex, const char *dir, long long step, const uint64_t *data_pos, char *err,
                    size_t n);

/* Loads a checkpoint into the executor: `path` is a step folder, or a
 * checkpoint folder whose `latest` names one. With optim 0 only the
 * parameters are read (sampling) and *step is 0. Sets *step, and
 * *data_pos (when not NULL) to the saved data cursor, or UINT64_MAX when
 * the checkpoint has none. Returns 0, or -1 with a message naming the file
 * (a missing or mis-shaped tensor, a truncated or corrupted file). */
int mesh__ckpt_load(mesh__exec *ex, const char *path, int optim, long long *step, uint64_t *data_pos,
                    char *err, size_t n);

#endif
