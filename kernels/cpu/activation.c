/* activation.c — elementwise activations: GELU (tanh approximation, as
 * GPT-2), SiLU and SwiGLU. Backward passes accumulate into dx.
 *
 * Every kernel walks its arrays in chunks of KCPU_CHUNK elements copied into
 * local arrays, so that the fixed-count loops over a chunk vectorise at -O2
 * and outputs may alias inputs (kcpu_math_impl.h). The exponentials are
 * kcpu__expf: libm's tanhf and expf do not vectorise.
 */
#include "kcpu_dense.h"

#include "kcpu_math_impl.h" /* defines: kcpu__expf, KCPU_CHUNK, chunk helpers */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f

/* GELU through a sigmoid: 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), with
 * u = sqrt(2/pi) (x + 0.044715 x^3), since 1 + tanh(u) = 2 / (1 + e^(-2u)).
 * One exp and no cancellation, so the result keeps its relative accuracy
 * for large negative x too, where 1 + tanhf(u) loses every digit. Below
 * x = -10, where kcpu__expf saturates at e^88, the result is x e^-88
 * instead of something smaller still: both under 1e-37. */
static float gelu_exp(float x)
{
    return kcpu__expf(-2.0f * GELU_SCALE * (x + GELU_CUBE * x * x * x));
}

/* y[KCPU_CHUNK] = gelu(x[KCPU_CHUNK]). */
static void gelu_chunk(float *y, const float *x)
{
    for (int i = 0; i < KCPU_CHUNK; i++)
        y[i] = x[i] / (1.0f + gelu_exp(x[i]));
}

/* dx[KCPU_CHUNK] += gelu'(x) dout, where with s = 1 / (1 + e), e = e^(-2u):
 * gelu'(x) = s + 2 x s (1 - s) u'(x) and 1 - s = e s. */
static void gelu_grad_chunk(float *dx, const float *x, const float *dout)
{
    for (int i = 0; i < KCPU_CHUNK; i++) {
        float xi = x[i], e = gelu_exp(xi);
        float s = 1.0f / (1.0f + e);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * xi * xi);
        dx[i] += (s + 2.0f * xi * du * s * (e * s)) * dout[i];
    }
}

void kcpu_gelu_forward(float *out, const float *x, size_t n)
{
    float xc[KCPU_CHUNK], yc[KCPU_CHUNK];
    for (size_t i = 0; i < n; i += KCPU_CHUNK) {
        size_t len = kcpu__chunk_len(i, n);
        kcpu__chunk_load(xc, x + i, len);
        gelu_chunk(yc, xc);
        kcpu__chunk_store(out + i, yc, len);
    }
}

void kcpu_gelu_backward(float *dx, const float *x, const float *dout,
                        size_t n)
{
    float xc[KCPU_CHUNK], gc[KCPU_CHUNK], dc[KCPU_CHUNK];
    for (size_t i = 0; i < n; i += KCPU_CHUNK) {
        size_t len = kcpu__chunk_len(i, n);
        kcpu__chunk_load(xc, x + i, len);
        kcpu__chunk_load(gc, dout + i, len);
        kcpu__chunk_load(dc, dx + i, len);
        gelu_grad_chunk(dc, xc, gc);
        kcpu__chunk_store(dx + i, dc, len);
    }
}

void kcpu_gelu_backward_inplace(float *d, const float *x, size_t n)
{
    float xc[KCPU_CHUNK], gc[KCPU_CHUNK], dc[KCPU_CHUNK];
    for (size_t i = 0; i < n; i += KCPU_CHUNK) {
        size_t len = kcpu__chunk_len(i, n);
        kcpu__chunk_load(xc, x + i, len);
        kcpu__chunk_load(gc, d + i, len);
        for (int j = 0; j < KCPU_CHUNK; j++)
            dc[j] = 0.0f; /* 0 + the product, as into a zeroed dx */
        gelu_grad_chunk(dc, xc, gc);
        kcpu__chunk_store(d + i, dc, len);
    }
}

/* sigmoid(x) = 1 / (1 + exp(-x)); finite for every finite x. */
static float sigmoidf(float x)
{
    return 1.0f / (1.0f + kcpu__expf(-x));
}

/* silu'(x) = s (1 + x (1 - s)), s = sigmoid(x). */
static float silu_grad(float x)
{
    float s = sigmoidf(x);
    return s * (1.0f + x * (1.0f - s));
}

/* y[KCPU_CHUNK] = silu(g) * up. */
static void silu_mul_chunk(float *y, const float *g, const float *up)
{
    for (int i = 0; i < KCPU_CHUNK; i++)
        y[i] = g[i] * sigmoidf(g[i]) * up[i];
}

/* dx[KCPU_CHUNK] += silu'(g) * up * dout. */
static void silu_grad_chunk(float *dx, const float *g, const float *up,
                            const float *dout)
{
    for (int i = 0; i < KCPU_CHUNK; i++)
        dx[i] += silu_grad(g[i]) * up[i] * dout[i];
}

/* uc[KCPU_CHUNK] = up's chunk at i, or ones when up is NULL (plain SiLU). */
static void silu_up_load(float *uc, const float *up, size_t i, size_t len)
{
    if (up) {
        kcpu__chunk_load(uc, up + i, len);
        return;
    }
    for (int j = 0; j < KCPU_CHUNK; j++)
        uc[j] = 1.0f;
}

/* out = silu(gate) * up over n elements; up may be NULL (plain SiLU). */
static void silu_mul_forward(float *out, const float *gate, const float *up,
                             size_t n)
{
    float gc[KCPU_CHUNK], uc[KCPU_CHUNK], yc[KCPU_CHUNK];
    for (size_t i = 0; i < n; i += KCPU_CHUNK) {
        size_t len = kcpu__chunk_len(i, n);
        kcpu__chunk_load(gc, gate + i, len);
        silu_up_load(uc, up, i, len);
        silu_mul_chunk(yc, gc, uc);
        kcpu__chunk_store(out + i, yc, len);
    }
}

/* dgate += silu'(gate) * up * dout over n elements; up may be NULL. */
static void silu_mul_backward(float *dgate, const float *dout,
                              const float *gate, const float *up, size_t n)
{
    float gc[KCPU_CHUNK], uc[KCPU_CHUNK], oc[KCPU_CHUNK], dc[KCPU_CHUNK];
    for (size_t i = 0; i < n; i += KCPU_CHUNK) {
        size_t len = kcpu__chunk_len(i, n);
        kcpu__chunk_load(gc, gate + i, len);
        kcpu__chunk_load(oc, dout + i, len);
        kcpu__chunk_load(dc, dgate + i, len);
        silu_up_load(uc, up, i, len);
        silu_grad_chunk(dc, gc, uc, oc);
        kcpu__chunk_store(dgate + i, dc, len);
    }
}

void kcpu_silu_forward(float *out, const float *x, size_t n)
{
    silu_mul_forward(out, x, NULL, n);
}

void kcpu_silu_backward(float *dx, const float *x, const float *dout,
                        size_t n)
{
    silu_mul_backward(dx, dout, x, NULL, n);
}

void kcpu_swiglu_forward(float *out, const float *gate, const float *up,
                         size_t n)
{
    silu_mul_forward(out, gate, up, n);
}

/* dup += silu(gate) * dout is silu_mul_forward's product with dout as up,
 * added to dup chunk by chunk. */
static void swiglu_dup(float *dup, const float *dout, const float *gate,
                       size_t n)
{
    float gc[KCPU_CHUNK], oc[KCPU_CHUNK], yc[KCPU_CHUNK];
    for (size_t i = 0; i < n; i += KCPU_CHUNK) {
        size_t len = kcpu__chunk_len(i, n);
        kcpu__chunk_load(gc, gate + i, len);
        kcpu__chunk_load(oc, dout + i, len);
        silu_mul_chunk(yc, gc, oc);
        for (size_t j = 0; j < len; j++)
            dup[i + j] += yc[j];
    }
}

void kcpu_swiglu_backward(float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n)
{
    if (dgate)
        silu_mul_backward(dgate, dout, gate, up, n);
    if (dup)
        swiglu_dup(dup, dout, gate, n);
}
