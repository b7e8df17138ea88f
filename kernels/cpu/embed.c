/* embed.c — token embedding: a row gather forward, a row scatter-add
 * backward. The backward is a plain loop in index order, so repeated ids
 * accumulate in a fixed order and the result is bitwise reproducible.
 */
#include "kcpu_dense.h"

#include <assert.h> /* defines: assert */
#include <string.h> /* defines: memcpy, memset */

#include "kcpu_math_impl.h" /* defines: kcpu__add_into */

void kcpu_embedding_rows_forward(float *out, const int32_t *ids, const float *table, int n, int row0, int rows,
                                 int C)
{
    assert(n >= 0 && rows > 0 && C > 0);
    for (int i = 0; i < n; i++) {
        int r = ids[i] - row0;
        if (r >= 0 && r < rows)
            memcpy(out + (size_t)i * C, table + (size_t)r * C, (size_t)C * sizeof *out);
        else
            memset(out + (size_t)i * C, 0, (size_t)C * sizeof *out);
    }
}

void kcpu_embedding_rows_backward(float *dtable, const float *dout, const int32_t *ids, int n, int row0, int rows,
                                  int C)
{
    assert(n >= 0 && rows > 0 && C > 0);
    for (int i = 0; i < n; i++) {
        int r = ids[i] - row0;
        if (r >= 0 && r < rows)
            kcpu__add_into(dtable + (size_t)r * C, dout + (size_t)i * C, (size_t)C);
    }
}

void kcpu_embedding_forward(float *out, const int32_t *ids,
                            const float *table, int n, int V, int C)
{
#ifndef NDEBUG
    for (int i = 0; i < n; i++)
        assert(ids[i] >= 0 && ids[i] < V);
#endif
    kcpu_embedding_rows_forward(out, ids, table, n, 0, V, C);
}

void kcpu_embedding_backward(float *dtable, const float *dout,
                             const int32_t *ids, int n, int V, int C)
{
#ifndef NDEBUG
    for (int i = 0; i < n; i++)
        assert(ids[i] >= 0 && ids[i] < V);
#endif
    kcpu_embedding_rows_backward(dtable, dout, ids, n, 0, V, C);
}
