/*
 * fixture.h: the front-end steps the compiler's unit tests share: a .mesh
 * source (or file) loaded with --set overrides and checked, its
 * diagnostics on stderr so that a failed check says why.
 */
#ifndef MESH_FIXTURE_H
#define MESH_FIXTURE_H

#include "frontend.h" /* defines: fe */
#include "mesh.h"     /* defines: mesh_plan */

/* Loads `src` (named m.mesh) or, when `path` is not NULL, the file `path`,
 * after the n_sets --set overrides in `sets`; checks it with std/ from the
 * source tree. Fails the test on any error; the caller frees with fe_free. */
fe *fixture_checked(const char *src, const char *path, const char *const *sets, int n_sets);

/* Compiles `src` (named tiny.mesh) with the n_sets --set overrides in
 * `sets` and reads the plan into *p (free with plan_free). Fails the test,
 * with meshc's or the reader's message, on any error. */
struct plan;
void fixture_compile(struct plan *p, const char *src, const char *const *sets, int n_sets);

/* A one-rank plan the interpreter runs (a vocabulary of 32, global_batch 4
 * of micro_batch 2, seq_len 4, seed 3), with `sets` as meshc --set. */
mesh_plan *fixture_plan(const char *const *sets, int n_sets);

/* `src` compiled with the --set overrides to a public mesh_plan (free with
 * mesh_plan_free); fails the test on any error. */
mesh_plan *fixture_mesh_plan(const char *src, const char *const *sets, int n_sets);

/* The tiny GPT of the executor's tests: vocab 16, context 8, dim 8, 2
 * heads, 2 layers, a tied head; global_batch 4 of micro_batch 2, seq_len
 * 8, 40 steps of AdamW (lr 3e-2, clip 1), seed 7. */
extern const char fixture_tiny_gpt[];

/* What the transformer blocks of std/ do not use: activations that stand
 * alone (silu and gelu of a plain matmul: no bias add to fuse them with;
 * the gelu read by a matmul with a transposed weight, so its backward is
 * not fused either), a broadcast add whose first term is the broadcast
 * one ([seq, dim] + [batch, seq, dim]), and a loss of two cross-entropies
 * (their sum: a loss that is not one op's); the tiny GPT's sizes and
 * training otherwise. */
extern const char fixture_other_ops[];

#endif
