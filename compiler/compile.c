/* compile.c — the compiler's stages after the checks (compile.h). */
#include "compile.h"

#include <errno.h>  /* errno */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc */
#include <string.h> /* memset, strerror */

#include "memplan.h"
#include "plan.h"
#include "ranks.h"
#include "stats.h"

/* Splits the layer stack over the pp x v pipeline chunks: as written in
 * train.stage_layers; equally (the checker made sure it divides); or, with
 * stage_layers = balanced, so that the costliest chunk is as cheap as
 * possible, counting the work before the stack (embedding) on the first
 * chunk and after it (LM head, loss) on the last. */
static int assign_layers(compiled *c) {
    const graph *g = c->prog.g;
    int chunks = c->sc.pp * c->sc.v;
    long long total = 0;
    for (int r = 0; r < g->n_regions; r++)
        if (g->regions[r].is_stack) total = g->regions[r].count;
    long long *n = calloc((size_t)chunks, sizeof *n);
    if (!n) return -1;
    c->sc.chunk_layers = n;
    if (total == 0) return 0;
    if (c->setup.stage_mode == 2) {
        for (int i = 0; i < chunks; i++) n[i] = c->setup.stage_layers[i];
        return 0;
    }
    if (c->setup.stage_mode != 1 || chunks == 1) {
        for (int i = 0; i < chunks; i++) n[i] = total / chunks;
        return 0;
    }
    double pre, layer, post;
    stats_stack_costs(&c->prog, &pre, &layer, &post);
    if (layer <= 0) layer = 1;
    /* every chunk one layer, then each further layer to the cheapest chunk */
    for (int i = 0; i < chunks; i++) n[i] = 1;
    for (long long k = chunks; k < total; k++) {
        int best = 0;
        double best_cost = 0;
        for (int i = 0; i < chunks; i++) {
            double cost = (double)(n[i] + 1) * layer + (i == 0 ? pre : 0) + (i == chunks - 1 ? post : 0);
            if (i == 0 || cost < best_cost) { best = i; best_cost = cost; }
        }
        n[best]++;
    }
    return 0;
}

/* What each of the rank programs' operations carries, from the plan
 * these settings make (the runtime counts the same, memplan.h): *bytes
 * (per step, freed by the caller) and *sz. 0, or -1 with the reason in
 * err (out of memory, or a plan that cannot be made). */
static int plan_sizes(const compiled *c, const graph *g, ranks_sizes *sz, signed char **bytes, char *err,
                      size_t n) {
    plan pl;
    *bytes = NULL;
    if (plan_from(&pl, "", &c->setup, g, &c->prog, &c->sc) != 0) {
        snprintf(err, n, "%s", pl.error);
        plan_free(&pl);
        return -1;
    }
    *bytes = malloc((size_t)(pl.n_steps > 0 ? pl.n_steps : 1));
    if (*bytes) {
        for (int i = 0; i < pl.n_steps; i++) (*bytes)[i] = (signed char)memplan_step_elem_bytes(&pl, i);
        sz->elem_bytes = *bytes;
        sz->act_bytes = 0;
        for (int r = 0; r < pl.n_regions; r++)
            if (pl.regions[r].is_stack) {
                for (int k = 0; k < pl.regions[r].n_carry; k++)
                    sz->act_bytes += memplan_value_bytes(&pl, pl.regions[r].carry[k].exit);
                break;
            }
    } else {
        snprintf(err, n, "out of memory");
    }
    plan_free(&pl);
    return *bytes ? 0 : -1;
}

fe_status compile_run(fe *f, compiled *c, int run_check) {
    memset(c, 0, sizeof *c);
    c->setup = fe_get_setup(f);
    const graph *g = fe_graph(f);
    if (shard_build(g, &c->setup, &c->prog) != 0) {
        fe_error_at(f, c->prog.error_node >= 0 ? g->nodes[c->prog.error_node].where : LOC_NONE, c->prog.error);
        return FE_ERRORS;
    }
    c->have_prog = 1;
    if (c->setup.micro_batches > COMPILE_MAX_MICRO_BATCHES || c->setup.pp * c->setup.virtual_stages > COMPILE_MAX_CHUNKS) {
        char msg[256];
        snprintf(msg, sizeof msg, "the pipeline schedule is too large to build: %lld micro-batches per step (at "
                 "most %d) and %lld pipeline chunks (at most %d)", c->setup.micro_batches, COMPILE_MAX_MICRO_BATCHES,
                 c->setup.pp * c->setup.virtual_stages, COMPILE_MAX_CHUNKS);
        fe_error_at(f, LOC_NONE, msg);
        return FE_ERRORS;
    }
    static const sched_kind kinds[] = {SCHED_KIND_GPIPE, SCHED_KIND_1F1B, SCHED_KIND_INTERLEAVED};
    char err[512];
    if (sched_build(&c->sc, kinds[c->setup.schedule], (int)c->setup.pp, (int)c->setup.micro_batches,
                    c->setup.schedule == 2 ? c->setup.virtual_stages : 1, err, sizeof err) != 0) {
        fe_error_at(f, LOC_NONE, err);
        return FE_ERRORS;
    }
    c->have_sched = 1;
    if (assign_layers(c) < 0) return FE_NOMEM;
    if (!run_check) return FE_OK;
    fe_status st = FE_OK;
    ranks_sizes sz;
    signed char *bytes;
    if (plan_sizes(c, g, &sz, &bytes, err, sizeof err) != 0) {
        fe_error_at(f, LOC_NONE, err);
        return FE_ERRORS;
    }
    int built = ranks_build(&c->ranks, &c->prog, &c->sc, &sz, err, sizeof err);
    free(bytes);
    c->have_ranks = 1;
    if (built == -2) {
        /* too large to simulate rank by rank: said on the check line */
        snprintf(c->skipped, sizeof c->skipped, "%s", err);
        return FE_OK;
    }
    if (built != 0 || ranks_check(&c->ranks, err, sizeof err) != 0) {
        char msg[640];
        snprintf(msg, sizeof msg, "the plan fails the static check: %s", err);
        fe_error_at(f, LOC_NONE, msg);
        st = FE_ERRORS;
    }
    c->colls = c->ranks.n_coll;
    c->p2p = c->ranks.n_p2p;
    return st;
}

fe_status compile_cost(fe *f, compiled *c, FILE *print, long long limit) {
    stats s;
    if (stats_build(&s, &c->prog, &c->sc) != 0) return FE_NOMEM;
    if (print) stats_print(&s, &c->prog, &c->sc, c->have_ranks && !c->skipped[0] ? &c->ranks : NULL, print);
    fe_status st = FE_OK;
    loc at = LOC_NONE;
    if (limit <= 0 && c->setup.memory_limit > 0) {
        limit = c->setup.memory_limit;
        at = c->setup.memory_limit_at;
    }
    for (int i = 0; limit > 0 && i < s.pp; i++) {
        const stats_stage *x = &s.stage[i];
        if (x->total <= limit) continue;
        char msg[512];
        long long per = c->setup.world / c->setup.pp;
        snprintf(msg, sizeof msg, "pipeline stage %d (ranks %lld to %lld) needs %.2f GiB per rank, over the memory "
                 "limit of %.2f GiB: params %.2f, gradients %.2f, optimizer %.2f, activations %.2f GiB", i,
                 i * per, (i + 1) * per - 1, (double)x->total / 1073741824.0, (double)limit / 1073741824.0,
                 (double)x->params / 1073741824.0, (double)x->grads / 1073741824.0,
                 (double)x->optim / 1073741824.0, (double)x->activations / 1073741824.0);
        fe_error_at(f, at, msg);
        st = FE_ERRORS;
    }
    stats_free(&s);
    return st;
}

void compile_free(compiled *c) {
    if (c->have_ranks) ranks_free(&c->ranks);
    if (c->have_prog) shard_free(&c->prog);
    if (c->have_sched) sched_free(&c->sc);
}

void compile_print_check(const compiled *c, FILE *out) {
    if (c->skipped[0]) {
        fprintf(out, "  check:    not run: %s\n", c->skipped);
        return;
    }
    char a[32], b[32];
    fe_commas(c->colls, a, sizeof a);
    fe_commas(c->p2p, b, sizeof b);
    fprintf(out, "  check:    every rank's step simulated (%lld rank%s, %s collective calls, %s sends and receives): "
           "no deadlock, every collective matched\n", c->setup.world, c->setup.world == 1 ? "" : "s", a, b);
}


fe_status compile_dump_memory(fe *f, const compiled *c, FILE *out) {
    plan pl;
    if (plan_from(&pl, "", &c->setup, fe_graph(f), &c->prog, &c->sc) != 0) {
        fe_error_at(f, LOC_NONE, pl.error);
        plan_free(&pl);
        return FE_ERRORS;
    }
    memplan mp;
    fe_status st = memplan_build(&mp, &pl, 0, 0) == 0 ? FE_OK : FE_NOMEM;
    if (st == FE_OK) memplan_dump(&mp, &pl, out);
    memplan_free(&mp);
    plan_free(&pl);
    return st;
}

/* The default plan path: FILE.mesh -> FILE.plan, next to it. */
static void default_path(const char *source, char *buf, size_t n) {
    size_t len = strlen(source);
    if (len > 5 && strcmp(source + len - 5, ".mesh") == 0) len -= 5;
    snprintf(buf, n, "%.*s.plan", (int)len, source);
}

fe_status compile_write_plan(fe *f, const compiled *c, const char *source, const char *path, FILE *to,
                             char *written, size_t written_len) {
    plan pl;
    if (plan_from(&pl, source, &c->setup, fe_graph(f), &c->prog, &c->sc) != 0) {
        fe_error_at(f, LOC_NONE, pl.error);
        plan_free(&pl);
        return FE_ERRORS;
    }
    /* the bytes each stage's ranks send, from the checked rank programs */
    if (c->have_ranks && !c->skipped[0] && plan_set_traffic(&pl, &c->ranks) != 0) {
        plan_free(&pl);
        return FE_NOMEM;
    }
    char err[9000], tmp[4200], dest[4096];
    fe_status st = FE_OK;
    if (to) {
        if (plan_write(&pl, to, err, sizeof err) != 0) {
            fe_error_at(f, LOC_NONE, err);
            st = FE_ERRORS;
        }
        plan_free(&pl);
        return st;
    }
    if (path) snprintf(dest, sizeof dest, "%s", path);
    else default_path(source, dest, sizeof dest);
    /* written whole to a temporary name, then renamed: a reader never sees
     * half a plan, and a failed compile leaves the old plan in place */
    snprintf(tmp, sizeof tmp, "%s.tmp", dest);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        snprintf(err, sizeof err, "cannot write the plan to '%s': %s", tmp, strerror(errno));
        fe_error_at(f, LOC_NONE, err);
        plan_free(&pl);
        return FE_ERRORS;
    }
    int rc = plan_write(&pl, out, err, sizeof err);
    long size = rc == 0 ? ftell(out) : -1;
    if (fclose(out) != 0 && rc == 0) {
        rc = -1;
        snprintf(err, sizeof err, "cannot write the plan to '%s': %s", tmp, strerror(errno));
    }
    if (rc == 0 && rename(tmp, dest) != 0) {
        rc = -1;
        snprintf(err, sizeof err, "cannot rename '%s' to '%s': %s", tmp, dest, strerror(errno));
    }
    if (rc != 0) {
        remove(tmp);
        fe_error_at(f, LOC_NONE, err);
        st = FE_ERRORS;
    } else if (written) {
        snprintf(written, written_len, "%s (%ld bytes)", dest, size);
    }
    plan_free(&pl);
    return st;
}
