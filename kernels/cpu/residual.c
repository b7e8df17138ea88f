/* residual.c — the residual add and the broadcast add of a [T,C] tensor
 * (a position embedding, or a bias with T = 1) onto [B,T,C]. Backward
 * passes accumulate.
 *
 * The loops go in groups of KCPU_LANES with fixed-count inner loops, so
 * that gcc -O2 vectorises them (kcpu_math_impl.h); the forward reads a
 * group into a local array before it writes, since out may alias an input.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */

#include "kcpu_math_impl.h" /* defines: KCPU_LANES, kcpu__add_into */

/* out[n] = a[n] + b[n]; out may alias a or b. */
static void add_rows(float *out, const float *a, const float *b, size_t n)
{
    size_t i = 0;
    for (; i + KCPU_LANES <= n; i += KCPU_LANES) {
        float t[KCPU_LANES];
        for (int u = 0; u < KCPU_LANES; u++)
            t[u] = a[i + u] + b[i + u];
        for (int u = 0; u < KCPU_LANES; u++)
            out[i + u] = t[u];
    }
    for (; i < n; i++)
        out[i] = a[i] + b[i];
}

void kcpu_add_forward(float *out, const float *a, const float *b, size_t n)
{
    add_rows(out, a, b, n);
}

void kcpu_add_backward(float *da, float *db, const float *dout, size_t n)
{
    if (da)
        kcpu__add_into(da, dout, n);
    if (db)
        kcpu__add_into(db, dout, n);
}

void kcpu_add_broadcast_forward(float *out, const float *a, const float *p,
                                int B, int T, int C)
{
    assert(B >= 0 && T >= 0 && C >= 0);
    size_t tc = (size_t)T * C;
    for (int b = 0; b < B; b++)
        add_rows(out + (size_t)b * tc, a + (size_t)b * tc, p, tc);
}

void kcpu_add_broadcast_backward(float *da, float *dp, const float *dout,
                                 int B, int T, int C)
{
    assert(B >= 0 && T >= 0 && C >= 0);
    size_t tc = (size_t)T * C;
    if (da)
        kcpu__add_into(da, dout, (size_t)B * tc);
    if (dp) /* sum over b in order: deterministic */
        for (int b = 0; b < B; b++)
            kcpu__add_into(dp, dout + (size_t)b * tc, tc);
}
