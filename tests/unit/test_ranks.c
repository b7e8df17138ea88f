/*
 * test_ranks.c: the static check over every rank's program
 * (compiler/ranks.c): generated programs pass; the same programs with one
 * rank's collectives swapped, or one receive dropped, are caught with a
 * message that names the ranks.
 */
#include <string.h> /* defines: strstr */

#include "fixture.h"  /* defines: fixture_checked */
#include "compile.h"  /* defines: compile_run, compiled */
#include "frontend.h" /* defines: fe_* */
#include "ranks.h"    /* defines: ranks_* */
#include "unit.h"     /* defines: TEST_IMPL, ASSERT_* */

/* GPT-2-style, 4 layers, on dp 2 x tp 2 x pp 2 with 1F1B and zero 1:
 * compiled as meshc does (compile_run: the rank programs sized by the
 * plan's layout). */
static fe *build(compiled *c) {
    static const char src[] =
        "import \"std/transformer.mesh\"\n"
        "model m {\n"
        "  input tokens : int[batch, seq]\n"
        "  param wte : [256, 64] @split(tp, 0)\n"
        "  x = embed(tokens, wte)\n"
        "  repeat 4 { x = gpt2_block(x, heads: 4) }\n"
        "  loss = cross_entropy(x @ transpose(wte), tokens)\n"
        "}\n"
        "mesh { dp = 2  tp = 2  pp = 2 }\n"
        "train { global_batch = 8  micro_batch = 1  seq_len = 8  steps = 1  zero = 1\n"
        "        optimizer = adamw(lr: 1e-3) }\n";
    fe *f = fixture_checked(src, NULL, NULL, 0);
    ASSERT_INT_EQ(fe_get_setup(f).micro_batches, 4);
    ASSERT_INT_EQ(compile_run(f, c, 1), FE_OK);
    ASSERT_INT_EQ(c->have_ranks, 1);
    return f;
}

static void teardown(fe *f, compiled *c) {
    compile_free(c);
    fe_free(f);
}

TEST_IMPL(ranks_generated_programs_pass)
{
    compiled c;
    fe *f = build(&c);
    rank_progs *r = &c.ranks;
    char msg[1024];
    ASSERT_INT_EQ(r->world, 8);
    ASSERT_INT_EQ(ranks_check(r, msg, sizeof msg), 0);
    /* 4 micro-batches x (activations + gradients) x 4 (dp, tp) pairs of
     * stage ranks, each a send and a receive */
    ASSERT_INT_EQ(r->n_p2p, 4 * 2 * 4 * 2);
    /* tensor-parallel peers run the same collectives in the same order */
    ASSERT_INT_EQ(r->progs[0].n, r->progs[1].n);
    teardown(f, &c);
}

/* Swapping two different collectives of one group on one rank: its peers
 * enter them in the other order. (Collectives of equal type and size are
 * indistinguishable to the check, and swapping them cannot deadlock.) */
TEST_IMPL(ranks_swapped_collectives_caught)
{
    compiled c;
    fe *f = build(&c);
    rank_progs *r = &c.ranks;
    verify_op *ops = r->ops[1];
    int i = 0, j = -1;
    for (; i < r->n_ops[1] && j < 0; i++)
        for (int k = i + 1; k < r->n_ops[1]; k++)
            if (ops[i].kind == VERIFY_COLL && ops[k].kind == VERIFY_COLL && ops[i].group == ops[k].group &&
                (ops[i].coll != ops[k].coll || ops[i].bytes != ops[k].bytes)) {
                j = k;
                break;
            }
    ASSERT_INT_GE(j, 0);
    i--;
    verify_op tmp = ops[i];
    ops[i] = ops[j];
    ops[j] = tmp;
    char msg[1024];
    ASSERT_INT_EQ(ranks_check(r, msg, sizeof msg), -1);
    ASSERT_NOT_NULL(strstr(msg, "rank 1"));
    teardown(f, &c);
}

/* Dropping a receive on a stage-1 rank: the send is never received. */
TEST_IMPL(ranks_missing_receive_caught)
{
    compiled c;
    fe *f = build(&c);
    rank_progs *r = &c.ranks;
    int rank = 4; /* pp stage 1, dp 0, tp 0 */
    verify_op *ops = r->ops[rank];
    int k = 0;
    while (k < r->n_ops[rank] && ops[k].kind != VERIFY_RECV) k++;
    ASSERT_INT_LT(k, r->n_ops[rank]);
    memmove(&ops[k], &ops[k + 1], (size_t)(r->n_ops[rank] - k - 1) * sizeof *ops);
    r->n_ops[rank]--;
    r->progs[rank].n--;
    char msg[1024];
    ASSERT_INT_EQ(ranks_check(r, msg, sizeof msg), -1);
    ASSERT_NOT_NULL(strstr(msg, "rank 4"));
    teardown(f, &c);
}
