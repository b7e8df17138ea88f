/*
 * test_memplan.c: the static memory plan (compiler/memplan.c) on a model
 * small enough to account by hand: which activations backward keeps, the
 * slots the schedule needs, recompute, and reuse of the workspace.
 */

#include "fixture.h"  /* defines: fixture_checked */
#include "frontend.h" /* defines: fe_* */
#include "kern.h"     /* defines: kern_cpu_vtbl, kern_cuda_vtbl */
#include "memplan.h"  /* defines: memplan_* */
#include "plan.h"     /* defines: plan_from */
#include "unit.h"     /* defines: TEST_IMPL, ASSERT_* */

enum { B = 2, T = 8, D = 16, F = 64, V = 32 };

/* x = embed -> repeat 2 { x + gelu(layernorm(x) @ w1) @ w2 } -> logits;
 * fp32, one rank (or pp 2). */
/* A compiled model, its plan and the plan's memory plan. */
typedef struct built {
    fe *f;
    shard_prog p;
    sched sc;
    plan pl;
} built;

static fe *build(const char *const *sets, int n_sets, built *x, memplan *m) {
    shard_prog *p = &x->p;
    sched *sc = &x->sc;
    static const char src[] =
        "model m {\n"
        "  input tokens : int[batch, seq]\n"
        "  param emb : [32, 16]\n"
        "  x = embed(tokens, emb)\n"
        "  repeat 2 {\n"
        "    param g : [16] = ones\n"
        "    param w1 : [16, 64]\n"
        "    param w2 : [64, 16]\n"
        "    x = x + gelu(layernorm(x, g) @ w1) @ w2\n"
        "  }\n"
        "  loss = cross_entropy(x @ transpose(emb), tokens)\n"
        "}\n"
        "mesh { dp = 1 }\n"
        "train { global_batch = 4  micro_batch = 2  seq_len = 8  steps = 1  optimizer = adamw(lr: 1e-3) }\n";
    fe *f = fixture_checked(src, NULL, sets, n_sets);
    fe_setup s = fe_get_setup(f);
    ASSERT_INT_EQ(shard_build(fe_graph(f), &s, p), 0);
    char err[128];
    ASSERT_INT_EQ(sched_build(sc, SCHED_KIND_1F1B, (int)s.pp, (int)s.micro_batches, 1, err, sizeof err), 0);
    ASSERT_INT_EQ(plan_from(&x->pl, "m.mesh", &s, fe_graph(f), p, sc), 0);
    ASSERT_INT_EQ(memplan_build(m, &x->pl, 0, 0), 0);
    x->f = f;
    return f;
}

static void teardown(built *x, memplan *m) {
    memplan_free(m);
    plan_free(&x->pl);
    sched_free(&x->sc);
    shard_free(&x->p);
    fe_free(x->f);
}

/* What backward reads, per layer: the norm's input and its two row
 * statistics, each matmul's input, gelu's input. Outside: the ids, the
 * LM head's input, the logits and the targets, and the loss's statistics. */
TEST_IMPL(memplan_saved_activations_by_hand)
{
    built x;
    memplan m;
    build(NULL, 0, &x, &m);
    const long long rows = B * T, fl = 4;
    long long layer = rows * D * fl      /* layernorm input */
                    + rows * 2 * 4       /* its mean and 1/std */
                    + rows * D * fl      /* w1's input: the norm's output */
                    + rows * F * fl      /* gelu's input */
                    + rows * F * fl;     /* w2's input: gelu's output */
    long long outside = rows * 4         /* the token ids (embed, and the targets) */
                      + rows * D * fl    /* the LM head's input: the last layer's output */
                      + rows * V * fl    /* the logits */
                      + 16 + rows * 3 * 4; /* the loss (its room: 16 bytes); cross-entropy's loss, max and
                                              sum per token */
    ASSERT_INT_EQ(m.stage[0].layer_stride, layer);
    ASSERT_INT_EQ(m.stage[0].slot_bytes, 2 * layer + outside);
    ASSERT_INT_EQ(m.stage[0].slots, 1);
    /* workspace: reuse makes it smaller than all temporaries together */
    ASSERT_INT_GE(m.stage[0].workspace, rows * F * fl);
    ASSERT_INT_LT(m.stage[0].workspace, 2 * (layer + outside));
    ASSERT_INT_EQ(m.stage[0].total, m.stage[0].params + m.stage[0].grads + m.stage[0].optim +
                                        m.stage[0].slot_bytes + m.stage[0].workspace + m.stage[0].comm);
    teardown(&x, &m);
}

/* With full recompute a layer keeps only its input. */
TEST_IMPL(memplan_recompute_keeps_layer_inputs)
{
    static const char *const sets[] = {"train.recompute=full"};
    built x;
    memplan m;
    build(sets, 1, &x, &m);
    ASSERT_INT_EQ(m.stage[0].layer_stride, B * T * D * 4);
    teardown(&x, &m);
}

/* 1F1B keeps pp - s micro-batches in flight on stage s. */
TEST_IMPL(memplan_slots_follow_the_schedule)
{
    static const char *const sets[] = {"mesh.pp=2", "train.micro_batch=1"};
    built x;
    memplan m;
    build(sets, 2, &x, &m);
    ASSERT_INT_EQ(m.pp, 2);
    ASSERT_INT_EQ(m.stage[0].slots, 2);
    ASSERT_INT_EQ(m.stage[1].slots, 1);
    teardown(&x, &m);
}

/* zero = 2 stages the full gradients of the params outside the stack and
 * of one layer before their reduce-scatter; zero = 3 also gathers their
 * values whole for use, a layer's and the next one's (prefetched). The
 * grads (zero >= 2) and params (zero = 3) are the dp group's shards. */
TEST_IMPL(memplan_zero3_gathers_two_layers)
{
    static const char *const z0[] = {"mesh.dp=2", "train.zero=0"}, *const z2[] = {"mesh.dp=2", "train.zero=2"},
                             *const z3[] = {"mesh.dp=2", "train.zero=3"};
    built x0, x2, x3;
    memplan m0, m2, m3;
    build(z0, 2, &x0, &m0);
    build(z2, 2, &x2, &m2);
    build(z3, 2, &x3, &m3);
    long long layer = (D + D * F + F * D) * 4, fixed = V * D * 4; /* one layer's params, emb's; fp32 */
    ASSERT_INT_EQ(m2.stage[0].zlayer, layer);
    ASSERT_INT_EQ(m2.stage[0].zfixed, fixed);
    /* zero 2: the gradients staged, outside the stack and two layers (one
     * reduce-scattering while the next fills the other); zero 3: the
     * values gathered too, two layers (one in use, one prefetched) */
    ASSERT_INT_EQ(m2.stage[0].workspace - m0.stage[0].workspace, fixed + 2 * layer);
    ASSERT_INT_EQ(m3.stage[0].workspace - m0.stage[0].workspace, 2 * fixed + 4 * layer);
    ASSERT_INT_EQ(m2.stage[0].grads * 2, m0.stage[0].grads);
    ASSERT_INT_EQ(m2.stage[0].params, m0.stage[0].params);
    ASSERT_INT_EQ(m3.stage[0].params * 2, m0.stage[0].params);
    teardown(&x2, &m2);
    teardown(&x0, &m0);
    teardown(&x3, &m3);
}

/* Every activation's room, every slot entry (a value and its fp32
 * statistics) and every region is a multiple of 16 bytes, in bf16 and
 * fp32 plans alike, with full recomputation or without: the statistics
 * and int32 ids after bf16 values are aligned, and a GPU kernel that
 * loads 16-byte packs where its buffers allow them finds every buffer
 * allowing them (were the layout to decide, a plan would sum in another
 * order than the same plan laid out otherwise: memplan.c). The loss, one
 * number, takes 16 bytes before its statistics; the params stay dense
 * (bf16: 2 bytes each), the masters are in the optimizer's 12 bytes a
 * param. */
static void rooms_of_16(const built *x, const memplan *m)
{
    for (int s = 0; s < m->pp; s++) {
        const mem_stage *ms = &m->stage[s];
        int64_t regions[] = {ms->params, ms->grads, ms->optim, ms->slot_bytes, ms->pinned, ms->shared,
                             ms->recompute, ms->gathered, ms->comm, ms->layer_stride};
        for (int k = 0; k < (int)(sizeof regions / sizeof regions[0]); k++) ASSERT_INT_EQ(regions[k] % 16, 0);
        for (int id = 0; id < x->pl.n_tensors; id++) {
            const mem_buf *b = memplan_buf(m, s, id);
            if (b->region != MEM_SLOT && b->region != MEM_WORKSPACE && b->region != MEM_RECOMPUTE) continue;
            ASSERT_INT_EQ(b->offset % 16, 0);
            ASSERT_INT_EQ(b->bytes % 16, 0); /* the statistics right after it */
            ASSERT_INT_EQ(b->stride % 16, 0);
        }
    }
    ASSERT_INT_EQ(memplan_buf(m, m->pp - 1, x->pl.loss)->bytes, 16);
}

TEST_IMPL(memplan_every_room_aligns_to_16_bytes)
{
    static const char *const bf16[] = {"train.precision=bf16", "mesh.pp=2", "train.micro_batch=1"},
                             *const fp32[] = {"train.precision=fp32", "mesh.pp=2", "train.micro_batch=1"},
                             *const fp32r[] = {"train.precision=fp32", "train.recompute=full", "train.micro_batch=1"};
    built xb, xf, xr;
    memplan mb, mf, mr;
    build(bf16, 3, &xb, &mb);
    build(fp32, 3, &xf, &mf);
    build(fp32r, 3, &xr, &mr);
    ASSERT_INT_EQ(mb.float_bytes, 2);
    rooms_of_16(&xb, &mb);
    rooms_of_16(&xf, &mf);
    rooms_of_16(&xr, &mr);
    ASSERT_INT_GE(mr.stage[0].recompute, 16);
    long long n = (32 * 16 + 2 * (16 + 16 * 64 + 64 * 16)); /* emb, then each layer's g, w1, w2 */
    ASSERT_INT_EQ(mb.stage[0].params + mb.stage[1].params, (n + 32 * 16) * 2); /* emb on both ends (tied) */
    ASSERT_INT_EQ(mb.stage[0].optim % 12, 0);
    ASSERT_INT_EQ(mb.stage[0].optim, mb.stage[0].params / 2 * 12);
    teardown(&xb, &mb);
    teardown(&xf, &mf);
    teardown(&xr, &mr);
}

/* A moe layer's routing room holds every device's layout: the CPU
 * kernels' and (in a CUDA=1 build) the GPU kernels', 256-byte aligned
 * with their extra arrays, for shapes from one token to uneven large ones;
 * the room is a multiple of 256 bytes, so the expert buffers after it stay
 * aligned. */
TEST_IMPL(memplan_moe_route_room_fits_every_device)
{
    static const int shapes[][4] = {{1, 1, 1, 1}, {16, 4, 2, 8}, {33, 7, 3, 15}, {4096, 64, 2, 160}, {0, 8, 1, 1}};
    const kern_vtbl *tables[] = {&kern_cpu_vtbl, &kern_cuda_vtbl};
    int checked = 0;
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int N = shapes[s][0], E = shapes[s][1], K = shapes[s][2], C = shapes[s][3];
        int64_t room = memplan_moe_route_bytes(N, E, K, C);
        ASSERT_INT_EQ(room % 256, 0);
        for (int t = 0; t < 2; t++) {
            if (!tables[t]->moe_route_bytes) continue; /* CUDA=0: the cuda table only opens (to fail) */
            size_t need = tables[t]->moe_route_bytes(N, E, K, C);
            ASSERT_INT_LT(0, (long)need);
            ASSERT_INT_LT((long)need - 1, (long)room);
            checked++;
        }
    }
    ASSERT_INT_LT(4, checked);
}
