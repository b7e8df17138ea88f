/* graph.h — the model's dataflow graph, recorded by the checker.
 *
 * While the checker evaluates the model it appends one node per tensor:
 * inputs, params and every op application, with concrete shapes. Block
 * calls are inlined; a `repeat` body is recorded once, as a region with its
 * count (the compiler treats the body as running `count` times, each
 * iteration feeding the loop-carried tensors to the next). The region of
 * the first top-level repeat is the layer stack that pipelines cut.
 *
 * This is what the compiler (compiler/) lowers; `meshc --dump=graph`
 * prints it.
 */
#ifndef MESH_GRAPH_H
#define MESH_GRAPH_H

#include <stdint.h> /* int64_t */
#include <stdio.h>  /* FILE */

#include "diag.h"

enum { GRAPH_MAX_IN = 6, GRAPH_MAX_RANK = 8 };

#define GRAPH_OP_LIST(X)                                                    \
    X(INPUT, "input") X(PARAM, "param")                                     \
    X(EMBED, "embed") X(ARANGE, "arange") X(MATMUL, "matmul")               \
    X(TRANSPOSE, "transpose") X(BIAS_ADD, "bias_add")                       \
    X(LAYERNORM, "layernorm") X(RMSNORM, "rmsnorm") X(ROPE, "rope")         \
    X(ATTENTION, "attention") X(GELU, "gelu") X(SILU, "silu")               \
    X(SWIGLU, "swiglu") X(MOE, "moe") X(CROSS_ENTROPY, "cross_entropy")     \
    X(ADD, "add") X(SUB, "sub") X(MUL, "mul") X(SCALE, "scale")

typedef enum g_op {
#define GRAPH_ENUM(e, s) G_##e,
    GRAPH_OP_LIST(GRAPH_ENUM)
#undef GRAPH_ENUM
    G_OP_COUNT
} g_op;

const char *graph_op_name(g_op op);

enum { GRAPH_INIT_NORMAL, GRAPH_INIT_ZEROS, GRAPH_INIT_ONES };

/* Parameter-placement annotations, evaluated: axis (0 dp, 1 tp, 2 pp, 3 ep)
 * and dimension (-1 for @replicate). */
typedef struct g_annot {
    int axis, dim;
} g_annot;

typedef struct g_node {
    g_op op;
    int in[GRAPH_MAX_IN];    /* input node ids */
    int n_in;
    int rank;                /* output shape */
    int64_t dims[GRAPH_MAX_RANK];
    int is_int;
    int region;              /* innermost repeat region holding it, -1 if none */
    const char *name;        /* param's global name, input's name, or NULL */
    g_annot annot[4];        /* params (and annotated bindings): annotations */
    int n_annot;
    int annotated;           /* the user wrote annotations (else: auto layout) */
    /* attributes of the op */
    int64_t heads, kv_heads, top_k, vocab;
    double eps, theta, capacity, aux_loss, scale;
    int act_gelu, causal, arange_ids; /* moe act: 1 gelu, 0 swiglu; embed of arange ids */
    int init;                /* params: GRAPH_INIT_NORMAL (with init_std), _ZEROS or _ONES */
    double init_std;
    loc where;               /* the expression that made it */
} g_node;

enum { GRAPH_MAX_CARRY = 8 };

/* A loop-carried tensor: iteration i+1 reads `exit` of iteration i where
 * the body reads `entry` (defined before the region). */
typedef struct g_carry {
    int entry, exit;
} g_carry;

typedef struct g_region {
    int first, end;          /* node ids [first, end) recorded in the body */
    g_carry carry[GRAPH_MAX_CARRY];
    int n_carry;
    int64_t count;           /* iterations */
    int parent;              /* enclosing region, -1 if none */
    int is_stack;            /* the model's layer stack */
    const char *label;
} g_region;

typedef struct graph {
    g_node *nodes;
    int n, cap;
    g_region *regions;
    int n_regions, cap_regions;
    int loss;                /* node id of the loss, -1 if none */
    int cur_region;          /* while recording */
} graph;

void graph_init(graph *g);
void graph_free(graph *g);
/* Appends a node (copied); returns its id, or -1 when out of memory. */
int graph_add(graph *g, const g_node *n);
int graph_region_begin(graph *g, int64_t count, int is_stack, const char *label);
void graph_region_end(graph *g, int region);
/* Records that the body rebinds the tensor first bound to `entry` (or to a
 * later value of it) to `now`. Returns -1 if the region carries too many. */
int graph_region_carry(graph *g, int region, int before, int now);

/* --dump=graph: one node per line, `%id = op(%a, %b) [shape] attrs`. */
void graph_dump(const graph *g, FILE *out);

#endif
