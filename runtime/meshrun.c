/*
 * meshrun.c: the `meshrun` command, which will execute plans made by meshc.
 *
 * Today it loads and validates a plan (compiler/plan.h: magic, format
 * version, every field) and says what it holds; executing it lands with the
 * runtime milestone. It reports that plainly instead of pretending to run
 * anything.
 *
 * Exit status: 0 for --help and --version, 1 when the plan file cannot be
 * read or is not a valid plan of this format, 2 for usage errors and for a
 * valid plan (execution not implemented yet).
 */
#include <errno.h>  /* defines: errno */
#include <stdio.h>  /* defines: printf, fprintf, fopen */
#include <string.h> /* defines: strcmp, strerror */

#include <stdint.h> /* defines: uint16_t */
#include <stdlib.h> /* defines: malloc, free */

#include "mesh.h" /* defines: mesh_version */
#include "data.h" /* defines: mesh__shard_write, mesh__tokenize_bytes */
#include "plan.h" /* defines: plan_read, plan_free */

static const char usage_text[] =
    "usage: meshrun [options] FILE.plan\n"
    "       meshrun tokenize TEXT... -o SHARD.bin\n"
    "\n"
    "Execute a plan compiled by meshc. Today it loads and validates the plan;\n"
    "executing it is not implemented yet.\n"
    "\n"
    "meshrun tokenize turns text files into one token shard (llm.c's format:\n"
    "a 1024-byte header, then uint16 tokens) with the byte-level tokenizer\n"
    "(vocabulary 256).\n"
    "\n"
    "options:\n"
    "  -h, --help     print this help and exit\n"
    "  --version      print the version and exit\n";

/* Print a one-line error and the usage to stderr; return the usage status. */
static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "meshrun: error: %s%s%s%s\n", what, arg ? " '" : "",
            arg ? arg : "", arg ? "'" : "");
    fputs(usage_text, stderr);
    return 2;
}

/* Loads and validates the plan, then says plans cannot run yet. */
static int run_plan(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "meshrun: error: cannot open '%s': %s\n", path,
                strerror(errno));
        return 1;
    }
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    for (;;) {
        if (!text) break;
        len += fread(text + len, 1, cap - len, f);
        if (len < cap || ferror(f)) break;
        char *bigger = realloc(text, cap * 2);
        if (!bigger) { free(text); text = NULL; break; }
        text = bigger;
        cap *= 2;
    }
    int bad = !text || ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "meshrun: error: cannot read '%s'\n", path);
        free(text);
        return 1;
    }
    plan p;
    char err[1024];
    int rc = plan_read(&p, text, len, err, sizeof err);
    free(text);
    if (rc != 0) {
        fprintf(stderr, "meshrun: error: %s:%s\n", path, err);
        return 1;
    }
    fprintf(stderr,
            "meshrun: %s: a valid plan for %lld rank%s (dp %lld x tp %lld x "
            "pp %lld x ep %lld)\n"
            "meshrun: error: executing plans is not implemented yet (it lands "
            "with the runtime milestone)\n",
            path, (long long)p.setup.world, p.setup.world == 1 ? "" : "s",
            (long long)p.setup.dp,
            (long long)p.setup.tp, (long long)p.setup.pp,
            (long long)p.setup.ep);
    plan_free(&p);
    return 2;
}

/* meshrun tokenize TEXT... -o SHARD.bin */
static int tokenize(int argc, char **argv)
{
    const char *out = NULL;
    int n_in = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0) {
            if (i + 1 >= argc) return usage_error("-o needs a file name", NULL);
            out = argv[++i];
        } else if (strcmp(argv[i], "--bytes") == 0) {
            /* the only tokenizer today; accepted for clarity */
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return usage_error("unknown tokenize option", argv[i]);
        } else {
            argv[n_in++] = argv[i];
        }
    }
    if (!out || n_in == 0) return usage_error("tokenize needs text files and -o SHARD.bin", NULL);
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap);
    for (int i = 0; text && i < n_in; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "meshrun: error: cannot open '%s': %s\n", argv[i], strerror(errno));
            free(text);
            return 1;
        }
        size_t got;
        while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
            len += got;
            if (len == cap) {
                char *bigger = realloc(text, cap * 2);
                if (!bigger) { free(text); text = NULL; break; }
                text = bigger;
                cap *= 2;
            }
        }
        fclose(f);
    }
    uint16_t *tok = text ? malloc((len ? len : 1) * sizeof *tok) : NULL;
    if (!text || !tok) {
        fputs("meshrun: error: out of memory\n", stderr);
        free(text);
        free(tok);
        return 1;
    }
    size_t n = mesh__tokenize_bytes(text, len, tok);
    char err[512];
    int rc = mesh__shard_write(out, tok, n, err, sizeof err);
    free(text);
    free(tok);
    if (rc != 0) {
        fprintf(stderr, "meshrun: error: %s\n", err);
        return 1;
    }
    printf("meshrun: %s: %zu tokens (byte-level, vocabulary 256)\n", out, n);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "tokenize") == 0) return tokenize(argc - 2, argv + 2);
    const char *plan_path = NULL;
    int options_done = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && arg[0] == '-' && arg[1] != '\0') {
            if (strcmp(arg, "--") == 0) {
                options_done = 1;
            } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
                fputs(usage_text, stdout);
                return 0;
            } else if (strcmp(arg, "--version") == 0) {
                printf("meshrun %s\n", mesh_version());
                return 0;
            } else {
                return usage_error("unknown option", arg);
            }
        } else if (plan_path) {
            return usage_error("more than one plan file given:", arg);
        } else {
            plan_path = arg;
        }
    }
    if (!plan_path)
        return usage_error("no plan file given", NULL);
    return run_plan(plan_path);
}
