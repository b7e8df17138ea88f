/* comm_async.c — a queue of collectives run in order by a thread of its
 * own, over its own copy of the group (comm_async.h). */
#include "comm_async.h"

#include <pthread.h> /* pthread_*, the queue's thread, mutex and condition */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* calloc, malloc, free */
#include <string.h>  /* strcmp */
#include <time.h>    /* clock_gettime: a deferred queue's pauses between looks */

typedef enum {
    A_ALL_REDUCE,
    A_REDUCE_SCATTER,
    A_ALL_GATHER,
    A_ALL_REDUCE_V,
    A_REDUCE_SCATTER_V,
    A_ALL_GATHER_V
} acall_kind;

typedef struct acall {
    acall_kind kind;
    const float *in;
    float *out;
    size_t n;
    float **bufs; /* _v: the queue's copies of the caller's arrays (one allocation, freed once run) */
    size_t *ns;
    int k;
    int elements; /* the float elements it counts (comm_async_set_elements), -1: the communicator's */
} acall;

struct comm_async {
    comm *c; /* the queue's own: a split of the caller's group */
    comm_async_hooks hooks;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a call queued, one done, the end */
    acall *q;          /* calls [done, issued) wait at q[k % cap] */
    long cap, issued, done;
    double busy; /* seconds the calls have run, in all */
    int inflight;     /* deferred: work enqueued that is not known to be done */
    double busy_from; /* deferred: when that work began */
    double delay; /* comm_async_set_delay */
    int elements; /* the calls issued from now on: comm_async_set_elements (-1: none set) */
    int failed, stop;
    char error[sizeof ((comm *)0)->error];
};

/* Runs call `ticket` between its wait and ran hooks; 0, or -1 with the
 * reason in err. */
static int run_call(comm_async *a, const acall *k, long ticket, char *err, size_t n)
{
    const comm_async_hooks *h = &a->hooks;
    if (h->wait && h->wait(h->ud, ticket, a->c, err, n) != 0) return -1;
    if (k->elements >= 0 && comm_set_elements(a->c, k->elements) != 0) {
        snprintf(err, n, "a communication queue: its group cannot count elements of type %d", k->elements);
        return -1;
    }
    int rc = k->kind == A_ALL_REDUCE       ? comm_all_reduce(a->c, k->out, k->n)
           : k->kind == A_REDUCE_SCATTER   ? comm_reduce_scatter(a->c, k->in, k->out, k->n)
           : k->kind == A_ALL_GATHER       ? comm_all_gather(a->c, k->in, k->out, k->n)
           : k->kind == A_ALL_REDUCE_V     ? comm_all_reduce_v(a->c, k->bufs, k->ns, k->k)
           : k->kind == A_REDUCE_SCATTER_V ? comm_reduce_scatter_v(a->c, k->bufs, k->ns, k->k)
                                           : comm_all_gather_v(a->c, k->bufs, k->ns, k->k);
    if (rc != 0) {
        snprintf(err, n, "%s", a->c->error);
        return -1;
    }
    return h->ran ? h->ran(h->ud, ticket, a->c, err, n) : 0;
}

/* Marks the queue failed with why (under its lock). */
static void fail_locked(comm_async *a, const char *why)
{
    if (a->failed) return;
    a->failed = 1;
    snprintf(a->error, sizeof a->error, "%s", why);
}

/* Deferred, with work in flight and no call to run: one look at the work
 * (comm_nccl_progress; idle_s: how long there has been nothing else to
 * do), then, unless it is done, a pause that a new call ends. Under the
 * lock, dropped for the look. */
static void watch_in_flight(comm_async *a, double idle_s, int *looks)
{
    char err[sizeof a->error] = "";
    pthread_mutex_unlock(&a->mu);
    int st = comm_nccl_progress(a->c, idle_s);
    if (st < 0) snprintf(err, sizeof err, "%s", a->c->error);
    pthread_mutex_lock(&a->mu);
    if (st <= 0) { /* done, or failed (the world aborted: the work ended) */
        a->busy += comm_now() - a->busy_from;
        a->inflight = 0;
        if (st < 0) fail_locked(a, err);
        pthread_cond_broadcast(&a->cv);
        return;
    }
    if (++*looks < 16) return; /* (a sum often ends within microseconds) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100000; /* nothing waits for these looks but errors and the end: 0.1 ms apart */
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    if (a->done == a->issued) pthread_cond_timedwait(&a->cv, &a->mu, &ts);
}

static void *progress(void *arg)
{
    comm_async *a = arg;
    double idle_from = 0; /* deferred: since when only work in flight is left to watch */
    int looks = 0;
    comm_nccl_thread_on_gpu(a->c); /* (before any rank's kernel could fault) */
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (a->done == a->issued && !a->stop && !a->inflight) pthread_cond_wait(&a->cv, &a->mu);
        if (a->done == a->issued) {
            if (!a->inflight) break; /* stopped, nothing left */
            watch_in_flight(a, comm_now() - idle_from, &looks);
            continue;
        }
        acall k = a->q[a->done % a->cap];
        long ticket = a->done + 1;
        int failed = a->failed;
        double delay = a->delay;
        pthread_mutex_unlock(&a->mu);
        if (delay > 0) comm_sleep(delay);
        char err[sizeof a->error] = "";
        double t0 = comm_now();
        int rc = failed ? -1 : run_call(a, &k, ticket, err, sizeof err); /* after a failure the rest are dropped */
        double ran = comm_now() - t0;
        free(k.bufs);
        pthread_mutex_lock(&a->mu);
        if (!a->hooks.deferred) a->busy += ran;
        else if (rc == 0 && !a->inflight) a->inflight = 1, a->busy_from = t0;
        idle_from = comm_now();
        looks = 0;
        if (rc != 0 && !a->failed) {
            a->failed = 1;
            snprintf(a->error, sizeof a->error, "%s", err);
        }
        a->done++;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int comm_async_supported(const comm *c)
{
    const char *b = comm_checked_inner(c)->v->name; /* a checked one: its inner's */
    return !strcmp(b, "threads") || !strcmp(b, "tcp") || (!strcmp(b, "mpi") && comm_mpi_thread_multiple()) ||
           !strcmp(b, "nccl");
}

int comm_async_new(comm *c, const comm_async_hooks *hooks, comm_async **out)
{
    *out = NULL;
    comm_async *a = calloc(1, sizeof *a);
    int ok = a != NULL;
    if (a) a->elements = -1;
    comm *own = NULL;
    /* collective over c: every member splits, even one that is out of memory */
    if (comm_split(c, ok ? 0 : -1, c->rank, &own) != 0) {
        free(a);
        return -1;
    }
    if (!ok || !own) {
        comm_free(own);
        free(a);
        return comm_fail(c, "a communication queue", "out of memory");
    }
    /* NCCL: a world of its own, for the queue's thread; deferred, its calls return once enqueued */
    if (comm_nccl_own_thread(own) != 0 ||
        (hooks && hooks->deferred && !strcmp(own->v->name, "nccl") && comm_nccl_defer(own) != 0)) {
        comm_fail(c, "a communication queue", "%s", own->error);
        comm_free(own);
        free(a);
        return -1;
    }
    a->c = own;
    if (hooks) a->hooks = *hooks;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, progress, a) != 0) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        comm_free(own);
        free(a);
        return comm_fail(c, "a communication queue", "no thread for it");
    }
    *out = a;
    return 0;
}

static long issue(comm_async *a, acall k)
{
    const comm_async_hooks *h = &a->hooks;
    char err[sizeof a->error];
    long t = -1;
    k.elements = a->elements; /* (this thread sets it) */
    pthread_mutex_lock(&a->mu);
    /* a ring of marks: call issued + 1 - marks has run before its slot is marked again */
    while (h->marks > 0 && !a->failed && a->issued - a->done >= h->marks) pthread_cond_wait(&a->cv, &a->mu);
    if (a->failed) goto out;
    if (h->mark) { /* in this thread; the queue's runs only calls issued, so not this one yet */
        pthread_mutex_unlock(&a->mu);
        err[0] = '\0';
        int rc = h->mark(h->ud, a->issued + 1, err, sizeof err);
        pthread_mutex_lock(&a->mu);
        if (rc != 0) {
            fail_locked(a, err);
            goto out;
        }
    }
    if (a->issued - a->done == a->cap) { /* full: grow, keeping the pending calls in order */
        long cap = a->cap ? 2 * a->cap : 64;
        acall *q = malloc((size_t)cap * sizeof *q);
        if (!q) {
            snprintf(err, sizeof err, "a communication queue over %d ranks: out of memory", a->c->size);
            fail_locked(a, err);
            goto out;
        }
        for (long i = a->done; i < a->issued; i++) q[i % cap] = a->q[i % a->cap];
        free(a->q);
        a->q = q;
        a->cap = cap;
    }
    a->q[a->issued % a->cap] = k;
    t = ++a->issued;
    pthread_cond_broadcast(&a->cv);
out:
    pthread_mutex_unlock(&a->mu);
    return t;
}

long comm_async_all_reduce(comm_async *a, float *buf, size_t n)
{
    return issue(a, (acall){A_ALL_REDUCE, buf, buf, n, NULL, NULL, 0, -1});
}

long comm_async_reduce_scatter(comm_async *a, const float *in, float *out, size_t n)
{
    return issue(a, (acall){A_REDUCE_SCATTER, in, out, n, NULL, NULL, 0, -1});
}

long comm_async_all_gather(comm_async *a, const float *in, float *out, size_t n)
{
    return issue(a, (acall){A_ALL_GATHER, in, out, n, NULL, NULL, 0, -1});
}

static long issue_v(comm_async *a, acall_kind kind, float *const *bufs, const size_t *n, int k)
{
    /* the arrays copied, in one block: pointers, then sizes */
    void *block = malloc((size_t)k * (sizeof(float *) + sizeof(size_t)) + 1);
    if (!block) {
        char why[96];
        snprintf(why, sizeof why, "a communication queue over %d ranks: out of memory", a->c->size);
        pthread_mutex_lock(&a->mu);
        fail_locked(a, why);
        pthread_mutex_unlock(&a->mu);
        return -1;
    }
    float **b = block;
    size_t *ns = (size_t *)(void *)(b + k);
    for (int i = 0; i < k; i++) b[i] = bufs[i], ns[i] = n[i];
    long t = issue(a, (acall){kind, NULL, NULL, 0, b, ns, k, -1});
    if (t < 0) free(block);
    return t;
}

long comm_async_all_reduce_v(comm_async *a, float *const *bufs, const size_t *n, int k)
{
    return issue_v(a, A_ALL_REDUCE_V, bufs, n, k);
}

long comm_async_reduce_scatter_v(comm_async *a, float *const *bufs, const size_t *n, int k)
{
    return issue_v(a, A_REDUCE_SCATTER_V, bufs, n, k);
}

long comm_async_all_gather_v(comm_async *a, float *const *bufs, const size_t *n, int k)
{
    return issue_v(a, A_ALL_GATHER_V, bufs, n, k);
}

int comm_async_wait(comm_async *a, long ticket)
{
    const comm_async_hooks *h = &a->hooks;
    pthread_mutex_lock(&a->mu);
    while (a->done < ticket && a->done < a->issued) pthread_cond_wait(&a->cv, &a->mu);
    int rc = a->failed ? -1 : 0;
    long last = ticket < a->done ? ticket : a->done; /* the latest call waited for */
    pthread_mutex_unlock(&a->mu);
    if (rc != 0 || last < 1 || !h->joined) return rc;
    char err[sizeof a->error] = "";
    if (h->joined(h->ud, last, err, sizeof err) == 0) return 0;
    pthread_mutex_lock(&a->mu);
    fail_locked(a, err);
    pthread_mutex_unlock(&a->mu);
    return -1;
}

int comm_async_wait_all(comm_async *a) { return comm_async_wait(a, comm_async_last(a)); }

void comm_async_set_elements(comm_async *a, int type) { a->elements = type; }

void comm_async_set_delay(comm_async *a, double seconds)
{
    pthread_mutex_lock(&a->mu);
    a->delay = seconds;
    pthread_mutex_unlock(&a->mu);
}

/* The queue's counters, read under its lock: calls issued, and not yet
 * run (deferred: + 1 while work is in flight); seconds busy. */
static void counters(const comm_async *a, long *issued, long *pending, double *busy)
{
    comm_async *m = (comm_async *)a; /* the lock only */
    pthread_mutex_lock(&m->mu);
    *issued = a->issued;
    *pending = a->issued - a->done + a->inflight;
    *busy = a->busy;
    pthread_mutex_unlock(&m->mu);
}

long comm_async_last(const comm_async *a)
{
    long issued, pending;
    double busy;
    counters(a, &issued, &pending, &busy);
    return issued;
}

long comm_async_pending(const comm_async *a)
{
    long issued, pending;
    double busy;
    counters(a, &issued, &pending, &busy);
    return pending;
}

void comm_async_abort(comm_async *a, const char *why) { comm_abort(a->c, why); }

const char *comm_async_error(const comm_async *a) { return a->error; }

int comm_async_own_device(comm_async *a, struct dev *d)
{
    if (comm_checked_restage(a->c, d) == 0) return 0;
    snprintf(a->error, sizeof a->error, "%s", a->c->error);
    return -1;
}

double comm_async_busy(const comm_async *a)
{
    long issued, pending;
    double busy;
    counters(a, &issued, &pending, &busy);
    return busy;
}

void comm_async_free(comm_async *a)
{
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL); /* (it ran, or dropped, every call queued) */
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    comm_free(a->c);
    free(a->q);
    free(a);
}
