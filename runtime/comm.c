/* comm.c — calls through a communicator's function table (comm.h), and
 * what the backends share. */
#include "comm.h"

#include <stdarg.h> /* va_list */
#include <stdio.h>  /* snprintf, vsnprintf */
#include <stdlib.h> /* realloc */
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
    if (c) c->v->free(c);
}

int comm_fail(comm *c, const char *op, const char *fmt, ...)
{
    char why[240]; /* with the prefix, fits c->error */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(c->error, sizeof c->error, "%s over %d rank%s (this is rank %d): %s", op, c->size,
             c->size == 1 ? "" : "s", c->world_rank, why);
    return -1;
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
