/* value.h — what the checker computes for an expression.
 *
 * Constants are evaluated exactly (64-bit integers with overflow checks,
 * doubles); tensors are shapes with concrete sizes (`batch` and `seq` come
 * from the train section). V_ERR marks a value whose error was already
 * reported: every consumer accepts it silently, so one mistake gives one
 * diagnostic.
 */
#ifndef MESH_VALUE_H
#define MESH_VALUE_H

#include <stdint.h> /* int64_t */

#include "diag.h"

enum { VALUE_MAX_RANK = 8 };

typedef enum vkind {
    V_ERR,    /* already reported */
    V_INT,
    V_FLOAT,
    V_BOOL,
    V_STR,
    V_WORD,   /* a bare word used as an option value: 1f1b, bf16, dynamic */
    V_TUPLE,
    V_TENSOR,
    V_CALL    /* an option constructor: adamw(...), cosine(...), normal(...) */
} vkind;

typedef struct value value;
struct value {
    vkind kind;
    int64_t i;            /* V_INT, V_BOOL */
    double f;             /* V_FLOAT */
    const char *s;        /* V_STR, V_WORD, V_CALL (the name) */
    int rank;             /* V_TENSOR */
    int is_int;           /* V_TENSOR of integers (token ids) */
    int64_t dims[VALUE_MAX_RANK];
    unsigned split_axes;  /* V_TENSOR: bit per mesh axis it is annotated @split over */
    unsigned placed_axes; /* V_TENSOR: bit per mesh axis with any annotation */
    int node;             /* V_TENSOR: graph node id + 1 (graph.h); 0 when not recorded */
    int n;                /* V_TUPLE elements, V_CALL arguments */
    value *elems;
    const char **names;   /* V_CALL argument names (NULL = positional) */
    loc *locs;            /* V_CALL argument locations */
    loc where;            /* the expression that produced it */
};

const char *value_kind_name(vkind k);

#endif
