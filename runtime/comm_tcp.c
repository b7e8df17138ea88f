/* comm_tcp.c — the TCP communicator (comm.h): one rank per process, the
 * processes of a job that torchrun started (or anything that sets RANK,
 * WORLD_SIZE, MASTER_ADDR and MASTER_PORT), without MPI.
 *
 * Start: the ranks meet at the rendezvous (rendezvous.c; MESH_PORT, else
 * MASTER_PORT + 1), each listens on a port of its own, the addresses are
 * all-gathered there, and every pair of ranks gets one socket: rank i
 * connects to every j < i (listening already) and accepts every j > i.
 * The sub-communicators of split share the world's sockets: every frame
 * carries its group's id.
 *
 * Frames: {magic, kind, group, bytes} and the bytes. Kinds: a
 * collective's part, a point-to-point message, an abort (its reason), and
 * the goodbye of a rank that frees the world. A receiver thread per
 * process reads every socket as data comes (poll) and queues whole frames
 * per sender; a call takes the oldest frame of its group and kind from
 * the peer it needs. So sends are eager: the sender writes and goes on,
 * whatever the receiver is doing, and transfers in any order cannot
 * deadlock.
 *
 * Sums are the threads backend's, to the bit: all-reduce gives rank r the
 * chunk [n r / p, n (r + 1) / p); each rank sends every peer that peer's
 * chunk, adds the p copies of its own element by element in rank order,
 * and sends the sum back to every peer (2 n (p - 1) / p floats each way
 * per rank, as the MPI backend's). Reduce-scatter is the first half.
 *
 * Failure: comm_abort sends its reason to every peer, and the world
 * stops: every call waiting, or made later, on any rank returns -1 naming
 * the failed rank. A peer whose connection closes before its goodbye
 * (exit, crash, kill) failed: the others stop, naming it. A call that
 * waits longer than the timeout (MESH_COLLECTIVE_TIMEOUT_S) stops the
 * world, naming the rank, the call and the peer it waited for.
 */
#include "comm.h"
#include "rendezvous.h"

#include <arpa/inet.h>   /* inet_ntop */
#include <errno.h>       /* errno, ETIMEDOUT, EAGAIN */
#include <netdb.h>       /* getaddrinfo */
#include <netinet/in.h>  /* sockaddr_in, sockaddr_in6 */
#include <netinet/tcp.h> /* TCP_NODELAY */
#include <poll.h>        /* poll */
#include <pthread.h>     /* pthread_*, the receiver thread */
#include <stdint.h>      /* uint32_t, uint64_t, SIZE_MAX */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* malloc, calloc, free, getenv, strtol */
#include <string.h>      /* memcpy, strerror */
#include <sys/socket.h>  /* socket, sendmsg, shutdown */
#include <sys/uio.h>     /* struct iovec */
#include <time.h>        /* struct timespec */
#include <unistd.h>      /* close, pipe, write */

enum { FRAME_MAGIC = 0x6d657368 /* "mesh" */, HELLO_MAGIC = 0x6d657368 + 1 };
enum { K_COLL = 1, K_P2P, K_ABORT, K_BYE }; /* frame kinds */
enum { STOPPED = -4 };                      /* send_frame: the world stopped while it waited */
static const uint64_t END_GROUP = UINT64_MAX; /* comm_tcp_finish's exchange */
static const double TELL_S = 2;               /* at most, per peer, to tell it the world stops */
static const double STRANGER_S = 5;           /* a connection's time to say hello */

typedef struct frame {
    uint32_t magic, kind;
    uint64_t group; /* an abort's: the rank that failed */
    uint64_t bytes;
} frame;

typedef struct tmsg { /* a frame received */
    struct tmsg *next;
    uint32_t kind;
    uint64_t group;
    size_t bytes;
    unsigned char data[];
} tmsg;

typedef struct tpeer {
    int fd;                  /* -1: this rank */
    pthread_mutex_t send_mu; /* one frame at a time */
    int broken;              /* nothing more goes out (a send stopped inside a frame, or the end) */
    /* the receiver thread's */
    int reading;
    frame in;                /* the frame being read */
    size_t in_got;
    tmsg *cur;
    size_t cur_got;
    /* under the world's mu */
    tmsg *head, *tail;       /* received, not yet taken */
    int bye, gone;           /* it said goodbye; its connection ended */
} tpeer;

typedef struct comm_tcp_state {
    int rank, size;
    double timeout;
    tpeer *peer;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* a frame came, a peer left, the world stopped */
    int aborted, by;         /* the world stopped; by: the rank that failed (or waited too long) */
    char why[256];
    int told;                /* this rank told its peers */
    uint32_t led;            /* groups made with this rank as their lowest member (split's ids) */
    int refs;                /* handles alive */
    int holds, ended;        /* comm_tcp_hold's; ended: the last handle went (world_end) */
    pthread_t rx;
    int rx_on, wake[2];      /* the receiver thread, and the pipe that stops it */
    struct pollfd *pf;       /* the receiver's */
    int *pf_peer;
} tworld;

typedef struct tcomm {
    comm c;
    tworld *w;
    uint64_t group;          /* the world's: 0 */
    int *world;              /* per member, its world rank */
    float *scratch;
    size_t scratch_n;
} tcomm;

static const comm_vtbl tcp_vtbl;

/* ---- the world's state -------------------------------------------------- */

/* The world stops (the first reason stays); mu held. */
static void stop_locked(tworld *w, int by, const char *why)
{
    if (w->aborted) return;
    w->aborted = 1;
    w->by = by;
    snprintf(w->why, sizeof w->why, "%s", why);
    pthread_cond_broadcast(&w->cv);
}

static int stopped(tworld *w)
{
    pthread_mutex_lock(&w->mu);
    int s = w->aborted;
    pthread_mutex_unlock(&w->mu);
    return s;
}

/* Writes one frame to world rank q before the deadline: 0, or
 * RDV_TIMEOUT, RDV_CLOSED, RDV_ERROR, or STOPPED when stoppable and the
 * world stops while it waits; send_mu held. */
static int send_frame(tworld *w, int q, uint32_t kind, uint64_t group, const void *buf, size_t bytes, double until,
                      int stoppable)
{
    tpeer *p = &w->peer[q];
    frame f = {FRAME_MAGIC, kind, group, bytes};
    struct iovec iov[2] = {{&f, sizeof f}, {(void *)(uintptr_t)buf, bytes}};
    size_t sent = 0;
    int i = 0, rc = 0;
    while (i < 2) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov + i;
        mh.msg_iovlen = (size_t)(2 - i);
        ssize_t k = sendmsg(p->fd, &mh, MSG_NOSIGNAL);
        if (k >= 0) {
            sent += (size_t)k;
            for (size_t left = (size_t)k; left > 0 && i < 2;) {
                size_t used = left < iov[i].iov_len ? left : iov[i].iov_len;
                iov[i].iov_base = (unsigned char *)iov[i].iov_base + used;
                iov[i].iov_len -= used;
                left -= used;
                if (iov[i].iov_len == 0) i++;
            }
            continue;
        }
        if (errno == EINTR) continue;
        if (errno == EPIPE || errno == ECONNRESET) rc = RDV_CLOSED;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) rc = RDV_ERROR;
        else { /* the peer's buffer is full: wait, watching the clock and the world */
            double slice = comm_now() + 0.1;
            int ready = rdv_wait(p->fd, POLLOUT, slice < until ? slice : until);
            if (ready < 0) rc = RDV_ERROR;
            else if (ready == 0 && comm_now() >= until) rc = RDV_TIMEOUT;
            else if (stoppable && stopped(w)) rc = STOPPED;
        }
        if (rc != 0) break;
    }
    if (rc != 0 && sent > 0) p->broken = 1; /* the peer would read the rest as a new frame */
    return rc;
}

/* Tells every peer (once) that the world stops, with the reason and who
 * failed; then nothing more goes out. */
static void tell_peers(tworld *w)
{
    pthread_mutex_lock(&w->mu);
    int first = !w->told, by = w->by;
    char why[sizeof w->why];
    memcpy(why, w->why, sizeof why);
    w->told = 1;
    pthread_mutex_unlock(&w->mu);
    if (!first) return;
    for (int q = 0; q < w->size; q++) {
        tpeer *p = &w->peer[q];
        if (p->fd < 0) continue;
        pthread_mutex_lock(&p->send_mu);
        if (!p->broken) send_frame(w, q, K_ABORT, (uint64_t)by, why, strlen(why), comm_now() + TELL_S, 0);
        shutdown(p->fd, SHUT_WR);
        p->broken = 1;
        pthread_mutex_unlock(&p->send_mu);
    }
}

/* "OP over N ranks (this is rank R): WHY": the world's reason. */
static int fail(tcomm *t, const char *op) { return comm_fail(&t->c, op, "%s", t->w->why); }

/* Stops the world with why (naming rank by), tells the peers; -1. */
static int halt(tcomm *t, const char *op, int by, const char *why)
{
    pthread_mutex_lock(&t->w->mu);
    stop_locked(t->w, by, why);
    pthread_mutex_unlock(&t->w->mu);
    tell_peers(t->w);
    return fail(t, op);
}

static int out_of_memory(tcomm *t, const char *op)
{
    char why[120];
    snprintf(why, sizeof why, "rank %d ran out of memory in %s", t->c.world_rank, op);
    return halt(t, op, t->c.world_rank, why);
}

/* ---- the receiver thread ------------------------------------------------ */

/* A whole frame from peer q: queued, or acted on. */
static void deliver(tworld *w, int q, tmsg *m)
{
    tpeer *p = &w->peer[q];
    pthread_mutex_lock(&w->mu);
    if (m->kind == K_ABORT) {
        char why[sizeof w->why];
        size_t k = m->bytes < sizeof why - 1 ? m->bytes : sizeof why - 1;
        memcpy(why, m->data, k);
        why[k] = '\0';
        stop_locked(w, m->group < (uint64_t)w->size ? (int)m->group : q, why);
        free(m);
    } else if (m->kind == K_BYE) {
        p->bye = 1;
        free(m);
    } else {
        m->next = NULL;
        if (p->tail) p->tail->next = m;
        else p->head = m;
        p->tail = m;
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Peer q's connection ended, or carried what no rank sends: unless it
 * said goodbye, it failed. */
static void lost(tworld *w, int q, const char *how)
{
    tpeer *p = &w->peer[q];
    char why[sizeof w->why];
    free(p->cur);
    p->cur = NULL;
    pthread_mutex_lock(&w->mu);
    p->gone = 1;
    if (!p->bye) {
        comm_rank_failed(why, sizeof why, q, how);
        stop_locked(w, q, why);
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Reads what peer q has sent (at most a few MiB, then the others' turn);
 * -1 once its connection is over. */
static int read_peer(tworld *w, int q)
{
    tpeer *p = &w->peer[q];
    size_t budget = (size_t)8 << 20;
    while (budget > 0) {
        int head = p->in_got < sizeof p->in;
        void *into = head ? (unsigned char *)&p->in + p->in_got : p->cur->data + p->cur_got;
        size_t want = head ? sizeof p->in - p->in_got : p->cur->bytes - p->cur_got;
        ssize_t k = recv(p->fd, into, want, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k <= 0) {
            lost(w, q, "its connection closed in the middle of the run (its process exited, crashed or was killed)");
            return -1;
        }
        budget -= (size_t)k < budget ? (size_t)k : budget;
        if (head) {
            p->in_got += (size_t)k;
            if (p->in_got < sizeof p->in) continue;
            if (p->in.magic != FRAME_MAGIC || p->in.kind < K_COLL || p->in.kind > K_BYE ||
                p->in.bytes > SIZE_MAX - sizeof(tmsg)) {
                lost(w, q, "its connection carried something else than mesh's frames");
                return -1;
            }
            if (!(p->cur = malloc(sizeof *p->cur + (size_t)p->in.bytes))) {
                char why[sizeof w->why];
                snprintf(why, sizeof why, "rank %d ran out of memory receiving %llu bytes from rank %d", w->rank,
                         (unsigned long long)p->in.bytes, q);
                pthread_mutex_lock(&w->mu);
                stop_locked(w, w->rank, why);
                pthread_mutex_unlock(&w->mu);
                return -1;
            }
            p->cur->kind = p->in.kind;
            p->cur->group = p->in.group;
            p->cur->bytes = (size_t)p->in.bytes;
            p->cur_got = 0;
        } else {
            p->cur_got += (size_t)k;
        }
        if (p->cur_got == p->cur->bytes) {
            tmsg *m = p->cur;
            p->cur = NULL;
            p->in_got = 0;
            deliver(w, q, m);
        }
    }
    return 0;
}

static void *receiver(void *arg)
{
    tworld *w = arg;
    for (;;) {
        int k = 1;
        w->pf[0] = (struct pollfd){w->wake[0], POLLIN, 0};
        for (int q = 0; q < w->size; q++)
            if (w->peer[q].reading) {
                w->pf[k] = (struct pollfd){w->peer[q].fd, POLLIN, 0};
                w->pf_peer[k++] = q;
            }
        if (poll(w->pf, (nfds_t)k, -1) < 0) {
            if (errno == EINTR) continue;
            char why[sizeof w->why];
            snprintf(why, sizeof why, "rank %d cannot watch its connections: %s", w->rank, strerror(errno));
            pthread_mutex_lock(&w->mu);
            stop_locked(w, w->rank, why);
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        if (w->pf[0].revents) return NULL; /* the world ends */
        for (int i = 1; i < k; i++)
            if (w->pf[i].revents && read_peer(w, w->pf_peer[i]) != 0) w->peer[w->pf_peer[i]].reading = 0;
    }
}

/* ---- frames to and from peers ------------------------------------------- */

/* One frame of this group to member `to`; 0, or -1 with c->error (the
 * world stops unless it had). */
static int put(tcomm *t, const char *op, int to, uint32_t kind, const void *buf, size_t bytes, double until)
{
    tworld *w = t->w;
    int q = t->world[to];
    tpeer *p = &w->peer[q];
    pthread_mutex_lock(&p->send_mu);
    pthread_mutex_lock(&w->mu);
    int was_stopped = w->aborted, left = p->bye || p->gone;
    pthread_mutex_unlock(&w->mu);
    int rc = was_stopped || left || p->broken ? STOPPED : send_frame(w, q, kind, t->group, buf, bytes, until, 1);
    pthread_mutex_unlock(&p->send_mu);
    if (rc == 0) return 0;
    char why[sizeof w->why];
    int by = w->rank;
    if (left && !was_stopped) {
        snprintf(why, sizeof why, "rank %d left the job (it freed its communicator) while rank %d sends it %s", q,
                 w->rank, op);
        by = q;
    } else if (rc == STOPPED) {
        return stopped(w) ? fail(t, op) : comm_fail(&t->c, op, "the connection to rank %d is broken", q);
    } else if (rc == RDV_TIMEOUT) {
        snprintf(why, sizeof why, "rank %d waited in %s for more than %g s (MESH_COLLECTIVE_TIMEOUT_S): rank %d "
                 "takes nothing (stuck or gone)", w->rank, op, w->timeout, q);
    } else if (rc == RDV_CLOSED) {
        comm_rank_failed(why, sizeof why, q,
                         "its connection closed in the middle of the run (its process exited, crashed or was killed)");
        by = q;
    } else {
        snprintf(why, sizeof why, "rank %d cannot send to rank %d: %s", w->rank, q, strerror(errno));
    }
    return halt(t, op, by, why);
}

/* The first of p's frames of kind and group, unqueued; mu held. */
static tmsg *unqueue(tpeer *p, uint32_t kind, uint64_t group)
{
    for (tmsg **at = &p->head, *prev = NULL; *at; prev = *at, at = &(*at)->next) {
        tmsg *m = *at;
        if (m->kind != kind || m->group != group) continue;
        *at = m->next;
        if (p->tail == m) p->tail = prev;
        return m;
    }
    return NULL;
}

/* The oldest frame of kind in this group from member `from`, waiting
 * until the deadline. NULL with c->error when the world stops, the peer
 * left, or the wait runs out: then the world stops naming this rank's
 * wait, unless quiet. */
static tmsg *take(tcomm *t, const char *op, int from, uint32_t kind, double until, int quiet)
{
    tworld *w = t->w;
    int q = t->world[from], by = w->rank, late = 0;
    tpeer *p = &w->peer[q];
    char why[sizeof w->why] = "";
    struct timespec ts = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
    tmsg *m = NULL;
    pthread_mutex_lock(&w->mu);
    while (!w->aborted && !(m = unqueue(p, kind, t->group))) {
        if (p->bye || p->gone) {
            snprintf(why, sizeof why, "rank %d left the job (it freed its communicator) while rank %d waited for it "
                     "in %s", q, w->rank, op);
            by = q;
            break;
        }
        if (late) {
            if (!quiet)
                snprintf(why, sizeof why, "rank %d waited in %s for more than %g s (MESH_COLLECTIVE_TIMEOUT_S): "
                         "rank %d sent nothing (stuck or gone)", w->rank, op, w->timeout, q);
            break;
        }
        late = pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT;
    }
    if (!m && why[0]) stop_locked(w, by, why);
    int was_stopped = w->aborted;
    pthread_mutex_unlock(&w->mu);
    if (m) return m;
    if (why[0]) tell_peers(w);
    if (was_stopped) fail(t, op);
    else comm_fail(&t->c, op, "rank %d sent nothing in time", q);
    return NULL;
}

/* take, and the frame must hold `bytes` bytes: the ranks' calls disagree
 * otherwise, and the world stops. */
static tmsg *take_n(tcomm *t, const char *op, int from, size_t bytes, double until)
{
    tmsg *m = take(t, op, from, K_COLL, until, 0);
    if (!m || m->bytes == bytes) return m;
    char why[sizeof t->w->why];
    snprintf(why, sizeof why, "rank %d got %zu bytes from rank %d in %s, and expected %zu: the ranks' calls "
             "disagree", t->c.rank, m->bytes, from, op, bytes);
    free(m);
    halt(t, op, t->c.world_rank, why);
    return NULL;
}

static double deadline(const tcomm *t) { return comm_now() + t->w->timeout; }

/* ---- collectives -------------------------------------------------------- */

/* The first element of member q's chunk of n, of p chunks. */
static size_t chunk_at(size_t n, int q, int p) { return n * (size_t)q / (size_t)p; }

/* sum[i] = the members' part[i], added in rank order, where rank q's part
 * is a frame from q (own: mine); the frames are n floats. */
static int sum_in_rank_order(tcomm *t, const char *op, const float *mine, float *sum, size_t n, double until)
{
    for (int q = 0; q < t->c.size; q++) {
        tmsg *m = q == t->c.rank ? NULL : take_n(t, op, q, n * sizeof *sum, until);
        if (q != t->c.rank && !m) return -1;
        const float *part = m ? (const float *)(const void *)m->data : mine;
        if (q == 0) {
            memcpy(sum, part, n * sizeof *sum);
        } else {
            for (size_t i = 0; i < n; i++) sum[i] += part[i];
        }
        free(m);
    }
    return 0;
}

/* Every member's `bytes` of in into out[size x bytes], in rank order. */
static int gather(tcomm *t, const char *op, const void *in, void *out, size_t bytes, double until)
{
    unsigned char *all = out;
    int r = t->c.rank;
    for (int q = 0; q < t->c.size; q++)
        if (q != r && put(t, op, q, K_COLL, in, bytes, until) != 0) return -1;
    if (all + (size_t)r * bytes != (const unsigned char *)in) memmove(all + (size_t)r * bytes, in, bytes);
    for (int q = 0; q < t->c.size; q++) {
        if (q == r) continue;
        tmsg *m = take_n(t, op, q, bytes, until);
        if (!m) return -1;
        memcpy(all + (size_t)q * bytes, m->data, bytes);
        free(m);
    }
    return 0;
}

static int c_all_reduce(comm *c, float *buf, size_t n)
{
    tcomm *t = (tcomm *)c;
    int p = c->size, r = c->rank;
    double until = deadline(t);
    size_t lo = chunk_at(n, r, p), mine = chunk_at(n, r + 1, p) - lo;
    float *sum = comm_scratch(&t->scratch, &t->scratch_n, mine);
    if (!sum) return out_of_memory(t, "all-reduce");
    /* every member's chunk to it; the copies of this rank's chunk summed */
    for (int q = 0; q < p; q++) {
        size_t at = chunk_at(n, q, p);
        if (q != r && put(t, "all-reduce", q, K_COLL, buf + at, (chunk_at(n, q + 1, p) - at) * sizeof *buf, until) != 0)
            return -1;
    }
    if (sum_in_rank_order(t, "all-reduce", buf + lo, sum, mine, until) != 0) return -1;
    /* the sums to everyone */
    memcpy(buf + lo, sum, mine * sizeof *sum);
    for (int q = 0; q < p; q++)
        if (q != r && put(t, "all-reduce", q, K_COLL, sum, mine * sizeof *sum, until) != 0) return -1;
    for (int q = 0; q < p; q++) {
        if (q == r) continue;
        size_t at = chunk_at(n, q, p), len = chunk_at(n, q + 1, p) - at;
        tmsg *m = take_n(t, "all-reduce", q, len * sizeof *buf, until);
        if (!m) return -1;
        memcpy(buf + at, m->data, len * sizeof *buf);
        free(m);
    }
    return 0;
}

static int c_reduce_scatter(comm *c, const float *in, float *out, size_t n)
{
    tcomm *t = (tcomm *)c;
    double until = deadline(t);
    float *sum = comm_scratch(&t->scratch, &t->scratch_n, n);
    if (!sum) return out_of_memory(t, "reduce-scatter");
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && put(t, "reduce-scatter", q, K_COLL, in + (size_t)q * n, n * sizeof *in, until) != 0)
            return -1;
    if (sum_in_rank_order(t, "reduce-scatter", in + (size_t)c->rank * n, sum, n, until) != 0) return -1;
    memcpy(out, sum, n * sizeof *out); /* out may be this rank's own input: that was sent */
    return 0;
}

static int c_all_gather(comm *c, const float *in, float *out, size_t n)
{
    tcomm *t = (tcomm *)c;
    return gather(t, "all-gather", in, out, n * sizeof *in, deadline(t));
}

static int c_all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    tcomm *t = (tcomm *)c;
    int p = c->size, r = c->rank, bad = -1;
    double until = deadline(t);
    size_t from = 0, at = 0, own = 0, got = 0;
    for (int q = 0; q < p; q++) {
        if (q == r) own = from;
        else if (put(t, "all-to-all", q, K_COLL, in + from, send[q] * sizeof *in, until) != 0) return -1;
        from += send[q];
    }
    for (int q = 0; q < p; q++) {
        tmsg *m = q == r ? NULL : take(t, "all-to-all", q, K_COLL, until, 0);
        if (q != r && !m) return -1;
        size_t sent = m ? m->bytes / sizeof *out : send[r];
        if (sent != recv[q] || (m && m->bytes % sizeof *out)) {
            if (bad < 0) bad = q, got = sent;
        } else {
            memmove(out + at, m ? (const float *)(const void *)m->data : in + own, recv[q] * sizeof *out);
        }
        free(m);
        at += recv[q];
    }
    if (bad < 0) return 0;
    char why[sizeof t->w->why];
    snprintf(why, sizeof why, "rank %d expected %zu floats from rank %d in all-to-all, which sends %zu", r, recv[bad],
             bad, got);
    return halt(t, "all-to-all", c->world_rank, why);
}

static int c_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    tcomm *t = (tcomm *)c;
    double until = deadline(t);
    if (c->rank == root) {
        for (int q = 0; q < c->size; q++)
            if (q != root && put(t, "broadcast", q, K_COLL, buf, bytes, until) != 0) return -1;
        return 0;
    }
    tmsg *m = take_n(t, "broadcast", root, bytes, until);
    if (!m) return -1;
    memcpy(buf, m->data, bytes);
    free(m);
    return 0;
}

static int c_barrier(comm *c)
{
    tcomm *t = (tcomm *)c;
    double until = deadline(t);
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && put(t, "barrier", q, K_COLL, NULL, 0, until) != 0) return -1;
    for (int q = 0; q < c->size; q++) {
        tmsg *m = q == c->rank ? NULL : take_n(t, "barrier", q, 0, until);
        if (q != c->rank && !m) return -1;
        free(m);
    }
    return 0;
}

/* ---- point to point ----------------------------------------------------- */

static int peer_ok(comm *c, int peer, const char *what)
{
    if (peer >= 0 && peer < c->size && peer != c->rank) return 1;
    snprintf(c->error, sizeof c->error, "%s rank %d of a group of %d (this is rank %d)", what, peer, c->size,
             c->rank);
    return 0;
}

static int c_send(comm *c, const void *buf, size_t bytes, int peer)
{
    tcomm *t = (tcomm *)c;
    if (!peer_ok(c, peer, "send to")) return -1;
    return put(t, "send", peer, K_P2P, buf, bytes, deadline(t));
}

static int c_recv(comm *c, void *buf, size_t bytes, int peer)
{
    tcomm *t = (tcomm *)c;
    if (!peer_ok(c, peer, "receive from")) return -1;
    tmsg *m = take(t, "receive", peer, K_P2P, deadline(t), 0);
    if (!m) return -1;
    int ok = m->bytes == bytes;
    if (ok) memcpy(buf, m->data, bytes);
    else
        snprintf(c->error, sizeof c->error, "receive from rank %d: %zu bytes sent, %zu expected", peer, m->bytes,
                 bytes);
    free(m); /* the message is taken, as the threads backend takes it */
    return ok ? 0 : -1;
}

static int c_group_noop(comm *c)
{
    (void)c;
    return 0;
}

static void c_abort(comm *c, const char *why)
{
    tcomm *t = (tcomm *)c;
    char msg[sizeof t->w->why];
    comm_rank_failed(msg, sizeof msg, c->world_rank, why);
    pthread_mutex_lock(&t->w->mu);
    stop_locked(t->w, c->world_rank, msg);
    pthread_mutex_unlock(&t->w->mu);
    tell_peers(t->w);
}

/* ---- handles, split, the world's end ------------------------------------ */

/* A handle on the group of `size` members world[] (taken), this rank being
 * member `rank`; NULL if out of memory (world freed). */
static comm *handle(tworld *w, uint64_t group, int *world, int size, int rank)
{
    tcomm *t = calloc(1, sizeof *t);
    if (!t) {
        free(world);
        return NULL;
    }
    t->c.v = &tcp_vtbl;
    t->c.rank = rank;
    t->c.size = size;
    t->c.world_rank = w->rank;
    t->w = w;
    t->group = group;
    t->world = world;
    pthread_mutex_lock(&w->mu);
    w->refs++;
    pthread_mutex_unlock(&w->mu);
    return &t->c;
}

static int c_split(comm *c, int color, int key, comm **out)
{
    tcomm *t = (tcomm *)c;
    int p = c->size, k = 0, lead = -1, me = 0;
    *out = NULL;
    /* every member's color, key and count of groups it led */
    int32_t mine[3] = {color, key, (int32_t)t->w->led}, *all = malloc((size_t)p * sizeof mine);
    int *members = malloc((size_t)p * sizeof *members);
    if (!all || !members) {
        free(all);
        free(members);
        return out_of_memory(t, "split");
    }
    int rc = gather(t, "split", mine, all, sizeof mine, deadline(t));
    if (rc != 0 || color < 0) { /* color < 0: in no group */
        free(all);
        free(members);
        return rc;
    }
    /* the members of this color, ordered by (key, rank); the lowest rank
     * names the group with its count, so ids never repeat in the world */
    for (int q = 0; q < p; q++)
        if (all[3 * q] == color) {
            if (lead < 0) lead = q;
            members[k++] = q;
        }
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && all[3 * members[j] + 1] < all[3 * members[j - 1] + 1]; j--) {
            int s = members[j];
            members[j] = members[j - 1];
            members[j - 1] = s;
        }
    uint64_t id = (uint64_t)(t->world[lead] + 1) << 32 | (uint32_t)all[3 * lead + 2];
    if (lead == c->rank) t->w->led++;
    for (int i = 0; i < k; i++) {
        if (members[i] == c->rank) me = i;
        members[i] = t->world[members[i]];
    }
    free(all);
    *out = handle(t->w, id, members, k, me);
    return *out ? 0 : out_of_memory(t, "split");
}

static void free_queue(tpeer *p)
{
    for (tmsg *m = p->head, *next; m; m = next) {
        next = m->next;
        free(m);
    }
    free(p->cur);
}

/* Frees the world; its receiver thread has stopped (or never started). */
static void world_free(tworld *w)
{
    for (int q = 0; q < w->size; q++) {
        if (w->peer[q].fd >= 0) close(w->peer[q].fd);
        free_queue(&w->peer[q]);
        pthread_mutex_destroy(&w->peer[q].send_mu);
    }
    close(w->wake[0]);
    close(w->wake[1]);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->pf);
    free(w->pf_peer);
    free(w->peer);
    free(w);
}

/* The last handle is gone: a world that did not stop says goodbye to
 * every peer and waits for theirs (so no socket closes with data unread,
 * which would reset it); one that stopped passes the reason on. */
static void world_end(tworld *w)
{
    if (w->rx_on) {
        double until = comm_now() + w->timeout;
        if (!stopped(w)) {
            for (int q = 0; q < w->size; q++) {
                tpeer *p = &w->peer[q];
                if (p->fd < 0) continue;
                pthread_mutex_lock(&p->send_mu);
                if (!p->broken) send_frame(w, q, K_BYE, 0, NULL, 0, until, 1);
                shutdown(p->fd, SHUT_WR);
                p->broken = 1;
                pthread_mutex_unlock(&p->send_mu);
            }
            struct timespec ts = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
            pthread_mutex_lock(&w->mu);
            for (int q = 0; q < w->size && !w->aborted; q++)
                while (w->peer[q].fd >= 0 && !w->peer[q].bye && !w->peer[q].gone && !w->aborted)
                    if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) break;
            pthread_mutex_unlock(&w->mu);
        }
        if (stopped(w)) tell_peers(w);
        ssize_t k;
        do k = write(w->wake[1], "x", 1);
        while (k < 0 && errno == EINTR);
        pthread_join(w->rx, NULL);
    }
    pthread_mutex_lock(&w->mu);
    w->ended = 1;
    int held = w->holds > 0;
    pthread_mutex_unlock(&w->mu);
    if (!held) world_free(w); /* (else comm_tcp_release frees it) */
}

static void c_free(comm *c)
{
    tcomm *t = (tcomm *)c;
    tworld *w = t->w;
    pthread_mutex_lock(&w->mu);
    int last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (last) world_end(w);
    free(t->world);
    free(t->scratch);
    free(t);
}

static const comm_vtbl tcp_vtbl = {
    "tcp", c_all_reduce, c_reduce_scatter, c_all_gather, c_all_to_all, c_broadcast, c_send, c_recv,
    c_barrier, c_split, c_group_noop, c_group_noop, c_abort, c_free, NULL, NULL, NULL, /* _v: packed by comm.c */
};

/* ---- making the world --------------------------------------------------- */

/* A world of size ranks, this one `rank`, no connections yet; NULL if out
 * of memory. */
static tworld *world_new(int rank, int size, double timeout)
{
    tworld *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->rank = rank;
    w->size = size;
    w->timeout = timeout;
    w->wake[0] = w->wake[1] = -1;
    w->peer = calloc((size_t)size, sizeof *w->peer);
    w->pf = calloc((size_t)size + 1, sizeof *w->pf);
    w->pf_peer = calloc((size_t)size + 1, sizeof *w->pf_peer);
    pthread_condattr_t ca;
    int ok = w->peer && w->pf && w->pf_peer && pipe(w->wake) == 0 && pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&w->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (ok && pthread_mutex_init(&w->mu, NULL) != 0) {
        pthread_cond_destroy(&w->cv);
        ok = 0;
    }
    for (int q = 0; ok && q < size; q++) {
        w->peer[q].fd = -1;
        if (pthread_mutex_init(&w->peer[q].send_mu, NULL) != 0) {
            while (q-- > 0) pthread_mutex_destroy(&w->peer[q].send_mu);
            pthread_mutex_destroy(&w->mu);
            pthread_cond_destroy(&w->cv);
            ok = 0;
        }
    }
    if (!ok) {
        if (w->wake[0] >= 0) close(w->wake[0]);
        if (w->wake[1] >= 0) close(w->wake[1]);
        free(w->peer);
        free(w->pf);
        free(w->pf_peer);
        free(w);
        return NULL;
    }
    return w;
}

/* A rank's address as the others reach it, all-gathered. */
typedef struct taddr {
    uint8_t family; /* 4 or 6 */
    uint8_t pad;
    uint16_t port;  /* network order */
    uint8_t ip[16];
} taddr;

static socklen_t to_sockaddr(const taddr *a, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    if (a->family == 4) {
        struct sockaddr_in *s = (struct sockaddr_in *)ss;
        s->sin_family = AF_INET;
        s->sin_port = a->port;
        memcpy(&s->sin_addr, a->ip, 4);
        return sizeof *s;
    }
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
    s->sin6_family = AF_INET6;
    s->sin6_port = a->port;
    memcpy(&s->sin6_addr, a->ip, 16);
    return sizeof *s;
}

static void from_sockaddr(const struct sockaddr_storage *ss, taddr *a)
{
    memset(a, 0, sizeof *a);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)ss;
        a->family = 4;
        a->port = s->sin_port;
        memcpy(a->ip, &s->sin_addr, 4);
    } else {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ss;
        a->family = 6;
        a->port = s->sin6_port;
        memcpy(a->ip, &s->sin6_addr, 16);
    }
}

/* "IP:PORT" of a. */
static const char *addr_text(const taddr *a, char *buf, size_t n)
{
    char ip[64] = "?";
    inet_ntop(a->family == 4 ? AF_INET : AF_INET6, a->ip, ip, sizeof ip);
    snprintf(buf, n, a->family == 4 ? "%s:%u" : "[%s]:%u", ip, (unsigned)ntohs(a->port));
    return buf;
}

/* This host's address towards the rendezvous host (the route a UDP
 * socket would take: nothing is sent), where the other ranks reach it. */
static int local_address(const char *host, int port, taddr *me, char *err, size_t n)
{
    struct addrinfo hints = {0}, *ai = NULL;
    char ps[16];
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai), fd = -1, ok = 0;
    if (rc != 0) {
        snprintf(err, n, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    for (struct addrinfo *a = ai; a && !ok; a = a->ai_next) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) || (fd = socket(a->ai_family, SOCK_DGRAM, 0)) < 0)
            continue;
        ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&ss, &len) == 0;
        if (ok) from_sockaddr(&ss, me);
        close(fd);
    }
    freeaddrinfo(ai);
    if (!ok) snprintf(err, n, "no route from this host to '%s'", host);
    return ok ? 0 : -1;
}

static void no_delay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small frames go out at once */
}

/* Rank w->rank's socket to every other: it listens on a port of its own
 * (all-gathered at the rendezvous), connects to every lower rank and
 * accepts every higher one, each connection opening with {magic, rank,
 * size}. 0, or -1 with err. */
static int connect_ranks(tworld *w, rdv *r, const char *host, int port, char *err, size_t n)
{
    taddr me, *all = calloc((size_t)w->size, sizeof *all);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char why[200], at[80];
    int lfd = -1, rc = -1;
    double until = comm_now() + w->timeout;
    if (!all) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    if (local_address(host, port, &me, why, sizeof why) != 0) {
        snprintf(err, n, "rank %d: %s", w->rank, why);
        goto out;
    }
    me.port = 0;
    len = to_sockaddr(&me, &ss);
    if ((lfd = socket(ss.ss_family, SOCK_STREAM, 0)) < 0 || bind(lfd, (struct sockaddr *)&ss, len) != 0 ||
        listen(lfd, w->size) != 0 || rdv_nonblocking(lfd) != 0 ||
        getsockname(lfd, (struct sockaddr *)&ss, &(socklen_t){sizeof ss}) != 0) {
        snprintf(err, n, "rank %d cannot listen on %s: %s", w->rank, addr_text(&me, at, sizeof at), strerror(errno));
        goto out;
    }
    from_sockaddr(&ss, &me);
    if (rdv_all_gather(r, &me, all, sizeof me, err, n) != 0) goto out;
    uint32_t hello[3] = {HELLO_MAGIC, (uint32_t)w->rank, (uint32_t)w->size};
    for (int q = 0; q < w->rank; q++) { /* the lower ranks listen already */
        len = to_sockaddr(&all[q], &ss);
        int fd = rdv_connect((struct sockaddr *)&ss, len, until), e = errno;
        if (fd >= 0 && (e = rdv_write(fd, hello, sizeof hello, until)) != 0) {
            e = e == RDV_TIMEOUT ? ETIMEDOUT : e == RDV_CLOSED ? ECONNRESET : errno;
            close(fd);
            fd = -1;
        }
        if (fd < 0) {
            snprintf(err, n, "rank %d cannot connect to rank %d at %s: %s", w->rank, q,
                     addr_text(&all[q], at, sizeof at), strerror(e));
            goto out;
        }
        no_delay(fd);
        w->peer[q].fd = fd;
    }
    for (int arrived = w->rank + 1; arrived < w->size;) {
        int ready = rdv_wait(lfd, POLLIN, until);
        if (ready <= 0) {
            int q = w->rank + 1;
            while (w->peer[q].fd >= 0) q++;
            snprintf(err, n, "rank %d: rank %d did not connect within %g s", w->rank, q, w->timeout);
            goto out;
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue; /* EAGAIN, ECONNABORTED: the next */
        uint32_t h[3] = {0, 0, 0};
        double by = comm_now() + STRANGER_S;
        if (rdv_nonblocking(fd) != 0 || rdv_read(fd, h, sizeof h, by < until ? by : until) != 0 ||
            h[0] != HELLO_MAGIC || h[2] != (uint32_t)w->size || h[1] <= (uint32_t)w->rank ||
            h[1] >= (uint32_t)w->size || w->peer[h[1]].fd >= 0) {
            close(fd); /* a stranger */
            continue;
        }
        no_delay(fd);
        w->peer[h[1]].fd = fd;
        arrived++;
    }
    rc = 0;
out:
    if (lfd >= 0) close(lfd);
    free(all);
    return rc;
}

comm *comm_tcp_connect(const char *host, int port, int rank, int size, double timeout_s, char *err, size_t n)
{
    double timeout = timeout_s > 0 ? timeout_s : comm_timeout_from_env();
    char why[400];
    rdv *r = rdv_open(host, port, rank, size, timeout, err, n);
    if (!r) return NULL;
    tworld *w = world_new(rank, size, timeout);
    int *world = malloc((size_t)size * sizeof *world);
    if (!w || !world) {
        snprintf(err, n, "rank %d: out of memory", rank);
        goto fail;
    }
    if (size > 1 && connect_ranks(w, r, host, port, why, sizeof why) != 0) {
        snprintf(err, n, "connecting the %d ranks (rendezvous at %s:%d): %s", size, host, port, why);
        goto fail;
    }
    for (int q = 0; q < size; q++) {
        world[q] = q;
        w->peer[q].reading = w->peer[q].fd >= 0;
    }
    if (size > 1) {
        if (pthread_create(&w->rx, NULL, receiver, w) != 0) {
            snprintf(err, n, "rank %d: cannot start the receiver thread", rank);
            goto fail;
        }
        w->rx_on = 1;
    }
    rdv_close(r);
    comm *c = handle(w, 0, world, size, rank);
    if (!c) {
        snprintf(err, n, "rank %d: out of memory", rank);
        world_end(w);
    }
    return c;
fail:
    rdv_close(r);
    free(world);
    if (w) world_free(w);
    return NULL;
}

/* A launcher variable: a number from lo; -1 with err if unset or not one. */
static int env_number(const char *name, int lo, char *err, size_t n)
{
    const char *s = getenv(name);
    char *end;
    long v = s ? strtol(s, &end, 10) : -1;
    if (!s || end == s || *end || v < lo || v > 1 << 30) {
        if (s) snprintf(err, n, "%s='%s' is not a %s", name, s, lo ? "number of processes" : "rank");
        else snprintf(err, n, "%s is not set: the TCP communicator takes the rank and the job's size from RANK and "
                      "WORLD_SIZE (torchrun sets them)", name);
        return -1;
    }
    return (int)v;
}

comm *comm_tcp_world(double timeout_s, char *err, size_t n)
{
    char host[256];
    int port = 0, rank = env_number("RANK", 0, err, n), size = rank < 0 ? -1 : env_number("WORLD_SIZE", 1, err, n);
    if (rank < 0 || size < 0) return NULL;
    if (rank >= size) {
        snprintf(err, n, "RANK=%d of WORLD_SIZE=%d: no such rank", rank, size);
        return NULL;
    }
    if (rdv_env_address(host, sizeof host, &port, err, n) != 0) return NULL;
    return comm_tcp_connect(host, port, rank, size, timeout_s, err, n);
}

comm_tcp_state *comm_tcp_state_of(const comm *c)
{
    c = c ? comm_checked_inner(c) : NULL;
    return c && c->v == &tcp_vtbl ? ((const tcomm *)(const void *)c)->w : NULL;
}

void comm_tcp_hold(comm_tcp_state *w)
{
    pthread_mutex_lock(&w->mu);
    w->holds++;
    pthread_mutex_unlock(&w->mu);
}

int comm_tcp_stopped(comm_tcp_state *w, char *why, size_t n)
{
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    int s = w->aborted;
    if (s && why && n) snprintf(why, n, "%s", w->why);
    pthread_mutex_unlock(&w->mu);
    return s;
}

void comm_tcp_stop(comm_tcp_state *w, const char *why)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    stop_locked(w, w->rank, why);
    pthread_mutex_unlock(&w->mu);
    tell_peers(w);
}

void comm_tcp_release(comm_tcp_state *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    int last = --w->holds == 0 && w->ended;
    pthread_mutex_unlock(&w->mu);
    if (last) world_free(w);
}

int comm_tcp_finish(comm *c, int failed, const char *why)
{
    tcomm *t = (tcomm *)c, end = *t;
    tworld *w = t->w;
    int first = failed ? c->rank : -1, ok = 1;
    int32_t flag = failed != 0;
    c->error[0] = '\0';
    if (c->size == 1) return first;
    /* a failed rank waits less than the others' timeout, so that the
     * world stops naming it rather than one that waits for it */
    double grace = w->timeout / 2 < 5 ? w->timeout / 2 : 5, until = comm_now() + (failed ? grace : w->timeout);
    end.group = END_GROUP;
    for (int q = 0; q < c->size && ok; q++)
        if (q != c->rank) ok = put(&end, "the end of the run", q, K_COLL, &flag, sizeof flag, until) == 0;
    for (int q = 0; q < c->size && ok; q++) {
        if (q == c->rank) continue;
        tmsg *m = take(&end, "the end of the run", q, K_COLL, until, failed);
        if (!(ok = m != NULL)) break;
        int32_t f = 0;
        memcpy(&f, m->data, m->bytes == sizeof f ? sizeof f : 0);
        if (f && (first < 0 || q < first)) first = q;
        free(m);
    }
    if (ok) return first;
    if (failed && !stopped(w)) c_abort(c, why); /* the others wait for this rank in a collective */
    pthread_mutex_lock(&w->mu);
    first = w->aborted ? w->by : c->rank;
    snprintf(c->error, sizeof c->error, "%s", w->aborted ? w->why : end.c.error);
    pthread_mutex_unlock(&w->mu);
    return first;
}
