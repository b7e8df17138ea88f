/* comm_nccl_p2p.c — the NCCL communicator's sends and receives
 * (comm_nccl_impl.h): a send is staged on the device and deferred, issued
 * with the process's next call (in one NCCL group with it when that call
 * is a receive), at a group's end, or when the handle is freed (the top
 * of comm_nccl.c says why); a receive from oneself outside a group copies
 * the oldest send to oneself without NCCL. A send to (a receive from) a
 * ring neighbour with a channel of its own goes there instead
 * (comm_nccl_chan.c).
 */
#include <stdio.h>  /* defines: snprintf */
#include <stdlib.h> /* defines: realloc */
#include <string.h> /* defines: memset, memmove */

#include "comm_nccl_impl.h"

/* Issues the world's deferred sends, inside an NCCL group; on a failure,
 * *bad is the handle whose send failed. Sends to oneself stay pending (a
 * receive takes them without NCCL), unless self: at a group's end, where
 * the group's receive from oneself takes them through NCCL. */
ncclResult_t nccl__issue_sends(nworld *w, int self, ncomm **bad)
{
    for (ncomm *x = w->comms; x; x = x->next) {
        int kept = 0;
        for (int i = 0; i < x->pending; i++) {
            nslot s = x->slot[i];
            if (s.peer == x->c.rank && !self) { /* kept, in order; its slot's buffer moves to i */
                x->slot[i] = x->slot[kept];
                x->slot[kept++] = s;
                continue;
            }
            ncclResult_t rc = ncclSend(s.data, s.bytes, ncclChar, s.peer, x->nc, x->stream);
            if (nccl__failed(rc)) {
                *bad = x;
                return rc;
            }
            nccl__mark(x, "send");
        }
        x->pending = kept; /* the issued buffers stay untouched until the wait for them ends */
    }
    return ncclSuccess;
}

/* Whether any deferred send would go through NCCL. */
static int any_pending(const nworld *w)
{
    for (const ncomm *x = w->comms; x; x = x->next)
        for (int i = 0; i < x->pending; i++)
            if (x->slot[i].peer != x->c.rank) return 1;
    return 0;
}

/* The deferred sends go out before a call that is not a receive, and the
 * call waits for them to be received. */
int nccl__flush_sends(ncomm *m, const char *op)
{
    ncomm *bad = m;
    if (!any_pending(m->w)) return 0;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl__nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    rc = nccl__issue_sends(m->w, 0, &bad);
    return nccl__close_group(m, op, "ncclSend", rc, bad);
}

/* A copy between device buffers for a call (a send's staging, a receive
 * from oneself): waited for, or, in an ordered world, between the
 * caller's work before and after it (m->done recorded after it). */
int nccl__copy_in_turn(ncomm *m, const char *op, void *dst, const void *src, size_t bytes)
{
    if (!m->w->ordered) return nccl__copy_wait(m, op, dst, src, bytes, cudaMemcpyDeviceToDevice);
    if (nccl__after_caller(m, op) != 0) return -1;
    cudaError_t ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, m->stream);
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaMemcpyAsync", ce);
    m->touched = 1; /* (not fresh: joined now; in a group, a fresh NCCL call stays fresh) */
    m->last = op;
    return nccl__join_caller(m, m, op);
}

static int peer_ok(comm *c, int peer, const char *what)
{
    if (peer >= 0 && peer < c->size) return 1;
    snprintf(c->error, sizeof c->error, "%s rank %d of a group of %d", what, peer, c->size);
    return 0;
}

/* Slot i of m's (made, with the ones before it, if m has fewer), holding
 * at least bytes: a smaller buffer is replaced, in stream's order (a
 * cudaFree would wait for every stream of the GPU); NULL if out of
 * memory. */
nslot *nccl__slot(ncomm *m, int i, size_t bytes, cudaStream_t stream)
{
    while (i >= m->slots) {
        int n = m->slots ? 2 * m->slots : 4;
        nslot *s = realloc(m->slot, (size_t)n * sizeof *s);
        if (!s) return NULL;
        memset(s + m->slots, 0, (size_t)(n - m->slots) * sizeof *s);
        m->slot = s;
        m->slots = n;
    }
    nslot *s = &m->slot[i];
    if (s->cap < bytes) {
        if (s->data) (void)cudaFreeAsync(s->data, stream);
        s->data = NULL;
        s->cap = 0;
        if (cudaSetDevice(m->w->device) != cudaSuccess || cudaMallocAsync(&s->data, bytes, stream) != cudaSuccess) {
            (void)cudaGetLastError();
            s->data = NULL;
            return NULL;
        }
        s->cap = bytes;
    }
    return s;
}

/* Eager on NCCL's terms: the data is copied to a staging buffer and the
 * send deferred (see the top of comm_nccl.c). */
int nccl__send(comm *c, const void *buf, size_t bytes, int peer)
{
    ncomm *m = (ncomm *)c;
    if (!peer_ok(c, peer, "send to") || nccl__dead(m, "send") != 0 || nccl__on_device(m, "send", buf, bytes) != 0)
        return -1;
    if (bytes == 0) return 0; /* as the receive of 0 bytes: nothing moves */
    ncomm *ch = nccl__chan_of(m->out, peer);
    if (ch) return nccl__chan_send(m, ch, buf, bytes);
    nslot *s = nccl__slot(m, m->pending, bytes, m->stream); /* at the end of the pending ones */
    if (!s) return comm_fail(c, "send", "out of device memory staging %zu bytes", bytes);
    if (nccl__copy_in_turn(m, "send", s->data, buf, bytes) != 0) return -1;
    s->bytes = bytes;
    s->peer = peer;
    m->pending++;
    return 0;
}

/* A receive from oneself, outside a group: the oldest send to oneself,
 * copied from its staging buffer (NCCL is not involved, so any number of
 * sends to oneself may come first). */
static int recv_self(ncomm *m, void *buf, size_t bytes)
{
    int j = 0;
    while (j < m->pending && m->slot[j].peer != m->c.rank) j++;
    if (j == m->pending)
        return comm_fail(&m->c, "receive", "from itself (rank %d), which sent it nothing", m->c.rank);
    nslot s = m->slot[j];
    memmove(&m->slot[j], &m->slot[j + 1], (size_t)(m->pending - j - 1) * sizeof s);
    m->slot[--m->pending] = s; /* taken: its buffer is free again */
    if (s.bytes != bytes) {
        snprintf(m->c.error, sizeof m->c.error, "receive from rank %d: %zu bytes sent, %zu expected", m->c.rank,
                 s.bytes, bytes);
        return -1;
    }
    return nccl__copy_in_turn(m, "receive", buf, s.data, bytes);
}

/* Outside a group: one NCCL group with the world's deferred sends. */
int nccl__recv(comm *c, void *buf, size_t bytes, int peer)
{
    ncomm *m = (ncomm *)c;
    if (!peer_ok(c, peer, "receive from") || nccl__dead(m, "receive") != 0 ||
        nccl__on_device(m, "receive", buf, bytes) != 0)
        return -1;
    if (bytes == 0) return 0;
    ncomm *ch = nccl__chan_of(m->in, peer);
    if (ch) return nccl__chan_recv(m, ch, buf, bytes);
    if (m->w->group)
        return nccl__after_caller(m, "receive") != 0
                 ? -1
                 : nccl__issued(m, "receive", "ncclRecv", ncclRecv(buf, bytes, ncclChar, peer, m->nc, m->stream));
    if (peer == c->rank) return nccl__begin(m, "receive") != 0 ? -1 : recv_self(m, buf, bytes);
    if (nccl__after_caller(m, "receive") != 0) return -1;
    ncomm *bad = m;
    const char *call = "ncclSend";
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl__nccl_fail(m->nc, m, "receive", "ncclGroupStart", rc);
    rc = nccl__issue_sends(m->w, 0, &bad);
    if (!nccl__failed(rc)) {
        bad = m;
        call = "ncclRecv";
        rc = ncclRecv(buf, bytes, ncclChar, peer, m->nc, m->stream);
        nccl__mark(m, "receive");
    }
    return nccl__close_group(m, "receive", call, rc, bad);
}
