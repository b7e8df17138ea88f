/* plan.h — the plan file: what meshc hands to the runtime.
 *
 * A plan is one YAML document ("The plan file" in docs/plan.md), written
 * and read with libyaml: a magic string and a format version, the mesh and train
 * settings, every tensor of the graph with its shape, dtype, op attributes
 * and placement per mesh axis, the repeat regions, the SPMD program (the
 * forward, backward, gradient-sync and after-optimizer steps of
 * shard_prog, in order) and the pipeline schedule, per stage.
 *
 * Plans are SPMD: every rank runs the one program, parameterised by its
 * mesh coordinates (a collective over tp runs in the rank's tp group, a
 * split placement selects the rank's slice), so the file does not grow
 * with dp, tp or ep; only the pipeline section has one entry per stage.
 *
 * The in-memory `plan` owns everything it holds (strings, arrays): it can
 * be used after the graph, shard_prog and sched it was made from are freed.
 * Ownership: plan_from and plan_read fill a caller-provided struct;
 * plan_free releases it (a no-op on a zeroed or freed struct).
 */
#ifndef MESH_PLAN_H
#define MESH_PLAN_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t */
#include <stdio.h>  /* FILE */

#include "frontend.h" /* fe_setup */
#include "memplan.h"  /* mem_stage */
#include "graph.h"    /* g_op, g_carry, GRAPH_MAX_* */
#include "sched.h"    /* sched, sched_kind, sched_unit */
#include "shard.h"    /* shard_prog, shard_pl, shard_step_kind, SHARD_AXES */

#define PLAN_MAGIC "mesh-plan"
enum { PLAN_FORMAT_VERSION = 1 };

typedef enum plan_dtype { PLAN_DTYPE_F32, PLAN_DTYPE_I32 } plan_dtype;

/* When a step runs: shard_step.backward. */
typedef enum plan_phase {
    PLAN_FORWARD,         /* per micro-batch */
    PLAN_BACKWARD,        /* per micro-batch */
    PLAN_GRAD_SYNC,       /* once per step, after the last micro-batch */
    PLAN_AFTER_OPTIMIZER  /* once per step, after the optimizer step */
} plan_phase;

typedef struct plan_tensor {
    g_op op;
    char *name;                   /* params and inputs; NULL for others */
    int rank;
    int64_t dims[GRAPH_MAX_RANK]; /* as one data-parallel rank sees it */
    plan_dtype dtype;
    int in[GRAPH_MAX_IN];         /* input tensor ids, each < this id */
    int n_in;
    int region;                   /* innermost region, -1 if none */
    shard_pl pl;                  /* placement per axis: dp, tp, pp, ep */
    /* op attributes (docs/plan.md lists which op has which) */
    int64_t heads, kv_heads, top_k, vocab;
    double eps, theta, capacity, aux_loss, scale;
    int act_gelu, causal;
    int init;                     /* params: GRAPH_INIT_NORMAL (init_std), _ZEROS, _ONES */
    double init_std;
} plan_tensor;

typedef struct plan_region {
    int first, end;               /* tensor ids [first, end) of the body */
    int64_t count;                /* iterations */
    int parent;                   /* enclosing region, -1 if none */
    int is_stack;                 /* the layer stack that pipelines cut */
    char *label;
    g_carry carry[GRAPH_MAX_CARRY];
    int n_carry;
} plan_region;

typedef struct plan_step {
    plan_phase phase;
    shard_step_kind kind;
    int node;                     /* tensor computed, or converted */
    int axis;                     /* collectives: 0 dp, 1 tp, 2 pp, 3 ep; compute: -1 */
    int dim;                      /* the dimension, -1 if none */
    int64_t elems;                /* collectives: elements of the whole tensor; compute: 0 */
    int region;                   /* innermost region, -1 if none */
    char *why;                    /* collectives: a short reason (maybe ""); compute: NULL */
    int recompute;                /* backward: a forward step run again (recompute = full) */
    int bucket;                   /* gradient sync: consecutive steps of one bucket (>= 1) are one
                                     collective; 0 none */
} plan_step;

/* What one rank sends in one step (its stage's first rank, as the static
 * check expands the program): the bytes of its collectives by kind and
 * axis (the whole tensor of each call, as `meshc --stats` counts them) and
 * of its pipeline sends. */
typedef struct plan_traffic {
    int64_t coll[STEP_SLICE][SHARD_AXES]; /* [shard_step_kind][axis]; all-reduce .. all-to-all */
    int64_t send;
} plan_traffic;

typedef struct plan_stage {
    sched_unit *units;            /* in execution order */
    int n_units;
} plan_stage;

typedef struct plan {
    int format;                   /* PLAN_FORMAT_VERSION */
    char *meshc;                  /* the version of meshc that wrote it */
    char *source;                 /* the .mesh file it was compiled from */
    fe_setup setup;               /* mesh and train settings (layers: the stack's count) */
    int loss;                     /* tensor id of the loss, -1 if none */
    plan_tensor *tensors;
    int n_tensors;
    plan_region *regions;
    int n_regions;
    plan_step *steps;             /* forward, backward, grad-sync, after-optimizer */
    int n_steps;
    /* pipeline */
    sched_kind kind;
    int pp, m, v;                 /* stages, micro-batches, chunks per stage */
    char *data, *val_data, *checkpoint_dir; /* owned; setup's pointers point here */
    mem_stage *memory;            /* per pp stage: the memory plan's sizes (memplan.h) */
    plan_traffic *traffic;        /* per pp stage, NULL when not known (the check did not run) */
    int64_t *chunk_layers;        /* layer-stack iterations run by each of the pp x v chunks
                                     (all 0 without a stack) */
    plan_stage *stages;           /* pp entries */
    char error[256];              /* why plan_from failed */
} plan;

/* Copies what the runtime needs out of a compiled model. `sc` is the
 * pipeline schedule built for s->pp, s->micro_batches and
 * s->virtual_stages; with pp == 1 it may be NULL, and the one-stage
 * schedule is built here. Returns 0, or -1 with out->error (out of memory,
 * or a schedule that does not match the settings); *out is then freed. */
int plan_from(plan *out, const char *source, const fe_setup *s, const graph *g, const shard_prog *p,
              const sched *sc);
void plan_free(plan *p);

/* Fills p->traffic from every rank's program (ranks.h); 0, or -1 out of memory. */
struct rank_progs;
int plan_set_traffic(plan *p, const struct rank_progs *r);

/* Writes the plan as YAML: fixed key order and number formatting, so equal
 * plans give equal bytes. Returns 0, or -1 with a message in err (size n). */
int plan_write(const plan *p, FILE *out, char *err, size_t n);

/* Reads a plan from text (len bytes, no NUL needed) and checks every field.
 * Returns 0, or -1 with "LINE:COL: message" in err (size n), followed by a
 * "\nHINT: ..." line for a plan of another format version; *out is then
 * zeroed. Never reads outside text, whatever it holds. */
int plan_read(plan *out, const char *text, size_t len, char *err, size_t n);

/* "forward", "backward", "grad-sync", "after-optimizer". */
const char *plan_phase_name(plan_phase ph);

/* internal, shared by plan.c and plan_read.c: the names the file uses */
typedef enum plan_attr {
    PLAN_ATTR_HEADS, PLAN_ATTR_KV_HEADS, PLAN_ATTR_CAUSAL, PLAN_ATTR_THETA, PLAN_ATTR_EPS, PLAN_ATTR_TOP_K,
    PLAN_ATTR_CAPACITY, PLAN_ATTR_ACT, PLAN_ATTR_AUX_LOSS, PLAN_ATTR_VOCAB, PLAN_ATTR_SCALE, PLAN_ATTR_COUNT
} plan_attr;
const char *plan__attr_name(plan_attr a);
unsigned plan__op_attrs(g_op op);          /* bit (1u << plan_attr) per attribute the op has */
const char *plan__dtype_name(plan_dtype d); /* "f32", "i32" */
const char *plan__unit_name(sched_op op);   /* "fwd", "bwd", "send_act", ... */
const char *plan__precision_name(int precision); /* "fp32", "bf16", "fp16" */
const char *plan__axis_name(int axis);      /* "dp", "tp", "pp", "ep" */

#endif
