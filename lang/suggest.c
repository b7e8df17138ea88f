/* suggest.c — Levenshtein distance with a cutoff for "did you mean". */
#include "suggest.h"

#include <string.h> /* strlen, strcmp */

enum { SUGGEST_MAX_LEN = 64 };

static int min3(int a, int b, int c) {
    int m = a < b ? a : b;
    return m < c ? m : c;
}

/* Edit distance (insert, delete, substitute, adjacent swap). */
static int distance(const char *a, const char *b) {
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > SUGGEST_MAX_LEN || m > SUGGEST_MAX_LEN) return SUGGEST_MAX_LEN;
    int d[SUGGEST_MAX_LEN + 1][SUGGEST_MAX_LEN + 1];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int cost = a[i - 1] != b[j - 1];
            d[i][j] = min3(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[n][m];
}

void suggest_init(suggest *s, const char *word) {
    s->word = word;
    s->best = NULL;
    s->best_dist = SUGGEST_MAX_LEN;
}

void suggest_offer(suggest *s, const char *candidate) {
    if (!candidate || strcmp(candidate, s->word) == 0) return;
    int dist = distance(s->word, candidate);
    if (dist < s->best_dist || (dist == s->best_dist && s->best && strcmp(candidate, s->best) < 0)) {
        s->best = candidate;
        s->best_dist = dist;
    }
}

const char *suggest_result(const suggest *s) {
    if (!s->best) return NULL;
    int len = (int)strlen(s->word);
    int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
    return s->best_dist <= limit ? s->best : NULL;
}
