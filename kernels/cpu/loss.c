/* loss.c — fused softmax + cross-entropy over a (padded) vocabulary.
 *
 * The forward keeps no probabilities: it saves the row maximum and the
 * log-sum-exp of the shifted row, two floats per row, and the backward
 * recomputes p = exp(logit - max) / sum column by column. Only the first V
 * of the Vp columns take part; the padded ones are never read.
 *
 * The exponentials are kcpu__expf over chunks of KCPU_CHUNK columns (SIMD,
 * kcpu_math_impl.h), and each row's sum is kept in double, in four lanes
 * in a fixed order: the row sum is accurate to about 1e-7 relative, and
 * the same on every run.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <math.h>   /* defines: exp, log, INFINITY */
#include <string.h> /* defines: memset */

#include "kcpu_math_impl.h" /* defines: kcpu__expf, KCPU_CHUNK, chunk helpers */

/* max of row[V], in KCPU_LANES lanes (a max is exact in any order). */
static float ce_row_max(const float *row, int V)
{
    float lane[KCPU_LANES], m;
    int j = 0;
    for (int u = 0; u < KCPU_LANES; u++)
        lane[u] = -INFINITY;
    for (; j + KCPU_LANES <= V; j += KCPU_LANES)
        for (int u = 0; u < KCPU_LANES; u++)
            lane[u] = row[j + u] > lane[u] ? row[j + u] : lane[u];
    m = lane[0];
    for (int u = 1; u < KCPU_LANES; u++)
        m = lane[u] > m ? lane[u] : m;
    for (; j < V; j++)
        m = row[j] > m ? row[j] : m;
    return m;
}

/* e[KCPU_CHUNK] = exp(x - mx); padding of -inf gives 0. */
static void ce_exp_chunk(float *e, const float *x, float mx)
{
    for (int j = 0; j < KCPU_CHUNK; j++)
        e[j] = kcpu__expf(x[j] - mx);
}

/* sum over j of exp(row[j] - mx), in double. */
static double ce_row_sumexp(const float *row, int V, float mx)
{
    float x[KCPU_CHUNK], e[KCPU_CHUNK];
    double lane[4] = {0.0, 0.0, 0.0, 0.0};
    for (size_t i = 0; i < (size_t)V; i += KCPU_CHUNK) {
        kcpu__chunk_load_fill(x, row + i, kcpu__chunk_len(i, (size_t)V),
                              -INFINITY);
        ce_exp_chunk(e, x, mx);
        for (int j = 0; j < KCPU_CHUNK; j += 4)
            for (int u = 0; u < 4; u++)
                lane[u] += e[j + u];
    }
    return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

float kcpu_crossentropy_forward(float *losses, float *rowmax, float *lse,
                                const float *logits, const int32_t *targets,
                                int N, int V, int Vp)
{
    assert(N > 0 && V > 0 && V <= Vp);
    double total = 0.0;
    for (int i = 0; i < N; i++) {
        const float *row = logits + (size_t)i * Vp;
        assert(targets[i] >= 0 && targets[i] < V);
        float mx = ce_row_max(row, V);
        double ls = log(ce_row_sumexp(row, V, mx));
        /* -log p[target] = lse - (logit[target] - max) */
        double loss = ls - ((double)row[targets[i]] - mx);
        losses[i] = (float)loss;
        rowmax[i] = mx;
        lse[i] = (float)ls;
        total += loss;
    }
    return (float)(total / N);
}

/* d[KCPU_CHUNK] += (exp(x - mx) inv - onehot(t)) scale: p is exp(x - mx)
 * over the row's sum, inv = 1 / sum; t is the target's index in the chunk
 * (any other value when it is elsewhere). */
static void ce_grad_chunk(float *d, const float *x, float mx, float inv,
                          int t, float scale)
{
    for (int j = 0; j < KCPU_CHUNK; j++) {
        float ind = j == t ? 1.0f : 0.0f;
        d[j] += (kcpu__expf(x[j] - mx) * inv - ind) * scale;
    }
}

/* The shard's columns that are not padding: [0, valid). */
static int ce_valid(int col0, int W, int V)
{
    int valid = V - col0;
    return valid < 0 ? 0 : valid > W ? W : valid;
}

void kcpu_crossentropy_shard_backward(float *dlogits, const float *logits, const int32_t *targets,
                                      const float *rowmax, const float *lse, float dloss, int N, int col0, int W,
                                      int V)
{
    assert(N > 0 && V > 0 && W > 0 && col0 >= 0);
    int valid = ce_valid(col0, W, V), in_place = dlogits == logits;
    float scale = (float)((double)dloss / N);
    float x[KCPU_CHUNK], d[KCPU_CHUNK];
    for (int i = 0; i < N; i++) {
        const float *row = logits + (size_t)i * W;
        float *drow = dlogits + (size_t)i * W;
        float inv = (float)exp(-(double)lse[i]); /* 1 / sum of exp(x - max) */
        assert(targets[i] >= 0 && targets[i] < V);
        for (size_t j = 0; j < (size_t)valid; j += KCPU_CHUNK) {
            size_t len = kcpu__chunk_len(j, (size_t)valid);
            kcpu__chunk_load_fill(x, row + j, len, -INFINITY);
            if (in_place) /* the gradient over the logits: from zero, as an assigned one */
                memset(d, 0, sizeof d);
            else
                kcpu__chunk_load(d, drow + j, len);
            ce_grad_chunk(d, x, rowmax[i], inv, targets[i] - col0 - (int)j, scale);
            kcpu__chunk_store(drow + j, d, len);
        }
        if (in_place) /* and 0 past the vocabulary */
            memset(drow + valid, 0, (size_t)(W - valid) * sizeof *drow);
    }
}

void kcpu_crossentropy_backward(float *dlogits, const float *logits,
                                const int32_t *targets, const float *rowmax,
                                const float *lse, float dloss, int N, int V,
                                int Vp)
{
    assert(N > 0 && V > 0 && V <= Vp);
    kcpu_crossentropy_shard_backward(dlogits, logits, targets, rowmax, lse, dloss, N, 0, Vp, V);
}

void kcpu_crossentropy_shard_max(float *rowmax, float *target_logit, const float *logits, const int32_t *targets,
                                 int N, int col0, int W, int V)
{
    int valid = ce_valid(col0, W, V);
    for (int i = 0; i < N; i++) {
        const float *row = logits + (size_t)i * W;
        int t = targets[i] - col0;
        rowmax[i] = valid > 0 ? ce_row_max(row, valid) : -INFINITY;
        target_logit[i] = t >= 0 && t < valid ? row[t] : 0.0f;
    }
}

void kcpu_crossentropy_shard_sumexp(double *x, const float *target_logit, const float *logits, const float *rowmax,
                                    int N, int col0, int W, int V)
{
    int valid = ce_valid(col0, W, V);
    for (int i = 0; i < N; i++) {
        x[i] = valid > 0 ? ce_row_sumexp(logits + (size_t)i * W, valid, rowmax[i]) : 0.0;
        x[N + i] = (double)target_logit[i];
    }
}

void kcpu_crossentropy_shard_rowmax(float *rowmax, const float *all, int N, int P)
{
    for (int i = 0; i < N; i++) {
        float m = all[i];
        for (int q = 1; q < P; q++)
            m = all[(size_t)q * (size_t)N + (size_t)i] > m ? all[(size_t)q * (size_t)N + (size_t)i] : m;
        rowmax[i] = m;
    }
}

float kcpu_crossentropy_shard_finish(float *losses, float *lse, double *all, const float *rowmax, int N, int P)
{
    size_t n2 = 2 * (size_t)N;
    double total = 0.0;
    for (int i = 0; i < N; i++) {
        double sum = 0.0, t = 0.0;
        for (int q = 0; q < P; q++) {
            sum += all[(size_t)q * n2 + (size_t)i];
            t += all[(size_t)q * n2 + (size_t)N + (size_t)i];
        }
        double ls = log(sum), loss = ls - (t - rowmax[i]);
        losses[i] = (float)loss;
        lse[i] = (float)ls;
        all[i] = loss;
        total += loss;
    }
    return (float)(total / N);
}
