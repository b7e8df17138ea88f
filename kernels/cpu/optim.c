/* optim.c — the AdamW step and global-norm gradient clipping on flat fp32
 * buffers.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <math.h>   /* defines: pow, sqrt, sqrtf */

void kcpu_adamw_step(float *params, const float *grads, float *m, float *v,
                     size_t n, float lr, float beta1, float beta2, float eps,
                     float weight_decay, int t)
{
    assert(t >= 1);
    /* bias corrections in double: 1 - beta^t loses digits in float */
    float c1 = (float)(1.0 - pow(beta1, t));
    float c2 = (float)(1.0 - pow(beta2, t));
    for (size_t i = 0; i < n; i++) {
        float g = grads[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = mi / c1;
        float vhat = vi / c2;
        m[i] = mi;
        v[i] = vi;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) +
                           weight_decay * params[i]);
    }
}

float kcpu_global_norm(const float *const *bufs, const size_t *sizes,
                       int nbufs)
{
    double ss = 0.0;
    for (int b = 0; b < nbufs; b++)
        for (size_t i = 0; i < sizes[b]; i++)
            ss += (double)bufs[b][i] * bufs[b][i];
    return (float)sqrt(ss);
}

float kcpu_clip_global_norm(float *const *bufs, const size_t *sizes,
                            int nbufs, float max_norm)
{
    /* float *const * needs a cast to const float *const * in C */
    double norm = kcpu_global_norm((const float *const *)bufs, sizes, nbufs);
    double scale = (double)max_norm / (norm + 1e-6);
    if (scale < 1.0)
        for (int b = 0; b < nbufs; b++)
            for (size_t i = 0; i < sizes[b]; i++)
                bufs[b][i] = (float)(bufs[b][i] * scale);
    return (float)norm;
}
