/* verify.c — symbolic execution of rank programs (see verify.h).
 *
 * State: per rank a program counter and whether it is queued, blocked or
 * done; per group the number of members waiting at its current collective
 * and the first of them (the reference the others must agree with); the
 * posted but unreceived sends in a hash table keyed by (src, dst, tag), each
 * key holding a FIFO of sends. A ready queue holds the ranks that may move.
 * A rank runs until it blocks; a send wakes the receiver it satisfies, the
 * last member of a collective wakes the others. When the queue is empty,
 * every rank is done or the program deadlocks.
 */
#include "verify.h"

#include <stdarg.h> /* va_list */
#include <stdint.h> /* uint64_t */
#include <stdio.h>  /* vsnprintf */
#include <stdlib.h> /* malloc, calloc, free, qsort */
#include <string.h> /* memset */

enum { LIST_MAX = 8 }; /* ranks or sends listed in one message */

/* ---- Messages ------------------------------------------------------- */

typedef struct msgbuf {
    char *buf;
    size_t cap, len;
} msgbuf;

static void say(msgbuf *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends to the message, cutting it at the buffer's end. */
static void say(msgbuf *m, const char *fmt, ...) {
    if (!m->buf || m->cap == 0 || m->len + 1 >= m->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(m->buf + m->len, m->cap - m->len, fmt, ap);
    va_end(ap);
    if (k > 0) m->len += (size_t)k < m->cap - m->len ? (size_t)k : m->cap - m->len - 1;
}

/* "op 3 (all-reduce(tp) of h.3)", or the op's fields when `what` is NULL. */
static void say_op(msgbuf *m, const verify_op *op, int index) {
    if (op->what) {
        say(m, "op %d (%s)", index, op->what);
        return;
    }
    switch (op->kind) {
    case VERIFY_COLL: say(m, "op %d (collective %d on group %d)", index, op->coll, op->group); break;
    case VERIFY_SEND: say(m, "op %d (send to rank %d, tag %d)", index, op->peer, op->tag); break;
    case VERIFY_RECV: say(m, "op %d (recv from rank %d, tag %d)", index, op->peer, op->tag); break;
    default: say(m, "op %d (unknown kind %d)", index, (int)op->kind); break;
    }
}

/* ---- Pending sends: (src, dst, tag) -> FIFO of send op indices ------- */

typedef struct pend {
    int op;   /* index of the send in the sender's program */
    int next; /* next pending send of the same key, -1 at the end */
} pend;

typedef struct slot {
    int src, dst, tag;
    int head, tail; /* into the pend pool; head < 0: slot empty */
} slot;

typedef struct mailbox {
    slot *slots;
    size_t cap, used; /* cap is a power of two */
    pend *pool;
    int n_pool, cap_pool, free_list;
} mailbox;

static size_t key_hash(int src, int dst, int tag) {
    uint64_t h = (uint32_t)src * 0x9E3779B97F4A7C15u;
    h ^= (uint32_t)dst + 0xBF58476D1CE4E5B9u + (h << 6) + (h >> 2);
    h ^= (uint32_t)tag + 0x94D049BB133111EBu + (h << 6) + (h >> 2);
    h ^= h >> 31;
    return (size_t)(h * 0xD6E8FEB86659FD93u >> 17);
}

/* The slot holding the key, or the empty slot where it would go. */
static size_t mb_find(const mailbox *b, int src, int dst, int tag) {
    size_t i = key_hash(src, dst, tag) & (b->cap - 1);
    while (b->slots[i].head >= 0 &&
           (b->slots[i].src != src || b->slots[i].dst != dst || b->slots[i].tag != tag))
        i = (i + 1) & (b->cap - 1);
    return i;
}

static int mb_grow(mailbox *b) {
    size_t cap = b->cap ? b->cap * 2 : 1024;
    slot *old = b->slots;
    size_t old_cap = b->cap;
    b->slots = malloc(cap * sizeof *b->slots);
    if (!b->slots) {
        b->slots = old;
        return -1;
    }
    b->cap = cap;
    for (size_t i = 0; i < cap; i++) b->slots[i].head = -1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].head >= 0) b->slots[mb_find(b, old[i].src, old[i].dst, old[i].tag)] = old[i];
    free(old);
    return 0;
}

static int mb_post(mailbox *b, int src, int dst, int tag, int op) {
    if ((b->used + 1) * 2 > b->cap && mb_grow(b) != 0) return -1;
    int node = b->free_list;
    if (node >= 0) {
        b->free_list = b->pool[node].next;
    } else {
        if (b->n_pool == b->cap_pool) {
            int cap = b->cap_pool ? b->cap_pool * 2 : 1024;
            pend *p = realloc(b->pool, (size_t)cap * sizeof *p);
            if (!p) return -1;
            b->pool = p;
            b->cap_pool = cap;
        }
        node = b->n_pool++;
    }
    b->pool[node] = (pend){op, -1};
    size_t i = mb_find(b, src, dst, tag);
    slot *s = &b->slots[i];
    if (s->head < 0) {
        *s = (slot){src, dst, tag, node, node};
        b->used++;
    } else {
        b->pool[s->tail].next = node;
        s->tail = node;
    }
    return 0;
}

/* Removes slot i, shifting later entries of its probe run back (linear
 * probing needs no tombstones then). */
static void mb_remove(mailbox *b, size_t i) {
    size_t mask = b->cap - 1, j = i;
    b->slots[i].head = -1;
    b->used--;
    for (;;) {
        j = (j + 1) & mask;
        if (b->slots[j].head < 0) return;
        size_t home = key_hash(b->slots[j].src, b->slots[j].dst, b->slots[j].tag) & mask;
        /* Move j into the hole at i unless its home lies in (i, j]. */
        if ((i <= j) ? (i < home && home <= j) : (i < home || home <= j)) continue;
        b->slots[i] = b->slots[j];
        b->slots[j].head = -1;
        i = j;
    }
}

/* Takes the oldest send for the key; returns its op index or -1. */
static int mb_take(mailbox *b, int src, int dst, int tag) {
    if (b->cap == 0) return -1;
    size_t i = mb_find(b, src, dst, tag);
    slot *s = &b->slots[i];
    if (s->head < 0) return -1;
    int node = s->head, op = b->pool[node].op;
    s->head = b->pool[node].next;
    b->pool[node].next = b->free_list;
    b->free_list = node;
    if (s->head < 0) mb_remove(b, i);
    return op;
}

static void mb_free(mailbox *b) {
    free(b->slots);
    free(b->pool);
}

/* ---- The run -------------------------------------------------------- */

enum { R_READY, R_QUEUED, R_BLOCKED, R_DONE };

typedef struct vgroup {
    int *sorted;  /* members, ascending, for membership tests */
    int waiting;  /* members at the current collective */
    int ref;      /* the first of them */
} vgroup;

typedef struct run {
    const verify_program *prog;
    int n_ranks, n_groups;
    const verify_group *groups;
    vgroup *g;
    int *pc, *state;
    int *queue, q_head, q_len; /* ring of n_ranks */
    mailbox box;
    msgbuf m;
} run;

static const verify_op *cur(const run *r, int rank) {
    return &r->prog[rank].ops[r->pc[rank]];
}

static void enqueue(run *r, int rank) {
    r->state[rank] = R_QUEUED;
    r->queue[(r->q_head + r->q_len++) % r->n_ranks] = rank;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int is_member(const vgroup *g, int n, int rank) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (g->sorted[mid] == rank) return 1;
        if (g->sorted[mid] < rank) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

/* Checks the groups and builds their sorted member lists. */
static int setup_groups(run *r) {
    for (int k = 0; k < r->n_groups; k++) {
        const verify_group *vg = &r->groups[k];
        if (vg->n < 1 || !vg->ranks) {
            say(&r->m, "group %d has no members", k);
            return -1;
        }
        r->g[k].sorted = malloc((size_t)vg->n * sizeof(int));
        if (!r->g[k].sorted) {
            say(&r->m, "out of memory");
            return -1;
        }
        memcpy(r->g[k].sorted, vg->ranks, (size_t)vg->n * sizeof(int));
        qsort(r->g[k].sorted, (size_t)vg->n, sizeof(int), cmp_int);
        for (int i = 0; i < vg->n; i++) {
            int x = r->g[k].sorted[i];
            if (x < 0 || x >= r->n_ranks) {
                say(&r->m, "group %d lists rank %d, but there are %d ranks", k, x, r->n_ranks);
                return -1;
            }
            if (i > 0 && x == r->g[k].sorted[i - 1]) {
                say(&r->m, "group %d lists rank %d twice", k, x);
                return -1;
            }
        }
    }
    return 0;
}

static void say_members(msgbuf *m, const verify_group *g) {
    for (int i = 0; i < g->n && i < LIST_MAX; i++) say(m, "%s%d", i ? ", " : "", g->ranks[i]);
    if (g->n > LIST_MAX) say(m, " and %d more", g->n - LIST_MAX);
}

/* A send: post it, and wake its receiver if that is waiting for it. */
static int do_send(run *r, int rank, const verify_op *op) {
    if (mb_post(&r->box, rank, op->peer, op->tag, r->pc[rank]) != 0) {
        say(&r->m, "out of memory");
        return -1;
    }
    int p = op->peer;
    if (r->state[p] == R_BLOCKED) {
        const verify_op *w = cur(r, p);
        if (w->kind == VERIFY_RECV && w->peer == rank && w->tag == op->tag) enqueue(r, p);
    }
    return 0;
}

/* A receive: 1 if it completed, 0 if it waits, -1 on a size mismatch. */
static int do_recv(run *r, int rank, const verify_op *op) {
    int s = mb_take(&r->box, op->peer, rank, op->tag);
    if (s < 0) return 0;
    const verify_op *send = &r->prog[op->peer].ops[s];
    if (send->bytes != op->bytes) {
        say(&r->m, "size mismatch: rank %d ", rank);
        say_op(&r->m, op, r->pc[rank]);
        say(&r->m, " receives %lld bytes from rank %d, but rank %d ", op->bytes, op->peer, op->peer);
        say_op(&r->m, send, s);
        say(&r->m, " sends %lld bytes (tag %d)", send->bytes, op->tag);
        return -1;
    }
    return 1;
}

/* A collective: 1 if this rank was the last to arrive (the others are
 * woken), 0 if it waits, -1 on a disagreement. */
static int do_coll(run *r, int rank, const verify_op *op) {
    vgroup *g = &r->g[op->group];
    const verify_group *vg = &r->groups[op->group];
    if (!is_member(g, vg->n, rank)) {
        say(&r->m, "rank %d enters ", rank);
        say_op(&r->m, op, r->pc[rank]);
        say(&r->m, " on group %d, which it is not a member of (members: ", op->group);
        say_members(&r->m, vg);
        say(&r->m, ")");
        return -1;
    }
    if (g->waiting > 0) {
        const verify_op *ref = cur(r, g->ref);
        if (ref->coll != op->coll || ref->bytes != op->bytes) {
            say(&r->m, "collective mismatch on group %d: rank %d enters ", op->group, rank);
            say_op(&r->m, op, r->pc[rank]);
            say(&r->m, " with %lld bytes while rank %d enters ", op->bytes, g->ref);
            say_op(&r->m, ref, r->pc[g->ref]);
            say(&r->m, " with %lld bytes", ref->bytes);
            if (ref->coll != op->coll) say(&r->m, " (collective types %d and %d)", op->coll, ref->coll);
            return -1;
        }
    } else {
        g->ref = rank;
    }
    if (++g->waiting < vg->n) return 0;
    g->waiting = 0;
    for (int i = 0; i < vg->n; i++) {
        int x = vg->ranks[i];
        if (x == rank) continue;
        r->pc[x]++;
        enqueue(r, x);
    }
    return 1;
}

/* Runs one rank until it blocks or ends. */
static int step_rank(run *r, int rank) {
    const verify_program *p = &r->prog[rank];
    while (r->pc[rank] < p->n) {
        const verify_op *op = cur(r, rank);
        int rc = 1;
        if ((op->kind == VERIFY_SEND || op->kind == VERIFY_RECV) && (op->peer < 0 || op->peer >= r->n_ranks)) {
            say(&r->m, "rank %d ", rank);
            say_op(&r->m, op, r->pc[rank]);
            say(&r->m, " names rank %d, but there are %d ranks", op->peer, r->n_ranks);
            return -1;
        }
        if (op->kind == VERIFY_COLL && (op->group < 0 || op->group >= r->n_groups)) {
            say(&r->m, "rank %d ", rank);
            say_op(&r->m, op, r->pc[rank]);
            say(&r->m, " names group %d, but there are %d groups", op->group, r->n_groups);
            return -1;
        }
        switch (op->kind) {
        case VERIFY_SEND: rc = do_send(r, rank, op) == 0 ? 1 : -1; break;
        case VERIFY_RECV: rc = do_recv(r, rank, op); break;
        case VERIFY_COLL: rc = do_coll(r, rank, op); break;
        default:
            say(&r->m, "rank %d op %d has unknown kind %d", rank, r->pc[rank], (int)op->kind);
            return -1;
        }
        if (rc < 0) return -1;
        if (rc == 0) {
            r->state[rank] = R_BLOCKED;
            return 0;
        }
        r->pc[rank]++;
    }
    r->state[rank] = R_DONE;
    return 0;
}

/* What a blocked rank waits for, for the deadlock message. */
static void say_wait(run *r, int rank) {
    const verify_op *op = cur(r, rank);
    say(&r->m, "\n  rank %d at ", rank);
    say_op(&r->m, op, r->pc[rank]);
    if (op->kind == VERIFY_RECV) {
        say(&r->m, ": waits for a send from rank %d with tag %d", op->peer, op->tag);
        if (r->state[op->peer] == R_DONE) say(&r->m, " (rank %d has finished)", op->peer);
        return;
    }
    const verify_group *vg = &r->groups[op->group];
    int missing = 0, shown = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) say(&r->m, ": waits in group %d for", op->group);
        for (int i = 0; i < vg->n; i++) {
            int x = vg->ranks[i];
            const verify_op *w = r->state[x] == R_BLOCKED ? cur(r, x) : NULL;
            if (w && w->kind == VERIFY_COLL && w->group == op->group) continue; /* arrived */
            if (pass == 0) {
                missing++;
            } else if (shown < 3) {
                say(&r->m, "%s%d%s", shown ? ", " : missing == 1 ? " rank " : " ranks ", x,
                    r->state[x] == R_DONE ? " (finished)" : "");
                shown++;
            }
        }
    }
    if (missing > shown) say(&r->m, " and %d more", missing - shown);
}

static void say_deadlock(run *r) {
    int blocked = 0, shown = 0;
    for (int i = 0; i < r->n_ranks; i++) blocked += r->state[i] == R_BLOCKED;
    say(&r->m, "deadlock: %d of %d ranks blocked, none can proceed:", blocked, r->n_ranks);
    for (int i = 0; i < r->n_ranks && shown < LIST_MAX; i++)
        if (r->state[i] == R_BLOCKED) {
            say_wait(r, i);
            shown++;
        }
    if (blocked > shown) say(&r->m, "\n  and %d more", blocked - shown);
}

typedef struct lost {
    int src, op;
} lost;

static int cmp_lost(const void *a, const void *b) {
    const lost *x = a, *y = b;
    if (x->src != y->src) return (x->src > y->src) - (x->src < y->src);
    return (x->op > y->op) - (x->op < y->op);
}

/* Sends still pending at the end, in rank and program order. */
static int say_unreceived(run *r) {
    mailbox *b = &r->box;
    size_t n = 0, k = 0;
    for (size_t i = 0; i < b->cap; i++)
        if (b->slots[i].head >= 0)
            for (int x = b->slots[i].head; x >= 0; x = b->pool[x].next) n++;
    if (n == 0) return 0;
    lost *l = malloc(n * sizeof *l);
    if (!l) {
        say(&r->m, "%zu sends are never received (out of memory listing them)", n);
        return -1;
    }
    for (size_t i = 0; i < b->cap; i++)
        if (b->slots[i].head >= 0)
            for (int x = b->slots[i].head; x >= 0; x = b->pool[x].next) l[k++] = (lost){b->slots[i].src, b->pool[x].op};
    qsort(l, n, sizeof *l, cmp_lost);
    say(&r->m, "%zu send%s never received:", n, n == 1 ? " is" : "s are");
    for (size_t i = 0; i < n && i < LIST_MAX; i++) {
        const verify_op *op = &r->prog[l[i].src].ops[l[i].op];
        say(&r->m, "\n  rank %d ", l[i].src);
        say_op(&r->m, op, l[i].op);
        say(&r->m, ": %lld bytes to rank %d with tag %d", op->bytes, op->peer, op->tag);
    }
    if (n > LIST_MAX) say(&r->m, "\n  and %zu more", n - LIST_MAX);
    free(l);
    return -1;
}

static int execute(run *r) {
    for (int i = 0; i < r->n_ranks; i++) enqueue(r, i);
    while (r->q_len > 0) {
        int rank = r->queue[r->q_head];
        r->q_head = (r->q_head + 1) % r->n_ranks;
        r->q_len--;
        if (step_rank(r, rank) != 0) return -1;
    }
    for (int i = 0; i < r->n_ranks; i++)
        if (r->state[i] != R_DONE) {
            say_deadlock(r);
            return -1;
        }
    return say_unreceived(r);
}

int verify_run(const verify_program *ranks, int n_ranks, const verify_group *groups, int n_groups,
               char *msg, size_t msg_len) {
    run r;
    memset(&r, 0, sizeof r);
    r.m = (msgbuf){msg, msg_len, 0};
    r.box.free_list = -1;
    if (msg && msg_len) msg[0] = '\0';
    if (n_ranks < 0 || n_groups < 0 || (n_ranks > 0 && !ranks) || (n_groups > 0 && !groups)) {
        say(&r.m, "verify: bad arguments (%d ranks, %d groups)", n_ranks, n_groups);
        return -1;
    }
    if (n_ranks == 0) return 0;
    for (int i = 0; i < n_ranks; i++)
        if (ranks[i].n < 0 || (ranks[i].n > 0 && !ranks[i].ops)) {
            say(&r.m, "rank %d has a bad program (%d ops)", i, ranks[i].n);
            return -1;
        }
    r.prog = ranks;
    r.n_ranks = n_ranks;
    r.groups = groups;
    r.n_groups = n_groups;
    r.g = calloc((size_t)n_groups + 1, sizeof *r.g);
    r.pc = calloc((size_t)n_ranks, sizeof *r.pc);
    r.state = calloc((size_t)n_ranks, sizeof *r.state);
    r.queue = calloc((size_t)n_ranks, sizeof *r.queue);
    int rc = -1;
    if (!r.g || !r.pc || !r.state || !r.queue || mb_grow(&r.box) != 0) {
        say(&r.m, "out of memory");
        goto done;
    }
    if (setup_groups(&r) == 0) rc = execute(&r);
done:
    if (r.g)
        for (int k = 0; k < n_groups; k++) free(r.g[k].sorted);
    free(r.g);
    free(r.pc);
    free(r.state);
    free(r.queue);
    mb_free(&r.box);
    return rc;
}

/* ---- Pipeline schedules --------------------------------------------- */

enum { WHAT_LEN = 128 };

int verify_sched(const sched *s, char *msg, size_t msg_len) {
    msgbuf m = {msg, msg_len, 0};
    if (msg && msg_len) msg[0] = '\0';
    if (!s || !s->stages || s->pp < 1) {
        say(&m, "verify: no schedule");
        return -1;
    }
    long long n_chunks = (long long)s->pp * s->v, total = 0;
    if (2 * (long long)s->m * n_chunks > 0x7fffffff) {
        say(&m, "verify: schedule too large for p2p tags");
        return -1;
    }
    for (int st = 0; st < s->pp; st++) total += s->stages[st].n_units;
    verify_program *prog = calloc((size_t)s->pp, sizeof *prog);
    verify_op *ops = malloc((size_t)(total ? total : 1) * sizeof *ops);
    char *what = malloc((size_t)(total ? total : 1) * WHAT_LEN);
    int rc = -1;
    if (!prog || !ops || !what) {
        say(&m, "out of memory");
        goto done;
    }
    long long k = 0;
    for (int st = 0; st < s->pp; st++) {
        prog[st].ops = ops + k;
        for (int i = 0; i < s->stages[st].n_units; i++) {
            const sched_unit *u = &s->stages[st].units[i];
            int grad = u->op == SCHED_SEND_GRAD || u->op == SCHED_RECV_GRAD;
            int send = u->op == SCHED_SEND_ACT || u->op == SCHED_SEND_GRAD;
            if (u->op == SCHED_FWD || u->op == SCHED_BWD) continue;
            /* The consuming chunk: activations flow up, gradients down. */
            long long c = u->chunk + (send ? (grad ? -1 : 1) : 0);
            char *w = what + k * WHAT_LEN, unit[48];
            sched_unit_str(u, unit, sizeof unit);
            snprintf(w, WHAT_LEN, "%s %s micro %d chunk %d %s stage %d, %s", send ? "send" : "recv",
                     grad ? "grad" : "act", u->micro, u->chunk, send ? "to" : "from", u->peer, unit);
            ops[k++] = (verify_op){send ? VERIFY_SEND : VERIFY_RECV, -1, 0, 1, u->peer,
                                   (int)(2 * ((long long)u->micro * n_chunks + c) + grad), w};
            prog[st].n++;
        }
    }
    rc = verify_run(prog, s->pp, NULL, 0, msg, msg_len);
done:
    free(prog);
    free(ops);
    free(what);
    return rc;
}
