/* optim.c — the AdamW step and global-norm gradient clipping on flat fp32
 * buffers.
 *
 * The AdamW arithmetic runs over chunks of KCPU_CHUNK elements in
 * fixed-count loops that gcc -O2 vectorises (kcpu_math_impl.h), with the
 * square roots in a loop of their own: sqrtf keeps a branch for errno that
 * stops the vectoriser. The operations and their order are those of the
 * plain formula, so the results are the same bits as an element-by-element
 * loop. The clipping's factor can be folded into the step (grad_scale):
 * the gradients are scaled as kcpu_scale_buffers would, without writing
 * them back. Sums of squares are kept in double, in KCPU_LANES lanes.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <math.h>   /* defines: pow, sqrt, sqrtf */
#include <string.h> /* defines: memcpy */

#include "kcpu_math_impl.h" /* defines: KCPU_CHUNK, KCPU_LANES, chunk helpers */

/* The constants of one AdamW step. */
typedef struct adamw_k {
    float lr, beta1, beta2, eps, weight_decay;
    float c1, c2; /* bias corrections 1 - beta^t */
} adamw_k;

/* One chunk of KCPU_CHUNK elements, updated in place. */
static void adamw_chunk(float *restrict params, const float *restrict grads,
                        float *restrict m, float *restrict v,
                        const adamw_k *k)
{
    float mhat[KCPU_CHUNK], root[KCPU_CHUNK];
    for (int i = 0; i < KCPU_CHUNK; i++) {
        float g = grads[i];
        float mi = k->beta1 * m[i] + (1.0f - k->beta1) * g;
        float vi = k->beta2 * v[i] + (1.0f - k->beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        mhat[i] = mi / k->c1;
        root[i] = vi / k->c2; /* vhat, square-rooted below */
    }
    for (int i = 0; i < KCPU_CHUNK; i++)
        root[i] = sqrtf(root[i]);
    for (int i = 0; i < KCPU_CHUNK; i++)
        params[i] -= k->lr * (mhat[i] / (root[i] + k->eps) +
                              k->weight_decay * params[i]);
}

/* x[n] = (float)(x * scale), the product in double. */
static void scale_in_place(float *x, size_t n, double scale)
{
    size_t i = 0;
    for (; i + KCPU_LANES <= n; i += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            x[i + u] = (float)(x[i + u] * scale);
    for (; i < n; i++)
        x[i] = (float)(x[i] * scale);
}

/* The last n < KCPU_CHUNK elements, through local copies (the gradients
 * scaled). */
static void adamw_tail(float *params, const float *grads, double scale,
                       float *m, float *v, size_t n, const adamw_k *k)
{
    float p[KCPU_CHUNK], g[KCPU_CHUNK], mc[KCPU_CHUNK], vc[KCPU_CHUNK];
    kcpu__chunk_load(p, params, n);
    kcpu__chunk_load(g, grads, n);
    scale_in_place(g, n, scale);
    kcpu__chunk_load(mc, m, n);
    kcpu__chunk_load(vc, v, n);
    adamw_chunk(p, g, mc, vc, k);
    kcpu__chunk_store(params, p, n);
    kcpu__chunk_store(m, mc, n);
    kcpu__chunk_store(v, vc, n);
}

void kcpu_adamw_step(float *params, const float *grads, double grad_scale,
                     float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int t)
{
    assert(t >= 1);
    /* bias corrections in double: 1 - beta^t loses digits in float */
    adamw_k k = {lr, beta1, beta2, eps, weight_decay,
                 (float)(1.0 - pow(beta1, t)), (float)(1.0 - pow(beta2, t))};
    float g[KCPU_CHUNK]; /* a chunk's gradients scaled */
    size_t i = 0;
    for (; i + KCPU_CHUNK <= n; i += KCPU_CHUNK) {
        const float *gi = grads + i;
        if (grad_scale != 1.0) {
            memcpy(g, gi, sizeof g);
            scale_in_place(g, KCPU_CHUNK, grad_scale);
            gi = g;
        }
        adamw_chunk(params + i, gi, m + i, v + i, &k);
    }
    if (i < n)
        adamw_tail(params + i, grads + i, grad_scale, m + i, v + i, n - i, &k);
}

/* sum of x[n]^2 in double, in KCPU_LANES lanes. */
static double sum_squares(const float *x, size_t n)
{
    double lane[KCPU_LANES] = {0}, ss = 0.0;
    size_t i = 0;
    for (; i + KCPU_LANES <= n; i += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] += (double)x[i + u] * x[i + u];
    for (int u = 0; u < KCPU_LANES; u++)
        ss += lane[u];
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    return ss;
}

double kcpu_sum_squares(const float *const *bufs, const size_t *sizes, int nbufs)
{
    double ss = 0.0;
    for (int b = 0; b < nbufs; b++)
        ss += sum_squares(bufs[b], sizes[b]);
    return ss;
}

float kcpu_global_norm(const float *const *bufs, const size_t *sizes,
                       int nbufs)
{
    return (float)sqrt(kcpu_sum_squares(bufs, sizes, nbufs));
}

float kcpu_clip_global_norm(float *const *bufs, const size_t *sizes,
                            int nbufs, float max_norm)
{
    /* float *const * needs a cast to const float *const * in C */
    double norm = kcpu_global_norm((const float *const *)bufs, sizes, nbufs);
    double scale = (double)max_norm / (norm + 1e-6);
    if (scale < 1.0)
        kcpu_scale_buffers(bufs, sizes, nbufs, scale);
    return (float)norm;
}

void kcpu_scale_buffers(float *const *bufs, const size_t *sizes, int nbufs, double scale)
{
    for (int b = 0; b < nbufs; b++)
        scale_in_place(bufs[b], sizes[b], scale);
}
