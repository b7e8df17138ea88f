/* attention_cudnn_graph.h — internal to kernels/cuda: what attention_cudnn.cu (the
 * library loaded, a context's plans, their calls) and attention_cudnn_graph.cu (the
 * attention's operation graphs and their plans) share.
 */
#ifndef MESH_ATTENTION_CUDNN_GRAPH_H
#define MESH_ATTENTION_CUDNN_GRAPH_H

#include <stdint.h> /* defines: int64_t */

#include "cudnn_api.h"

/* The loaded library's entry points (attention_cudnn.cu loads them). */
extern kcdnn_api kcuda__cdnn;

/* Unique ids of the tensors a call binds (the graph's virtual ones from
 * KCUDA__CUDNN_UID_VIRTUAL on). */
enum {
    KCUDA__CUDNN_UID_Q = 1, KCUDA__CUDNN_UID_K, KCUDA__CUDNN_UID_V, KCUDA__CUDNN_UID_O,
    KCUDA__CUDNN_UID_STATS, KCUDA__CUDNN_UID_DO, KCUDA__CUDNN_UID_DQ, KCUDA__CUDNN_UID_DK,
    KCUDA__CUDNN_UID_DV, KCUDA__CUDNN_UID_SCALE, KCUDA__CUDNN_UID_NEG_INF, KCUDA__CUDNN_UID_ONE,
    KCUDA__CUDNN_UID_D, KCUDA__CUDNN_UID_DQ_ACC, KCUDA__CUDNN_UID_VIRTUAL = 100
};

#define KCUDA__CUDNN_GRAPH_DESCS 112 /* descriptors a graph keeps: the backward's ~90 at most */

/* A graph being described: every descriptor made for it (destroyed with
 * it, kcuda__cudnn_graph_free), its plan once built. Zeroed before its
 * first descriptor (kcuda__cudnn_build numbers its virtual tensors). */
typedef struct kcuda__cudnn_graph {
    kcdnn_desc keep[KCUDA__CUDNN_GRAPH_DESCS];
    int nkeep;
    kcdnn_desc plan;   /* NULL until built; not built: why */
    int64_t workspace; /* the plan's own bytes */
    int64_t uid;       /* the next virtual tensor's */
    char why[200];     /* the first failure, in cuDNN's words */
    int compiled;      /* device-less (kcuda__cudnn_build without a handle): an
                          engine's plan compiled and failed only to load, for
                          want of a GPU */
} kcuda__cudnn_graph;

/* The attention's shape, as the graphs see it ([B, T, heads, d] rows of
 * qs elements for q and dq, kvs for k, v, dk and dv, H d for o and do). */
typedef struct kcuda__cudnn_shape {
    int64_t B, H, KV, T, d, qs, kvs;
    int io; /* the 2-byte type (KCDNN_DATA_BFLOAT16 or _HALF) */
} kcuda__cudnn_shape;

/* Destroys g's plan and descriptors and zeroes it. */
void kcuda__cudnn_graph_free(kcuda__cudnn_graph *g);

/* A descriptor of g (NULL after a failure); an attribute set; finalized. */
kcdnn_desc kcuda__cudnn_new(kcuda__cudnn_graph *g, int type);
void kcuda__cudnn_set(kcuda__cudnn_graph *g, kcdnn_desc d, int name, int type, int64_t n, const void *v);
void kcuda__cudnn_fin(kcuda__cudnn_graph *g, kcdnn_desc d, const char *what);

/* g (zeroed, or holding only the device's properties) described as the
 * causal attention's forward (bwd 0; the binding's ids: Q, K, V, O,
 * STATS, SCALE, NEG_INF) or backward (Q, K, V, O, DO, STATS, DQ, DK, DV,
 * SCALE, NEG_INF, ONE, D, and DQ_ACC unless det) of shape s, and its plan:
 * the heuristic's (mode A) first engine that builds, for handle h's GPU,
 * or (h NULL) the device that the finalized device properties dev
 * describe (no GPU needed: kcuda_attention_cudnn_check). */
void kcuda__cudnn_build(kcuda__cudnn_graph *g, const kcuda__cudnn_shape &s, int bwd, bool det, kcdnn_handle h,
                        kcdnn_desc dev);

#endif
