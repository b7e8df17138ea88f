/* norm.c — layernorm and rmsnorm over the last axis of [rows,C].
 *
 * Forward passes save per-row statistics (mean and rstd; rstd) so that the
 * backward need not recompute them. Row sums are accumulated in double: this
 * is the reference the other backends are compared to, so it is written for
 * accuracy rather than speed. Backward passes accumulate.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <math.h>   /* defines: sqrt */

void kcpu_layernorm_forward(float *out, float *mean, float *rstd,
                            const float *x, const float *w, const float *b,
                            int rows, int C, float eps)
{
    assert(rows >= 0 && C > 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        float *outr = out + (size_t)r * C;
        double sum = 0.0, var = 0.0;
        for (int c = 0; c < C; c++)
            sum += xr[c];
        double mu = sum / C;
        for (int c = 0; c < C; c++) {
            double d = xr[c] - mu;
            var += d * d;
        }
        double rs = 1.0 / sqrt(var / C + (double)eps);
        for (int c = 0; c < C; c++) {
            double y = (xr[c] - mu) * rs * w[c];
            outr[c] = (float)(b ? y + b[c] : y);
        }
        mean[r] = (float)mu;
        rstd[r] = (float)rs;
    }
}

/* With xhat = (x - mean) rstd and g = dout * w, per row:
 *   dx = rstd (g - mean(g) - xhat mean(g xhat)), dw += dout xhat, db += dout.
 */
void kcpu_layernorm_backward(float *dx, float *dw, float *db,
                             const float *dout, const float *x,
                             const float *w, const float *mean,
                             const float *rstd, int rows, int C)
{
    assert(rows >= 0 && C > 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        const float *gr = dout + (size_t)r * C;
        double mu = mean[r], rs = rstd[r];
        double gsum = 0.0, gxsum = 0.0;
        for (int c = 0; c < C; c++) {
            double xhat = (xr[c] - mu) * rs;
            double g = (double)gr[c] * w[c];
            gsum += g;
            gxsum += g * xhat;
            if (dw)
                dw[c] += (float)(gr[c] * xhat);
            if (db)
                db[c] += gr[c];
        }
        if (!dx)
            continue;
        double gmean = gsum / C, gxmean = gxsum / C;
        float *dxr = dx + (size_t)r * C;
        for (int c = 0; c < C; c++) {
            double xhat = (xr[c] - mu) * rs;
            double g = (double)gr[c] * w[c];
            dxr[c] += (float)(rs * (g - gmean - xhat * gxmean));
        }
    }
}

void kcpu_rmsnorm_forward(float *out, float *rstd, const float *x,
                          const float *w, int rows, int C, float eps)
{
    assert(rows >= 0 && C > 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        float *outr = out + (size_t)r * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)xr[c] * xr[c];
        double rs = 1.0 / sqrt(ss / C + (double)eps);
        for (int c = 0; c < C; c++)
            outr[c] = (float)(xr[c] * rs * w[c]);
        rstd[r] = (float)rs;
    }
}

/* With g = dout * w, per row:
 *   dx = rstd (g - x rstd^2 mean(g x)), dw += dout x rstd.
 */
void kcpu_rmsnorm_backward(float *dx, float *dw, const float *dout,
                           const float *x, const float *w, const float *rstd,
                           int rows, int C)
{
    assert(rows >= 0 && C > 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        const float *gr = dout + (size_t)r * C;
        double rs = rstd[r];
        double gxsum = 0.0;
        for (int c = 0; c < C; c++) {
            gxsum += (double)gr[c] * w[c] * xr[c];
            if (dw)
                dw[c] += (float)(gr[c] * (xr[c] * rs));
        }
        if (!dx)
            continue;
        double k = rs * rs * gxsum / C;
        float *dxr = dx + (size_t)r * C;
        for (int c = 0; c < C; c++)
            dxr[c] += (float)(rs * ((double)gr[c] * w[c] - xr[c] * k));
    }
}
