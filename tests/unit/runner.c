/*
 * runner.c: main for the unit tests; runs the tests in test_list.h.
 *
 * usage: unit_tests [NAME...]   (no names: run every test, in list order)
 *
 * Output is TAP-like: a plan line `1..N`, then `ok N - name` or
 * `not ok N - name` per test (details on stderr, before the line, prefixed
 * "# "), then `# N passed, N failed`. Each test runs in a forked child, so a
 * crash, an abort or a sanitizer report fails that test alone; under
 * LeakSanitizer a test that leaks fails too. Exit status: 0 if all passed,
 * 1 if any failed, 2 for an unknown test name.
 *
 * MESH_UNIT_TIMES=1 adds a line `# NAME: S s` after each result (wall
 * time, for finding what makes CI slow; tests never depend on it).
 */
#include <errno.h>     /* defines: errno, EINTR */
#include <stdarg.h>    /* defines: va_list */
#include <stdio.h>     /* defines: printf, fprintf, fflush */
#include <stdlib.h>    /* defines: exit, getenv */
#include <string.h>    /* defines: strcmp, strerror */
#include <sys/types.h> /* defines: pid_t */
#include <sys/wait.h>  /* defines: waitpid, WIFEXITED, ... */
#include <time.h>      /* defines: clock_gettime, CLOCK_MONOTONIC */
#include <unistd.h>    /* defines: fork, _exit */

#include "unit.h" /* defines: test_<name> declarations, unit_fail */

struct unit_test {
    const char *name;
    void (*fn)(void);
};

static const struct unit_test unit_tests[] = {
#define TEST(name) {#name, test_##name},
#include "test_list.h"
#undef TEST
};

enum { UNIT_NTESTS = sizeof unit_tests / sizeof unit_tests[0] };

void unit_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "# %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(NULL);
    /* _exit, not exit: skip the leak check, the test has already failed. */
    _exit(1);
}

/* Run one test in a child process; return 1 if it passed. */
static int unit_run(const struct unit_test *t)
{
    int st;
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "# %s: fork failed: %s\n", t->name, strerror(errno));
        return 0;
    }
    if (pid == 0) {
        t->fn();
        fflush(NULL);
        exit(0); /* exit runs LeakSanitizer's check in sanitizer builds */
    }
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "# %s: waitpid failed: %s\n", t->name,
                    strerror(errno));
            return 0;
        }
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 1;
    if (WIFEXITED(st) && WEXITSTATUS(st) != 1) /* 1 is a failed assert */
        fprintf(stderr, "# %s: exited with status %d\n", t->name,
                WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        fprintf(stderr, "# %s: killed by signal %d\n", t->name, WTERMSIG(st));
    return 0;
}

/* Is test i selected by the names on the command line (all if none)? */
static int unit_selected(int i, int argc, char **argv)
{
    if (argc < 2)
        return 1;
    for (int a = 1; a < argc; a++)
        if (strcmp(argv[a], unit_tests[i].name) == 0)
            return 1;
    return 0;
}

static double unit_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int planned = 0, n = 0, passed = 0, failed = 0;
    const char *times = getenv("MESH_UNIT_TIMES");
    int timed = times && strcmp(times, "1") == 0;

    for (int a = 1; a < argc; a++) {
        int known = 0;
        for (int i = 0; i < UNIT_NTESTS; i++)
            known |= strcmp(argv[a], unit_tests[i].name) == 0;
        if (!known) {
            fprintf(stderr, "unit_tests: unknown test '%s'\n", argv[a]);
            return 2;
        }
    }
    for (int i = 0; i < UNIT_NTESTS; i++)
        planned += unit_selected(i, argc, argv);
    printf("1..%d\n", planned);
    for (int i = 0; i < UNIT_NTESTS; i++) {
        if (!unit_selected(i, argc, argv))
            continue;
        double t0 = unit_now();
        n++;
        if (unit_run(&unit_tests[i])) {
            passed++;
            printf("ok %d - %s\n", n, unit_tests[i].name);
        } else {
            failed++;
            printf("not ok %d - %s\n", n, unit_tests[i].name);
        }
        if (timed)
            printf("# %s: %.2f s\n", unit_tests[i].name, unit_now() - t0);
        fflush(stdout);
    }
    printf("# %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
