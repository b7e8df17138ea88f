/*
 * test_data.c: token shards (runtime/data.c): round trip, every refusal
 * naming the file, and data-parallel slices that add up to the global batch.
 */
#include <stdio.h>  /* defines: fopen, snprintf, remove */
#include <stdlib.h> /* defines: mkdtemp */
#include <string.h> /* defines: strstr */

#include "data.h" /* defines: mesh__shard_* */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

static char dir[64];

static const char *path_of(const char *name) {
    static char buf[128];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mesh-data-XXXXXX");
        if (!mkdtemp(dir)) unit_fail(__FILE__, __LINE__, "mkdtemp failed");
    }
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* Removes the test's files and its folder. */
static void cleanup(void) {
    static const char *const names[] = {"a.bin", "short.bin", "magic.bin", "cut.bin", "v7.bin", "b.bin"};
    for (size_t i = 0; dir[0] && i < sizeof names / sizeof names[0]; i++) remove(path_of(names[i]));
    if (dir[0]) remove(dir);
}

TEST_IMPL(data_shard_roundtrip)
{
    uint16_t tok[1000];
    int32_t ids[22];
    size_t n = mesh__tokenize_bytes("The Devil's Dictionary", 22, ids);
    ASSERT_UINT_EQ(n, 22);
    ASSERT_INT_EQ(ids[0], 'T');
    for (int i = 0; i < 22; i++) tok[i] = (uint16_t)ids[i];
    for (int i = 22; i < 1000; i++) tok[i] = (uint16_t)(i % 256);
    char err[256];
    const char *p = path_of("a.bin");
    ASSERT_INT_EQ(mesh__shard_write(p, tok, 1000, err, sizeof err), 0);
    mesh__shard s;
    ASSERT_INT_EQ(mesh__shard_open(&s, p, 256, err, sizeof err), 0);
    ASSERT_UINT_EQ(s.n, 1000);
    ASSERT_INT_EQ(memcmp(s.tokens, tok, sizeof tok), 0);
    mesh__shard_close(&s);
    /* a vocabulary smaller than the tokens is refused, naming the place */
    ASSERT_INT_EQ(mesh__shard_open(&s, p, 100, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "a.bin: token 104 at position 1 is outside the model's vocabulary of 100"));
    cleanup();
}

static void write_bytes(const char *p, const void *data, size_t n) {
    FILE *f = fopen(p, "wb");
    ASSERT_NOT_NULL(f);
    ASSERT_UINT_EQ(fwrite(data, 1, n, f), n);
    fclose(f);
}

TEST_IMPL(data_shard_refusals)
{
    char err[256];
    mesh__shard s;
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("missing.bin"), 0, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "missing.bin: cannot open"));
    unsigned char h[1024 + 8] = {0};
    write_bytes(path_of("short.bin"), h, 100);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("short.bin"), 0, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "shorter than a shard's 1024-byte header"));
    write_bytes(path_of("magic.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("magic.bin"), 0, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "not a token shard (magic 0"));
    /* magic 20240520 = 0x0134d888, version 1, 10 tokens, but only 4 there */
    h[0] = 0x88; h[1] = 0xd8; h[2] = 0x34; h[3] = 0x01; h[4] = 1; h[8] = 10;
    write_bytes(path_of("cut.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("cut.bin"), 0, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "truncated or corrupted"));
    h[4] = 7;
    write_bytes(path_of("v7.bin"), h, sizeof h);
    ASSERT_INT_EQ(mesh__shard_open(&s, path_of("v7.bin"), 0, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "shard version 7"));
    cleanup();
}

/* The ranks' slices of a step, side by side, are the one-rank batch. */
TEST_IMPL(data_rank_slices_make_the_global_batch)
{
    enum { N = 5000, G = 8, SEQ = 16 };
    static uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)((i * 7 + 3) % 256);
    char err[256];
    const char *p = path_of("b.bin");
    ASSERT_INT_EQ(mesh__shard_write(p, tok, N, err, sizeof err), 0);
    mesh__shard s;
    ASSERT_INT_EQ(mesh__shard_open(&s, p, 256, err, sizeof err), 0);
    static int32_t all_in[G * SEQ], all_tg[G * SEQ], in[G * SEQ], tg[G * SEQ];
    for (long long step = 0; step < 50; step += 7) {
        mesh__batch(&s, step, G, 1, 0, SEQ, all_in, all_tg);
        for (int ranks = 2; ranks <= G; ranks *= 2)
            for (int r = 0; r < ranks; r++) {
                mesh__batch(&s, step, G, ranks, r, SEQ, in, tg);
                int per = G / ranks;
                ASSERT_INT_EQ(memcmp(in, all_in + r * per * SEQ, (size_t)per * SEQ * sizeof *in), 0);
                ASSERT_INT_EQ(memcmp(tg, all_tg + r * per * SEQ, (size_t)per * SEQ * sizeof *tg), 0);
            }
        for (int i = 0; i + 1 < SEQ; i++) ASSERT_INT_EQ(all_tg[i], all_in[i + 1]); /* targets are inputs shifted */
    }
    mesh__shard_close(&s);
    cleanup();
}
