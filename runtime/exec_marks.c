/* exec_marks.c — a communication queue's marks (ex_marks, exec_impl.h):
 * the comm_async hooks that order the queue's calls after the compute
 * stream's kernels and the compute stream after the calls
 * (exec_overlap.c issues the calls), and on a GPU the times of both,
 * measured there.
 *
 * As a call is queued, an event of the ring ev[] marks the compute
 * stream's work so far (mark). On the CPU, or a GPU whose NCCL calls are
 * not ordered on its streams, the queue's thread waits for it on the host
 * (wait_mark) before the call, and the rank's wait for a ticket is the
 * host's. Deferred (the rank's NCCL calls ordered on the compute stream:
 * ex->ordered), no thread waits for the GPU: the queue's stream waits for
 * the mark, the queue's thread records a done event after the call once
 * NCCL has enqueued it (ran), and the rank's wait for a ticket ends with
 * the compute stream made to wait for that event (joined).
 *
 * Deferred, the GPU's own times, from timed events in rings of EX_TIMES:
 * each call's time on the queue's stream (start, once its wait for the
 * mark is over, to end) and each of the compute stream's waits for a call
 * (pre and post, around it), added in (harvested) once the GPU has
 * finished them, never waited for; a call or a wait that finds its ring
 * full goes untimed. They are mesh_step_stats' overlap_ms and wait_ms on
 * a GPU (exec__overlap_times). Test: parallel_cuda_overlap_timed_on_the_gpu.
 *
 * Each call's time is also kept by its entry of mesh_context_sent's table
 * (mesh_context_overlap_ms): the entry exec__queue_entry names as the call
 * is issued goes with its ticket (mark), then with its timed slot
 * (deferred), else the host's time from the end of its wait for the mark
 * to its end (ran). Test: parallel_comm_timed_in_turn.
 */
#include "exec_impl.h"

#include <pthread.h> /* pthread_mutex_* */
#include <stdio.h>   /* snprintf */

/* comm_async's hooks (ud: the queue's ex_marks). As a call is queued: its
 * slot's event marks the compute stream's work so far. */
static int mark(void *ud, long ticket, char *err, size_t n)
{
    ex_marks *m = ud;
    mesh__exec *ex = m->ex;
    m->entry[ticket % EX_MARKS] = m->next_entry; /* (read by the queue's thread once the call is queued) */
    m->next_entry = EX_ENTRIES;
    if (dev_event_record(ex->dev, m->ev[ticket % EX_MARKS], (dev_stream *)ex->kern.stream) == MESH_OK) return 0;
    snprintf(err, n, "rank %d: marking a queued collective on %s: %s", ex->rank, ex->dev->name,
             dev_last_error(ex->dev));
    return -1;
}

/* ---- the GPU's own times (deferred queues) ---------------------------- */

void exec__harvest_times(dev *d, dev_event *const *from, dev_event *const *to, int ring, long long made,
                         long long *timed, const short *at, double *ms, long long *n)
{
    while (*timed < made) {
        int slot = (int)(*timed % ring), done = 0, k = at ? at[slot] : 0;
        double t = 0;
        if (dev_event_query(d, to[slot], &done) != MESH_OK || !done ||
            dev_event_elapsed(d, from[slot], to[slot], &t) != MESH_OK)
            return;
        ms[k] += t > 0 ? t : 0;
        if (n) n[k]++;
        ++*timed;
    }
}

/* The calls' times so far (under m->mu; d: the calling thread's handle). */
static void harvest_calls(ex_marks *m, dev *d)
{
    exec__harvest_times(d, m->start, m->end, EX_TIMES, m->calls_made, &m->calls_timed, m->at, m->ms, m->n);
}

/* The rank's thread: the calls' and the compute stream's waits' times, as
 * far as the GPU has got (no wait). */
static void harvest(ex_marks *m)
{
    if (!m->deferred || !m->mu_made) return;
    pthread_mutex_lock(&m->mu);
    harvest_calls(m, m->ex->dev);
    pthread_mutex_unlock(&m->mu);
    exec__harvest_times(m->ex->dev, m->pre, m->post, EX_TIMES, m->joins_made, &m->joins_timed, NULL, &m->stall_ms, NULL);
}

/* In the queue's thread, before a call: the work it was queued after has
 * run (deferred: the queue's stream waits for it on the GPU, then marks
 * the call's start if its ring has room). */
static int wait_mark(void *ud, long ticket, comm *c, char *err, size_t n)
{
    ex_marks *m = ud;
    mesh__exec *ex = m->ex;
    if (m->deferred) {
        if (comm_nccl_wait_event(c, m->ev[ticket % EX_MARKS]) != 0) {
            snprintf(err, n, "%s", c->error);
            return -1;
        }
        pthread_mutex_lock(&m->mu);
        harvest_calls(m, m->dev);
        m->timing = m->calls_made - m->calls_timed < EX_TIMES;
        m->untimed_calls += !m->timing;
        long long slot = m->calls_made % EX_TIMES;
        m->at[slot] = m->entry[ticket % EX_MARKS];
        pthread_mutex_unlock(&m->mu);
        if (!m->timing || comm_nccl_record_event(c, m->start[slot]) == 0) return 0;
        snprintf(err, n, "%s", c->error);
        return -1;
    }
    if (dev_event_sync(m->dev, m->ev[ticket % EX_MARKS], m->timeout) == MESH_OK) {
        m->t0 = comm_now(); /* the call's own time from here (ran) */
        return 0;
    }
    snprintf(err, n, "rank %d: waiting for the kernels before a queued collective: %s", ex->rank,
             dev_last_error(m->dev));
    return -1;
}

/* Deferred, in the queue's thread once the call is enqueued: its slot's
 * done event follows it on the queue's stream (and its end, timed). */
static int ran(void *ud, long ticket, comm *c, char *err, size_t n)
{
    ex_marks *m = ud;
    if (!m->deferred) { /* the call has run: the host's time in it, by entry */
        int e = m->entry[ticket % EX_MARKS];
        double t = 1e3 * (comm_now() - m->t0);
        pthread_mutex_lock(&m->mu);
        m->ms[e] += t;
        m->n[e]++;
        pthread_mutex_unlock(&m->mu);
        return 0;
    }
    if (comm_nccl_record_event(c, m->done[ticket % EX_MARKS]) != 0 ||
        (m->timing && comm_nccl_record_event(c, m->end[m->calls_made % EX_TIMES]) != 0)) {
        snprintf(err, n, "%s", c->error);
        return -1;
    }
    if (m->timing) {
        pthread_mutex_lock(&m->mu);
        m->calls_made++;
        pthread_mutex_unlock(&m->mu);
    }
    m->timing = 0;
    return 0;
}

/* Deferred, in the rank's thread at the end of its wait for a ticket: the
 * compute stream waits for the call's work (a slot marked again since by
 * a later call makes it wait for that one too: the queue runs in order). */
static int joined(void *ud, long ticket, char *err, size_t n)
{
    ex_marks *m = ud;
    if (!m->deferred) return 0;
    mesh__exec *ex = m->ex;
    dev_stream *s = (dev_stream *)ex->kern.stream;
    dev_event *done_ev = m->done[ticket % EX_MARKS];
    int done = 1, slot = (int)(m->joins_made % EX_TIMES);
    harvest(m);
    int timed = m->joins_made - m->joins_timed < EX_TIMES; /* (else the GPU is EX_TIMES waits behind) */
    if (dev_event_query(ex->dev, done_ev, &done) == MESH_OK &&
        (!timed || dev_event_record(ex->dev, m->pre[slot], s) == MESH_OK) &&
        dev_event_wait(ex->dev, s, done_ev) == MESH_OK &&
        (!timed || dev_event_record(ex->dev, m->post[slot], s) == MESH_OK)) {
        m->joins++;
        m->joins_made += timed;
        m->ahead += !done; /* (the host went on with the call still on the GPU) */
        return 0;
    }
    snprintf(err, n, "rank %d: ordering the compute stream after a queued collective: %s", ex->rank,
             dev_last_error(ex->dev));
    return -1;
}

/* The queue's marks: its events and its thread's handle on the device.
 * With the rank's NCCL calls ordered on the compute stream (ex->ordered),
 * the queue's are ordered on the GPU too (deferred). */
int exec__marks_init(mesh__exec *ex, ex_marks *m)
{
    char why[640];
    m->ex = ex;
    m->deferred = ex->ordered;
    m->timeout = comm_timeout_from_env(); /* a queue never waits longer than its backend's timeout */
    mesh_status st = dev_open(ex->gpu ? MESH_DEVICE_CUDA : MESH_DEVICE_CPU, ex->gpu ? ex->dev->index : 0, &m->dev, why,
                              sizeof why);
    for (int i = 0; st == MESH_OK && i < EX_MARKS; i++) {
        st = dev_event_create(ex->dev, &m->ev[i]);
        if (st == MESH_OK && m->deferred) st = dev_event_create(ex->dev, &m->done[i]);
        if (st != MESH_OK) snprintf(why, sizeof why, "%s", dev_last_error(ex->dev));
    }
    for (int i = 0; st == MESH_OK && m->deferred && i < EX_TIMES; i++) {
        dev_event **timed[] = {&m->start[i], &m->end[i], &m->pre[i], &m->post[i]};
        for (int k = 0; st == MESH_OK && k < 4; k++) st = dev_event_create_timed(ex->dev, timed[k]);
        if (st != MESH_OK) snprintf(why, sizeof why, "%s", dev_last_error(ex->dev));
    }
    m->next_entry = EX_ENTRIES;
    if (st == MESH_OK) {
        if (pthread_mutex_init(&m->mu, NULL) == 0) m->mu_made = 1;
        else st = MESH_ERR_NOMEM, snprintf(why, sizeof why, "pthread_mutex_init failed");
    }
    if (st == MESH_OK) return 0;
    snprintf(ex->error, sizeof ex->error, "rank %d: a communication queue's events: %s", ex->rank, why);
    return -2;
}

void exec__marks_free(mesh__exec *ex, ex_marks *m)
{
    for (int i = 0; i < EX_MARKS; i++) {
        dev_event_destroy(ex->dev, m->ev[i]);
        dev_event_destroy(ex->dev, m->done[i]);
        m->ev[i] = m->done[i] = NULL;
    }
    for (int i = 0; i < EX_TIMES; i++) {
        dev_event *all[] = {m->start[i], m->end[i], m->pre[i], m->post[i]};
        for (int k = 0; k < 4; k++) dev_event_destroy(ex->dev, all[k]);
        m->start[i] = m->end[i] = m->pre[i] = m->post[i] = NULL;
    }
    if (m->mu_made) pthread_mutex_destroy(&m->mu);
    m->mu_made = 0;
    dev_close(m->dev);
    m->dev = NULL;
}

comm_async_hooks exec__marks_hooks(ex_marks *m, int deferred)
{
    comm_async_hooks h = {mark, wait_mark, ran, joined, m, EX_MARKS, deferred};
    return h;
}

double exec__marks_busy(ex_marks *m, const comm_async *q, double *stall)
{
    *stall = 0;
    if (!m->deferred) return comm_async_busy(q);
    harvest(m);
    pthread_mutex_lock(&m->mu);
    double busy = 0;
    for (int e = 0; e <= EX_ENTRIES; e++) busy += 1e-3 * m->ms[e];
    pthread_mutex_unlock(&m->mu);
    *stall = 1e-3 * m->stall_ms;
    return busy;
}

double exec__marks_entry_ms(ex_marks *m, int e, long long *calls)
{
    *calls = 0;
    if (!m->mu_made) return 0;
    harvest(m);
    pthread_mutex_lock(&m->mu);
    double ms = m->ms[e];
    *calls = m->n[e];
    pthread_mutex_unlock(&m->mu);
    return ms;
}

long long exec__marks_untimed(ex_marks *m)
{
    if (!m->mu_made) return 0;
    pthread_mutex_lock(&m->mu);
    long long n = m->untimed_calls;
    pthread_mutex_unlock(&m->mu);
    return n + (m->joins - m->joins_made);
}
