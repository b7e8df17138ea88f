/* activation.c — elementwise activations: GELU (tanh approximation, as
 * GPT-2), SiLU and SwiGLU. Backward passes accumulate into dx.
 */
#include "kcpu_dense.h"

#include <math.h> /* defines: tanhf, expf */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f

void kcpu_gelu_forward(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_SCALE * (xi + GELU_CUBE * xi * xi * xi);
        out[i] = 0.5f * xi * (1.0f + tanhf(u));
    }
}

void kcpu_gelu_backward(float *dx, const float *x, const float *dout,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_SCALE * (xi + GELU_CUBE * xi * xi * xi);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * xi * xi);
        float g = 0.5f * (1.0f + th) + 0.5f * xi * sech2 * du;
        dx[i] += g * dout[i];
    }
}

/* sigmoid(x) = 1 / (1 + exp(-x)); finite for every finite x. */
static float sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

void kcpu_silu_forward(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * sigmoidf(x[i]);
}

/* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x). */
static float silu_grad(float x)
{
    float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}

void kcpu_silu_backward(float *dx, const float *x, const float *dout,
                        size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] += silu_grad(x[i]) * dout[i];
}

void kcpu_swiglu_forward(float *out, const float *gate, const float *up,
                         size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

void kcpu_swiglu_backward(float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dgate)
            dgate[i] += silu_grad(gate[i]) * up[i] * dout[i];
        if (dup)
            dup[i] += gate[i] * sigmoidf(gate[i]) * dout[i];
    }
}
