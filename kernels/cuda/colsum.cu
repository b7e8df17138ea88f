/* colsum.cu — column sums over rows in a fixed order, for the gradients
 * that are sums over the batch's rows: a bias's (a matmul's, a broadcast
 * add's), a position embedding's, and a norm's weight and bias (norm.cu
 * sums its own products into the partials and finishes here).
 *
 * Two passes, no atomics: the rows are cut into chunks of COLSUM_ROWS;
 * a block of 32 columns x 8 row lanes sums one chunk into part[chunk, c]
 * (lane y takes rows y, y+8, ..., the 8 lanes added in order); then the
 * same block adds the chunks to dst in the same way. The partials depend
 * on the shape alone, so a call gives the same bits every time. The grid
 * has a block per 32 columns and chunk: a bias of 768 over 32768 rows is
 * 24 x 128 blocks, the whole GPU, where one thread per column would be 3
 * blocks walking 32768 rows each.
 *
 * Where the rows allow (N a multiple of the 16-byte pack's width, src
 * 16-byte aligned), the first pass reads packs: each thread sums a pack
 * of 8 columns (4 in fp32) over the same rows, four rows' loads issued
 * before their adds, so that a warp reads 512 contiguous bytes of a row
 * and every thread keeps 64 bytes in flight. The rows of each column are
 * added in the same order as one column per thread adds them: the same
 * bits (gpu_tests' bias_backward_* check them).
 */
#include "kcuda_impl.h"

/* Lane y of a block of 32 columns x 8 row lanes sums rows y, y + 8, ...
 * of src[M, N] in [r0, r1), and the 8 lanes are added in order. First
 * pass (FINISH false): out[chunk, c] = the sum over the chunk's
 * COLSUM_ROWS rows (fp32 partials). FINISH: out[c] += the sum over all M
 * rows (src the partials, M the chunks). */
template <typename T, typename D, bool FINISH>
__global__ void colsum_kernel(D *out, const T *src, int M, int N)
{
    __shared__ float sh[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = FINISH ? 0 : (int)blockIdx.y * COLSUM_ROWS;
    int r1 = FINISH ? M : min(M, r0 + COLSUM_ROWS);
    float acc = 0.0f;
    if (c < N)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8)
            acc += kc_f(src[(size_t)r * N + c]);
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < N) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++)
            t += sh[y][threadIdx.x];
        if (FINISH)
            out[c] = kc_to<D>(kc_f(out[c]) + t);
        else
            out[(size_t)blockIdx.y * N + c] = kc_to<D>(t);
    }
}

/* The first pass over packs: lane y of a block of 32 packs x 8 row lanes
 * sums rows y, y + 8, ... of its pack's W columns in [r0, r1), and the 8
 * lanes are added in order into out[chunk, c..c+W). N % W == 0, src
 * 16-byte aligned. */
template <typename T>
__global__ void colsum_pack_kernel(float *out, const T *src, int M, int N)
{
    constexpr int W = kc_pack<T>::W;
    __shared__ float sh[8][W][33];
    int c = (blockIdx.x * 32 + threadIdx.x) * W;
    int r0 = (int)blockIdx.y * COLSUM_ROWS, r1 = min(M, r0 + COLSUM_ROWS);
    float acc[W];
#pragma unroll
    for (int j = 0; j < W; j++)
        acc[j] = 0.0f;
    if (c < N) {
        const T *p = src + c;
        int r = r0 + (int)threadIdx.y;
        for (; r + 24 < r1; r += 32) { /* four rows: loads, then adds in order */
            float x[4][W];
#pragma unroll
            for (int u = 0; u < 4; u++)
                kc_load_pack<T>(x[u], p + (size_t)(r + 8 * u) * N);
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int j = 0; j < W; j++)
                    acc[j] += x[u][j];
        }
        for (; r < r1; r += 8) {
            float x[W];
            kc_load_pack<T>(x, p + (size_t)r * N);
#pragma unroll
            for (int j = 0; j < W; j++)
                acc[j] += x[j];
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++)
        sh[threadIdx.y][j][threadIdx.x] = acc[j];
    __syncthreads();
    /* lane y adds the 8 lanes' sums of columns y, y + 8, ... of the block's
     * packs, in lane order */
    for (int j = (int)threadIdx.y; j < W; j += 8) {
        if (c >= N)
            break;
        float t = 0.0f;
        for (int y = 0; y < 8; y++)
            t += sh[y][j][threadIdx.x];
        out[(size_t)blockIdx.y * N + c + j] = t;
    }
}

int kcuda__colsum_chunks(int M, int N, const char *what)
{
    KCUDA_ARG(M >= 0 && N > 0, "%s: bad sizes rows=%d columns=%d", what, M,
              N);
    int chunks = (M + COLSUM_ROWS - 1) / COLSUM_ROWS;
    KCUDA_ARG(chunks <= 65535, "%s: %d rows, at most %d (the column sums' "
              "grid)", what, M, 65535 * COLSUM_ROWS);
    return chunks;
}

int kcuda__colsum_finish(void *dst, kcuda_dtype dst_dt, const float *part,
                         int chunks, int N, cudaStream_t s)
{
    KCUDA_DT_OK(dst_dt);
    dim3 grid((unsigned)((N + 31) / 32)), block(32, 8);
    KCUDA_DISPATCH(dst_dt, D, {
        colsum_kernel<float, D, true><<<grid, block, 0, s>>>((D *)dst, part,
                                                             chunks, N);
        KCUDA_LAUNCHED("colsum_kernel (finish)");
    });
    return 0;
}

int kcuda__colsum_add(kcuda_ctx *ctx, void *dst, kcuda_dtype dst_dt,
                      const void *src, int M, int N, kcuda_dtype dt,
                      cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    KCUDA_ARG(dst_dt == dt || dst_dt == KCUDA_F32,
              "column sum: a sum of dtype %d beside %d", (int)dst_dt, (int)dt);
    int chunks = kcuda__colsum_chunks(M, N, "column sum");
    if (chunks <= 0)
        return chunks;
    void *scratch = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, (size_t)chunks * N * sizeof(float),
                             &scratch, s));
    float *part = (float *)scratch;
    int W = (int)(16 / kcuda_dtype_size(dt)), packs = N % W == 0 && kcuda__aligned16(src);
    dim3 block(32, 8);
    KCUDA_DISPATCH(dt, T, {
        if (packs) {
            dim3 grid((unsigned)((N / W + 31) / 32), (unsigned)chunks);
            colsum_pack_kernel<T><<<grid, block, 0, s>>>(part, (const T *)src, M, N);
            KCUDA_LAUNCHED("colsum_pack_kernel");
        } else {
            dim3 grid((unsigned)((N + 31) / 32), (unsigned)chunks);
            colsum_kernel<T, float, false><<<grid, block, 0, s>>>(
                part, (const T *)src, M, N);
            KCUDA_LAUNCHED("colsum_kernel");
        }
    });
    return kcuda__colsum_finish(dst, dst_dt, part, chunks, N, s);
}
