/* exec_impl.h — what the executor's files share (internal to libmesh):
 * the executor's state and the functions that cross its files.
 *
 *   exec.c         checking a plan, laying the arena out, joining the mesh
 *   exec_mem.c     where a tensor's value, gradient and statistics live
 *   exec_ops.c     one op forward and backward, through the device's kernels (kern.h)
 *   exec_step.c    the program's phases, collectives, pipeline, a step
 *   exec_params.c  params in the whole param, ZeRO shards, checkpoints' views
 *   exec_overlap.c the collectives overlapped with compute: what is issued when
 *   exec_marks.c   their communication queues' marks, and their times on a GPU
 *   exec_comm.c    the collectives made in the rank's turn: ordered, timed
 *   exec_loss.c    the loss's terms, on the device until the step reads them
 *   exec_prof.c    the op profile: each kind of work's time in a training step
 */
#ifndef MESH_EXEC_IMPL_H
#define MESH_EXEC_IMPL_H

#include <pthread.h> /* pthread_mutex_t */
#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t, uint64_t */

#include "comm.h"    /* comm */
#include "comm_async.h" /* comm_async */
#include "device.h"  /* dev */
#include "exec.h"    /* mesh__exec */
#include "kcpu.h"    /* kcpu_precision */
#include "kern.h"    /* kern, kern_moe_dims */
#include "memplan.h" /* memplan, mem_buf */

/* A moe node's geometry; its routing lives at the start of its aux memory
 * (route_bytes: the memory plan's room, the device's layout within). */
typedef struct ex_moe {
    kern_moe_dims g;      /* N, D, E, K, C */
    int F;                /* the experts' hidden width on this rank */
    int P, El;            /* the ep group's ranks, and the experts each holds (E / P) */
    size_t route_bytes;
} ex_moe;

/* A matmul whose only consumer is the bias add right after it runs as one
 * kernel with it (x @ w + bias: cuBLASLt's bias epilogue on a GPU), and a
 * GELU right after that bias add with them (the GELU epilogue, which also
 * writes the bias add's value, the GELU's backward input): `into` is the
 * bias add that computes this matmul or GELU (-1: computed at its own
 * node); `gelu` the GELU a bias add computes (-1: none). Recomputation
 * runs the GELU at its own node. In the backward, a matmul whose input is
 * a GELU's value, read by it alone, runs the GELU's backward too when the
 * GELU's is the next backward step (cuBLASLt's DGELU epilogue: the
 * product's gradient is never stored): `dgelu` is that GELU (-1: none),
 * `dgelu_by` the matmul that runs a GELU's backward (-1: its own node).
 * A residual add and the layernorm or rmsnorm of the next step that reads
 * it (kern.add_norm_forward: the sum read back once, not from memory):
 * `norm` is the norm an add computes (-1: none), and the norm's `into`
 * that add; recomputation runs the norm at its own node. */
typedef struct ex_fuse {
    int into, gelu;
    int dgelu, dgelu_by;
    int norm;
} ex_fuse;

/* One term of the loss: coef x the device float in slot `slot`, or coef
 * itself (slot -1, a value the host has), or a micro-batch's end
 * (EX_LOSS_END). */
enum { EX_LOSS_SLOTS = 256, EX_LOSS_TERMS = 512, EX_LOSS_END = -2 };
typedef struct ex_lterm {
    int slot;
    double coef;
} ex_lterm;

/* A communication queue's marks (exec_marks.c): per call in flight, an
 * event recorded on the compute stream when the call is queued, which the
 * queue's thread waits for (through a device handle of its own) before
 * running the call: on a GPU, the kernels that write its buffers have
 * run. Deferred (ordered NCCL calls), the queue's stream waits for it
 * instead, and the compute stream for the call's done event after the
 * rank's wait for its ticket. Slot ticket % EX_MARKS
 * (comm_async_hooks.marks). */
enum { EX_MARKS = 64, EX_TIMES = 256 };
/* Entries of mesh_context_sent's table a collective's time is kept by:
 * kind x 4 + axis (shard_step_kind; the pipeline's transfers: kind
 * STEP_SLICE, axis 0); EX_ENTRIES: none (a call outside a training step). */
enum { EX_ENTRIES = (STEP_SLICE + 1) * 4 };
typedef struct ex_marks {
    struct mesh__exec *ex;
    dev *dev; /* the queue's thread's handle on the executor's device */
    dev_event *ev[EX_MARKS];
    dev_event *done[EX_MARKS]; /* deferred: recorded after each call on the queue's stream */
    double timeout; /* the longest wait for a mark (MESH_COLLECTIVE_TIMEOUT_S) */
    int deferred;   /* the queue's NCCL calls ordered on the GPU (comm_async_hooks.deferred): with ex->ordered */
    long long joins, ahead; /* deferred: the rank's waits, and those that returned with the call still
                               running on the GPU */
    /* Deferred, the GPU's own times, from timed events, in rings of
     * EX_TIMES: each call's on the queue's stream, from start (recorded
     * once the stream's wait for the mark is over) to end; and each of the
     * compute stream's waits for a call (joined), from pre to post. A
     * slot's times are added in (harvested) once the GPU has finished
     * them; a call or a wait that finds its ring full (the GPU EX_TIMES
     * behind the host) goes untimed rather than wait. */
    dev_event *start[EX_TIMES], *end[EX_TIMES];
    dev_event *pre[EX_TIMES], *post[EX_TIMES];
    pthread_mutex_t mu; /* calls_made, calls_timed, at, ms, n: the queue's thread records, either harvests */
    int mu_made;
    int timing;               /* (the queue's thread) the call in hand has its start recorded */
    long long calls_made, calls_timed; /* calls whose start and end are recorded; whose times are added in */
    short entry[EX_MARKS];    /* each call's entry (EX_ENTRIES), set as it is queued (mark) from next_entry */
    short next_entry;         /* (the rank's thread) the entry of the call it queues next */
    short at[EX_TIMES];       /* deferred: each timed slot's entry */
    double t0;                /* (the queue's thread) the host's clock as the call in hand began */
    double ms[EX_ENTRIES + 1];   /* by entry: the calls' time, the GPU's (harvested) or else the host's */
    long long n[EX_ENTRIES + 1]; /* the calls whose times ms has */
    long long joins_made, joins_timed; /* (the rank's thread only) the same for the waits */
    double stall_ms;          /* the compute stream's time waiting for calls, harvested */
    long long untimed_calls;  /* calls that found their ring full (under mu; the waits that did:
                                 joins - joins_made) */
} ex_marks;

/* The collectives the rank makes in its turn, timed during a training
 * step by entry of mesh_context_sent's table (exec_comm.c): ms[kind x 4 +
 * axis] (shard_step_kind; the pipeline's transfers: kind STEP_SLICE, axis 0). Ordered
 * on a GPU, each call's time comes from the timed events start and end in
 * a ring of EX_TIMES, added in once the GPU has finished them
 * (exec__harvest_times); else from the host's clock. */
typedef struct ex_turns {
    dev_event *start[EX_TIMES], *end[EX_TIMES];
    short entry[EX_TIMES];          /* each slot's entry: kind x 4 + axis */
    long long made, timed, untimed; /* calls recorded, added in, found the ring full */
    int kind, axis, slot;           /* the call in hand: its entry (kind -1: untimed), its slot (-1: the host's) */
    double t0;                      /* the host's clock as it began */
    double ms[(STEP_SLICE + 1) * 4];     /* by entry, kind x 4 + axis */
    long long calls[(STEP_SLICE + 1) * 4]; /* the calls whose times ms has */
} ex_turns;

/* The op profile (exec_prof.c; MESH__EXEC_PROFILE): the time of a
 * training step's work by entry: op x phase (EX_PROF_FWD, _BWD,
 * _RECOMPUTE) for each node's kernels, then the optimizer (the gradient's
 * norm and AdamW) and the collectives in the rank's turn (with the
 * pipeline's transfers). On a GPU from timed events on the compute
 * stream in rings of EX_PROF_RING pairs, added in once the GPU has
 * finished them (a pair that finds its ring full goes untimed); else the
 * host's clock around the calls. The first step (its warm-up) is left
 * out. */
enum { EX_PROF_FWD, EX_PROF_BWD, EX_PROF_RECOMPUTE };
enum {
    EX_PROF_OPTIMIZER = G_OP_COUNT * 3,
    EX_PROF_COMM,
    EX_PROF_ENTRIES,
    EX_PROF_RING = 4096
};
typedef struct ex_prof {
    int on;
    dev_event **start, **end; /* a GPU's rings of EX_PROF_RING */
    short *at;                /* each slot's entry */
    long long made, timed, untimed;
    int depth;                /* begin/end nesting: the outermost is timed */
    int entry, slot;          /* the work in hand: its entry (-1: untimed), its slot (-1: the host's) */
    double t0;                /* the host's clock as it began */
    double ms[EX_PROF_ENTRIES];
    long long calls[EX_PROF_ENTRIES];
    double flops[EX_PROF_ENTRIES]; /* model FLOPs of the timed brackets */
} ex_prof;

struct mesh__exec {
    const plan *p;
    /* where it trains: the arena is device memory (host memory on the CPU,
     * from the allocator hook), every kernel runs through `kern`, and what
     * the host writes or reads in the arena goes through exec__fill,
     * exec__to_dev and exec__to_host */
    dev *dev;
    kern kern;
    int gpu;             /* dev is a GPU */
    int ordered;         /* the rank's NCCL calls are ordered on the compute stream (comm_nccl_order):
                            no wait for the GPU before them */
    int host_arena;      /* the arena is plain host memory (the CPU; not a GPU, nor the guarded
                            test device, MESH__EXEC_GUARD) */
    int esize;           /* bytes of a float element in the arena: 4, or 2 (bf16 on a GPU; the CPU
                            keeps bf16 and fp16 values in fp32 words); a param's gradient is fp32
                            always (memplan.h) */
    int dev_failed;      /* a device call failed: ex->error says which; the step fails */
    int failed;          /* a train step or forward pass returned -2: no more (mesh__exec_failed) */
    float *logits_host;  /* gpu: the logits copied back for mesh__exec_logits */
    memplan mp;          /* the layout, in fp32 */
    const mem_stage *ms; /* this stage's sizes */
    unsigned char *arena; /* the one allocation: ms->total bytes */
    /* byte offsets of the regions in the arena */
    int64_t grads_at, optim_at, slots_at, pinned_at, shared_at, recompute_at;
    int64_t gathered_at; /* zero >= 2: the full gradients staged before their reduce-scatter
                            (ms->zfixed + ms->zlayer), then with zero = 3 the params gathered
                            whole (ms->zfixed + 2 ms->zlayer) */
    int64_t gstage_at;   /* mixed precision: an op's contribution to its params' fp32 gradients,
                            staged (ms->gstage bytes, exec__gstage_begin) */
    int64_t comm_at;     /* the communication buffer: ms->comm bytes */
    int gst_n;           /* the op whose backward runs stages these params' gradients: exec__gptr */
    int gst_id[GRAPH_MAX_IN];        /* gives gst_buf[k] for param gst_id[k] */
    float *gst_buf[GRAPH_MAX_IN];    /* (ex->numel[gst_id[k]] elements) */
    int gst_it;                      /* the iteration (the params' copies) */
    size_t *cnumel;      /* per tensor: elements of its value as its consumers read it (after its
                            forward conversion over tp, if any: sequence parallelism) */
    signed char *step_part; /* per plan step of the forward and backward: the part of a unit it
                               runs in (MEM_PART_*), by its place in the program */
    int64_t part_at[3];  /* a slot's parts */
    int slot;            /* the slot of the unit being run */
    int *slot_of;        /* per micro-batch: its slot while in flight */
    char *slot_busy;     /* per slot */
    int n;               /* tensors */
    size_t *numel;       /* per tensor: elements of one iteration's value on this rank */
    int64_t (*ld)[GRAPH_MAX_RANK]; /* per tensor: its dims on this rank (tp and ep splits applied) */
    int *iters;          /* per tensor: iterations of its region (1 outside) */
    int *zero_by;        /* per tensor: the node whose backward starts its gradient
                            (its last consumer in its segment, or itself), -1 if none */
    int *params;         /* tensor ids of the params */
    int n_params;
    char ***names;       /* per param tensor: its iterations' global names */
    float **gbufs;       /* the gradients this rank updates, for the global norm: per param
                            tensor (all copies) without ZeRO, per copy its shard with it */
    size_t *gsizes;      /* and their elements */
    double *gss;         /* and their sums of squares, each step */
    kern_adamw *adam;    /* AdamW's tensors, one a gradient buffer (kern_vtbl.adamw_many), filled each step */
    char *gsplit;        /* and the sum of squares each adds to (exec__optimizer_shards) */
    int n_gbufs;
    size_t *shard;       /* per param tensor: elements of each copy's ZeRO shard (all without) */
    size_t *opt_at;      /* per param tensor: where its first copy's moments start in m and v */
    size_t opt_elems;    /* elements of m (and of v) on this rank */
    int zero;            /* ZeRO >= 1: each param's optimizer state is sharded over its
                            data-parallel group (exec__zcomm) */
    int tokens_in, targets_in; /* the input tensors */
    int stack;           /* the layer stack's region, -1 if none */
    double dloss;        /* seed of the backward: 1 / micro-batches (times the loss scale) */
    /* mixed precision (bf16, fp16): values and gradients are kept rounded
     * to the plan's precision in fp32 words (exec__round after every op and
     * collective), the optimizer updates fp32 masters (exec__master) */
    kcpu_precision prec;
    double loss_scale;   /* fp16: the backward's seed is scaled by it; 1 otherwise */
    int scale_dynamic;   /* fp16 with loss_scale = dynamic: halved on an overflow, doubled after
                            scale_interval steps without one */
    long long scale_good; /* steps since the last overflow or growth */
    long long scale_interval;
    ex_moe **moe;        /* per tensor: moe layers' geometry, NULL for others */
    ex_fuse *fuse;       /* per tensor: ops computed by one kernel (exec.c: find_fusions) */
    int n_fused;         /* the bias adds that run with their matmul, and the GELUs whose
                            backward runs with a matmul's */
    /* the loss's terms, on the device until the step reads them (exec_loss.c) */
    float *lslots;       /* [EX_LOSS_SLOTS + 1] device floats the kernels write */
    int n_lslots, n_lterms;
    ex_lterm lterms[EX_LOSS_TERMS];
    double lacc, lcur;   /* the sum so far, and the current micro-batch's */
    int loss_read;       /* the loss tensor's value is read by another op */
    int loss_terms;      /* the loss is the sum of the plan's cross-entropies (exec.c: loss_of_terms):
                            their means are its terms, the adds' values not read */
    int recomputing;     /* running forward steps again in a backward */
    int grads_follow;    /* this forward's backward follows (a training step, mesh__exec_grad): the
                            loss's cross-entropy writes its logits' gradient over them
                            (mem_buf.grad_in_value) */
    int poison;          /* test hook: dead memory is filled with NaN (mesh__exec_set_poison) */
    long long adam_t;    /* AdamW steps taken */
    size_t host_bytes;   /* bookkeeping allocated besides the arena */
    int rank;            /* in the plan's world */
    int coord[4];        /* on each axis: dp, tp, pp, ep */
    comm *axis[4];       /* this rank's group on each axis of size > 1, else NULL */
    comm *world;         /* the world's communicator for device buffers (not owned), NULL on one rank */
    /* the host twins of world, axis, data and tied: the groups that move
     * host buffers (the exact sums of the loss and the norm, init and
     * checkpoints, the chain's loss). The same handles, unless the device's
     * communicator takes device buffers only (NCCL; the checked one of the
     * guarded device or of GPUs sharing a host world): then split from the
     * host world and owned (host_own) */
    comm *hworld, *haxis[4], *hdata, *htied;
    int host_own;
    comm *checked;       /* the checked world over the host one, staged through host memory (the
                            guarded device; GPUs without NCCL, MESH_GPU_SHARED), owned, or NULL */
    int data_ranks;      /* ranks the global batch is split over: dp x ep */
    /* pipeline: this rank's stage runs chunk `stage` (one chunk per stage) */
    int stage, last_stage;
    int chunk, chunks;   /* the chunk being run (of the stage's: stage, stage + pp, ...), and pp x v */
    int first_layer, n_layers; /* the chunk's iterations of the stack */
    int *copies;         /* per param tensor: the copies this stage holds (0: none) */
    comm *tied;          /* the first and the last stage, for a param both use (pp > 1) */
    comm *data;          /* dp x ep: the ranks the batch is split over, a dense param's data-parallel
                            group (axis[0] when ep = 1; owned when ep > 1) */
    /* the gradient sync overlapped with backward (exec_overlap.c) */
    comm *ov_comm[2];    /* the data-parallel groups (dense params', experts') */
    comm_async *ov_q[2]; /* and their queues; NULL: not overlapped */
    ex_marks ov_mark[2]; /* and their marks */
    int *ov_at;          /* per plan step: where its copies' flags start in ov_issued, -1: never early */
    signed char *ov_parts; /* per plan step outside the stack: the parts whose backward adds to its param */
    char *ov_issued;     /* per (early step, copy): issued this step */
    size_t ov_n;
    int ov_last;         /* running the last backward of its chunk this step: gradients finish */
    int ov_step_calls;   /* calls issued during this step's backward */
    int no_buckets;      /* MESH__EXEC_NO_BUCKETS */
    float **bk_bufs;     /* a bucket's call: 2 x steps buffers and their sizes (exec__bucket_call) */
    size_t *bk_n;
    long *pf_ticket;     /* ZeRO-3 prefetch, per plan step and iteration parity: the gather in
                            flight's ticket */
    int *pf_it;          /* and its iteration (-1: none in flight, -2: a step never prefetched) */
    int pf_step_calls;   /* gathers prefetched this step */
    struct ex_rs {        /* ZeRO-2/3: the reduce-scatters queued in backward, not yet added to their
                             shards (rs_n, in issue order) */
        int node, it;
        long ticket;
        comm_async *queue;
    } *rs;
    int rs_n, rs_cap;
    int rs_step_calls;   /* reduce-scatters queued this step */
    long ag_fixed[2];    /* ZeRO-1/2: per queue, the last ticket of the updated params' gathers outside
                            the stack, issued after AdamW and waited for by the next forward */
    long (*ag_layer)[2]; /* and per layer copy of the stage (ag_layers of them) */
    int ag_layers;
    int ag_pending;      /* gathers issued and not all waited for */
    int ag_step_calls;   /* gathers queued after this step's AdamW */
    int ov_failed;       /* the last step failed: its calls in flight are abandoned at free */
    double ov_busy0;     /* the queues' busy seconds when the step began */
    double ov_stall0;    /* deferred: the compute stream's seconds waiting for them, then */
    double ov_wait_s;    /* seconds the rank waited for its queues this step */
    char error[1536];    /* why the last step failed */
    int counting;        /* in a training step: bytes sent are counted */
    double flops;        /* the model FLOPs of the nodes run in the training step so far
                            (exec__prof_begin_node; recomputation not counted) */
    int chain;           /* deterministic: the data-parallel ranks add their gradients one after
                            another, in the one-rank order (MESH__EXEC_DETERMINISTIC) */
    double sent[STEP_SLICE][4], sent_p2p; /* bytes sent by kind and axis, and by pipeline sends */
    ex_turns turns;      /* the in-turn collectives' times (exec_comm.c) */
    ex_prof prof;        /* the op profile (exec_prof.c) */
    long long steps;     /* training steps counted */
    mesh_alloc_fn alloc; /* the context's allocator hook */
    void *ud;
};

/* Calls fn(ctx, local, whole, len) for each contiguous run of param id's
 * elements on the rank `rt` of its tp group and `re` of its ep group (an
 * expert's weights): `len` elements at `local` in the rank's slice are at
 * `whole` in the whole param. */
typedef void (*run_fn)(void *ctx, size_t local, size_t whole, size_t len);

/* Initialising a param's slice: the whole param's values at its indices. */
typedef struct init_ctx {
    float *w;
    uint64_t key;
    float std;
} init_ctx;

/* exec_mem.c */
int64_t exec__last_dim(const plan_tensor *t);

/* Device memory: memset, and copies into and out of the arena (on the
 * CPU, memset and memcpy). A failure is recorded in ex->error and
 * ex->dev_failed (the step then fails); 0, or -1. to_host waits for the
 * device. */
int exec__fill(mesh__exec *ex, void *p, int byte, size_t bytes);
int exec__to_dev(mesh__exec *ex, void *dst, const void *src, size_t bytes);
int exec__to_host(mesh__exec *ex, void *dst, const void *src, size_t bytes);

/* The same for n float elements of the arena (ex->esize bytes each: bf16
 * ones are converted, rounding to nearest even on the way in), and for
 * one (a scalar tensor: the loss, its gradient). */
int exec__floats_to_dev(mesh__exec *ex, void *dst, const float *src, size_t n);
int exec__floats_to_host(mesh__exec *ex, float *dst, const void *src, size_t n);

/* Element k of the arena's float array p. */
float *exec__at(const mesh__exec *ex, float *p, size_t k);

/* A kernel call that failed (kern's message, with the rank and what it
 * ran for): recorded as a device failure; returns -1. */
int exec__kern_failed(mesh__exec *ex, const char *what);

/* Kernel fn of the rank's table on its arguments: its return code. The
 * guarded test device opens its memory around it (dev_guard). */
#define EXEC_KERN(ex, fn, ...) \
    (dev_guard((ex)->dev, 1), exec__kern_done((ex), (ex)->kern.v->fn(&(ex)->kern, __VA_ARGS__)))
int exec__kern_done(mesh__exec *ex, int rc); /* closes the guard; returns rc */

/* A collective or transfer (call) on arena memory, through a device
 * communicator (NCCL's; on the guarded device and GPUs sharing a host
 * world, a checked one staged through host memory, so the guard stays
 * closed). NCCL's calls are ordered on the compute stream (ex->ordered:
 * the GPU runs them between the kernels before and after, and the host
 * goes on); otherwise, on a GPU, the kernels before the call are waited
 * for first (MESH_NCCL_BLOCKING=1, or a checked world: the call returns
 * with its result in place), and the call is not made if that wait
 * fails. */
#define EXEC_COMM(ex, kind, axis, call) \
    (exec__comm_begin((ex), (kind), (axis)) != 0 ? -1 : exec__comm_end((ex), (call)))
/* exec_comm.c. The call's time in a training step is added to entry
 * (kind, axis) of mesh_context_sent's table (a shard_step_kind; STEP_SLICE
 * with axis 0: the pipeline's transfers; kind -1: not timed). */
int exec__comm_begin(mesh__exec *ex, int kind, int axis);
int exec__comm_end(mesh__exec *ex, int rc); /* returns rc, or -1 if timing it failed */
/* n pairs of timed events (start[i], end[i]); 0, or -2 with ex->error
 * (naming `what` they time); and their release (NULLs allowed). */
int exec__timed_pairs(mesh__exec *ex, dev_event **start, dev_event **end, int n, const char *what);
void exec__timed_pairs_free(mesh__exec *ex, dev_event **start, dev_event **end, int n);
/* The events that time them (ordered on a GPU): -2 with ex->error */
int exec__turns_init(mesh__exec *ex);
void exec__turns_free(mesh__exec *ex);
/* The time so far of entry (kind, axis)'s calls, in ms, and *calls of
 * them (*untimed: the calls of all entries that went untimed); and of
 * every entry. */
double exec__turns_ms(mesh__exec *ex, int kind, int axis, long long *calls, long long *untimed);
double exec__turns_total(mesh__exec *ex);

/* exec_prof.c. The op profile (ex->prof.on): the work between begin and
 * end counts in entry `entry` (EX_PROF_*; -1: not timed) when in a
 * training step other than the first; nested pairs count in the
 * outermost. begin: 0, or -1 (a device failure, in ex->error); end
 * returns rc, or -1 if timing failed. */
int exec__prof_begin(mesh__exec *ex, int entry);
int exec__prof_end(mesh__exec *ex, int rc);
/* exec__prof_begin for node id's kernels in a phase (EX_PROF_FWD...):
 * its op's entry (a matmul's for the bias add that computes it; none for
 * a node that runs nothing of its own: a transpose, a matmul, GELU or
 * GELU backward that another node's kernel computes; a GELU is
 * recomputed at its own node), and its model FLOPs counted there. */
int exec__prof_begin_node(mesh__exec *ex, int id, int phase);
/* The events (a GPU's, when profiling): -2 with ex->error */
int exec__prof_init(mesh__exec *ex);
void exec__prof_free(mesh__exec *ex);

/* bytes from src to dst, both in the arena (a device-to-device copy); dmove
 * allows them to overlap (dst below src, as a slice moved to the front). */
int exec__dcopy(mesh__exec *ex, void *dst, const void *src, size_t bytes);
int exec__dmove(mesh__exec *ex, void *dst, const void *src, size_t bytes);

/* Mixed precision: x[n] rounded to the plan's precision (fp32: nothing). */
void exec__round(const mesh__exec *ex, float *x, size_t n);

/* Mixed precision's fp32 main gradients (memplan.h): around node c's
 * backward at iteration it, its params' gradients are staged (begin: each
 * param's, zeroed in the staging area, is what exec__gptr gives for it),
 * then added to the fp32 ones (end); but those the kernel adds to in fp32
 * itself (kern.dw32, memplan_grad_fp32). 0, or -1 (a
 * device call failed: nothing stays staged). exec__gstage_staged: is param
 * id's staged now. */
int exec__gstage_begin(mesh__exec *ex, int c, int it);
int exec__gstage_end(mesh__exec *ex);
int exec__gstage_staged(const mesh__exec *ex, int id);
/* Does node c's backward overwrite input k's gradient whole (kern.assign),
 * so that it need not be zeroed first? (exec_step.c) */
int exec__assigns(const mesh__exec *ex, int c, int k);
void exec__gstage_drop(mesh__exec *ex); /* after a failure: nothing staged */

/* The float elements of the collectives on c (and issued on q) from now
 * on: fp32 for gradients of params (grads), else the tensors' type; on
 * 2-byte storage only (the CPU's groups are fp32). 0, or -1 with
 * ex->error. */
int exec__grad_elements(mesh__exec *ex, comm *c, comm_async *q, int grads);

/* The fp32 master copy of copy it of param id's shard (laid out as its
 * moments, exec__shard_of); NULL in fp32. */
float *exec__master(const mesh__exec *ex, int id, int it);

const mem_buf *exec__buf_of(const mesh__exec *ex, int id);

int exec__in_stack(const mesh__exec *ex, int id);

/* The copy of a param at iteration it: a layer-stack param's copies are
 * the layers of the stage's chunks, in chunk order. */
int64_t exec__param_copy(const mesh__exec *ex, int id, int it);

/* The iteration of a param's copy k (exec__param_copy's inverse). */
int exec__copy_it(const mesh__exec *ex, int id, int k);

/* Where a later pipeline chunk receives carried value c: the start of its slot. */
int64_t exec__recv_at(const mesh__exec *ex, int c);

/* Value of tensor id at its iteration it (-1, a carried entry: 0). */
float *exec__vptr(const mesh__exec *ex, int id, int it);

/* Gradient of tensor id at its iteration it. A carried value's gradient
 * alternates between its pair of buffers: the exit of iteration it uses
 * it % 2, the entry (the exit of the iteration before the stage's first)
 * the other. */
float *exec__gptr(const mesh__exec *ex, int id, int it);

/* The saved statistics after tensor id's value. */
float *exec__aux_ptr(const mesh__exec *ex, int id, int it);

float *exec__val_in(const mesh__exec *ex, int id, int r, int it);

float *exec__grad_in(const mesh__exec *ex, int id, int r, int it);

/* Is tensor id split over tp (and along which dim, if so)? */
int exec__split_tp(const mesh__exec *ex, int id);

/* Is param id split over ep (an expert's weights, along its first dim)? */
int exec__split_ep(const mesh__exec *ex, int id);

/* The group param id's optimizer state is sharded over with ZeRO: its
 * data-parallel group (dp x ep for a dense param, dp for an expert's);
 * NULL without ZeRO or for a group of one. */
comm *exec__zcomm(const mesh__exec *ex, int id);

/* Is param id staged whole for use (zero 3: its value) or before its
 * reduce-scatter (zero >= 2: its gradient), its data-parallel group being
 * larger than one? */
int exec__staged(const mesh__exec *ex, int id);

/* This rank's ZeRO shard of copy it of param id ([lo, lo + len) of its
 * elements, exec__shard_of): its value and its gradient where the
 * optimizer reads them (the whole param's elements without ZeRO-3 or
 * ZeRO-2, the sharded regions with them). */
float *exec__pshard(const mesh__exec *ex, int id, int it);
float *exec__gshard(const mesh__exec *ex, int id, int it);

/* The last of tensor id's dims on this rank. */
int exec__lastd(const mesh__exec *ex, int id);
/* Every op's kernels on this rank within the buffers they read and write
 * (exec_check.c): 0, or -1 with a message in err (size errn). */
int exec__check_kernels(const mesh__exec *ex, char *err, size_t errn);
/* An attention (or rope) node's batch, sequence, query and kv heads on
 * this rank, and head size (exec_ops.c). */
void exec__attn_dims(const mesh__exec *ex, int id, int *B, int *T, int *H, int *KV, int *d);

/* Switches to chunk c of the stage: its layers, and its slot's parts
 * (chunk 0 starts with the part before the stack, a later one with what
 * it receives; the last ends with the part after). */
void exec__set_chunk(mesh__exec *ex, int c);

/* exec_ops.c */
int exec__forward_node(mesh__exec *ex, int id, int it);

int exec__backward_node(mesh__exec *ex, int id, int it);

/* exec_step.c */
/* ex->step_part, for the stack found. 0, -1 out of memory, or -2 if the
 * plan's layer-stack backward is not one run of steps (zero >= 2 needs it). */
int exec__step_parts(mesh__exec *ex);

/* The sum over the group of x[0..n-1], in rank order, exactly (doubles
 * travel as bytes). */
/* The loss's terms (exec_loss.c): open/close its device floats (open: 0;
 * -1 without host memory; -2 when the device's allocation failed, said in
 * ex->error, with the rank and how full the device is); begin a
 * sum from start; a term's device float for a kernel to write (coef x
 * its value; NULL if reading the earlier ones failed), a value the host
 * has, a micro-batch's end; take: the sum, the device read once. dump: a
 * device float for a value nobody adds (a recomputed forward's). */
int exec__loss_open(mesh__exec *ex);
void exec__loss_close(mesh__exec *ex);
void exec__loss_begin(mesh__exec *ex, double start);
float *exec__loss_term(mesh__exec *ex, double coef);
float *exec__loss_dump(mesh__exec *ex);
int exec__loss_value(mesh__exec *ex, double v);
int exec__loss_micro_end(mesh__exec *ex);
int exec__loss_take(mesh__exec *ex, double *total);

/* The host twin of a group (itself when the groups are one). */
comm *exec__host_comm(const mesh__exec *ex, comm *c);
int exec__sum_doubles(mesh__exec *ex, comm *c, double *x, int n);

/* The group a collective step runs over on this rank (NULL: a group of one). */
comm *exec__step_comm(const mesh__exec *ex, const plan_step *st);

/* Gradient buckets (the plan's `bucket`): is step s a data-parallel
 * gradient sum (zero 0/1) or after-optimizer gather that goes in its
 * bucket's one call? bucket_end: the end of the run of steps from q (below
 * end) in q's bucket. bucket_call: steps [q, r) at iteration it in one
 * call (comm.h's _v; two when some shards are uneven), skipping params
 * this stage does not hold; blocking (queue NULL: skips what the overlap
 * issued) or queued; the bytes counted where the call is made. The calls
 * made (0 to 2), or -1 with ex->error. */
int exec__bucketed(const mesh__exec *ex, int s);
int exec__bucket_end(const mesh__exec *ex, int q, int end);
int exec__bucket_call(mesh__exec *ex, int q, int r, int it, comm_async *queue);

/* exec_overlap.c: the gradient sync overlapped with backward. init (after
 * the groups, collective over the data-parallel ones): 0, -1 out of
 * memory, -2 a queue failed (ex->error). step_begin: before a step's first
 * unit. layer_done: the backward of a stack iteration is done; parts_done:
 * of the parts the unit's chunk runs (`here`, MEM_PART_* bits), backward
 * adds nothing more to those not in `left`; each issues what is finished
 * (when ex->ov_last: the chunk's last backward of the step). wait:
 * before the grad-sync phase. issued: was step st's copy at it issued? */
int exec__overlap_init(mesh__exec *ex, unsigned flags);
void exec__overlap_free(mesh__exec *ex);
void exec__overlap_step_begin(mesh__exec *ex);
int exec__overlap_layer_done(mesh__exec *ex, int it);
int exec__overlap_parts_done(mesh__exec *ex, int here, int left);
int exec__overlap_wait(mesh__exec *ex);
int exec__overlap_issued(const mesh__exec *ex, const plan_step *st, int it);

/* A queue's marks (exec_marks.c). exec__marks_init makes its events
 * (with deferred, ex->ordered, the timed ones and the lock too);
 * exec__marks_hooks gives the hooks comm_async_new takes; exec__marks_busy
 * the seconds the queue's calls have run so far (deferred: on the GPU, as
 * far as it has got) and *stall the compute stream's seconds waiting for
 * them (deferred; else 0); exec__marks_untimed the calls and waits not
 * timed (their ring full). */
int exec__marks_init(mesh__exec *ex, ex_marks *m);
/* Adds in the times of the pairs [*timed, made) of a ring of `ring`
 * timed events (pair k in slot k % ring, from[slot] to to[slot]) that
 * the GPU has finished, oldest first, never waiting: each to ms[at[slot]]
 * (ms[0] when at is NULL), and one to n[at[slot]] when n is not NULL. A
 * failed query stops it: the times are a measurement, not the step's
 * result. d: the calling thread's handle on the device. */
void exec__harvest_times(dev *d, dev_event *const *from, dev_event *const *to, int ring, long long made,
                         long long *timed, const short *at, double *ms, long long *n);
void exec__marks_free(mesh__exec *ex, ex_marks *m);
comm_async_hooks exec__marks_hooks(ex_marks *m, int deferred);
double exec__marks_busy(ex_marks *m, const comm_async *q, double *stall);
long long exec__marks_untimed(ex_marks *m);
/* Milliseconds the queue's calls of entry e (EX_ENTRIES) ran, and their
 * count: the GPU's time as far as it has finished them (deferred), else
 * the host's in each call after its wait for its mark. */
double exec__marks_entry_ms(ex_marks *m, int e, long long *calls);
/* The next call issued to queue q (one of ex's) counts under step kind
 * and axis's entry, during a training step (else under none). */
void exec__queue_entry(mesh__exec *ex, const comm_async *q, int kind, int axis);
/* Both queues' time in calls of kind and axis, and their count. */
double exec__overlap_entry_ms(mesh__exec *ex, int kind, int axis, long long *calls);

/* This step's overlap so far: seconds its queues' calls ran, and seconds
 * the rank waited for them (comm_async_busy; the waits exec_overlap.c
 * makes). Deferred (a GPU's NCCL calls ordered on its streams), from
 * timed events as far as the GPU has got: the calls' time on the queue's
 * stream; and the compute stream's waits for them, added to the host's
 * (until each call is enqueued). */
void exec__overlap_times(mesh__exec *ex, double *busy_s, double *wait_s);

/* ZeRO's two exchanges of copy it of step st's param over its
 * data-parallel group, blocking (0, or -1 with the group's error) or on
 * queue (the ticket, or -1): zreduce sums the staged gradient into the
 * rank's shard of it (a reduce-scatter; the whole sum when the shards are
 * uneven); zgather fills the whole value from every rank's shard, the
 * rank's own copied in first from its shard when `own` (zero 3), else
 * already in place (zero 1/2 after AdamW). */
long exec__zreduce(mesh__exec *ex, const plan_step *st, int it, comm_async *queue);
long exec__zgather(mesh__exec *ex, const plan_step *st, int it, int own, comm_async *queue);

/* zero 2/3: the micro-batch's sum of copy it of param id (in its staged
 * gradient, after its reduce-scatter), added to the rank's shard. 0, or
 * -1 (ex->error). */
int exec__zshard_add(mesh__exec *ex, int id, int it);

/* ZeRO-2/3's reduce-scatter of a param's staged gradient in backward, on
 * the queue: rs_issue queues step st's at iteration it (1), 0 if there is
 * no queue (the caller runs it), -1 on failure. rs_finish waits for the
 * queued ones of layer iterations of parity `parity` (-1: all of them)
 * and adds each to its shard, in issue order. 0, or -1 (ex->error). */
int exec__rs_issue(mesh__exec *ex, const plan_step *st, int it);
int exec__rs_finish(mesh__exec *ex, int parity);

/* ZeRO-1/2: the after-optimizer gathers of the updated params, queued
 * (1; 0: no queue, the caller runs the phase; -1 on failure), those
 * outside the stack first, then the layers in forward order. gather_wait:
 * waits for those outside the stack and layer copy `copy`'s (-1: all of
 * them, -2: only those outside the stack). 0, or -1 (ex->error). */
int exec__gather_issue(mesh__exec *ex);
int exec__gather_wait(mesh__exec *ex, int copy);

/* ZeRO-3 prefetch: issues the gathers among steps [from, to) (a stack
 * block) for iteration it, the next one (0, or -1 with ex->error).
 * prefetched: step st's gather at it was prefetched: waits for it (1), 0
 * if it was not, -1 if it failed (ex->error). */
int exec__prefetch(mesh__exec *ex, int from, int to, int it);
int exec__prefetched(mesh__exec *ex, const plan_step *st, int it);

/* exec_params.c */
void exec__param_runs(const mesh__exec *ex, int id, int rt, int re, run_fn fn, void *ctx);

void exec__init_run(void *ctx, size_t local, size_t whole, size_t len);

/* The part of copy it of param id this rank updates: elements [lo, lo +
 * len) (all of them without ZeRO), and its AdamW moments. */
void exec__shard_of(const mesh__exec *ex, int id, int it, size_t *lo, size_t *len, float **m, float **v);

/* Each param's initial values (from the plan's seed and its global name;
 * with zero 3 into its shards). 0, or -1 out of memory. */
int exec__init_params(mesh__exec *ex);



/* What this rank's optimizer updates: without ZeRO every param whole;
 * with it (over the param's data-parallel group) each copy's shard of
 * ceil(n / ranks) elements, as the memory plan lays out the moments. */
int exec__optimizer_shards(mesh__exec *ex);

/* exec.c */
/* Bookkeeping: counted apart from the arena. */
void *exec__host_calloc(mesh__exec *ex, size_t n, size_t size);
void exec__host_free(mesh__exec *ex, void *p, size_t bytes); /* one of those, of `bytes` */

#endif
