/* norm.c — layernorm and rmsnorm over the last axis of [rows,C].
 *
 * Forward passes save per-row statistics (mean and rstd; rstd) so that the
 * backward need not recompute them. Row sums are accumulated in double: this
 * is the reference the other backends are compared to, so it is written for
 * accuracy first. Backward passes accumulate.
 *
 * Each row is walked in groups of KCPU_LANES with fixed-count inner loops
 * (the rest of the row one by one), so that gcc -O2 vectorises them: sums
 * keep KCPU_LANES partial sums, added in a fixed order, and the loops that
 * write take restrict pointers (no output of these kernels aliases an
 * input; see kcpu_dense.h).
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <math.h>   /* defines: sqrt */

#include "kcpu_math_impl.h" /* defines: KCPU_LANES, kcpu__add_into */

/* The partial sums of one row, added up in a fixed order. */
static double lanes_total(const double *lane)
{
    double s = 0.0;
    for (int u = 0; u < KCPU_LANES; u++)
        s += lane[u];
    return s;
}

/* sum of x[C], in double. */
static double row_sum(const float *x, int C)
{
    double lane[KCPU_LANES] = {0}, s;
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] += x[c + u];
    s = lanes_total(lane);
    for (; c < C; c++)
        s += x[c];
    return s;
}

/* sum of (x[C] - mu)^2, in double. */
static double row_sum_sq_dev(const float *x, int C, double mu)
{
    double lane[KCPU_LANES] = {0}, s;
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] += (x[c + u] - mu) * (x[c + u] - mu);
    s = lanes_total(lane);
    for (; c < C; c++)
        s += (x[c] - mu) * (x[c] - mu);
    return s;
}

/* sum of (x[C] * y[C]), or of x^2 when y == x, in double. */
static double row_dot(const float *x, const float *y, int C)
{
    double lane[KCPU_LANES] = {0}, s;
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] += (double)x[c + u] * y[c + u];
    s = lanes_total(lane);
    for (; c < C; c++)
        s += (double)x[c] * y[c];
    return s;
}

/* ---- layernorm --------------------------------------------------------- */

/* out[C] = (x - mu) rs w (+ b when b is not NULL), in double. */
static void ln_row_out(float *restrict out, const float *restrict x,
                       const float *restrict w, const float *restrict b,
                       int C, double mu, double rs)
{
    int c = 0;
    if (b) {
        for (; c + KCPU_LANES <= C; c += KCPU_LANES)
            for (int u = 0; u < KCPU_LANES; u++)
                out[c + u] = (float)((x[c + u] - mu) * rs * w[c + u] +
                                     b[c + u]);
        for (; c < C; c++)
            out[c] = (float)((x[c] - mu) * rs * w[c] + b[c]);
        return;
    }
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            out[c + u] = (float)((x[c + u] - mu) * rs * w[c + u]);
    for (; c < C; c++)
        out[c] = (float)((x[c] - mu) * rs * w[c]);
}

void kcpu_layernorm_forward(float *out, float *mean, float *rstd,
                            const float *x, const float *w, const float *b,
                            int rows, int C, float eps)
{
    assert(rows >= 0 && C > 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        double mu = row_sum(xr, C) / C;
        double rs = 1.0 / sqrt(row_sum_sq_dev(xr, C, mu) / C + (double)eps);
        ln_row_out(out + (size_t)r * C, xr, w, b, C, mu, rs);
        mean[r] = (float)mu;
        rstd[r] = (float)rs;
    }
}

/* With xhat = (x - mu) rs and g = dout w over one row: sums[0] = sum of g,
 * sums[1] = sum of g xhat, in double. */
static void ln_row_sums(double *sums, const float *dout, const float *x,
                        const float *w, int C, double mu, double rs)
{
    double lg[KCPU_LANES] = {0}, lgx[KCPU_LANES] = {0};
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++) {
            double g = (double)dout[c + u] * w[c + u];
            lg[u] += g;
            lgx[u] += g * ((x[c + u] - mu) * rs);
        }
    sums[0] = lanes_total(lg);
    sums[1] = lanes_total(lgx);
    for (; c < C; c++) {
        double g = (double)dout[c] * w[c];
        sums[0] += g;
        sums[1] += g * ((x[c] - mu) * rs);
    }
}

/* dw[C] += dout xhat, xhat = (x - mu) rs. */
static void ln_row_dw(float *restrict dw, const float *restrict dout,
                      const float *restrict x, int C, double mu, double rs)
{
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            dw[c + u] += (float)(dout[c + u] * ((x[c + u] - mu) * rs));
    for (; c < C; c++)
        dw[c] += (float)(dout[c] * ((x[c] - mu) * rs));
}

/* dx[C] += rs (g - gmean - xhat gxmean), g = dout w, xhat = (x - mu) rs. */
static void ln_row_dx(float *restrict dx, const float *restrict dout,
                      const float *restrict x, const float *restrict w,
                      int C, double mu, double rs, double gmean,
                      double gxmean)
{
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++) {
            double g = (double)dout[c + u] * w[c + u];
            double xhat = (x[c + u] - mu) * rs;
            dx[c + u] += (float)(rs * (g - gmean - xhat * gxmean));
        }
    for (; c < C; c++) {
        double g = (double)dout[c] * w[c], xhat = (x[c] - mu) * rs;
        dx[c] += (float)(rs * (g - gmean - xhat * gxmean));
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
        double mu = mean[r], rs = rstd[r], sums[2];
        if (dw)
            ln_row_dw(dw, gr, xr, C, mu, rs);
        if (db)
            kcpu__add_into(db, gr, (size_t)C);
        if (!dx)
            continue;
        ln_row_sums(sums, gr, xr, w, C, mu, rs);
        ln_row_dx(dx + (size_t)r * C, gr, xr, w, C, mu, rs, sums[0] / C,
                  sums[1] / C);
    }
}

/* ---- rmsnorm ----------------------------------------------------------- */

/* out[C] = x rs w, in double. */
static void rms_row_out(float *restrict out, const float *restrict x,
                        const float *restrict w, int C, double rs)
{
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            out[c + u] = (float)(x[c + u] * rs * w[c + u]);
    for (; c < C; c++)
        out[c] = (float)(x[c] * rs * w[c]);
}

void kcpu_rmsnorm_forward(float *out, float *rstd, const float *x,
                          const float *w, int rows, int C, float eps)
{
    assert(rows >= 0 && C > 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * C;
        double rs = 1.0 / sqrt(row_dot(xr, xr, C) / C + (double)eps);
        rms_row_out(out + (size_t)r * C, xr, w, C, rs);
        rstd[r] = (float)rs;
    }
}

/* sum of dout w x over one row, in double. */
static double rms_row_gx(const float *dout, const float *w, const float *x,
                         int C)
{
    double lane[KCPU_LANES] = {0}, s;
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] += (double)dout[c + u] * w[c + u] * x[c + u];
    s = lanes_total(lane);
    for (; c < C; c++)
        s += (double)dout[c] * w[c] * x[c];
    return s;
}

/* dw[C] += dout x rs. */
static void rms_row_dw(float *restrict dw, const float *restrict dout,
                       const float *restrict x, int C, double rs)
{
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            dw[c + u] += (float)(dout[c + u] * (x[c + u] * rs));
    for (; c < C; c++)
        dw[c] += (float)(dout[c] * (x[c] * rs));
}

/* dx[C] += rs (dout w - x k). */
static void rms_row_dx(float *restrict dx, const float *restrict dout,
                       const float *restrict x, const float *restrict w,
                       int C, double rs, double k)
{
    int c = 0;
    for (; c + KCPU_LANES <= C; c += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            dx[c + u] += (float)(rs * ((double)dout[c + u] * w[c + u] -
                                       x[c + u] * k));
    for (; c < C; c++)
        dx[c] += (float)(rs * ((double)dout[c] * w[c] - x[c] * k));
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
        if (dw)
            rms_row_dw(dw, gr, xr, C, rs);
        if (!dx)
            continue;
        double k = rs * rs * rms_row_gx(gr, w, xr, C) / C;
        rms_row_dx(dx + (size_t)r * C, gr, xr, w, C, rs, k);
    }
}
