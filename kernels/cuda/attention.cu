/* attention.cu — causal grouped-query attention in the FlashAttention
 * manner: tiles of 64 query rows by 64 keys in shared memory, an online
 * softmax, and nothing of size T x T anywhere.
 *
 * A block is 4 warps and owns 64 rows (queries, or keys in the dk/dv
 * kernel); warp w owns 16 of them (the forward in 2-byte types at head
 * sizes over 64: 128 rows, 32 a warp in two tiles, attn_fwd_kernel's
 * MT = 2). Every warp-level tile lives in registers in the layout of the
 * tensor cores' m16n8k16 accumulator (kcuda_ptx.h): lane l (g = l / 4,
 * t = l % 4) holds, of a [16 x 64] score tile, s[j][e] at row
 * g + 8 (e / 2), column 8 j + 2 t + e % 2; of a [16 x DP] output tile,
 * acc[n][e] at row g + 8 (e / 2), column 8 n + 2 t + e % 2. So the 4
 * lanes of a quad hold a row and reduce it with two butterfly shuffles
 * (every lane ends with the same bits). After the block loads a K/V (or
 * Q/dO) tile, all the math of a warp is on its own rows, so only the tile
 * loads need __syncthreads.
 *
 * Tile products: bf16 and fp16 on the tensor cores (mma.sync m16n8k16,
 * fp32 accumulation): operands from shared memory by ldmatrix, and the
 * probabilities P (and dS) straight from the score registers, rounded to
 * 2 bytes, as the A operand of the next product (the accumulator's layout
 * is the A operand's, two columns per register): no tile goes through
 * shared memory on its way from one product to the next. fp32 runs the
 * same layout as FMAs from shared memory (padded rows, no bank
 * conflicts), P passing through a per-warp tile; or, where the context
 * asks (kcuda_ctx_set_tf32), on the tensor cores' TF32 products
 * (mma.sync m16n8k8: operands rounded to 10 bits of mantissa, sums in
 * fp32), P and dS again the A operand where they stand (warp_pv). The
 * tiles load by cp.async in every type. The head size is padded
 * to DP = 32, 64 or 128 with zeros.
 *
 * Forward: per block of queries, walk the key tiles (only those at or
 * before the diagonal when causal: the tiles start at multiples of 64, so
 * the first tile shows every row a key and no row's max stays -inf), keep
 * the running max m and sum l per row, rescale the output rows by
 * exp(m_old - m_new), and save lse = m scale + log(l) per row (m the
 * max of the raw scores q.k). Each exponential is one FFMA into log2
 * units (the score times scale log2(e), less the max's) and one ex2
 * (kc_exp2: no compares and multiplies around it for denormal results,
 * expf's eight instructions fewer still): at a head size of 64 the
 * instructions around the tensor cores' bound the loop. lse stays in
 * natural-log units (the CPU's, and the backward's input). Only the tiles
 * with masked entries (the diagonal one when causal, the one across T)
 * compare positions.
 * Backward: a first kernel computes D = rowsum(dout * out) (times the
 * scale) and lse log2(e), per row, which the others queue by cp.async
 * with their tiles (attn_bwd_d_kernel); the dk/dv
 * kernel owns a tile of keys of one kv head and walks its query heads and
 * the query tiles that see it, in order, recomputing p = exp(s - lse)
 * from q, k and the saved lse. By default (and in fp32) a kernel of its
 * own then recomputes p and dp for dq: it owns a tile of queries and walks
 * the key tiles (7 tile products a pair of tiles, against 5, but no
 * atomics and no waiting: the fastest of the three ways on an H200 at
 * GPT-2's shapes). kcuda_ctx_set_deterministic's other modes, 2-byte
 * types only: the dk/dv kernel adds its share of dq (ds k) into an fp32
 * copy with atomics, which a last kernel adds to dq, as they come (mode
 * 0), or (mode 2) in turn, last key tile first, through a counter per
 * (batch, head, query tile); the blocks then run last key tile first, so
 * a block waits only for blocks started before it, and along the
 * diagonal each finds the one before it a step ahead.
 *
 * attention_wg.cu has the forward and this default backward on Hopper's
 * warpgroup products (kcuda_attention_wgmma); what both files share is
 * in attention_impl.h.
 */
#include <string.h> /* defines: memset */

#include "attention_impl.h" /* defines: attn_args, att_cfg, the shared device functions */
#include "kcuda_impl.h"
#include "kcuda_ptx.h" /* defines: kc_mma16816, kc_ldsm4, kc_ldsm4_t, kc_pack2, kc_cp_async16 */

/* ---- tiles ---------------------------------------------------------------- */

/* Queues the copy of dst[64][LD] = rows [row0, row0 + 64) of src (row
 * stride `stride`), the first d columns, zeros past T and past d. With vec
 * (d and the stride multiples of the 16-byte pack's width, src aligned),
 * in packs by cp.async (zeros by its zero fill; rows of 2 DP + 16 bytes,
 * or fp32's 4 DP + 16, keep the packs aligned), so that the next tile
 * loads behind this one's products; else element by element. Either way
 * every thread sees the tile after kc_cp_async_wait and a __syncthreads.
 * A block is ATT_THREADS threads (every attention kernel's launch): in
 * packs, a thread copies the same column of every RS-th row, the loop
 * unrolled, so that a pack costs its copy and an address's add, where a
 * loop over blockDim.x's stride cost 25 instructions a pack (sm_90). */
template <typename T, int DP>
__device__ void queue_tile(T *dst, const T *src, long long stride, int row0,
                           int T_, int d, int vec)
{
    constexpr int LD = att_cfg<T, DP>::LD;
    constexpr int W = kc_pack<T>::W;
    static_assert(LD * sizeof(T) % 16 == 0, "queue_tile: rows of whole 16-byte packs");
    if (vec) {
        constexpr int PPR = DP / W;             /* packs per row */
        constexpr int RS = ATT_THREADS / PPR;   /* rows a pass */
        static_assert(ATT_THREADS % PPR == 0 && ATT_TILE % RS == 0, "queue_tile: whole passes");
        int r = threadIdx.x / PPR, c = (threadIdx.x % PPR) * W;
        bool cin = c < d;
        const T *s = src + (long long)(row0 + r) * stride + c; /* advanced by RS rows a pass */
        long long step = (long long)RS * stride;
        T *t = dst + r * LD + c;
#pragma unroll
        for (int i = 0; i < ATT_TILE / RS; i++, s += step) {
            bool in = cin && row0 + r + RS * i < T_;
            kc_cp_async16(t + RS * i * LD, in ? s : src, in);
        }
        return;
    }
    for (int idx = threadIdx.x; idx < ATT_TILE * DP; idx += blockDim.x) {
        int r = idx / DP, c = idx % DP, gr = row0 + r;
        dst[r * LD + c] =
            gr < T_ && c < d ? src[gr * stride + c] : kc_to<T>(0.0f);
    }
}

/* TF32 (attn_args.tf32): the elements of a [64][LD] fp32 tile that this
 * thread's queue_tile copied (the same vec), rounded in place by
 * kc_tf32_round, after the thread's wait for its copies and before the
 * barrier that shows the tile to the block: each element is rounded once
 * for every warp's products, the values those products would get by
 * rounding each operand as they load it. 2-byte tiles: nothing. */
template <typename T, int DP>
__device__ __forceinline__ void round_tile(T *dst, int vec)
{
    if constexpr (!att_cfg<T, DP>::TC) {
        constexpr int LD = att_cfg<T, DP>::LD, W = kc_pack<T>::W;
        if (vec) {
            constexpr int PPR = DP / W, RS = ATT_THREADS / PPR;
            T *t = dst + (threadIdx.x / PPR) * LD + (threadIdx.x % PPR) * W;
#pragma unroll
            for (int i = 0; i < ATT_TILE / RS; i++) {
                kc_pack<T> p = *reinterpret_cast<kc_pack<T> *>(t + RS * i * LD);
#pragma unroll
                for (int j = 0; j < W; j++)
                    p.v[j] = kc_tf32_round(p.v[j]);
                *reinterpret_cast<kc_pack<T> *>(t + RS * i * LD) = p;
            }
            return;
        }
        for (int idx = threadIdx.x; idx < ATT_TILE * DP; idx += blockDim.x)
            dst[idx / DP * LD + idx % DP] = kc_tf32_round(dst[idx / DP * LD + idx % DP]);
    } else {
        (void)dst, (void)vec;
    }
}

/* ---- warp-level tile products ------------------------------------------- */

/* acc[mt][2 n] and acc[mt][2 n + 1] += a[mt] times the two B operands of
 * one ldmatrix x4 (its matrices 0-1, then 2-3), for mt < MT. */
template <typename T, int MT, int N>
__device__ __forceinline__ void mma_pair_mt(float (&acc)[MT][N][4], int n, const uint32_t (&a)[MT][4],
                                            const uint32_t (&bf)[4])
{
    const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        kc_mma16816<T>(acc[mt][2 * n], a[mt], b0);
        kc_mma16816<T>(acc[mt][2 * n + 1], a[mt], b1);
    }
}

/* s[mt] = the warp's [16 x 64] piece of A B^T over the head size for A's
 * rows [row0 + 16 mt, + 16), mt < MT, A and B [..][LD] tiles, on the
 * tensor cores: per 16 columns of the head size, each A piece by one
 * ldmatrix (matrices: rows 0-7 and 8-15 by columns 0-7, then by 8-15), B's
 * by one per 16 rows of B (stored [n][k]: B operands without .trans; rows
 * 0-7 by columns 0-7 and 8-15, then rows 8-15), each B fragment serving
 * all MT pieces. */
template <typename T, int DP, int MT>
__device__ __forceinline__ void warp_abt_mt(float (&s)[MT][8][4], const T *A, int row0, const T *B)
{
    typedef att_cfg<T, DP> cfg;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[mt][j][e] = 0.0f;
    const T *a = A + (row0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * cfg::LD + 8 * (lane >> 4);
    const T *b = B + ((lane & 7) + 8 * (lane >> 4)) * cfg::LD + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            kc_ldsm4(af[mt], a + 16 * mt * cfg::LD + 16 * kk);
#pragma unroll
        for (int jp = 0; jp < 4; jp++) {
            uint32_t bf[4];
            kc_ldsm4(bf, b + 16 * jp * cfg::LD + 16 * kk);
            mma_pair_mt<T>(s, jp, af, bf);
        }
    }
}

/* af = the A operands of the warp's rows [row0, row0 + 16) of the [64][LD]
 * tile A over the whole head size, as warp_abt_mt loads them: for a block
 * whose A tile stays the same over its loop (the forward's queries), held
 * in registers rather than loaded again for each tile of B. */
template <typename T, int DP>
__device__ __forceinline__ void load_a_frags(uint32_t (&af)[DP / 16][4], const T *A, int row0)
{
    typedef att_cfg<T, DP> cfg;
    int lane = threadIdx.x & 31;
    const T *a = A + (row0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * cfg::LD + 8 * (lane >> 4);
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++)
        kc_ldsm4(af[kk], a + 16 * kk);
}

/* s = warp_abt_mt's one piece, its A operands af (load_a_frags) in
 * registers: the same products in the same order, the same bits. */
template <typename T, int DP>
__device__ __forceinline__ void warp_abt_regs(float (&s)[8][4], const uint32_t (&af)[DP / 16][4], const T *B)
{
    typedef att_cfg<T, DP> cfg;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[j][e] = 0.0f;
    const T *b = B + ((lane & 7) + 8 * (lane >> 4)) * cfg::LD + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++)
#pragma unroll
        for (int jp = 0; jp < 4; jp++) {
            uint32_t bf[4];
            kc_ldsm4(bf, b + 16 * jp * cfg::LD + 16 * kk);
            mma_pair_mt<T>(reinterpret_cast<float(&)[1][8][4]>(s), jp,
                           reinterpret_cast<const uint32_t(&)[1][4]>(af[kk]), bf);
        }
}

/* s = A[16 w .. 16 w + 16) B^T over the head size: the warp's [16 x 64]
 * piece of A B^T, A and B [64][LD] tiles. Tensor cores: warp_abt_mt's one
 * piece. fp32: FMAs over the first d columns, or with tf32 TF32 products
 * (m16n8k8) over the padded head size, 8 columns at a time, A and B
 * rounded already (round_tile): A's row g, columns t and t + 4, and B's
 * key g by ldmatrix (whose 16-byte rows of 4 floats give lane (g, t) its
 * row's element t; rows of 4 DP + 16 bytes: no bank conflicts). */
template <typename T, int DP>
__device__ __forceinline__ void warp_abt(float (&s)[8][4], const T *A,
                                         const T *B, int d, bool tf32)
{
    typedef att_cfg<T, DP> cfg;
    int w = threadIdx.x >> 5;
    if constexpr (cfg::TC) {
        (void)d, (void)tf32;
        warp_abt_mt<T, DP, 1>(reinterpret_cast<float(&)[1][8][4]>(s), A, 16 * w, B);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[j][e] = 0.0f;
        if (tf32) {
            /* A's rows 16 w .. + 15 and B's 64 by ldmatrix, 4 fp32 columns
             * a 16-byte row: A's matrices rows 0-7 and 8-15 by columns
             * kk .. kk + 3, then kk + 4 ..; B's keys 16 jp .. + 7 by
             * columns kk .., kk + 4 .., then keys 16 jp + 8 .. */
            int lane = threadIdx.x & 31;
            const float *a = reinterpret_cast<const float *>(A) +
                             (16 * w + (lane & 7) + 8 * ((lane >> 3) & 1)) * cfg::LD + 4 * (lane >> 4);
            const float *b = reinterpret_cast<const float *>(B) + ((lane & 7) + 8 * (lane >> 4)) * cfg::LD +
                             4 * ((lane >> 3) & 1);
#pragma unroll
            for (int kk = 0; kk < DP; kk += 8) {
                uint32_t af[4];
                kc_ldsm4(af, a + kk);
#pragma unroll
                for (int jp = 0; jp < 4; jp++) {
                    uint32_t bf[4];
                    kc_ldsm4(bf, b + 16 * jp * cfg::LD + kk);
                    const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
                    kc_mma1688_tf32(s[2 * jp], af, b0);
                    kc_mma1688_tf32(s[2 * jp + 1], af, b1);
                }
            }
            return;
        }
        const float *a0 = reinterpret_cast<const float *>(A) + (16 * w + att_row(0)) * cfg::LD;
        const float *a1 = a0 + 8 * cfg::LD;
        const float *b = reinterpret_cast<const float *>(B) + att_col(0) * cfg::LD;
#pragma unroll 2
        for (int kk = 0; kk < d; kk++) {
            float x0 = a0[kk], x1 = a1[kk];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float y0 = b[8 * j * cfg::LD + kk], y1 = b[(8 * j + 1) * cfg::LD + kk];
                s[j][0] += x0 * y0;
                s[j][1] += x0 * y1;
                s[j][2] += x1 * y0;
                s[j][3] += x1 * y1;
            }
        }
    }
}

/* acc[mt] += A[mt] X[16 kk .. 16 kk + 16) for mt < MT: A[mt] a [16 x 16]
 * A operand (of the rows' columns 16 kk ..), X a [64][LD] tile stored
 * [k][n], whose B operands ldmatrix .trans gives (matrices: rows 0-7 and
 * 8-15 by columns 0-7, then by 8-15), each loaded once for all MT.
 * Tensor cores only. */
template <typename T, int DP, int MT>
__device__ __forceinline__ void mma_x(float (&acc)[MT][DP / 8][4], const uint32_t (&pa)[MT][4],
                                      const T *X, int kk)
{
    typedef att_cfg<T, DP> cfg;
    int lane = threadIdx.x & 31;
    const T *x = X + (16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)) * cfg::LD + 8 * (lane >> 4);
#pragma unroll
    for (int np = 0; np < DP / 16; np++) {
        uint32_t bf[4];
        kc_ldsm4_t(bf, x + 16 * np);
        mma_pair_mt<T>(acc, np, pa, bf);
    }
}

/* acc[mt] += P[mt] X for mt < MT: P[mt] the warp's [16 x 64] tiles in
 * registers, X a [64][LD] tile (rows indexed by P's columns), acc[mt] the
 * warp's [16 x DP] pieces. P rounded to 2 bytes is the A operand as it
 * stands (its columns 16 kk .. 16 kk + 16 are p[2 kk] and p[2 kk + 1]);
 * each of X's fragments (ldmatrix .trans) loaded once for all MT tiles.
 * Tensor cores only. */
template <typename T, int DP, int MT>
__device__ __forceinline__ void warp_pv_mt(float (&acc)[MT][DP / 8][4], const float (&p)[MT][8][4], const T *X)
{
#pragma unroll
    for (int kk = 0; kk < ATT_TILE / 16; kk++) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            pa[mt][0] = kc_pack2<T>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            pa[mt][1] = kc_pack2<T>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            pa[mt][2] = kc_pack2<T>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            pa[mt][3] = kc_pack2<T>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
        mma_x<T, DP, MT>(acc, pa, X, kk);
    }
}

/* acc += P X: P the warp's [16 x 64] tile in registers, X a [64][LD]
 * tile (rows indexed by P's columns), acc the warp's [16 x DP] piece.
 * Tensor cores: warp_pv_mt's one tile. fp32: P goes through the warp's
 * tile pf[16][LDF]; or with tf32, TF32 products (m16n8k8) with P as the
 * A operand where it stands: a product's k index t stands for P's column
 * 2t of the 8 and t + 4 for 2t + 1 (the accumulator's two columns), so
 * its B operand is X's rows 2t and 2t + 1 (any order of k gives the same
 * sum of products). */
template <typename T, int DP>
__device__ __forceinline__ void warp_pv(float (&acc)[DP / 8][4],
                                        const float (&p)[8][4], const T *X,
                                        float *pf, bool tf32)
{
    typedef att_cfg<T, DP> cfg;
    if constexpr (cfg::TC) {
        (void)pf, (void)tf32;
        warp_pv_mt<T, DP, 1>(reinterpret_cast<float(&)[1][DP / 8][4]>(acc),
                             reinterpret_cast<const float(&)[1][8][4]>(p), X);
    } else if (tf32) {
        (void)pf;
        int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        const float *x = reinterpret_cast<const float *>(X) + 2 * t * cfg::LD + g;
#pragma unroll
        for (int kc = 0; kc < 8; kc++) {
            const uint32_t pa[4] = {kc_tf32(p[kc][0]), kc_tf32(p[kc][2]), kc_tf32(p[kc][1]), kc_tf32(p[kc][3])};
#pragma unroll
            for (int n = 0; n < DP / 8; n++) {
                const uint32_t bf[2] = {kc_bits(x[8 * kc * cfg::LD + 8 * n]), kc_bits(x[(8 * kc + 1) * cfg::LD + 8 * n])};
                kc_mma1688_tf32(acc[n], pa, bf);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                pf[att_row(e) * cfg::LDF + 8 * j + att_col(e)] = p[j][e];
        __syncwarp();
        const float *p0 = pf + att_row(0) * cfg::LDF, *p1 = p0 + 8 * cfg::LDF;
        const float *x = reinterpret_cast<const float *>(X) + att_col(0);
#pragma unroll 2
        for (int jj = 0; jj < ATT_TILE; jj++) {
            float u0 = p0[jj], u1 = p1[jj];
#pragma unroll
            for (int n = 0; n < DP / 8; n++) {
                float y0 = x[jj * cfg::LD + 8 * n], y1 = x[jj * cfg::LD + 8 * n + 1];
                acc[n][0] += u0 * y0;
                acc[n][1] += u0 * y1;
                acc[n][2] += u1 * y0;
                acc[n][3] += u1 * y1;
            }
        }
        __syncwarp();
    }
}

/* The i-th [64 x LD] tile of shared memory. */
template <typename T, int DP>
__device__ __forceinline__ T *att_tile(unsigned char *smem, int i)
{
    return (T *)(smem + i * att_cfg<T, DP>::TILE_BYTES);
}

/* The warp's P tile (fp32 path), at byte `base` of shared memory. */
template <typename T, int DP>
__device__ __forceinline__ float *warp_scratch(unsigned char *base)
{
    return (float *)(base + (threadIdx.x >> 5) * att_cfg<T, DP>::WARP_BYTES);
}

/* Key tile `it` of `tiles` (keys from 64 it), double-buffered: its K and
 * V in the pair of tiles at base + 2 (it % 2), base + 2 (it % 2) + 1,
 * queued by the call before (the first by the kernel); queues the next
 * tile into the other pair, which the last iteration read (the caller's
 * __syncthreads after its products guards it), then waits for this one
 * and makes it everyone's. TF32: rounds this one first (round_tile), and
 * at the first tile round_first() the tiles the kernel queued with it. */
template <typename T, int DP, typename F>
__device__ __forceinline__ void kv_tile(unsigned char *smem, int base, int it, int tiles,
                                        const T *k, const T *v, const attn_args &a,
                                        const T **sK, const T **sV, F round_first)
{
    int cur = it & 1;
    *sK = att_tile<T, DP>(smem, base + 2 * cur);
    *sV = att_tile<T, DP>(smem, base + 2 * cur + 1);
    if (it + 1 < tiles) {
        int j1 = (it + 1) * ATT_TILE;
        queue_tile<T, DP>(att_tile<T, DP>(smem, base + 2 - 2 * cur), k, a.ks, j1, a.T, a.d, a.vec);
        queue_tile<T, DP>(att_tile<T, DP>(smem, base + 3 - 2 * cur), v, a.vs, j1, a.T, a.d, a.vec);
        kc_cp_async_commit();
        kc_cp_async_wait<1>();
    } else {
        kc_cp_async_wait<0>();
    }
    if (a.tf32) { /* (fp32 only) this tile's, and at the first the kernel's first tiles' */
        round_tile<T, DP>(att_tile<T, DP>(smem, base + 2 * cur), a.vec);
        round_tile<T, DP>(att_tile<T, DP>(smem, base + 2 * cur + 1), a.vec);
        if (it == 0)
            round_first();
    }
    __syncthreads(); /* this tile is everyone's */
}

/* ---- forward -------------------------------------------------------------- */

/* The forward: a block of 64 MT query rows, MT x 16 a warp (MT = 2:
 * FlashAttention-2's blocks of 128 rows, 2-byte types only; fp32 has 1).
 * At MT = 2 each K and V fragment a warp loads from shared memory serves
 * its two tiles of 16 rows, and each K and V tile in shared memory 128
 * rows. A warp skips the products of a key tile after all of its rows
 * (causal: on the diagonal at MT = 2, the first warps' half of the last
 * tile), which would add nothing (the probabilities 0, the rescaling by
 * 1): every row's arithmetic is the same, in the same order, at either
 * MT, and so are its bits. */
template <typename T, int DP, int MT>
__global__ void __launch_bounds__(ATT_THREADS, att_fwd_min_blocks<T, DP, MT>()) attn_fwd_kernel(attn_args a)
{
    typedef att_cfg<T, DP> cfg;
    static_assert(MT == 1 || cfg::TC, "fp32: 16 rows a warp");
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int BR = ATT_TILE * MT; /* the block's query rows */
    int w = threadIdx.x >> 5;
    att_qhead<T> hd;
    if (!att_q_head<T>(a, BR, &hd))
        return;
    const T *q = hd.q, *k = hd.k, *v = hd.v;
    T *o = hd.o;
    int i0 = hd.i0, b = hd.b, h = hd.h;
    /* Q's MT tiles (one [BR][LD] array: a tile's bytes are 64 LD
     * elements), then K and V twice: the next tile's load runs behind this
     * one's products; fp32's P tiles after them */
    const T *sQ = (const T *)smem;
    float *pf = warp_scratch<T, DP>(smem + (4 + MT) * cfg::TILE_BYTES);
    int end = a.causal ? min(a.T, i0 + BR) : a.T;
    int tiles = (end + ATT_TILE - 1) / ATT_TILE;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        queue_tile<T, DP>(att_tile<T, DP>(smem, mt), q, a.qs, i0 + ATT_TILE * mt, a.T, a.d, a.vec);
    queue_tile<T, DP>(att_tile<T, DP>(smem, MT), k, a.ks, 0, a.T, a.d, a.vec);
    queue_tile<T, DP>(att_tile<T, DP>(smem, MT + 1), v, a.vs, 0, a.T, a.d, a.vec);
    kc_cp_async_commit();
    int row0 = 16 * MT * w; /* the warp's first row in the block */
    /* one tile of 16 rows a warp on the tensor cores: its queries' A
     * operands in registers from the first key tile on, not loaded again
     * for each (att_fwd_min_blocks) */
    constexpr bool QREG = MT == 1 && cfg::TC;
    uint32_t qf[DP / 16][4];
    float m[MT][2], l[MT][2], acc[MT][DP / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
        zero_acc<DP>(acc[mt]);
    }
    for (int it = 0; it < tiles; it++) {
        int j0 = it * ATT_TILE;
        const T *sK, *sV;
        kv_tile<T, DP>(smem, MT, it, tiles, k, v, a, &sK, &sV, [&] {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                round_tile<T, DP>(att_tile<T, DP>(smem, mt), a.vec); /* Q */
        });
        if (MT == 1 || !a.causal || j0 <= i0 + row0 + 16 * MT - 1) { /* (warp-uniform) */
            float s[MT][8][4];
            if constexpr (QREG) {
                if (it == 0)
                    load_a_frags<T, DP>(qf, sQ, row0);
                warp_abt_regs<T, DP>(s[0], qf, sK);
            } else if constexpr (cfg::TC) {
                warp_abt_mt<T, DP, MT>(s, sQ, row0, sK);
            } else {
                warp_abt<T, DP>(s[0], sQ, sK, a.d, a.tf32);
            }
            /* -inf where masked: only the diagonal tile (causal) and the
             * one across T have masked entries */
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int r0 = i0 + row0 + 16 * mt;
                if (!att_full(a, MT == 1 ? i0 : r0, j0, false))
                    att_mask_scores(s[mt], a, r0, j0);
                att_online_softmax<DP>(s[mt], m[mt], l[mt], acc[mt], a.scale2);
            }
            if constexpr (cfg::TC)
                warp_pv_mt<T, DP, MT>(acc, s, sV);
            else
                warp_pv<T, DP>(acc[0], s[0], sV, pf, a.tf32);
        }
        __syncthreads(); /* this pair is read: the next iteration refills it */
    }
    float *lse = a.lse + ((long long)b * a.H + h) * a.T;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        att_store_rows<T, DP>(o, lse, a, i0 + row0 + 16 * mt, acc[mt], m[mt], l[mt]);
}

/* ---- backward ------------------------------------------------------------- */

/* The backward's per-row values, in rows of Tp (attn_args.Dw): Ds[b, h, t]
 * = the sum over the head's columns of dout * out, times the scale, and
 * L[b, h, t] = lse log2(e). A warp per row. */
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
    if ((threadIdx.x & 31) == 0) {
        long long bh = (long long)b * a.H + h, at = bh * att_tp(a.T) + t;
        a.Dw[at] = s * a.scale;
        a.Lw[at] = a.lse_in[bh * a.T + t] * KC_LOG2E;
    }
}

/* dq += ds k of the step's query tile (ADQ): every warp's rows of ds^T
 * (keys by queries) into the tile sS, then each warp the product for its
 * 16 queries with the block's 64 keys (A operands of ds by ldmatrix
 * .trans of ds^T), added into the fp32 dqa by atomics; with tickets, in
 * turn: after the key tiles past this one that see the query tile (all
 * of them, or up to the query tile when causal), then this one's ticket
 * given. */
template <typename T, int DP>
__device__ __forceinline__ void dq_atomic(const attn_args &a, const float (&ds)[8][4], T *sS,
                                          const T *sK, int b, int h, int i0, int j0)
{
    typedef att_cfg<T, DP> cfg;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            *reinterpret_cast<uint32_t *>(sS + (16 * w + att_row(2 * r)) * cfg::LDS + 8 * j + att_col(0)) =
                kc_pack2<T>(ds[j][2 * r], ds[j][2 * r + 1]);
    int *tk = nullptr;
    if (a.tickets) {
        int qt = (a.T + ATT_TILE - 1) / ATT_TILE, I = i0 / ATT_TILE, J = j0 / ATT_TILE;
        tk = a.tickets + ((long long)b * a.H + h) * qt + I;
        if (threadIdx.x == 0)
            kc_wait_ge(tk, a.causal ? I - J : qt - 1 - J);
    }
    __syncthreads(); /* every warp's keys (and this tile's turn) */
    float dq[DP / 8][4];
    zero_acc<DP>(dq);
    /* matrices: keys 0-7 by queries 0-7, then by 8-15, then keys 8-15 */
    const T *s = sS + ((lane & 7) + 8 * (lane >> 4)) * cfg::LDS + 16 * w + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < ATT_TILE / 16; kk++) {
        uint32_t af[4];
        kc_ldsm4_t(af, s + 16 * kk * cfg::LDS);
        mma_x<T, DP, 1>(reinterpret_cast<float(&)[1][DP / 8][4]>(dq), reinterpret_cast<uint32_t(&)[1][4]>(af), sK, kk);
    }
    long long hd = (long long)a.H * a.d;
    float *y = a.dqa + (long long)b * a.T * hd + (long long)h * a.d;
    each_out<DP>(dq, i0, a.T, a.d, [&](int row, int col, float v) { atomicAdd(y + row * hd + col, v); });
    if (tk) { /* every thread's adds before the ticket */
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            kc_add_release(tk, 1);
    }
}

/* dK, dV of one tile of 64 keys of one kv head (a warp per 16 keys): for
 * each query head of the group in order, and each query tile that sees
 * these keys, in order, the scores come transposed (keys are the warp's
 * rows): p = exp(s - lse), ds = p (dp - D) scale, dv += p^T dout,
 * dk += ds^T q; with ADQ also dq += ds k (dq_atomic; tensor cores only).
 * The early keys (the most queries) first; with tickets the last keys
 * first, the order of the turns. MINB: the blocks an SM it is compiled
 * for (kcuda_attention_backward_blocks; 0, the default: the registers
 * ptxas chooses). */
template <typename T, int DP, bool ADQ, int MINB>
__global__ void __launch_bounds__(ATT_THREADS, MINB) attn_bwd_dkv_kernel(attn_args a)
{
    typedef att_cfg<T, DP> cfg;
    extern __shared__ __align__(128) unsigned char smem[];
    int w = threadIdx.x >> 5;
    int j0 = (a.tickets ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * ATT_TILE;
    long long bkv = att_row_block(a.B * (long long)a.KV);
    if (bkv < 0)
        return;
    int b = (int)(bkv / a.KV), kvh = (int)(bkv % a.KV), rep = a.H / a.KV;
    long long bt0 = (long long)b * a.T;
    /* K, V, then Q and dout twice (the next pair loads behind this one's
     * products), (ADQ: the ds^T tile,) then lse and D twice */
    T *sS = (T *)(smem + 6 * cfg::TILE_BYTES);
    float *sLD = (float *)(smem + 6 * cfg::TILE_BYTES + (ADQ ? cfg::S_BYTES : 0)); /* [2][lse 64, D 64] */
    float *pf = warp_scratch<T, DP>((unsigned char *)(sLD + 4 * ATT_TILE));
    const T *sK = att_tile<T, DP>(smem, 0), *sV = att_tile<T, DP>(smem, 1);
    int first = a.causal ? j0 : 0;
    int qtiles = (a.T - first + ATT_TILE - 1) / ATT_TILE, steps = rep * qtiles;
    /* step i: query head kvh * rep + i / qtiles, its query tile i % qtiles,
     * into buffer i % 2 */
    auto queue_step = [&](int i) {
        int h = kvh * rep + i / qtiles, i0 = first + (i % qtiles) * ATT_TILE, buf = i & 1;
        long long hrow = ((long long)b * a.H + h) * att_tp(a.T);
        queue_tile<T, DP>(att_tile<T, DP>(smem, 2 + 2 * buf),
                          (const T *)a.q + bt0 * a.qs + (long long)h * a.d, a.qs, i0,
                          a.T, a.d, a.vec);
        queue_tile<T, DP>(att_tile<T, DP>(smem, 3 + 2 * buf),
                          (const T *)a.dout + bt0 * a.os + (long long)h * a.d, a.os,
                          i0, a.T, a.d, a.vec);
        queue_rowvec(sLD + 2 * ATT_TILE * buf, a.Lr + hrow, i0, a.T);
        queue_rowvec(sLD + 2 * ATT_TILE * buf + ATT_TILE, a.Dr + hrow, i0, a.T);
        kc_cp_async_commit();
    };

    queue_tile<T, DP>(att_tile<T, DP>(smem, 0),
                      (const T *)a.k + bt0 * a.ks + (long long)kvh * a.d, a.ks, j0,
                      a.T, a.d, a.vec);
    queue_tile<T, DP>(att_tile<T, DP>(smem, 1),
                      (const T *)a.v + bt0 * a.vs + (long long)kvh * a.d, a.vs, j0,
                      a.T, a.d, a.vec);
    queue_step(0); /* one group with K and V */
    float dk[DP / 8][4], dv[DP / 8][4];
    /* on the tensor cores at head sizes up to 64, compiled for no minimum
     * of blocks: the warp's keys' and values' A operands in registers from
     * the first step on, not loaded again for each (228 registers at d 64,
     * still 2 blocks an SM, no spills; at d 128, or for 3 blocks an SM,
     * they would spill) */
    constexpr bool KREG = cfg::TC && DP <= 64 && MINB == 0;
    uint32_t kf[DP / 16][4], vf[DP / 16][4];
    zero_acc<DP>(dk);
    zero_acc<DP>(dv);
    for (int i = 0; i < steps; i++) {
        int i0 = first + (i % qtiles) * ATT_TILE, cur = i & 1;
        const T *sQ = att_tile<T, DP>(smem, 2 + 2 * cur);
        const T *sO = att_tile<T, DP>(smem, 3 + 2 * cur); /* dout */
        const float *sL = sLD + 2 * ATT_TILE * cur, *sD = sL + ATT_TILE;
        if (i + 1 < steps) { /* into the buffer the last step read */
            queue_step(i + 1);
            kc_cp_async_wait<1>();
        } else {
            kc_cp_async_wait<0>();
        }
        if (a.tf32) { /* (fp32 only) this step's Q and dout, and K and V at the first */
            round_tile<T, DP>(att_tile<T, DP>(smem, 2 + 2 * cur), a.vec);
            round_tile<T, DP>(att_tile<T, DP>(smem, 3 + 2 * cur), a.vec);
            if (i == 0) {
                round_tile<T, DP>(att_tile<T, DP>(smem, 0), a.vec);
                round_tile<T, DP>(att_tile<T, DP>(smem, 1), a.vec);
            }
        }
        __syncthreads(); /* this step's tiles are everyone's */
        float p[8][4], ds[8][4];
        if constexpr (KREG) {
            if (i == 0) {
                load_a_frags<T, DP>(kf, sK, 16 * w);
                load_a_frags<T, DP>(vf, sV, 16 * w);
            }
            warp_abt_regs<T, DP>(p, kf, sQ);  /* s^T */
            warp_abt_regs<T, DP>(ds, vf, sO); /* dp^T */
        } else {
            warp_abt<T, DP>(p, sK, sQ, a.d, a.tf32);  /* s^T */
            warp_abt<T, DP>(ds, sV, sO, a.d, a.tf32); /* dp^T */
        }
        /* p = exp(s - lse) as exp2 of log2 units; the mask's compares
         * only on the tiles that have masked entries */
        att_tile_math(att_full(a, i0, j0, true), [&](auto masked) {
            att_probs_kq<decltype(masked)::value>(p, ds, a, j0, i0, sL, sD);
        });
        warp_pv<T, DP>(dv, p, sO, pf, a.tf32);
        warp_pv<T, DP>(dk, ds, sQ, pf, a.tf32);
        if constexpr (ADQ)
            dq_atomic<T, DP>(a, ds, sS, sK, b, kvh * rep + i / qtiles, i0, j0);
        __syncthreads(); /* this buffer is read: the next step refills it */
    }
    add_rows_out<T, DP>((T *)a.dk + bt0 * a.ks + (long long)kvh * a.d, a.ks,
                        dk, j0, a.T, a.d, a.assign & 2);
    add_rows_out<T, DP>((T *)a.dv + bt0 * a.vs + (long long)kvh * a.d, a.vs,
                        dv, j0, a.T, a.d, a.assign & 4);
}

/* dQ of one tile of 64 queries of one head: over the key tiles it sees,
 * p = exp(s - lse), ds = p (dp - D) scale, dq += ds k. MINB as the dk/dv
 * kernel's. */
template <typename T, int DP, int MINB>
__global__ void __launch_bounds__(ATT_THREADS, MINB) attn_bwd_dq_kernel(attn_args a)
{
    typedef att_cfg<T, DP> cfg;
    extern __shared__ __align__(128) unsigned char smem[];
    att_qhead<T> hd;
    if (!att_q_head<T>(a, ATT_TILE, &hd))
        return;
    int i0 = hd.i0, h = hd.h;
    long long bt0 = (long long)hd.b * a.T;
    const T *k = hd.k, *v = hd.v;
    /* Q, dout, then K and V twice (the next pair loads behind this one's
     * products), then lse and D */
    const T *sQ = att_tile<T, DP>(smem, 0), *sO = att_tile<T, DP>(smem, 1);
    float *sL = (float *)(smem + 6 * cfg::TILE_BYTES);
    float *sD = sL + ATT_TILE;
    float *pf = warp_scratch<T, DP>((unsigned char *)(sD + ATT_TILE));
    int end = a.causal ? min(a.T, i0 + ATT_TILE) : a.T;
    int tiles = (end + ATT_TILE - 1) / ATT_TILE;
    att_dq_queue_first<T>(a, hd, sL, sD, [&](int n, const T *src, long long stride, int row0) {
        queue_tile<T, DP>(att_tile<T, DP>(smem, n), src, stride, row0, a.T, a.d, a.vec);
    });
    float dq[DP / 8][4];
    zero_acc<DP>(dq);
    for (int it = 0; it < tiles; it++) {
        int j0 = it * ATT_TILE;
        const T *sK, *sV;
        kv_tile<T, DP>(smem, 2, it, tiles, k, v, a, &sK, &sV, [&] {
            round_tile<T, DP>(att_tile<T, DP>(smem, 0), a.vec); /* Q, dout */
            round_tile<T, DP>(att_tile<T, DP>(smem, 1), a.vec);
        });
        float p[8][4], ds[8][4];
        warp_abt<T, DP>(p, sQ, sK, a.d, a.tf32);
        warp_abt<T, DP>(ds, sO, sV, a.d, a.tf32);
        att_tile_math(att_full(a, i0, j0, true), [&](auto masked) {
            att_probs_qk<decltype(masked)::value>(ds, p, a, i0, j0, sL, sD);
        });
        warp_pv<T, DP>(dq, ds, sK, pf, a.tf32);
        __syncthreads(); /* this pair is read: the next iteration refills it */
    }
    add_rows_out<T, DP>((T *)a.dq + bt0 * a.qs + (long long)h * a.d, a.qs, dq,
                        i0, a.T, a.d, a.assign & 1);
}

/* dq = (assign's bit: 0, else dq) + dqa, element by element ([B, T, H,
 * d] in dq's rows of qs). */
template <typename T>
__global__ void attn_dq_finish_kernel(attn_args a)
{
    long long hd = (long long)a.H * a.d, n = (long long)a.B * a.T * hd;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    T *p = (T *)a.dq + (i / hd) * a.qs + i % hd;
    *p = kc_to<T>(((a.assign & 1) ? 0.0f : kc_f(*p)) + a.dqa[i]);
}

/* ---- launchers ------------------------------------------------------------ */

static int att_grid_rows = 65535; /* kcuda_attention_grid_rows */
static int att_fwd_rows = 0;      /* kcuda_attention_forward_rows */
static int att_bwd_more = 0;      /* kcuda_attention_backward_blocks */
static int att_bwd_only = 0;      /* kcuda_attention_backward_only */
static int att_wgmma = 0;         /* kcuda_attention_wgmma */

void kcuda_attention_grid_rows(int rows)
{
    att_grid_rows = rows >= 1 && rows <= 65535 ? rows : 65535;
}

void kcuda_attention_forward_rows(int rows)
{
    att_fwd_rows = rows == 64 || rows == 128 ? rows : 0;
}

void kcuda_attention_backward_blocks(int on)
{
    att_bwd_more = on != 0;
}

int kcuda_attention_wgmma(int on)
{
    att_wgmma = on != 0;
    return att_wgmma && attn_wg_available();
}

void kcuda_attention_backward_only(int which)
{
    att_bwd_only = which == 1 || which == 2 ? which : 0;
}

/* The forward's query rows a warp, in tiles of 16 (attn_fwd_kernel's MT),
 * as measured on an H200 (docs/benchmarks.md, B 8 x T 1024, causal, bf16):
 * 1 at a padded head size up to 64 (GPT-2's: 115 TFLOP/s, against 101 with
 * 2; 4 blocks an SM, against 2 at 177 registers a thread); 2 for
 * 2-byte types at 128 (Llama's: 107 against 100, though its registers
 * spill a little). kcuda_attention_forward_rows chooses otherwise. */
template <typename T, int DP>
static int att_fwd_mt(void)
{
    if (!att_cfg<T, DP>::TC)
        return 1;
    return att_fwd_rows ? att_fwd_rows / ATT_TILE : DP <= 64 ? 1 : 2;
}

/* attn_fwd_kernel<T, DP, 2>, instantiated for 2-byte types only */
template <typename T, int DP>
static void (*att_fwd_kernel2(void))(attn_args)
{
    if constexpr (att_cfg<T, DP>::TC)
        return attn_fwd_kernel<T, DP, 2>;
    else
        return attn_fwd_kernel<T, DP, 1>;
}

/* The default backward's kernel `which` (ATT_DKV or ATT_DQ): compiled
 * for more blocks an SM (the dk/dv kernel 3, dq's 4: 168 and 128
 * registers, the dk/dv kernel loading its keys' and values' operands for
 * each step and spilling 52 bytes, against 228 and 128 with no minimum
 * and no spills, ptxas sm_90: dq's is the same either way;
 * tests/gpu/ptxas_budget.txt holds them to it) where
 * kcuda_attention_backward_blocks asks, 2-byte types at DP 64 only. */
template <typename T, int DP>
static void (*att_bwd_kernel(int which))(attn_args)
{
    if constexpr (att_cfg<T, DP>::TC && DP == 64)
        if (att_bwd_more)
            return which == ATT_DQ ? attn_bwd_dq_kernel<T, DP, 4> : attn_bwd_dkv_kernel<T, DP, false, 3>;
    return which == ATT_DQ ? attn_bwd_dq_kernel<T, DP, 0> : attn_bwd_dkv_kernel<T, DP, false, 0>;
}

template <typename T, int DP>
static int attn_launch(int which, const attn_args &a, cudaStream_t s)
{
    typedef att_cfg<T, DP> cfg;
    size_t warps = ATT_THREADS / 32 * cfg::WARP_BYTES;
    /* the forward: Q, K and V twice; dk/dv: K, V, Q and dout twice, (ds^T,)
     * lse and D twice; dq: Q, dout, K and V twice, lse and D */
    bool dkv = which == ATT_DKV || which == ATT_DKV_ADQ, adq = which == ATT_DKV_ADQ && cfg::TC;
    int mt = which == ATT_FWD ? att_fwd_mt<T, DP>() : 1;
    /* on warpgroup products where asked and possible (attention_wg.cu) */
    size_t wg_bytes = 0;
    void (*wgk)(attn_args) = nullptr;
    if constexpr (cfg::TC)
        if (which != ATT_DKV_ADQ && att_wgmma && a.vec && attn_wg_available())
            wgk = attn_wg_kernel(which, std::is_same<T, bf16>::value, DP, &wg_bytes);
    if (wgk)
        mt = 1;
    size_t bytes = wgk ? wg_bytes
                   : which == ATT_FWD ? (4 + mt) * cfg::TILE_BYTES + warps
                   : dkv ? 6 * cfg::TILE_BYTES + (adq ? cfg::S_BYTES : 0) + 4 * ATT_TILE * sizeof(float) + warps
                         : 6 * cfg::TILE_BYTES + 2 * ATT_TILE * sizeof(float) + warps;
    unsigned tiles = (unsigned)((a.T + ATT_TILE * mt - 1) / (ATT_TILE * mt));
    void (*kern)(attn_args) = which == ATT_FWD ? (mt == 2 ? att_fwd_kernel2<T, DP>() : attn_fwd_kernel<T, DP, 1>)
                              : adq            ? attn_bwd_dkv_kernel<T, DP, cfg::TC, 0>
                                               : att_bwd_kernel<T, DP>(dkv ? ATT_DKV : ATT_DQ);
    if (wgk)
        kern = wgk;
    /* a block per (query or key tile, batch row, head); the rows past the
     * grid's 65535 in z slices (att_row_block), the tiles of one head
     * next to each other (its keys and values stay in L2 among them) */
    long long rows = dkv ? (long long)a.B * a.KV : (long long)a.B * a.H;
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
    a->scale2 = a->scale * KC_LOG2E;
    long long W = dt == KCUDA_F32 ? 4 : 8;
    a->vec = d % W == 0 && qs % W == 0 && kvs % W == 0 && a->os % W == 0 &&
             kcuda__aligned16(a->q, a->k, a->v, a->dout);
    return 0;
}

static int attn_forward(kcuda_ctx *ctx, void *out, float *lse, const void *q, const void *k,
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
    a.tf32 = ctx && ctx->tf32 && dt == KCUDA_F32; /* kcuda_ctx_set_tf32 */
    if (B == 0 || T == 0)
        return 0;
    int taken = 0; /* on cuDNN, where the context asks and it takes it */
    KCUDA_TRY(kcuda__cudnn_forward(ctx, a, dt, s, &taken));
    if (taken)
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
    a.tf32 = ctx && ctx->tf32 && dt == KCUDA_F32; /* kcuda_ctx_set_tf32 */
    if (B == 0 || T == 0)
        return 0;
    int taken = 0; /* on cuDNN, where the context asks and it takes it */
    KCUDA_TRY(kcuda__cudnn_backward(ctx, a, dt, s, &taken));
    if (taken)
        return 0;
    void *scratch = NULL;
    size_t rows = (size_t)B * H * T, qn = rows * (size_t)d; /* D; dq's elements */
    /* dq by its own kernel, or (kcuda_ctx_set_deterministic) by the dk/dv
     * kernel's atomics into fp32 scratch, then added, in any order or in
     * turns */
    int adq = ctx->dq_atomics != 0 && dt != KCUDA_F32, turns = adq && ctx->dq_atomics == 2;
    size_t nt = (size_t)B * H * ((T + ATT_TILE - 1) / ATT_TILE); /* tickets */
    /* Ds and L (attn_bwd_d_kernel), each in rows of Tp */
    size_t dbytes = kcuda__round256((size_t)B * H * (size_t)att_tp(T) * sizeof(float));
    size_t abytes = adq ? kcuda__round256(qn * sizeof(float)) : 0;
    KCUDA_ARG((rows + 7) / 8 <= 0x7fffffffu && (qn + 255) / 256 <= 0x7fffffffu,
              "attention: B*H*T = %zu rows, too many", rows);
    KCUDA_TRY(kcuda__scratch(ctx, 2 * dbytes + abytes + (turns ? nt * sizeof(int) : 0), &scratch, s));
    a.Dw = (float *)scratch;
    a.Dr = a.Dw;
    a.Lw = (float *)((char *)scratch + dbytes);
    a.Lr = a.Lw;
    if (adq) { /* dq's fp32 copy and the tickets after it, zeroed together */
        a.dqa = (float *)((char *)scratch + 2 * dbytes);
        a.tickets = turns ? (int *)((char *)scratch + 2 * dbytes + abytes) : NULL;
        KCUDA_CHECK(cudaMemsetAsync(a.dqa, 0, abytes + (turns ? nt * sizeof(int) : 0), s));
    }
    unsigned blocks = (unsigned)((rows + 7) / 8);
    KCUDA_DISPATCH(dt, E, {
        attn_bwd_d_kernel<E><<<blocks, 256, 0, s>>>(a);
        KCUDA_LAUNCHED("attn_bwd_d_kernel");
    });
    if (!adq) {
        if (att_bwd_only != 2)
            KCUDA_TRY(attn_dispatch(ATT_DKV, a, dt, s));
        return att_bwd_only == 1 ? 0 : attn_dispatch(ATT_DQ, a, dt, s);
    }
    KCUDA_TRY(attn_dispatch(ATT_DKV_ADQ, a, dt, s));
    KCUDA_DISPATCH(dt, E, {
        attn_dq_finish_kernel<E><<<(unsigned)((qn + 255) / 256), 256, 0, s>>>(a);
        KCUDA_LAUNCHED("attn_dq_finish_kernel");
    });
    return 0;
}

int kcuda_attention_forward(kcuda_ctx *ctx, void *out, float *lse, const void *q,
                            const void *k, const void *v, int B, int T, int H,
                            int KV, int d, int causal, kcuda_dtype dt,
                            void *stream)
{
    return attn_forward(ctx, out, lse, q, k, v, (long long)H * d, (long long)KV * d,
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

int kcuda_attention_qkv_forward(kcuda_ctx *ctx, void *out, float *lse, const void *qkv,
                                int B, int T, int H, int KV, int d,
                                int causal, kcuda_dtype dt, void *stream)
{
    KCUDA_DT_OK(dt);
    size_t es = kcuda_dtype_size(dt);
    long long row = (long long)(H + 2 * KV) * d;
    const char *base = (const char *)qkv;
    return attn_forward(ctx, out, lse, base, base + (size_t)H * d * es,
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
