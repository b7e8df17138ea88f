/* comm_nccl_chan.c — the NCCL communicator's ring channels
 * (comm_nccl_impl.h, comm.h's comm_nccl_channels): for a handle whose
 * ranks form a pipeline, a communicator of two ranks and its own stream
 * for each direction between neighbours (rank r to r + 1, and r + 1 to r;
 * with the ring, also the last rank to the first and back).
 *
 * Why. An ncclSend waits on its stream until the peer's ncclRecv has
 * started, so the handle's deferred sends (comm_nccl_p2p.c) go out in one
 * NCCL group with the rank's next receive. The interleaved schedule's
 * order does not pair them: on pp 2 with 4 micro-batches each stage ends
 * up in a group whose receive the other stage posts only after its own
 * group (found by tests/sweep/mesh_sweep.py). On a channel a send waits
 * for nothing but its own receive: its stream carries this rank's sends
 * to that one peer and nothing else, and the peer's channel stream its
 * receives from this rank and nothing else, both in the order they were
 * made. Sends are then as eager as the threads' and MPI's, and a schedule
 * that runs on those runs here: Megatron-LM's batched send/receive pairs
 * are not needed. (PyTorch's process groups likewise give each pair of
 * ranks its own NCCL communicator for point-to-point calls; a channel here
 * is one direction of a pair, so that a blocked send never holds up a
 * receive.)
 *
 * A send copies the data to a staging slot of the channel's (on the
 * owner's stream, after the caller's work: the caller may rewrite its
 * buffer at once), then enqueues the ncclSend on the channel's stream and
 * returns: neither the host nor the caller's stream waits for it. An event
 * recorded after it says when its slot is free again. The world's waits
 * do not wait for a channel's sends either, but its checks (an NCCL error
 * through the watchdog, a failed rank, an abort) stop them; the owner's
 * flush (comm_nccl_flush, at the end of a pipeline's schedule) makes the
 * caller wait for them, so that a send never received shows as the
 * timeout of a wait naming it. A receive is the owner's: on the channel's
 * stream after the caller's work, and the caller's after it (ordered), or
 * waited for.
 *
 * Made by comm_nccl_channels, collective over the handle: two splits a
 * round, in 1 to 3 rounds of pairs that share no rank (even ring: pairs
 * (0,1), (2,3), ... then (1,2), (3,4), ...; an odd one's last pair has a
 * round of its own), so 2 to 6 splits whatever the number of ranks. A
 * channel is a handle of the world (its abort aborts it; the watchdog asks
 * it for errors) freed with its owner.
 */
#include <stdint.h> /* defines: uintptr_t */
#include <stdio.h>  /* defines: snprintf */
#include <string.h> /* defines: memset */

#include "comm_nccl_impl.h"

ncomm *nccl__chan_of(const nchan *at, int peer)
{
    for (int k = 0; k < CHANS; k++)
        if (at[k].h && at[k].peer == peer) return at[k].h;
    return NULL;
}

/* The round of pair i (ranks i and i + 1 mod p): pairs of one round share
 * no rank. */
static int round_of(int i, int p) { return p % 2 && i == p - 1 ? 2 : i % 2; }

/* One split of m: this rank's channel of the round's pairs in direction
 * dir (0: i to i + 1, 1: back), if it is in one. */
static int make_round(ncomm *m, int pairs, int round, int dir)
{
    int p = m->c.size, r = m->c.rank, color = -1, key = 0, peer = -1, any = 0;
    for (int i = 0; i < pairs; i++) {
        if (round_of(i, p) != round) continue;
        int a = dir ? (i + 1) % p : i, b = dir ? i : (i + 1) % p; /* a sends to b */
        any = 1;
        if (r != a && r != b) continue;
        color = i;
        key = r == a ? 0 : 1; /* the sender is the channel's rank 0 */
        peer = r == a ? b : a;
    }
    if (!any) return 0;
    comm *x = NULL;
    if (nccl__split(&m->c, color, key, &x) != 0) return -1;
    if (!x) return 0;
    ncomm *ch = (ncomm *)x;
    nchan *at = key == 0 ? m->out : m->in;
    int k = at[0].h ? 1 : 0;
    at[k].h = ch;
    at[k].peer = peer;
    ch->sending = key == 0;
    snprintf(ch->what, sizeof ch->what, "%s rank %d", ch->sending ? "send to" : "receive from", peer);
    m->chan[m->chans++] = ch;
    return 0;
}

int comm_nccl_channels(comm *c, int ring)
{
    c = c ? (comm *)(uintptr_t)comm_checked_inner(c) : NULL;
    if (!c || c->v != &nccl__vtbl) return 0;
    ncomm *m = (ncomm *)c;
    int p = c->size;
    if (nccl__dead(m, "channels") != 0) return -1;
    if (m->w->group) return comm_fail(c, "channels", "between group_begin and group_end");
    if (m->w->own) return comm_fail(c, "channels", "a queue's own world takes no channels");
    if (p < 2 || m->out[0].h || m->in[0].h) return 0; /* (made already) */
    int pairs = p == 2 ? 1 : ring ? p : p - 1;
    for (int round = 0; round < 3; round++)
        for (int dir = 0; dir < 2; dir++)
            if (make_round(m, pairs, round, dir) != 0) return -1;
    return 0;
}

/* A slot of ch's whose last send is done (or a new one), holding bytes,
 * allocated on the owner m's stream; NULL if out of memory. */
static nslot *free_slot(ncomm *ch, ncomm *m, size_t bytes)
{
    int i = 0;
    for (; i < ch->slots; i++) {
        nslot *s = &ch->slot[i];
        if (!s->busy) break;
        cudaError_t ce = cudaEventQuery(s->sent);
        if (ce == cudaSuccess) break;
        if (ce == cudaErrorNotReady) (void)cudaGetLastError();
    }
    nslot *s = nccl__slot(ch, i, bytes, m->stream);
    if (s && !s->sent && cudaEventCreateWithFlags(&s->sent, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        s->sent = NULL;
        return NULL;
    }
    if (s) s->busy = 0;
    return s;
}

/* Waits until NCCL has enqueued ch's call (a non-blocking communicator
 * takes no other call before), with a wait's checks (recorded in m). */
static int enqueued(ncomm *ch, ncomm *m, const char *op)
{
    int was = ch->touched;
    ch->touched = 1;
    if (nccl__wait_for(m, op, 0) != 0) return -1;
    ch->touched = was;
    return 0;
}

static int in_group(ncomm *m, const char *op)
{
    return comm_fail(&m->c, op, "its channel (comm_nccl_channels) takes no call between group_begin and group_end");
}

/* The start of a channel's call: as nccl__begin's (the world alive, an
 * ordered world's all-to-all counts, the deferred sends out), without
 * ordering m's stream, which the call does not use but to stage a send. */
static int chan_begin(ncomm *m, const char *op)
{
    if (m->w->group) return in_group(m, op);
    nccl__on_gpu(m);
    if (nccl__dead(m, op) != 0 || (m->w->ordered && nccl__check_counts(m) != 0)) return -1;
    return nccl__flush_sends(m, op);
}

int nccl__chan_send(ncomm *m, ncomm *ch, const void *buf, size_t bytes)
{
    const char *op = ch->what;
    if (chan_begin(m, op) != 0) return -1;
    nslot *s = free_slot(ch, m, bytes);
    if (!s) return comm_fail(&m->c, op, "out of device memory staging %zu bytes", bytes);
    /* staged on m's stream (the caller's later work after it; unordered:
     * waited for), then the send on the channel's after it */
    if (nccl__copy_in_turn(m, op, s->data, buf, bytes) != 0) return -1;
    cudaError_t ce = m->w->ordered ? cudaStreamWaitEvent(ch->stream, m->done, 0) : cudaSuccess;
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaStreamWaitEvent", ce);
    ncclResult_t rc = LONE(m, ncclSend(s->data, bytes, ncclChar, 1 - ch->c.rank, ch->nc, ch->stream));
    if (nccl__failed(rc)) return nccl__nccl_fail(ch->nc, m, op, "ncclSend", rc);
    if (enqueued(ch, m, op) != 0) return -1;
    ce = cudaEventRecord(s->sent, ch->stream);
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaEventRecord", ce);
    s->busy = 1;
    s->bytes = bytes;
    ch->inflight = 1;
    ch->last = ch->what;
    return 0;
}

int nccl__chan_recv(ncomm *m, ncomm *ch, void *buf, size_t bytes)
{
    const char *op = ch->what;
    if (chan_begin(m, op) != 0 || nccl__stream_after_caller(ch, m, op) != 0) return -1;
    ncclResult_t rc = LONE(m, ncclRecv(buf, bytes, ncclChar, 1 - ch->c.rank, ch->nc, ch->stream));
    if (nccl__failed(rc)) return nccl__nccl_fail(ch->nc, m, op, "ncclRecv", rc);
    nccl__mark(ch, ch->what);
    return nccl__settle(m, op);
}

/* The sends of m's channels since the last flush: the caller waits for
 * them (ordered: its stream; else the host), as for a call's work; a
 * failure names the channel (or op, when several had sends). */
int nccl__chan_flush(ncomm *m, const char *op)
{
    int any = 0;
    const char *one = op;
    for (int k = 0; k < CHANS; k++) {
        ncomm *ch = m->out[k].h;
        if (!ch || !ch->inflight) continue;
        ch->inflight = 0;
        nccl__mark(ch, ch->what);
        one = ch->what;
        any++;
    }
    return any ? nccl__settle(m, any == 1 ? one : op) : 0;
}

/* m's channels go before it, in the order they were made (every rank's
 * order: each is freed by its two ranks one after the other). */
void nccl__chan_free(ncomm *m)
{
    for (int k = 0; k < m->chans; k++) nccl__free(&m->chan[k]->c);
    m->chans = 0;
    memset(m->out, 0, sizeof m->out);
    memset(m->in, 0, sizeof m->in);
}
