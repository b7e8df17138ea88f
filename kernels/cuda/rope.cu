/* rope.cu — rotary position embedding, rotate-half layout (rope.c): channel
 * j < d/2 of a head pairs with j + d/2 and the pair turns by the angle
 * (pos0 + t) * theta^(-2j/d). One thread per pair; the angle, its cosine
 * and sine and the rotation are computed in double, as on the CPU, so the
 * results differ from kcpu's by the last rounding at most.
 */
#include "kcuda_impl.h"

/* sign +1: out = R x (out may be x); sign -1: out += R^T x. */
template <typename T>
__global__ void rope_kernel(T *out, const T *in, int T_, int H, int d,
                            float theta, int pos0, int sign, size_t pairs)
{
    int half = d / 2;
    size_t C = (size_t)H * d;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < pairs;
         i += stride) {
        int j = (int)(i % (size_t)half);
        size_t rest = i / (size_t)half;
        int h = (int)(rest % (size_t)H);
        size_t bt = rest / (size_t)H;
        int t = (int)(bt % (size_t)T_);
        double a = (double)(pos0 + t) * pow((double)theta, -2.0 * j / d);
        double s, c;
        sincos(a, &s, &c);
        s *= sign;
        size_t o = bt * C + (size_t)h * d + (size_t)j;
        double x0 = kc_f(in[o]), x1 = kc_f(in[o + half]);
        float y0 = (float)(x0 * c - x1 * s), y1 = (float)(x0 * s + x1 * c);
        if (sign > 0) {
            out[o] = kc_to<T>(y0);
            out[o + half] = kc_to<T>(y1);
        } else {
            out[o] = kc_to<T>(kc_f(out[o]) + y0);
            out[o + half] = kc_to<T>(kc_f(out[o + half]) + y1);
        }
    }
}

static int rope(void *out, const void *in, int B, int T, int H, int d,
                float theta, int pos0, int sign, kcuda_dtype dt,
                cudaStream_t s)
{
    KCUDA_DT_OK(dt);
    KCUDA_ARG(B >= 0 && T >= 0 && H >= 0 && d > 0 && d % 2 == 0,
              "rope: bad sizes B=%d T=%d H=%d d=%d (d must be even)", B, T, H,
              d);
    size_t pairs = (size_t)B * T * H * (size_t)(d / 2);
    if (pairs == 0)
        return 0;
    KCUDA_DISPATCH(dt, E, {
        rope_kernel<E><<<kcuda__blocks(pairs, 256), 256, 0, s>>>(
            (E *)out, (const E *)in, T, H, d, theta, pos0, sign, pairs);
        KCUDA_LAUNCHED("rope_kernel");
    });
    return 0;
}

int kcuda_rope_forward(void *out, const void *x, int B, int T, int H, int d,
                       float theta, int pos0, kcuda_dtype dt, void *stream)
{
    return rope(out, x, B, T, H, d, theta, pos0, +1, dt,
                kcuda__stream(stream));
}

int kcuda_rope_backward(void *dx, const void *dout, int B, int T, int H,
                        int d, float theta, int pos0, kcuda_dtype dt,
                        void *stream)
{
    return rope(dx, dout, B, T, H, d, theta, pos0, -1, dt,
                kcuda__stream(stream));
}
