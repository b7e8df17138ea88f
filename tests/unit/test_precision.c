/*
 * test_precision.c: mixed precision on the CPU reference. The rounding
 * kernels (kernels/cpu/precision.c) against IEEE binary16 and bfloat16,
 * and the executor's bf16 and fp16 training (runtime/exec*.c): values kept
 * rounded, fp32 masters, fp16's dynamic loss scaling (an overflow skips the
 * step and halves the scale, good steps double it), checkpoints that
 * resume to the bit.
 */
#include <math.h>   /* fabs, ldexp, isnan, isinf, sqrt */
#include <stdint.h> /* uint32_t, uint64_t */
#include <stdio.h>  /* fprintf, snprintf */
#include <stdlib.h> /* free, malloc, mkdtemp, system */
#include <string.h> /* memcpy, strlen */

#include "api_impl.h"   /* mesh_context: its executor */
#include "checkpoint.h" /* mesh__ckpt_save, mesh__ckpt_load */
#include "device.h"     /* dev_cuda_probe */
#include "exec.h"       /* mesh__exec_* */
#include "fixture.h"    /* fixture_tiny_gpt */
#include "kcpu.h"       /* kcpu_bf16_round, kcpu_fp16_round */
#include "memplan.h"    /* memplan_build: the gradient staging; memplan_pos_table */
#include "mesh.h"       /* mesh_compile */
#include "plan.h"       /* plan_read */
#include "unit.h"       /* TEST_IMPL, ASSERT_* */

static float f_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t u_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* The binary16 number with bits h, exactly, as a float. */
static float half_value(unsigned h)
{
    int e = (int)((h >> 10) & 31u), m = (int)(h & 1023u);
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (float)((h & 0x8000u) ? -v : v);
}

#define EXPECT_ROUND(fn, x, want)                                                                    \
    do {                                                                                            \
        float got_ = fn(x), want_ = (want);                                                         \
        if (u_of(got_) != u_of(want_))                                                              \
            unit_fail(__FILE__, __LINE__, "%s(%.9g) = %.9g, not %.9g", #fn, (double)(x), (double)got_, \
                      (double)want_);                                                               \
    } while (0)

/* Ties go to even, overflow to infinity, NaN stays NaN; every binary16
 * number rounds to itself, and a random float to a neighbour within half
 * a unit in the last place. */
TEST_IMPL(kcpu_rounds_to_bf16_and_fp16)
{
    EXPECT_ROUND(kcpu_bf16_round, 1.0f, 1.0f);
    EXPECT_ROUND(kcpu_bf16_round, 1.0f + 0x1p-8f, 1.0f);                   /* a tie: to even */
    EXPECT_ROUND(kcpu_bf16_round, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f);     /* a tie: up to even */
    EXPECT_ROUND(kcpu_bf16_round, 1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f);
    EXPECT_ROUND(kcpu_bf16_round, -3.0f, -3.0f);
    EXPECT_ROUND(kcpu_bf16_round, f_of(0x7f7fffffu), INFINITY);            /* FLT_MAX: past bf16's largest */
    EXPECT_ROUND(kcpu_bf16_round, INFINITY, INFINITY);
    ASSERT_INT_EQ(isnan(kcpu_bf16_round(NAN)) != 0, 1);
    EXPECT_ROUND(kcpu_fp16_round, 1.0f + 0x1p-11f, 1.0f);
    EXPECT_ROUND(kcpu_fp16_round, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-9f);
    EXPECT_ROUND(kcpu_fp16_round, 65504.0f, 65504.0f);
    EXPECT_ROUND(kcpu_fp16_round, 65519.0f, 65504.0f);
    EXPECT_ROUND(kcpu_fp16_round, 65520.0f, INFINITY);                     /* the tie past the largest */
    EXPECT_ROUND(kcpu_fp16_round, -1e6f, -INFINITY);
    EXPECT_ROUND(kcpu_fp16_round, 0x1p-24f, 0x1p-24f);                     /* the least subnormal */
    EXPECT_ROUND(kcpu_fp16_round, 0x1p-25f, 0.0f);                         /* a tie: to even, zero */
    EXPECT_ROUND(kcpu_fp16_round, 3 * 0x1p-25f, 0x1p-23f);
    EXPECT_ROUND(kcpu_fp16_round, 1e-9f, 0.0f);
    ASSERT_INT_EQ(isnan(kcpu_fp16_round(NAN)) != 0, 1);
    for (unsigned h = 0; h < 65536; h++) {
        float v = half_value(h);
        if (isnan(v)) continue;
        if (u_of(kcpu_fp16_round(v)) != u_of(v))
            unit_fail(__FILE__, __LINE__, "binary16 0x%04x (%.9g) does not round to itself", h, (double)v);
        /* 2-byte storage (kcpu_pack16/unpack16, the GPU's layout on the CPU): every
         * number's bits there and back, in fp16 and in bf16 */
        uint16_t bits = (uint16_t)h, again;
        float w;
        kcpu_unpack16(&w, &bits, 1, KCPU_FP16);
        kcpu_pack16(&again, &w, 1, KCPU_FP16);
        if (u_of(w) != u_of(v) || again != bits)
            unit_fail(__FILE__, __LINE__, "fp16 0x%04x: unpacked %.9g, packed back 0x%04x", h, (double)w, again);
        kcpu_unpack16(&w, &bits, 1, KCPU_BF16);
        kcpu_pack16(&again, &w, 1, KCPU_BF16);
        if (!isnan(w) && (u_of(w) != (uint32_t)h << 16 || again != bits))
            unit_fail(__FILE__, __LINE__, "bf16 0x%04x: unpacked %.9g, packed back 0x%04x", h, (double)w, again);
    }
    float big = 70000.0f;
    uint16_t inf16;
    kcpu_pack16(&inf16, &big, 1, KCPU_FP16);
    ASSERT_INT_EQ(inf16, 0x7c00); /* past fp16's largest: infinity, as a GPU's conversion gives */
    uint64_t s = 88172645463325252ull;
    for (int k = 0; k < 200000; k++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float x = (float)ldexp((double)(s >> 11) / 9007199254740992.0 - 0.5, (int)(s % 40) - 30);
        float b = kcpu_bf16_round(x), h = kcpu_fp16_round(x);
        double ub = ldexp(1.0, ilogb(x) - 7), uh = fabs(x) < 0x1p-14 ? 0x1p-24 : ldexp(1.0, ilogb(x) - 10);
        if ((u_of(b) & 0xffffu) || fabs((double)b - x) > ub / 2 || fabs((double)h - x) > uh / 2 ||
            u_of(kcpu_fp16_round(h)) != u_of(h))
            unit_fail(__FILE__, __LINE__, "%.9g: bf16 %.9g, fp16 %.9g", (double)x, (double)b, (double)h);
    }
}

#define gpt_src fixture_tiny_gpt /* two layers, a tied head */


static void compile_with(plan *p, const char *const *sets, int n_sets) { fixture_compile(p, gpt_src, sets, n_sets); }

static mesh__exec *exec_of(const plan *p)
{
    char err[256];
    mesh__exec *ex = mesh__exec_create(p, NULL, NULL, err, sizeof err);
    if (!ex) unit_fail(__FILE__, __LINE__, "%s", err);
    return ex;
}

/* The step's two micro-batches of a repeating pattern (test_exec.c's). */
static void step_batch(int32_t *in, int32_t *tg, int step)
{
    for (int h = 0; h < 2; h++)
        for (size_t k = 0; k < 16; k++) {
            in[h * 16 + k] = (int32_t)((k * 3 + (size_t)(step + 5 * h)) % 16);
            tg[h * 16 + k] = (int32_t)((k * 3 + 3 + (size_t)(step + 5 * h)) % 16);
        }
}

/* Steps [from, to] on ex: losses (and stats) into out[step - 1]. */
static void train(mesh__exec *ex, int from, int to, mesh__step_stats *out)
{
    int32_t in[32], tg[32];
    for (int step = from; step <= to; step++) {
        step_batch(in, tg, step);
        mesh__step_stats st;
        if (mesh__exec_train_step(ex, step, in, tg, &st) != 0)
            unit_fail(__FILE__, __LINE__, "step %d failed: %s", step, mesh__exec_error(ex));
        out[step - 1] = st;
    }
}

/* Elements of every param copy of ex, and whether all are in precision
 * p's numbers. */
static int values_in(mesh__exec *ex, float (*round)(float), size_t *total)
{
    const char *name;
    size_t n;
    float *w, *g;
    int all = 1;
    *total = 0;
    for (int k = 0; mesh__exec_param(ex, k, &name, &n, &w, &g) == 0; k++, *total += n)
        for (size_t e = 0; e < n; e++) all &= u_of(round(w[e])) == u_of(w[e]);
    return all;
}

/* Mixed precision keeps fp32 main gradients (memplan.h): an op's kernel
 * adds its contribution to a param's gradient in fp32 (a matmul's weight,
 * an embedding's table, a norm's weight and bias, a bias; others, moe's
 * experts, stage it in the plan's precision and add that), over the ops
 * that use it (the tied embedding's two) and the micro-batches, and sums
 * it in fp32 over the data-parallel ranks. In bf16 and fp16 the plan's
 * gradients take 4 bytes a param element (2 its values); after a step of
 * two micro-batches on 2-byte storage (a GPU's layout, MESH__EXEC_CPU16),
 * without clipping, most gradient elements are not numbers of the plan's
 * precision, and they are the bits of the CPU's run in fp32 words. With one
 * micro-batch, every norm's and bias's gradient (one op's contribution
 * each) has elements off the grid: none was stored in 2 bytes first. */
TEST_IMPL(precision_gradients_accumulate_in_fp32)
{
    /* (no clipping: its scale alone would take the gradients off the grid) */
#define NO_CLIP "train.optimizer=adamw(lr: 3e-2, weight_decay: 0.0, clip: 0)"
    static const char *const sets[4][3] = {{"train.precision=bf16", NO_CLIP, "train.micro_batch=2"},
                                           {"train.precision=fp16", NO_CLIP, "train.micro_batch=2"},
                                           {"train.precision=bf16", NO_CLIP, "train.micro_batch=4"},
                                           {"train.precision=fp16", NO_CLIP, "train.micro_batch=4"}};
#undef NO_CLIP
    float (*rounds[2])(float) = {kcpu_bf16_round, kcpu_fp16_round};
    for (int v = 0; v < 4; v++) {
        plan p;
        compile_with(&p, sets[v], 3);
        ASSERT_INT_EQ(p.setup.clip == 0.0, 1);
        char err[256];
        mesh__exec *half = mesh__exec_create_flags(&p, NULL, NULL, MESH__EXEC_CPU16 | MESH__EXEC_NO_FUSE, err, sizeof err);
        if (!half) unit_fail(__FILE__, __LINE__, "%s", err);
        mesh__exec *words = exec_of(&p);
        mesh__step_stats st[1];
        train(half, 1, 1, st);
        train(words, 1, 1, st);
        const char *name;
        size_t n, total = 0, off = 0;
        float *w, *g, *w2, *g2;
        for (int k = 0; mesh__exec_param(half, k, &name, &n, &w, &g) == 0; k++) {
            ASSERT_INT_EQ(mesh__exec_param(words, k, &name, &n, &w2, &g2), 0);
            size_t o = 0;
            for (size_t e = 0; e < n; e++) o += u_of(rounds[v % 2](g[e])) != u_of(g[e]);
            if (memcmp(g, g2, n * sizeof *g) != 0)
                unit_fail(__FILE__, __LINE__, "%s: %s's gradient in 2-byte storage is not the fp32 words' run's",
                          sets[v][0], name);
            /* (wpe: its add sums the batch in fp32 into its gradient, memplan_pos_table) */
            if (v >= 2 && (strstr(name, "ln") || strstr(name, "b_") || !strcmp(name, "wpe")) && o == 0)
                unit_fail(__FILE__, __LINE__, "%s, one micro-batch: %s's gradient is all %s numbers", sets[v][0],
                          name, sets[v][0] + 16);
            off += o;
            total += n;
        }
        fprintf(stderr, "# %s, %s: %zu of %zu gradient elements are not %s numbers\n", sets[v][0], sets[v][2], off,
                total, sets[v][0] + 16);
        if (!(2 * off > total)) unit_fail(__FILE__, __LINE__, "%zu of %zu off the 2-byte grid", off, total);
        /* the position embedding, embed(arange(seq), wpe), is the one whose gradient goes to its table's */
        int pos = 0;
        for (int id = 0; id < p.n_tensors; id++) {
            int table = memplan_pos_table(&p, id);
            if (table < 0) continue;
            pos++;
            ASSERT_STR_EQ(p.tensors[table].name, "wpe");
            memplan mp; /* no gradient buffer of its own */
            ASSERT_INT_EQ(memplan_build(&mp, &p, 0, 0), 0);
            ASSERT_INT_EQ(memplan_buf(&mp, 0, id)->grad_region, MEM_NONE);
            memplan_free(&mp);
            for (int c = id + 1; c < p.n_tensors; c++) /* its add's backward writes the table's fp32 gradient */
                for (int k = 0; k < p.tensors[c].n_in; k++)
                    if (p.tensors[c].in[k] == id)
                        ASSERT_INT_EQ(memplan_grad_param(&p, c, k) == table && memplan_grad_fp32(&p, c, k), 1);
        }
        ASSERT_INT_EQ(pos, 1);
        /* the plan's gradients: 4 bytes an element, the values 2 (each region rounded to 16 bytes) */
        ASSERT_INT_EQ((long long)p.memory[0].grads, (long long)((total * 4 + 15) / 16 * 16));
        ASSERT_INT_EQ((long long)p.memory[0].params, (long long)((total * 2 + 15) / 16 * 16));
        mesh__exec_free(half);
        mesh__exec_free(words);
        plan_free(&p);
    }
}

/* One training step of one fp16 micro-batch of 4 sequences of 4 tokens
 * on each rank: wpe's gradient after it (scaled by the loss scale; AdamW
 * reads it and leaves it) into got[rank]. */
typedef struct sp_run {
    float *got[2];
    size_t n;
} sp_run;

static const char *const sp_sets[] = {"train.precision=fp16", "train.micro_batch=4", "train.global_batch=4",
                                      "train.seq_len=4", "train.optimizer=adamw(lr: 3e-2, clip: 0)",
                                      "mesh.tp=2", "train.sequence_parallel=true"};
/* (all of them: tp 2 with sequence parallelism; but the last two: one rank) */
#define SP_SETS ((int)(sizeof sp_sets / sizeof *sp_sets))
#define SP_SETS_ONE_RANK (SP_SETS - 2)

static void sp_batch(int32_t *in, int32_t *tg)
{
    for (int k = 0; k < 16; k++) in[k] = (k * 5 + 3) % 16, tg[k] = (k * 7 + 1) % 16;
}

static int wpe_grad(mesh__exec *ex, float *out, size_t *n_out)
{
    const char *name;
    size_t n;
    float *w, *g;
    for (int k = 0; mesh__exec_param(ex, k, &name, &n, &w, &g) == 0; k++)
        if (strcmp(name, "wpe") == 0) {
            if (out) memcpy(out, g, n * sizeof *g);
            *n_out = n;
            return 0;
        }
    return -1;
}

static mesh_status sp_rank(mesh_context *ctx, int rank, void *ud)
{
    sp_run *r = ud;
    int32_t in[16], tg[16];
    sp_batch(in, tg);
    mesh_step_stats st;
    mesh_status s = mesh_train_step(ctx, in, tg, &st);
    if (s != MESH_OK) return s;
    size_t n;
    return st.skipped || wpe_grad(ctx->ex, r->got[rank], &n) != 0 || n != r->n ? MESH_ERR_INTERNAL : MESH_OK;
}

/* With sequence parallelism the position embedding is sliced over tp (a
 * rank's rows of the sequence, to meet the sequence-split add); in bf16
 * and fp16 each rank still sums its rows over the batch in fp32 straight
 * into wpe's gradient, and the slice's dual, an all-gather, gathers every
 * rank's rows there (memplan_pos_sliced), as one rank's whole sum would.
 * After one fp16 micro-batch (context 8, seq 4: 2 rows a rank) wpe's
 * gradient is the same bits on both tp ranks, not all fp16 numbers (the
 * embedding's stored fp16 gradient gathered would be), zero past the
 * sequence, and within 1e-2 of one rank's (tp rounds its partial sums
 * elsewhere); the plan keeps no gradient buffer for the embedding and
 * room for the fp32 rows in its communication buffer. */
TEST_IMPL(precision_sp_position_embedding_sums_in_fp32)
{
    plan p;
    compile_with(&p, sp_sets, SP_SETS);
    int pos = -1;
    for (int id = 0; id < p.n_tensors; id++)
        if (memplan_pos_table(&p, id) >= 0) {
            ASSERT_INT_EQ(pos, -1);
            pos = id;
        }
    ASSERT_INT_EQ(pos >= 0 && memplan_pos_sliced(&p, pos), 1);
    memplan mp;
    ASSERT_INT_EQ(memplan_build(&mp, &p, 0, 0), 0);
    ASSERT_INT_EQ(memplan_buf(&mp, 0, pos)->grad_region, MEM_NONE);
    ASSERT_INT_EQ(mp.stage[0].comm >= 4 * 8 * 4, 1); /* T x C fp32 */
    memplan_free(&mp);
    plan_free(&p);

    /* one rank, the reference */
    plan one;
    compile_with(&one, sp_sets, SP_SETS_ONE_RANK);
    mesh__exec *ex = exec_of(&one);
    int32_t in[16], tg[16];
    sp_batch(in, tg);
    mesh__step_stats st;
    if (mesh__exec_train_step(ex, 1, in, tg, &st) != 0) unit_fail(__FILE__, __LINE__, "%s", mesh__exec_error(ex));
    ASSERT_INT_EQ(st.skipped, 0);
    size_t n = 0;
    ASSERT_INT_EQ(wpe_grad(ex, NULL, &n), 0);
    ASSERT_UINT_EQ(n, 8 * 8);
    float *ref = malloc(n * sizeof *ref), *got0 = malloc(n * sizeof *got0), *got1 = malloc(n * sizeof *got1);
    ASSERT_INT_EQ(ref && got0 && got1, 1);
    ASSERT_INT_EQ(wpe_grad(ex, ref, &n), 0);
    mesh__exec_free(ex);
    plan_free(&one);

    /* tp 2, sequence parallel */
    mesh_plan *mpl = fixture_mesh_plan(gpt_src, sp_sets, SP_SETS);
    sp_run r = {{got0, got1}, n};
    if (mesh_run_ranks(mpl, sp_rank, &r) != MESH_OK) unit_fail(__FILE__, __LINE__, "%s", mesh_last_error());
    mesh_plan_free(mpl);

    ASSERT_INT_EQ(memcmp(got0, got1, n * sizeof *got0), 0);
    double d2 = 0, r2 = 0;
    size_t off = 0;
    for (size_t e = 0; e < n; e++) {
        if (e >= 4 * 8) ASSERT_INT_EQ(got0[e] == 0 && ref[e] == 0, 1); /* rows past seq_len */
        off += u_of(kcpu_fp16_round(got0[e])) != u_of(got0[e]);
        d2 += ((double)got0[e] - ref[e]) * ((double)got0[e] - ref[e]);
        r2 += (double)ref[e] * ref[e];
    }
    fprintf(stderr, "# wpe's gradient: %zu of %d elements off the fp16 grid, %.2e from one rank's\n", off, 4 * 8,
            sqrt(d2 / r2));
    ASSERT_INT_EQ(off > 0 && r2 > 0 && sqrt(d2 / r2) < 1e-2, 1);
    for (int half = 0; half < 2; half++) { /* both ranks' rows there */
        double h2 = 0;
        for (size_t e = (size_t)half * 16; e < (size_t)half * 16 + 16; e++) h2 += (double)got0[e] * got0[e];
        ASSERT_INT_EQ(h2 > 0, 1);
    }
    free(ref);
    free(got0);
    free(got1);
}

/* bf16 and fp16 train the tiny GPT as fp32 does: the loss falls below 1
 * (from ln 16), each step's loss within 0.02 + 3% of fp32's (bf16 strays
 * by 1.2% at most over the first 30 steps, 5.5% at a loss of 0.2; fp16 by
 * 0.4%). The weights the ops
 * read are bf16 (fp16) numbers, the fp32 masters (what mesh_param_get and
 * checkpoints give) are not; the arena is fp32's layout plus the masters
 * (no staging of an op's contribution to the fp32 gradients: every op
 * here adds its own in fp32). */
TEST_IMPL(precision_bf16_fp16_train_as_fp32)
{
    static const char *const sets[3][1] = {{"train.precision=fp32"}, {"train.precision=bf16"},
                                           {"train.precision=fp16"}};
    float (*rounds[3])(float) = {NULL, kcpu_bf16_round, kcpu_fp16_round};
    mesh__step_stats ref[40], got[40];
    size_t fp32_bytes = 0;
    for (int v = 0; v < 3; v++) {
        plan p;
        compile_with(&p, sets[v], 1);
        mesh__exec *ex = exec_of(&p);
        train(ex, 1, 40, v == 0 ? ref : got);
        if (v == 0) {
            fp32_bytes = mesh__exec_bytes(ex);
            for (int id = 0; id < p.n_tensors; id++) /* (fp32: every gradient is fp32 already) */
                ASSERT_INT_EQ(memplan_pos_table(&p, id), -1);
        } else {
            size_t total;
            ASSERT_INT_EQ(values_in(ex, rounds[v], &total), 1);
            /* + the masters; no staging of an op's contribution to the fp32 gradients: every
             * op with params here adds to them in fp32 itself (memplan_grad_fp32) */
            memplan mp;
            ASSERT_INT_EQ(memplan_build(&mp, &p, 4, MEMPLAN_MASTERS), 0);
            size_t staging = (size_t)mp.stage[0].gstage;
            memplan_free(&mp);
            ASSERT_INT_EQ((long long)staging, 0);
            ASSERT_UINT_EQ(mesh__exec_bytes(ex), fp32_bytes + total * sizeof(float) + staging);
            ASSERT_INT_LT((long long)p.memory[0].total, (long long)fp32_bytes);        /* the plan: 2-byte values */
            /* the masters: the whole first param, not all of it representable */
            size_t n0 = mesh__exec_param_numel(ex, 0), off = 0;
            float *whole = malloc(n0 * sizeof *whole);
            ASSERT_INT_EQ(mesh__exec_param_get(ex, 0, whole), 0);
            for (size_t e = 0; e < n0; e++) off += u_of(rounds[v](whole[e])) != u_of(whole[e]);
            free(whole);
            ASSERT_INT_GE((long long)off, (long long)n0 / 2);
            for (int k = 0; k < 40; k++) {
                ASSERT_INT_EQ(got[k].skipped, 0);
                if (fabs(got[k].loss - ref[k].loss) <= 0.02 + 0.03 * ref[k].loss) continue;
                fprintf(stderr, "# %s, step %d: loss %.6f, fp32 %.6f\n", sets[v][0], k + 1, got[k].loss, ref[k].loss);
                unit_fail(__FILE__, __LINE__, "mixed precision strays from fp32");
            }
            /* the norm reported is of the unscaled gradient */
            ASSERT_INT_EQ(fabs(got[0].norm - ref[0].norm) <= 0.02 * ref[0].norm, 1);
            ASSERT_INT_EQ(got[0].loss_scale == (v == 2 ? 65536.0 : 1.0), 1);
        }
        if (!(got[39].loss < 1.0 && ref[39].loss < 1.0))
            unit_fail(__FILE__, __LINE__, "%s: the loss did not fall below 1 (%.4f)", sets[v][0],
                      (v ? got : ref)[39].loss);
        mesh__exec_free(ex);
        plan_free(&p);
    }
}

/* fp16's dynamic loss scale, started at 2^40: the scaled gradients
 * overflow, so steps are skipped (params, masters and AdamW's count
 * unchanged) and the scale halves until they fit; then after every 3 steps
 * without an overflow it doubles. The model still learns. A fixed scale
 * stays as written. */
TEST_IMPL(precision_fp16_loss_scale_skips_and_grows)
{
    static const char *const dyn[] = {"train.precision=fp16"}, *const fixed[] = {"train.precision=fp16",
                                                                                  "train.loss_scale=1024"};
    plan p;
    compile_with(&p, dyn, 1);
    mesh__exec *ex = exec_of(&p);
    mesh__exec_set_scaler(ex, 0x1p40, 3);
    size_t n0 = mesh__exec_param_numel(ex, 0);
    float *before = malloc(2 * n0 * sizeof *before), *after = before + n0;
    ASSERT_INT_EQ(mesh__exec_param_get(ex, 0, before), 0);
    mesh__step_stats st[40];
    train(ex, 1, 1, st);
    ASSERT_INT_EQ(st[0].skipped, 1);
    ASSERT_INT_EQ(st[0].loss_scale == 0x1p40, 1);
    ASSERT_INT_EQ(*mesh__exec_loss_scale(ex) == 0x1p39, 1);
    ASSERT_INT_EQ(*mesh__exec_adam_steps(ex), 0);
    ASSERT_INT_EQ(mesh__exec_param_get(ex, 0, after), 0);
    ASSERT_INT_EQ(memcmp(before, after, n0 * sizeof *before), 0);
    free(before);
    train(ex, 2, 40, st);
    int skips = 0, grown = 0, good = 0;
    long long adam = 0;
    for (int k = 0; k < 40; k++) {
        double next = k < 39 ? st[k + 1].loss_scale : *mesh__exec_loss_scale(ex);
        if (st[k].skipped) {
            skips++;
            good = 0;
            ASSERT_INT_EQ(next == st[k].loss_scale / 2, 1);
        } else if (++good == 3) {
            grown++;
            good = 0;
            adam++;
            ASSERT_INT_EQ(next == st[k].loss_scale * 2, 1);
        } else {
            adam++;
            ASSERT_INT_EQ(next == st[k].loss_scale, 1);
        }
    }
    ASSERT_INT_GE(skips, 10); /* from 2^40 down to where fp16 holds the gradients */
    ASSERT_INT_GE(grown, 1);
    ASSERT_INT_EQ(*mesh__exec_adam_steps(ex), adam);
    if (!(st[39].loss < st[0].loss - 1.2))
        unit_fail(__FILE__, __LINE__, "the loss stayed at %.4f (%.4f at first)", st[39].loss, st[0].loss);
    mesh__exec_free(ex);
    plan_free(&p);

    compile_with(&p, fixed, 2);
    ASSERT_INT_EQ(p.setup.loss_scale == 1024.0, 1);
    ex = exec_of(&p);
    train(ex, 1, 10, st);
    for (int k = 0; k < 10; k++) ASSERT_INT_EQ(st[k].loss_scale == 1024.0 && !st[k].skipped, 1);
    mesh__exec_free(ex);
    plan_free(&p);
}

/* A bf16 or fp16 run saved after 4 steps and loaded into a new executor
 * continues as the run that went on: the same losses to the bit (the
 * masters are saved, not their rounding; fp16's scale and its count of
 * good steps too). */
TEST_IMPL(precision_checkpoint_resumes_to_the_bit)
{
    static const char *const sets[2][1] = {{"train.precision=bf16"}, {"train.precision=fp16"}};
    for (int v = 0; v < 2; v++) {
        char dir[] = "/tmp/mesh-prec-XXXXXX", err[512], cmd[64];
        if (!mkdtemp(dir)) unit_fail(__FILE__, __LINE__, "mkdtemp failed");
        plan p;
        compile_with(&p, sets[v], 1);
        mesh__exec *a = exec_of(&p), *b = exec_of(&p);
        if (v == 1) { /* a scale that moves: down first, then up after 2 good steps */
            mesh__exec_set_scaler(a, 0x1p30, 2);
            mesh__exec_set_scaler(b, 0x1p30, 2);
        }
        mesh__step_stats sa[10], sb[10];
        train(a, 1, 5, sa);
        if (mesh__ckpt_save(a, dir, 5, NULL, NULL, err, sizeof err) != 0) unit_fail(__FILE__, __LINE__, "%s", err);
        train(a, 6, 10, sa);
        long long step = 0;
        if (mesh__ckpt_load(b, dir, 1, &step, NULL, err, sizeof err) != 0) unit_fail(__FILE__, __LINE__, "%s", err);
        ASSERT_INT_EQ(step, 5);
        train(b, 6, 10, sb);
        for (int k = 5; k < 10; k++)
            if (sa[k].loss != sb[k].loss || sa[k].loss_scale != sb[k].loss_scale)
                unit_fail(__FILE__, __LINE__, "%s, step %d: %.17g (scale %g) resumed, %.17g (scale %g) straight on",
                          sets[v][0], k + 1, sb[k].loss, sb[k].loss_scale, sa[k].loss, sa[k].loss_scale);
        mesh__exec_free(a);
        mesh__exec_free(b);
        plan_free(&p);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) unit_fail(__FILE__, __LINE__, "%s failed", cmd);
    }
}

/* The executor on a GPU (MESH__EXEC_CUDA): the tiny GPT's 20 steps give
 * the CPU executor's losses within 1e-4 relative, fp32 both (the GPU's
 * products sum in another order), within 2e-2 in bf16 and fp16 (the GPU's
 * 2-byte storage against the CPU's rounding, fp16's loss scale and skipped
 * steps alike), and so with activation recompute and on
 * fixture_other_ops; its params read back (mesh_param_get's path) match.
 * It runs on a stream of its own. Without a GPU it prints one SKIP line. */
TEST_IMPL(exec_cuda_trains_as_the_cpu)
{
    char why[320], err[512];
    plan p;
    /* what the GPU executor takes, asked without a GPU: every precision, on
     * one GPU and on several (NCCL between them) */
    static const char *const taken[][2] = {{"train.precision=bf16", "mesh.dp=1"},
                                           {"train.precision=fp16", "mesh.dp=1"},
                                           {"train.precision=fp32", "mesh.dp=2"},
                                           {"train.precision=bf16", "mesh.dp=2"},
                                           {"train.precision=fp16", "mesh.dp=2"}};
    for (int k = 0; k < 5; k++) {
        compile_with(&p, taken[k], 2);
        ASSERT_INT_EQ(mesh__exec_gpu_supported(&p, err, sizeof err), 0);
        plan_free(&p);
    }
    compile_with(&p, NULL, 0);
    ASSERT_INT_EQ(mesh__exec_gpu_supported(&p, err, sizeof err), 0);
    if (!dev_cuda_probe(why, sizeof why, NULL, 0)) {
        printf("SKIP exec cuda: no GPU (%s)\n", why);
        ASSERT_NULL(mesh__exec_create_rank(&p, 0, NULL, NULL, 0, NULL, NULL, MESH__EXEC_CUDA, err, sizeof err));
        if (!strstr(err, "no GPU") && !strstr(err, "without CUDA")) unit_fail(__FILE__, __LINE__, "%s", err);
        plan_free(&p);
        return;
    }
    mesh__exec *cpu = exec_of(&p), *gpu = mesh__exec_create_rank(&p, 0, NULL, NULL, 0, NULL, NULL, MESH__EXEC_CUDA, err,
                                                                   sizeof err);
    if (!gpu) unit_fail(__FILE__, __LINE__, "%s", err);
    /* on a stream of its own (non-blocking), not the legacy default one */
    ASSERT_INT_EQ(mesh__exec_stream(gpu) != NULL && mesh__exec_stream(cpu) == NULL, 1);
    mesh__step_stats a[20], b[20];
    train(cpu, 1, 20, a);
    train(gpu, 1, 20, b);
    for (int k = 0; k < 20; k++)
        if (!(fabs(a[k].loss - b[k].loss) <= 1e-4 * a[k].loss))
            unit_fail(__FILE__, __LINE__, "step %d: %.9f on the GPU, %.9f on the CPU", k + 1, b[k].loss, a[k].loss);
    size_t n0 = mesh__exec_param_numel(cpu, 0);
    float *wa = malloc(2 * n0 * sizeof *wa), *wb = wa + n0;
    ASSERT_INT_EQ(mesh__exec_param_get(cpu, 0, wa), 0);
    ASSERT_INT_EQ(mesh__exec_param_get(gpu, 0, wb), 0);
    for (size_t e = 0; e < n0; e++)
        if (!(fabs(wa[e] - wb[e]) <= 1e-3 * (fabs(wa[e]) + 1e-2)))
            unit_fail(__FILE__, __LINE__, "param 0, element %zu: %.9g on the GPU, %.9g on the CPU", e, wb[e], wa[e]);
    free(wa);
    mesh__exec_free(cpu);
    mesh__exec_free(gpu);
    plan_free(&p);
    /* bf16 and fp16: the GPU stores 2 bytes where the CPU rounds fp32 words,
     * at the same points; the losses agree as such runs on two meshes do */
    /* (fp16 with a fixed scale: whether a step at the dynamic scale's edge
     * overflows may differ between two summation orders; the dynamic scale
     * itself is checked on the CPU, in the GPU's layout) */
    /* and activation recompute (train.recompute=full: each node recomputed
     * on its own, none fused, in the backward), and fixture_other_ops (silu
     * and gelu alone, a broadcast add's terms swapped, a loss of two
     * cross-entropies), in fp32 as closely as above */
    static const struct {
        const char *sets[2];
        double tol;
        int other; /* fixture_other_ops, not the tiny GPT */
    } runs[] = {{{"train.precision=bf16", "train.seed=7"}, 2e-2, 0},
                {{"train.precision=fp16", "train.loss_scale=1024"}, 2e-2, 0},
                {{"train.precision=fp32", "train.recompute=full"}, 1e-4, 0},
                {{"train.precision=bf16", "train.recompute=full"}, 2e-2, 0},
                {{"train.precision=fp32", "train.seed=7"}, 1e-4, 1},
                {{"train.precision=bf16", "train.seed=7"}, 2e-2, 1}};
    for (size_t q = 0; q < sizeof runs / sizeof runs[0]; q++) {
        fixture_compile(&p, runs[q].other ? fixture_other_ops : gpt_src, runs[q].sets, 2);
        cpu = exec_of(&p);
        gpu = mesh__exec_create_rank(&p, 0, NULL, NULL, 0, NULL, NULL, MESH__EXEC_CUDA, err, sizeof err);
        if (!gpu) unit_fail(__FILE__, __LINE__, "%s", err);
        ASSERT_UINT_EQ(mesh__exec_bytes(gpu), (size_t)p.memory[0].total); /* the plan's layout, to the byte */
        train(cpu, 1, 20, a);
        train(gpu, 1, 20, b);
        for (int k = 0; k < 20; k++)
            if (!(fabs(a[k].loss - b[k].loss) <= runs[q].tol * a[k].loss) || a[k].skipped != b[k].skipped)
                unit_fail(__FILE__, __LINE__, "%s%s %s, step %d: %.9f on the GPU, %.9f on the CPU",
                          runs[q].other ? "other_ops, " : "", runs[q].sets[0], runs[q].sets[1], k + 1, b[k].loss,
                          a[k].loss);
        mesh__exec_free(cpu);
        mesh__exec_free(gpu);
        plan_free(&p);
    }
}
