/* norm.cu — layernorm and rmsnorm over the last axis of [rows,C], plain and
 * fused with the residual add before them, forward and backward.
 *
 * Forward: one warp per row, eight rows per block; the lanes walk the row
 * in 16-byte packs (when the row allows) and sum in fp32, combined by a
 * butterfly; layernorm takes two passes (the mean, then the variance about
 * it), as the CPU does in double. The row statistics are saved as kcpu
 * saves them: mean and rstd (layernorm), rstd (rmsnorm).
 * Backward: dx one warp per row. dw and db are column sums over the rows
 * in a fixed order, no atomics: in the same pass as dx, each warp adds its
 * rows' products into its own column sums in shared memory, a block's
 * warps are added in order for its chunk of 64 rows, and the chunks in a
 * fixed order (colsum.cu) through the context's scratch. (Rows too wide
 * for the shared memory take a pass of their own over dout and x.) They
 * are fp32 beside 2-byte tensors when they are a param's main gradient
 * (dw_dt).
 */
#include "kcuda_impl.h"

#define NORM_ROWS_PER_BLOCK 8

/* n (1 or a pack's width) elements from src into dst, as floats. */
template <typename T>
__device__ __forceinline__ void load_n(float *dst, const T *src, int n)
{
    if (n == kc_pack<T>::W) {
        kc_load_pack<T>(dst, src);
        return;
    }
    dst[0] = kc_f(src[0]);
}

/* n elements from src: as load_n when `packed`, else one by one (a pack's
 * width from a source not on a 16-byte boundary). */
template <typename T>
__device__ __forceinline__ void load_any(float *dst, const T *src, int n, int packed)
{
    if (packed) {
        load_n<T>(dst, src, n);
        return;
    }
    for (int j = 0; j < n; j++)
        dst[j] = kc_f(src[j]);
}

template <typename T>
__device__ __forceinline__ void store_n(T *dst, const float *src, int n)
{
    if (n == kc_pack<T>::W) {
        kc_store_pack<T>(dst, src);
        return;
    }
    dst[0] = kc_to<T>(src[0]);
}

/* Calls f(c, n) for the lane's pieces of a row of C: packs of W at
 * c = (lane + 32 k) W with vec, else single elements at c = lane + 32 k. */
template <typename T, typename F>
__device__ __forceinline__ void row_foreach(int C, int vec, F &&f)
{
    constexpr int W = kc_pack<T>::W;
    int lane = threadIdx.x & 31;
    if (vec) {
        for (int c = lane * W; c < C; c += 32 * W)
            f(c, W);
    } else {
        for (int c = lane; c < C; c += 32)
            f(c, 1);
    }
}

/* ---- forward -------------------------------------------------------------- */

/* One warp per row. ADD: res = a + b (rounded to T and stored), and the
 * norm reads res; else it reads a. RMS: rmsnorm, else layernorm. vec:
 * the norm's operands (res or a, out, w, bias) allow packs, which decides
 * each lane's elements and so the order of the sums; vab: a and b allow
 * them too (else a pack's elements are loaded one by one), so that the
 * fused kernel sums as the norm alone would on res (the same bits). */
template <typename T, bool ADD, bool RMS>
__global__ void norm_fwd_kernel(T *res, T *out, float *mean, float *rstd,
                                const T *a, const T *b, const T *w,
                                const T *bias, int rows, int C, float eps,
                                int vec, int vab)
{
    constexpr int W = kc_pack<T>::W;
    int row = blockIdx.x * NORM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    size_t off = (size_t)row * C;
    const T *xr = ADD ? res + off : a + off;
    T *orow = out + off;
    /* pass 1: the sum (layernorm) or the sum of squares (rmsnorm) */
    float s1 = 0.0f;
    row_foreach<T>(C, vec, [&](int c, int n) {
        float v[W];
        if (ADD) {
            float u[W];
            load_any<T>(v, a + off + c, n, vab);
            load_any<T>(u, b + off + c, n, vab);
            for (int j = 0; j < n; j++) /* the sum as stored (rounded) */
                v[j] = kc_f(kc_to<T>(v[j] + u[j]));
            store_n<T>(res + off + c, v, n);
        } else {
            load_n<T>(v, xr + c, n);
        }
        for (int j = 0; j < n; j++)
            s1 += RMS ? v[j] * v[j] : v[j];
    });
    s1 = kc_warp_sum(s1);
    float mu = 0.0f, rs;
    if (RMS) {
        rs = 1.0f / sqrtf(s1 / (float)C + eps);
    } else {
        mu = s1 / (float)C;
        float s2 = 0.0f;
        row_foreach<T>(C, vec, [&](int c, int n) {
            float v[W];
            load_n<T>(v, xr + c, n);
            for (int j = 0; j < n; j++)
                s2 += (v[j] - mu) * (v[j] - mu);
        });
        s2 = kc_warp_sum(s2);
        rs = 1.0f / sqrtf(s2 / (float)C + eps);
    }
    row_foreach<T>(C, vec, [&](int c, int n) {
        float v[W], wv[W], bv[W];
        load_n<T>(v, xr + c, n);
        load_n<T>(wv, w + c, n);
        if (!RMS && bias)
            load_n<T>(bv, bias + c, n);
        for (int j = 0; j < n; j++) {
            float y = (v[j] - mu) * rs * wv[j];
            v[j] = (!RMS && bias) ? y + bv[j] : y;
        }
        store_n<T>(orow + c, v, n);
    });
    if ((threadIdx.x & 31) == 0) {
        if (!RMS)
            mean[row] = mu;
        rstd[row] = rs;
    }
}

/* Row vectors allowed: packs stay inside rows and every row starts on a
 * 16-byte boundary. */
static int rows_vec(size_t esize, int C, const void *p0, const void *p1,
                    const void *p2, const void *p3, const void *p4)
{
    return (C * esize) % 16 == 0 && kcuda__aligned16(p0, p1, p2, p3, p4);
}

template <bool ADD, bool RMS>
static int norm_forward(void *res, void *out, float *mean, float *rstd,
                        const void *a, const void *b, const void *w,
                        const void *bias, int rows, int C, float eps,
                        kcuda_dtype dt, cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    KCUDA_ARG(rows >= 0 && C > 0, "norm: bad sizes rows=%d C=%d", rows, C);
    if (rows == 0)
        return 0;
    /* (the norm's operands decide, as kcuda_layernorm_forward's of res) */
    int vec = rows_vec(kcuda_dtype_size(dt), C, ADD ? res : a, out, w, NULL,
                       NULL) &&
              kcuda__aligned16(bias);
    int vab = ADD && vec && kcuda__aligned16(a, b, NULL, NULL, NULL);
    unsigned blocks =
        (unsigned)((rows + NORM_ROWS_PER_BLOCK - 1) / NORM_ROWS_PER_BLOCK);
    KCUDA_DISPATCH(dt, T, {
        norm_fwd_kernel<T, ADD, RMS><<<blocks, 32 * NORM_ROWS_PER_BLOCK, 0, s>>>(
            (T *)res, (T *)out, mean, rstd, (const T *)a, (const T *)b,
            (const T *)w, (const T *)bias, rows, C, eps, vec, vab);
        KCUDA_LAUNCHED("norm_fwd_kernel");
    });
    return 0;
}

int kcuda_layernorm_forward(void *out, float *mean, float *rstd,
                            const void *x, const void *w, const void *b,
                            int rows, int C, float eps, kcuda_dtype dt,
                            void *stream)
{
    return norm_forward<false, false>(NULL, out, mean, rstd, x, NULL, w, b,
                                      rows, C, eps, dt, kcuda__stream(stream));
}

int kcuda_rmsnorm_forward(void *out, float *rstd, const void *x,
                          const void *w, int rows, int C, float eps,
                          kcuda_dtype dt, void *stream)
{
    return norm_forward<false, true>(NULL, out, NULL, rstd, x, NULL, w, NULL,
                                     rows, C, eps, dt, kcuda__stream(stream));
}

int kcuda_add_layernorm_forward(void *res, void *out, float *mean,
                                float *rstd, const void *a, const void *b,
                                const void *w, const void *bias, int rows,
                                int C, float eps, kcuda_dtype dt,
                                void *stream)
{
    return norm_forward<true, false>(res, out, mean, rstd, a, b, w, bias, rows,
                                     C, eps, dt, kcuda__stream(stream));
}

int kcuda_add_rmsnorm_forward(void *res, void *out, float *rstd,
                              const void *a, const void *b, const void *w,
                              int rows, int C, float eps, kcuda_dtype dt,
                              void *stream)
{
    return norm_forward<true, true>(res, out, NULL, rstd, a, b, w, NULL, rows,
                                    C, eps, dt, kcuda__stream(stream));
}

/* ---- backward ---------------------------------------------------------- */

#define NORM_BWD_CHUNK 64 /* rows per block when dw (and db) are summed too */
#define NORM_BWD_SMEM (48 * 1024) /* the column sums' shared memory, at most */

/* The slot of element c + j of a row (n = 1, or c a pack's start and n its
 * width) in a warp's column sums: a lane's elements are 32 slots apart and
 * a lane's slots are those equal to it mod 32, so a warp's adds for one j
 * fall in 32 banks and a lane reads and writes only its own. */
__device__ __forceinline__ int norm_slot(int c, int j, int n)
{
    int p = c / n;
    return (p >> 5) * 32 * n + j * 32 + (p & 31);
}

/* norm_slot's inverse: the column of slot s (n as there). */
__device__ __forceinline__ int norm_slot_col(int s, int n)
{
    return ((s / (32 * n)) * 32 + (s & 31)) * n + (s >> 5) % n;
}

/* Each warp takes rows r0 + warp, r0 + warp + warps, ... of its block's
 * chunk of rows. Layernorm, with g = dout w and xhat = (x - mean) rstd:
 *   dx += rstd (g - mean(g) - xhat mean(g xhat));
 * rmsnorm: dx += rstd (g - x k), k = rstd^2 mean(g x) (nothing with dx
 * NULL). COLS: the same pass sums dout xhat (layernorm) or dout x rstd
 * (rmsnorm) and dout (layernorm's db) over the warp's rows into its column
 * sums in shared memory (S slots each: norm_slot), and the block writes
 * their sums, warps in order, to part0 and part1[block, c]. */
template <typename T, bool RMS, bool COLS>
__global__ void norm_bwd_kernel(T *dx, float *part0, float *part1,
                                const T *dout, const T *x, const T *w,
                                const float *mean, const float *rstd,
                                int rows, int C, int vec, int chunk, int S)
{
    constexpr int W = kc_pack<T>::W, NACC = RMS ? 1 : 2;
    extern __shared__ __align__(16) unsigned char smem[];
    float *acc = reinterpret_cast<float *>(smem); /* [warps][NACC][S] */
    int warps = blockDim.x >> 5, warp = threadIdx.x >> 5;
    float *a0 = acc + (size_t)warp * NACC * S, *a1 = a0 + S;
    if (COLS)
        for (int s = threadIdx.x & 31; s < NACC * S; s += 32)
            a0[s] = 0.0f;
    int r0 = blockIdx.x * chunk, r1 = min(rows, r0 + chunk);
    for (int row = r0 + warp; row < r1; row += warps) {
        size_t off = (size_t)row * C;
        float mu = RMS ? 0.0f : mean[row], rs = rstd[row];
        float gmean = 0.0f, gxmean = 0.0f;
        if (dx) {
            float s0 = 0.0f, s1 = 0.0f;
            row_foreach<T>(C, vec, [&](int c, int n) {
                float g[W], xv[W], wv[W];
                load_n<T>(g, dout + off + c, n);
                load_n<T>(xv, x + off + c, n);
                load_n<T>(wv, w + c, n);
                for (int j = 0; j < n; j++) {
                    float gj = g[j] * wv[j];
                    if (RMS) {
                        s1 += gj * xv[j];
                    } else {
                        s0 += gj;
                        s1 += gj * ((xv[j] - mu) * rs);
                    }
                }
            });
            gmean = kc_warp_sum(s0) / (float)C;
            gxmean = kc_warp_sum(s1) / (float)C;
        }
        float k = rs * rs * gxmean;
        row_foreach<T>(C, vec, [&](int c, int n) {
            float g[W], xv[W], wv[W], d[W];
            load_n<T>(g, dout + off + c, n);
            load_n<T>(xv, x + off + c, n);
            if (dx) {
                load_n<T>(wv, w + c, n);
                load_n<T>(d, dx + off + c, n);
            }
            for (int j = 0; j < n; j++) {
                float xhat = RMS ? xv[j] * rs : (xv[j] - mu) * rs;
                if (dx) {
                    float gj = g[j] * wv[j];
                    d[j] += RMS ? rs * (gj - xv[j] * k)
                                : rs * (gj - gmean - xhat * gxmean);
                }
                if (COLS) {
                    int sl = norm_slot(c, j, n);
                    a0[sl] += g[j] * xhat;
                    if (!RMS)
                        a1[sl] += g[j];
                }
            }
            if (dx)
                store_n<T>(dx + off + c, d, n);
        });
    }
    if (!COLS)
        return;
    __syncthreads();
    int n = vec ? W : 1;
    for (int s = threadIdx.x; s < S; s += blockDim.x) {
        int c = norm_slot_col(s, n);
        if (c >= C)
            continue;
        float t0 = 0.0f, t1 = 0.0f;
        for (int v = 0; v < warps; v++) {
            t0 += acc[(size_t)v * NACC * S + s];
            if (!RMS)
                t1 += acc[(size_t)v * NACC * S + S + s];
        }
        part0[(size_t)blockIdx.x * C + c] = t0;
        if (!RMS)
            part1[(size_t)blockIdx.x * C + c] = t1;
    }
}

/* part0[chunk, c] = sum over the chunk's rows of dout xhat (layernorm) or
 * dout x rstd (rmsnorm); part1[chunk, c] = sum of dout (layernorm's db).
 * Block: 32 columns x 8 row lanes, the lane sums added in order. For rows
 * too wide for norm_bwd_kernel's column sums in shared memory. */
template <typename T, bool RMS>
__global__ void norm_bwd_cols_kernel(float *part0, float *part1,
                                     const T *dout, const T *x,
                                     const float *mean, const float *rstd,
                                     int rows, int C)
{
    __shared__ float sh0[8][33], sh1[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(rows, r0 + COLSUM_ROWS);
    float a0 = 0.0f, a1 = 0.0f;
    if (c < C)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) {
            size_t i = (size_t)r * C + c;
            float g = kc_f(dout[i]), xv = kc_f(x[i]);
            if (RMS) {
                a0 += g * (xv * rstd[r]);
            } else {
                a0 += g * ((xv - mean[r]) * rstd[r]);
                a1 += g;
            }
        }
    sh0[threadIdx.y][threadIdx.x] = a0;
    sh1[threadIdx.y][threadIdx.x] = a1;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t0 = 0.0f, t1 = 0.0f;
        for (int y = 0; y < 8; y++) {
            t0 += sh0[y][threadIdx.x];
            t1 += sh1[y][threadIdx.x];
        }
        part0[(size_t)blockIdx.y * C + c] = t0;
        if (part1)
            part1[(size_t)blockIdx.y * C + c] = t1;
    }
}

/* dx alone: a warp per row, NORM_ROWS_PER_BLOCK rows a block. */
template <bool RMS>
static int norm_bwd_dx(void *dx, const void *dout, const void *x,
                       const void *w, const float *mean, const float *rstd,
                       int rows, int C, int vec, kcuda_dtype dt,
                       cudaStream_t s)
{
    unsigned blocks =
        (unsigned)((rows + NORM_ROWS_PER_BLOCK - 1) / NORM_ROWS_PER_BLOCK);
    KCUDA_DISPATCH(dt, T, {
        norm_bwd_kernel<T, RMS, false>
            <<<blocks, 32 * NORM_ROWS_PER_BLOCK, 0, s>>>(
                (T *)dx, (float *)NULL, (float *)NULL, (const T *)dout, (const T *)x,
                (const T *)w, mean, rstd, rows, C, vec, NORM_ROWS_PER_BLOCK,
                0);
        KCUDA_LAUNCHED("norm_bwd_kernel");
    });
    return 0;
}

/* The column sums' partials part0 and (two) part1 [chunks, C], in the
 * context's scratch. */
static int norm_parts(kcuda_ctx *ctx, int chunks, int C, bool two,
                      float **part0, float **part1, cudaStream_t s)
{
    size_t part_bytes = kcuda__round256((size_t)chunks * C * sizeof(float));
    void *scratch = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, (two ? 2 : 1) * part_bytes, &scratch, s));
    *part0 = (float *)scratch;
    *part1 = two ? (float *)((char *)scratch + part_bytes) : NULL;
    return 0;
}

/* dw += the sum over the chunks of part0, db += part1's (each if any). */
static int norm_finish(void *dw, void *db, kcuda_dtype dw_dt,
                       const float *part0, const float *part1, int chunks,
                       int C, cudaStream_t s)
{
    if (dw)
        KCUDA_TRY(kcuda__colsum_finish(dw, dw_dt, part0, chunks, C, s));
    if (db && part1)
        KCUDA_TRY(kcuda__colsum_finish(db, dw_dt, part1, chunks, C, s));
    return 0;
}

/* dx (if any), dw and db (if any) in one pass over dout and x: a block per
 * NORM_BWD_CHUNK rows with as many warps (up to 8) as their column sums
 * fit NORM_BWD_SMEM; 0, or 1 when a warp's do not fit. */
template <bool RMS>
static int norm_bwd_fused(kcuda_ctx *ctx, void *dx, void *dw, void *db,
                          const void *dout, const void *x, const void *w,
                          const float *mean, const float *rstd, int rows,
                          int C, int vec, kcuda_dtype dt, kcuda_dtype dw_dt,
                          cudaStream_t s)
{
    int n = vec ? 16 / (int)kcuda_dtype_size(dt) : 1, nacc = RMS ? 1 : 2;
    int S = (C + 32 * n - 1) / (32 * n) * (32 * n);
    size_t warp_bytes = (size_t)nacc * S * sizeof(float);
    int warps = (int)(NORM_BWD_SMEM / warp_bytes);
    if (warps < 1)
        return 1;
    warps = warps < 8 ? warps : 8;
    int chunks = (rows + NORM_BWD_CHUNK - 1) / NORM_BWD_CHUNK;
    float *part0, *part1;
    KCUDA_TRY(norm_parts(ctx, chunks, C, !RMS, &part0, &part1, s));
    KCUDA_DISPATCH(dt, T, {
        norm_bwd_kernel<T, RMS, true>
            <<<(unsigned)chunks, 32 * warps, warps * warp_bytes, s>>>(
                (T *)dx, part0, part1, (const T *)dout, (const T *)x,
                (const T *)w, mean, rstd, rows, C, vec, NORM_BWD_CHUNK, S);
        KCUDA_LAUNCHED("norm_bwd_kernel (with the column sums)");
    });
    return norm_finish(dw, db, dw_dt, part0, part1, chunks, C, s);
}

template <bool RMS>
static int norm_backward(kcuda_ctx *ctx, void *dx, void *dw, void *db,
                         const void *dout, const void *x, const void *w,
                         const float *mean, const float *rstd, int rows,
                         int C, kcuda_dtype dt, kcuda_dtype dw_dt,
                         cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    KCUDA_ARG(dw_dt == dt || dw_dt == KCUDA_F32,
              "norm: dw of dtype %d beside %d", (int)dw_dt, (int)dt);
    KCUDA_ARG(rows >= 0 && C > 0, "norm: bad sizes rows=%d C=%d", rows, C);
    if (rows == 0)
        return 0;
    int vec = rows_vec(kcuda_dtype_size(dt), C, dx, dout, x, w, NULL);
    if (!dw && !db)
        return dx ? norm_bwd_dx<RMS>(dx, dout, x, w, mean, rstd, rows, C, vec,
                                     dt, s)
                  : 0;
    int rc = norm_bwd_fused<RMS>(ctx, dx, dw, db, dout, x, w, mean, rstd,
                                 rows, C, vec, dt, dw_dt, s);
    if (rc <= 0)
        return rc;
    /* rows too wide: dx, then the column sums in a pass of their own */
    if (dx)
        KCUDA_TRY(norm_bwd_dx<RMS>(dx, dout, x, w, mean, rstd, rows, C, vec,
                                   dt, s));
    int chunks = kcuda__colsum_chunks(rows, C, "norm backward");
    if (chunks <= 0)
        return chunks;
    float *part0, *part1;
    KCUDA_TRY(norm_parts(ctx, chunks, C, !RMS, &part0, &part1, s));
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)chunks), block(32, 8);
    KCUDA_DISPATCH(dt, T, {
        norm_bwd_cols_kernel<T, RMS><<<grid, block, 0, s>>>(
            part0, part1, (const T *)dout, (const T *)x, mean, rstd, rows, C);
        KCUDA_LAUNCHED("norm_bwd_cols_kernel");
    });
    return norm_finish(dw, db, dw_dt, part0, part1, chunks, C, s);
}

int kcuda_layernorm_backward(kcuda_ctx *ctx, void *dx, void *dw, void *db,
                             const void *dout, const void *x, const void *w,
                             const float *mean, const float *rstd, int rows,
                             int C, kcuda_dtype dt, kcuda_dtype dw_dt,
                             void *stream)
{
    return norm_backward<false>(ctx, dx, dw, db, dout, x, w, mean, rstd, rows,
                                C, dt, dw_dt, kcuda__stream(stream));
}

int kcuda_rmsnorm_backward(kcuda_ctx *ctx, void *dx, void *dw,
                           const void *dout, const void *x, const void *w,
                           const float *rstd, int rows, int C, kcuda_dtype dt,
                           kcuda_dtype dw_dt, void *stream)
{
    return norm_backward<true>(ctx, dx, dw, NULL, dout, x, w, NULL, rstd, rows,
                               C, dt, dw_dt, kcuda__stream(stream));
}
