/* plan_check.h — a plan's tensors against their ops (plan_check.c). */
#ifndef MESH_PLAN_CHECK_H
#define MESH_PLAN_CHECK_H

#include <stddef.h> /* size_t */

#include "plan.h"

/* Tensor id of p against its op: the inputs' count, dtypes and shapes the
 * op takes, its own shape, its attributes, and its dimensions split over
 * the mesh (tp; a parameter's over ep) dividing by the axis. Its inputs
 * and the mesh must be read already. Returns 0, or -1 with a message in
 * msg (size n), e.g. "it takes 2 inputs, not 1". */
int plan_check_tensor(const plan *p, int id, char *msg, size_t n);

#endif
