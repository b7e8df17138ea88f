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
#include "shard.h"

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

/* Derives the placements and the forward and backward programs. */
static fe_status dump_placements(fe *f) {
    fe_setup setup = fe_get_setup(f);
    shard_prog p;
    fe_status st = FE_OK;
    if (shard_build(fe_graph(f), &setup, &p) == 0) {
        shard_dump(&p, stdout);
    } else {
        fe_error_at(f, p.error_node >= 0 ? fe_graph(f)->nodes[p.error_node].where : LOC_NONE, p.error);
        st = FE_ERRORS;
    }
    shard_free(&p);
    return st;
}

int main(int argc, char **argv) {
    const char *includes[MAX_INCLUDES], *sets[MAX_SETS], *file = NULL, *dump = NULL;
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
                strcmp(dump, "placements") != 0)
                return usage_error("unknown dump '%s' (use --dump=ast, params, graph or placements)", dump);
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
        if (st == FE_OK) {
            if (!dump) fe_summary(f, stdout);
            else if (strcmp(dump, "params") == 0) fe_dump_params(f, stdout);
            else if (strcmp(dump, "graph") == 0) graph_dump(fe_graph(f), stdout);
            else if (strcmp(dump, "placements") == 0) st = dump_placements(f);
        }
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
