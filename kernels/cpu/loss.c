/* loss.c — fused softmax + cross-entropy over a (padded) vocabulary.
 *
 * The forward keeps no probabilities: it saves the row maximum and the
 * log-sum-exp of the shifted row, two floats per row, and the backward
 * recomputes p = exp(logit - max - lse) column by column. Only the first V
 * of the Vp columns take part; the padded ones are never read.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <math.h>   /* defines: exp, log */

float kcpu_crossentropy_forward(float *losses, float *rowmax, float *lse,
                                const float *logits, const int32_t *targets,
                                int N, int V, int Vp)
{
    assert(N > 0 && V > 0 && V <= Vp);
    double total = 0.0;
    for (int i = 0; i < N; i++) {
        const float *row = logits + (size_t)i * Vp;
        assert(targets[i] >= 0 && targets[i] < V);
        float mx = row[0];
        for (int j = 1; j < V; j++)
            if (row[j] > mx)
                mx = row[j];
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += exp((double)row[j] - mx);
        double ls = log(sum);
        /* -log p[target] = lse - (logit[target] - max) */
        double loss = ls - ((double)row[targets[i]] - mx);
        losses[i] = (float)loss;
        rowmax[i] = mx;
        lse[i] = (float)ls;
        total += loss;
    }
    return (float)(total / N);
}

void kcpu_crossentropy_backward(float *dlogits, const float *logits,
                                const int32_t *targets, const float *rowmax,
                                const float *lse, float dloss, int N, int V,
                                int Vp)
{
    assert(N > 0 && V > 0 && V <= Vp);
    double scale = (double)dloss / N;
    for (int i = 0; i < N; i++) {
        const float *row = logits + (size_t)i * Vp;
        float *drow = dlogits + (size_t)i * Vp;
        double shift = (double)rowmax[i] + lse[i];
        assert(targets[i] >= 0 && targets[i] < V);
        for (int j = 0; j < V; j++) {
            double p = exp((double)row[j] - shift);
            double ind = j == targets[i] ? 1.0 : 0.0;
            drow[j] += (float)((p - ind) * scale);
        }
    }
}
