/*
 * test_shard.c: analytic tests of placements and collective insertion
 * (compiler/shard.c, autodiff.c) against Megatron-LM's published counts:
 * per transformer layer, 2 all-reduces of b*s*h over tp in forward and 2 in
 * backward; with sequence parallelism 2 all-gathers and 2 reduce-scatters
 * each way instead; ZeRO's gradient reductions of exactly the local params.
 */
#include <stdio.h>  /* defines: snprintf */

#include "fixture.h"  /* defines: fixture_checked */
#include "frontend.h" /* defines: fe_* */
#include "shard.h"    /* defines: shard_* */
#include "stats.h"    /* defines: stats_* */
#include "unit.h"     /* defines: TEST_IMPL, ASSERT_* */

enum { B = 2, S = 16, H = 64, L = 3 };

/* A GPT-2 model with L layers of width H, checked and sharded with the
 * given --set overrides; the caller frees. */
static fe *sharded(shard_prog *p, const char *const *sets, int n_sets) {
    static const char src[] =
        "import \"std/transformer.mesh\"\n"
        "model m {\n"
        "  input tokens : int[batch, seq]\n"
        "  input targets : int[batch, seq]\n"
        "  param wte : [256, 64] @split(tp, 0)\n"
        "  param wpe : [16, 64]\n"
        "  x = embed(tokens, wte) + embed(arange(seq), wpe)\n"
        "  repeat 3 { x = gpt2_block(x, heads: 4) }\n"
        "  param lnf_w : [64] = ones\n"
        "  param lnf_b : [64] = zeros\n"
        "  loss = cross_entropy(layernorm(x, lnf_w, lnf_b) @ transpose(wte), targets)\n"
        "}\n"
        "mesh { tp = 2 }\n"
        "train { global_batch = 2  seq_len = 16  steps = 1  optimizer = adamw(lr: 1e-3) }\n";
    fe *f = fixture_checked(src, NULL, sets, n_sets);
    fe_setup setup = fe_get_setup(f);
    ASSERT_INT_EQ(shard_build(fe_graph(f), &setup, p), 0);
    return f;
}

enum { AR = STEP_ALL_REDUCE, RS = STEP_REDUCE_SCATTER, AG = STEP_ALL_GATHER, A2A = STEP_ALL_TO_ALL, TPX = 1, DPX = 0 };

TEST_IMPL(shard_megatron_tp_layer_counts)
{
    shard_prog p;
    fe *f = sharded(&p, NULL, 0);
    shard_counts c;
    shard_count(&p, 0, 1, &c); /* forward, one layer */
    ASSERT_INT_EQ(c.n[AR][TPX], 2);
    ASSERT_INT_EQ(c.elems[AR][TPX], 2 * B * S * H);
    ASSERT_INT_EQ(c.n[RS][TPX] + c.n[AG][TPX] + c.n[A2A][TPX], 0);
    shard_count(&p, 1, 1, &c); /* backward, one layer */
    ASSERT_INT_EQ(c.n[AR][TPX], 2);
    ASSERT_INT_EQ(c.elems[AR][TPX], 2 * B * S * H);
    ASSERT_INT_EQ(c.n[RS][TPX] + c.n[AG][TPX], 0);
    /* the whole micro-batch: + the vocab-parallel embedding's all-reduce and
     * cross-entropy's three all-reduces of one number per token forward,
     * and the LM head input's all-reduce backward */
    shard_count(&p, 0, 0, &c);
    ASSERT_INT_EQ(c.n[AR][TPX], 2 * L + 1 + 3);
    ASSERT_INT_EQ(c.elems[AR][TPX], (2 * L + 1) * B * S * H + 3 * B * S);
    shard_count(&p, 1, 0, &c);
    ASSERT_INT_EQ(c.n[AR][TPX], 2 * L + 1);
    shard_free(&p);
    fe_free(f);
}

TEST_IMPL(shard_megatron_sequence_parallel_counts)
{
    static const char *const sets[] = {"train.sequence_parallel=true"};
    shard_prog p;
    fe *f = sharded(&p, sets, 1);
    shard_counts c;
    shard_count(&p, 0, 1, &c);
    ASSERT_INT_EQ(c.n[AR][TPX], 0);
    ASSERT_INT_EQ(c.n[RS][TPX], 2);
    ASSERT_INT_EQ(c.n[AG][TPX], 2);
    ASSERT_INT_EQ(c.elems[RS][TPX], 2 * B * S * H);
    ASSERT_INT_EQ(c.elems[AG][TPX], 2 * B * S * H);
    shard_count(&p, 1, 1, &c);
    ASSERT_INT_EQ(c.n[RS][TPX], 2);
    ASSERT_INT_EQ(c.n[AG][TPX], 2);
    ASSERT_INT_EQ(c.elems[RS][TPX] + c.elems[AG][TPX], 4 * B * S * H);
    /* the gradients of the params that see sequence-split activations (two
     * norms' weights and biases, the two row-parallel biases) are summed,
     * once per step (Megatron's layernorm-grad all-reduce) */
    ASSERT_INT_EQ(c.n[AR][TPX], 0);
    shard_count(&p, 2, 1, &c);
    ASSERT_INT_EQ(c.n[AR][TPX], 6);
    ASSERT_INT_EQ(c.elems[AR][TPX], 6 * H);
    shard_free(&p);
    fe_free(f);
}

/* Full recompute: each layer's backward runs its forward again first, with
 * its collectives: 2 + 2 all-reduces of b*s*h per layer in backward. */
TEST_IMPL(shard_recompute_repeats_forward_collectives)
{
    static const char *const sets[] = {"train.recompute=full"};
    shard_prog p;
    fe *f = sharded(&p, sets, 1);
    shard_counts c;
    shard_count(&p, 1, 1, &c);
    ASSERT_INT_EQ(c.n[AR][TPX], 4);
    ASSERT_INT_EQ(c.elems[AR][TPX], 4 * B * S * H);
    int recomputed = 0;
    for (int i = 0; i < p.n_steps; i++) recomputed += p.steps[i].recompute;
    ASSERT_INT_GE(recomputed, 14); /* the layer's 14 ops and its 2 all-reduces */
    shard_free(&p);
    fe_free(f);
}

/* ZeRO: the gradient sync moves exactly the local params: Psi elements
 * reduce-scattered (zero >= 1) or all-reduced (zero 0), and zero 1/2
 * gather Psi updated elements after the step (anchors.md: 2 Psi in all). */
TEST_IMPL(shard_zero_gradient_sync)
{
    /* params per tp rank: wte/2 + wpe + L*(block) + lnf, block with
     * split qkv, fc, out-proj weights and split biases */
    const long long psi_total = 256 * 64 + 16 * 64 + L * (12LL * H * H + 13 * H) + 2 * H;
    const long long replicated = 16 * 64 + L * (6LL * H) + 2 * H; /* wpe, norms, two biases, lnf */
    const long long psi_local = (psi_total - replicated) / 2 + replicated;
    for (int zero = 0; zero <= 3; zero++) {
        char z[32];
        snprintf(z, sizeof z, "train.zero=%d", zero);
        const char *sets[] = {"mesh.dp=4", "train.global_batch=8", z};
        shard_prog p;
        fe *f = sharded(&p, sets, 3);
        shard_counts c;
        /* once per step, in buckets (the params after the stack, each
         * layer's, those before); zero 2 and 3 per micro-batch in backward,
         * each param's gradient as soon as its backward is done */
        shard_count(&p, 2, 0, &c);
        ASSERT_INT_EQ(c.elems[zero ? RS : AR][DPX], zero >= 2 ? 0 : psi_local);
        ASSERT_INT_EQ(c.n[zero ? RS : AR][DPX], zero >= 2 ? 0 : L + 2);
        ASSERT_INT_EQ(c.n[zero ? AR : RS][DPX], 0);
        shard_count(&p, 1, 0, &c);
        ASSERT_INT_EQ(c.elems[RS][DPX], zero >= 2 ? psi_local : 0);
        shard_count(&p, 3, 0, &c);
        ASSERT_INT_EQ(c.elems[AG][DPX], zero == 1 || zero == 2 ? psi_local : 0);
        /* zero 3 gathers every param before its use in forward, and a
         * layer's again in backward (those outside the stack stay gathered):
         * with the reduce-scatter, about 3 Psi per step (1.5x plain dp) */
        const long long outside = 256 * 64 / 2 + 16 * 64 + 2 * H; /* wte / 2, wpe, lnf */
        for (int b = 0; b < 2; b++) {
            shard_count(&p, b, 0, &c);
            ASSERT_INT_EQ(c.elems[AG][DPX], zero == 3 ? psi_local - (b ? outside : 0) : 0);
        }
        shard_free(&p);
        fe_free(f);
    }
}

/* Expert parallelism: each moe sends tokens to their experts and back,
 * forward and backward, with buffers of experts x capacity x dim. */
TEST_IMPL(shard_moe_all_to_all)
{
    static const char src[] =
        "model m {\n"
        "  input tokens : int[batch, seq]\n"
        "  param emb : [64, 16]\n"
        "  param router : [16, 4]\n"
        "  param w_fc : [4, 16, 32] @split(ep, 0)\n"
        "  param w_out : [4, 32, 16] @split(ep, 0)\n"
        "  x = embed(tokens, emb)\n"
        "  repeat 2 { x = x + moe(x, router, w_fc, w_out, act: gelu, top_k: 2, capacity: 1.0) }\n"
        "  loss = cross_entropy(x @ transpose(emb), tokens)\n"
        "}\n"
        "mesh { ep = 2 }\n"
        "train { global_batch = 4  seq_len = 8  steps = 1  optimizer = adamw(lr: 1e-3) }\n";
    fe *f = fixture_checked(src, NULL, NULL, 0);
    fe_setup setup = fe_get_setup(f);
    shard_prog p;
    ASSERT_INT_EQ(shard_build(fe_graph(f), &setup, &p), 0);
    shard_counts c;
    /* 2 sequences x 8 tokens per rank, top 2 of 4 experts: capacity 8 */
    for (int b = 0; b < 2; b++) {
        shard_count(&p, b, 0, &c);
        ASSERT_INT_EQ(c.n[A2A][3], 2 * 2);
        ASSERT_INT_EQ(c.elems[A2A][3], 2 * 2 * (4 * 8 * 16));
    }
    shard_count(&p, 2, 0, &c);
    /* dense params over dp x ep = 2 ranks, experts over dp = 1: not synced */
    ASSERT_INT_EQ(c.elems[AR][DPX], 64 * 16 + 16 * 4);
    shard_free(&p);
    fe_free(f);
}

/* Model-state memory per rank equals ZeRO's accounting (anchors.md §1)
 * with gradients of G bytes: with bf16, (2 + G + 12) Psi without ZeRO;
 * (2 + G) Psi + 12 Psi / Nd (stage 1); 2 Psi + (G + 12) Psi / Nd (stage
 * 2); (2 + G + 12) Psi / Nd (stage 3). The paper keeps fp16 gradients (G =
 * 2: 16 Psi); mesh keeps fp32 main gradients, G = 4, as Megatron-LM does
 * for bf16 (18 bytes a param; 6 + 12 / d with its distributed optimizer). */
TEST_IMPL(stats_zero_memory_matches_anchors)
{
    const long long nd = 4;
    for (int zero = 0; zero <= 3; zero++) {
        char z[32];
        snprintf(z, sizeof z, "train.zero=%d", zero);
        const char *sets[] = {"mesh.tp=1", "mesh.dp=4", "train.global_batch=8", "train.precision=bf16", z};
        shard_prog p;
        fe *f = sharded(&p, sets, 5);
        fe_setup setup = fe_get_setup(f);
        sched sc;
        char err[128];
        ASSERT_INT_EQ(sched_build(&sc, SCHED_KIND_1F1B, 1, (int)setup.micro_batches, 1, err, sizeof err), 0);
        stats s;
        ASSERT_INT_EQ(stats_build(&s, &p, &sc), 0);
        const long long psi = s.stage[0].n_params;
        ASSERT_INT_EQ(psi, 256 * 64 + 16 * 64 + L * (12LL * H * H + 13 * H) + 2 * H);
        const long long G = 4;
        long long want = zero == 0 ? (2 + G + 12) * psi : zero == 1 ? (2 + G) * psi + 12 * psi / nd
                       : zero == 2 ? 2 * psi + (G + 12) * psi / nd : (2 + G + 12) * psi / nd;
        long long got = s.stage[0].params + s.stage[0].grads + s.stage[0].optim;
        /* Psi / Nd rounds per tensor; allow one byte per param tensor */
        ASSERT_INT_LT(got > want ? got - want : want - got, 64);
        stats_free(&s);
        sched_free(&sc);
        shard_free(&p);
        fe_free(f);
    }
}
