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
#include "compile.h"
#include "timeline.h"

#ifndef MESH_STD_DIR
#define MESH_STD_DIR "lang"
#endif

enum { MAX_INCLUDES = 64, MAX_SETS = 256 };

static const char usage_text[] =
    "usage: meshc [options] FILE.mesh\n"
    "\n"
    "Checks a .mesh model, compiles it into a plan for meshrun (FILE.plan, next\n"
    "to FILE.mesh) and prints a summary: parameters, mesh, schedule, check.\n"
    "\n"
    "options:\n"
    "  -o PLAN            write the plan to PLAN instead of FILE.plan\n"
    "  --dump=ast         print the syntax tree of FILE as stable text\n"
    "  --dump=params      print every parameter: name, shape, placement, init\n"
    "  --dump=graph       print the model's dataflow graph (ops, shapes, repeats);\n"
    "                     --dump=ir is the same\n"
    "  --dump=placements  print every tensor's placement over the mesh and the\n"
    "                     collectives of the forward and backward programs\n"
    "  --dump=schedule    print the pipeline schedule: each stage's units in order\n"
    "  --dump=memory      print the memory plan: per stage, and every buffer's place\n"
    "  --dump=plan        print the plan file (YAML) instead of writing it\n"
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

int main(int argc, char **argv) {
    const char *includes[MAX_INCLUDES], *sets[MAX_SETS], *file = NULL, *dump = NULL, *timeline = NULL;
    const char *output = NULL;
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
            if (strcmp(dump, "ir") == 0) dump = "graph"; /* the IR the compiler lowers is the graph */
            if (strcmp(dump, "ast") != 0 && strcmp(dump, "params") != 0 && strcmp(dump, "graph") != 0 &&
                strcmp(dump, "placements") != 0 && strcmp(dump, "schedule") != 0 && strcmp(dump, "plan") != 0 &&
                strcmp(dump, "memory") != 0)
                return usage_error("unknown dump '%s' (use --dump=ast, params, graph (or ir), placements, schedule, "
                                   "memory or plan)", dump);
        } else if (strcmp(a, "--check") == 0) {
            check_only = 1;
        } else if (strcmp(a, "-o") == 0 || (strncmp(a, "-o", 2) == 0 && a[2])) {
            output = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (!output || !*output) return usage_error("%s needs a file name", "-o");
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
            int needs = !dump || strcmp(dump, "placements") == 0 || strcmp(dump, "schedule") == 0 ||
                        strcmp(dump, "plan") == 0 || strcmp(dump, "memory") == 0 || timeline;
            int write_plan = !dump && !check_only && !want_stats;
            compiled c;
            char written[4200] = "";
            if (needs) st = compile_run(f, &c, !dump);
            if (st == FE_OK && !dump) st = compile_cost(f, &c, NULL, memory_limit);
            if (st == FE_OK && write_plan) st = compile_write_plan(f, &c, file, output, NULL, written, sizeof written);
            if (st == FE_OK && !dump && !check_only && !want_stats) fe_summary(f, stdout);
            if (st == FE_OK && !dump && !want_stats) compile_print_check(&c, stdout);
            if (st == FE_OK && written[0]) printf("  plan:     %s\n", written);
            if (st == FE_OK && dump && strcmp(dump, "plan") == 0)
                st = compile_write_plan(f, &c, file, NULL, stdout, NULL, 0);
            if (st == FE_OK && !dump && want_stats) compile_cost(f, &c, stdout, 0);
            if (st == FE_OK && dump && strcmp(dump, "placements") == 0) shard_dump(&c.prog, stdout);
            if (st == FE_OK && dump && strcmp(dump, "schedule") == 0) sched_dump(&c.sc, stdout);
            if (st == FE_OK && dump && strcmp(dump, "memory") == 0) {
                st = compile_dump_memory(f, &c, stdout);
            }
            if (st == FE_OK && timeline) st = write_timeline(f, &c, timeline);
            if (needs) compile_free(&c);
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
