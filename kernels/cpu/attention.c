/* attention.c — causal grouped-query scaled dot-product attention, in the
 * FlashAttention manner on a CPU: the forward takes each query row in one
 * pass over the keys with an online softmax (running max m and sum l,
 * rescaling the output accumulator when m grows) and saves only the row's
 * log-sum-exp; the backward recomputes each probability as
 * exp(s - lse) and accumulates dq, dk, dv directly, so nothing of size
 * T x T is ever stored. No scratch is needed: out's row is the forward's
 * accumulator.
 *
 * One strided core serves both layouts: separate q, k, v (row strides H*d,
 * KV*d, KV*d) and packed qkv (every row stride (H+2*KV)*d). */
#include <math.h> /* defines: expf, logf, sqrtf, INFINITY */

#include "kcpu_attention.h"

/* Shapes and row strides (in floats, between consecutive t) of one call. */
typedef struct attn_dims {
    int B, T, H, KV, d, causal;
    long qs, ks, vs; /* row strides of q, k, v (and of dq, dk, dv) */
} attn_dims;

static float attn_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Keys visible from query row i: 0 .. end-1. */
static int attn_end(const attn_dims *a, int i)
{
    return a->causal ? i + 1 : a->T;
}

static void attn_forward(float *out, float *lse, const float *q,
                         const float *k, const float *v, const attn_dims *a)
{
    int T = a->T, H = a->H, d = a->d, group = a->H / a->KV;
    float scale = 1.0f / sqrtf((float)d);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / group;
            for (int i = 0; i < T; i++) {
                const float *qi = q + ((long)b * T + i) * a->qs + (long)h * d;
                float *o = out + ((long)b * T + i) * H * d + (long)h * d;
                float m = -INFINITY, l = 0.0f;
                for (int c = 0; c < d; c++)
                    o[c] = 0.0f;
                for (int j = 0; j < attn_end(a, i); j++) {
                    const float *kj = k + ((long)b * T + j) * a->ks + (long)g * d;
                    const float *vj = v + ((long)b * T + j) * a->vs + (long)g * d;
                    float s = scale * attn_dot(qi, kj, d);
                    if (s > m) { /* new max: rescale what is summed so far */
                        float corr = expf(m - s); /* 0 on the first key */
                        l *= corr;
                        for (int c = 0; c < d; c++)
                            o[c] *= corr;
                        m = s;
                    }
                    float p = expf(s - m);
                    l += p;
                    for (int c = 0; c < d; c++)
                        o[c] += p * vj[c];
                }
                for (int c = 0; c < d; c++)
                    o[c] /= l;
                lse[((long)b * H + h) * T + i] = m + logf(l);
            }
        }
}

/* p = exp(s - lse), dp = dout . v, ds = p (dp - dout . out). */
static void attn_backward(float *dq, float *dk, float *dv, const float *dout,
                          const float *out, const float *lse, const float *q,
                          const float *k, const float *v, const attn_dims *a)
{
    int T = a->T, H = a->H, d = a->d, group = a->H / a->KV;
    float scale = 1.0f / sqrtf((float)d);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < H; h++) {
            int g = h / group;
            for (int i = 0; i < T; i++) {
                long qo = ((long)b * T + i) * a->qs + (long)h * d;
                long oo = ((long)b * T + i) * H * d + (long)h * d;
                const float *qi = q + qo, *doi = dout + oo;
                float *dqi = dq + qo;
                float D = attn_dot(doi, out + oo, d);
                float L = lse[((long)b * H + h) * T + i];
                for (int j = 0; j < attn_end(a, i); j++) {
                    long ko = ((long)b * T + j) * a->ks + (long)g * d;
                    long vo = ((long)b * T + j) * a->vs + (long)g * d;
                    float p = expf(scale * attn_dot(qi, k + ko, d) - L);
                    float ds = p * (attn_dot(doi, v + vo, d) - D) * scale;
                    for (int c = 0; c < d; c++) {
                        dqi[c] += ds * k[ko + c];
                        dk[ko + c] += ds * qi[c];
                        dv[vo + c] += p * doi[c];
                    }
                }
            }
        }
}

static attn_dims attn_make(int B, int T, int H, int KV, int d, int causal,
                           long qs, long kvs)
{
    attn_dims a = {B, T, H, KV, d, causal, qs, kvs, kvs};
    return a;
}

void kcpu_attention_forward(float *out, float *lse, const float *q,
                            const float *k, const float *v, int B, int T,
                            int H, int KV, int d, int causal)
{
    attn_dims a = attn_make(B, T, H, KV, d, causal, (long)H * d, (long)KV * d);
    attn_forward(out, lse, q, k, v, &a);
}

void kcpu_attention_backward(float *dq, float *dk, float *dv,
                             const float *dout, const float *out,
                             const float *lse, const float *q, const float *k,
                             const float *v, int B, int T, int H, int KV,
                             int d, int causal)
{
    attn_dims a = attn_make(B, T, H, KV, d, causal, (long)H * d, (long)KV * d);
    attn_backward(dq, dk, dv, dout, out, lse, q, k, v, &a);
}

void kcpu_attention_qkv_forward(float *out, float *lse, const float *qkv,
                                int B, int T, int H, int KV, int d, int causal)
{
    long row = (long)(H + 2 * KV) * d;
    attn_dims a = attn_make(B, T, H, KV, d, causal, row, row);
    attn_forward(out, lse, qkv, qkv + (long)H * d, qkv + (long)(H + KV) * d,
                 &a);
}

void kcpu_attention_qkv_backward(float *dqkv, const float *dout,
                                 const float *out, const float *lse,
                                 const float *qkv, int B, int T, int H,
                                 int KV, int d, int causal)
{
    long row = (long)(H + 2 * KV) * d;
    long ko = (long)H * d, vo = (long)(H + KV) * d;
    attn_dims a = attn_make(B, T, H, KV, d, causal, row, row);
    attn_backward(dqkv, dqkv + ko, dqkv + vo, dout, out, lse, qkv, qkv + ko,
                  qkv + vo, &a);
}
