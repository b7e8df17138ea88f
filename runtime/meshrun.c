/*
 * meshrun.c: the `meshrun` command, which will execute plans made by meshc.
 *
 * Today it only parses its command line: plan execution lands with the
 * milestone that gives meshc its plan output. It reports that plainly instead
 * of pretending to run anything.
 *
 * Exit status: 0 for --help and --version, 1 when the plan file cannot be
 * opened, 2 for usage errors and for a plan (not implemented yet).
 */
#include <errno.h>  /* defines: errno */
#include <stdio.h>  /* defines: printf, fprintf, fopen */
#include <string.h> /* defines: strcmp, strerror */

#include "mesh.h" /* defines: mesh_version */

static const char usage_text[] =
    "usage: meshrun [options] FILE.plan\n"
    "\n"
    "Execute a plan compiled by meshc (not implemented yet).\n"
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

/* Check the plan file can be read, then say plans cannot run yet. */
static int run_plan(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "meshrun: error: cannot open '%s': %s\n", path,
                strerror(errno));
        return 1;
    }
    fclose(f);
    fputs("meshrun: error: executing plans is not implemented yet (the "
          "compiler's plan output lands with the next milestone)\n",
          stderr);
    return 2;
}

int main(int argc, char **argv)
{
    const char *plan = NULL;
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
        } else if (plan) {
            return usage_error("more than one plan file given:", arg);
        } else {
            plan = arg;
        }
    }
    if (!plan)
        return usage_error("no plan file given", NULL);
    return run_plan(plan);
}
