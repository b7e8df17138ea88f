/* attention_wg.cu — the attention's kernels on Hopper's warpgroup
 * products (wgmma, sm_90a): the forward and the default backward's two
 * main kernels of attention.cu, with the same tiles, the same
 * arithmetic between the products and the same outputs
 * (attention_impl.h), every tile product a kc_wgmma (kcuda_ptx.h).
 * attention.cu launches them where kcuda_attention_wgmma asks and the GPU
 * runs the sm_90a code (attn_wg_kernel, at the end).
 */
#include "attention_impl.h" /* defines: attn_args, att_cfg, the shared device functions */
#include "kcuda_impl.h"
#include "kcuda_ptx.h" /* defines: kc_wgmma, kc_wgmma_ss, kc_cp_async16, kc_fence_proxy_async */

/* ---- forward on warpgroup products (wgmma, sm_90a) -------------------------
 *
 * The same forward, the block's 4 warps one warpgroup: each product of a
 * key tile is kc_wgmma's, the tensor cores reading K and V from shared
 * memory once for the whole block, where mma.sync has each warp load
 * every K and V fragment into its registers by ldmatrix (4 times the
 * shared-memory reads, and 48 instructions a warp a tile). The tiles are
 * stored as core matrices (att_cm: [DP / 8 chunks of 8 columns][64 rows]
 * [8], 16 bytes a row of a chunk, no padding): K is then K-major B for
 * S = Q K^T (lbo: the next chunk, 1024 bytes; sbo: the next 8 rows, 128)
 * and V N-major B for O += P V (lbo: the next 8 keys, 128; sbo: the next
 * chunk). Q is K-major A of the first product, in shared memory too (its
 * A operands held in registers over the loop, ptxas (CUDA 13, sm_90a)
 * gave those registers to other values after the first tile's products,
 * in nvdisasm's listing); P is the A operand of the second product in
 * registers, as in attn_fwd_kernel. The softmax of a key tile runs while
 * the tensor cores add the tile before's P V (attn_fwd_wg), and dq's
 * kernel overlaps its products alike (attn_bwd_dq_wg); the dk/dv kernel
 * computes P while dP^T is being summed, no more. Only the
 * accumulators' order within a product differs from attn_fwd_kernel's,
 * so the results may differ in their last bits on a GPU (not on the
 * emulation). 2-byte types, a.vec, sm_90a (kcuda_attention_wgmma). */

/* A kernel on warpgroup products, T and DP its template's: in a device
 * pass without wgmma (the build's compute_90 PTX) its trap alone (never
 * launched there: attn_wg_available), the body not even instantiated;
 * else BODY<T, DP>(a, smem) over the block's dynamic shared memory. */
#ifdef KC_WGMMA_ABSENT
#define ATT_WG_KERNEL(BODY)                                                    \
    {                                                                          \
        (void)a;                                                               \
        __trap();                                                              \
    }
#else
#define ATT_WG_KERNEL(BODY)                                                    \
    {                                                                          \
        static_assert(att_cfg<T, DP>::TC, "wgmma: 2-byte types");              \
        extern __shared__ __align__(128) unsigned char smem[];                 \
        BODY<T, DP>(a, smem);                                                  \
    }
#endif

/* Bytes of a [64 x DP] tile of core matrices. */
template <typename T, int DP>
__host__ __device__ constexpr size_t att_cm_bytes()
{
    return (size_t)ATT_TILE * DP * sizeof(T);
}

/* The bytes from one chunk of a tile of core matrices to the next. */
#define ATT_CM_CHUNK (ATT_TILE * 16)

/* Element offset of (row, chunk c) in a tile of core matrices. */
__device__ __forceinline__ int att_cm(int row, int c)
{
    return c * ATT_TILE * 8 + row * 8;
}

/* queue_tile into a tile of core matrices, in 16-byte packs (a.vec only):
 * DP / 16 passes of the block's 128 threads; in a pass, lane l of warp w
 * copies row l % 8 + 8 w + 32 (pass % 2), chunk (l / 8) % 4 + 4 (pass / 2),
 * so that each 8 lanes' stores fall in 8 different 16-byte bank groups
 * and each row's 4 chunks a pass are 64 contiguous bytes read. */
template <typename T, int DP>
__device__ void queue_tile_cm(T *dst, const T *src, long long stride, int row0, int T_, int d)
{
    static_assert(DP % 32 == 0 && ATT_THREADS == 128, "queue_tile_cm: whole passes");
    int tid = threadIdx.x;
    int rb = (tid & 7) + 8 * (tid >> 5), cb = (tid >> 3) & 3;
#pragma unroll
    for (int i = 0; i < DP / 16; i++) {
        int r = rb + 32 * (i & 1), c = cb + 4 * (i >> 1);
        bool in = 8 * c < d && row0 + r < T_;
        const T *from = in ? src + (long long)(row0 + r) * stride + 8 * c : src;
        kc_cp_async16(dst + att_cm(r, c), from, in);
    }
}

/* pa = the warp's [16 x 64] tile a (P or dS, rows the warp's) rounded to
 * 2 bytes, as the A operands of 4 products over the tile's columns. */
template <typename T>
__device__ __forceinline__ void wg_pack(uint32_t (&pa)[4][4], const float (&a)[8][4])
{
#pragma unroll
    for (int kk = 0; kk < ATT_TILE / 16; kk++) {
        pa[kk][0] = kc_pack2<T>(a[2 * kk][0], a[2 * kk][1]);
        pa[kk][1] = kc_pack2<T>(a[2 * kk][2], a[2 * kk][3]);
        pa[kk][2] = kc_pack2<T>(a[2 * kk + 1][0], a[2 * kk + 1][1]);
        pa[kk][3] = kc_pack2<T>(a[2 * kk + 1][2], a[2 * kk + 1][3]);
    }
}

/* acc += A X over the 64 keys (or queries) of a step: A packed by wg_pack,
 * X a tile of core matrices [64][DP] read N-major. Queued (the caller
 * packs every A first, then fences, and commits and waits after). */
template <typename T, int DP>
__device__ __forceinline__ void wg_acc_x(float (&acc)[DP / 8][4], const uint32_t (&pa)[4][4], const T *X)
{
#pragma unroll
    for (int kk = 0; kk < ATT_TILE / 16; kk++)
        kc_wgmma<T, DP, 1>(acc, pa[kk], X + att_cm(16 * kk, 0), 128, ATT_CM_CHUNK, 1);
}

/* s = A B^T over the head size, A and B tiles of core matrices [64][DP]
 * (both K-major, from shared memory). Queued. */
template <typename T, int DP>
__device__ __forceinline__ void wg_abt(float (&s)[8][4], const T *A, const T *B)
{
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++)
        kc_wgmma_ss<T, ATT_TILE, 0>(s, A + att_cm(0, 2 * kk), ATT_CM_CHUNK, 128, B + att_cm(0, 2 * kk),
                                    ATT_CM_CHUNK, 128, kk);
}

/* queue_tile_cm of key tile `it` of K and of V, as one group of copies:
 * K into the kernel's tile KB + it % KN, V into VB + it % VN (KN and VN
 * copies of each, for the products still reading the tiles before). */
template <typename T, int DP, int KB, int KN, int VB, int VN>
__device__ __forceinline__ void wg_queue_kv(unsigned char *smem, int it, const T *k, const T *v, const attn_args &a)
{
    constexpr size_t TB = att_cm_bytes<T, DP>();
    int j0 = it * ATT_TILE;
    queue_tile_cm<T, DP>((T *)(smem + (KB + it % KN) * TB), k, a.ks, j0, a.T, a.d);
    queue_tile_cm<T, DP>((T *)(smem + (VB + it % VN) * TB), v, a.vs, j0, a.T, a.d);
    kc_cp_async_commit();
}

/* The forward's loop, FlashAttention-3's overlap within a warpgroup: the
 * products of key tile it (S = Q K^T) and of the tile before (O += P V)
 * are queued together, and the softmax of tile it runs while the tensor
 * cores still add P V; only then is O rescaled (its registers are the
 * product's until it is waited for) and tile it's P packed. So O takes
 * exp(m_old - m_new) after the tile before's P V, not before it as in
 * attn_fwd_kernel: the same operations on the same values, in the same
 * order. Shared memory: Q, K twice, V three times (tile it - 1's V is
 * read while tile it + 1's loads). */
template <typename T, int DP>
__device__ __forceinline__ void attn_fwd_wg(const attn_args &a, unsigned char *smem)
{
    int w = threadIdx.x >> 5;
    att_qhead<T> hd;
    if (!att_q_head<T>(a, ATT_TILE, &hd))
        return;
    int i0 = hd.i0, row0 = 16 * w;
    const T *k = hd.k, *v = hd.v;
    constexpr size_t TB = att_cm_bytes<T, DP>();
    const T *sQ = (const T *)smem; /* then K twice, V three times */
    int end = a.causal ? min(a.T, i0 + ATT_TILE) : a.T;
    int tiles = (end + ATT_TILE - 1) / ATT_TILE;
    queue_tile_cm<T, DP>((T *)smem, hd.q, a.qs, i0, a.T, a.d);
    wg_queue_kv<T, DP, 1, 2, 3, 3>(smem, 0, k, v, a);
    kc_cp_async_wait<0>();
    kc_fence_proxy_async();
    __syncthreads(); /* Q and tile 0 are everyone's */
    if (tiles > 1)
        wg_queue_kv<T, DP, 1, 2, 3, 3>(smem, 1, k, v, a);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2], acc[DP / 8][4], s[8][4];
    uint32_t pa[ATT_TILE / 16][4];
    zero_acc<DP>(acc);
    kc_wgmma_fence();
    wg_abt<T, DP>(s, sQ, (const T *)(smem + TB));
    kc_wgmma_commit();
    kc_wgmma_wait<0>();
    kc_wgmma_hold(s);
    if (!att_full(a, i0, 0, false))
        att_mask_scores(s, a, i0 + row0, 0);
    att_softmax_step(s, m, l, corr, a.scale2); /* O is 0: nothing to rescale */
    wg_pack<T>(pa, s);
    for (int it = 1; it < tiles; it++) {
        int j0 = it * ATT_TILE;
        kc_cp_async_wait<0>();
        kc_fence_proxy_async();
        /* tile it is everyone's; tile it - 1's S and tile it - 2's P V
         * are done in every warp, so their buffers take tile it + 1 */
        __syncthreads();
        if (it + 1 < tiles)
            wg_queue_kv<T, DP, 1, 2, 3, 3>(smem, it + 1, k, v, a);
        kc_wgmma_fence();
        wg_abt<T, DP>(s, sQ, (const T *)(smem + (1 + it % 2) * TB));
        kc_wgmma_commit();
        wg_acc_x<T, DP>(acc, pa, (const T *)(smem + (3 + (it - 1) % 3) * TB)); /* tile it - 1's */
        kc_wgmma_commit();
        kc_wgmma_wait<1>(); /* S; P V may still run */
        kc_wgmma_hold(s);
        if (!att_full(a, i0, j0, false))
            att_mask_scores(s, a, i0 + row0, j0);
        att_softmax_step(s, m, l, corr, a.scale2);
        kc_wgmma_wait<0>();
        kc_wgmma_hold(acc);
        att_rescale<DP>(acc, corr);
        wg_pack<T>(pa, s);
    }
    kc_wgmma_fence();
    wg_acc_x<T, DP>(acc, pa, (const T *)(smem + (3 + (tiles - 1) % 3) * TB));
    kc_wgmma_commit();
    kc_wgmma_wait<0>();
    kc_wgmma_hold(acc);
    float *lse = a.lse + ((long long)hd.b * a.H + hd.h) * a.T;
    att_store_rows<T, DP>(hd.o, lse, a, i0 + row0, acc, m, l);
}

template <typename T, int DP>
__global__ void __launch_bounds__(ATT_THREADS, att_fwd_min_blocks<T, DP, 1>())
    attn_fwd_wg_kernel(attn_args a) ATT_WG_KERNEL(attn_fwd_wg)

/* ---- backward on warpgroup products (wgmma, sm_90a) ------------------------
 *
 * The default backward's two main kernels with every tile product
 * Hopper's (kcuda_attention_wgmma), their tiles stored as core matrices
 * as the wgmma forward's: the scores and dP come from two products with
 * both operands in shared memory, both K-major (S^T = K Q^T and
 * dP^T = V dout^T for the dk/dv kernel, S = Q K^T and dP = dout V^T for
 * dq's), and the gradients from products with P, dS (or their
 * transposes) in registers as A and the other tile N-major in shared
 * memory (dV += P^T dout, dK += dS^T Q; dQ += dS K). The probabilities
 * and dS are the default kernels' arithmetic on the same layout. */

/* The dk/dv kernel's blocks an SM: 3 at head sizes up to 64 (168
 * registers, no spills, where ptxas (sm_90a, CUDA 13) takes 186 with no
 * minimum, 2 blocks), else the registers ptxas chooses (235 at d 128,
 * 2 blocks; 158 since P is computed while dP^T is summed). dq's takes
 * 151 at d 64 (3 blocks) with no minimum; 4 would spill. Overlapping
 * the dk/dv kernel's dS with its dV product, or a step with the next,
 * keeps p, dS, dk, dv and the packed P or dS live at once: ptxas
 * serialised the wgmmas at 168 registers (C7512). */
template <int DP>
constexpr int att_dkv_wg_min_blocks()
{
    return DP <= 64 ? 3 : 0;
}

template <typename T, int DP>
__device__ __forceinline__ void attn_bwd_dkv_wg(const attn_args &a, unsigned char *smem)
{
    constexpr size_t TB = att_cm_bytes<T, DP>();
    int j0 = blockIdx.x * ATT_TILE;
    long long bkv = att_row_block(a.B * (long long)a.KV);
    if (bkv < 0)
        return;
    int b = (int)(bkv / a.KV), kvh = (int)(bkv % a.KV), rep = a.H / a.KV;
    long long bt0 = (long long)b * a.T;
    /* K, V, then Q and dout twice, then lse and D twice */
    float *sLD = (float *)(smem + 6 * TB); /* [2][lse 64, D 64] */
    const T *sK = (const T *)smem, *sV = (const T *)(smem + TB);
    int first = a.causal ? j0 : 0;
    int qtiles = (a.T - first + ATT_TILE - 1) / ATT_TILE, steps = rep * qtiles;
    auto queue_step = [&](int i) { /* as the dk/dv kernel's */
        int h = kvh * rep + i / qtiles, i0 = first + (i % qtiles) * ATT_TILE, buf = i & 1;
        long long hrow = ((long long)b * a.H + h) * att_tp(a.T);
        queue_tile_cm<T, DP>((T *)(smem + (2 + 2 * buf) * TB), (const T *)a.q + bt0 * a.qs + (long long)h * a.d,
                             a.qs, i0, a.T, a.d);
        queue_tile_cm<T, DP>((T *)(smem + (3 + 2 * buf) * TB),
                             (const T *)a.dout + bt0 * a.os + (long long)h * a.d, a.os, i0, a.T, a.d);
        queue_rowvec(sLD + 2 * ATT_TILE * buf, a.Lr + hrow, i0, a.T);
        queue_rowvec(sLD + 2 * ATT_TILE * buf + ATT_TILE, a.Dr + hrow, i0, a.T);
        kc_cp_async_commit();
    };
    queue_tile_cm<T, DP>((T *)smem, (const T *)a.k + bt0 * a.ks + (long long)kvh * a.d, a.ks, j0, a.T, a.d);
    queue_tile_cm<T, DP>((T *)(smem + TB), (const T *)a.v + bt0 * a.vs + (long long)kvh * a.d, a.vs, j0, a.T,
                         a.d);
    queue_step(0);
    float dk[DP / 8][4], dv[DP / 8][4];
    zero_acc<DP>(dk);
    zero_acc<DP>(dv);
    for (int i = 0; i < steps; i++) {
        int i0 = first + (i % qtiles) * ATT_TILE, cur = i & 1;
        const T *sQ = (const T *)(smem + (2 + 2 * cur) * TB);
        const T *sO = (const T *)(smem + (3 + 2 * cur) * TB);
        const float *sL = sLD + 2 * ATT_TILE * cur, *sD = sL + ATT_TILE;
        if (i + 1 < steps) {
            queue_step(i + 1);
            kc_cp_async_wait<1>();
        } else {
            kc_cp_async_wait<0>();
        }
        kc_fence_proxy_async();
        __syncthreads(); /* this step's tiles are everyone's */
        /* S^T and dP^T as two groups: P is computed while dP^T is still
         * being summed (overlapping dS with dV's product too would keep
         * more registers than 3 blocks an SM leave: ptxas serialises) */
        float p[8][4], ds[8][4];
        kc_wgmma_fence();
        wg_abt<T, DP>(p, sK, sQ); /* s^T */
        kc_wgmma_commit();
        wg_abt<T, DP>(ds, sV, sO); /* dp^T */
        kc_wgmma_commit();
        kc_wgmma_wait<1>();
        kc_wgmma_hold(p);
        att_tile_math(att_full(a, i0, j0, true), [&](auto masked) {
            att_kq_pass<decltype(masked)::value, true, false>(p, ds, a, j0, i0, sL, sD);
        });
        kc_wgmma_wait<0>();
        kc_wgmma_hold(ds);
        att_kq_pass<false, false, true>(p, ds, a, j0, i0, sL, sD);
        uint32_t pa[4][4], da[4][4];
        wg_pack<T>(pa, p);
        wg_pack<T>(da, ds);
        kc_wgmma_fence();
        wg_acc_x<T, DP>(dv, pa, sO);
        wg_acc_x<T, DP>(dk, da, sQ);
        kc_wgmma_commit();
        kc_wgmma_wait<0>();
        kc_wgmma_hold(dv);
        kc_wgmma_hold(dk);
        __syncthreads(); /* this buffer is read: the next step refills it */
    }
    add_rows_out<T, DP>((T *)a.dk + bt0 * a.ks + (long long)kvh * a.d, a.ks, dk, j0, a.T, a.d, a.assign & 2);
    add_rows_out<T, DP>((T *)a.dv + bt0 * a.vs + (long long)kvh * a.d, a.vs, dv, j0, a.T, a.d, a.assign & 4);
}

template <typename T, int DP>
__global__ void __launch_bounds__(ATT_THREADS, att_dkv_wg_min_blocks<DP>())
    attn_bwd_dkv_wg_kernel(attn_args a) ATT_WG_KERNEL(attn_bwd_dkv_wg)

/* dq's kernel, its products overlapped as the forward's (attn_fwd_wg):
 * key tile it's S and dP are queued with the tile before's dq += dS K
 * (three groups), tile it's P is computed while dP and that product
 * still run, and its dS while the product does. dq's sums
 * are the same, in the same order. Shared memory: Q, dout, K three
 * times (tile it - 1's is read while tile it + 1's loads), V twice, lse
 * and D. */
template <typename T, int DP>
__device__ __forceinline__ void attn_bwd_dq_wg(const attn_args &a, unsigned char *smem)
{
    constexpr size_t TB = att_cm_bytes<T, DP>();
    att_qhead<T> hd;
    if (!att_q_head<T>(a, ATT_TILE, &hd))
        return;
    int i0 = hd.i0;
    long long bt0 = (long long)hd.b * a.T;
    int end = a.causal ? min(a.T, i0 + ATT_TILE) : a.T;
    int tiles = (end + ATT_TILE - 1) / ATT_TILE;
    const T *sQ = (const T *)smem, *sO = (const T *)(smem + TB);
    float *sL = (float *)(smem + 7 * TB), *sD = sL + ATT_TILE;
    att_dq_queue_first<T>(a, hd, sL, sD, [&](int n, const T *src, long long stride, int row0) {
        queue_tile_cm<T, DP>((T *)(smem + (n == 3 ? 5 : n) * TB), src, stride, row0, a.T, a.d); /* V: 5 */
    });
    kc_cp_async_wait<0>();
    kc_fence_proxy_async();
    __syncthreads(); /* Q, dout, lse, D and key tile 0 are everyone's */
    if (tiles > 1)
        wg_queue_kv<T, DP, 2, 3, 5, 2>(smem, 1, hd.k, hd.v, a);
    float dq[DP / 8][4], p[8][4], ds[8][4];
    uint32_t da[4][4];
    zero_acc<DP>(dq);
    kc_wgmma_fence();
    wg_abt<T, DP>(p, sQ, (const T *)(smem + 2 * TB));
    kc_wgmma_commit();
    wg_abt<T, DP>(ds, sO, (const T *)(smem + 5 * TB));
    kc_wgmma_commit();
    kc_wgmma_wait<1>(); /* S: P while dP is summed */
    kc_wgmma_hold(p);
    att_tile_math(att_full(a, i0, 0, true),
                  [&](auto masked) { att_qk_pass<decltype(masked)::value, true, false>(ds, p, a, i0, 0, sL, sD); });
    kc_wgmma_wait<0>();
    kc_wgmma_hold(ds);
    att_qk_pass<false, false, true>(ds, p, a, i0, 0, sL, sD);
    wg_pack<T>(da, ds);
    for (int it = 1; it < tiles; it++) {
        int j0 = it * ATT_TILE;
        kc_cp_async_wait<0>();
        kc_fence_proxy_async();
        /* tile it is everyone's; tile it - 1's S and dP and tile it - 2's
         * dq product are done in every warp, so their buffers take tile
         * it + 1 */
        __syncthreads();
        if (it + 1 < tiles)
            wg_queue_kv<T, DP, 2, 3, 5, 2>(smem, it + 1, hd.k, hd.v, a);
        kc_wgmma_fence();
        wg_abt<T, DP>(p, sQ, (const T *)(smem + (2 + it % 3) * TB));
        kc_wgmma_commit();
        wg_abt<T, DP>(ds, sO, (const T *)(smem + (5 + it % 2) * TB));
        kc_wgmma_commit();
        wg_acc_x<T, DP>(dq, da, (const T *)(smem + (2 + (it - 1) % 3) * TB)); /* tile it - 1's */
        kc_wgmma_commit();
        kc_wgmma_wait<2>(); /* S; dP and dq's may still run */
        kc_wgmma_hold(p);
        att_tile_math(att_full(a, i0, j0, true),
                      [&](auto masked) { att_qk_pass<decltype(masked)::value, true, false>(ds, p, a, i0, j0, sL, sD); });
        kc_wgmma_wait<1>(); /* dP */
        kc_wgmma_hold(ds);
        att_qk_pass<false, false, true>(ds, p, a, i0, j0, sL, sD);
        kc_wgmma_wait<0>();
        kc_wgmma_hold(dq);
        wg_pack<T>(da, ds);
    }
    kc_wgmma_fence();
    wg_acc_x<T, DP>(dq, da, (const T *)(smem + (2 + (tiles - 1) % 3) * TB));
    kc_wgmma_commit();
    kc_wgmma_wait<0>();
    kc_wgmma_hold(dq);
    add_rows_out<T, DP>((T *)a.dq + bt0 * a.qs + (long long)hd.h * a.d, a.qs, dq, i0, a.T, a.d, a.assign & 1);
}

template <typename T, int DP>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dq_wg_kernel(attn_args a) ATT_WG_KERNEL(attn_bwd_dq_wg)

/* ---- the launcher's choice ------------------------------------------------ */

/* 1 where this file's kernels were compiled with wgmma (sm_90a's machine
 * code, or the emulation), else 0 (the compute_90 PTX). */
__global__ void attn_wg_probe_kernel(int *out)
{
#if defined(KC_WGMMA) || defined(EMU_CUDA_RUNTIME_H)
    *out = 1;
#else
    *out = 0;
#endif
}

int attn_wg_available(void)
{
    static int known[64]; /* per device: 0 not asked yet, 1 no, 2 yes */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 0;
    if (!known[dev]) {
        void *d = nullptr;
        int h = 0;
        bool ok = cudaMalloc(&d, sizeof h) == cudaSuccess;
        if (ok) {
            attn_wg_probe_kernel<<<1, 1>>>((int *)d);
            ok = cudaGetLastError() == cudaSuccess && cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess;
        }
        if (d)
            cudaFree(d);
        known[dev] = ok && h == 1 ? 2 : 1;
    }
    return known[dev] == 2;
}

template <typename T, int DP>
static void (*wg_kernel(int which, size_t *bytes))(attn_args)
{
    constexpr size_t TB = att_cm_bytes<T, DP>();
    /* the forward: Q, K twice and V three times; dk/dv: K, V, Q and dout twice, lse
     * and D twice; dq: Q, dout, K three times, V twice, lse and D */
    *bytes = which == ATT_FWD ? 6 * TB
             : which == ATT_DKV ? 6 * TB + 4 * ATT_TILE * sizeof(float)
                                : 7 * TB + 2 * ATT_TILE * sizeof(float);
    return which == ATT_FWD ? attn_fwd_wg_kernel<T, DP>
           : which == ATT_DKV ? attn_bwd_dkv_wg_kernel<T, DP>
                              : attn_bwd_dq_wg_kernel<T, DP>;
}

template <typename T>
static void (*wg_kernel_d(int which, int DP, size_t *bytes))(attn_args)
{
    return DP <= 32 ? wg_kernel<T, 32>(which, bytes)
           : DP <= 64 ? wg_kernel<T, 64>(which, bytes)
                      : wg_kernel<T, 128>(which, bytes);
}

void (*attn_wg_kernel(int which, bool is_bf16, int DP, size_t *bytes))(attn_args)
{
    *bytes = 0;
    if (which != ATT_FWD && which != ATT_DKV && which != ATT_DQ)
        return nullptr;
    return is_bf16 ? wg_kernel_d<bf16>(which, DP, bytes) : wg_kernel_d<f16>(which, DP, bytes);
}
