/* attention.cu — causal grouped-query attention in the FlashAttention
 * manner: tiles of 64 query rows by 64 keys in shared memory, an online
 * softmax, and nothing of size T x T anywhere.
 *
 * A block is 4 warps and owns 64 rows (queries, or keys in the dk/dv
 * kernel); warp w owns 16 of them. Within a warp, lane l holds a [4 x 8]
 * piece of each [16 x 64] score tile: rows 4 (l / 8) + i and columns
 * (l % 8) + 8 j, so the 8 lanes of a row group reduce a row with three
 * butterfly shuffles (every lane ends with the same bits), and the same
 * lanes hold that row's output columns (l % 8) + 8 c. After the block
 * loads a K/V (or Q/dO) tile, all the math of a warp is on its own rows,
 * so only the tile loads need __syncthreads.
 *
 * Tile products: fp32 runs them as fp32 FMAs from shared memory (padded
 * rows, no bank conflicts); bf16 on tensor cores through WMMA (16x16x16,
 * fp32 accumulation), with the score tiles passing through shared memory
 * to reach the lane layout above, and P (and dS) rounded to bf16 for their
 * products. The head size is padded to DP = 32, 64 or 128 with zeros.
 *
 * Forward: per block of queries, walk the key tiles (only those at or
 * before the diagonal when causal: the tiles start at multiples of 64, so
 * the first tile shows every row a key and no row's max stays -inf), keep
 * the running max m and sum l per row, rescale the output rows by
 * exp(m_old - m_new), and save lse = m + log(l) per row.
 * Backward, deterministic without atomics: a first kernel computes
 * D = rowsum(dout * out); the dk/dv kernel owns a tile of keys of one kv
 * head and walks its query heads and the query tiles that see it, in
 * order; the dq kernel owns a tile of queries and walks the key tiles.
 * Each recomputes p = exp(s - lse) from q, k and the saved lse.
 */
#include <type_traits> /* defines: std::conditional */
#include <mma.h>    /* defines: nvcuda::wmma */
#include <string.h> /* defines: memset */

#include "kcuda_impl.h"

using namespace nvcuda;

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
    float *Dw;            /* [B, H, T] scratch: rowsum(dout * out) */
    const float *Dr;
    long long qs, ks, vs, os;
    int B, T, H, KV, d, causal, vec;
    int assign;           /* backward: dq (1), dk (2), dv (4) overwritten, not added to */
    float scale;
};

/* Shared-memory row length of a [64 x DP] tile: fp32 pads by one word
 * (the FMA loops read columns), bf16 by 16 bytes (WMMA needs ldm % 8 == 0
 * and 32-byte aligned fragments). */
template <typename T, int DP> struct att_cfg {
    static constexpr bool TC = sizeof(T) == 2;
    static constexpr int LD = TC ? DP + 8 : DP + 1;
    static constexpr size_t TILE_BYTES =
        (sizeof(T) * ATT_TILE * LD + 127) / 128 * 128;
    static constexpr int LDS = 68;     /* fp32 score tile [16 x 64] (TC) */
    static constexpr int LDP = 72;     /* 2-byte P / dS tile [16 x 64] (TC) */
    /* the tensor cores' 2-byte type: T itself (bf16 or fp16); for fp32 a
     * placeholder the TC code is compiled with but never runs */
    typedef typename std::conditional<sizeof(T) == 2, T, bf16>::type L;
    static constexpr int LDO = DP + 4; /* fp32 [16 x DP] output tile (TC) */
    static constexpr int LDF = 65;     /* fp32 P / dS tile (FMA path) */
};

/* ---- tiles ---------------------------------------------------------------- */

/* dst[64][LD] = rows [row0, row0 + 64) of src (row stride `stride`), the
 * first d columns; zeros past T and past d. With vec, 16-byte packs (d and
 * the stride multiples of the pack width, src aligned). */
template <typename T, int DP>
__device__ void load_tile(T *dst, const T *src, long long stride, int row0,
                          int T_, int d, int vec)
{
    constexpr int LD = att_cfg<T, DP>::LD;
    constexpr int W = kc_pack<T>::W;
    if (vec) {
        constexpr int PPR = DP / W; /* packs per row */
        for (int idx = threadIdx.x; idx < ATT_TILE * PPR; idx += blockDim.x) {
            int r = idx / PPR, c = (idx % PPR) * W, gr = row0 + r;
            kc_pack<T> p;
            if (gr < T_ && c < d) {
                p = *reinterpret_cast<const kc_pack<T> *>(src + gr * stride + c);
            } else {
#pragma unroll
                for (int j = 0; j < W; j++)
                    p.v[j] = kc_to<T>(0.0f);
            }
            if (LD % W == 0) {
                *reinterpret_cast<kc_pack<T> *>(dst + r * LD + c) = p;
            } else {
#pragma unroll
                for (int j = 0; j < W; j++)
                    dst[r * LD + c + j] = p.v[j];
            }
        }
        return;
    }
    for (int idx = threadIdx.x; idx < ATT_TILE * DP; idx += blockDim.x) {
        int r = idx / DP, c = idx % DP, gr = row0 + r;
        dst[r * LD + c] =
            gr < T_ && c < d ? src[gr * stride + c] : kc_to<T>(0.0f);
    }
}

/* ---- warp-level tile products ------------------------------------------- */

/* s[i][j] = A[16 w + 4 g + i] . B[sub + 8 j] over the head size: a warp's
 * [16 x 64] piece of A B^T, A and B [64][LD] tiles, in the lane layout.
 * fp32: FMAs over the first d columns. bf16: WMMA into the warp's fp32
 * tile ws[16][LDS], then read back. */
template <typename T, int DP>
__device__ __forceinline__ void warp_abt(float (&s)[4][8], const T *A,
                                         const T *B, int d, float *ws)
{
    typedef att_cfg<T, DP> cfg;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 3, sub = lane & 7;
    if constexpr (cfg::TC) {
        typedef typename cfg::L L;
        const L *a = reinterpret_cast<const L *>(A) + 16 * w * cfg::LD;
        const L *b = reinterpret_cast<const L *>(B);
#pragma unroll
        for (int n = 0; n < 4; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int k = 0; k < DP / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, L, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, L, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, a + k * 16, cfg::LD);
                wmma::load_matrix_sync(fb, b + n * 16 * cfg::LD + k * 16, cfg::LD);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(ws + n * 16, acc, cfg::LDS, wmma::mem_row_major);
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                s[i][j] = ws[(4 * g + i) * cfg::LDS + sub + 8 * j];
        __syncwarp();
    } else {
        (void)ws;
        const float *a = reinterpret_cast<const float *>(A) + (16 * w + 4 * g) * cfg::LD;
        const float *b = reinterpret_cast<const float *>(B) + sub * cfg::LD;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                s[i][j] = 0.0f;
#pragma unroll 4
        for (int kk = 0; kk < d; kk++) {
            float av[4], bv[8];
#pragma unroll
            for (int i = 0; i < 4; i++)
                av[i] = a[i * cfg::LD + kk];
#pragma unroll
            for (int j = 0; j < 8; j++)
                bv[j] = b[8 * j * cfg::LD + kk];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    s[i][j] += av[i] * bv[j];
        }
    }
}

/* acc[i][c] += sum over the 64 columns jj of P[4 g + i][jj] * V[jj][sub +
 * 8 c]: a warp's [16 x DP] piece of P V, P the warp's [16 x 64] tile in the
 * lane layout, V a [64][LD] tile. fp32: P goes through the warp's tile
 * pf[16][LDF]. bf16: P rounded into pb[16][LDP], WMMA into po[16][LDO]. */
template <typename T, int DP>
__device__ __forceinline__ void warp_pv(float (&acc)[4][DP / 8],
                                        const float (&p)[4][8], const T *V,
                                        float *pf, typename att_cfg<T, DP>::L *pb, float *po)
{
    typedef att_cfg<T, DP> cfg;
    int lane = threadIdx.x & 31, g = lane >> 3, sub = lane & 7;
    if constexpr (cfg::TC) {
        typedef typename cfg::L L;
        (void)pf;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                pb[(4 * g + i) * cfg::LDP + sub + 8 * j] = kc_to<L>(p[i][j]);
        __syncwarp();
        const L *v = reinterpret_cast<const L *>(V);
        wmma::fragment<wmma::matrix_a, 16, 16, 16, L, wmma::row_major> fa[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            wmma::load_matrix_sync(fa[k], pb + k * 16, cfg::LDP);
#pragma unroll
        for (int n = 0; n < DP / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
            wmma::fill_fragment(o, 0.0f);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, L, wmma::row_major> fb;
                wmma::load_matrix_sync(fb, v + k * 16 * cfg::LD + n * 16, cfg::LD);
                wmma::mma_sync(o, fa[k], fb, o);
            }
            wmma::store_matrix_sync(po + n * 16, o, cfg::LDO, wmma::mem_row_major);
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < DP / 8; c++)
                acc[i][c] += po[(4 * g + i) * cfg::LDO + sub + 8 * c];
        __syncwarp();
    } else {
        (void)pb;
        (void)po;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                pf[(4 * g + i) * cfg::LDF + sub + 8 * j] = p[i][j];
        __syncwarp();
        const float *v = reinterpret_cast<const float *>(V) + sub;
#pragma unroll 2
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float pv[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                pv[i] = pf[(4 * g + i) * cfg::LDF + jj];
#pragma unroll
            for (int c = 0; c < DP / 8; c++) {
                float vv = v[jj * cfg::LD + 8 * c];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[i][c] += pv[i] * vv;
            }
        }
        __syncwarp();
    }
}

/* Sum and max over the 8 lanes of a row group (lanes differing in bits
 * 0..2): the same bits in all 8. */
__device__ __forceinline__ float group_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v;
}

__device__ __forceinline__ float group_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
    return v;
}

/* Per-warp scratch, after the block's [64 x DP] tiles: region A (TC: the
 * fp32 score tile [16][LDS], which warp_abt has read back into registers
 * before warp_pv reuses the region for its output tile [16][LDO]; FMA: the
 * fp32 P tile [16][LDF]) and, TC only, the 2-byte P tile [16][LDP]. */
template <typename T, int DP> struct att_warp {
    typedef att_cfg<T, DP> cfg;
    static constexpr size_t A =
        cfg::TC ? (sizeof(float) * 16 * (cfg::LDS > cfg::LDO ? cfg::LDS : cfg::LDO) + 127) / 128 * 128
                : (sizeof(float) * 16 * cfg::LDF + 127) / 128 * 128;
    static constexpr size_t PB =
        cfg::TC ? (sizeof(typename cfg::L) * 16 * cfg::LDP + 127) / 128 * 128 : 0;
    static constexpr size_t BYTES = A + PB;
};

/* The warp's region A and 2-byte tile, at byte `base` of shared memory. */
template <typename T, int DP>
__device__ __forceinline__ void warp_scratch(unsigned char *base, float **wa,
                                             typename att_cfg<T, DP>::L **pb)
{
    unsigned char *wb = base + (threadIdx.x >> 5) * att_warp<T, DP>::BYTES;
    *wa = (float *)wb;
    *pb = (typename att_cfg<T, DP>::L *)(wb + att_warp<T, DP>::A);
}

/* ---- forward -------------------------------------------------------------- */

/* The (batch, head) pair of this block: blockIdx.y, continued in
 * blockIdx.z past the grid's 65535 rows (attn_launch); -1 for the padding
 * blocks of the last z slice (the whole block returns). */
__device__ __forceinline__ long long att_row_block(long long rows)
{
    long long r = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    return r < rows ? r : -1;
}

template <typename T, int DP>
__global__ void __launch_bounds__(ATT_THREADS) attn_fwd_kernel(attn_args a)
{
    typedef att_cfg<T, DP> cfg;
    extern __shared__ __align__(128) unsigned char smem[];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 3, sub = lane & 7;
    /* heavy (late) query blocks first when causal */
    int i0 = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * ATT_TILE;
    long long bh = att_row_block(a.B * (long long)a.H);
    if (bh < 0)
        return;
    int b = (int)(bh / a.H), h = (int)(bh % a.H), kvh = h / (a.H / a.KV);
    long long bt0 = (long long)b * a.T;
    const T *q = (const T *)a.q + bt0 * a.qs + (long long)h * a.d;
    const T *k = (const T *)a.k + bt0 * a.ks + (long long)kvh * a.d;
    const T *v = (const T *)a.v + bt0 * a.vs + (long long)kvh * a.d;
    T *o = (T *)a.o + bt0 * a.os + (long long)h * a.d;
    T *sQ = (T *)smem;
    T *sK = (T *)(smem + cfg::TILE_BYTES);
    T *sV = (T *)(smem + 2 * cfg::TILE_BYTES);
    float *wa;
    typename cfg::L *pb;
    warp_scratch<T, DP>(smem + 3 * cfg::TILE_BYTES, &wa, &pb);

    load_tile<T, DP>(sQ, q, a.qs, i0, a.T, a.d, a.vec);
    float m[4], l[4], acc[4][DP / 8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < DP / 8; c++)
            acc[i][c] = 0.0f;
    }
    int end = a.causal ? min(a.T, i0 + ATT_TILE) : a.T;
    for (int j0 = 0; j0 < end; j0 += ATT_TILE) {
        __syncthreads(); /* the last tile's K and V are no longer read */
        load_tile<T, DP>(sK, k, a.ks, j0, a.T, a.d, a.vec);
        load_tile<T, DP>(sV, v, a.vs, j0, a.T, a.d, a.vec);
        __syncthreads();
        float s[4][8];
        warp_abt<T, DP>(s, sQ, sK, a.d, wa);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = i0 + 16 * w + 4 * g + i;
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int col = j0 + sub + 8 * j;
                bool ok = col < a.T && (!a.causal || col <= row);
                s[i][j] = ok ? s[i][j] * a.scale : -INFINITY;
                mt = fmaxf(mt, s[i][j]);
            }
            mt = group_max(mt);
            float mn = fmaxf(m[i], mt);
            float ms = mn == -INFINITY ? 0.0f : mn;
            float corr = expf(m[i] - ms); /* 0 on the first tile */
            float ls = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                s[i][j] = expf(s[i][j] - ms); /* -inf gives 0 */
                ls += s[i][j];
            }
            l[i] = l[i] * corr + group_sum(ls);
            m[i] = mn;
#pragma unroll
            for (int c = 0; c < DP / 8; c++)
                acc[i][c] *= corr;
        }
        warp_pv<T, DP>(acc, s, sV, wa, pb, wa);
    }
    float *lse = a.lse + ((long long)b * a.H + h) * a.T;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = i0 + 16 * w + 4 * g + i;
        if (row >= a.T)
            continue;
        float inv = 1.0f / l[i]; /* a multiply per element, as on the CPU */
#pragma unroll
        for (int c = 0; c < DP / 8; c++) {
            int col = sub + 8 * c;
            if (col < a.d)
                o[(long long)row * a.os + col] = kc_to<T>(acc[i][c] * inv);
        }
        if (sub == 0)
            lse[row] = m[i] + logf(l[i]);
    }
}

/* ---- backward ------------------------------------------------------------- */

/* D[b, h, t] = sum over the head's columns of dout * out: a warp per row. */
template <typename T>
__global__ void attn_bwd_d_kernel(attn_args a)
{
    long long rows = (long long)a.B * a.T * a.H;
    long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    int h = (int)(r % a.H);
    long long bt = r / a.H;
    int t = (int)(bt % a.T), b = (int)(bt / a.T);
    const T *dout = (const T *)a.dout + bt * a.os + (long long)h * a.d;
    const T *out = (const T *)a.out + bt * a.os + (long long)h * a.d;
    float s = 0.0f;
    for (int c = threadIdx.x & 31; c < a.d; c += 32)
        s += kc_f(dout[c]) * kc_f(out[c]);
    s = kc_warp_sum(s);
    if ((threadIdx.x & 31) == 0)
        a.Dw[((long long)b * a.H + h) * a.T + t] = s;
}

/* The per-row values of a tile (lse or D), zero past T. */
__device__ __forceinline__ void load_rowvec(float *dst, const float *src,
                                            int row0, int T_)
{
    for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x)
        dst[r] = row0 + r < T_ ? src[row0 + r] : 0.0f;
}

/* y[row0 + 16 w + 4 g + i][sub + 8 c] += acc[i][c] (set: = acc, y not
 * read) for rows < T and columns < d (one thread per element: no
 * conflicts; each element of a backward's outputs is written by one
 * block). */
template <typename T, int DP>
__device__ __forceinline__ void add_rows_out(T *y, long long stride,
                                             const float (&acc)[4][DP / 8],
                                             int row0, int T_, int d, int set)
{
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 3, sub = lane & 7;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = row0 + 16 * w + 4 * g + i;
        if (row >= T_)
            continue;
#pragma unroll
        for (int c = 0; c < DP / 8; c++) {
            int col = sub + 8 * c;
            if (col < d) {
                T *p = y + (long long)row * stride + col;
                *p = kc_to<T>((set ? 0.0f : kc_f(*p)) + acc[i][c]);
            }
        }
    }
}

/* dK, dV of one tile of 64 keys of one kv head (a warp per 16 keys): for
 * each query head of the group in order, and each query tile that sees
 * these keys, in order, the scores come transposed (keys are the warp's
 * rows): p = exp(s - lse), ds = p (dp - D) scale, dv += p^T dout,
 * dk += ds^T q. */
template <typename T, int DP>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dkv_kernel(attn_args a)
{
    typedef att_cfg<T, DP> cfg;
    extern __shared__ __align__(128) unsigned char smem[];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 3, sub = lane & 7;
    int j0 = blockIdx.x * ATT_TILE; /* early keys (the most queries) first */
    long long bkv = att_row_block(a.B * (long long)a.KV);
    if (bkv < 0)
        return;
    int b = (int)(bkv / a.KV), kvh = (int)(bkv % a.KV), rep = a.H / a.KV;
    long long bt0 = (long long)b * a.T;
    T *sK = (T *)smem;
    T *sV = (T *)(smem + cfg::TILE_BYTES);
    T *sQ = (T *)(smem + 2 * cfg::TILE_BYTES);
    T *sO = (T *)(smem + 3 * cfg::TILE_BYTES); /* dout */
    float *sL = (float *)(smem + 4 * cfg::TILE_BYTES);
    float *sD = sL + ATT_TILE;
    float *wa;
    typename cfg::L *pb;
    warp_scratch<T, DP>(smem + 4 * cfg::TILE_BYTES + 2 * ATT_TILE * sizeof(float),
                        &wa, &pb);

    load_tile<T, DP>(sK, (const T *)a.k + bt0 * a.ks + (long long)kvh * a.d,
                     a.ks, j0, a.T, a.d, a.vec);
    load_tile<T, DP>(sV, (const T *)a.v + bt0 * a.vs + (long long)kvh * a.d,
                     a.vs, j0, a.T, a.d, a.vec);
    float dk[4][DP / 8], dv[4][DP / 8];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < DP / 8; c++)
            dk[i][c] = dv[i][c] = 0.0f;
    for (int hr = 0; hr < rep; hr++) {
        int h = kvh * rep + hr;
        const T *q = (const T *)a.q + bt0 * a.qs + (long long)h * a.d;
        const T *dout = (const T *)a.dout + bt0 * a.os + (long long)h * a.d;
        const float *lse = a.lse_in + ((long long)b * a.H + h) * a.T;
        const float *D = a.Dr + ((long long)b * a.H + h) * a.T;
        for (int i0 = a.causal ? j0 : 0; i0 < a.T; i0 += ATT_TILE) {
            __syncthreads(); /* the last query tile is no longer read */
            load_tile<T, DP>(sQ, q, a.qs, i0, a.T, a.d, a.vec);
            load_tile<T, DP>(sO, dout, a.os, i0, a.T, a.d, a.vec);
            load_rowvec(sL, lse, i0, a.T);
            load_rowvec(sD, D, i0, a.T);
            __syncthreads();
            float p[4][8], ds[4][8];
            warp_abt<T, DP>(p, sK, sQ, a.d, wa);  /* s^T */
            warp_abt<T, DP>(ds, sV, sO, a.d, wa); /* dp^T */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = j0 + 16 * w + 4 * g + i;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    int qc = sub + 8 * j, qr = i0 + qc;
                    bool ok = key < a.T && qr < a.T && (!a.causal || key <= qr);
                    float pv = ok ? expf(p[i][j] * a.scale - sL[qc]) : 0.0f;
                    p[i][j] = pv;
                    ds[i][j] = pv * (ds[i][j] - sD[qc]) * a.scale;
                }
            }
            warp_pv<T, DP>(dv, p, sO, wa, pb, wa);
            warp_pv<T, DP>(dk, ds, sQ, wa, pb, wa);
        }
    }
    add_rows_out<T, DP>((T *)a.dk + bt0 * a.ks + (long long)kvh * a.d, a.ks,
                        dk, j0, a.T, a.d, a.assign & 2);
    add_rows_out<T, DP>((T *)a.dv + bt0 * a.vs + (long long)kvh * a.d, a.vs,
                        dv, j0, a.T, a.d, a.assign & 4);
}

/* dQ of one tile of 64 queries of one head: over the key tiles it sees,
 * p = exp(s - lse), ds = p (dp - D) scale, dq += ds k. */
template <typename T, int DP>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dq_kernel(attn_args a)
{
    typedef att_cfg<T, DP> cfg;
    extern __shared__ __align__(128) unsigned char smem[];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 3, sub = lane & 7;
    int i0 = (a.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * ATT_TILE;
    long long bh = att_row_block(a.B * (long long)a.H);
    if (bh < 0)
        return;
    int b = (int)(bh / a.H), h = (int)(bh % a.H), kvh = h / (a.H / a.KV);
    long long bt0 = (long long)b * a.T;
    const T *k = (const T *)a.k + bt0 * a.ks + (long long)kvh * a.d;
    const T *v = (const T *)a.v + bt0 * a.vs + (long long)kvh * a.d;
    T *sQ = (T *)smem;
    T *sO = (T *)(smem + cfg::TILE_BYTES); /* dout */
    T *sK = (T *)(smem + 2 * cfg::TILE_BYTES);
    T *sV = (T *)(smem + 3 * cfg::TILE_BYTES);
    float *sL = (float *)(smem + 4 * cfg::TILE_BYTES);
    float *sD = sL + ATT_TILE;
    float *wa;
    typename cfg::L *pb;
    warp_scratch<T, DP>(smem + 4 * cfg::TILE_BYTES + 2 * ATT_TILE * sizeof(float),
                        &wa, &pb);

    load_tile<T, DP>(sQ, (const T *)a.q + bt0 * a.qs + (long long)h * a.d, a.qs,
                     i0, a.T, a.d, a.vec);
    load_tile<T, DP>(sO, (const T *)a.dout + bt0 * a.os + (long long)h * a.d,
                     a.os, i0, a.T, a.d, a.vec);
    load_rowvec(sL, a.lse_in + ((long long)b * a.H + h) * a.T, i0, a.T);
    load_rowvec(sD, a.Dr + ((long long)b * a.H + h) * a.T, i0, a.T);
    float dq[4][DP / 8];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < DP / 8; c++)
            dq[i][c] = 0.0f;
    int end = a.causal ? min(a.T, i0 + ATT_TILE) : a.T;
    for (int j0 = 0; j0 < end; j0 += ATT_TILE) {
        __syncthreads();
        load_tile<T, DP>(sK, k, a.ks, j0, a.T, a.d, a.vec);
        load_tile<T, DP>(sV, v, a.vs, j0, a.T, a.d, a.vec);
        __syncthreads();
        float p[4][8], ds[4][8];
        warp_abt<T, DP>(p, sQ, sK, a.d, wa);
        warp_abt<T, DP>(ds, sO, sV, a.d, wa);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = 16 * w + 4 * g + i, row = i0 + r;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int col = j0 + sub + 8 * j;
                bool ok = row < a.T && col < a.T && (!a.causal || col <= row);
                float pv = ok ? expf(p[i][j] * a.scale - sL[r]) : 0.0f;
                ds[i][j] = pv * (ds[i][j] - sD[r]) * a.scale;
            }
        }
        warp_pv<T, DP>(dq, ds, sK, wa, pb, wa);
    }
    add_rows_out<T, DP>((T *)a.dq + bt0 * a.qs + (long long)h * a.d, a.qs, dq,
                        i0, a.T, a.d, a.assign & 1);
}

/* ---- launchers ------------------------------------------------------------ */

enum { ATT_FWD, ATT_DKV, ATT_DQ };

static int att_grid_rows = 65535; /* kcuda_attention_grid_rows */

void kcuda_attention_grid_rows(int rows)
{
    att_grid_rows = rows >= 1 && rows <= 65535 ? rows : 65535;
}

template <typename T, int DP>
static int attn_launch(int which, const attn_args &a, cudaStream_t s)
{
    typedef att_cfg<T, DP> cfg;
    size_t warps = ATT_THREADS / 32 * att_warp<T, DP>::BYTES;
    size_t bytes = which == ATT_FWD
                       ? 3 * cfg::TILE_BYTES + warps
                       : 4 * cfg::TILE_BYTES + 2 * ATT_TILE * sizeof(float) + warps;
    unsigned tiles = (unsigned)((a.T + ATT_TILE - 1) / ATT_TILE);
    void (*kern)(attn_args) = which == ATT_FWD   ? attn_fwd_kernel<T, DP>
                              : which == ATT_DKV ? attn_bwd_dkv_kernel<T, DP>
                                                 : attn_bwd_dq_kernel<T, DP>;
    /* a block per (query or key tile, batch row, head); the rows past the
     * grid's 65535 in z slices (att_row_block), the tiles of one head
     * next to each other (its keys and values stay in L2 among them) */
    long long rows = which == ATT_DKV ? (long long)a.B * a.KV : (long long)a.B * a.H;
    unsigned ys = (unsigned)(rows < att_grid_rows ? rows : att_grid_rows);
    dim3 grid(tiles, ys, (unsigned)((rows + ys - 1) / ys));
    KCUDA_CHECK(cudaFuncSetAttribute(
        kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    kern<<<grid, ATT_THREADS, bytes, s>>>(a);
    KCUDA_LAUNCHED("attention kernel");
    return 0;
}

/* The padded head size's instantiation. */
template <typename T>
static int attn_launch_d(int which, const attn_args &a, cudaStream_t s)
{
    if (a.d <= 32)
        return attn_launch<T, 32>(which, a, s);
    if (a.d <= 64)
        return attn_launch<T, 64>(which, a, s);
    return attn_launch<T, 128>(which, a, s);
}

static int attn_dispatch(int which, const attn_args &a, kcuda_dtype dt,
                         cudaStream_t s)
{
    if (dt == KCUDA_BF16)
        return attn_launch_d<bf16>(which, a, s);
    if (dt == KCUDA_F16)
        return attn_launch_d<f16>(which, a, s);
    return attn_launch_d<float>(which, a, s);
}

/* Checks the sizes and fills the shapes, strides and the vec flag. */
static int attn_setup(attn_args *a, int B, int T, int H, int KV, int d,
                      int causal, kcuda_dtype dt, long long qs, long long kvs)
{
    KCUDA_DT_OK(dt);
    KCUDA_ARG(B >= 0 && T >= 0 && H >= 1 && KV >= 1 && H % KV == 0,
              "attention: bad sizes B=%d T=%d H=%d KV=%d (H %% KV must be 0)",
              B, T, H, KV);
    KCUDA_ARG(d >= 1 && d <= 128,
              "attention: head size d=%d unsupported (1..128)", d);
    KCUDA_ARG((long long)B * H <= 65535LL * 65535,
              "attention: B*H=%lld exceeds the grid's 65535 x 65535",
              (long long)B * H);
    a->B = B;
    a->T = T;
    a->H = H;
    a->KV = KV;
    a->d = d;
    a->causal = causal != 0;
    a->qs = qs;
    a->ks = kvs;
    a->vs = kvs;
    a->os = (long long)H * d;
    a->scale = 1.0f / sqrtf((float)d);
    long long W = dt == KCUDA_F32 ? 4 : 8;
    a->vec = d % W == 0 && qs % W == 0 && kvs % W == 0 && a->os % W == 0 &&
             kcuda__aligned16(a->q, a->k, a->v, a->dout);
    return 0;
}

static int attn_forward(void *out, float *lse, const void *q, const void *k,
                        const void *v, long long qs, long long kvs, int B,
                        int T, int H, int KV, int d, int causal,
                        kcuda_dtype dt, cudaStream_t s)
{
    attn_args a;
    memset(&a, 0, sizeof a);
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = out;
    a.lse = lse;
    KCUDA_TRY(attn_setup(&a, B, T, H, KV, d, causal, dt, qs, kvs));
    if (B == 0 || T == 0)
        return 0;
    return attn_dispatch(ATT_FWD, a, dt, s);
}

static int attn_backward(kcuda_ctx *ctx, void *dq, void *dk, void *dv,
                         const void *dout, const void *out, const float *lse,
                         const void *q, const void *k, const void *v,
                         long long qs, long long kvs, int B, int T, int H,
                         int KV, int d, int causal, int assign,
                         kcuda_dtype dt, cudaStream_t s)
{
    attn_args a;
    memset(&a, 0, sizeof a);
    a.assign = assign;
    a.q = q;
    a.k = k;
    a.v = v;
    a.out = out;
    a.dout = dout;
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.lse_in = lse;
    KCUDA_TRY(attn_setup(&a, B, T, H, KV, d, causal, dt, qs, kvs));
    if (B == 0 || T == 0)
        return 0;
    void *scratch = NULL;
    size_t rows = (size_t)B * H * T;
    KCUDA_ARG((rows + 7) / 8 <= 0x7fffffffu, "attention: B*H*T = %zu rows, too many", rows);
    KCUDA_TRY(kcuda__scratch(ctx, rows * sizeof(float), &scratch, s));
    a.Dw = (float *)scratch;
    a.Dr = a.Dw;
    unsigned blocks = (unsigned)((rows + 7) / 8);
    KCUDA_DISPATCH(dt, E, {
        attn_bwd_d_kernel<E><<<blocks, 256, 0, s>>>(a);
        KCUDA_LAUNCHED("attn_bwd_d_kernel");
    });
    KCUDA_TRY(attn_dispatch(ATT_DKV, a, dt, s));
    return attn_dispatch(ATT_DQ, a, dt, s);
}

int kcuda_attention_forward(void *out, float *lse, const void *q,
                            const void *k, const void *v, int B, int T, int H,
                            int KV, int d, int causal, kcuda_dtype dt,
                            void *stream)
{
    return attn_forward(out, lse, q, k, v, (long long)H * d, (long long)KV * d,
                        B, T, H, KV, d, causal, dt, kcuda__stream(stream));
}

int kcuda_attention_backward(kcuda_ctx *ctx, void *dq, void *dk, void *dv,
                             const void *dout, const void *out,
                             const float *lse, const void *q, const void *k,
                             const void *v, int B, int T, int H, int KV,
                             int d, int causal, int assign, kcuda_dtype dt,
                             void *stream)
{
    return attn_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v,
                         (long long)H * d, (long long)KV * d, B, T, H, KV, d,
                         causal, assign, dt, kcuda__stream(stream));
}

int kcuda_attention_qkv_forward(void *out, float *lse, const void *qkv,
                                int B, int T, int H, int KV, int d,
                                int causal, kcuda_dtype dt, void *stream)
{
    KCUDA_DT_OK(dt);
    size_t es = kcuda_dtype_size(dt);
    long long row = (long long)(H + 2 * KV) * d;
    const char *base = (const char *)qkv;
    return attn_forward(out, lse, base, base + (size_t)H * d * es,
                        base + (size_t)(H + KV) * d * es, row, row, B, T, H,
                        KV, d, causal, dt, kcuda__stream(stream));
}

int kcuda_attention_qkv_backward(kcuda_ctx *ctx, void *dqkv,
                                 const void *dout, const void *out,
                                 const float *lse, const void *qkv, int B,
                                 int T, int H, int KV, int d, int causal,
                                 int assign, kcuda_dtype dt, void *stream)
{
    KCUDA_DT_OK(dt);
    size_t es = kcuda_dtype_size(dt);
    long long row = (long long)(H + 2 * KV) * d;
    const char *base = (const char *)qkv;
    char *dbase = (char *)dqkv;
    size_t ko = (size_t)H * d * es, vo = (size_t)(H + KV) * d * es;
    return attn_backward(ctx, dbase, dbase + ko, dbase + vo, dout, out, lse,
                         base, base + ko, base + vo, row, row, B, T, H, KV, d,
                         causal, assign ? 7 : 0, dt, kcuda__stream(stream));
}
