/* comm.c — calls through a communicator's function table (comm.h), and
 * what the backends share. */
#include "comm.h"

#include <stdarg.h> /* va_list */
#include <stdio.h>  /* snprintf, vsnprintf */
#include <stdlib.h> /* realloc, free, strtol */
#include <string.h> /* memcpy, strstr, strncmp */
#include <time.h>   /* clock_gettime, nanosleep */

int comm_all_reduce(comm *c, float *buf, size_t n) { return c->size == 1 ? 0 : c->v->all_reduce(c, buf, n); }

int comm_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    return c->v->reduce_scatter(c, in, out, n);
}

int comm_all_gather(comm *c, const float *in, float *out, size_t n) { return c->v->all_gather(c, in, out, n); }

int comm_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    return c->v->all_to_all(c, in, send, out, recv);
}

int comm_broadcast(comm *c, void *buf, size_t bytes, int root) { return c->v->broadcast(c, buf, bytes, root); }
int comm_send(comm *c, const void *buf, size_t bytes, int peer) { return c->v->send(c, buf, bytes, peer); }
int comm_recv(comm *c, void *buf, size_t bytes, int peer) { return c->v->recv(c, buf, bytes, peer); }
int comm_barrier(comm *c) { return c->v->barrier(c); }
int comm_split(comm *c, int color, int key, comm **out) { return c->v->split(c, color, key, out); }
int comm_group_begin(comm *c) { return c->v->group_begin(c); }
int comm_group_end(comm *c) { return c->v->group_end(c); }
void comm_abort(comm *c, const char *why) { c->v->abort(c, why); }

void comm_free(comm *c)
{
    if (!c) return;
    free(c->packed);
    c->v->free(c);
}

int comm_set_elements(comm *c, int type)
{
    if (!c || comm_nccl_set_elements(c, type) == 0 || comm_checked_set_elements(c, type) == 0) return 0;
    return type == COMM_F32 ? 0 : -1;
}

/* Copies between the buffers of a _v call and one packed array p: whole
 * (all_reduce_v) one after another; by chunk (reduce_scatter_v,
 * all_gather_v) rank-major, each buffer's chunk q for q = 0, 1, ..., so
 * that one call's chunk of a rank is its chunks of all. Ranks [q0, q1)
 * only; in: into p, else out of it. */
static void pack(const comm *c, float *const *bufs, const size_t *n, int k, int chunks, int q0, int q1, float *p,
                 int in)
{
    for (int q = 0; q < (chunks ? q1 : 1); q++)
        for (int i = 0; i < k; i++) {
            size_t len = chunks ? n[i] / (size_t)c->size : n[i];
            if (!chunks || q >= q0) {
                if (in) memcpy(p, bufs[i] + (size_t)q * len, len * sizeof *p);
                else memcpy(bufs[i] + (size_t)q * len, p, len * sizeof *p);
            }
            p += len;
        }
}

/* c->packed, for all elements; NULL if out of memory. */
static float *packed(comm *c, const size_t *n, int k, size_t *all)
{
    *all = 0;
    for (int i = 0; i < k; i++) *all += n[i];
    return comm_scratch(&c->packed, &c->packed_n, *all);
}

int comm_all_reduce_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (c->size == 1 || k == 0) return 0;
    if (c->v->all_reduce_v) return c->v->all_reduce_v(c, bufs, n, k);
    if (k == 1) return c->v->all_reduce(c, bufs[0], n[0]);
    size_t all;
    float *p = packed(c, n, k, &all);
    if (!p) return comm_fail(c, "all-reduce", "out of memory packing %d buffers", k);
    pack(c, bufs, n, k, 0, 0, 1, p, 1);
    if (c->v->all_reduce(c, p, all) != 0) return -1;
    pack(c, bufs, n, k, 0, 0, 1, p, 0);
    return 0;
}

int comm_reduce_scatter_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (c->size == 1 || k == 0) return 0;
    if (c->v->reduce_scatter_v) return c->v->reduce_scatter_v(c, bufs, n, k);
    size_t all;
    float *p = packed(c, n, k, &all), *mine;
    if (!p) return comm_fail(c, "reduce-scatter", "out of memory packing %d buffers", k);
    mine = p + (size_t)c->rank * (all / (size_t)c->size);
    pack(c, bufs, n, k, 1, 0, c->size, p, 1);
    if (c->v->reduce_scatter(c, p, mine, all / (size_t)c->size) != 0) return -1;
    pack(c, bufs, n, k, 1, c->rank, c->rank + 1, p, 0);
    return 0;
}

int comm_all_gather_v(comm *c, float *const *bufs, const size_t *n, int k)
{
    if (c->size == 1 || k == 0) return 0;
    if (c->v->all_gather_v) return c->v->all_gather_v(c, bufs, n, k);
    size_t all;
    float *p = packed(c, n, k, &all), *mine;
    if (!p) return comm_fail(c, "all-gather", "out of memory packing %d buffers", k);
    mine = p + (size_t)c->rank * (all / (size_t)c->size);
    pack(c, bufs, n, k, 1, c->rank, c->rank + 1, p, 1);
    if (c->v->all_gather(c, mine, p, all / (size_t)c->size) != 0) return -1;
    pack(c, bufs, n, k, 1, 0, c->size, p, 0);
    return 0;
}

int comm_fail(comm *c, const char *op, const char *fmt, ...)
{
    char why[900]; /* with the prefix, fits c->error */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(c->error, sizeof c->error, "%s over %d rank%s (this is rank %d): %s", op, c->size,
             c->size == 1 ? "" : "s", c->world_rank, why);
    return -1;
}

void comm_rank_failed(char *buf, size_t n, int rank, const char *why)
{
    snprintf(buf, n, "rank %d failed: %s", rank, why ? why : "aborted");
}

int comm_names_other(const char *error, int self)
{
    if (strstr(error, COMM_ANOTHER_FAILED)) return 1;
    for (const char *p = strstr(error, "rank "); p; p = strstr(p + 1, "rank ")) {
        char *end;
        long q = strtol(p + 5, &end, 10);
        if (end != p + 5 && q != self && !strncmp(end, " failed", 7)) return 1;
    }
    return 0;
}

float *comm_scratch(float **buf, size_t *cap, size_t n)
{
    if (*buf && n <= *cap) return *buf;
    float *s = realloc(*buf, (n ? n : 1) * sizeof *s);
    if (!s) return NULL;
    *buf = s;
    *cap = n;
    return s;
}

double comm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void comm_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}
