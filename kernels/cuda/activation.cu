/* activation.cu — elementwise activations: GELU (tanh approximation),
 * SiLU and SwiGLU, forward and backward (which accumulates), on the
 * elementwise engine of kcuda_impl.h (16-byte packs per thread). The
 * formulas are activation.c's, written the same way: GELU through one
 * exponential, x / (1 + e^(-2u)), which keeps its relative accuracy for
 * large negative x. Also the row-masked SwiGLU of the MoE experts.
 */
#include "kcuda_impl.h"

__device__ __forceinline__ float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x). */
__device__ __forceinline__ float silu_grad(float x)
{
    float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* y = gelu(x) */
struct gelu_fwd {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[0] / (1.0f + kc_gelu_exp(x[0]));
    }
};

/* dx += gelu'(x) dout; with s = 1 / (1 + e): gelu' = s + 2 x s (1 - s) u'
 * and 1 - s = e s. x = {x, dout, dx}. */
/* x: x, dout, and (ADD) dx; y: dx (+)= gelu'(x) dout (0 + the gradient
 * when assigned: the same bits as a zeroed dx's) */
template <bool ADD> struct gelu_bwd {
    __device__ void operator()(const float *x, float *y) const
    {
        float xi = x[0], e = kc_gelu_exp(xi);
        float s = 1.0f / (1.0f + e);
        float du = KC_GELU_SCALE * (1.0f + 3.0f * KC_GELU_CUBE * xi * xi);
        y[0] = (ADD ? x[2] : 0.0f) + (s + 2.0f * xi * du * s * (e * s)) * x[1];
    }
};

/* y = x sigmoid(x) */
struct silu_fwd {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[0] * sigmoid(x[0]);
    }
};

/* dx += silu'(x) dout; x = {x, dout, dx} */
template <bool ADD> struct silu_bwd {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = (ADD ? x[2] : 0.0f) + silu_grad(x[0]) * x[1];
    }
};

/* y = silu(gate) up; x = {gate, up} */
struct swiglu_fwd {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[0] * sigmoid(x[0]) * x[1];
    }
};

/* x = {gate, up, dout, dgate, dup}: dgate += silu'(gate) up dout,
 * dup += silu(gate) dout */
struct swiglu_bwd_both {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[3] + silu_grad(x[0]) * x[1] * x[2];
        y[1] = x[4] + x[0] * sigmoid(x[0]) * x[2];
    }
};

/* x = {gate, up, dout, dgate} */
struct swiglu_bwd_gate {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[3] + silu_grad(x[0]) * x[1] * x[2];
    }
};

/* x = {gate, dout, dup} */
struct swiglu_bwd_up {
    __device__ void operator()(const float *x, float *y) const
    {
        y[0] = x[2] + x[0] * sigmoid(x[0]) * x[1];
    }
};

int kcuda_gelu_forward(void *out, const void *x, size_t n, kcuda_dtype dt,
                       void *stream)
{
    const void *in[1] = {x};
    void *o[1] = {out};
    return kc_ew_launch<1, 1>(in, o, n, dt, gelu_fwd(), kcuda__stream(stream));
}

int kcuda_gelu_backward(void *dx, const void *x, const void *dout, size_t n,
                        int assign, kcuda_dtype dt, void *stream)
{
    const void *in[3] = {x, dout, dx};
    void *o[1] = {dx};
    if (assign)
        return kc_ew_launch<2, 1>(in, o, n, dt, gelu_bwd<false>(),
                                  kcuda__stream(stream));
    return kc_ew_launch<3, 1>(in, o, n, dt, gelu_bwd<true>(),
                              kcuda__stream(stream));
}

int kcuda_silu_forward(void *out, const void *x, size_t n, kcuda_dtype dt,
                       void *stream)
{
    const void *in[1] = {x};
    void *o[1] = {out};
    return kc_ew_launch<1, 1>(in, o, n, dt, silu_fwd(), kcuda__stream(stream));
}

int kcuda_silu_backward(void *dx, const void *x, const void *dout, size_t n,
                        int assign, kcuda_dtype dt, void *stream)
{
    const void *in[3] = {x, dout, dx};
    void *o[1] = {dx};
    if (assign)
        return kc_ew_launch<2, 1>(in, o, n, dt, silu_bwd<false>(),
                                  kcuda__stream(stream));
    return kc_ew_launch<3, 1>(in, o, n, dt, silu_bwd<true>(),
                              kcuda__stream(stream));
}

int kcuda_swiglu_forward(void *out, const void *gate, const void *up,
                         size_t n, kcuda_dtype dt, void *stream)
{
    const void *in[2] = {gate, up};
    void *o[1] = {out};
    return kc_ew_launch<2, 1>(in, o, n, dt, swiglu_fwd(),
                              kcuda__stream(stream));
}

int kcuda_swiglu_backward(void *dgate, void *dup, const void *dout,
                          const void *gate, const void *up, size_t n,
                          kcuda_dtype dt, void *stream)
{
    cudaStream_t s = kcuda__stream(stream);
    if (dgate && dup) {
        const void *in[5] = {gate, up, dout, dgate, dup};
        void *o[2] = {dgate, dup};
        return kc_ew_launch<5, 2>(in, o, n, dt, swiglu_bwd_both(), s);
    }
    if (dgate) {
        const void *in[4] = {gate, up, dout, dgate};
        void *o[1] = {dgate};
        return kc_ew_launch<4, 1>(in, o, n, dt, swiglu_bwd_gate(), s);
    }
    if (dup) {
        const void *in[3] = {gate, dout, dup};
        void *o[1] = {dup};
        return kc_ew_launch<3, 1>(in, o, n, dt, swiglu_bwd_up(), s);
    }
    KCUDA_DT_OK(dt);
    return 0;
}

/* ---- the MoE experts' SwiGLU, masked by each expert's row count --------- */

/* act[e,c,f] = silu(hg) hu for c < count[e], else 0. */
template <typename T>
__global__ void swiglu_rows_fwd_kernel(T *act, const T *hg, const T *hu,
                                       const int *count, int C, size_t n,
                                       int F)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        size_t row = i / (size_t)F;
        int e = (int)(row / (size_t)C), c = (int)(row % (size_t)C);
        float g = kc_f(hg[i]);
        act[i] = kc_to<T>(c < count[e] ? g * sigmoid(g) * kc_f(hu[i]) : 0.0f);
    }
}

/* dg = silu'(hg) hu dact, du = silu(hg) dact for c < count[e], else 0;
 * du may be dact's buffer (each element is read before it is written). */
template <typename T>
__global__ void swiglu_rows_bwd_kernel(T *dg, T *du, const T *dact,
                                       const T *hg, const T *hu,
                                       const int *count, int C, size_t n,
                                       int F)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        size_t row = i / (size_t)F;
        int e = (int)(row / (size_t)C), c = (int)(row % (size_t)C);
        float g = kc_f(hg[i]), d = kc_f(dact[i]), u = kc_f(hu[i]);
        int keep = c < count[e];
        float s = sigmoid(g);
        dg[i] = kc_to<T>(keep ? d * u * s * (1.0f + g * (1.0f - s)) : 0.0f);
        du[i] = kc_to<T>(keep ? d * (g * s) : 0.0f);
    }
}

int kcuda__swiglu_rows_forward(void *act, const void *hg, const void *hu,
                               const int *count, int E, int C, int F,
                               kcuda_dtype dt, cudaStream_t s)
{
    size_t n = (size_t)E * C * F;
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(dt, T, {
        swiglu_rows_fwd_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (T *)act, (const T *)hg, (const T *)hu, count, C, n, F);
        KCUDA_LAUNCHED("swiglu_rows_fwd_kernel");
    });
    return 0;
}

int kcuda__swiglu_rows_backward(void *dg, void *du, const void *dact,
                                const void *hg, const void *hu,
                                const int *count, int E, int C, int F,
                                kcuda_dtype dt, cudaStream_t s)
{
    size_t n = (size_t)E * C * F;
    if (n == 0)
        return 0;
    KCUDA_DISPATCH(dt, T, {
        swiglu_rows_bwd_kernel<T><<<kcuda__blocks(n, 256), 256, 0, s>>>(
            (T *)dg, (T *)du, (const T *)dact, (const T *)hg, (const T *)hu,
            count, C, n, F);
        KCUDA_LAUNCHED("swiglu_rows_bwd_kernel");
    });
    return 0;
}
