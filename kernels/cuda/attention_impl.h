/* attention_impl.h — internal to kernels/cuda: what the attention's
 * kernels on mma.sync (attention.cu, whose head comment describes the
 * tiles, the layouts and the algorithm) and on Hopper's warpgroup
 * products (attention_wg.cu) share: the kernels' arguments and tile
 * sizes, the lanes' layout, the masks, the online softmax and the
 * probabilities' arithmetic, the outputs' rows; and what one file asks of
 * the other.
 */
#ifndef MESH_ATTENTION_IMPL_H
#define MESH_ATTENTION_IMPL_H

#include <stddef.h>    /* defines: size_t */
#include <type_traits> /* defines: std::true_type, std::false_type */

#include "kcuda_impl.h"
#include "kcuda_ptx.h" /* defines: kc_cp_async16_n */

#define ATT_TILE 64   /* query rows per block, keys per tile */
#define ATT_THREADS 128

/* Everything a kernel needs; pointers at batch 0, head 0, row 0. Strides
 * are in elements between consecutive t. */
struct attn_args {
    const void *q, *k, *v, *out, *dout;
    void *o;              /* forward output */
    void *dq, *dk, *dv;   /* backward outputs (+=, or = where assign's bit says) */
    float *lse;           /* [B, H, T], forward output */
    const float *lse_in;  /* backward input */
    float *Dw;            /* [B, H, Tp] scratch: rowsum(dout * out) scale */
    float *Lw;            /* [B, H, Tp] scratch: lse log2(e) */
    float *dqa;           /* [B, T, H, d] fp32 scratch: dq summed by atomics (kcuda_ctx_set_deterministic) */
    int *tickets;         /* [B, H, query tiles]: the key tiles whose dq is in (NULL: no turns) */
    const float *Dr, *Lr; /* Dw, Lw: rows of Tp = T rounded up to 4, so
                           * that each 64-row piece is 16 cp.async packs */
    long long qs, ks, vs, os;
    int B, T, H, KV, d, causal, vec;
    int assign;           /* backward: dq (1), dk (2), dv (4) overwritten, not added to */
    int tf32;             /* fp32: the tile products on TF32 tensor cores (kcuda_ctx_set_tf32) */
    float scale;          /* 1 / sqrt(d) */
    float scale2;         /* scale log2(e): scores in log2 units, for kc_exp2 */
};

/* The backward's per-row scratch's row length: T rounded up to 4 floats. */
__host__ __device__ __forceinline__ long long att_tp(int T_)
{
    return (T_ + 3) / 4 * 4;
}

/* Shared-memory row length of a [64 x DP] tile: fp32 pads by four words
 * (a row stride of 4 banks: the FMA loops' reads of 8 rows' columns, and
 * TF32's operands, rows g and columns t or rows 2t and columns g, g < 8,
 * t < 4, fall in 32 different banks), 2-byte types by 16 bytes (ldmatrix
 * reads 16-byte rows, and 8 rows of a row stride of 2 DP + 16 bytes fall
 * in 8 different 16-byte bank groups: no conflicts). */
template <typename T, int DP> struct att_cfg {
    static constexpr bool TC = sizeof(T) == 2;
    static constexpr int LD = TC ? DP + 8 : DP + 4;
    static constexpr size_t TILE_BYTES =
        (sizeof(T) * ATT_TILE * LD + 127) / 128 * 128;
    static constexpr int LDF = 65; /* fp32 P tile [16 x 64] (FMA path) */
    /* the dk/dv kernel's ds^T tile [64 keys][64 queries] (2-byte types,
     * dq by atomics), rows padded by 16 bytes as the tiles' are */
    static constexpr int LDS = ATT_TILE + 8;
    static constexpr size_t S_BYTES = (sizeof(T) * ATT_TILE * LDS + 127) / 128 * 128;
    /* per-warp scratch after the tiles: the fp32 path's P tile only */
    static constexpr size_t WARP_BYTES =
        TC ? 0 : (sizeof(float) * 16 * LDF + 127) / 128 * 128;
};

/* The row of element e of a lane's tile (0..15, within the warp's rows)
 * and its column within a group of 8. */
__device__ __forceinline__ int att_row(int e)
{
    return ((threadIdx.x & 31) >> 2) + 8 * (e >> 1);
}

__device__ __forceinline__ int att_col(int e)
{
    return 2 * (threadIdx.x & 3) + (e & 1);
}

/* Whether every score of the tile of queries [i0, i0 + 64) by keys
 * [j0, j0 + 64) is seen: both inside T (rows too when `rows`, the
 * backward's: the forward never reads the rows past T) and, when causal,
 * every key at or before every query. Block-uniform: the kernels then
 * skip the mask's compares, as every tile but the diagonal's and the last
 * one's allows. */
__device__ __forceinline__ bool att_full(const attn_args &a, int i0, int j0, bool rows)
{
    return j0 + ATT_TILE <= a.T && (!rows || i0 + ATT_TILE <= a.T) &&
           (!a.causal || j0 + ATT_TILE - 1 <= i0);
}

/* f(std::true_type) on a tile with masked entries, f(std::false_type)
 * on a full one (att_full): two copies of f's loop, the full one with no
 * compares. */
template <typename F>
__device__ __forceinline__ void att_tile_math(bool full, F f)
{
    if (full)
        f(std::false_type());
    else
        f(std::true_type());
}

/* A warp's [16 x DP] accumulator, zeroed. */
template <int DP>
__device__ __forceinline__ void zero_acc(float (&acc)[DP / 8][4])
{
#pragma unroll
    for (int n = 0; n < DP / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[n][e] = 0.0f;
}

/* Sum and max over the 4 lanes of a quad (lanes differing in bits 0..1):
 * the same bits in all 4. */
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

/* -inf for the masked entries of a warp's [16 x 64] scores s, of queries
 * from `row0` (their position in the sequence) by keys from j0: a key past
 * T or (causal) after the query. */
__device__ __forceinline__ void att_mask_scores(float (&s)[8][4], const attn_args &a, int row0, int j0)
{
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int row = row0 + att_row(e);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int col = j0 + 8 * j + att_col(e);
            if (col >= a.T || (a.causal && col > row))
                s[j][e] = -INFINITY;
        }
    }
}

/* The online softmax's step over a key tile for the warp's 16 rows: the
 * running max m (of the raw scores, q.k) and sum l of the lane's rows g and
 * g + 8, s turned into the probabilities p = exp(scale (s - m_new)) that
 * the product with V takes, and corr[r] = exp(m_old - m_new), the factor
 * that row's output takes before that product adds to it (att_rescale).
 * In log2 units: each exponential is one FFMA, s scale log2(e) -
 * m_new scale log2(e), and one kc_exp2 (a max of the raw scores is the
 * max of the scaled ones: the scale is positive). */
__device__ __forceinline__ void att_softmax_step(float (&s)[8][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                                 float scale2)
{
#pragma unroll
    for (int r = 0; r < 2; r++) { /* the lane's rows g and g + 8 */
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++)
            mt = fmaxf(mt, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
        mt = quad_max(mt);
        float mn = fmaxf(m[r], mt);
        float ms = __fmul_rn(mn == -INFINITY ? 0.0f : mn, scale2);
        corr[r] = kc_exp2(__fmaf_rn(m[r], scale2, -ms)); /* 0 on the first tile */
        float ls = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float x = kc_exp2(__fmaf_rn(s[j][2 * r + c], scale2, -ms)); /* -inf gives 0 */
                s[j][2 * r + c] = x;
                ls += x;
            }
        /* (rounded apart, as the CPU does: nvcc would contract a * b + c
         * into an FMA where it chooses, not the same way in every
         * instantiation) */
        l[r] = __fadd_rn(__fmul_rn(l[r], corr[r]), quad_sum(ls));
        m[r] = mn;
    }
}

/* The lane's output rows g and g + 8 times corr[0] and corr[1]. */
template <int DP>
__device__ __forceinline__ void att_rescale(float (&acc)[DP / 8][4], const float (&corr)[2])
{
#pragma unroll
    for (int n = 0; n < DP / 8; n++) {
        acc[n][0] *= corr[0];
        acc[n][1] *= corr[0];
        acc[n][2] *= corr[1];
        acc[n][3] *= corr[1];
    }
}

/* att_softmax_step, then the output rows rescaled at once (the product
 * with V comes next). */
template <int DP>
__device__ __forceinline__ void att_online_softmax(float (&s)[8][4], float (&m)[2], float (&l)[2],
                                                   float (&acc)[DP / 8][4], float scale2)
{
    float corr[2];
    att_softmax_step(s, m, l, corr, scale2);
    att_rescale<DP>(acc, corr);
}

/* The warp's 16 output rows from `row0` (acc / l, those before T) and
 * their lse = m + log(l), in natural-log units. */
template <typename T, int DP>
__device__ __forceinline__ void att_store_rows(T *o, float *lse, const attn_args &a, int row0,
                                               const float (&acc)[DP / 8][4], const float (&m)[2],
                                               const float (&l)[2])
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + att_row(2 * r);
        if (row >= a.T)
            continue;
        float inv = 1.0f / l[r]; /* a multiply per element, as on the CPU */
#pragma unroll
        for (int n = 0; n < DP / 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                int col = 8 * n + att_col(c);
                if (col < a.d)
                    o[(long long)row * a.os + col] = kc_to<T>(acc[n][2 * r + c] * inv);
            }
        if ((threadIdx.x & 3) == 0)
            lse[row] = __fadd_rn(__fmul_rn(m[r], a.scale), logf(l[r])); /* natural log units; no FMA (above) */
    }
}

/* The (batch, head) pair of this block: blockIdx.y, continued in
 * blockIdx.z past the grid's 65535 rows (attn_launch); -1 for the padding
 * blocks of the last z slice (the whole block returns). */
__device__ __forceinline__ long long att_row_block(long long rows)
{
    long long r = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    return r < rows ? r : -1;
}

/* A block of query rows (the forward's, dq's): its first row i0 (blocks
 * of `rows`, the heavy late ones first when causal) and its (batch,
 * head), b and h (att_row_block's pair), with q, k, v and o at row 0 of
 * that pair (k and v of its kv head); false for a padding block. */
template <typename T> struct att_qhead {
    const T *q, *k, *v;
    T *o;
    int i0, b, h;
};

template <typename T>
__device__ __forceinline__ bool att_q_head(const attn_args &a, int rows, att_qhead<T> *r)
{
    r->i0 = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * rows;
    long long bh = att_row_block(a.B * (long long)a.H);
    if (bh < 0)
        return false;
    int b = (int)(bh / a.H), h = (int)(bh % a.H), kvh = h / (a.H / a.KV);
    long long bt0 = (long long)b * a.T;
    r->q = (const T *)a.q + bt0 * a.qs + (long long)h * a.d;
    r->k = (const T *)a.k + bt0 * a.ks + (long long)kvh * a.d;
    r->v = (const T *)a.v + bt0 * a.vs + (long long)kvh * a.d;
    r->o = (T *)a.o + bt0 * a.os + (long long)h * a.d;
    r->b = b;
    r->h = h;
    return true;
}

/* The blocks an SM the forward is compiled for: 4 in 2-byte types at
 * MT = 1 and head sizes up to 64 (GPT-2's: 128 registers a thread with
 * its queries' operands in registers, no spills, ptxas sm_90; 130 free,
 * which would fit only 3), else no minimum (0: the registers ptxas
 * chooses; shared memory allows 2 blocks at d 128). */
template <typename T, int DP, int MT>
constexpr int att_fwd_min_blocks()
{
    return MT == 1 && sizeof(T) == 2 && DP <= 64 ? 4 : 0;
}

/* A score's probability p = exp(scale s - lse) from the raw score s = q.k
 * and L = lse log2(e): one FFMA and a kc_exp2. */
__device__ __forceinline__ float att_prob(float s, float L, float scale2)
{
    return kc_exp2(__fmaf_rn(s, scale2, -L));
}

/* Its gradient ds = p (dp - D) scale from dp = dout.v and Ds = D scale:
 * p (dp scale - Ds), one FFMA and a multiply. */
__device__ __forceinline__ float att_ds(float p, float dp, float Ds, float scale)
{
    return p * __fmaf_rn(dp, scale, -Ds);
}

/* The dk/dv kernels' probabilities and their gradients for a step, in
 * place: where P, p = exp(s - lse) (0 where masked, when M) from the
 * scores s^T of the warp's 16 keys from j0 (rows) by the 64 queries from
 * i0; where DS, ds = p (dp - D) scale from dp^T; the queries' lse
 * log2(e) and D scale in sL and sD (by column). One pass over the tile
 * for both (the mma.sync kernel's, att_probs_kq), or a pass each
 * (attention_wg.cu's: P's while dp^T is still being summed, then DS's
 * over the p it left). */
template <bool M, bool P, bool DS>
__device__ __forceinline__ void att_kq_pass(float (&p)[8][4], float (&ds)[8][4], const attn_args &a, int j0, int i0,
                                            const float *sL, const float *sD)
{
    int w = threadIdx.x >> 5;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int key = j0 + 16 * w + att_row(e);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int qc = 8 * j + att_col(e), qr = i0 + qc;
            float pv = p[j][e];
            if constexpr (P) {
                pv = att_prob(pv, sL[qc], a.scale2);
                if constexpr (M)
                    if (key >= a.T || qr >= a.T || (a.causal && key > qr))
                        pv = 0.0f;
                p[j][e] = pv;
            }
            if constexpr (DS)
                ds[j][e] = att_ds(pv, ds[j][e], sD[qc], a.scale);
        }
    }
}

template <bool M>
__device__ __forceinline__ void att_probs_kq(float (&p)[8][4], float (&ds)[8][4], const attn_args &a, int j0, int i0,
                                             const float *sL, const float *sD)
{
    att_kq_pass<M, true, true>(p, ds, a, j0, i0, sL, sD);
}

/* The dq kernels' probabilities and their gradients, in place: where P,
 * the scores s of the warp's 16 queries from i0 (rows) by the 64 keys
 * from j0 become p = exp(s - lse) (0 where masked, when M); where DS,
 * ds = p (dp - D) scale from dp; the queries' lse log2(e) and D scale in
 * sL and sD (by row). One pass for both (att_probs_qk), or a pass each
 * (P's, then DS's), as att_kq_pass. */
template <bool M, bool P, bool DS>
__device__ __forceinline__ void att_qk_pass(float (&ds)[8][4], float (&s)[8][4], const attn_args &a, int i0, int j0,
                                            const float *sL, const float *sD)
{
    int w = threadIdx.x >> 5;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int r = 16 * w + att_row(e), row = i0 + r;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int col = j0 + 8 * j + att_col(e);
            float pv = s[j][e];
            if constexpr (P) {
                pv = att_prob(pv, sL[r], a.scale2);
                if constexpr (M)
                    if (row >= a.T || col >= a.T || (a.causal && col > row))
                        pv = 0.0f;
                s[j][e] = pv;
            }
            if constexpr (DS)
                ds[j][e] = att_ds(pv, ds[j][e], sD[r], a.scale);
        }
    }
}

template <bool M>
__device__ __forceinline__ void att_probs_qk(float (&ds)[8][4], float (&s)[8][4], const attn_args &a, int i0,
                                             int j0, const float *sL, const float *sD)
{
    att_qk_pass<M, true, true>(ds, s, a, i0, j0, sL, sD);
}

/* Queues the copy of dst[64] = the per-row values src[row0 .. row0 + 64)
 * (a row of attn_args.Dr or Lr, 16-byte aligned: rows of Tp), zero past
 * T: 16 packs by cp.async (the one across T in part, its rest zero-filled),
 * in the thread's open group; seen after the group's wait and a barrier,
 * as the tiles are. */
__device__ __forceinline__ void queue_rowvec(float *dst, const float *src, int row0, int T_)
{
    int i = threadIdx.x;
    if (i < ATT_TILE / 4) {
        int row = row0 + 4 * i, n = T_ - row;
        n = n <= 0 ? 0 : n >= 4 ? 16 : 4 * n;
        kc_cp_async16_n(dst + 4 * i, n ? src + row : src, n);
    }
}

/* The dq kernels' first loads, one group: its queries and dout (tiles 0
 * and 1), their rows' lse and D (into sL and sD), and the first key tile's
 * K and V (tiles 2 and 3). queue(n, src, stride, row0) queues tile n of
 * the kernel's own layout (attention.cu's rows, or attention_wg.cu's
 * core matrices). */
template <typename T, typename Q>
__device__ __forceinline__ void att_dq_queue_first(const attn_args &a, const att_qhead<T> &hd, float *sL, float *sD,
                                                   Q queue)
{
    long long hrow = ((long long)hd.b * a.H + hd.h) * att_tp(a.T);
    queue(0, hd.q, a.qs, hd.i0);
    queue(1, (const T *)a.dout + (long long)hd.b * a.T * a.os + (long long)hd.h * a.d, a.os, hd.i0);
    queue_rowvec(sL, a.Lr + hrow, hd.i0, a.T);
    queue_rowvec(sD, a.Dr + hrow, hd.i0, a.T);
    queue(2, hd.k, a.ks, 0);
    queue(3, hd.v, a.vs, 0);
    kc_cp_async_commit();
}

/* f(row, col, v) for each of the lane's elements of the warp's [16 x DP]
 * tile acc, at row row0 + 16 w + its row, below T and d. */
template <int DP, typename F>
__device__ __forceinline__ void each_out(const float (&acc)[DP / 8][4], int row0, int T_, int d, F f)
{
    int w = threadIdx.x >> 5;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int row = row0 + 16 * w + att_row(e);
        if (row >= T_)
            continue;
#pragma unroll
        for (int n = 0; n < DP / 8; n++) {
            int col = 8 * n + att_col(e);
            if (col < d)
                f(row, col, acc[n][e]);
        }
    }
}

/* y[row][col] += acc (set: = acc, y not read) for the lane's elements
 * (one thread per element: no conflicts; each element of a backward's
 * outputs is written by one block). */
template <typename T, int DP>
__device__ __forceinline__ void add_rows_out(T *y, long long stride,
                                             const float (&acc)[DP / 8][4],
                                             int row0, int T_, int d, int set)
{
    each_out<DP>(acc, row0, T_, d, [&](int row, int col, float v) {
        T *p = y + (long long)row * stride + col;
        *p = kc_to<T>((set ? 0.0f : kc_f(*p)) + v);
    });
}

/* ATT_DKV_ADQ: the dk/dv kernel summing dq too, by atomics (2-byte types) */
enum { ATT_FWD, ATT_DKV, ATT_DQ, ATT_DKV_ADQ };

/* attention_wg.cu: whether the current GPU runs the kernels' wgmma code:
 * a probe kernel, once per device, says whether the machine code loaded
 * for attention_wg.cu is sm_90a's (with wgmma) or the PTX's (in which
 * those kernels only trap). */
int attn_wg_available(void);

/* attention_wg.cu: the kernel on warpgroup products for `which`
 * (ATT_FWD, ATT_DKV or ATT_DQ; null for ATT_DKV_ADQ) in bf16 (is_bf16)
 * or fp16 at the padded head size DP (32, 64 or 128), and in *bytes its
 * dynamic shared memory. The caller launches it only where
 * attn_wg_available() and a.vec hold (attention.cu: kcuda_attention_wgmma). */
void (*attn_wg_kernel(int which, bool is_bf16, int DP, size_t *bytes))(attn_args);

/* attention_cudnn.cu: the forward (a's q, k, v, o, lse) or the backward
 * (q, k, v, out, dout, lse_in, dq, dk, dv, assign) of a (attn_setup's)
 * on cuDNN where the context asks and cuDNN takes the call (*taken 1);
 * else *taken 0, nothing done, and attention.cu runs its own kernels. */
int kcuda__cudnn_forward(kcuda_ctx *ctx, const attn_args &a, kcuda_dtype dt, cudaStream_t s, int *taken);
int kcuda__cudnn_backward(kcuda_ctx *ctx, const attn_args &a, kcuda_dtype dt, cudaStream_t s, int *taken);

#endif
