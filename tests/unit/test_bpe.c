/*
 * test_bpe.c: GPT-2's byte-level BPE (runtime/bpe.c) on a tiny vocabulary
 * built here from the format's rules: merge order by rank, every occurrence
 * merged in one pass, the pre-tokenizer's pieces, decoding, and each
 * refusal naming the file and place. The real GPT-2 files are checked
 * against OpenAI's encoder in tests/run.sh (tokenize/gpt2-*).
 */
#include <stdio.h>  /* defines: snprintf */
#include <stdlib.h> /* defines: free */
#include <string.h> /* defines: strlen, strstr, memcmp */

#include "bpe.h"  /* defines: mesh__bpe_* */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

/* The byte-level alphabet, written from its definition: printable bytes
 * are themselves, the 68 others are U+0100.. in byte order. */
static unsigned alpha_cp(int b)
{
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    if (printable) return (unsigned)b;
    unsigned next = 256;
    for (int k = 0; k < b; k++)
        if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174)) next++;
    return next;
}

/* Appends the raw bytes s as alphabet text, UTF-8 (or as \uXXXX escapes). */
static void put_alpha(char *out, size_t *n, const char *s, size_t len, int escape)
{
    for (size_t k = 0; k < len; k++) {
        unsigned cp = alpha_cp((unsigned char)s[k]);
        if (escape) *n += (size_t)sprintf(out + *n, "\\u%04X", cp);
        else if (cp < 0x80 && cp != '"' && cp != '\\') out[(*n)++] = (char)cp;
        else if (cp < 0x80) *n += (size_t)sprintf(out + *n, "\\%c", (char)cp);
        else out[(*n)++] = (char)(0xC0 | cp >> 6), out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* Merges in rank order, as raw bytes "left|right". */
static const char *const merges[] = {"l|l", "h|e", "he|ll", "hell|o", " |w", "o|r", " w|or", "a|a",
                                     "a|1"};
enum { N_MERGES = sizeof merges / sizeof merges[0] };

static char enc[64 * 1024], mer[4096];
static size_t enc_n, mer_n;

/* encoder.json: the 256 bytes (escaped), then each merge's result (UTF-8),
 * then <|endoftext|>; vocab.bpe: the merges. extra is appended to the
 * encoder object before its closing brace. */
static void build(const char *extra)
{
    enc_n = 0;
    enc[enc_n++] = '{';
    int id = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        enc[enc_n++] = '"';
        put_alpha(enc, &enc_n, &c, 1, 1);
        enc_n += (size_t)sprintf(enc + enc_n, "\": %d, ", id++);
    }
    mer_n = (size_t)sprintf(mer, "#version: 0.2\n");
    for (int m = 0; m < N_MERGES; m++) {
        const char *bar = strchr(merges[m], '|');
        char joined[32];
        size_t l = (size_t)(bar - merges[m]), r = strlen(bar + 1);
        memcpy(joined, merges[m], l);
        memcpy(joined + l, bar + 1, r);
        enc[enc_n++] = '"';
        put_alpha(enc, &enc_n, joined, l + r, 0);
        enc_n += (size_t)sprintf(enc + enc_n, "\": %d,\n", id++);
        put_alpha(mer, &mer_n, merges[m], l, 0);
        mer[mer_n++] = ' ';
        put_alpha(mer, &mer_n, bar + 1, r, 0);
        mer[mer_n++] = '\n';
    }
    enc_n += (size_t)sprintf(enc + enc_n, "\"<|endoftext|>\": %d%s}\n", id, extra);
}

static mesh__bpe *load(char *err, size_t n)
{
    return mesh__bpe_load_mem(enc, enc_n, "enc.json", mer, mer_n, "merges.bpe", err, n);
}

/* Encodes s and checks the ids' texts, joined by '|'. */
static void expect_tokens(const mesh__bpe *b, const char *s, const char *want)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    char err[256], got[512], text[64];
    ASSERT_INT_EQ(mesh__bpe_encode(b, s, strlen(s), &ids, &n, &cap, err, sizeof err), 0);
    size_t g = 0;
    for (size_t k = 0; k < n; k++) {
        size_t len = mesh__bpe_decode(b, &ids[k], 1, text, sizeof text);
        if (k) got[g++] = '|';
        memcpy(got + g, text, len);
        g += len;
    }
    got[g] = '\0';
    free(ids);
    ASSERT_STR_EQ(got, want);
}

TEST_IMPL(bpe_merges_by_rank)
{
    char err[256];
    build("");
    mesh__bpe *b = load(err, sizeof err);
    if (!b) unit_fail(__FILE__, __LINE__, err);
    ASSERT_INT_EQ(mesh__bpe_vocab(b), 256 + N_MERGES + 1);
    ASSERT_INT_EQ(mesh__bpe_id(b, "<|endoftext|>", 13), 256 + N_MERGES);
    ASSERT_INT_EQ(mesh__bpe_id(b, " wor", 4), 256 + 6);
    /* "ll" (rank 0) before "he" (rank 1), then "hell", "hello" */
    expect_tokens(b, "hello", "hello");
    /* " w", then "or", then " wor": pairs merge by rank, not left to right */
    expect_tokens(b, "hello world", "hello| wor|l|d");
    /* every occurrence of the best pair merges in one left-to-right pass */
    expect_tokens(b, "aaa", "aa|a");
    expect_tokens(b, "aaaa", "aa|aa");
    /* merges stay inside the pre-tokenizer's pieces: letters and digits
     * are apart, so the token "a1" is not used for "a1" in text */
    ASSERT_INT_EQ(mesh__bpe_id(b, "a1", 2), 256 + 8);
    expect_tokens(b, "a1 aaa", "a|1| |aa|a");
    /* contractions; a run of spaces leaves its last one to the next word */
    expect_tokens(b, "he'll  hello\n42x", "he|'|ll| | |hello|\n|4|2|x");
    mesh__bpe_free(b);
}

TEST_IMPL(bpe_round_trips_unicode)
{
    char err[256];
    build("");
    mesh__bpe *b = load(err, sizeof err);
    if (!b) unit_fail(__FILE__, __LINE__, err);
    const char *s = "Caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 hello\tworld  \n";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    ASSERT_INT_EQ(mesh__bpe_encode(b, s, strlen(s), &ids, &n, &cap, err, sizeof err), 0);
    char back[256];
    size_t len = mesh__bpe_decode(b, ids, n, back, sizeof back);
    ASSERT_UINT_EQ(len, strlen(s));
    ASSERT_INT_EQ(memcmp(back, s, len), 0);
    /* a short buffer gets a prefix and the full length */
    ASSERT_UINT_EQ(mesh__bpe_decode(b, ids, n, back, 3), strlen(s));
    ASSERT_INT_EQ(memcmp(back, "Caf", 3), 0);
    /* text that is not UTF-8 is refused, naming the byte */
    ASSERT_INT_EQ(mesh__bpe_encode(b, "abc\xff", 4, &ids, &n, &cap, err, sizeof err), -1);
    ASSERT_NOT_NULL(strstr(err, "not valid UTF-8 at byte 3"));
    free(ids);
    mesh__bpe_free(b);
}

/* Loads the current enc/mer and expects a refusal containing want. */
static void expect_refusal(const char *want)
{
    char err[256] = "";
    mesh__bpe *b = load(err, sizeof err);
    ASSERT_NULL(b);
    if (!strstr(err, want)) unit_fail(__FILE__, __LINE__, err);
}

/* The good files plus one more merge line, which must be refused. */
static void expect_bad_merge(const char *line, const char *want)
{
    build("");
    memcpy(mer + mer_n, line, strlen(line));
    mer_n += strlen(line);
    expect_refusal(want);
}

TEST_IMPL(bpe_refusals)
{
    build(", \"x\": 900");
    expect_refusal("enc.json: error: ids 120 and 900 are the same token");
    build(", \"zz\": 7");
    expect_refusal("this id is given to two tokens");
    build(", \"zz\" 900");
    expect_refusal("enc.json:10:28: error: expected ':'");
    build(", \"zz\": -1");
    expect_refusal("expected a token id");
    build(", \"\\u0001\": 900");
    expect_refusal("token has a character outside GPT-2's byte alphabet");
    build(", \"zz\": 900,");
    expect_refusal("expected a string");
    build("");
    enc[3] = 'q'; /* "\u0100" -> "\q100": an invalid escape */
    expect_refusal("enc.json:1:3: error: invalid escape");
    build("");
    memcpy(enc + 1, "\"\\u0041\": 0", 11); /* byte 0's token written as 'A' */
    expect_refusal("ids 0 and 65 are the same token");
    expect_bad_merge("q z\n", "merges.bpe:11:1: error: the merged token is not in encoder.json");
    expect_bad_merge("qz z\n", "merges.bpe:11:1: error: this side of the merge is not a token");
    expect_bad_merge("a  a\n", "expected a merge: two tokens separated by one space");
    expect_bad_merge("l l\n", "this merge is listed twice");
    char err[256];
    ASSERT_NULL(mesh__bpe_load("/nonexistent/encoder.json", "x", err, sizeof err));
    ASSERT_NOT_NULL(strstr(err, "cannot open '/nonexistent/encoder.json'"));
}
