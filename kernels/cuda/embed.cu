/* embed.cu — token embedding: a row gather forward, a deterministic row
 * scatter-add backward.
 *
 * The backward must add repeated ids in index order without float atomics.
 * It sorts (id, index) pairs with cub's radix sort, which is stable (equal
 * ids keep their index order), then one block owns each run of equal ids:
 * it starts from the table row and adds the dout rows of the run in order,
 * exactly the additions of kcpu_embedding_backward (the same bits in fp32).
 * Scratch (the context's): the sorted keys and indices and cub's storage.
 */
#include <cub/device/device_radix_sort.cuh> /* defines: cub::DeviceRadixSort */

#include "kcuda_impl.h"

/* out[i, :] = table[ids[i] - row0, :], or zeros outside [0, rows). One
 * thread per element, or per 16-byte pack with vec (C a multiple of the
 * pack width). */
template <typename T>
__global__ void embed_fwd_kernel(T *out, const int32_t *ids, const T *table,
                                 int n, int row0, int rows, int C, int vec)
{
    constexpr int W = kc_pack<T>::W;
    int w = vec ? W : 1;
    size_t per_row = (size_t)(C / w), total = (size_t)n * per_row;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += stride) {
        size_t i = k / per_row;
        int c = (int)(k % per_row) * w;
        int r = ids[i] - row0;
        T *dst = out + i * C + c;
        if (r < 0 || r >= rows) {
            for (int j = 0; j < w; j++)
                dst[j] = kc_to<T>(0.0f);
            continue;
        }
        const T *src = table + (size_t)r * C + c;
        if (vec)
            *reinterpret_cast<kc_pack<T> *>(dst) =
                *reinterpret_cast<const kc_pack<T> *>(src);
        else
            dst[0] = src[0];
    }
}

int kcuda_embedding_rows_forward(void *out, const int32_t *ids,
                                 const void *table, int n, int row0, int rows,
                                 int C, kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(n >= 0 && rows > 0 && C > 0,
              "embedding: bad sizes n=%d rows=%d C=%d", n, rows, C);
    if (n == 0)
        return 0;
    int vec = (C * kcuda_dtype_size(dt)) % 16 == 0 &&
              kcuda__aligned16(out, table);
    KCUDA_DISPATCH(dt, T, {
        size_t work = (size_t)n * (size_t)(vec ? C / kc_pack<T>::W : C);
        embed_fwd_kernel<T><<<kcuda__blocks(work, 256), 256, 0, s>>>(
            (T *)out, ids, (const T *)table, n, row0, rows, C, vec);
        KCUDA_LAUNCHED("embed_fwd_kernel");
    });
    return 0;
}

int kcuda_embedding_forward(void *out, const int32_t *ids, const void *table,
                            int n, int V, int C, kcuda_dtype dt, void *stream)
{
    return kcuda_embedding_rows_forward(out, ids, table, n, 0, V, C, dt,
                                        stream);
}

__global__ void iota_kernel(int32_t *v, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += gridDim.x * blockDim.x)
        v[i] = i;
}

int kcuda_arange(int32_t *out, size_t n, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_ARG(n <= 0x7fffffff, "arange: n=%zu is past int32", n);
    if (n == 0)
        return 0;
    iota_kernel<<<kcuda__blocks(n, 256), 256, 0, s>>>(out, (int)n);
    KCUDA_LAUNCHED("iota_kernel");
    return 0;
}

/* ---- backward ------------------------------------------------------------- */

/* The rows of a run a thread loads before adding them: a frequent token
 * (a comma, " the") has hundreds of rows in a batch, and one load at a
 * time makes its block wait a memory latency per row (the two embeddings'
 * backward took 1.09 ms of GPT-2's step on an H200, 2026-12-04, loading
 * one row at a time; not measured since). */
#define EMBED_ROWS_AHEAD 8

/* Block p owns the run of equal sorted ids that starts at p (if one does):
 * dtable[id - row0, c] += dout[idx[q], c] for q over the run, in order.
 * With vec, a thread takes a 16-byte pack of columns (8 of bf16: GPT-2's
 * 768 in one pass of 96 threads, one load a row of the run), else one
 * column at a time; each column's additions are the same, in the same
 * order, either way. Either loads EMBED_ROWS_AHEAD rows, then adds them
 * in order. */
template <typename T, typename D>
__global__ void embed_bwd_kernel(D *dtable, const T *dout,
                                 const int32_t *keys, const int32_t *idx,
                                 int n, int row0, int rows, int C, int vec)
{
    constexpr int W = kc_pack<T>::W;
    int p = blockIdx.x;
    int id = keys[p];
    if (p > 0 && keys[p - 1] == id)
        return; /* not the start of a run */
    int r = id - row0;
    if (r < 0 || r >= rows)
        return;
    int end = p + 1;
    while (end < n && keys[end] == id)
        end++;
    D *row = dtable + (size_t)r * C;
    constexpr int U = EMBED_ROWS_AHEAD;
    if (vec) {
        for (int c = threadIdx.x * W; c < C; c += blockDim.x * W) {
            float acc[W];
#pragma unroll
            for (int j = 0; j < W; j++)
                acc[j] = kc_f(row[c + j]);
            for (int q = p; q < end; q += U) {
                kc_pack<T> x[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (q + u < end)
                        x[u] = *reinterpret_cast<const kc_pack<T> *>(dout + (size_t)idx[q + u] * C + c);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (q + u < end)
#pragma unroll
                        for (int j = 0; j < W; j++)
                            acc[j] += kc_f(x[u].v[j]);
            }
#pragma unroll
            for (int j = 0; j < W; j++)
                row[c + j] = kc_to<D>(acc[j]);
        }
        return;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = kc_f(row[c]);
        for (int q = p; q < end; q += U) {
            T x[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (q + u < end)
                    x[u] = dout[(size_t)idx[q + u] * C + c];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (q + u < end)
                    acc += kc_f(x[u]);
        }
        row[c] = kc_to<D>(acc);
    }
}

int kcuda_embedding_rows_backward(kcuda_ctx *ctx, void *dtable,
                                  const void *dout, const int32_t *ids, int n,
                                  int row0, int rows, int C, kcuda_dtype dt,
                                  kcuda_dtype table_dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(table_dt == dt || table_dt == KCUDA_F32,
              "embedding: dtable of dtype %d beside %d", (int)table_dt,
              (int)dt);
    KCUDA_ARG(n >= 0 && rows > 0 && C > 0,
              "embedding: bad sizes n=%d rows=%d C=%d", n, rows, C);
    if (n == 0)
        return 0;
    size_t cub_bytes = 0;
    KCUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        NULL, cub_bytes, (const int32_t *)NULL, (int32_t *)NULL,
        (const int32_t *)NULL, (int32_t *)NULL, n, 0, 32, s));
    size_t arr = kcuda__round256((size_t)n * sizeof(int32_t));
    void *scratch = NULL;
    KCUDA_TRY(kcuda__scratch(ctx, 3 * arr + cub_bytes, &scratch, s));
    char *m = (char *)scratch;
    int32_t *keys = (int32_t *)m, *idx_in = (int32_t *)(m + arr);
    int32_t *idx = (int32_t *)(m + 2 * arr);
    void *tmp = m + 3 * arr;
    iota_kernel<<<kcuda__blocks((size_t)n, 256), 256, 0, s>>>(idx_in, n);
    KCUDA_LAUNCHED("iota_kernel");
    /* stable: equal ids keep their index order */
    KCUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, cub_bytes, ids, keys,
                                                idx_in, idx, n, 0, 32, s));
    int vec = (C * kcuda_dtype_size(dt)) % 16 == 0 && kcuda__aligned16(dout);
    KCUDA_DISPATCH(dt, T, {
        if (table_dt == KCUDA_F32) {
            embed_bwd_kernel<T, float><<<(unsigned)n, 128, 0, s>>>(
                (float *)dtable, (const T *)dout, keys, idx, n, row0, rows, C,
                vec);
        } else {
            embed_bwd_kernel<T, T><<<(unsigned)n, 128, 0, s>>>(
                (T *)dtable, (const T *)dout, keys, idx, n, row0, rows, C,
                vec);
        }
        KCUDA_LAUNCHED("embed_bwd_kernel");
    });
    return 0;
}

int kcuda_embedding_backward(kcuda_ctx *ctx, void *dtable, const void *dout,
                             const int32_t *ids, int n, int V, int C,
                             kcuda_dtype dt, void *stream)
{
    return kcuda_embedding_rows_backward(ctx, dtable, dout, ids, n, 0, V, C,
                                         dt, dt, stream);
}
