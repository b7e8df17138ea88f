/* suggest.h — "did you mean ...?" by edit distance. */
#ifndef MESH_SUGGEST_H
#define MESH_SUGGEST_H

typedef struct suggest {
    const char *word;  /* what was written */
    const char *best;  /* closest candidate so far, or NULL */
    int best_dist;
} suggest;

void suggest_init(suggest *s, const char *word);
void suggest_offer(suggest *s, const char *candidate);
/* The best candidate if it is close enough to be a likely typo, else NULL. */
const char *suggest_result(const suggest *s);

#endif
