/*
 * test_data.c: token shards and the streams over them (runtime/data.c):
 * shards round trip and every refusal names the file; a stream reads the
 * shards a glob matches in order, window by window, never across a shard's
 * end, and wraps around; data-parallel ranks read disjoint slices that make
 * up the global batch; the cursor seeks, and a checkpoint carries it, so a
 * resumed run sees the losses of an uninterrupted one.
 */
#include <stdio.h>    /* defines: fopen, snprintf, remove */
#include <stdlib.h>   /* defines: mkdtemp */
#include <string.h>   /* defines: strstr */
#include <sys/stat.h> /* defines: mkdir, stat */
#include <unistd.h>   /* defines: rmdir */

#include "data.h" /* defines: mesh__shard_* */
#include "fixture.h" /* defines: fixture_plan */
#include "mesh.h" /* defines: mesh_data_*, mesh_compile */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

static char dir[64];

static const char *path_of(const char *name) {
    static char buf[160];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mesh-data-XXXXXX");
        if (!mkdtemp(dir)) unit_fail(__FILE__, __LINE__, "mkdtemp failed");
    }
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* Removes the test's files and its folder. */
static void cleanup(void) {
    static const char *const names[] = {
        "a.bin", "short.bin", "magic.bin", "cut.bin", "v7.bin", "b.bin", "s_0.bin", "s_1.bin", "s_2.bin",
        "s_3.bin", "other.bin", "big.bin", "few.bin", "ck/step-00000003/model.safetensors",
        "ck/step-00000003/optim.safetensors", "ck/step-00000003", "ck/latest", "ck"};
    for (size_t i = 0; dir[0] && i < sizeof names / sizeof names[0]; i++) remove(path_of(names[i]));
    if (dir[0]) remove(dir);
    dir[0] = '\0';
}

static void write_bytes(const char *p, const void *data, size_t n) {
    FILE *f = fopen(p, "wb");
    ASSERT_NOT_NULL(f);
    ASSERT_UINT_EQ(fwrite(data, 1, n, f), n);
    fclose(f);
}

TEST_IMPL(data_shard_roundtrip)
{
    int ids[1000];
    mesh_tokenizer *bytes = NULL;
    size_t n = 0;
    int vocab = 0, eot = 0;
    ASSERT_INT_EQ(mesh_tokenizer_load(NULL, &bytes), MESH_OK);
    ASSERT_INT_EQ(mesh_tokenizer_info(bytes, &vocab, &eot), MESH_OK);
    ASSERT_INT_EQ(vocab * 10 + eot, 2560 - 1);
    ASSERT_INT_EQ(mesh_tokenizer_encode(bytes, "The Devil's Dictionary", 22, ids, 5, &n), MESH_ERR_INVALID_ARG);
    ASSERT_UINT_EQ(n, 22); /* what it would need */
    ASSERT_INT_EQ(mesh_tokenizer_encode(bytes, "The Devil's Dictionary", 22, ids, 22, &n), MESH_OK);
    ASSERT_UINT_EQ(n, 22);
    ASSERT_INT_EQ(ids[0], 'T');
    char text[8];
    size_t len = 0;
    ASSERT_INT_EQ(mesh_tokenizer_decode(bytes, ids, 22, text, sizeof text, &len), MESH_OK);
    ASSERT_UINT_EQ(len, 22);
    ASSERT_INT_EQ(memcmp(text, "The Devi", 8), 0);
    mesh_tokenizer_free(bytes);
    mesh_tokenizer_free(NULL);
    for (int i = 22; i < 1000; i++) ids[i] = i % 256;
    char err[256];
    const char *p = path_of("a.bin");
    ASSERT_INT_EQ(mesh_shard_write(p, ids, 1000), MESH_OK);
    mesh__shard s;
    ASSERT_INT_EQ(mesh__shard_open(&s, p, 256, err, sizeof err), MESH_OK);
    ASSERT_UINT_EQ(s.n, 1000);
    for (int i = 0; i < 1000; i++) ASSERT_INT_EQ(s.tokens[i], ids[i]);
    mesh__shard_close(&s);
    /* a vocabulary smaller than the tokens is refused, naming the place */
    ASSERT_INT_EQ(mesh__shard_open(&s, p, 100, err, sizeof err), MESH_ERR_CHECK);
    ASSERT_NOT_NULL(strstr(err, "a.bin: token 104 at position 1 is outside the model's vocabulary of 100"));
    /* ids that do not fit uint16 are refused before anything is written */
    ids[7] = 70000;
    ASSERT_INT_EQ(mesh_shard_write(path_of("b.bin"), ids, 10), MESH_ERR_INVALID_ARG);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "b.bin: token 70000 at position 7 does not fit"));
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("b.bin"), 0, err, sizeof err), MESH_ERR_IO);
    cleanup();
}

TEST_IMPL(data_shard_refusals)
{
    char err[256];
    mesh__shard s;
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("missing.bin"), 0, err, sizeof err), MESH_ERR_IO);
    ASSERT_NOT_NULL(strstr(err, "missing.bin: cannot open"));
    unsigned char h[1024 + 8] = {0};
    write_bytes(path_of("short.bin"), h, 100);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("short.bin"), 0, err, sizeof err), MESH_ERR_PARSE);
    ASSERT_NOT_NULL(strstr(err, "shorter than a shard's 1024-byte header"));
    write_bytes(path_of("magic.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("magic.bin"), 0, err, sizeof err), MESH_ERR_PARSE);
    ASSERT_NOT_NULL(strstr(err, "not a token shard (magic 0"));
    /* magic 20240520 = 0x0134d888, version 1, 10 tokens, but only 4 there */
    h[0] = 0x88; h[1] = 0xd8; h[2] = 0x34; h[3] = 0x01; h[4] = 1; h[8] = 10;
    write_bytes(path_of("cut.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("cut.bin"), 0, err, sizeof err), MESH_ERR_PARSE);
    ASSERT_NOT_NULL(strstr(err, "truncated or corrupted"));
    h[4] = 7;
    write_bytes(path_of("v7.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("v7.bin"), 0, err, sizeof err), MESH_ERR_PARSE);
    ASSERT_NOT_NULL(strstr(err, "shard version 7"));
    cleanup();
}

/* Shard s's token i. */
static int token(int s, int i) { return (s * 11 + i * 5 + 1) % 32; }

/* Shards s_0 .. s_3 of 21, 10, 3 and 13 tokens: 5, 2, 0 and 3 windows of 4
 * (the one of 3 tokens has none), and other.bin, which the glob skips. */
static const int shard_len[4] = {21, 10, 3, 13};

static void write_shards(void) {
    int ids[32];
    for (int s = 0; s < 4; s++) {
        char name[32];
        snprintf(name, sizeof name, "s_%d.bin", s);
        for (int i = 0; i < shard_len[s]; i++) ids[i] = token(s, i);
        ASSERT_INT_EQ(mesh_shard_write(path_of(name), ids, (size_t)shard_len[s]), MESH_OK);
    }
    ASSERT_INT_EQ(mesh_shard_write(path_of("other.bin"), ids, 5), MESH_OK);
}

/* Asserts that sequence in/tg is window w of the four shards. */
static void expect_window(const int *in, const int *tg, int w) {
    int s = 0;
    while (w >= (shard_len[s] - 1) / 4) w -= (shard_len[s++] - 1) / 4;
    for (int t = 0; t < 4; t++) {
        ASSERT_INT_EQ(in[t], token(s, 4 * w + t));
        ASSERT_INT_EQ(tg[t], token(s, 4 * w + t + 1));
    }
}

/* Every shard the glob matches, in order, one window after another (none
 * across a shard's end), wrapping around; tell and seek. */
TEST_IMPL(data_stream_reads_shards_in_order)
{
    write_shards();
    char pattern[160];
    snprintf(pattern, sizeof pattern, "%s", path_of("s_*.bin"));
    mesh_plan *mp = fixture_plan(NULL, 0);
    mesh_data *d = NULL;
    ASSERT_INT_EQ(mesh_data_open(mp, pattern, 0, &d), MESH_OK);
    int shards = 0;
    uint64_t tokens = 0, seqs = 0, pos = 1;
    ASSERT_INT_EQ(mesh_data_info(d, &shards, &tokens, &seqs), MESH_OK);
    ASSERT_INT_EQ(shards, 4);
    ASSERT_UINT_EQ(tokens, 21 + 10 + 3 + 13);
    ASSERT_UINT_EQ(seqs, 5 + 2 + 0 + 3);
    const char *name = NULL;
    ASSERT_INT_EQ(mesh_data_shard(d, 2, &name, &tokens), MESH_OK);
    ASSERT_NOT_NULL(strstr(name, "/s_2.bin"));
    ASSERT_UINT_EQ(tokens, 3);
    ASSERT_INT_EQ(mesh_data_shard(d, 4, &name, &tokens), MESH_ERR_INVALID_ARG);
    ASSERT_INT_EQ(mesh_data_tell(d, &pos), MESH_OK);
    ASSERT_UINT_EQ(pos, 0);
    /* a step is 2 micro-batches of 2 sequences: 4 windows; 5 steps are two
     * passes over the 10 windows */
    int in[16], tg[16];
    for (int step = 0; step < 5; step++) {
        ASSERT_INT_EQ(mesh_data_next(d, in, tg), MESH_OK);
        for (int g = 0; g < 4; g++) expect_window(in + 4 * g, tg + 4 * g, (4 * step + g) % 10);
    }
    ASSERT_INT_EQ(mesh_data_tell(d, &pos), MESH_OK);
    ASSERT_UINT_EQ(pos, 20);
    /* seeking repeats what was read there, across the end */
    ASSERT_INT_EQ(mesh_data_seek(d, 7), MESH_OK);
    ASSERT_INT_EQ(mesh_data_next(d, in, tg), MESH_OK);
    for (int g = 0; g < 4; g++) expect_window(in + 4 * g, tg + 4 * g, (7 + g) % 10);
    ASSERT_INT_EQ(mesh_data_seek(d, UINT64_MAX - 1), MESH_OK); /* any position is one */
    ASSERT_INT_EQ(mesh_data_next(d, in, tg), MESH_OK);
    expect_window(in, tg, (int)((UINT64_MAX - 1) % 10));
    mesh_data_free(d);
    /* one path is a stream of one shard */
    ASSERT_INT_EQ(mesh_data_open(mp, path_of("s_3.bin"), 0, &d), MESH_OK);
    ASSERT_INT_EQ(mesh_data_info(d, &shards, NULL, &seqs), MESH_OK);
    ASSERT_INT_EQ(shards * 100 + (int)seqs, 103);
    mesh_data_free(d);
    mesh_data_free(NULL);
    mesh_plan_free(mp);
    cleanup();
}

/* Ranks' slices of a step, side by side, are the one-rank batch: with
 * global_batch 8, dp 1 reads 4 micro-batches of 2, dp 2 two per rank, dp 4
 * one per rank. */
TEST_IMPL(data_stream_rank_slices_make_the_global_batch)
{
    write_shards();
    char pattern[160];
    snprintf(pattern, sizeof pattern, "%s", path_of("s_*.bin"));
    const char *one[] = {"train.global_batch=8"};
    mesh_plan *mp1 = fixture_plan(one, 1);
    mesh_data *all = NULL;
    int mb = 0, m = 0, seq = 0;
    ASSERT_INT_EQ(mesh_plan_batch(mp1, &mb, &m, &seq, NULL), MESH_OK);
    ASSERT_INT_EQ(mb * 100 + m * 10 + seq, 2 * 100 + 4 * 10 + 4);
    ASSERT_INT_EQ(mesh_data_open(mp1, pattern, 1, &all), MESH_ERR_INVALID_ARG);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "data-parallel rank 1 is not one of the plan's 1"));
    ASSERT_INT_EQ(mesh_data_open(mp1, pattern, 0, &all), MESH_OK);
    for (int dp = 2; dp <= 4; dp *= 2) {
        char set[32];
        snprintf(set, sizeof set, "mesh.dp=%d", dp);
        const char *sets[] = {"train.global_batch=8", set};
        mesh_plan *mp = fixture_plan(sets, 2);
        mesh_data *rank[4] = {NULL};
        for (int r = 0; r < dp; r++) ASSERT_INT_EQ(mesh_data_open(mp, pattern, r, &rank[r]), MESH_OK);
        ASSERT_INT_EQ(mesh_data_seek(all, 0), MESH_OK);
        for (int step = 0; step < 4; step++) {
            int in[32], tg[32], part_in[32], part_tg[32];
            ASSERT_INT_EQ(mesh_data_next(all, in, tg), MESH_OK);
            int per = 8 / dp * 4; /* ids per rank */
            for (int r = 0; r < dp; r++) {
                ASSERT_INT_EQ(mesh_data_next(rank[r], part_in, part_tg), MESH_OK);
                ASSERT_INT_EQ(memcmp(part_in, in + r * per, (size_t)per * sizeof *in), 0);
                ASSERT_INT_EQ(memcmp(part_tg, tg + r * per, (size_t)per * sizeof *tg), 0);
            }
        }
        uint64_t a = 0, b = 0;
        ASSERT_INT_EQ(mesh_data_tell(all, &a), MESH_OK);
        ASSERT_INT_EQ(mesh_data_tell(rank[dp - 1], &b), MESH_OK);
        ASSERT_UINT_EQ(a, 32);
        ASSERT_UINT_EQ(b, 32); /* every rank's cursor is the global one */
        for (int r = 0; r < dp; r++) mesh_data_free(rank[r]);
        mesh_plan_free(mp);
    }
    mesh_data_free(all);
    mesh_plan_free(mp1);
    cleanup();
}

/* Each bad file, and a pattern that matches none, is refused naming it. */
TEST_IMPL(data_stream_refusals)
{
    mesh_plan *mp = fixture_plan(NULL, 0);
    mesh_data *d = (mesh_data *)1;
    char pattern[160];
    snprintf(pattern, sizeof pattern, "%s", path_of("none_*.bin"));
    ASSERT_INT_EQ(mesh_data_open(mp, pattern, 0, &d), MESH_ERR_IO);
    ASSERT_NULL(d);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "no file matches '"));
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "/none_*.bin'"));
    ASSERT_INT_EQ(mesh_data_open(mp, path_of("missing.bin"), 0, &d), MESH_ERR_IO);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "missing.bin: cannot open: No such file"));
    unsigned char h[1024 + 8] = {0};
    write_bytes(path_of("magic.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh_data_open(mp, path_of("magic.bin"), 0, &d), MESH_ERR_PARSE);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "magic.bin: not a token shard (magic 0, not 20240520)"));
    h[0] = 0x88; h[1] = 0xd8; h[2] = 0x34; h[3] = 0x01; h[4] = 1; h[8] = 10;
    write_bytes(path_of("cut.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh_data_open(mp, path_of("cut.bin"), 0, &d), MESH_ERR_PARSE);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "cut.bin: the header says 10 tokens (1044 bytes), but the file "
                                              "has 1032 bytes: truncated or corrupted"));
    /* one bad shard among good ones: the plan's vocabulary is 32 */
    write_shards();
    int ids[8] = {1, 2, 3, 40, 5, 6, 7, 8};
    ASSERT_INT_EQ(mesh_shard_write(path_of("s_2.bin"), ids, 8), MESH_OK);
    snprintf(pattern, sizeof pattern, "%s", path_of("s_*.bin"));
    ASSERT_INT_EQ(mesh_data_open(mp, pattern, 0, &d), MESH_ERR_CHECK);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "s_2.bin: token 40 at position 3 is outside the model's "
                                              "vocabulary of 32"));
    /* shards too short for one sequence of seq_len + 1 tokens */
    ASSERT_INT_EQ(mesh_shard_write(path_of("few.bin"), ids + 4, 4), MESH_OK);
    ASSERT_INT_EQ(mesh_data_open(mp, path_of("few.bin"), 0, &d), MESH_ERR_CHECK);
    ASSERT_NOT_NULL(strstr(mesh_last_error(), "few.bin: 4 tokens hold no sequence of seq_len + 1 = 5 tokens"));
    ASSERT_INT_EQ(mesh_data_open(mp, path_of("few.bin"), -1, &d), MESH_ERR_INVALID_ARG);
    ASSERT_INT_EQ(mesh_data_open(NULL, pattern, 0, &d), MESH_ERR_INVALID_ARG);
    ASSERT_INT_EQ(mesh_data_next(NULL, ids, ids), MESH_ERR_INVALID_ARG);
    mesh_plan_free(mp);
    cleanup();
}

/* Trains `steps` steps from `data`, writing each loss to losses[]. */
static void train(mesh_context *ctx, mesh_data *data, int steps, double *losses) {
    int in[16], tg[16];
    for (int k = 0; k < steps; k++) {
        mesh_step_stats st;
        ASSERT_INT_EQ(mesh_data_next(data, in, tg), MESH_OK);
        ASSERT_INT_EQ(mesh_train_step(ctx, in, tg, &st), MESH_OK);
        losses[k] = st.loss;
    }
}

/* 6 steps straight, and 3 + a checkpoint + 3 resumed in new objects, give
 * the same losses, bit for bit; the stream starts at sequence 3, so only
 * a saved cursor (not steps x global_batch) can get it right. */
TEST_IMPL(data_checkpoint_resume_same_losses)
{
    write_shards();
    char pattern[160], ck[160];
    snprintf(pattern, sizeof pattern, "%s", path_of("s_*.bin"));
    snprintf(ck, sizeof ck, "%s", path_of("ck"));
    mesh_plan *mp = fixture_plan(NULL, 0);
    mesh_context *ctx = NULL;
    mesh_data *d = NULL;
    double straight[6], resumed[6];
    ASSERT_INT_EQ(mesh_context_create(mp, 0, &ctx), MESH_OK);
    ASSERT_INT_EQ(mesh_data_open(mp, pattern, 0, &d), MESH_OK);
    ASSERT_INT_EQ(mesh_data_seek(d, 3), MESH_OK);
    train(ctx, d, 6, straight);
    mesh_context_free(ctx);
    mesh_data_free(d);

    ASSERT_INT_EQ(mesh_context_create(mp, 0, &ctx), MESH_OK);
    ASSERT_INT_EQ(mesh_data_open(mp, pattern, 0, &d), MESH_OK);
    ASSERT_INT_EQ(mesh_data_seek(d, 3), MESH_OK);
    train(ctx, d, 3, resumed);
    ASSERT_INT_EQ(mesh_checkpoint_save_with(ctx, ck, d), MESH_OK);
    mesh_context_free(ctx);
    mesh_data_free(d);

    long long step = -1;
    uint64_t pos = 0;
    ASSERT_INT_EQ(mesh_context_create(mp, 0, &ctx), MESH_OK);
    ASSERT_INT_EQ(mesh_data_open(mp, pattern, 0, &d), MESH_OK);
    ASSERT_INT_EQ(mesh_checkpoint_load_with(ctx, ck, d), MESH_OK);
    ASSERT_INT_EQ(mesh_context_step(ctx, &step), MESH_OK);
    ASSERT_INT_EQ(step, 3);
    ASSERT_INT_EQ(mesh_data_tell(d, &pos), MESH_OK);
    ASSERT_UINT_EQ(pos, 3 + 3 * 4);
    train(ctx, d, 3, resumed + 3);
    for (int k = 0; k < 6; k++)
        if (straight[k] != resumed[k])
            unit_fail(__FILE__, __LINE__, "step %d: loss %.17g straight, %.17g resumed", k + 1, straight[k],
                      resumed[k]);
    /* a checkpoint saved without a stream restores steps x global_batch */
    ASSERT_INT_EQ(mesh_checkpoint_save(ctx, ck), MESH_OK); /* step 6 */
    ASSERT_INT_EQ(mesh_checkpoint_load_with(ctx, ck, d), MESH_OK);
    ASSERT_INT_EQ(mesh_data_tell(d, &pos), MESH_OK);
    ASSERT_UINT_EQ(pos, 6 * 4);
    /* the same step saved again replaces it (swapped in by one rename),
     * leaving no temporary folder */
    ASSERT_INT_EQ(mesh_data_seek(d, 40), MESH_OK);
    ASSERT_INT_EQ(mesh_checkpoint_save_with(ctx, ck, d), MESH_OK);
    ASSERT_INT_EQ(mesh_data_seek(d, 0), MESH_OK);
    ASSERT_INT_EQ(mesh_checkpoint_load_with(ctx, ck, d), MESH_OK);
    ASSERT_INT_EQ(mesh_data_tell(d, &pos), MESH_OK);
    ASSERT_UINT_EQ(pos, 40);
    struct stat left;
    ASSERT_INT_EQ(stat(path_of("ck/.step-00000006.tmp"), &left), -1);
    /* evaluation reads micro-batches from the cursor, as mesh_forward does */
    int in[16], tg[16];
    double loss = 0, a = 0, b = 0;
    ASSERT_INT_EQ(mesh_data_seek(d, 0), MESH_OK);
    ASSERT_INT_EQ(mesh_data_next(d, in, tg), MESH_OK);
    ASSERT_INT_EQ(mesh_forward(ctx, in, tg, &a, NULL, 0), MESH_OK);
    ASSERT_INT_EQ(mesh_forward(ctx, in + 8, tg + 8, &b, NULL, 0), MESH_OK);
    ASSERT_INT_EQ(mesh_data_seek(d, 0), MESH_OK);
    ASSERT_INT_EQ(mesh_evaluate(ctx, d, 2, &loss), MESH_OK);
    ASSERT_INT_EQ(loss == (a + b) / 2, 1);
    ASSERT_INT_EQ(mesh_data_tell(d, &pos), MESH_OK);
    ASSERT_UINT_EQ(pos, 4);
    mesh_context_free(ctx);
    mesh_data_free(d);
    mesh_plan_free(mp);
    remove(path_of("ck/step-00000006/model.safetensors"));
    remove(path_of("ck/step-00000006/optim.safetensors"));
    rmdir(path_of("ck/step-00000006"));
    cleanup();
}
