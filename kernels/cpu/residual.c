/* residual.c — the residual add and the broadcast add of a [T,C] tensor
 * (a position embedding) onto [B,T,C]. Backward passes accumulate.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */

void kcpu_add_forward(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void kcpu_add_backward(float *da, float *db, const float *dout, size_t n)
{
    if (da)
        for (size_t i = 0; i < n; i++)
            da[i] += dout[i];
    if (db)
        for (size_t i = 0; i < n; i++)
            db[i] += dout[i];
}

void kcpu_add_broadcast_forward(float *out, const float *a, const float *p,
                                int B, int T, int C)
{
    assert(B >= 0 && T >= 0 && C >= 0);
    size_t tc = (size_t)T * C;
    for (int b = 0; b < B; b++) {
        const float *ab = a + (size_t)b * tc;
        float *ob = out + (size_t)b * tc;
        for (size_t i = 0; i < tc; i++)
            ob[i] = ab[i] + p[i];
    }
}

void kcpu_add_broadcast_backward(float *da, float *dp, const float *dout,
                                 int B, int T, int C)
{
    assert(B >= 0 && T >= 0 && C >= 0);
    size_t tc = (size_t)T * C;
    if (da)
        kcpu_add_backward(da, NULL, dout, (size_t)B * tc);
    if (dp) /* sum over b in order: deterministic */
        for (int b = 0; b < B; b++) {
            const float *g = dout + (size_t)b * tc;
            for (size_t i = 0; i < tc; i++)
                dp[i] += g[i];
        }
}
