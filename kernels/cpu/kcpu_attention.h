/* kcpu_attention.h — see kcpu.h. Rotary position embedding (rope.c) and
 * causal grouped-query self-attention (attention.c).
 *
 * Shapes: B batch, T sequence, H query heads, KV key/value heads (H % KV
 * == 0; query head h reads kv head h / (H / KV)), d head size. Semantics are
 * docs/language.md's `rope` and `attention`. Forward functions overwrite
 * their outputs; backward functions accumulate (+=) into gradients.
 */
#ifndef MESH_KCPU_ATTENTION_H
#define MESH_KCPU_ATTENTION_H

/* Rotate-half RoPE: in each head, channel j < d/2 pairs with j + d/2 and the
 * pair turns by (pos0 + t) * theta^(-2j/d). `out` may equal `x`. */
void kcpu_rope_forward(float *out,     /* [B, T, H*d] */
                       const float *x, /* [B, T, H*d] */
                       int B, int T, int H, int d, /* d even */
                       float theta, int pos0);
/* dx += R^T dout: the inverse rotation of dout. */
void kcpu_rope_backward(float *dx,        /* [B, T, H*d] (+=) */
                        const float *dout, /* [B, T, H*d] */
                        int B, int T, int H, int d, float theta, int pos0);

/* softmax(q k^T / sqrt(d)) v per head, causal if `causal` (t sees <= t).
 * FlashAttention-style: blocks of query rows walk tiles of keys with an
 * online softmax; no T x T matrix is formed (the scratch is one 64 x 64
 * tile, on the stack). Saves lse, the log-sum-exp of each row's scaled
 * scores, for the backward. */
void kcpu_attention_forward(float *out,     /* [B, T, H*d] */
                            float *lse,     /* [B, H, T] */
                            const float *q, /* [B, T, H*d] */
                            const float *k, /* [B, T, KV*d] */
                            const float *v, /* [B, T, KV*d] */
                            int B, int T, int H, int KV, int d, int causal);
/* Recomputes the scores tile by tile from q, k and lse (two 64 x 64 tiles
 * of scratch, on the stack). dq, dk, dv accumulate; a kv head's gradient
 * sums over the H / KV query heads that share it. */
void kcpu_attention_backward(float *dq,         /* [B, T, H*d] (+=) */
                             float *dk,         /* [B, T, KV*d] (+=) */
                             float *dv,         /* [B, T, KV*d] (+=) */
                             const float *dout, /* [B, T, H*d] */
                             const float *out,  /* [B, T, H*d] forward */
                             const float *lse,  /* [B, H, T] forward */
                             const float *q,    /* [B, T, H*d] */
                             const float *k,    /* [B, T, KV*d] */
                             const float *v,    /* [B, T, KV*d] */
                             int B, int T, int H, int KV, int d, int causal);

/* The packed layout: each row of qkv is H*d q channels, then KV*d k, then
 * KV*d v. Nothing is copied: the kernels read (and the backward accumulates
 * into) the three slices in place, with row stride (H + 2*KV)*d. */
void kcpu_attention_qkv_forward(float *out,       /* [B, T, H*d] */
                                float *lse,       /* [B, H, T] */
                                const float *qkv, /* [B, T, (H+2*KV)*d] */
                                int B, int T, int H, int KV, int d,
                                int causal);
void kcpu_attention_qkv_backward(float *dqkv, /* [B, T, (H+2*KV)*d] (+=) */
                                 const float *dout, /* [B, T, H*d] */
                                 const float *out,  /* [B, T, H*d] */
                                 const float *lse,  /* [B, H, T] */
                                 const float *qkv,  /* [B, T, (H+2*KV)*d] */
                                 int B, int T, int H, int KV, int d,
                                 int causal);

#endif
