/* kcpu_moe.h — see kcpu.h. Mixture-of-experts (moe.c): routing, dispatch
 * into per-expert buffers, SwiGLU experts, and combine.
 *
 * Shapes: N tokens, D model width, E experts, K = top_k (1 <= K <= E),
 * F expert hidden width, C capacity (kcpu_moe_capacity). A layer is
 *
 *   route(x, router)          -> experts, weights, slots, aux
 *   xe = dispatch(x)          [E, C, D]
 *   ye = expert(xe)           [E, C, D]  swiglu(xe@w_gate, xe@w_up)@w_down
 *   y  = combine(ye, weights) [N, D]
 *
 * Routing, as chosen here (docs/language.md leaves the details open):
 *  - p = softmax(x @ router) over all E experts.
 *  - The K experts with the largest p, largest first; equal p goes to the
 *    lower expert index.
 *  - weights: p renormalised over the K chosen (= softmax over the chosen
 *    logits), so each token's K weights sum to 1 before any drop.
 *  - Capacity is first come, first served in token index order: token n
 *    takes a slot in each chosen expert that still has one, so every expert
 *    buffer holds its tokens in token index order. A dropped (token, expert)
 *    pair contributes zero to y; the token's other experts keep their
 *    weights (no renormalisation after drops).
 *  - aux = E * sum_e f_e * P_e (Switch/Mixtral), where f_e is the share of
 *    the N*K (token, expert) choices that picked e, counted before capacity
 *    (sum_e f_e = 1), and P_e the mean over tokens of p[., e]. Balanced
 *    routing gives 1. Only P is differentiated; f and the top-k selection
 *    are constants. The caller multiplies by the coefficient.
 */
#ifndef MESH_KCPU_MOE_H
#define MESH_KCPU_MOE_H

#include <stddef.h> /* size_t */

/* One routing decision and what its backward needs. The arrays live in the
 * same allocation as the struct (kcpu_moe_route_alloc). */
typedef struct kcpu_moe_route {
    int N, E, K, C;
    int *expert;   /* [N, K] chosen experts, highest probability first */
    float *weight; /* [N, K] renormalised routing weights */
    int *slot;     /* [N, K] row in expert[n,k]'s buffer, -1 if dropped */
    int *token;    /* [E, C] token in each buffer row, -1 if empty */
    int *count;    /* [E] tokens kept per expert (<= C) */
    int *chosen;   /* [E] tokens that chose e, before capacity */
    float *probs;  /* [N, E] softmax of the router logits */
    int dropped;   /* (token, expert) pairs dropped by capacity */
    float aux;     /* E * sum_e f_e P_e, without the coefficient */
} kcpu_moe_route;

/* ceil(capacity_factor * N * K / E), ignoring a relative excess below 1e-9
 * (so 1.1 * 10 is 11, not 12); at least 1 when N > 0. */
int kcpu_moe_capacity(int N, int E, int K, double capacity_factor);

/* One malloc for the struct and its arrays; NULL if out of memory or a
 * size is out of range. kcpu_moe_route_free(NULL) does nothing. */
kcpu_moe_route *kcpu_moe_route_alloc(int N, int E, int K, int C);
void kcpu_moe_route_free(kcpu_moe_route *r);

/* The routing arrays in caller memory: kcpu_moe_route_bytes(N, E, K, C)
 * bytes (0 when a size is out of range), 16-byte aligned; bind points r's
 * arrays into mem and sets its sizes (returns -1 for sizes out of range). */
size_t kcpu_moe_route_bytes(int N, int E, int K, int C);
int kcpu_moe_route_bind(kcpu_moe_route *r, void *mem, int N, int E, int K, int C);

/* Fill r (allocated for this N, E, K, C) from x @ router. */
void kcpu_moe_route_forward(kcpu_moe_route *r,
                            const float *x,      /* [N, D] */
                            const float *router, /* [D, E] */
                            int D);
/* Backward through the routing weights and the aux loss to x and router:
 * dlogits = d(weights)/d(logits)^T dweight + aux_coef * d(aux)/d(logits). */
void kcpu_moe_route_backward(float *dx,            /* [N, D] (+=) */
                             float *drouter,       /* [D, E] (+=) */
                             float *scratch,       /* [N, E] */
                             const float *dweight, /* [N, K] */
                             float aux_coef,
                             const kcpu_moe_route *r,
                             const float *x,      /* [N, D] */
                             const float *router, /* [D, E] */
                             int D);

/* xe[e, c] = x[token[e, c]], zero rows where the slot is empty. */
void kcpu_moe_dispatch_forward(float *xe,      /* [E, C, D] */
                               const float *x, /* [N, D] */
                               const kcpu_moe_route *r, int D);
void kcpu_moe_dispatch_backward(float *dx,        /* [N, D] (+=) */
                                const float *dxe, /* [E, C, D] */
                                const kcpu_moe_route *r, int D);

/* y[n] = sum over kept k of weight[n,k] * ye[expert[n,k], slot[n,k]]. */
void kcpu_moe_combine_forward(float *y,        /* [N, D] */
                              const float *ye, /* [E, C, D] */
                              const kcpu_moe_route *r, int D);
void kcpu_moe_combine_backward(float *dye,     /* [E, C, D] (+=) */
                               float *dweight, /* [N, K] (+=) */
                               const float *dy, /* [N, D] */
                               const float *ye, /* [E, C, D] */
                               const kcpu_moe_route *r, int D);

/* SwiGLU experts on the first count[e] rows of each buffer (the rest of ye
 * is zeroed, the rest of hg, hu, act untouched): hg = xe @ w_gate[e],
 * hu = xe @ w_up[e], act = silu(hg) * hu, ye = act @ w_down[e]. hg, hu and
 * act are saved for the backward. */
void kcpu_moe_expert_forward(float *ye,  /* [E, C, D] */
                             float *hg,  /* [E, C, F] */
                             float *hu,  /* [E, C, F] */
                             float *act, /* [E, C, F] */
                             const float *xe,     /* [E, C, D] */
                             const float *w_gate, /* [E, D, F] */
                             const float *w_up,   /* [E, D, F] */
                             const float *w_down, /* [E, F, D] */
                             const int *count,    /* [E] */
                             int E, int C, int D, int F);
void kcpu_moe_expert_backward(float *dxe,     /* [E, C, D] (+=) */
                              float *dw_gate, /* [E, D, F] (+=) */
                              float *dw_up,   /* [E, D, F] (+=) */
                              float *dw_down, /* [E, F, D] (+=) */
                              float *scratch, /* [2, C, F] */
                              const float *dye,    /* [E, C, D] */
                              const float *hg,     /* [E, C, F] */
                              const float *hu,     /* [E, C, F] */
                              const float *act,    /* [E, C, F] */
                              const float *xe,     /* [E, C, D] */
                              const float *w_gate, /* [E, D, F] */
                              const float *w_up,   /* [E, D, F] */
                              const float *w_down, /* [E, F, D] */
                              const int *count,    /* [E] */
                              int E, int C, int D, int F);

#endif
