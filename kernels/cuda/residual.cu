/* residual.cu — the residual add and the broadcast add of a [T,C] tensor
 * (a position embedding, or a bias with T = 1) onto [B,T,C], forward and
 * backward (which accumulates). The broadcast backward's sums over b are
 * colsum.cu's column sums (fixed order, no atomics), fp32 beside 2-byte
 * tensors when they are a param's main gradient (dp_dt).
 */
#include <climits>

#include "kcuda_impl.h"

/* y = a + b */
struct add2 {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[0] + x[1];
    }
};

/* y0 = x0 + x2, y1 = x1 + x2 (da += dout, db += dout) */
struct add_into2 {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[0] + x[2];
        y[1] = x[1] + x[2];
    }
};

/* y0 = x1, y1 = x0 + x1 (one side's gradient overwritten by dout, the
 * other's added to: a residual add's backward, whose branch gradient is
 * written first and whose stream's is summed) */
struct set_add {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[1];
        y[1] = x[0] + x[1];
    }
};

/* y0 = y1 = x0 (both sides overwritten) */
struct set2 {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[0];
        y[1] = x[0];
    }
};

int kcuda_add_forward(void *out, const void *a, const void *b, size_t n,
                      kcuda_dtype dt, void *stream)
{
    const void *in[2] = {a, b};
    void *o[1] = {out};
    return kc_ew_launch<2, 1>(in, o, n, dt, add2(), kcuda__stream(stream));
}

int kcuda_add_backward(void *da, void *db, const void *dout, size_t n,
                       int assign, kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    /* two buffers: one kernel, dout read once */
    if (da && db && da != db && !(assign & 3)) {
        const void *in[3] = {da, db, dout};
        void *o[2] = {da, db};
        return kc_ew_launch<3, 2>(in, o, n, dt, add_into2(), s);
    }
    if (da && db && da != db && (assign & 3) == 3) {
        const void *in[1] = {dout};
        void *o[2] = {da, db};
        return kc_ew_launch<1, 2>(in, o, n, dt, set2(), s);
    }
    if (da && db && da != db) {
        void *set = assign & 1 ? da : db, *add = assign & 1 ? db : da;
        const void *in[2] = {add, dout};
        void *o[2] = {set, add};
        return kc_ew_launch<2, 2>(in, o, n, dt, set_add(), s);
    }
    /* one buffer (or the same buffer twice: added twice, as on the CPU), or
     * one overwritten: a copy of dout */
    for (int k = 0; k < 2; k++) {
        void *d = k == 0 ? da : db;
        if (!d || n == 0)
            continue;
        if (assign >> k & 1) {
            KCUDA_CHECK(cudaMemcpyAsync(d, dout, n * kcuda_dtype_size(dt),
                                        cudaMemcpyDeviceToDevice, s));
            continue;
        }
        const void *in[2] = {d, dout};
        void *o[1] = {d};
        KCUDA_TRY(kc_ew_launch<2, 1>(in, o, n, dt, add2(), s));
    }
    return 0;
}

/* out[b, i] = a[b, i] + p[i] over i < tc; one thread per element. */
template <typename T>
__global__ void add_bcast_kernel(T *out, const T *a, const T *p, size_t tc,
                                 size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        out[i] = kc_to<T>(kc_f(a[i]) + kc_f(p[i % tc]));
}

int kcuda_add_broadcast_forward(void *out, const void *a, const void *p,
                                int B, int T, int C, kcuda_dtype dt,
                                void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(B >= 0 && T >= 0 && C >= 0, "add_broadcast: bad sizes");
    size_t tc = (size_t)T * C, n = (size_t)B * tc;
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(dt, E, {
        add_bcast_kernel<E><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (E *)out, (const E *)a, (const E *)p, tc, n);
        KCUDA_LAUNCHED("add_bcast_kernel");
    });
    return 0;
}

int kcuda_add_broadcast_backward(kcuda_ctx *ctx, void *da, void *dp,
                                 const void *dout, int B, int T, int C,
                                 kcuda_dtype dt, kcuda_dtype dp_dt,
                                 int da_assign, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    KCUDA_DT_OK(dt);
    KCUDA_ARG(B >= 0 && T >= 0 && C >= 0, "add_broadcast: bad sizes");
    size_t tc = (size_t)T * C;
    KCUDA_ARG(tc <= INT_MAX, "add_broadcast: T*C = %zu, at most %d", tc,
              INT_MAX);
    if (da)
        KCUDA_TRY(kcuda_add_backward(da, NULL, dout, (size_t)B * tc,
                                     da_assign ? 1 : 0, dt, stream));
    if (dp && tc > 0) /* the sums over b: column sums of dout as [B, T*C] */
        KCUDA_TRY(kcuda__colsum_add(ctx, dp, dp_dt, dout, B, (int)tc, dt, s));
    return 0;
}
