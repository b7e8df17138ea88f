/* exec.h — the plan interpreter of one CPU rank (internal to libmesh;
 * runtime/exec*.c, whose shared state is in exec_impl.h).
 *
 * Runs one rank of a plan's program (compiler/plan.h) on any dp x tp x pp
 * x ep mesh: the rank's pipeline chunks, in the order of the schedule's
 * units; a unit's forward steps in order, a layer stack's steps once per
 * iteration (each reading what its predecessor carried), its backward
 * steps in reverse; the plan's collectives over the rank's groups, split
 * from the world communicator; then the gradient sync, the global-norm
 * clip and an AdamW step at the learning rate the schedule gives, and the
 * after-optimizer gathers.
 *
 * Every buffer lives in one arena laid out by the memory plan (memplan.h),
 * the plan's own to the byte; params are initialised from (seed, global
 * name, element index of the whole param) (init.h), so every mesh
 * materialises the same model.
 *
 * Refused with a message naming what: sequence parallelism, ZeRO 2 and 3,
 * moe layers with tp, nested repeats, and a few ops (sub, mul, scale, a
 * transpose used other than as a matmul weight, GELU experts).
 */
#ifndef MESH_EXEC_H
#define MESH_EXEC_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int32_t */

#include "comm.h" /* comm */
#include "mesh.h" /* mesh_alloc_fn */
#include "plan.h" /* plan */

typedef struct mesh__exec mesh__exec;

/* Statistics of one training step. */
typedef struct mesh__step_stats {
    double loss;      /* mean over the step's micro-batches */
    double norm;      /* global gradient norm before clipping */
    double lr;        /* learning rate used */
    double loss_scale; /* the loss scale the step's backward used (1 but with fp16) */
    int skipped;      /* fp16: the gradients overflowed, the step was skipped (params and
                         AdamW unchanged) and the loss scale lowered */
    int overlapped;   /* collectives run while the rank computed (exec_overlap.c): the gradient
                         sync during backward, ZeRO-2/3's reduce-scatters, ZeRO-3's gathers */
    double overlap_ms; /* the time those collectives ran */
    double wait_ms;   /* the time the rank waited for them (what overlapping did not hide) */
    double comm_ms;   /* the time of the collectives it made in its turn (exec_comm.c) */
    double flops;     /* the model FLOPs of the nodes it ran (exec_prof.c's count) */
} mesh__step_stats;

/* Creates the executor for a plan (which must outlive it) and initialises
 * the parameters; its buffers come from alloc (NULL: mesh_alloc_default).
 * Returns NULL with a message in err for a plan it cannot run yet, or out
 * of memory. */
mesh__exec *mesh__exec_create(const plan *p, mesh_alloc_fn alloc, void *ud, char *err, size_t n);
void mesh__exec_free(mesh__exec *ex);

/* mesh__exec_create with flags. MESH__EXEC_NO_REUSE lays the arena out
 * without liveness reuse (larger than the plan's), the reference that
 * tests compare the plan's layout against. MESH__EXEC_DETERMINISTIC sums
 * the data-parallel ranks' gradients and losses one rank after another in
 * the one-rank order (mesh_set_deterministic). MESH__EXEC_CUDA trains on
 * GPU 0 (the arena in its memory, the CUDA kernels: kern.h); the plans it
 * runs so far are those of mesh__exec_gpu_supported. MESH__EXEC_GUARD
 * (tests) trains on the CPU with the arena on the guarded device
 * (device.h): host code that touches it but through a copy, a kernel or a
 * collective faults, so the CPU checks the discipline a GPU needs; any
 * mesh without tp and moe (whose exchanges are host code yet). */
enum {
    MESH__EXEC_NO_REUSE = 1u,
    MESH__EXEC_DETERMINISTIC = 2u,
    MESH__EXEC_CUDA = 4u,
    MESH__EXEC_GUARD = 8u,
    MESH__EXEC_NO_OVERLAP = 16u, /* the gradient sync after backward, not during it (exec_overlap.c) */
    MESH__EXEC_NO_BUCKETS = 32u, /* tests: one collective per param, not per bucket (exec__bucketed) */
    MESH__EXEC_SLOW_QUEUE = 64u, /* tests: the communication queue waits 0.2 ms before each call, so that a
                                    missing wait for one reads stale data every time */
    MESH__EXEC_NO_FUSE = 128u,   /* tests: every matmul, bias add and GELU at its own node (find_fusions) */
    MESH__EXEC_CPU16 = 256u,     /* tests: a bf16 or fp16 plan on the CPU in 2-byte storage, a GPU's
                                    layout (kern_cpu16.c) */
    MESH__EXEC_PROFILE = 512u    /* the op profile (mesh_set_profile; exec_prof.c) */
};
mesh__exec *mesh__exec_create_flags(const plan *p, mesh_alloc_fn alloc, void *ud, unsigned flags, char *err,
                                    size_t n);

/* The executor of rank `rank` of a plan of several ranks, over world (a
 * communicator of host buffers of the plan's world size, not owned; NULL
 * for one rank) and dworld (the same ranks' communicator of device
 * buffers, NCCL's on GPUs, not owned; NULL: world moves both), on GPU
 * `gpu` with MESH__EXEC_CUDA. Collective:
 * every rank of the world creates its executor at once (each splits its
 * groups per mesh axis from both worlds). On failure the world is
 * aborted, so the other ranks fail too rather than wait. */
mesh__exec *mesh__exec_create_rank(const plan *p, int rank, comm *world, comm *dworld, int gpu, mesh_alloc_fn alloc,
                                   void *ud, unsigned flags, char *err, size_t n);

/* 0 if this executor runs the plan, else -1 with the reason in err (the
 * check mesh__exec_create makes before anything else). */
int mesh__exec_supported(const plan *p, char *err, size_t n);

/* The same for training on a GPU (MESH__EXEC_CUDA: a rank per GPU, fp32,
 * bf16 or fp16 storage): every plan the CPU runs. */
int mesh__exec_gpu_supported(const plan *p, char *err, size_t n);

/* Which part of each global batch this rank reads: data_rank of
 * data_ranks (dp x ep). */
void mesh__exec_data_rank(const mesh__exec *ex, int *data_rank, int *data_ranks);

/* *x becomes the mean of every data-parallel rank's x (collective over dp);
 * 0, or -2 if the collective failed. */
int mesh__exec_data_mean(mesh__exec *ex, double *x);

/* Entry k of what this rank sent per training step (the mean over the
 * steps taken): "all-reduce(tp)" and the like, or "send(pp)", its bytes
 * (each collective counted as the whole tensor of the plan's step), and
 * the plan's prediction for the rank's stage (-1 when the plan has none).
 * -1 past the last entry. */
int mesh__exec_sent(const mesh__exec *ex, int k, char *what, size_t n, double *bytes, double *planned);

/* The time per training step (the mean over the steps taken, in ms) of
 * entry k's collectives made in the rank's turn (exec_comm.c; those run
 * on a communication queue are overlap_ms'), as far as the device has
 * finished them, and how many calls a step that time is of; *untimed:
 * the calls of every entry that went untimed (the GPU EX_TIMES calls
 * behind the host). -1 past the last entry. */
int mesh__exec_comm_ms(mesh__exec *ex, int k, double *ms, double *calls, long long *untimed);
/* The same for entry k's collectives run on a communication queue
 * (overlapped: exec_marks.c), per step. -1 past the last entry. */
int mesh__exec_overlap_ms(mesh__exec *ex, int k, double *ms, double *calls);
/* What one of the kernels' options did, in words (kern_vtbl's report:
 * KERN_REPORT_GEMM_TUNING, KERN_REPORT_ATTENTION_CUDNN); -1 where the
 * kernels have none or it is off. */
int mesh__exec_kernels_report(mesh__exec *ex, int what, char *buf, size_t n);

/* Entry k of the op profile (MESH__EXEC_PROFILE), those with calls in
 * order: what ("matmul backward", "optimizer", "collectives in turn"),
 * its time per training step (the mean over the steps taken but the
 * first, in ms), calls and model GFLOP per step (mesh_profile_entry's),
 * and the steps it is the mean of. The device's work is waited for
 * first. *untimed: work that went untimed (a GPU EX_PROF_RING pairs
 * behind). -1 past the last entry, or when the profile is off or no step
 * but the first was taken. */
int mesh__exec_profile(mesh__exec *ex, int k, char *what, size_t n, double *ms, double *calls, double *gflop,
                       long long *steps, long long *untimed);

/* Why the last train step returned -2 (a collective failed). */
const char *mesh__exec_error(const mesh__exec *ex);

/* 1 once a train step or forward pass has returned -2 (a collective
 * failed: the worlds are aborted) or a device call of the rank has failed
 * (a kernel, a copy, an allocation on the GPU; mesh__exec_error says
 * which), else 0. It stays: the ranks no longer meet in the same
 * collectives, so the rank cannot go on (a train step or a forward pass
 * returns -2 at once, before it touches anything) and its worlds must be
 * aborted, not finished. */
int mesh__exec_failed(const mesh__exec *ex);

/* Tokens of one micro-batch: micro_batch x seq_len ids. */
size_t mesh__exec_batch_tokens(const mesh__exec *ex);

/* Forward only: the mean loss of one micro-batch (NaN if a collective
 * failed). */
double mesh__exec_loss(mesh__exec *ex, const int32_t *inputs, const int32_t *targets);

/* The same: the loss in *loss; 0, or -2 if a collective failed
 * (mesh__exec_error). */
int mesh__exec_forward(mesh__exec *ex, const int32_t *inputs, const int32_t *targets, double *loss);

/* One training step (1-based step number for the schedule) over the
 * plan's micro-batches: inputs and targets hold micro_batches x
 * batch_tokens ids each (this rank's part of the global batch). The loss
 * is the mean over every rank's micro-batches. Returns 0; -1 if the loss
 * or the gradient norm is not finite (the parameters are then left
 * unchanged, on every rank); -2 if a collective failed
 * (mesh__exec_error). */
int mesh__exec_train_step(mesh__exec *ex, long long step, const int32_t *inputs,
                          const int32_t *targets, mesh__step_stats *st);

/* Forward and backward of one micro-batch without an optimizer step,
 * leaving the parameters' gradients (of the mean loss) readable through
 * mesh__exec_param; returns the loss. */
double mesh__exec_grad(mesh__exec *ex, const int32_t *inputs, const int32_t *targets);

/* Parameter k (0-based, in plan order, each layer's copy separately): its
 * name (e.g. "h.1.gpt2_block.w_qkv"), elements on this rank, and this
 * rank's value and gradient (its tp slice; on a GPU, device pointers; the
 * value in the tensors' storage, the gradient fp32 always).
 * Returns -1 when k is past the last. */
int mesh__exec_param(mesh__exec *ex, int k, const char **name, size_t *n, float **value,
                     float **grad);

/* The shape of parameter k (one layer's copy), or -1. */
int mesh__exec_param_dims(const mesh__exec *ex, int k, const int64_t **dims, int *rank);

/* Parameter k whole (mesh__exec_param_numel elements, its global shape):
 * with tp the ranks' slices are gathered (collective over the tp group).
 * Returns 0, -1 past the last, -2 if a collective failed. */
size_t mesh__exec_param_numel(const mesh__exec *ex, int k);
int mesh__exec_param_get(mesh__exec *ex, int k, float *whole);
/* Parameter k from a whole array: this rank keeps its slice; -1 past the last. */
int mesh__exec_param_set(mesh__exec *ex, int k, const float *whole);

/* AdamW's moments of parameter k (as mesh__exec_param numbers them),
 * whole, into m and v (mesh__exec_param_numel elements each). With ZeRO
 * the shards are gathered over the param's data-parallel group, with tp
 * the slices over the tp group: every rank calls this for the same k. Returns 0, -1 past the last, -2 if a collective
 * failed (mesh__exec_error). */
int mesh__exec_moments_get(mesh__exec *ex, int k, float *m, float *v);

/* Sets parameter k's moments from whole arrays (with ZeRO this rank keeps
 * its shard); -1 past the last. */
int mesh__exec_moments_set(mesh__exec *ex, int k, const float *m, const float *v);

/* The rank in the plan's world, and its pipeline stage. */
int mesh__exec_rank(const mesh__exec *ex);

/* 1 when the rank's NCCL calls are ordered on its GPU's streams, so that
 * its collectives' times are the GPU's own (CUDA events), else 0. */
int mesh__exec_ordered(const mesh__exec *ex);
/* The bias adds this rank runs in one kernel with their matmul (and GELU),
 * counted once per step of the plan (a layer stack's once). */
int mesh__exec_fused(const mesh__exec *ex);
/* Device-to-host copies this rank's device has made so far. */
long long mesh__exec_host_reads(const mesh__exec *ex);
/* The host's waits for this rank's GPU so far (each a dev_stream_sync). */
long long mesh__exec_gpu_waits(const mesh__exec *ex);

/* The stream ex's kernels, copies and fills go on: on a GPU its own,
 * non-blocking (a cudaStream_t; kern_cuda.c), NULL on the CPU. */
void *mesh__exec_stream(const mesh__exec *ex);
/* This rank's waits for its communication queues' calls so far that
 * returned while the call was still running on the GPU (a deferred
 * queue's: exec_overlap.c); *waits (if not NULL): its deferred queues'
 * waits in all. */
long long mesh__exec_queue_ahead(const mesh__exec *ex, long long *waits);
/* Milliseconds this rank's compute stream has waited on the GPU for its
 * deferred queues' calls so far, as far as the GPU has got (0 without);
 * *untimed: the calls and waits not timed (their ring full: the GPU 256
 * behind the host). */
double mesh__exec_queue_stall_ms(mesh__exec *ex, long long *untimed);
int mesh__exec_stage(const mesh__exec *ex);

/* The pipeline group of host buffers (NULL with pp = 1; its rank s is stage s), this
 * rank's stage, and whether it leads the stage's ranks (dp, tp and ep
 * coordinates 0). */
comm *mesh__exec_pipeline(const mesh__exec *ex, int *stage, int *lead);
/* The world's communicator of host buffers (NULL on one rank). */
comm *mesh__exec_host_world(const mesh__exec *ex);

/* 1 when parameter k is a copy whose original another stage holds (a
 * tied weight's on the last stage). */
int mesh__exec_param_dup(const mesh__exec *ex, int k);

/* AdamW steps taken (read and restored by checkpoints). */
long long *mesh__exec_adam_steps(mesh__exec *ex);

/* fp16's loss scaler (read and restored by checkpoints): the scale (NULL
 * but in fp16) and the steps without an overflow since it last changed. */
double *mesh__exec_loss_scale(mesh__exec *ex);
long long *mesh__exec_scale_good(mesh__exec *ex);

/* Test hook: fp16 with a dynamic loss scale starts from `scale` and
 * doubles it after `interval` steps without an overflow (default 65536
 * and 2000, PyTorch's GradScaler's). */
void mesh__exec_set_scaler(mesh__exec *ex, double scale, long long interval);

/* After a forward: the logits (the loss's first input), [rows,
 * vocab_padded], in host memory (on a GPU, a copy the executor keeps);
 * NULL if the copy failed (mesh__exec_error). */
const float *mesh__exec_logits(mesh__exec *ex, int *vocab_padded);

/* Bytes of the executor's arena: parameters, gradients, AdamW's state,
 * the activations and statistics kept for backward, and the workspace, all
 * in the one allocation the memory plan lays out. */
size_t mesh__exec_bytes(const mesh__exec *ex);

/* Device bytes the kernels hold beside the arena (a GPU's cuBLASLt
 * workspace, the kernels' scratch at its largest so far, the executor's
 * own sums): the device's `held`; 0 on a CPU. */
size_t mesh__exec_kernel_bytes(const mesh__exec *ex);

/* 1 when the executor runs on a GPU (MESH__EXEC_CUDA), else 0. */
int mesh__exec_gpu(const mesh__exec *ex);

/* Bytes of bookkeeping besides the arena (names, per-tensor tables). */
size_t mesh__exec_host_bytes(const mesh__exec *ex);

/* Test hook: with on, every slot is filled with NaN before its unit's
 * forward and the shared workspace before each forward and backward, so
 * that reading memory the layout says is dead shows as NaN. */
void mesh__exec_set_poison(mesh__exec *ex, int on);

/* The learning rate of a step (1-based) under the plan's schedule. */
double mesh__exec_lr(const plan *p, long long step);

#endif
