/* file.c — reading a whole file (file.h). */
#include "file.h"

#include <errno.h>  /* errno */
#include <stdio.h>  /* fopen, fread, snprintf */
#include <stdlib.h> /* malloc, realloc, free */
#include <string.h> /* strerror */

char *mesh__read_file(const char *path, size_t *len, char *err, size_t errn)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errn, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    while (text) {
        n += fread(text + n, 1, cap - 1 - n, f);
        if (n < cap - 1 || ferror(f)) break;
        char *bigger = realloc(text, cap * 2);
        if (!bigger) { free(text); text = NULL; break; }
        text = bigger;
        cap *= 2;
    }
    int bad = !text || ferror(f);
    fclose(f);
    if (bad) {
        snprintf(err, errn, text ? "cannot read '%s'" : "out of memory reading '%s'", path);
        free(text);
        return NULL;
    }
    text[n] = '\0';
    *len = n;
    return text;
}
