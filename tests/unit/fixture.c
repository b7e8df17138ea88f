/*
 * fixture.c: the checked front end the compiler's unit tests start from,
 * and a small plan for the runtime's (see fixture.h).
 */
#include <stdio.h>  /* fputs, stderr */
#include <string.h> /* strlen */

#include "fixture.h"
#include "plan.h" /* defines: plan, plan_read */
#include "unit.h" /* defines: ASSERT_* */

static void to_stderr(void *ud, diag_level level, const char *text) {
    (void)ud;
    (void)level;
    fputs(text, stderr);
}

fe *fixture_checked(const char *src, const char *path, const char *const *sets, int n_sets) {
    fe_options o = {NULL, 0, MESH_STD_DIR, to_stderr, NULL};
    fe *f = fe_new(&o);
    ASSERT_NOT_NULL(f);
    for (int i = 0; i < n_sets; i++) ASSERT_INT_EQ(fe_add_set(f, sets[i]), FE_OK);
    if (path) ASSERT_INT_EQ(fe_load_file(f, path), FE_OK);
    else ASSERT_INT_EQ(fe_load_buffer(f, "m.mesh", src, strlen(src)), FE_OK);
    ASSERT_INT_EQ(fe_check(f), FE_OK);
    return f;
}

/* src compiled with the --set overrides: the plan's text (mesh_free it),
 * its length in *len; fails the test with meshc's message. */
static char *plan_text(const char *src, const char *const *sets, int n_sets, size_t *len) {
    mesh_compile_options o = MESH_COMPILE_OPTIONS_INIT;
    o.sets = sets;
    o.n_sets = n_sets;
    char *text = NULL;
    if (mesh_compile("tiny.mesh", src, strlen(src), &o, &text, len) != MESH_OK)
        unit_fail(__FILE__, __LINE__, "%s", mesh_last_error());
    return text;
}

void fixture_compile(plan *p, const char *src, const char *const *sets, int n_sets) {
    char err[512];
    size_t len = 0;
    char *text = plan_text(src, sets, n_sets, &len);
    if (plan_read(p, text, len, err, sizeof err) != 0) unit_fail(__FILE__, __LINE__, "%s", err);
    mesh_free(text);
}

mesh_plan *fixture_mesh_plan(const char *src, const char *const *sets, int n_sets) {
    size_t len = 0;
    char *text = plan_text(src, sets, n_sets, &len);
    mesh_plan *mp = NULL;
    ASSERT_INT_EQ(mesh_plan_from_memory(text, len, &mp), MESH_OK);
    mesh_free(text);
    return mp;
}

/* A model the interpreter runs, with a vocabulary of 32; `sets` as
 * meshc --set (global_batch 4 of micro_batch 2 and seq_len 4 by default). */
mesh_plan *fixture_plan(const char *const *sets, int n_sets) {
    static const char src[] =
        "model m {\n"
        "  input tokens : int[batch, seq]\n"
        "  input targets : int[batch, seq]\n"
        "  param wte : [32, 8] = normal(0.5)\n"
        "  loss = cross_entropy(embed(tokens, wte) @ transpose(wte), targets)\n"
        "}\n"
        "mesh { dp = 1 }\n"
        "train { global_batch = 4  micro_batch = 2  seq_len = 4  steps = 10  seed = 3\n"
        "        optimizer = adamw(lr: 1e-2) }\n";
    return fixture_mesh_plan(src, sets, n_sets);
}

/* The tiny GPT the executor tests train (two layers through the repeat's
 * carries, a tied LM head; a vocabulary of 16, 8 tokens). */
const char fixture_tiny_gpt[] =
    "import \"std/transformer.mesh\"\n"
    "model tiny {\n"
    "  vocab = 16\n  context = 8\n  dim = 8\n  heads = 2\n  layers = 2\n"
    "  input tokens : int[batch, seq]\n  input targets : int[batch, seq]\n"
    "  param wte : [vocab, dim] = normal(0.5)\n  param wpe : [context, dim] = normal(0.5)\n"
    "  x = embed(tokens, wte) + embed(arange(seq), wpe)\n"
    "  repeat layers as h { x = gpt2_block(x, heads: heads, n_layers: layers) }\n"
    "  param ln_f_w : [dim] = ones\n  param ln_f_b : [dim] = zeros\n"
    "  logits = layernorm(x, ln_f_w, ln_f_b) @ transpose(wte)\n"
    "  loss = cross_entropy(logits, targets)\n"
    "}\n"
    "mesh { dp = 1 }\n"
    "train {\n  global_batch = 4\n  micro_batch = 2\n  seq_len = 8\n  steps = 40\n"
    "  optimizer = adamw(lr: 3e-2, weight_decay: 0.0, clip: 1.0)\n  seed = 7\n}\n";

const char fixture_other_ops[] =
    "model other_ops {\n"
    "  vocab = 16\n  context = 8\n  dim = 8\n  ffn = 12\n"
    "  input tokens : int[batch, seq]\n  input targets : int[batch, seq]\n"
    "  param embedding : [vocab, dim] = normal(0.5)\n  param wpe : [context, dim] = normal(0.5)\n"
    "  param w1 : [dim, ffn] = normal(0.5)\n  param w2 : [ffn, dim] = normal(0.5)\n"
    "  param w3 : [dim, ffn] = normal(0.5)\n  param w4 : [dim, ffn] = normal(0.5)\n"
    "  param lm_head : [dim, vocab] = normal(0.5)\n"
    "  x = embed(arange(seq), wpe) + embed(tokens, embedding)\n"
    "  h = x + silu(x @ w1) @ w2\n"
    "  x = h + gelu(h @ w3) @ transpose(w4)\n"
    "  loss = cross_entropy(x @ lm_head, targets) + cross_entropy(h @ lm_head, targets)\n"
    "}\n"
    "mesh { dp = 1 }\n"
    "train {\n  global_batch = 4\n  micro_batch = 2\n  seq_len = 8\n  steps = 40\n"
    "  optimizer = adamw(lr: 3e-2, weight_decay: 0.0, clip: 1.0)\n  seed = 7\n}\n";
