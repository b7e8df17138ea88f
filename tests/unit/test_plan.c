/*
 * test_plan.c: the plan file (compiler/plan.c, plan_read.c). Plans made
 * from real models are written, read back and written again: the texts
 * must be byte-identical and the read plan must hold what the compiler
 * derived. Broken plans (another magic or version, cut short, bad values,
 * garbage, a few hundred deterministic mutations) must each be refused
 * with a message that says where and why, without crashing or leaking
 * (make asan).
 */
#include <stdio.h>  /* open_memstream, fclose */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* memcmp, memcpy, strstr, strlen */

#include "compile.h"  /* defines: compile_run, compiled */
#include "fixture.h"  /* defines: fixture_checked */
#include "frontend.h" /* defines: fe_* */
#include "plan.h"     /* defines: plan_* */
#include "sched.h"    /* defines: sched_build, sched_free */
#include "shard.h"    /* defines: shard_build, shard_free */
#include "unit.h"     /* defines: TEST_IMPL, ASSERT_* */

enum { B = 2, S = 16, H = 64, L = 4 };

/* A GPT-2 model with L layers of width H (or the file `path`), checked,
 * sharded with the --set overrides, scheduled when pp > 1, made a plan. */
static void make_plan(plan *out, const char *path, const char *const *sets, int n_sets) {
    static const char src[] =
        "import \"std/transformer.mesh\"\n"
        "model m {\n"
        "  input tokens : int[batch, seq]\n"
        "  input targets : int[batch, seq]\n"
        "  param wte : [256, 64] @split(tp, 0)\n"
        "  param wpe : [16, 64]\n"
        "  x = embed(tokens, wte) + embed(arange(seq), wpe)\n"
        "  repeat 4 { x = gpt2_block(x, heads: 4) }\n"
        "  param lnf_w : [64] = ones\n"
        "  param lnf_b : [64] = zeros\n"
        "  loss = cross_entropy(layernorm(x, lnf_w, lnf_b) @ transpose(wte), targets)\n"
        "}\n"
        "mesh { tp = 2 }\n"
        "train { global_batch = 2  seq_len = 16  steps = 1  optimizer = adamw(lr: 1e-3) }\n";
    fe *f = fixture_checked(src, path, sets, n_sets);
    fe_setup setup = fe_get_setup(f);
    shard_prog p;
    ASSERT_INT_EQ(shard_build(fe_graph(f), &setup, &p), 0);
    sched sc;
    char err[256];
    if (setup.pp > 1)
        ASSERT_INT_EQ(sched_build(&sc, (sched_kind)setup.schedule, (int)setup.pp, (int)setup.micro_batches,
                                  setup.virtual_stages, err, (int)sizeof err), 0);
    int rc = plan_from(out, path ? path : "m.mesh", &setup, fe_graph(f), &p, setup.pp > 1 ? &sc : NULL);
    if (rc != 0) fprintf(stderr, "# plan_from: %s\n", out->error);
    ASSERT_INT_EQ(rc, 0);
    if (setup.pp > 1) sched_free(&sc);
    shard_free(&p);
    fe_free(f); /* the plan must not point into any of these */
}

/* The plan as text; the caller frees. */
static char *write_text(const plan *p, size_t *len) {
    char *buf = NULL, err[256] = "";
    FILE *m = open_memstream(&buf, len);
    ASSERT_NOT_NULL(m);
    int rc = plan_write(p, m, err, sizeof err);
    fclose(m);
    if (rc != 0) fprintf(stderr, "# plan_write: %s\n", err);
    ASSERT_INT_EQ(rc, 0);
    return buf;
}

/* Writes p, reads it back into *back, writes that: the two texts must be
 * the same bytes. Returns the first text; the caller frees it and *back. */
static char *roundtrip(const plan *p, plan *back, size_t *len) {
    char err[512] = "";
    char *text = write_text(p, len);
    int rc = plan_read(back, text, *len, err, sizeof err);
    if (rc != 0) fprintf(stderr, "# plan_read: %s\n", err);
    ASSERT_INT_EQ(rc, 0);
    size_t len2;
    char *again = write_text(back, &len2);
    ASSERT_UINT_EQ(len2, *len);
    ASSERT_INT_EQ(memcmp(text, again, *len), 0);
    free(again);
    return text;
}

static int find_tensor(const plan *p, const char *name) {
    for (int i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].name && strcmp(p->tensors[i].name, name) == 0) return i;
    return -1;
}

TEST_IMPL(plan_roundtrip_tp)
{
    plan p, back;
    make_plan(&p, NULL, NULL, 0);
    size_t len;
    char *text = roundtrip(&p, &back, &len);
    ASSERT_NOT_NULL(strstr(text, "\nmagic: mesh-plan\nformat: 1\n"));
    ASSERT_STR_EQ(back.source, "m.mesh");
    ASSERT_INT_EQ(back.format, PLAN_FORMAT_VERSION);
    ASSERT_INT_EQ(back.setup.tp, 2);
    ASSERT_INT_EQ(back.setup.world, 2);
    ASSERT_INT_EQ(back.setup.layers, L);
    ASSERT_INT_EQ(back.n_tensors, p.n_tensors);
    ASSERT_INT_EQ(back.n_steps, p.n_steps);
    ASSERT_INT_EQ(back.loss, p.loss);
    /* the vocab-parallel embedding table: [256, 64] split by rows over tp */
    int wte = find_tensor(&back, "wte");
    ASSERT_INT_GE(wte, 0);
    const plan_tensor *t = &back.tensors[wte];
    ASSERT_INT_EQ(t->op, G_PARAM);
    ASSERT_INT_EQ(t->rank, 2);
    ASSERT_INT_EQ(t->dims[0], 256);
    ASSERT_INT_EQ(t->dims[1], 64);
    ASSERT_INT_EQ(t->dtype, PLAN_DTYPE_F32);
    ASSERT_INT_EQ(t->pl.kind[1], PL_SPLIT);
    ASSERT_INT_EQ(t->pl.dim[1], 0);
    ASSERT_INT_EQ(t->pl.kind[0], PL_REP);
    ASSERT_INT_EQ(back.tensors[find_tensor(&back, "tokens")].dtype, PLAN_DTYPE_I32);
    /* Megatron: per layer, forward, one all-reduce of b*s*h over tp after
     * each row-parallel product; the stack region holds L layers */
    int in_stack = 0, stack = -1;
    for (int r = 0; r < back.n_regions; r++)
        if (back.regions[r].is_stack) stack = r;
    ASSERT_INT_GE(stack, 0);
    ASSERT_INT_EQ(back.regions[stack].count, L);
    ASSERT_INT_EQ(back.regions[stack].n_carry, 1);
    for (int i = 0; i < back.n_steps; i++) {
        const plan_step *s = &back.steps[i];
        if (s->phase != PLAN_FORWARD || s->kind != STEP_ALL_REDUCE || s->region != stack) continue;
        ASSERT_INT_EQ(s->axis, 1);
        ASSERT_INT_EQ(s->elems, B * S * H);
        ASSERT_STR_EQ(s->why, p.steps[i].why);
        in_stack++;
    }
    ASSERT_INT_EQ(in_stack, 2);
    /* attributes survive: attention heads, layernorm eps */
    int att = 0;
    for (int i = 0; i < back.n_tensors; i++) {
        if (back.tensors[i].op == G_ATTENTION) {
            ASSERT_INT_EQ(back.tensors[i].heads, 4);
            att++;
        }
        if (back.tensors[i].op == G_LAYERNORM && !(back.tensors[i].eps == p.tensors[i].eps))
            unit_fail(__FILE__, __LINE__, "eps of tensor %d changed", i);
    }
    ASSERT_INT_EQ(att, 1);
    /* pp = 1: one stage, forward then backward of the one micro-batch */
    ASSERT_INT_EQ(back.pp, 1);
    ASSERT_INT_EQ(back.stages[0].n_units, 2);
    ASSERT_INT_EQ(back.stages[0].units[0].op, SCHED_FWD);
    ASSERT_INT_EQ(back.stages[0].units[1].op, SCHED_BWD);
    free(text);
    plan_free(&back);
    plan_free(&p);
    plan_free(&p); /* a freed plan frees again as a no-op */
}

/* pp = 2 with 1F1B and interleaving: the units of every stage are the
 * schedule's, and the plan does not grow with dp or tp. */
TEST_IMPL(plan_roundtrip_pipeline)
{
    static const char *const sets[] = {"mesh.pp=2", "train.global_batch=4", "train.micro_batch=1",
                                       "train.schedule=interleaved"};
    plan p, back;
    make_plan(&p, NULL, sets, 4);
    size_t len;
    char *text = roundtrip(&p, &back, &len);
    ASSERT_INT_EQ(back.kind, SCHED_KIND_INTERLEAVED);
    ASSERT_INT_EQ(back.pp, 2);
    ASSERT_INT_EQ(back.m, 4);
    ASSERT_INT_EQ(back.v, 2);
    for (int i = 0; i < back.pp * back.v; i++) ASSERT_INT_EQ(back.chunk_layers[i], 1);
    sched sc;
    char err[256];
    ASSERT_INT_EQ(sched_build(&sc, SCHED_KIND_INTERLEAVED, 2, 4, 2, err, (int)sizeof err), 0);
    for (int s = 0; s < 2; s++) {
        ASSERT_INT_EQ(back.stages[s].n_units, sc.stages[s].n_units);
        for (int u = 0; u < sc.stages[s].n_units; u++) {
            const sched_unit *a = &back.stages[s].units[u], *b = &sc.stages[s].units[u];
            ASSERT_INT_EQ(a->op, b->op);
            ASSERT_INT_EQ(a->micro, b->micro);
            ASSERT_INT_EQ(a->chunk, b->chunk);
            ASSERT_INT_EQ(a->peer, b->peer);
        }
    }
    sched_free(&sc);
    free(text);
    plan_free(&back);
    plan_free(&p);

    /* SPMD: dp 8 x tp 4 writes a plan as long as dp 2 x tp 2 */
    static const char *const small[] = {"mesh.tp=2", "mesh.dp=2", "train.global_batch=4"};
    static const char *const big[] = {"mesh.tp=4", "mesh.dp=8", "train.global_batch=16"};
    plan a, b;
    make_plan(&a, NULL, small, 3);
    make_plan(&b, NULL, big, 3);
    size_t la, lb;
    char *ta = write_text(&a, &la), *tb = write_text(&b, &lb);
    ASSERT_INT_EQ(a.n_tensors, b.n_tensors);
    ASSERT_INT_EQ(a.n_steps, b.n_steps);
    ASSERT_INT_LT((long long)lb, (long long)la + 64); /* only a few numbers differ */
    free(ta);
    free(tb);
    plan_free(&a);
    plan_free(&b);
}

/* Every example, on its own mesh and with a few overrides. */
TEST_IMPL(plan_roundtrip_examples)
{
    static const char *const files[] = {"gpt-tiny", "gpt2", "llama", "moe"};
    static const char *const tp2[] = {"mesh.tp=2"};
    static const char *const sp[] = {"mesh.tp=2", "mesh.dp=2", "train.sequence_parallel=true", "train.zero=3"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        for (int v = 0; v < 3; v++) {
            char path[512];
            snprintf(path, sizeof path, "%s/../examples/%s.mesh", MESH_STD_DIR, files[i]);
            if (v > 0 && strcmp(files[i], "gpt-tiny") != 0) continue;
            plan p, back;
            make_plan(&p, path, v == 1 ? tp2 : sp, v == 0 ? 0 : v == 1 ? 1 : 4);
            size_t len;
            free(roundtrip(&p, &back, &len));
            plan_free(&back);
            plan_free(&p);
        }
    }
}

/* As meshc will make it: from compile_run, which builds a schedule even for
 * pp = 1; the text equals the one plan_from makes without it. */
TEST_IMPL(plan_from_compiled)
{
    char path[512];
    snprintf(path, sizeof path, "%s/../examples/gpt-tiny.mesh", MESH_STD_DIR);
    fe *f = fixture_checked(NULL, path, NULL, 0);
    compiled c;
    ASSERT_INT_EQ(compile_run(f, &c, 0), FE_OK);
    ASSERT_INT_EQ(c.have_sched, 1);
    plan a, b;
    ASSERT_INT_EQ(plan_from(&a, path, &c.setup, fe_graph(f), &c.prog, &c.sc), 0);
    compile_free(&c);
    fe_free(f);
    make_plan(&b, path, NULL, 0);
    size_t la, lb;
    char *ta = write_text(&a, &la), *tb = write_text(&b, &lb);
    ASSERT_UINT_EQ(la, lb);
    ASSERT_INT_EQ(memcmp(ta, tb, la), 0);
    free(ta);
    free(tb);
    plan_free(&a);
    plan_free(&b);
}

/* text with the first `from` replaced by `to`; the caller frees */
static char *edit(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    if (!at) unit_fail(__FILE__, __LINE__, "'%s' is not in the plan", from);
    size_t a = (size_t)(at - text), f = strlen(from), t = strlen(to), n = strlen(text);
    char *out = malloc(n - f + t + 1);
    ASSERT_NOT_NULL(out);
    memcpy(out, text, a);
    memcpy(out + a, to, t);
    memcpy(out + a + t, at + f, n - a - f + 1);
    return out;
}

/* plan_read must fail on text with a message holding `want`, at LINE:COL. */
static void refused(const char *text, size_t len, const char *want) {
    plan p;
    char err[512] = "";
    ASSERT_INT_EQ(plan_read(&p, text, len, err, sizeof err), -1);
    ASSERT_INT_EQ(p.n_tensors, 0); /* zeroed */
    ASSERT_NULL(p.tensors);
    if (!strstr(err, want)) unit_fail(__FILE__, __LINE__, "message \"%s\" lacks \"%s\"", err, want);
    int line = 0, col = 0;
    if (sscanf(err, "%d:%d: ", &line, &col) != 2 || line < 1 || col < 1)
        unit_fail(__FILE__, __LINE__, "message \"%s\" does not start with LINE:COL", err);
}

static void refused_edit(const char *text, const char *from, const char *to, const char *want) {
    char *bad = edit(text, from, to);
    refused(bad, strlen(bad), want);
    free(bad);
}

/* make_plan's model (tp 2) as plan text; the caller frees. */
static char *model_text(size_t *len) {
    plan p;
    make_plan(&p, NULL, NULL, 0);
    char *text = write_text(&p, len);
    plan_free(&p);
    return text;
}

TEST_IMPL(plan_read_refuses_bad_plans)
{
    size_t len;
    char *text = model_text(&len);

    refused_edit(text, "magic: mesh-plan", "magic: mesh-plot", "not a mesh plan (magic is 'mesh-plot'");
    refused_edit(text, "magic: mesh-plan\n", "", "not a mesh plan (it has no 'magic: mesh-plan' line)");
    refused_edit(text, "format: 1", "format: 2",
                 "3:9: plan format version 2 is not supported: this build reads version 1\n"
                 "HINT: this plan was written by meshc 0.1.0 with format version 2; recompile the .mesh file with "
                 "this meshc (format version 1)");
    /* a newer plan is refused by its version, whatever else changed */
    refused_edit(text, "format: 1\n", "format: 7\nnew_section: {a: 1}\n", "format version 7 is not supported");
    /* cut short: at a line end it is still YAML, but has no end line */
    refused(text, (size_t)(strstr(text, "\nprogram:") - text), "the plan is truncated");
    refused(text, len / 2, "");
    refused(text, 0, "the file is empty");
    refused_edit(text, "placement: [R, S0, R, R]", "placement: [R, Q, R, R]",
                 "placement 'Q' over tp must be R (replicated), P (partial) or S<dim>");
    refused_edit(text, "placement: [R, S0, R, R]", "placement: [R, S2, R, R]", "below the rank 2");
    refused_edit(text, "in: [0, 2]", "in: [0, 9999]", "an input id (an earlier tensor) must be from 0 to");
    refused_edit(text, "in: [0, 2]", "in: [0, 4]", "must be from 0 to 3, not 4");
    refused_edit(text, "  dtype: f32\n", "  dtype: f32\n  colour: red\n", "unknown key 'colour' in tensor");
    refused_edit(text, "  dtype: f32\n", "", "has no key 'dtype'");
    refused_edit(text, "  dp: 1\n", "  dp: 1\n  dp: 1\n", "duplicate key 'dp' in mesh");
    refused_edit(text, "world: 2", "world: 3", "world (3) must be dp x tp x pp x ep");
    refused_edit(text, "zero: 0", "zero: \"0\"", "train: zero must be an integer");
    refused_edit(text, "zero: 0", "zero: 4", "zero must be from 0 to 3, not 4");
    refused_edit(text, "schedule: 1f1b", "schedule: zigzag", "schedule must be gpipe, 1f1b or interleaved");
    refused_edit(text, "recompute: false", "recompute: no", "recompute must be true or false");
    refused_edit(text, "eps: 1.0e-05", "eps: .nan", "must be a finite number");
    refused_edit(text, "kind: all-reduce", "kind: all-reduce-ish", "kind must be compute, all-reduce");
    refused_edit(text, "kind: compute, node: 4,", "kind: compute, node: 4, axis: tp,", "a compute step has no axis");
    refused_edit(text, "- [fwd, 0, 0, -1]", "- [fwd, 0, 1, -1]", "chunk must be 0, not 1");
    refused_edit(text, "    - [bwd, 0, 0, -1]\n", "", "never runs the backward of micro-batch 0 through chunk 0");
    refused_edit(text, "- [fwd, 0, 0, -1]", "- [fwd, 0, 0, 1]", "peer must be from -1 to 0");
    refused_edit(text, "loss: ", "loss: &x ", "anchors (&name) are not allowed");
    refused_edit(text, "zero: 0", "zero: !!int 0", "tags (!name) are not allowed");
    refused_edit(text, "end: mesh-plan", "end: mesh-plan\n---\nmore: 1", "a second one starts here");
    refused_edit(text, "mesh:\n  dp: 1", "mesh:\n  dp: [1", "malformed plan: YAML syntax error");

    /* garbage: binary bytes, and text that is YAML but not a plan */
    static const unsigned char junk[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0xff, 0xfe, 0x00, 0x80, '\n'};
    refused((const char *)junk, sizeof junk, "not a mesh plan");
    refused("just words\n", 11, "not a mesh plan (a plan is a YAML map");
    refused("- 1\n- 2\n", 8, "not a mesh plan");
    refused("{magic: [mesh-plan]}", 20, "not a mesh plan (magic is 'a list or map'");
    refused("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", 80,
            "nested more than 16 levels deep");
    free(text);
}

/* Each tensor is checked against its op (compiler/plan_check.c): a plan
 * edited into one whose ops read past their inputs is refused where the
 * tensor is, not run. */
TEST_IMPL(plan_read_checks_each_op)
{
    size_t len;
    char *text = model_text(&len);

    refused_edit(text, "in: [0, 2]", "in: [0]", "tensor 4 (embed): it takes 2 inputs, not 1");
    refused_edit(text, "in: [0, 2]", "in: [2, 0]", "its input 0 (tensor 2) must be i32, not f32");
    refused_edit(text, "shape: [2, 16, 64]\n  dtype: f32\n  in: [0, 2]", "shape: [2, 16, 65]\n  dtype: f32\n  in: [0, 2]",
                 "its shape [2, 16, 65] is not its ids' [2, 16] and a row of its table [256, 64]");
    refused_edit(text, "in: [4, 6]", "in: [4, 2]", "tensor 7 (add): its inputs' shapes [2, 16, 64] and [256, 64] do not "
                 "match");
    refused_edit(text, "in: [4, 6]", "in: [4, 1]", "its input 1 (tensor 1) must be f32, not i32");
    refused_edit(text, "    heads: 4\n    kv_heads: 4", "    heads: 3\n    kv_heads: 3",
                 "(attention): packed qkv's last dimension (192) is not (heads + 2 x kv_heads) x a head size");
    refused_edit(text, "    heads: 4\n    kv_heads: 4", "    heads: 4\n    kv_heads: 3",
                 "heads (4) must be a positive multiple of kv_heads (3)");
    refused_edit(text, "    heads: 4\n    kv_heads: 4", "    heads: 1\n    kv_heads: 1",
                 "(attention): its heads (1) are split over tp = 2");
    refused_edit(text, "shape: [256, 64]", "shape: [255, 64]", "tensor 2 (param): its dimension 0 (255) is split over "
                 "tp = 2");
    refused_edit(text, "vocab: 0", "vocab: 999", "vocab (999) must be from 1 to the logits' last dimension (256)");
    refused_edit(text, "node: 4, axis: tp, dim: -1", "node: 4, axis: tp, dim: 3",
                 "dim (-1, or below its tensor's rank) must be from -1 to 2, not 3");
    /* the op of a tensor changed: its inputs no longer fit */
    refused_edit(text, "op: embed", "op: matmul", "tensor 4 (matmul): its input 0 (tensor 0) must be f32, not i32");
    refused_edit(text, "op: add", "op: mul", "tensor 7 (mul): its inputs' shapes [2, 16, 64] and [16, 64] do not match");
    /* the inputs are the micro-batches of ids the caller gives (mesh_plan_batch) */
    refused_edit(text, "  seq_len: 16\n", "  seq_len: 8\n",
                 "tensor 0 (input): its shape [2, 16] is not [micro_batch, seq_len] = [2, 8]");
    /* the program: each step in its tensor's region (which part of a stage
     * runs it), the forward once per tensor in the ids' order, the
     * backward at most once in the reverse order */
    refused_edit(text, "{phase: forward, kind: compute, node: 4, region: -1}",
                 "{phase: forward, kind: compute, node: 4, region: 0}", "region 0, where its tensor 4 is in region -1");
    refused_edit(text, "{phase: forward, kind: compute, node: 6, region: -1}",
                 "{phase: forward, kind: compute, node: 5, region: -1}",
                 "computes tensor 5 after tensor 5: the forward runs in the order of the ids, each once");
    refused_edit(text, "{phase: forward, kind: compute, node: 6, region: -1}", "{phase: forward, kind: compute, node: 3, "
                 "region: -1}", "computes tensor 3, a param");
    refused_edit(text, "{phase: backward, kind: compute, node: 38, region: -1}",
                 "{phase: backward, kind: compute, node: 39, region: -1}", "takes the backward of tensor 39 after tensor "
                 "39's: the backward runs in the reverse order of the ids, each once");
    refused_edit(text, "- {phase: forward, kind: compute, node: 6, region: -1}\n", "",
                 "takes the backward of tensor 6, which the forward does not compute");
    /* the loss is a scalar (the logits were taken for it: their width then
     * passed for the vocabulary, and the targets were not checked against
     * the cross-entropy's own) */
    char loss[32];
    const char *at = strstr(text, "\nloss: ");
    ASSERT_NOT_NULL(at);
    snprintf(loss, sizeof loss, "loss: %d\n", atoi(at + 7));
    refused_edit(text, loss, "loss: 4\n", "the loss, tensor 4 (embed), must be a scalar");
    free(text);
}

/* The writer refuses what it cannot represent, and a schedule that does
 * not match the settings is refused by plan_from. */
TEST_IMPL(plan_write_and_from_refuse)
{
    plan p;
    make_plan(&p, NULL, NULL, 0);
    char *buf = NULL, err[256] = "";
    size_t len;
    free(p.source);
    p.source = strdup("caf\xe9.mesh"); /* Latin-1, not UTF-8 */
    FILE *m = open_memstream(&buf, &len);
    ASSERT_INT_EQ(plan_write(&p, m, err, sizeof err), -1);
    fclose(m);
    free(buf);
    ASSERT_STR_EQ(err, "cannot write the plan: the source file name is not valid UTF-8");
    plan_free(&p);

    char path[512];
    snprintf(path, sizeof path, "%s/../examples/gpt2.mesh", MESH_STD_DIR); /* pp = 2, 16 micro-batches */
    fe *f = fixture_checked(NULL, path, NULL, 0);
    fe_setup s = fe_get_setup(f);
    shard_prog sp;
    ASSERT_INT_EQ(shard_build(fe_graph(f), &s, &sp), 0);
    ASSERT_INT_EQ(plan_from(&p, path, &s, fe_graph(f), &sp, NULL), -1);
    ASSERT_STR_EQ(p.error, "plan_from: pp = 2 needs a pipeline schedule");
    sched sc;
    ASSERT_INT_EQ(sched_build(&sc, SCHED_KIND_1F1B, 2, 8, 1, err, (int)sizeof err), 0);
    ASSERT_INT_EQ(plan_from(&p, path, &s, fe_graph(f), &sp, &sc), -1);
    ASSERT_NOT_NULL(strstr(p.error, "does not match the settings (1f1b, pp 2, m 16, v 1)"));
    ASSERT_NULL(p.tensors);
    sched_free(&sc);
    shard_free(&sp);
    fe_free(f);
}

/* ---- Mutations ------------------------------------------------------ */

static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;

static unsigned rnd(unsigned n) { /* xorshift64*, deterministic */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (unsigned)((rng_state * 0x2545F4914F6CDD1Dull) >> 33) % n;
}

/* The start of line k of text (or its end). */
static size_t line_start(const char *t, size_t len, unsigned k) {
    size_t i = 0;
    for (; i < len && k > 0; i++)
        if (t[i] == '\n') k--;
    return i;
}

static size_t line_end(const char *t, size_t len, size_t i) {
    while (i < len && t[i] != '\n') i++;
    return i < len ? i + 1 : i;
}

/* One mutation of base into out (capacity 2 * len + 64); returns the new length. */
static size_t mutate(const char *base, size_t len, char *out) {
    static const char bytes[] = ":-[]{}#&*!|>'\"\n ,0123456789ePRS";
    unsigned lines = 0;
    for (size_t i = 0; i < len; i++) lines += base[i] == '\n';
    memcpy(out, base, len);
    switch (rnd(6)) {
    case 0: /* flip a few bytes */
        for (unsigned k = 1 + rnd(4); k > 0; k--) {
            unsigned c = rnd(4);
            out[rnd((unsigned)len)] = c == 0 ? (char)rnd(256) : bytes[rnd(sizeof bytes - 1)];
        }
        return len;
    case 1: /* truncate */
        return rnd((unsigned)len);
    case 2: { /* duplicate a line */
        size_t a = line_start(base, len, rnd(lines)), b = line_end(base, len, a);
        memcpy(out, base, b);
        memcpy(out + b, base + a, b - a);
        memcpy(out + b + (b - a), base + b, len - b);
        return len + (b - a);
    }
    case 3: { /* delete a line */
        size_t a = line_start(base, len, rnd(lines)), b = line_end(base, len, a);
        memcpy(out + a, base + b, len - b);
        return len - (b - a);
    }
    case 4: { /* change one digit: often still a plan, checked deeper */
        for (int tries = 0; tries < 64; tries++) {
            size_t i = rnd((unsigned)len);
            if (base[i] >= '0' && base[i] <= '9') {
                out[i] = (char)('0' + rnd(10));
                break;
            }
        }
        return len;
    }
    default: { /* swap two lines' contents by moving one line to another place */
        size_t a = line_start(base, len, rnd(lines)), b = line_end(base, len, a);
        size_t rest = len - (b - a);
        char *tmp = malloc(rest + 1);
        ASSERT_NOT_NULL(tmp);
        memcpy(tmp, base, a);
        memcpy(tmp + a, base + b, len - b);
        size_t at = line_start(tmp, rest, rnd(lines));
        memcpy(out, tmp, at);
        memcpy(out + at, base + a, b - a);
        memcpy(out + at + (b - a), tmp + at, rest - at);
        free(tmp);
        return len;
    }
    }
}

/* A few hundred mutated plans: none may crash (asan), and whatever reads
 * successfully must write and read back to the same text. */
TEST_IMPL(plan_read_survives_mutations)
{
    static const char *const sets[] = {"mesh.pp=2", "train.global_batch=4", "train.micro_batch=1"};
    plan p;
    make_plan(&p, NULL, sets, 3);
    size_t len;
    char *text = write_text(&p, &len);
    plan_free(&p);
    char *buf = malloc(2 * len + 64);
    ASSERT_NOT_NULL(buf);
    int accepted = 0, refused_n = 0;
    for (int i = 0; i < 400; i++) {
        size_t n = mutate(text, len, buf);
        plan q;
        char err[512];
        if (plan_read(&q, buf, n, err, sizeof err) != 0) {
            int line, col;
            if (sscanf(err, "%d:%d: ", &line, &col) != 2)
                unit_fail(__FILE__, __LINE__, "mutation %d: message \"%s\" has no LINE:COL", i, err);
            refused_n++;
            continue;
        }
        accepted++;
        plan back;
        size_t l1;
        char *t1 = roundtrip(&q, &back, &l1);
        free(t1);
        plan_free(&back);
        plan_free(&q);
    }
    fprintf(stderr, "# %d mutations read, %d refused\n", accepted, refused_n);
    ASSERT_INT_GE(refused_n, 100);
    free(buf);
    free(text);
}
