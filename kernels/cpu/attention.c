/* attention.c — causal grouped-query scaled dot-product attention, in the
 * FlashAttention manner on a CPU. Each (batch, head) pair is cut into
 * tiles of ATTN_BLOCK query rows by ATTN_BLOCK keys; the score products of
 * a tile go through kcpu__gemm (OpenBLAS), reading q, k and v in place
 * through their row strides.
 *
 *  - forward: for a block of query rows, walk the key tiles with an online
 *    softmax (running max m and sum l per row, rescaling the output rows
 *    when m grows) and save only each row's log-sum-exp.
 *  - backward: for a block of query rows and a key tile, recompute the
 *    probabilities as exp(s - lse) and accumulate dq, dk, dv straight into
 *    the caller's buffers (beta = 1).
 *
 * Scratch: one tile of scores (forward) or two (backward), ATTN_BLOCK x
 * ATTN_BLOCK floats each, on the stack: 16 KiB per tile, whatever T is.
 * Nothing of size T x T is stored, and the kernels keep no state, so they
 * may run on several threads at once. Deterministic: every sum runs in a
 * fixed order, and the products give the same bits on any number of
 * threads (gemm.c).
 *
 * With query blocks and key tiles the same size and both starting at
 * multiples of it, a causal key tile that starts at or before a query
 * block's first row shows every row of the block at least one key, so no
 * row's running max stays at -inf.
 *
 * One strided core serves both layouts: separate q, k, v (row strides H*d,
 * KV*d, KV*d) and packed qkv (every row stride (H+2*KV)*d). */
#include <math.h>   /* defines: logf, sqrtf, INFINITY */
#include <string.h> /* defines: memset */

#include "kcpu_attention.h"
#include "kcpu_gemm_impl.h" /* defines: kcpu__gemm */
#include "kcpu_math_impl.h" /* defines: kcpu__expf, KCPU_LANES */

/* Query rows per block and keys per tile (the same: see above). */
#define ATTN_BLOCK 64
_Static_assert(ATTN_BLOCK % KCPU_LANES == 0, "row helpers work in lanes");

/* Shapes and row strides (in floats, between consecutive t) of one call. */
typedef struct attn_dims {
    int B, T, H, KV, d, causal;
    long qs, ks, vs; /* row strides of q, k, v (and of dq, dk, dv) */
    long os;         /* row stride of out and dout: H*d */
    float scale;     /* 1 / sqrt(d) */
} attn_dims;

/* The tensors of a backward call (attn_backward moves them to one head). */
typedef struct attn_bwd {
    const float *q, *k, *v, *out, *dout, *lse;
    float *dq, *dk, *dv;
} attn_bwd;

/* Where head h of batch entry b starts (row 0 of its slice), in floats:
 * in q and dq, k and dk, v and dv, out and dout, lse. */
typedef struct attn_off {
    long q, k, v, o, lse;
} attn_off;

static attn_off attn_head_off(const attn_dims *a, int b, int h)
{
    int g = h / (a->H / a->KV); /* the kv head this query head reads */
    long row = (long)b * a->T;
    attn_off o = {row * a->qs + (long)h * a->d, row * a->ks + (long)g * a->d,
                  row * a->vs + (long)g * a->d, row * a->os + (long)h * a->d,
                  ((long)b * a->H + h) * a->T};
    return o;
}

static int attn_min(int a, int b)
{
    return a < b ? a : b;
}

static float attn_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Keys visible from query row i in the tile that starts at key j0: the
 * first n of its nc columns. */
static int attn_visible(const attn_dims *a, int i, int j0, int nc)
{
    return a->causal ? attn_min(i - j0 + 1, nc) : nc;
}

/* Keys [0, end) that the query block ending at row i1 (exclusive) sees. */
static int attn_key_end(const attn_dims *a, int i1)
{
    return a->causal ? i1 : a->T;
}

/* The row helpers below work on the first w columns of a tile row, w the
 * visible keys rounded up to whole groups of KCPU_LANES: fixed-count inner
 * loops that gcc vectorises, and on a causal diagonal tile about half the
 * work of the full width. */
static int attn_width(int visible)
{
    return (visible + KCPU_LANES - 1) / KCPU_LANES * KCPU_LANES;
}

/* Masks s[n, w) to -inf (exp makes those 0) and zeroes s[w, ATTN_BLOCK),
 * which the gemms after the row helpers read. */
static void attn_mask_row(float *s, int n, int w)
{
    for (int j = n; j < w; j++)
        s[j] = -INFINITY;
    for (int j = w; j < ATTN_BLOCK; j++)
        s[j] = 0.0f;
}

/* max of x[w], in KCPU_LANES lanes. */
static float attn_row_max(const float *x, int w)
{
    float lane[KCPU_LANES], m;
    for (int u = 0; u < KCPU_LANES; u++)
        lane[u] = -INFINITY;
    for (int j = 0; j < w; j += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] = x[j + u] > lane[u] ? x[j + u] : lane[u];
    m = lane[0];
    for (int u = 1; u < KCPU_LANES; u++)
        m = lane[u] > m ? lane[u] : m;
    return m;
}

/* sum of x[w], in KCPU_LANES lanes: a fixed order, so deterministic. */
static float attn_row_sum(const float *x, int w)
{
    float lane[KCPU_LANES] = {0}, s = 0.0f;
    for (int j = 0; j < w; j += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] += x[j + u];
    for (int u = 0; u < KCPU_LANES; u++)
        s += lane[u];
    return s;
}

/* s[j] = exp(s[j] - shift) over s[w], in place; -inf becomes 0. */
static void attn_exp_row(float *s, int w, float shift)
{
    for (int j = 0; j < w; j += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            s[j + u] = kcpu__expf(s[j + u] - shift);
}

/* ---- forward ---------------------------------------------------------- */

/* One tile's online-softmax step for row r of the block: turns the scores
 * s[ATTN_BLOCK] into p = exp(s - m_new) (0 where masked), folds their sum
 * into l, and returns the factor exp(m_old - m_new) that the row's output
 * so far must be scaled by. */
static float attn_online_row(float *s, int visible, float *m, float *l)
{
    int w = attn_width(visible);
    attn_mask_row(s, visible, w);
    float mt = attn_row_max(s, w);
    float mnew = mt > *m ? mt : *m;
    float corr = kcpu__expf(*m - mnew); /* 0 on the first tile (m = -inf) */
    attn_exp_row(s, w, mnew);
    *l = *l * corr + attn_row_sum(s, w);
    *m = mnew;
    return corr;
}

/* o[nr, d] (row stride os) *= corr[r] per row. */
static void attn_scale_rows(float *o, long os, const float *corr, int nr,
                            int d)
{
    for (int r = 0; r < nr; r++)
        if (corr[r] != 1.0f)
            for (int c = 0; c < d; c++)
                o[r * os + c] *= corr[r];
}

/* Query rows [i0, i0 + nr) of one head; q, k, v, o and lse point at the
 * head's row 0. s: a [ATTN_BLOCK, ATTN_BLOCK] scratch tile. */
static void attn_forward_block(float *o, float *lse, const float *q,
                               const float *k, const float *v,
                               const attn_dims *a, int i0, int nr, float *s)
{
    float m[ATTN_BLOCK], l[ATTN_BLOCK], corr[ATTN_BLOCK];
    int d = a->d, end = attn_key_end(a, i0 + nr);
    q += i0 * a->qs;
    o += i0 * a->os;
    for (int r = 0; r < nr; r++)
        m[r] = -INFINITY, l[r] = 0.0f;
    for (int j0 = 0; j0 < end; j0 += ATTN_BLOCK) {
        int nc = attn_min(ATTN_BLOCK, end - j0);
        /* s[nr, nc] = scale * q[nr, d] @ k[nc, d]^T */
        kcpu__gemm(0, 1, nr, nc, d, a->scale, q, (int)a->qs, k + j0 * a->ks, (int)a->ks, 0.0f, s,
                   ATTN_BLOCK);
        for (int r = 0; r < nr; r++)
            corr[r] = attn_online_row(s + r * ATTN_BLOCK,
                                      attn_visible(a, i0 + r, j0, nc), &m[r],
                                      &l[r]);
        if (j0 > 0)
            attn_scale_rows(o, a->os, corr, nr, d);
        /* o[nr, d] (+)= p[nr, nc] @ v[nc, d]; the first tile overwrites */
        kcpu__gemm(0, 0, nr, d, nc, 1.0f, s, ATTN_BLOCK, v + j0 * a->vs, (int)a->vs,
                   j0 > 0 ? 1.0f : 0.0f, o, (int)a->os);
    }
    for (int r = 0; r < nr; r++) {
        float inv = 1.0f / l[r]; /* a multiply per element, not a divide */
        for (int c = 0; c < d; c++)
            o[r * a->os + c] *= inv;
        lse[i0 + r] = m[r] + logf(l[r]);
    }
}

/* ---- backward --------------------------------------------------------- */

/* ds[w] = p (dp - D) scale, with dp read from ds; ds[w, ATTN_BLOCK) = 0. */
static void attn_ds_row(float *restrict ds, const float *restrict p, int w,
                        float D, float scale)
{
    for (int j = 0; j < w; j += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            ds[j + u] = p[j + u] * (ds[j + u] - D) * scale;
    for (int j = w; j < ATTN_BLOCK; j++)
        ds[j] = 0.0f;
}

/* With p = exp(s - lse), dp = dout v^T and D = dout . out per row:
 * ds = p (dp - D) scale, then dq += ds k, dk += ds^T q, dv += p^T dout.
 * One tile of one head (t points at the head's row 0): query rows
 * [i0, i0 + nr), keys [j0, j0 + nc). p and ds are [ATTN_BLOCK, ATTN_BLOCK]
 * scratch tiles; D[nr] is the block's. */
static void attn_backward_tile(const attn_bwd *t, const attn_dims *a, int i0,
                               int nr, int j0, int nc, const float *D,
                               float *p, float *ds)
{
    const float *q = t->q + i0 * a->qs, *dout = t->dout + i0 * a->os;
    const float *k = t->k + j0 * a->ks, *v = t->v + j0 * a->vs;
    int d = a->d;
    /* p[nr, nc] = scale * q[nr, d] @ k[nc, d]^T, then exp(p - lse) */
    kcpu__gemm(0, 1, nr, nc, d, a->scale, q, (int)a->qs, k, (int)a->ks, 0.0f, p, ATTN_BLOCK);
    /* ds[nr, nc] = dout[nr, d] @ v[nc, d]^T: dp, made ds below */
    kcpu__gemm(0, 1, nr, nc, d, 1.0f, dout, (int)a->os, v, (int)a->vs, 0.0f, ds, ATTN_BLOCK);
    for (int r = 0; r < nr; r++) {
        float *pr = p + r * ATTN_BLOCK;
        int visible = attn_visible(a, i0 + r, j0, nc);
        int w = attn_width(visible);
        attn_mask_row(pr, visible, w);
        attn_exp_row(pr, w, t->lse[i0 + r]);
        attn_ds_row(ds + r * ATTN_BLOCK, pr, w, D[r], a->scale);
    }
    /* dv[nc, d] += p[nr, nc]^T @ dout[nr, d] */
    kcpu__gemm(1, 0, nc, d, nr, 1.0f, p, ATTN_BLOCK, dout, (int)a->os, 1.0f, t->dv + j0 * a->vs,
               (int)a->vs);
    /* dk[nc, d] += ds[nr, nc]^T @ q[nr, d] */
    kcpu__gemm(1, 0, nc, d, nr, 1.0f, ds, ATTN_BLOCK, q, (int)a->qs, 1.0f, t->dk + j0 * a->ks,
               (int)a->ks);
    /* dq[nr, d] += ds[nr, nc] @ k[nc, d] */
    kcpu__gemm(0, 0, nr, d, nc, 1.0f, ds, ATTN_BLOCK, k, (int)a->ks, 1.0f, t->dq + i0 * a->qs,
               (int)a->qs);
}

/* Query rows [i0, i0 + nr) of one head, against every key tile they see. */
static void attn_backward_block(const attn_bwd *t, const attn_dims *a,
                                int i0, int nr, float *p, float *ds)
{
    float D[ATTN_BLOCK]; /* dout . out per row */
    int end = attn_key_end(a, i0 + nr);
    for (int r = 0; r < nr; r++)
        D[r] = attn_dot(t->dout + (i0 + r) * a->os,
                        t->out + (i0 + r) * a->os, a->d);
    for (int j0 = 0; j0 < end; j0 += ATTN_BLOCK)
        attn_backward_tile(t, a, i0, nr, j0, attn_min(ATTN_BLOCK, end - j0),
                           D, p, ds);
}

/* ---- drivers ---------------------------------------------------------- */

static void attn_forward(float *out, float *lse, const float *q,
                         const float *k, const float *v, const attn_dims *a)
{
    float s[ATTN_BLOCK * ATTN_BLOCK];
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->H; h++) {
            attn_off o = attn_head_off(a, b, h);
            for (int i0 = 0; i0 < a->T; i0 += ATTN_BLOCK)
                attn_forward_block(out + o.o, lse + o.lse, q + o.q, k + o.k,
                                   v + o.v, a, i0,
                                   attn_min(ATTN_BLOCK, a->T - i0), s);
        }
}

static void attn_backward(const attn_bwd *t, const attn_dims *a)
{
    float p[ATTN_BLOCK * ATTN_BLOCK], ds[ATTN_BLOCK * ATTN_BLOCK];
    /* a row's dp columns [nc, w) past a ragged tile's edge are read (and
     * multiplied by p = 0) before any gemm writes them */
    memset(ds, 0, sizeof ds);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->H; h++) {
            attn_off o = attn_head_off(a, b, h);
            attn_bwd hd = {t->q + o.q,      t->k + o.k,       t->v + o.v,
                           t->out + o.o,    t->dout + o.o,    t->lse + o.lse,
                           t->dq + o.q,     t->dk + o.k,      t->dv + o.v};
            for (int i0 = 0; i0 < a->T; i0 += ATTN_BLOCK)
                attn_backward_block(&hd, a, i0,
                                    attn_min(ATTN_BLOCK, a->T - i0), p, ds);
        }
}

static attn_dims attn_make(int B, int T, int H, int KV, int d, int causal,
                           long qs, long kvs)
{
    attn_dims a = {B, T, H, KV, d, causal, qs, kvs, kvs, (long)H * d,
                   1.0f / sqrtf((float)d)};
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
    attn_bwd t = {q, k, v, out, dout, lse, dq, dk, dv};
    attn_backward(&t, &a);
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
    attn_bwd t = {qkv, qkv + ko, qkv + vo, out, dout, lse,
                  dqkv, dqkv + ko, dqkv + vo};
    attn_backward(&t, &a);
}
