/* embed.c — token embedding: a row gather forward, a row scatter-add
 * backward. The backward is a plain loop in index order, so repeated ids
 * accumulate in a fixed order and the result is bitwise reproducible.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <string.h> /* defines: memcpy */

#include "kcpu_math_impl.h" /* defines: kcpu__add_into */

void kcpu_embedding_forward(float *out, const int32_t *ids,
                            const float *table, int n, int V, int C)
{
    assert(n >= 0 && V > 0 && C > 0);
    for (int i = 0; i < n; i++) {
        assert(ids[i] >= 0 && ids[i] < V);
        memcpy(out + (size_t)i * C, table + (size_t)ids[i] * C,
               (size_t)C * sizeof *out);
    }
    (void)V; /* only read by the assert */
}

void kcpu_embedding_backward(float *dtable, const float *dout,
                             const int32_t *ids, int n, int V, int C)
{
    assert(n >= 0 && V > 0 && C > 0);
    for (int i = 0; i < n; i++) {
        assert(ids[i] >= 0 && ids[i] < V);
        kcpu__add_into(dtable + (size_t)ids[i] * C, dout + (size_t)i * C,
                       (size_t)C);
    }
    (void)V;
}
