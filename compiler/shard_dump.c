/* shard_dump.c — `meshc --dump=placements` and collective counts. */
#include <string.h> /* strlen */

#include "shard.h"
#include "frontend.h" /* fe_commas */

static const char *const axis_names[SHARD_AXES] = {"dp", "tp", "pp", "ep"};

static void put_pl(const shard_prog *p, shard_pl x, FILE *out) {
    const long long size[SHARD_AXES] = {p->setup.dp, p->setup.tp, p->setup.pp, p->setup.ep};
    int any = 0;
    for (int a = 0; a < SHARD_AXES; a++) {
        if (a == 2 || size[a] <= 1) continue;
        fprintf(out, "%s%s:", any++ ? " " : "", axis_names[a]);
        if (x.kind[a] == PL_SPLIT) fprintf(out, "S(%d)", x.dim[a]);
        else fputs(x.kind[a] == PL_PARTIAL ? "P" : "R", out);
    }
    if (!any) fputs("-", out);
}

static void put_shape(const g_node *n, FILE *out) {
    fputc('[', out);
    for (int i = 0; i < n->rank; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)n->dims[i]);
    fputc(']', out);
}

/* Opens and closes `repeat` braces so the listing nests like the graph. */
typedef struct nest {
    int stack[32], depth;
} nest;

static int is_ancestor(const graph *g, int anc, int r) {
    for (; r >= 0; r = g->regions[r].parent)
        if (r == anc) return 1;
    return 0;
}

static void enter(const graph *g, nest *ns, int region, FILE *out) {
    while (ns->depth > 0 && !is_ancestor(g, ns->stack[ns->depth - 1], region)) {
        ns->depth--;
        fprintf(out, "%*s}\n", ns->depth * 2, "");
    }
    int chain[32], n = 0;
    for (int r = region; r >= 0 && n < 32; r = g->regions[r].parent) {
        if (ns->depth > 0 && r == ns->stack[ns->depth - 1]) break;
        chain[n++] = r;
    }
    while (n > 0 && ns->depth < 32) {
        int r = chain[--n];
        fprintf(out, "%*srepeat %lld {  # %s%s\n", ns->depth * 2, "", (long long)g->regions[r].count,
                g->regions[r].label, g->regions[r].is_stack ? " (layer stack)" : "");
        ns->stack[ns->depth++] = r;
    }
}

void shard_dump(const shard_prog *p, FILE *out) {
    const graph *g = p->g;
    const fe_setup *s = &p->setup;
    fprintf(out, "# placements on dp %lld x tp %lld x pp %lld x ep %lld%s: R replicated, S(d) split along d, "
                 "P partial sum\n", s->dp, s->tp, s->pp, s->ep, s->sequence_parallel && s->tp > 1 ? ", sequence parallel" : "");
    static const char *const phase[4] = {"# forward (one micro-batch)", "# backward (one micro-batch)",
                                         "# gradient sync (once per step, after the last micro-batch)",
                                         "# after the optimizer step"};
    for (int b = 0; b < 4; b++) {
        int any = 0;
        for (int i = 0; i < p->n_steps; i++) any |= p->steps[i].backward == b;
        if (b >= 2 && !any) continue;
        fprintf(out, "%s\n", phase[b]);
        nest ns = {{0}, 0};
        if (!b)
            for (int t = 0; t < g->n; t++) {
                if (g->nodes[t].op != G_PARAM && g->nodes[t].op != G_INPUT) continue;
                enter(g, &ns, g->nodes[t].region, out);
                fprintf(out, "%*s%%%d %s %s ", ns.depth * 2, "", t, graph_op_name(g->nodes[t].op), g->nodes[t].name);
                put_shape(&g->nodes[t], out);
                fputs("  ", out);
                put_pl(p, p->pl[t], out);
                fputc('\n', out);
            }
        for (int i = 0; i < p->n_steps; i++) {
            const shard_step *st = &p->steps[i];
            if (st->backward != b) continue;
            enter(g, &ns, st->region, out);
            const g_node *n = st->node >= 0 ? &g->nodes[st->node] : NULL;
            fprintf(out, "%*s", ns.depth * 2, "");
            if (st->kind == STEP_COMPUTE) {
                fprintf(out, "%s%%%d = %s(", st->recompute ? "r" : b == 1 ? "d" : "", st->node, graph_op_name(n->op));
                for (int k = 0; k < n->n_in; k++) fprintf(out, "%s%%%d", k ? ", " : "", n->in[k]);
                fputs(") ", out);
                put_shape(n, out);
                fputs("  ", out);
                put_pl(p, p->pl[st->node], out);
                fputc('\n', out);
            } else {
                char e[40];
                fe_commas((long long)st->elems, e, sizeof e);
                fprintf(out, "%s(%s) %s%%%d", shard_step_name(st->kind), axis_names[st->axis],
                        st->recompute ? "r" : b == 1 || b == 2 ? "d" : "", st->node);
                if (st->dim >= 0 && st->kind != STEP_ALL_REDUCE) fprintf(out, " dim %d", st->dim);
                fprintf(out, ", %s elements", e);
                if (st->bucket) fprintf(out, " (bucket %d)", st->bucket);
                fprintf(out, "  # %s\n", st->why ? st->why : "");
            }
        }
        enter(g, &ns, -1, out);
    }
    shard_counts c;
    static const char *const total[4] = {"forward per micro-batch", "backward per micro-batch",
                                         "gradient sync per step", "after the optimizer step"};
    for (int b = 0; b < 4; b++) {
        shard_count(p, b, 0, &c);
        if (b >= 2) {
            int any = 0;
            for (int k = 0; k < 6; k++)
                for (int a = 0; a < SHARD_AXES; a++) any |= c.n[k][a] != 0;
            if (!any) continue;
        }
        fprintf(out, "# %s:", total[b]);
        int any = 0;
        for (int k = STEP_ALL_REDUCE; k <= STEP_ALL_TO_ALL; k++)
            for (int a = 0; a < SHARD_AXES; a++) {
                if (!c.n[k][a]) continue;
                char e[40];
                fe_commas((long long)c.elems[k][a], e, sizeof e);
                fprintf(out, "%s %lld %s(%s) of %s elements", any++ ? "," : "", (long long)c.n[k][a],
                        shard_step_name((shard_step_kind)k), axis_names[a], e);
            }
        fprintf(out, "%s\n", any ? "" : " no collectives");
    }
}

void shard_count(const shard_prog *p, int backward, int in_stack_only, shard_counts *out) {
    memset(out, 0, sizeof *out);
    const graph *g = p->g;
    for (int i = 0; i < p->n_steps; i++) {
        const shard_step *st = &p->steps[i];
        if (st->backward != backward || st->kind == STEP_COMPUTE || st->kind == STEP_SLICE || st->axis < 0) continue;
        /* a bucket's steps are one collective */
        int same_bucket = st->bucket && i > 0 && p->steps[i - 1].bucket == st->bucket;
        int64_t mult = 1, in_stack = 0;
        for (int r = st->region; r >= 0; r = g->regions[r].parent) {
            in_stack |= g->regions[r].is_stack;
            if (!in_stack_only || !g->regions[r].is_stack) mult *= g->regions[r].count;
        }
        if (in_stack_only && !in_stack) continue;
        if (!same_bucket) out->n[st->kind][st->axis] += mult;
        out->elems[st->kind][st->axis] += mult * st->elems;
    }
}
