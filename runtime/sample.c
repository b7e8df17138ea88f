/* sample.c — generating tokens from a model (sample.h). */
#include "sample.h"

#include <math.h>   /* exp */
#include <string.h> /* memset, memcpy */

#include "init.h" /* mesh__philox */

const float *mesh__next_logits(mesh__exec *ex, const int32_t *ids, size_t n, int seq, int32_t *in,
                               int32_t *tg, int *vocab_padded)
{
    size_t bt = mesh__exec_batch_tokens(ex);
    size_t len = n < (size_t)seq ? n : (size_t)seq;
    memset(in, 0, bt * sizeof *in);
    memset(tg, 0, bt * sizeof *tg);
    memcpy(in, ids + (n - len), len * sizeof *in);
    mesh__exec_loss(ex, in, tg);
    const float *lg = mesh__exec_logits(ex, vocab_padded);
    return lg ? lg + (len - 1) * (size_t)*vocab_padded : NULL;
}

int32_t mesh__sample_draw(const float *row, int vocab, double temperature, uint64_t key, uint64_t counter)
{
    int best = 0;
    for (int j = 1; j < vocab; j++)
        if (row[j] > row[best]) best = j;
    if (temperature <= 0) return best;
    double sum = 0;
    for (int j = 0; j < vocab; j++) sum += exp((row[j] - row[best]) / temperature);
    uint32_t r[4];
    mesh__philox(r, counter, key);
    double u = ((double)r[0] + 0.5) / 4294967296.0 * sum, acc = 0;
    for (int j = 0; j < vocab; j++) {
        acc += exp((row[j] - row[best]) / temperature);
        if (acc >= u) return j;
    }
    return best;
}
