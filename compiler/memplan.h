/* memplan.h — the static memory plan of every rank: where each buffer lives.
 *
 * Built from a plan (plan.h) by meshc, which writes the sizes into the
 * plan file, and again by the runtime, which lays its one arena out by it:
 * the runtime's memory is the plan's, byte for byte. Per pipeline stage
 * (its ranks are alike) the arena is, in this order:
 *
 *   params      every param the stage holds (after the tp/ep splits; ZeRO-3
 *               shards them over dp), a layer param's copies one after another;
 *   grads       their gradients, in fp32 always (with bf16 or fp16 params too:
 *               fp32 main gradients, accumulated over the micro-batches and
 *               summed over the data-parallel ranks in fp32), laid out as
 *               the params (ZeRO-2/3 shard them);
 *   optim       AdamW's state in fp32: m, then v (then the fp32 master copy
 *               when params are bf16/fp16), each an array laid out like params;
 *   slots       `slots` x `slot_bytes`: the activations one (micro-batch,
 *               chunk) unit keeps for its backward (what each op's backward
 *               reads: a matmul's input, a norm's input and row statistics,
 *               attention's inputs, output and log-sum-exp, moe's routing and
 *               expert buffers, ...), one slot per unit the schedule keeps in
 *               flight at once. A slot holds the part before the layer stack
 *               (a later pipeline chunk: the carried values it receives),
 *               then each layer's (`layer_stride` apart), then the part after;
 *               with recompute = full, a layer keeps only what it carries to
 *               the next;
 *   workspace   pinned: gradients that live across segments (a carried
 *               value's gradient has two buffers, the iteration's and the one
 *               before it); shared: forward temporaries and backward gradients
 *               of one segment (before, one layer, after), placed by liveness
 *               (first fit over their live intervals); recompute: one layer's
 *               saved activations, rebuilt before its backward; gathered:
 *               with zero >= 2 the full gradients of the params outside the
 *               stack this stage holds and of two layers (iterations
 *               alternate: one layer's reduce-scatter runs while the next
 *               one's backward fills the other), each reduce-scattered into
 *               the sharded grads once its backward is done (per micro-
 *               batch); then with zero = 3 those params' values gathered whole
 *               for use, the layers' twice (the layer in use and the next,
 *               prefetched); gradient staging: with bf16 or fp16, one op's
 *               contribution to its params' gradients, written by its
 *               backward in the plan's precision and then added to their
 *               fp32 gradients;
 *   comm        the largest collective's output buffer (sequence parallelism
 *               packs a tensor's slices in it around a reduce-scatter or an
 *               all-gather; a vocabulary-parallel cross-entropy exchanges its
 *               rows' statistics in it).
 *
 * Liveness is in node order: a forward temporary lives from its producer to
 * its last consumer in its segment; a gradient from its last consumer's
 * backward to its producer's. What is used across segments or iterations is
 * kept in a slot (values) or pinned (gradients). Tensors inside a non-stack
 * repeat get one copy per iteration, `stride` apart.
 */
#ifndef MESH_MEMPLAN_H
#define MESH_MEMPLAN_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t */
#include <stdio.h>  /* FILE */

struct plan;

typedef enum mem_region {
    MEM_NONE,        /* no memory: a view (transpose of a param) or no gradient */
    MEM_PERSISTENT,  /* values: params region; gradients: grads region */
    MEM_SLOT,        /* within the unit's slot, at its part */
    MEM_WORKSPACE,   /* the shared workspace */
    MEM_PINNED,      /* the pinned workspace */
    MEM_RECOMPUTE    /* the recompute area of the workspace */
} mem_region;

enum { MEM_PART_PRE, MEM_PART_LAYER, MEM_PART_POST };

/* Sizes per stage, bytes per rank: what the plan file carries. */
typedef struct mem_stage {
    int64_t params, grads, optim;
    int64_t slot_bytes;             /* one unit's saved activations (the largest chunk's) */
    int slots;                      /* units in flight at the schedule's peak */
    int64_t layer_stride;           /* saved bytes of one layer-stack iteration */
    int64_t workspace;              /* pinned + shared + recompute + gathered + gstage */
    int64_t pinned, shared, recompute, gathered;
    int64_t zfixed, zlayer;         /* zero >= 2: the staged params outside the stack, and one
                                       layer's (bytes of their values; their fp32 gradients take
                                       4 / float_bytes times as many; gathered is made of them) */
    int64_t gstage;                 /* mixed precision: one op's contribution to the param gradients
                                       (the largest op's, in the plan's precision), added to them after it */
    int64_t comm;                   /* largest collective output */
    int64_t total;                  /* params + grads + optim + slots x slot_bytes + workspace + comm */
} mem_stage;

/* Where one tensor lives (the same on every stage, but for params). */
typedef struct mem_buf {
    mem_region region;              /* its value */
    signed char part;               /* MEM_PART_*: the segment it belongs to */
    signed char carried;            /* 1: a carried value (entry or exit of the stack's carries) */
    int64_t offset;                 /* value: within its region (slot: within its part; params: per stage) */
    int64_t bytes;                  /* one copy's value on one rank */
    int64_t aux;                    /* saved statistics, right after the value */
    int64_t stride;                 /* from one iteration's copy to the next (0: one copy reused) */
    mem_region grad_region;         /* MEM_PERSISTENT, MEM_WORKSPACE, MEM_PINNED or MEM_NONE */
    int64_t grad_offset;            /* within its region; a carried value's is its pair's first buffer */
    int64_t grad_stride;            /* per iteration (0: reused) */
    int grad_alias;                 /* the tensor whose gradient buffer is this one's too, or -1: a
                                       matmul's whose value only a bias add reads (x @ w + b) has
                                       none of its own (none to zero, nothing copied): the bias
                                       add's backward passes its output's gradient on unchanged,
                                       so the matmul's backward reads it, live until then. Not
                                       when anything converts the product between them (a partial
                                       sum's all-reduce, sequence parallelism's exchanges), nor
                                       across a repeat. And a GELU's whose input only it reads and
                                       whose value one matmul alone reads, as x (an MLP's
                                       gelu(pre) @ w): its input's, live from that matmul's
                                       backward, which writes the product there; the GELU's
                                       backward turns it into its input's gradient in place (or
                                       the runtime runs both in one kernel: cuBLASLt's DGELU
                                       epilogue). The runtime follows it (exec__gptr). */
    signed char grad_in_value;      /* 1: the gradient is written over the value, in its buffer
                                       (grad_region and grad_offset are the value's): the loss's
                                       cross-entropy's logits, whose gradient that op's forward
                                       writes over them when a backward follows (it needs nothing
                                       else of them), so no buffer of its own holds it. Only where
                                       the cross-entropy is the logits' one reader, in their
                                       segment. The runtime follows it (exec_ops.c) */
    int64_t scratch, scratch_offset; /* the backward's scratch (moe), in the shared workspace */
    int64_t zoffset;                /* a param staged whole (zero >= 2, data-parallel group > 1): its
                                       offset in its staging block (zfixed or zlayer; its gradient's:
                                       4 / float_bytes times it), else -1 */
} mem_buf;

typedef struct memplan {
    int pp;
    int float_bytes;                /* of a float element: 4 (fp32) or 2 (bf16, fp16) */
    mem_stage *stage;
    mem_buf *buf;                   /* pp x tensors: buf[stage * n_tensors + id] */
    int n_tensors;
    int64_t part_bytes[3];          /* one slot's parts: before, one layer (= layer_stride), after */
    int64_t recv_bytes;             /* a pipeline chunk after the first: the carried values it receives,
                                       at the start of its slot (where chunk 0 has the part before) */
    const char *unsupported;        /* why a runtime cannot follow this layout, or NULL */
} memplan;

/* memplan_build's flags. MEMPLAN_NO_REUSE gives every temporary and
 * gradient of the shared workspace its own bytes: a layout without
 * liveness reuse, for checking that reuse changes no result.
 * MEMPLAN_MASTERS keeps an fp32 master copy of the params after the
 * moments even with 4-byte floats: the layout of a CPU runtime that keeps
 * a bf16 or fp16 plan's low-precision values in fp32 words. */
enum { MEMPLAN_NO_REUSE = 1u, MEMPLAN_MASTERS = 2u };

/* Lays out every buffer of the plan. float_bytes is the size of a float
 * element (0: the plan's precision, 4 for fp32, else 2); a runtime that
 * computes bf16 plans in fp32 asks for 4. Returns 0, or -1 out of memory
 * (m is then freed). */
int memplan_build(memplan *m, const struct plan *p, int float_bytes, unsigned flags);
void memplan_free(memplan *m);

/* bytes rounded as the layout rounds an activation's room and each
 * region: up to a multiple of 16, whatever the float type (memplan.c says
 * why). */
int64_t memplan_round(const memplan *m, int64_t bytes);

/* A position embedding in a bf16 or fp16 plan: id = embed(arange(T),
 * table), read by one add alone (the token embeddings + id, repeated over
 * the batch), in its region and converted by no step, neither it nor the
 * table split along the rows. Its gradient is the batch's sum of the add's,
 * which stored in 2 bytes would overflow fp16 B times sooner than any
 * other; instead the add's backward sums it in fp32 straight into the
 * table's fp32 gradient (its first T rows: arange's embedding), as it does
 * for a bias, and id's own backward does nothing; id has no gradient
 * buffer. Under sequence parallelism id is sliced over tp along its rows
 * to meet the add's sequence-split side, and its gradient's all-gather is
 * the slice's dual: there (the table read by id alone) each rank sums its
 * rows into the table's gradient, and that step gathers every rank's rows
 * of the table's gradient, in fp32 (memplan_pos_sliced). The table, or -1. */
int memplan_pos_table(const struct plan *p, int id);

/* Is id a position embedding (memplan_pos_table) sliced over tp? */
int memplan_pos_sliced(const struct plan *p, int id);
/* Is step si the all-gather of such a position embedding's gradient (the
 * table's rows, in fp32)? */
int memplan_pos_gather_step(const struct plan *p, int si);

/* What a rank sends, as the plan counts it (its traffic, meshc --stats,
 * and meshrun's `bytes rank 0 sent` beside them): the bytes of an element
 * of step si's collective: 4 for a param's gradient (fp32 main gradients)
 * and the position embedding's gather, else the plan's precision's (a
 * GPU's; the CPU keeps a bf16 plan's values in 4-byte words, and counts
 * them as the plan's); and the bytes of tensor id's value, as the layout
 * of the plan's precision gives it room: a pipeline transfer sends the
 * carried value's whole room. */
int memplan_step_elem_bytes(const struct plan *p, int si);
int64_t memplan_value_bytes(const struct plan *p, int id);

/* The param whose gradient input k of node's backward adds to (x @
 * transpose(w): w; a position embedding: its table), or -1 when that
 * input is no param. */
int memplan_grad_param(const struct plan *p, int node, int k);
/* Mixed precision: does node's backward stage its contribution to the
 * gradient of the param at its input k (through a transpose: the param's)
 * in the gradient staging, in the plan's precision (1), or not (0: not a
 * param; a param staged at an earlier input; or written in fp32 by the
 * kernel itself, memplan_grad_fp32)? The runtime follows it
 * (exec__gstage_begin). */
int memplan_grad_staged(const struct plan *p, int node, int k);
/* Does node's kernel write its params' gradients in fp32 itself (kern.h's
 * dw32): a matmul's weight, an embedding's table, a norm's weight and bias,
 * an add's param (a bias, a position embedding)? Not when such a param is
 * also another of its inputs, which the kernel writes in the plan's
 * precision: then all its params are staged. */
int memplan_grad_fused(const struct plan *p, int node);
/* Is input k's gradient one of those: a param's fp32 main gradient that
 * node's kernel adds to in fp32? */
int memplan_grad_fp32(const struct plan *p, int node, int k);

/* The buffer of tensor id on a stage. */
const mem_buf *memplan_buf(const memplan *m, int stage, int id);

/* Bytes of the routing arrays of a moe layer: N tokens, E experts, top K,
 * capacity C; room for either device's layout (the GPU's is the larger). */
int64_t memplan_moe_route_bytes(int64_t N, int64_t E, int64_t K, int64_t C);
/* A moe layer's capacity per expert: ceil(factor x N x K / E), at least 1. */
int64_t memplan_moe_capacity(int64_t N, int64_t E, int64_t K, double factor);

/* Bytes of the communication buffer a vocabulary-parallel cross-entropy
 * over N rows on tp ranks uses to exchange its statistics. */
int64_t memplan_ce_exchange_bytes(int64_t N, int64_t tp);

/* --dump=memory */
void memplan_dump(const memplan *m, const struct plan *p, FILE *out);

#endif
