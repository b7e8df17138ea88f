/*
 * test_sched.c: pipeline schedules (compiler/sched.c) and their SVG
 * timeline (compiler/timeline.c).
 *
 * The bubble tests check the simulated idle share against the closed forms
 * in /work/shared/notes/anchors.md ("Pipeline bubble"): (p-1)/(m+p-1) for
 * GPipe and 1F1B, (p-1)/(v*m+p-1) interleaved. The order tests pin the
 * compute order against Narayanan et al. 2021, fig. 4 (1F1B on top,
 * interleaved with two chunks below, 4 devices, 8 micro-batches), written
 * out by hand from the figure in its 1-based numbering.
 */
#include <math.h>   /* fabs */
#include <stdio.h>  /* snprintf, open_memstream */
#include <stdlib.h> /* free */
#include <string.h> /* strstr, strlen */

#include "sched.h"    /* defines: sched_* */
#include "timeline.h" /* defines: timeline_svg */
#include "unit.h"     /* defines: TEST_IMPL, ASSERT_* */

/* Fails unless |got - want| <= 1e-9 * |want| (exact when want is 0). */
#define ASSERT_REL(got, want, what, ...)                                                      \
    do {                                                                                      \
        double g_ = (got), w_ = (want);                                                       \
        if (!(fabs(g_ - w_) <= 1e-9 * fabs(w_)))                                              \
            unit_fail(__FILE__, __LINE__, what ": got %.12f, want %.12f", __VA_ARGS__, g_, w_); \
    } while (0)

static void build(sched *s, sched_kind kind, int pp, int m, int v) {
    char err[200];
    int rc = sched_build(s, kind, pp, m, v, err, sizeof err);
    if (rc != 0) unit_fail(__FILE__, __LINE__, "sched_build(%d, %d, %d, %d): %s", (int)kind, pp, m, v, err);
}

/* sched_dump into a malloc'ed string. */
static char *dump(const sched *s) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ASSERT_NOT_NULL(f);
    sched_dump(s, f);
    fclose(f);
    return buf;
}

/* The compute units of one stage as fig. 4 labels them: "F1 F2 B1 ...",
 * 1-based micro-batches, a ' after units of the second local chunk. */
static void figure_row(const sched *s, int stage, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < s->stages[stage].n_units; i++) {
        const sched_unit *u = &s->stages[stage].units[i];
        if (u->op != SCHED_FWD && u->op != SCHED_BWD) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%c%d%s", len ? " " : "", u->op == SCHED_FWD ? 'F' : 'B',
                                u->micro + 1, u->chunk >= s->pp ? "'" : "");
        ASSERT_INT_LT(len, n);
    }
}

/* Parameters sched_build must refuse, with what the message must say. */
TEST_IMPL(sched_rejects_bad_parameters)
{
    static const struct {
        sched_kind kind;
        int pp, m, v;
        const char *says;
    } bad[] = {
        {SCHED_KIND_1F1B, 0, 4, 1, "pp, m and v >= 1"},
        {SCHED_KIND_GPIPE, 2, 0, 1, "pp, m and v >= 1"},
        {SCHED_KIND_INTERLEAVED, 2, 4, 0, "pp, m and v >= 1"},
        {SCHED_KIND_1F1B, 2, 4, 2, "v=2 needs the interleaved schedule"},
        {SCHED_KIND_GPIPE, 2, 4, 2, "v=2 needs the interleaved schedule"},
        {SCHED_KIND_1F1B, 4, 3, 1, "at least pp=4 micro-batches (m=3)"},
        {SCHED_KIND_INTERLEAVED, 4, 2, 2, "at least pp=4 micro-batches (m=2)"},
        {SCHED_KIND_INTERLEAVED, 4, 6, 2, "m=6 to be a multiple of pp=4"},
        {(sched_kind)7, 2, 4, 1, "unknown schedule kind 7"},
        {SCHED_KIND_1F1B, 1 << 20, 1 << 20, 1, "too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sched s;
        char err[200] = "";
        ASSERT_INT_EQ(sched_build(&s, bad[i].kind, bad[i].pp, bad[i].m, bad[i].v, err, sizeof err), -1);
        if (!strstr(err, bad[i].says)) unit_fail(__FILE__, __LINE__, "case %zu: \"%s\" lacks \"%s\"", i, err, bad[i].says);
        ASSERT_NULL(s.stages);
        sched_free(&s); /* a refused build leaves a zeroed, freeable struct */
    }
    ASSERT_INT_EQ(sched_build(NULL, SCHED_KIND_1F1B, 2, 2, 1, NULL, 0), -1);
    sched_free(NULL);
    /* GPipe takes fewer micro-batches than stages. */
    sched s;
    build(&s, SCHED_KIND_GPIPE, 4, 2, 1);
    sched_free(&s);
    sched_free(&s); /* twice is harmless */
}

/* The anchors: p=4, m=8: 27.3% (v=1) and 15.8% (v=2); p=8, m=64: 9.9%. */
TEST_IMPL(sched_bubble_anchors)
{
    static const struct {
        sched_kind kind;
        int pp, m, v;
        const char *pct;
    } a[] = {
        {SCHED_KIND_1F1B, 4, 8, 1, "27.3"},
        {SCHED_KIND_GPIPE, 4, 8, 1, "27.3"},
        {SCHED_KIND_INTERLEAVED, 4, 8, 2, "15.8"},
        {SCHED_KIND_1F1B, 8, 64, 1, "9.9"},
        {SCHED_KIND_GPIPE, 8, 64, 1, "9.9"},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        sched s;
        double bubble;
        char pct[16];
        build(&s, a[i].kind, a[i].pp, a[i].m, a[i].v);
        sched_simulate(&s, 1, 2, &bubble);
        snprintf(pct, sizeof pct, "%.1f", 100 * bubble);
        ASSERT_STR_EQ(pct, a[i].pct);
        sched_free(&s);
    }
}

/* Bubble and makespan against the closed forms on a grid of shapes and
 * for several cost ratios: (tf, tb) = (1, 2) and (1, 1) as asked, and
 * (2, 1), (1, 3), (3, 5) to show no ratio is special. */
static void check_formula(sched_kind kind, int pp, int m, int v) {
    static const double cost[][2] = {{1, 2}, {1, 1}, {2, 1}, {1, 3}, {3, 5}};
    sched s;
    build(&s, kind, pp, m, v);
    for (size_t c = 0; c < sizeof cost / sizeof cost[0]; c++) {
        double tf = cost[c][0], tb = cost[c][1], bubble = -1;
        double makespan = sched_simulate(&s, tf, tb, &bubble);
        double units = (double)v * m + pp - 1;
        ASSERT_REL(makespan, units * (tf + tb), "makespan kind %d pp %d m %d v %d tf %g tb %g", (int)kind, pp, m,
                   v, tf, tb);
        ASSERT_REL(bubble, (pp - 1) / units, "bubble kind %d pp %d m %d v %d tf %g tb %g", (int)kind, pp, m, v, tf,
                   tb);
    }
    sched_free(&s);
}

TEST_IMPL(sched_bubble_gpipe_and_1f1b)
{
    static const int ps[] = {1, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++) {
        int p = ps[i], ms[] = {p, 2 * p, 3 * p + 1, 16};
        for (int j = 0; j < 4; j++) {
            check_formula(SCHED_KIND_1F1B, p, ms[j], 1);
            check_formula(SCHED_KIND_GPIPE, p, ms[j], 1);
        }
        check_formula(SCHED_KIND_GPIPE, p, 1, 1); /* GPipe with m < p too */
    }
}

/* Interleaved: m % p == 0 only. The formula holds for tf != tb as well:
 * no (p, m, v) of this grid, nor of p <= 12, m <= 64, v <= 5 tried while
 * writing this, misses it. */
TEST_IMPL(sched_bubble_interleaved)
{
    static const int ps[] = {1, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++) {
        int p = ps[i], ms[] = {p, 2 * p, 16};
        for (int j = 0; j < 3; j++) {
            if (ms[j] % p != 0 || (j == 2 && (ms[j] == p || ms[j] == 2 * p))) continue;
            for (int v = 1; v <= 3; v++) check_formula(SCHED_KIND_INTERLEAVED, p, ms[j], v);
        }
    }
}

/* Each stage runs every (micro, chunk) of its chunks once forward and once
 * backward, the backward after the forward; receives sit right before
 * their consumer and sends right after their producer, with the right
 * peers; the first chunk receives no activations, the last no gradients. */
static void check_structure(sched_kind kind, int pp, int m, int v) {
    sched s;
    build(&s, kind, pp, m, v);
    int n_chunks = pp * v;
    char *fwd_at = calloc((size_t)m * n_chunks, 1), *bwd_at = calloc((size_t)m * n_chunks, 1);
    for (int st = 0; st < pp; st++) {
        const sched_stage *g = &s.stages[st];
        int n_f = 0, n_b = 0;
        for (int i = 0; i < g->n_units; i++) {
            const sched_unit *u = &g->units[i];
            ASSERT_INT_EQ(u->chunk % pp, st);
            ASSERT_INT_GE(u->micro, 0);
            ASSERT_INT_LT(u->micro, m);
            int key = u->micro * n_chunks + u->chunk, c = u->chunk;
            switch (u->op) {
            case SCHED_FWD:
                n_f++;
                ASSERT_INT_EQ(fwd_at[key]++, 0);
                ASSERT_INT_EQ(u->peer, -1);
                break;
            case SCHED_BWD:
                n_b++;
                ASSERT_INT_EQ(fwd_at[key], 1); /* the forward came first, on this stage */
                ASSERT_INT_EQ(bwd_at[key]++, 0);
                break;
            case SCHED_RECV_ACT:
                ASSERT_INT_GE(c, 1);
                ASSERT_INT_EQ(u->peer, (c - 1) % pp);
                ASSERT_INT_LT(i + 1, g->n_units);
                ASSERT_INT_EQ(g->units[i + 1].op, SCHED_FWD);
                ASSERT_INT_EQ(g->units[i + 1].micro, u->micro);
                ASSERT_INT_EQ(g->units[i + 1].chunk, c);
                break;
            case SCHED_SEND_ACT:
                ASSERT_INT_GE(i, 1);
                ASSERT_INT_LT(c, n_chunks - 1);
                ASSERT_INT_EQ(u->peer, (c + 1) % pp);
                ASSERT_INT_EQ(g->units[i - 1].op, SCHED_FWD);
                ASSERT_INT_EQ(g->units[i - 1].micro, u->micro);
                ASSERT_INT_EQ(g->units[i - 1].chunk, c);
                break;
            case SCHED_RECV_GRAD:
                ASSERT_INT_LT(c, n_chunks - 1);
                ASSERT_INT_EQ(u->peer, (c + 1) % pp);
                ASSERT_INT_EQ(g->units[i + 1].op, SCHED_BWD);
                ASSERT_INT_EQ(g->units[i + 1].micro, u->micro);
                ASSERT_INT_EQ(g->units[i + 1].chunk, c);
                break;
            case SCHED_SEND_GRAD:
                ASSERT_INT_GE(i, 1);
                ASSERT_INT_GE(c, 1);
                ASSERT_INT_EQ(u->peer, (c - 1) % pp);
                ASSERT_INT_EQ(g->units[i - 1].op, SCHED_BWD);
                ASSERT_INT_EQ(g->units[i - 1].micro, u->micro);
                ASSERT_INT_EQ(g->units[i - 1].chunk, c);
                break;
            }
            if (u->op != SCHED_FWD && u->op != SCHED_BWD) ASSERT_INT_NE(u->peer, st);
        }
        ASSERT_INT_EQ(n_f, m * v);
        ASSERT_INT_EQ(n_b, m * v);
        /* Every forward and backward but the ends of the model talks to a
         * neighbour when the neighbour is another stage. */
        int want = pp == 1 ? 0 : 2 * m * (2 * v - (st == 0) - (st == pp - 1));
        ASSERT_INT_EQ(g->n_units - n_f - n_b, want);
    }
    /* The first stage's forward of chunk 0 is its first unit, unreceived. */
    ASSERT_INT_EQ(s.stages[0].units[0].op, SCHED_FWD);
    ASSERT_INT_EQ(s.stages[0].units[0].chunk, 0);
    for (int i = 0; i < m * n_chunks; i++) ASSERT_INT_EQ(bwd_at[i], 1);
    free(fwd_at);
    free(bwd_at);
    sched_free(&s);
}

TEST_IMPL(sched_units_and_transfers)
{
    static const int ps[] = {1, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++) {
        int p = ps[i], ms[] = {p, 2 * p, 3 * p + 1, 16};
        for (int j = 0; j < 4; j++) {
            check_structure(SCHED_KIND_GPIPE, p, ms[j], 1);
            check_structure(SCHED_KIND_1F1B, p, ms[j], 1);
            if (ms[j] % p == 0)
                for (int v = 1; v <= 3; v++) check_structure(SCHED_KIND_INTERLEAVED, p, ms[j], v);
        }
    }
}

/* 1F1B: stage i holds min(p - i, m) micro-batches at the peak; GPipe m.
 * Interleaved: the warm-up plus the first steady forward, in (micro,
 * chunk) pairs: min(m*v, (p-i-1)*2 + (v-1)*p + 1). */
TEST_IMPL(sched_peak_inflight)
{
    static const int ps[] = {1, 2, 3, 4, 8};
    for (int i = 0; i < 5; i++) {
        int p = ps[i], ms[] = {p, 2 * p, 3 * p + 1, 16};
        for (int j = 0; j < 4; j++) {
            int m = ms[j];
            sched a, b;
            build(&a, SCHED_KIND_1F1B, p, m, 1);
            build(&b, SCHED_KIND_GPIPE, p, m, 1);
            for (int st = 0; st < p; st++) {
                ASSERT_INT_EQ(sched_peak_inflight(&a, st), p - st < m ? p - st : m);
                ASSERT_INT_EQ(sched_peak_inflight(&b, st), m);
            }
            ASSERT_INT_EQ(sched_peak_inflight(&a, p), -1);
            ASSERT_INT_EQ(sched_peak_inflight(&a, -1), -1);
            sched_free(&a);
            sched_free(&b);
            if (m % p != 0) continue;
            for (int v = 2; v <= 3; v++) {
                build(&a, SCHED_KIND_INTERLEAVED, p, m, v);
                for (int st = 0; st < p; st++) {
                    int want = (p - st - 1) * 2 + (v - 1) * p + 1;
                    ASSERT_INT_EQ(sched_peak_inflight(&a, st), want < m * v ? want : m * v);
                }
                sched_free(&a);
            }
        }
    }
    sched s;
    build(&s, SCHED_KIND_GPIPE, 4, 2, 1); /* m < p */
    ASSERT_INT_EQ(sched_peak_inflight(&s, 0), 2);
    sched_free(&s);
}

/* Narayanan et al. 2021, fig. 4, top: 1F1B, 4 devices, 8 micro-batches. */
TEST_IMPL(sched_1f1b_matches_fig4)
{
    static const char *const row[] = {
        "F1 F2 F3 F4 B1 F5 B2 F6 B3 F7 B4 F8 B5 B6 B7 B8",
        "F1 F2 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 F8 B6 B7 B8",
        "F1 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 F8 B7 B8",
        "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 F8 B8",
    };
    sched s;
    char buf[512];
    build(&s, SCHED_KIND_1F1B, 4, 8, 1);
    for (int st = 0; st < 4; st++) {
        figure_row(&s, st, buf, sizeof buf);
        ASSERT_STR_EQ(buf, row[st]);
    }
    sched_free(&s);
}

/* Fig. 4, bottom: interleaved, 4 devices, 8 micro-batches, 2 chunks per
 * device (' marks the second, the figure's lighter shade). Device 1 warms
 * up with 10 forwards (3*2 + 1*4): both chunks of micro-batches 1-4, then
 * 5 and 6 of chunk 1; device 4 with 4, so its first backward follows the
 * forward of micro-batch 1 through its second chunk, the model's last. */
TEST_IMPL(sched_interleaved_matches_fig4)
{
    static const char *const row[] = {
        "F1 F2 F3 F4 F1' F2' F3' F4' F5 F6 F7 B1' F8 B2' F5' B3' F6' B4' F7' B1 F8' B2 "
        "B3 B4 B5' B6' B7' B8' B5 B6 B7 B8",
        "F1 F2 F3 F4 F1' F2' F3' F4' F5 B1' F6 B2' F7 B3' F8 B4' F5' B1 F6' B2 F7' B3 F8' B4 "
        "B5' B6' B7' B8' B5 B6 B7 B8",
        "F1 F2 F3 F4 F1' F2' F3' B1' F4' B2' F5 B3' F6 B4' F7 B1 F8 B2 F5' B3 F6' B4 F7' B5' F8' B6' "
        "B7' B8' B5 B6 B7 B8",
        "F1 F2 F3 F4 F1' B1' F2' B2' F3' B3' F4' B4' F5 B1 F6 B2 F7 B3 F8 B4 F5' B5' F6' B6' F7' B7' F8' B8' "
        "B5 B6 B7 B8",
    };
    sched s;
    char buf[512];
    build(&s, SCHED_KIND_INTERLEAVED, 4, 8, 2);
    for (int st = 0; st < 4; st++) {
        figure_row(&s, st, buf, sizeof buf);
        ASSERT_STR_EQ(buf, row[st]);
    }
    sched_free(&s);
}

/* --dump=schedule for 1F1B pp=4 m=8: fig. 4 top with its transfers. Stage
 * 0 sends each forward's activations up and receives each backward's
 * gradients right before it; stage 3 (the last) receives no gradients. */
TEST_IMPL(sched_dump_1f1b_pp4_m8)
{
    sched s;
    build(&s, SCHED_KIND_1F1B, 4, 8, 1);
    char *got = dump(&s);
    ASSERT_STR_EQ(got,
        "stage 0: F0.0 >a0.0@1 F1.0 >a1.0@1 F2.0 >a2.0@1 F3.0 >a3.0@1 <g0.0@1 B0.0 F4.0 >a4.0@1 "
        "<g1.0@1 B1.0 F5.0 >a5.0@1 <g2.0@1 B2.0 F6.0 >a6.0@1 <g3.0@1 B3.0 F7.0 >a7.0@1 <g4.0@1 B4.0 "
        "<g5.0@1 B5.0 <g6.0@1 B6.0 <g7.0@1 B7.0\n"
        "stage 1: <a0.1@0 F0.1 >a0.1@2 <a1.1@0 F1.1 >a1.1@2 <a2.1@0 F2.1 >a2.1@2 <g0.1@2 B0.1 >g0.1@0 "
        "<a3.1@0 F3.1 >a3.1@2 <g1.1@2 B1.1 >g1.1@0 <a4.1@0 F4.1 >a4.1@2 <g2.1@2 B2.1 >g2.1@0 "
        "<a5.1@0 F5.1 >a5.1@2 <g3.1@2 B3.1 >g3.1@0 <a6.1@0 F6.1 >a6.1@2 <g4.1@2 B4.1 >g4.1@0 "
        "<a7.1@0 F7.1 >a7.1@2 <g5.1@2 B5.1 >g5.1@0 <g6.1@2 B6.1 >g6.1@0 <g7.1@2 B7.1 >g7.1@0\n"
        "stage 2: <a0.2@1 F0.2 >a0.2@3 <a1.2@1 F1.2 >a1.2@3 <g0.2@3 B0.2 >g0.2@1 <a2.2@1 F2.2 >a2.2@3 "
        "<g1.2@3 B1.2 >g1.2@1 <a3.2@1 F3.2 >a3.2@3 <g2.2@3 B2.2 >g2.2@1 <a4.2@1 F4.2 >a4.2@3 "
        "<g3.2@3 B3.2 >g3.2@1 <a5.2@1 F5.2 >a5.2@3 <g4.2@3 B4.2 >g4.2@1 <a6.2@1 F6.2 >a6.2@3 "
        "<g5.2@3 B5.2 >g5.2@1 <a7.2@1 F7.2 >a7.2@3 <g6.2@3 B6.2 >g6.2@1 <g7.2@3 B7.2 >g7.2@1\n"
        "stage 3: <a0.3@2 F0.3 B0.3 >g0.3@2 <a1.3@2 F1.3 B1.3 >g1.3@2 <a2.3@2 F2.3 B2.3 >g2.3@2 "
        "<a3.3@2 F3.3 B3.3 >g3.3@2 <a4.3@2 F4.3 B4.3 >g4.3@2 <a5.3@2 F5.3 B5.3 >g5.3@2 "
        "<a6.3@2 F6.3 B6.3 >g6.3@2 <a7.3@2 F7.3 B7.3 >g7.3@2\n");
    free(got);
    sched_free(&s);
}

/* Interleaved pp=2 m=4 v=2, worked by hand from Megatron-core's rules:
 * stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3; forwards go in
 * groups of pp=2 micro-batches per chunk: (0,c0) (1,c0) (0,c1) (1,c1)
 * (2,c0) ...; backwards the same with the chunks reversed. Warm-up is
 * (2-0-1)*2 + 1*2 = 4 forwards on stage 0 and 0*2 + 2 = 2 on stage 1,
 * then one forward and one backward in turn, then the rest of the
 * backwards. Stage 1 runs chunk 3, the model's last, so its F0.3 is
 * followed at once by B0.3 and sends gradients back to chunk 2. */
TEST_IMPL(sched_dump_interleaved_pp2_m4_v2)
{
    sched s;
    build(&s, SCHED_KIND_INTERLEAVED, 2, 4, 2);
    char *got = dump(&s);
    ASSERT_STR_EQ(got,
        "stage 0: F0.0 >a0.0@1 F1.0 >a1.0@1 <a0.2@1 F0.2 >a0.2@1 <a1.2@1 F1.2 >a1.2@1 "
        "F2.0 >a2.0@1 <g0.2@1 B0.2 >g0.2@1 F3.0 >a3.0@1 <g1.2@1 B1.2 >g1.2@1 "
        "<a2.2@1 F2.2 >a2.2@1 <g0.0@1 B0.0 <a3.2@1 F3.2 >a3.2@1 <g1.0@1 B1.0 "
        "<g2.2@1 B2.2 >g2.2@1 <g3.2@1 B3.2 >g3.2@1 <g2.0@1 B2.0 <g3.0@1 B3.0\n"
        "stage 1: <a0.1@0 F0.1 >a0.1@0 <a1.1@0 F1.1 >a1.1@0 "
        "<a0.3@0 F0.3 B0.3 >g0.3@0 <a1.3@0 F1.3 B1.3 >g1.3@0 <a2.1@0 F2.1 >a2.1@0 <g0.1@0 B0.1 >g0.1@0 "
        "<a3.1@0 F3.1 >a3.1@0 <g1.1@0 B1.1 >g1.1@0 <a2.3@0 F2.3 B2.3 >g2.3@0 <a3.3@0 F3.3 B3.3 >g3.3@0 "
        "<g2.1@0 B2.1 >g2.1@0 <g3.1@0 B3.1 >g3.1@0\n");
    free(got);
    sched_free(&s);
}

/* One stage, several chunks: the hand-offs stay local, no transfers. */
TEST_IMPL(sched_single_stage_interleaved)
{
    sched s;
    build(&s, SCHED_KIND_INTERLEAVED, 1, 2, 2);
    char *got = dump(&s);
    ASSERT_STR_EQ(got, "stage 0: F0.0 F0.1 B0.1 F1.0 B0.0 F1.1 B1.1 B1.0\n");
    free(got);
    double bubble;
    ASSERT_REL(sched_simulate(&s, 1, 2, &bubble), 12.0, "makespan %d", 0);
    ASSERT_REL(bubble, 0.0, "bubble %d", 0);
    sched_free(&s);
}

/* Unit times of 1F1B pp=2 m=2, tf=1 tb=2, worked by hand: stage 1 runs
 * F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; stage 0 F0 [0,1] F1 [1,2], then
 * waits for gradients: B0 [4,6], B1 [7,9]. Makespan 9, busy 6: 1/3. */
TEST_IMPL(sched_simulate_unit_times)
{
    sched s;
    build(&s, SCHED_KIND_1F1B, 2, 2, 1);
    double st0[16], en0[16], st1[16], en1[16], bubble;
    double *start[] = {st0, st1}, *end[] = {en0, en1};
    ASSERT_INT_LT(s.stages[0].n_units, 16);
    ASSERT_INT_LT(s.stages[1].n_units, 16);
    ASSERT_REL(sched_simulate_units(&s, 1, 2, start, end, &bubble), 9.0, "makespan %d", 0);
    ASSERT_REL(bubble, 1.0 / 3, "bubble %d", 0);
    char got[256];
    size_t len = 0;
    for (int st = 0; st < 2; st++)
        for (int i = 0; i < s.stages[st].n_units; i++) {
            char u[32];
            sched_unit_str(&s.stages[st].units[i], u, sizeof u);
            len += (size_t)snprintf(got + len, sizeof got - len, "%s%s[%g,%g]", len ? " " : "", u, start[st][i],
                                    end[st][i]);
        }
    ASSERT_STR_EQ(got, "F0.0[0,1] >a0.0@1[1,1] F1.0[1,2] >a1.0@1[2,2] <g0.0@1[2,4] B0.0[4,6] "
                       "<g1.0@1[6,7] B1.0[7,9] "
                       "<a0.1@0[0,1] F0.1[1,2] B0.1[2,4] >g0.1@0[4,4] <a1.1@0[4,4] F1.1[4,5] B1.1[5,7] "
                       ">g1.1@0[7,7]");
    sched_free(&s);
}

/* A hand-made schedule whose receive has no send cannot finish. */
TEST_IMPL(sched_simulate_detects_stuck_receive)
{
    sched_unit u0[] = {{SCHED_RECV_GRAD, 0, 0, 1}, {SCHED_FWD, 0, 0, -1}};
    sched_unit u1[] = {{SCHED_RECV_ACT, 0, 1, 0}, {SCHED_FWD, 0, 1, -1}};
    sched_stage st[] = {{u0, 2}, {u1, 2}};
    sched s = {SCHED_KIND_1F1B, 2, 1, 1, st, NULL};
    double bubble = 0;
    ASSERT_REL(sched_simulate(&s, 1, 2, &bubble), -1.0, "makespan %d", 0);
    ASSERT_REL(bubble, -1.0, "bubble %d", 0);
}

TEST_IMPL(sched_kind_names)
{
    ASSERT_STR_EQ(sched_kind_name(SCHED_KIND_GPIPE), "gpipe");
    ASSERT_STR_EQ(sched_kind_name(SCHED_KIND_1F1B), "1f1b");
    ASSERT_STR_EQ(sched_kind_name(SCHED_KIND_INTERLEAVED), "interleaved");
}

/* ---- timeline ------------------------------------------------------- */

static char *svg(const sched *s, double tf, double tb) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ASSERT_NOT_NULL(f);
    ASSERT_INT_EQ(timeline_svg(s, tf, tb, f), 0);
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* The whole file for 1F1B pp=2 m=2 (unit times as in
 * sched_simulate_unit_times; 960 px over a makespan of 9, so one time unit
 * is 106.67 px from x = 80). */
TEST_IMPL(timeline_svg_golden)
{
    sched s;
    build(&s, SCHED_KIND_1F1B, 2, 2, 1);
    /* One array element per line: the whole is longer than C's 4095. */
    static const char *const want[] = {
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1060\" height=\"188\" viewBox=\"0 0 1060 188\" "
        "font-family=\"sans-serif\" font-size=\"11\">\n",
        "<title>1F1B schedule, pp=2 m=2 v=1, bubble 33.33%</title>\n",
        "<defs>\n",
        "<pattern id=\"idle\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
        "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f2f2f2\"/>"
        "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#cccccc\" stroke-width=\"2\"/></pattern>\n",
        "</defs>\n",
        "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
        "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">1F1B schedule: pp=2, m=2, v=1 - "
        "bubble 33.33%</text>\n",
        "<text x=\"10\" y=\"42\" fill=\"#555555\">forward 1.00, backward 2.00 per unit; makespan 9.00; "
        "bubble = idle share of the busiest stage</text>\n",
        "<text x=\"72\" y=\"74\" text-anchor=\"end\">stage 0</text>\n",
        "<rect x=\"80\" y=\"56\" width=\"960\" height=\"28\" fill=\"url(#idle)\"/>\n",
        "<rect x=\"80.00\" y=\"56\" width=\"106.67\" height=\"28\" fill=\"#3a6ea5\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>forward micro 0 chunk 0</title></rect>\n",
        "<text x=\"133.33\" y=\"74\" text-anchor=\"middle\" fill=\"#ffffff\">0</text>\n",
        "<rect x=\"186.67\" y=\"56\" width=\"106.67\" height=\"28\" fill=\"#3a6ea5\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>forward micro 1 chunk 0</title></rect>\n",
        "<text x=\"240.00\" y=\"74\" text-anchor=\"middle\" fill=\"#ffffff\">1</text>\n",
        "<rect x=\"506.67\" y=\"56\" width=\"213.33\" height=\"28\" fill=\"#c8612b\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>backward micro 0 chunk 0</title></rect>\n",
        "<text x=\"613.33\" y=\"74\" text-anchor=\"middle\" fill=\"#ffffff\">0</text>\n",
        "<rect x=\"826.67\" y=\"56\" width=\"213.33\" height=\"28\" fill=\"#c8612b\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>backward micro 1 chunk 0</title></rect>\n",
        "<text x=\"933.33\" y=\"74\" text-anchor=\"middle\" fill=\"#ffffff\">1</text>\n",
        "<text x=\"72\" y=\"108\" text-anchor=\"end\">stage 1</text>\n",
        "<rect x=\"80\" y=\"90\" width=\"960\" height=\"28\" fill=\"url(#idle)\"/>\n",
        "<rect x=\"186.67\" y=\"90\" width=\"106.67\" height=\"28\" fill=\"#3a6ea5\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>forward micro 0 chunk 1</title></rect>\n",
        "<text x=\"240.00\" y=\"108\" text-anchor=\"middle\" fill=\"#ffffff\">0</text>\n",
        "<rect x=\"293.33\" y=\"90\" width=\"213.33\" height=\"28\" fill=\"#c8612b\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>backward micro 0 chunk 1</title></rect>\n",
        "<text x=\"400.00\" y=\"108\" text-anchor=\"middle\" fill=\"#ffffff\">0</text>\n",
        "<rect x=\"506.67\" y=\"90\" width=\"106.67\" height=\"28\" fill=\"#3a6ea5\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>forward micro 1 chunk 1</title></rect>\n",
        "<text x=\"560.00\" y=\"108\" text-anchor=\"middle\" fill=\"#ffffff\">1</text>\n",
        "<rect x=\"613.33\" y=\"90\" width=\"213.33\" height=\"28\" fill=\"#c8612b\" stroke=\"#ffffff\" "
        "stroke-width=\"0.5\"><title>backward micro 1 chunk 1</title></rect>\n",
        "<text x=\"720.00\" y=\"108\" text-anchor=\"middle\" fill=\"#ffffff\">1</text>\n",
        "<line x1=\"80\" y1=\"124\" x2=\"1040\" y2=\"124\" stroke=\"#333333\"/>\n",
        "<line x1=\"80.00\" y1=\"124\" x2=\"80.00\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"80.00\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">0</text>\n",
        "<line x1=\"186.67\" y1=\"124\" x2=\"186.67\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"186.67\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">1</text>\n",
        "<line x1=\"293.33\" y1=\"124\" x2=\"293.33\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"293.33\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">2</text>\n",
        "<line x1=\"400.00\" y1=\"124\" x2=\"400.00\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"400.00\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">3</text>\n",
        "<line x1=\"506.67\" y1=\"124\" x2=\"506.67\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"506.67\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">4</text>\n",
        "<line x1=\"613.33\" y1=\"124\" x2=\"613.33\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"613.33\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">5</text>\n",
        "<line x1=\"720.00\" y1=\"124\" x2=\"720.00\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"720.00\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">6</text>\n",
        "<line x1=\"826.67\" y1=\"124\" x2=\"826.67\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"826.67\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">7</text>\n",
        "<line x1=\"933.33\" y1=\"124\" x2=\"933.33\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"933.33\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">8</text>\n",
        "<line x1=\"1040.00\" y1=\"124\" x2=\"1040.00\" y2=\"128\" stroke=\"#333333\"/>\n",
        "<text x=\"1040.00\" y=\"140\" text-anchor=\"middle\" fill=\"#333333\">9</text>\n",
        "<text x=\"72\" y=\"140\" text-anchor=\"end\" fill=\"#333333\">time</text>\n",
        "<rect x=\"80\" y=\"158\" width=\"14\" height=\"14\" fill=\"#3a6ea5\" stroke=\"#999999\"/>\n",
        "<text x=\"100\" y=\"169\">forward</text>\n",
        "<rect x=\"190\" y=\"158\" width=\"14\" height=\"14\" fill=\"#c8612b\" stroke=\"#999999\"/>\n",
        "<text x=\"210\" y=\"169\">backward</text>\n",
        "<rect x=\"300\" y=\"158\" width=\"14\" height=\"14\" fill=\"url(#idle)\" stroke=\"#999999\"/>\n",
        "<text x=\"320\" y=\"169\">idle</text>\n",
        "</svg>\n",
    };
    char *got = svg(&s, 1, 2), *line = got;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        size_t n = strlen(want[i]);
        if (strncmp(line, want[i], n) != 0) unit_fail(__FILE__, __LINE__, "line %zu: want %s got %.*s", i + 1, want[i], (int)strcspn(line, "\n") + 1, line);
        line += n;
    }
    ASSERT_STR_EQ(line, "");
    free(got);
    sched_free(&s);
}

/* Interleaved: chunk labels, lighter shades, the anchor's bubble in the
 * title, one box per compute unit, balanced tags, same bytes twice. */
TEST_IMPL(timeline_svg_interleaved)
{
    sched s;
    build(&s, SCHED_KIND_INTERLEAVED, 4, 8, 2);
    char *a = svg(&s, 1, 2), *b = svg(&s, 1, 2);
    ASSERT_STR_EQ(a, b);
    ASSERT_NOT_NULL(strstr(a, "Interleaved 1F1B schedule: pp=4, m=8, v=2 - bubble 15.79%"));
    ASSERT_INT_EQ(count(a, "<title>forward micro"), 4 * 8 * 2);
    ASSERT_INT_EQ(count(a, "<title>backward micro"), 4 * 8 * 2);
    ASSERT_NOT_NULL(strstr(a, ">7.5</text>")); /* micro 7 on chunk 5 (stage 1's second) */
    ASSERT_NOT_NULL(strstr(a, "fill=\"#79a6d6\"")); /* a later chunk's forward */
    ASSERT_NOT_NULL(strstr(a, "later virtual chunks"));
    ASSERT_INT_EQ(count(a, "</rect>"), 4 * 8 * 2 * 2); /* each unit's box holds its tooltip */
    ASSERT_INT_EQ(count(a, "<title>"), count(a, "</title>"));
    ASSERT_INT_EQ(count(a, "<title>"), 1 + 4 * 8 * 2 * 2);
    ASSERT_INT_EQ(count(a, "<text"), count(a, "</text>"));
    ASSERT_INT_EQ(count(a, "<svg"), 1);
    ASSERT_NULL(strstr(a, "<script"));
    ASSERT_INT_EQ(strcmp(a + strlen(a) - 7, "</svg>\n"), 0);
    free(a);
    free(b);
    /* Negative costs are refused. */
    ASSERT_INT_EQ(timeline_svg(&s, -1, 2, stdout), -1);
    sched_free(&s);
}
