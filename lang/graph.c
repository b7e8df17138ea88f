/* graph.c — the recorded dataflow graph (graph.h). */
#include "graph.h"

#include <stdlib.h> /* realloc, free */
#include <string.h> /* memset */

static const char *const op_names[] = {
#define GRAPH_STR(e, s) s,
    GRAPH_OP_LIST(GRAPH_STR)
#undef GRAPH_STR
};

const char *graph_op_name(g_op op) { return op >= 0 && op < G_OP_COUNT ? op_names[op] : "?"; }

void graph_init(graph *g) {
    memset(g, 0, sizeof *g);
    g->loss = -1;
    g->cur_region = -1;
}

void graph_free(graph *g) {
    free(g->nodes);
    free(g->regions);
    graph_init(g);
}

int graph_add(graph *g, const g_node *n) {
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        g_node *p = realloc(g->nodes, (size_t)cap * sizeof *p);
        if (!p) return -1;
        g->nodes = p;
        g->cap = cap;
    }
    g->nodes[g->n] = *n;
    g->nodes[g->n].region = g->cur_region;
    return g->n++;
}

int graph_region_begin(graph *g, int64_t count, int is_stack, const char *label) {
    if (g->n_regions == g->cap_regions) {
        int cap = g->cap_regions ? 2 * g->cap_regions : 8;
        g_region *p = realloc(g->regions, (size_t)cap * sizeof *p);
        if (!p) return -1;
        g->regions = p;
        g->cap_regions = cap;
    }
    g_region *r = &g->regions[g->n_regions];
    memset(r, 0, sizeof *r);
    r->first = r->end = g->n;
    r->count = count;
    r->parent = g->cur_region;
    r->is_stack = is_stack;
    r->label = label;
    g->cur_region = g->n_regions;
    return g->n_regions++;
}

void graph_region_end(graph *g, int region) {
    if (region < 0) return;
    g->regions[region].end = g->n;
    g->cur_region = g->regions[region].parent;
}

int graph_region_carry(graph *g, int region, int before, int now) {
    if (region < 0) return 0;
    g_region *r = &g->regions[region];
    for (int i = 0; i < r->n_carry; i++)
        if (r->carry[i].exit == before) {
            r->carry[i].exit = now;
            return 0;
        }
    if (r->n_carry == GRAPH_MAX_CARRY) return -1;
    r->carry[r->n_carry++] = (g_carry){before, now};
    return 0;
}

static void dump_shape(const g_node *n, FILE *out) {
    fprintf(out, " %s[", n->is_int ? "int" : "");
    for (int i = 0; i < n->rank; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)n->dims[i]);
    fputc(']', out);
}

void graph_dump(const graph *g, FILE *out) {
    static const char *const axes[] = {"dp", "tp", "pp", "ep"};
    int open[64], depth = 0;
    for (int i = 0; i < g->n; i++) {
        for (int r = 0; r < g->n_regions; r++)
            if (g->regions[r].first == i && g->regions[r].end > i && depth < 64) {
                fprintf(out, "%*srepeat %lld%s {  # %s\n", depth * 2, "", (long long)g->regions[r].count,
                        g->regions[r].is_stack ? " (layer stack)" : "", g->regions[r].label);
                open[depth++] = r;
            }
        const g_node *n = &g->nodes[i];
        fprintf(out, "%*s%%%d = %s", depth * 2, "", i, graph_op_name(n->op));
        if (n->op == G_INPUT || n->op == G_PARAM) {
            fprintf(out, " %s", n->name);
        } else {
            fputc('(', out);
            for (int k = 0; k < n->n_in; k++) fprintf(out, "%s%%%d", k ? ", " : "", n->in[k]);
            fputc(')', out);
        }
        dump_shape(n, out);
        for (int k = 0; k < n->n_annot; k++) {
            if (n->annot[k].dim < 0) fprintf(out, " @replicate(%s)", axes[n->annot[k].axis]);
            else fprintf(out, " @split(%s, %d)", axes[n->annot[k].axis], n->annot[k].dim);
        }
        if (n->op == G_ATTENTION)
            fprintf(out, " heads=%lld kv_heads=%lld%s", (long long)n->heads, (long long)n->kv_heads,
                    n->causal ? " causal" : "");
        if (n->op == G_ROPE) fprintf(out, " heads=%lld theta=%g", (long long)n->heads, n->theta);
        if (n->op == G_LAYERNORM || n->op == G_RMSNORM) fprintf(out, " eps=%g", n->eps);
        if (n->op == G_MOE)
            fprintf(out, " top_k=%lld capacity=%g act=%s aux_loss=%g", (long long)n->top_k, n->capacity,
                    n->act_gelu ? "gelu" : "swiglu", n->aux_loss);
        if (n->op == G_CROSS_ENTROPY && n->vocab) fprintf(out, " vocab=%lld", (long long)n->vocab);
        if (n->op == G_SCALE) fprintf(out, " by %g", n->scale);
        if (i == g->loss) fputs("  # loss", out);
        fputc('\n', out);
        while (depth > 0 && g->regions[open[depth - 1]].end == i + 1) {
            const g_region *r = &g->regions[open[--depth]];
            fprintf(out, "%*s}", depth * 2, "");
            for (int k = 0; k < r->n_carry; k++)
                fprintf(out, "%s%%%d -> %%%d", k ? ", " : "  carries ", r->carry[k].exit, r->carry[k].entry);
            fputc('\n', out);
        }
    }
}
