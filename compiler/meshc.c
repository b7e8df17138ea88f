/* meshc.c — the mesh compiler's command line.
 *
 * At this stage meshc checks a .mesh file and prints a summary, the syntax
 * tree (--dump=ast) or the parameter table (--dump=params). Exit status: 0
 * ok, 1 diagnostics, 2 usage errors. Messages start with "meshc:", never
 * argv[0], so that test output does not depend on where meshc lives.
 */
#define _DEFAULT_SOURCE /* readlink */
#include <limits.h> /* PATH_MAX */
#include <stdio.h>  /* printf */
#include <stdlib.h> /* free */
#include <string.h> /* strcmp */
#include <sys/stat.h> /* stat */
#include <unistd.h> /* readlink */

#include "frontend.h"
#include "mesh.h"
#include "ranks.h"
#include "sched.h"
#include "shard.h"
#include "stats.h"
#include "timeline.h"

#ifndef MESH_STD_DIR
#define MESH_STD_DIR "lang"
#endif

enum { MAX_INCLUDES = 64, MAX_SETS = 256 };

static const char usage_text[] =
    "usage: meshc [options] FILE.mesh\n"
    "\n"
    "Checks a .mesh model and prints a summary: parameters, mesh, schedule.\n"
    "\n"
    "options:\n"
    "  --dump=ast         print the syntax tree of FILE as stable text\n"
    "  --dump=params      print every parameter: name, shape, placement, init\n"
    "  --dump=graph       print the model's dataflow graph (ops, shapes, repeats)\n"
    "  --dump=placements  print every tensor's placement over the mesh and the\n"
    "                     collectives of the forward and backward programs\n"
    "  --dump=schedule    print the pipeline schedule: each stage's units in order\n"
    "  --check            check only: print the static check's result, no summary\n"
    "  --stats            print per pipeline stage: memory per rank by kind, FLOPs\n"
    "                     and collectives per step, and the schedule's bubble\n"
    "  --memory-limit N   reject a plan needing more than N per rank (80GiB, 512MiB)\n"
    "  --timeline F.svg   draw the pipeline schedule into F.svg (open it in a browser)\n"
    "  --set KEY=VALUE    override a value: mesh.tp=4, train.micro_batch=2,\n"
    "                     model.dim=512 (a model constant), NAME (a top-level constant)\n"
    "  -I DIR             search DIR for imports (after the importing file's folder)\n"
    "  -h, --help         show this help\n"
    "  --version          show the version\n"
    "\n"
    "exit status: 0 ok, 1 errors in the input, 2 usage errors\n";

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "meshc: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'meshc --help'.\n");
    return 2;
}

/* The installed standard library (<bin>/../share/mesh) if present, else the
 * source tree's lang/ folder compiled in. */
static const char *std_dir(char *buf, size_t n) {
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            struct stat st;
            snprintf(buf, n, "%s/../share/mesh", exe);
            char probe[2 * PATH_MAX];
            int w = snprintf(probe, sizeof probe, "%.*s/std", PATH_MAX, buf);
            if (w > 0 && w < (int)sizeof probe && stat(probe, &st) == 0 && S_ISDIR(st.st_mode)) return buf;
        }
    }
    return MESH_STD_DIR;
}

/* What a compile derives after the checks: placements and programs, the
 * pipeline schedule, and the static check over every rank. */
typedef struct compiled {
    fe_setup setup;
    shard_prog prog;
    sched sc;
    rank_progs ranks;
    int have_prog, have_sched, have_ranks;
    long long ops, colls, p2p;
} compiled;

static fe_status compile(fe *f, compiled *c, int run_check) {
    memset(c, 0, sizeof *c);
    c->setup = fe_get_setup(f);
    const graph *g = fe_graph(f);
    if (shard_build(g, &c->setup, &c->prog) != 0) {
        fe_error_at(f, c->prog.error_node >= 0 ? g->nodes[c->prog.error_node].where : LOC_NONE, c->prog.error);
        return FE_ERRORS;
    }
    c->have_prog = 1;
    static const sched_kind kinds[] = {SCHED_KIND_GPIPE, SCHED_KIND_1F1B, SCHED_KIND_INTERLEAVED};
    char err[512];
    if (sched_build(&c->sc, kinds[c->setup.schedule], (int)c->setup.pp, (int)c->setup.micro_batches,
                    c->setup.schedule == 2 ? c->setup.virtual_stages : 1, err, sizeof err) != 0) {
        fe_error_at(f, LOC_NONE, err);
        return FE_ERRORS;
    }
    c->have_sched = 1;
    if (!run_check) return FE_OK;
    fe_status st = FE_OK;
    int built = ranks_build(&c->ranks, &c->prog, &c->sc, err, sizeof err) == 0;
    c->have_ranks = 1;
    if (!built || ranks_check(&c->ranks, err, sizeof err) != 0) {
        char msg[640];
        snprintf(msg, sizeof msg, "the plan fails the static check: %s", err);
        fe_error_at(f, LOC_NONE, msg);
        st = FE_ERRORS;
    }
    c->colls = c->ranks.n_coll;
    c->p2p = c->ranks.n_p2p;
    return st;
}

/* --stats, and --memory-limit: a stage over the limit is an error that
 * names the stage, its ranks and the parts. */
static fe_status cost(fe *f, compiled *c, int print, long long limit) {
    stats s;
    if (stats_build(&s, &c->prog, &c->sc) != 0) return FE_NOMEM;
    if (print) stats_print(&s, &c->prog, &c->sc, &c->ranks, stdout);
    fe_status st = FE_OK;
    loc at = LOC_NONE;
    if (limit <= 0 && c->setup.memory_limit > 0) {
        limit = c->setup.memory_limit;
        at = c->setup.memory_limit_at;
    }
    for (int i = 0; limit > 0 && i < s.pp; i++) {
        const stats_stage *x = &s.stage[i];
        if (x->total <= limit) continue;
        char msg[512];
        long long per = c->setup.world / c->setup.pp;
        snprintf(msg, sizeof msg, "pipeline stage %d (ranks %lld to %lld) needs %.2f GiB per rank, over the memory "
                 "limit of %.2f GiB: params %.2f, gradients %.2f, optimizer %.2f, activations %.2f GiB", i,
                 i * per, (i + 1) * per - 1, (double)x->total / 1073741824.0, (double)limit / 1073741824.0,
                 (double)x->params / 1073741824.0, (double)x->grads / 1073741824.0,
                 (double)x->optim / 1073741824.0, (double)x->activations / 1073741824.0);
        fe_error_at(f, at, msg);
        st = FE_ERRORS;
    }
    stats_free(&s);
    return st;
}

static void compiled_free(compiled *c) {
    if (c->have_ranks) ranks_free(&c->ranks);
    if (c->have_prog) shard_free(&c->prog);
    if (c->have_sched) sched_free(&c->sc);
}

/* --timeline FILE.svg: the schedule with backward twice as long as forward. */
static fe_status write_timeline(fe *f, const compiled *c, const char *path) {
    FILE *out = fopen(path, "w");
    if (!out || timeline_svg(&c->sc, 1.0, 2.0, out) != 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "cannot write the timeline to '%s'", path);
        fe_error_at(f, LOC_NONE, msg);
        if (out) fclose(out);
        return FE_ERRORS;
    }
    return fclose(out) == 0 ? FE_OK : FE_ERRORS;
}

/* 4576 -> "4,576" */
static void commas(long long v, char *buf, size_t n) {
    char d[32];
    int k = snprintf(d, sizeof d, "%lld", v), j = 0;
    for (int i = 0; i < k && (size_t)j + 2 < n; i++) {
        if (i > 0 && (k - i) % 3 == 0) buf[j++] = ',';
        buf[j++] = d[i];
    }
    buf[j] = '\0';
}

static void print_check(const compiled *c) {
    char a[32], b[32];
    commas(c->colls, a, sizeof a);
    commas(c->p2p, b, sizeof b);
    printf("  check:    every rank's step simulated (%lld rank%s, %s collective calls, %s sends and receives): "
           "no deadlock, every collective matched\n", c->setup.world, c->setup.world == 1 ? "" : "s", a, b);
}

int main(int argc, char **argv) {
    const char *includes[MAX_INCLUDES], *sets[MAX_SETS], *file = NULL, *dump = NULL, *timeline = NULL;
    int check_only = 0, want_stats = 0;
    long long memory_limit = 0;
    int n_inc = 0, n_sets = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("meshc %s\n", mesh_version());
            return 0;
        } else if (strncmp(a, "--dump=", 7) == 0) {
            dump = a + 7;
            if (strcmp(dump, "ast") != 0 && strcmp(dump, "params") != 0 && strcmp(dump, "graph") != 0 &&
                strcmp(dump, "placements") != 0 && strcmp(dump, "schedule") != 0)
                return usage_error("unknown dump '%s' (use --dump=ast, params, graph, placements or schedule)", dump);
        } else if (strcmp(a, "--check") == 0) {
            check_only = 1;
        } else if (strcmp(a, "--stats") == 0) {
            want_stats = 1;
        } else if (strcmp(a, "--memory-limit") == 0 || strncmp(a, "--memory-limit=", 15) == 0) {
            const char *v = a[14] == '=' ? a + 15 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || (memory_limit = fe_parse_bytes(v)) <= 0)
                return usage_error("--memory-limit needs a size such as 80GiB or 512MiB, not '%s'", v ? v : "");
        } else if (strcmp(a, "--timeline") == 0 || strncmp(a, "--timeline=", 11) == 0) {
            timeline = a[10] == '=' ? a + 11 : (i + 1 < argc ? argv[++i] : NULL);
            if (!timeline || !*timeline) return usage_error("%s needs a file name (an .svg)", "--timeline");
        } else if (strcmp(a, "--set") == 0 || strncmp(a, "--set=", 6) == 0) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return usage_error("%s needs KEY=VALUE", "--set");
            if (n_sets == MAX_SETS) return usage_error("too many %s options", "--set");
            sets[n_sets++] = v;
        } else if (strcmp(a, "-I") == 0 || (strncmp(a, "-I", 2) == 0 && a[2])) {
            const char *v = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return usage_error("%s needs a folder", "-I");
            if (n_inc == MAX_INCLUDES) return usage_error("too many %s options", "-I");
            includes[n_inc++] = v;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option '%s'", a);
        } else if (file) {
            return usage_error("more than one input file ('%s')", a);
        } else {
            file = a;
        }
    }
    if (!file) return usage_error("%s", "no input file");

    char stdbuf[PATH_MAX + 32];
    fe_options o = {includes, n_inc, std_dir(stdbuf, sizeof stdbuf), diag_to_file, stderr};
    fe *f = fe_new(&o);
    if (!f) {
        fputs("meshc: error: out of memory\n", stderr);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < n_sets; i++) {
        fe_status st = fe_add_set(f, sets[i]);
        if (st == FE_USAGE) {
            fe_free(f);
            fputs("Try 'meshc --help'.\n", stderr);
            return 2;
        }
        if (st != FE_OK) rc = 1;
    }
    fe_status st = fe_load_file(f, file);
    if (st == FE_OK && rc == 0) {
        if (dump && strcmp(dump, "ast") == 0) {
            fe_dump_ast(f, stdout);
            fflush(stdout);
        }
        st = fe_check(f);
        int has_model = st == FE_OK && fe_graph(f)->loss >= 0;
        if (st == FE_OK && (!dump || strcmp(dump, "ast") != 0) && has_model) {
            int needs = !dump || strcmp(dump, "placements") == 0 || strcmp(dump, "schedule") == 0 || timeline;
            compiled c;
            if (needs) st = compile(f, &c, !dump);
            if (st == FE_OK && !dump) st = cost(f, &c, 0, memory_limit);
            if (st == FE_OK && !dump && !check_only && !want_stats) fe_summary(f, stdout);
            if (st == FE_OK && !dump && !want_stats) print_check(&c);
            if (st == FE_OK && !dump && want_stats) cost(f, &c, 1, 0);
            if (st == FE_OK && dump && strcmp(dump, "placements") == 0) shard_dump(&c.prog, stdout);
            if (st == FE_OK && dump && strcmp(dump, "schedule") == 0) sched_dump(&c.sc, stdout);
            if (st == FE_OK && timeline) st = write_timeline(f, &c, timeline);
            if (needs) compiled_free(&c);
        } else if (st == FE_OK && !dump && !check_only) {
            fe_summary(f, stdout);
        }
        if (st == FE_OK && dump && strcmp(dump, "params") == 0) fe_dump_params(f, stdout);
        if (st == FE_OK && dump && strcmp(dump, "graph") == 0) graph_dump(fe_graph(f), stdout);
    }
    if (st == FE_NOMEM) fputs("meshc: error: out of memory\n", stderr);
    if (st != FE_OK) rc = 1;
    int ne = fe_error_count(f), nw = fe_warning_count(f);
    if (ne || nw) {
        fflush(stdout);
        fprintf(stderr, "meshc: %d error%s, %d warning%s\n", ne, ne == 1 ? "" : "s", nw, nw == 1 ? "" : "s");
    }
    fe_free(f);
    return rc;
}
