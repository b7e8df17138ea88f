/*
 * test_lang.c: unit tests for the front end's parts that golden files do
 * not pin directly: the arena, diagnostic rendering (columns, carets,
 * windows, de-duplication, the error limit), suggestions, and the
 * frontend object driven from memory.
 */
#include <stdint.h> /* defines: uintptr_t */
#include <stdio.h>  /* defines: snprintf */
#include <stdlib.h> /* defines: malloc, free */
#include <string.h> /* defines: strstr, memcpy */

#include "arena.h"    /* defines: arena_* */
#include "diag.h"     /* defines: diag_* */
#include "frontend.h" /* defines: fe_* */
#include "suggest.h"  /* defines: suggest_* */
#include "unit.h"     /* defines: TEST_IMPL, ASSERT_* */

/* Diagnostics captured into one buffer. */
static char captured[8192];
static size_t n_captured;

static void capture(void *ud, diag_level level, const char *text) {
    (void)ud;
    (void)level;
    size_t n = strlen(text);
    if (n_captured + n >= sizeof captured) n = sizeof captured - n_captured - 1;
    memcpy(captured + n_captured, text, n);
    n_captured += n;
    captured[n_captured] = '\0';
}

static diag_sink *sink_with(const char *text) {
    n_captured = 0;
    captured[0] = '\0';
    diag_sink *d = diag_new(capture, NULL);
    size_t n = strlen(text);
    char *copy = malloc(n + 1);
    memcpy(copy, text, n + 1);
    ASSERT_INT_EQ(diag_add_source(d, "t.mesh", NULL, copy, n), 0);
    return d;
}

TEST_IMPL(arena_alloc_zeroed_and_aligned)
{
    arena *a = arena_new();
    ASSERT_NOT_NULL(a);
    for (int i = 1; i < 2000; i += 37) {
        unsigned char *p = arena_alloc(a, (size_t)i);
        ASSERT_UINT_EQ((uintptr_t)p % 16, 0);
        for (int k = 0; k < i; k++) ASSERT_INT_EQ(p[k], 0);
        memset(p, 0xab, (size_t)i);
    }
    char *big = arena_alloc(a, 1 << 20); /* larger than a chunk */
    ASSERT_NOT_NULL(big);
    ASSERT_STR_EQ(arena_printf(a, "%s-%d", "x", 42), "x-42");
    arena_free(a);
    arena_free(NULL);
}

/* Columns count code points; the caret line copies tabs. */
TEST_IMPL(diag_caret_under_utf8_and_tabs)
{
    diag_sink *d = sink_with("a = 1\n\tb = \"\xc3\xa9\" + zz\n");
    loc l = {0, 17, 19}; /* "zz" */
    int line, col;
    diag_line_col(d, l, &line, &col);
    ASSERT_INT_EQ(line, 2);
    ASSERT_INT_EQ(col, 11);
    diag_report(d, DIAG_ERROR, l, "unknown name '%s'", "zz");
    ASSERT_STR_EQ(captured, "t.mesh:2:11: error: unknown name 'zz'\n"
                            "    2 | \tb = \"\xc3\xa9\" + zz\n"
                            "      | \t         ^~\n");
    ASSERT_INT_EQ(diag_errors(d), 1);
    diag_free(d);
}

/* A long line is shown as a window around the column. */
TEST_IMPL(diag_long_line_window)
{
    char text[1200];
    memset(text, 'a', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    diag_sink *d = sink_with(text);
    loc l = {0, 600, 601};
    diag_report(d, DIAG_ERROR, l, "here");
    ASSERT_NOT_NULL(strstr(captured, "t.mesh:1:601: error: here\n"));
    ASSERT_NOT_NULL(strstr(captured, " | ..."));
    const char *caret = strchr(captured, '^');
    const char *nl = caret;
    while (nl > captured && nl[-1] != '\n') nl--;
    /* "      | " + "..." + 80 columns of window before the error */
    ASSERT_INT_EQ(caret - nl, 8 + 3 + 80);
    diag_free(d);
}

/* The same diagnostic twice (a block instantiated twice) prints once, and
 * its notes are dropped with it. */
TEST_IMPL(diag_dedup_with_notes)
{
    diag_sink *d = sink_with("x = 1\n");
    loc l = {0, 0, 1};
    diag_report(d, DIAG_ERROR, l, "bad");
    diag_report(d, DIAG_NOTE, l, "because");
    size_t once = n_captured;
    diag_report(d, DIAG_ERROR, l, "bad");
    diag_report(d, DIAG_NOTE, l, "because");
    ASSERT_UINT_EQ(n_captured, once);
    ASSERT_INT_EQ(diag_errors(d), 1);
    diag_free(d);
}

TEST_IMPL(diag_stops_after_limit)
{
    diag_sink *d = sink_with("x = 1\n");
    for (int i = 0; i < DIAG_MAX_ERRORS + 10; i++) {
        loc l = {0, 0, 1};
        diag_report(d, DIAG_ERROR, l, "error %d", i);
    }
    ASSERT_INT_EQ(diag_errors(d), DIAG_MAX_ERRORS);
    ASSERT_INT_EQ(diag_stopped(d), 1);
    ASSERT_NOT_NULL(strstr(captured, "too many errors"));
    diag_free(d);
}

TEST_IMPL(suggest_close_names_only)
{
    suggest s;
    suggest_init(&s, "hedas");
    suggest_offer(&s, "dim");
    suggest_offer(&s, "heads");
    suggest_offer(&s, "layers");
    ASSERT_STR_EQ(suggest_result(&s), "heads");
    suggest_init(&s, "qqq");
    suggest_offer(&s, "heads");
    ASSERT_NULL(suggest_result(&s));
    suggest_init(&s, "tq");
    suggest_offer(&s, "dp");
    suggest_offer(&s, "tp");
    ASSERT_STR_EQ(suggest_result(&s), "tp");
    suggest_init(&s, "lyaers"); /* a swap counts as one edit */
    suggest_offer(&s, "layers");
    ASSERT_STR_EQ(suggest_result(&s), "layers");
    suggest_init(&s, "ab");
    suggest_offer(&s, "ay");
    suggest_offer(&s, "ax");
    ASSERT_STR_EQ(suggest_result(&s), "ax"); /* equal distance: alphabetical */
}

static const char tiny[] =
    "model m {\n"
    "  input tokens : int[batch, seq]\n"
    "  param wte : [256, 64] @split(tp, 0)\n"
    "  x = embed(tokens, wte)\n"
    "  loss = cross_entropy(x @ transpose(wte), tokens)\n"
    "}\n"
    "mesh { dp = 2 }\n"
    "train { global_batch = 8  seq_len = 16  steps = 10  optimizer = adamw(lr: 1e-3) }\n";

static fe *fe_for(const char *text, const char *set) {
    n_captured = 0;
    captured[0] = '\0';
    fe_options o = {NULL, 0, NULL, capture, NULL};
    fe *f = fe_new(&o);
    ASSERT_NOT_NULL(f);
    if (set) ASSERT_INT_EQ(fe_add_set(f, set), FE_OK);
    ASSERT_INT_EQ(fe_load_buffer(f, "t.mesh", text, strlen(text)), FE_OK);
    return f;
}

static const char *summary_of(fe *f) {
    static char buf[2048];
    FILE *mem = fmemopen(buf, sizeof buf, "w");
    fe_summary(f, mem);
    fclose(mem);
    return buf;
}

TEST_IMPL(frontend_checks_buffer)
{
    fe *f = fe_for(tiny, NULL);
    ASSERT_INT_EQ(fe_check(f), FE_OK);
    const char *s = summary_of(f);
    ASSERT_NOT_NULL(strstr(s, "model m, 16,384 parameters"));
    ASSERT_NOT_NULL(strstr(s, "dp 2 x tp 1 x pp 1 x ep 1 = 2 ranks"));
    ASSERT_NOT_NULL(strstr(s, "1 micro-batch of 4 per data-parallel rank (dp = 2)"));
    fe_free(f);
}

/* --set reaches the mesh, and its checks run: 256 rows over tp = 3 fail. */
TEST_IMPL(frontend_set_is_checked)
{
    fe *f = fe_for(tiny, "mesh.tp=4");
    ASSERT_INT_EQ(fe_check(f), FE_OK);
    ASSERT_NOT_NULL(strstr(summary_of(f), "tp 4"));
    fe_free(f);
    f = fe_for(tiny, "mesh.tp=3");
    ASSERT_INT_EQ(fe_check(f), FE_ERRORS);
    ASSERT_NOT_NULL(strstr(captured, "t.mesh:3:25: error: dimension 0 of 'wte' (256) is not divisible by tp = 3"));
    fe_free(f);
}

/* Independent mistakes are all reported in one run. */
TEST_IMPL(frontend_reports_every_error)
{
    const char *bad =
        "a = 7 / 2\n"
        "b = nosuch + 1\n"
        "c = 9223372036854775807 + 1\n";
    fe *f = fe_for(bad, NULL);
    ASSERT_INT_EQ(fe_check(f), FE_ERRORS);
    ASSERT_INT_EQ(fe_error_count(f), 3);
    ASSERT_NOT_NULL(strstr(captured, "t.mesh:1:5: error: 7 / 2 is not a whole number"));
    ASSERT_NOT_NULL(strstr(captured, "t.mesh:2:5: error: unknown name 'nosuch'"));
    ASSERT_NOT_NULL(strstr(captured, "t.mesh:3:5: error: integer overflow in '+'"));
    fe_free(f);
}

/* A file over the size limit is refused with a diagnostic, not read. */
TEST_IMPL(frontend_refuses_huge_buffer)
{
    size_t n = (size_t)FE_MAX_FILE + 1;
    char *big = malloc(n);
    ASSERT_NOT_NULL(big);
    memset(big, ' ', n);
    fe_options o = {NULL, 0, NULL, capture, NULL};
    fe *f = fe_new(&o);
    n_captured = 0;
    ASSERT_INT_EQ(fe_load_buffer(f, "big.mesh", big, n), FE_ERRORS);
    ASSERT_NOT_NULL(strstr(captured, "too large"));
    fe_free(f);
    free(big);
}
