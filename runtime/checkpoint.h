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
 * folder, flushes it to disk, renames it into place (a step saved again:
 * swapped with the old folder by one rename, RENAME_EXCHANGE, where the
 * system has it) and then rewrites `latest` through a renamed temporary
 * file, so a crash at any point leaves the previous checkpoint whole and
 * `latest` pointing at it.
 */
#ifndef MESH_CHECKPOINT_H
#define MESH_CHECKPOINT_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* uint64_t */

#include "exec.h" /* mesh__exec */

/* A job's hold on its checkpoint folder: DIR/.lock, an empty file locked
 * (a POSIX record lock, which the system drops when the process ends,
 * however it ends; F_GETLK names the holding process to a job refused,
 * and the folder's files stay the same bytes run to run). Rank 0 takes it at its first save in
 * DIR and keeps it until mesh__ckpt_unlock (the context's end). A save by
 * another process into a folder held so is refused, naming the holder:
 * two jobs saving the same step in one folder would replace each other's
 * files as they write them. Where the file system has no locks, saves go
 * on without one. The lock is the process's: two contexts of one process
 * (an embedding program's) do not exclude each other. dir NULL: none held. */
typedef struct mesh__ckpt_lock {
    char *dir;
    int fd;
} mesh__ckpt_lock;

void mesh__ckpt_unlock(mesh__ckpt_lock *lock);

/* Takes dir's lock before a first save (mesh_checkpoint_claim): rank 0
 * makes the folder and locks it; collective over the ranks, each getting
 * rank 0's result. 0, or -1 with a message (-2: the ranks' world failed). */
int mesh__ckpt_claim(mesh__exec *ex, const char *dir, mesh__ckpt_lock *lock, char *err, size_t n);

/* Saves the executor's parameters and optimizer state after `step` steps,
 * and the data cursor *data_pos unless data_pos is NULL. With several
 * ranks it is collective (ZeRO's shards of the optimizer state are
 * gathered) and rank 0 writes. Returns 0, or -1 with a message in err
 * (-2: a collective failed, or a step before did: mesh__exec_failed, and
 * nothing is written). lock: rank 0's hold on dir (NULL: none taken). */
int mesh__ckpt_save(mesh__exec *ex, const char *dir, long long step, const uint64_t *data_pos,
                    mesh__ckpt_lock *lock, char *err, size_t n);

/* Loads a checkpoint into the executor: `path` is a step folder, or a
 * checkpoint folder whose `latest` names one. With optim 0 only the
 * parameters are read (sampling) and *step is 0. Sets *step, and
 * *data_pos (when not NULL) to the saved data cursor, or UINT64_MAX when
 * the checkpoint has none. Returns 0, or -1 with a message naming the file
 * (a missing or mis-shaped tensor, a truncated or corrupted file). */
int mesh__ckpt_load(mesh__exec *ex, const char *path, int optim, long long *step, uint64_t *data_pos,
                    char *err, size_t n);

#endif
