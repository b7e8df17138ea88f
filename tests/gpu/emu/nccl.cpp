/* nccl.cpp (CPU emulation, tests/gpu/emu): NCCL on the emulated GPUs, for
 * runtime/comm_nccl*.c's tests: the ranks of a world are threads of this
 * process, each on its own emulated GPU (MESH_EMU_GPUS of them); with
 * EMU_NCCL_NODE set, processes too (nccl_node.cpp: worlds meet through
 * files, the processes' GPUs those of one node).
 *
 * What it keeps of NCCL:
 *  - Worlds form from a unique id (ncclGetUniqueId; NCCL_COMM_ID makes
 *    every rank's id the same) once all their ranks have called
 *    ncclCommInitRankConfig; two ranks on one GPU fail it (ncclInvalidUsage,
 *    "Duplicate GPU"). ncclCommSplit forms its worlds once every rank of
 *    the parent has called it, ordered by key, then by parent rank.
 *  - Non-blocking communicators (config.blocking = 0): init and split
 *    return ncclInProgress and ncclCommGetAsyncError says ncclInProgress
 *    until the world is formed; after a launch it says ncclInProgress once
 *    more (the enqueue), then ncclSuccess or an error. As NCCL requires, a
 *    communicator whose call returned ncclInProgress takes no other call
 *    (but ncclCommGetAsyncError, ncclGetLastError, ncclCommAbort) until its
 *    state has been seen to be ncclSuccess: ncclInvalidUsage.
 *  - Groups (ncclGroupStart/End, nested, per thread): the outermost end
 *    launches the group's operations; those on one stream go as one item
 *    of the stream's queue (internal.h: Async), so that a group's sends and
 *    receives progress together. A stream's item starts once the items
 *    before it on the stream are done, and is done once every one of its
 *    operations has met its peers': a collective when every rank of the
 *    world has started its (the n-th collective of each rank's
 *    communicator, which must agree in kind, count, type, operation and
 *    root), a send when its peer's receive has started (the n-th of one to
 *    the other; sizes must agree). A rank that never comes leaves the
 *    others' streams busy, as on a GPU: comm_nccl_wait.c's timeout and abort
 *    are what end it.
 *  - Arguments as NCCL checks them (every buffer in the memory of the
 *    communicator's GPU: the host's or another GPU's would fault its
 *    kernel; ranks in range), and in-place forms as NCCL defines them: an
 *    all-reduce or broadcast with sendbuff == recvbuff, a reduce-scatter
 *    with recvbuff == sendbuff + rank x count, an all-gather with sendbuff
 *    == recvbuff + rank x count; any other overlap is refused
 *    (ncclInvalidArgument).
 *  - ncclCommAbort and ncclCommDestroy end the communicator's pending
 *    operations (its streams go on); its peers' stay pending.
 *  - EMU_NCCL_LAG_US holds each launch's item that long before its
 *    operations start, as a slow link would (launch_lag_us).
 *
 * Sums are taken in rank order, in float for the 2-byte types, rounded
 * once. Every call holds the streams' lock (internal.h: async_mutex), so
 * the operations of all ranks are done one at a time. Misuse that NCCL
 * would not report but leave undefined (mismatched collectives or sizes,
 * a destroyed communicator) fails the communicator and is said on stderr
 * ("emu: ...").
 */
#include <nccl.h>

#include <algorithm> /* std::sort */
#include <atomic>    /* std::atomic: the ids' counter */
#include <condition_variable>
#include <cstdarg> /* va_list */
#include <cstdio>  /* snprintf */
#include <cstdlib> /* getenv */
#include <cstring> /* memcpy, memmove, memset */
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unistd.h> /* getpid */
#include <vector>

#include "emu/convert.h"
#include "internal.h"
#include "nccl_impl.h"

using namespace enccl;
using emu::diag;

namespace enccl {
const char *const kind_name[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast",
                                 "ncclReduce",    "ncclSend",          "ncclRecv"};
} /* namespace enccl */

namespace {

std::condition_variable g_cv; /* a world formed (blocking init and split wait) */
std::map<std::string, World *> g_forming;
std::set<ncclComm *> g_comms;
thread_local std::string t_last;
thread_local int t_depth;
thread_local std::vector<Op *> t_ops;
thread_local ncclResult_t t_group_err = ncclSuccess;

using Lock = std::unique_lock<std::mutex>;

ncclResult_t say(ncclComm *c, ncclResult_t rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* rc, with why as the last error (of c, if any) and on stderr. */
ncclResult_t say(ncclComm *c, ncclResult_t rc, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    t_last = buf;
    if (c)
        c->last = buf;
    diag("nccl: %s", buf);
    return rc;
}

} /* namespace */

namespace enccl {

void fail(ncclComm *c, ncclResult_t rc, const std::string &why)
{
    if (!c)
        return;
    if (c->state == ncclSuccess || c->state == ncclInProgress)
        c->state = rc;
    c->last = why;
    diag("nccl: rank %d: %s", c->rank, why.c_str());
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

} /* namespace enccl */

namespace {

/* ---- reductions ------------------------------------------------------------- */

template <class A> struct Codec {
    A (*load)(const char *p);
    void (*store)(char *p, A v);
};

template <class T, class A> A load_as(const char *p)
{
    T v;
    memcpy(&v, p, sizeof v);
    return (A)v;
}
template <class T, class A> void store_as(char *p, A v)
{
    T x = (T)v;
    memcpy(p, &x, sizeof x);
}
/* 2-byte floats through convert.h's conversions */
template <float (*TO_F32)(uint16_t)> float load16(const char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return TO_F32(h);
}
template <uint16_t (*FROM_F32)(float)> void store16(char *p, float v)
{
    uint16_t h = FROM_F32(v);
    memcpy(p, &h, 2);
}

/* dst[i] = red over srcs in rank order of src[i], i < n. */
template <class A>
void reduce_with(const Codec<A> &cd, size_t es, ncclRedOp_t red, const std::vector<const char *> &srcs, char *dst,
                 size_t n)
{
    for (size_t i = 0; i < n; i++) {
        A acc = cd.load(srcs[0] + i * es);
        for (size_t r = 1; r < srcs.size(); r++) {
            A v = cd.load(srcs[r] + i * es);
            switch (red) {
            case ncclProd: acc = acc * v; break;
            case ncclMax: acc = v > acc ? v : acc; break;
            case ncclMin: acc = v < acc ? v : acc; break;
            default: acc = acc + v; break;
            }
        }
        if (red == ncclAvg)
            acc = acc / (A)srcs.size();
        cd.store(dst + i * es, acc);
    }
}

void reduce(ncclDataType_t t, ncclRedOp_t red, const std::vector<const char *> &srcs, char *dst, size_t n)
{
    size_t es = type_size(t);
    switch (t) {
    case ncclInt8: reduce_with<long long>({load_as<int8_t, long long>, store_as<int8_t, long long>}, es, red, srcs, dst, n); break;
    case ncclUint8: reduce_with<unsigned long long>({load_as<uint8_t, unsigned long long>, store_as<uint8_t, unsigned long long>}, es, red, srcs, dst, n); break;
    case ncclInt32: reduce_with<long long>({load_as<int32_t, long long>, store_as<int32_t, long long>}, es, red, srcs, dst, n); break;
    case ncclUint32: reduce_with<unsigned long long>({load_as<uint32_t, unsigned long long>, store_as<uint32_t, unsigned long long>}, es, red, srcs, dst, n); break;
    case ncclInt64: reduce_with<long long>({load_as<int64_t, long long>, store_as<int64_t, long long>}, es, red, srcs, dst, n); break;
    case ncclUint64: reduce_with<unsigned long long>({load_as<uint64_t, unsigned long long>, store_as<uint64_t, unsigned long long>}, es, red, srcs, dst, n); break;
    case ncclFloat16: reduce_with<float>({load16<emu_f16_to_f32>, store16<emu_f32_to_f16>}, es, red, srcs, dst, n); break;
    case ncclBfloat16: reduce_with<float>({load16<emu_bf16_to_f32>, store16<emu_f32_to_bf16>}, es, red, srcs, dst, n); break;
    case ncclFloat32: reduce_with<float>({load_as<float, float>, store_as<float, float>}, es, red, srcs, dst, n); break;
    case ncclFloat64: reduce_with<double>({load_as<double, double>, store_as<double, double>}, es, red, srcs, dst, n); break;
    default: break;
    }
}

} /* namespace */

/* ---- operations and the streams' items ---------------------------------------------- */

namespace enccl {

struct Item : emu::Async {
    cudaStream_t stream;
    std::vector<Op *> ops;
    size_t left = 0;
    bool all_posted = false;
    bool held = false; /* EMU_NCCL_LAG_US: held that long once it starts */
    ~Item() override
    {
        for (Op *op : ops)
            delete op;
    }
    void start() override;
};

void finish(Op *op)
{
    if (op->done)
        return;
    op->done = true;
    if (op->c)
        op->c->live.erase(op);
    Item *it = op->item;
    if (--it->left == 0 && it->all_posted)
        emu::async_done(it);
}

} /* namespace enccl */

namespace {

} /* namespace */

namespace enccl {

std::string disagreement(const Op &a, int ra, const Op &b, int rb)
{
    if (b.kind == a.kind && b.count == a.count && b.type == a.type &&
        (a.kind == ALL_GATHER || a.kind == BROADCAST || b.red == a.red) &&
        !((a.kind == BROADCAST || a.kind == REDUCE) && b.peer != a.peer))
        return "";
    char why[300];
    snprintf(why, sizeof why,
             "collective #%llu does not agree: rank %d called %s (count %zu, type %d, op %d, root %d), "
             "rank %d %s (count %zu, type %d, op %d, root %d)",
             a.seq, ra, kind_name[a.kind], a.count, (int)a.type, (int)a.red, a.peer, rb, kind_name[b.kind],
             b.count, (int)b.type, (int)b.red, b.peer);
    return why;
}

void collective_output(const Op &a, const std::vector<const char *> &in, int r, int n, std::vector<char> &o)
{
    size_t es = type_size(a.type), count = a.count, p = (size_t)n;
    o.clear();
    switch (a.kind) {
    case ALL_REDUCE:
        o.resize(count * es);
        reduce(a.type, a.red, in, o.data(), count);
        break;
    case REDUCE:
        if (r != a.peer)
            break;
        o.resize(count * es);
        reduce(a.type, a.red, in, o.data(), count);
        break;
    case REDUCE_SCATTER: {
        std::vector<const char *> part;
        for (const char *x : in)
            part.push_back(x + (size_t)r * count * es);
        o.resize(count * es);
        reduce(a.type, a.red, part, o.data(), count);
        break;
    }
    case ALL_GATHER:
        o.resize(p * count * es);
        for (size_t q = 0; q < p; q++)
            memcpy(o.data() + q * count * es, in[q], count * es);
        break;
    case BROADCAST:
        o.assign(in[(size_t)a.peer], in[(size_t)a.peer] + count * es);
        break;
    default: break;
    }
}

} /* namespace enccl */

namespace {

/* The operations of one collective, every rank's started: checked to
 * agree, then done, outputs computed from every input before any is
 * written (the in-place forms). */
void run_collective(World *w, World::Coll &k)
{
    const Op *a = k.ops[0];
    for (int r = 1; r < w->n; r++) {
        std::string why = disagreement(*a, 0, *k.ops[(size_t)r], r);
        if (!why.empty()) {
            for (Op *op : k.ops)
                fail(op->c, ncclInvalidUsage, why);
            for (Op *op : k.ops)
                finish(op);
            return;
        }
    }
    std::vector<std::vector<char>> out((size_t)w->n);
    std::vector<const char *> in;
    for (const Op *op : k.ops)
        in.push_back((const char *)op->send);
    for (int r = 0; r < w->n; r++)
        collective_output(*a, in, r, w->n, out[(size_t)r]);
    for (int r = 0; r < w->n; r++)
        if (!out[(size_t)r].empty())
            memcpy(k.ops[(size_t)r]->recv, out[(size_t)r].data(), out[(size_t)r].size());
    for (Op *op : k.ops)
        finish(op);
}

/* A send and the receive it meets. */
void transfer(Op *s, Op *r)
{
    size_t sb = s->count * type_size(s->type), rb = r->count * type_size(r->type);
    if (sb != rb) {
        char why[200];
        snprintf(why, sizeof why, "transfer #%llu from rank %d to rank %d: %zu bytes sent, %zu received", s->seq,
                 s->c ? s->c->rank : -1, r->c ? r->c->rank : -1, sb, rb);
        fail(s->c, ncclInvalidUsage, why);
        fail(r->c, ncclInvalidUsage, why);
    } else if (sb) {
        memmove(r->recv, s->send, sb);
    }
    finish(s);
    finish(r);
}

/* op, first of its stream: meets its peers' (or waits for them). */
void post(Op *op)
{
    ncclComm *c = op->c;
    World *w = c->w;
    op->posted = true;
    if (op->kind == SEND || op->kind == RECV) {
        bool send = op->kind == SEND;
        std::pair<int, int> key = send ? std::make_pair(c->rank, op->peer) : std::make_pair(op->peer, c->rank);
        op->seq = send ? c->sent[op->peer]++ : c->received[op->peer]++;
        if (w->node) {
            node_post(op);
            return;
        }
        std::deque<Op *> &other = send ? w->recvs[key] : w->sends[key];
        if (other.empty()) {
            (send ? w->sends[key] : w->recvs[key]).push_back(op);
            return;
        }
        Op *peer = other.front();
        other.pop_front();
        send ? transfer(op, peer) : transfer(peer, op);
        return;
    }
    op->seq = c->colls++;
    if (w->node) {
        node_post(op);
        return;
    }
    World::Coll &k = w->colls[op->seq];
    if (k.ops.empty())
        k.ops.assign((size_t)w->n, nullptr);
    k.ops[(size_t)c->rank] = op;
    if (++k.posted < w->n)
        return;
    World::Coll whole = k;
    w->colls.erase(op->seq);
    run_collective(w, whole);
}

} /* namespace */

/* EMU_NCCL_LAG_US (0 to 1000000; default 0): how long each launch's item
 * is held once its stream gets to it, before its operations start, so
 * that every NCCL call takes at least that long on its stream (as a slow
 * link would): tests of what the executor measures on the GPU. */
static long launch_lag_us()
{
    static const long lag = [] {
        const char *e = getenv("EMU_NCCL_LAG_US");
        long v = e ? atol(e) : 0;
        return v < 0 ? 0 : v > 1000000 ? 1000000 : v;
    }();
    return lag;
}

void enccl::Item::start()
{
    if (launch_lag_us() > 0 && !held) {
        held = true;
        emu::after_us(launch_lag_us(), [this] { start(); });
        return;
    }
    for (Op *op : ops)
        if (op->doomed && op->c) /* EMU_FAIL=nccl:N: it never meets its peers */
            fail(op->c, ncclSystemError, "a network failure (EMU_FAIL): this operation will not end");
        else if (!op->done && op->c)
            post(op);
    all_posted = true;
    if (left == 0)
        emu::async_done(this);
}

namespace {

/* Takes op out of what waits for peers (an abort). */
void unpost(Op *op)
{
    World *w = op->c->w;
    if (!op->posted || !w)
        return;
    if (w->node) {
        node_unpost(op);
        return;
    }
    if (op->kind == SEND || op->kind == RECV) {
        bool send = op->kind == SEND;
        std::pair<int, int> key = send ? std::make_pair(op->c->rank, op->peer) : std::make_pair(op->peer, op->c->rank);
        std::deque<Op *> &q = send ? w->sends[key] : w->recvs[key];
        for (auto it = q.begin(); it != q.end(); ++it)
            if (*it == op) {
                q.erase(it);
                break;
            }
        return;
    }
    auto it = w->colls.find(op->seq);
    if (it == w->colls.end())
        return;
    it->second.ops[(size_t)op->c->rank] = nullptr;
    if (--it->second.posted == 0)
        w->colls.erase(it);
}

/* c goes (abort, destroy): its pending operations end, its world loses it. */
void drop(ncclComm *c)
{
    /* Every operation first out of reach (unposted, without a
     * communicator), then ended: ending one may end its stream's item,
     * which starts the next, whose operations of c would otherwise be
     * posted, met, ended and freed while still in this list. */
    std::vector<Op *> live(c->live.begin(), c->live.end());
    for (Op *op : live) {
        unpost(op);
        op->c = nullptr;
    }
    c->live.clear();
    for (Op *op : live)
        finish(op);
    g_comms.erase(c);
    World *w = c->w;
    if (w && w->node)
        node_leave(c);
    if (w) {
        if (c->rank >= 0 && c->rank < w->n && w->members[(size_t)c->rank] == c)
            w->members[(size_t)c->rank] = nullptr;
        if (!w->formed)
            w->joined--;
        if (--w->alive == 0) {
            if (!w->formed)
                g_forming.erase(w->id);
            if (w->node)
                node_forget(w);
            delete w;
        }
    }
    delete c;
}

/* 0 when c is a communicator not destroyed nor aborted. */
ncclResult_t alive(ncclComm *c, const char *call)
{
    if (g_comms.count(c))
        return ncclSuccess;
    return say(nullptr, ncclInvalidArgument, "%s on communicator %p, which is not alive (destroyed or aborted)", call,
               (void *)c);
}

/* 0 when c may take work. */
ncclResult_t usable(ncclComm *c, const char *call)
{
    if (alive(c, call) != ncclSuccess)
        return ncclInvalidArgument;
    if (c->state == ncclInProgress || c->splitting)
        return say(c, ncclInvalidUsage, "%s on a communicator still being made", call);
    /* NCCL: after ncclInProgress, poll the state until ncclSuccess before any other call */
    if (c->launching && c->state == ncclSuccess)
        return say(c, ncclInvalidUsage,
                   "%s on rank %d's communicator while its last launch is in progress (ncclCommGetAsyncError "
                   "has not said ncclSuccess since it returned ncclInProgress)",
                   call, c->rank);
    return c->state;
}

bool overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* NCCL's argument checks, and the in-place forms. */
ncclResult_t check(const Op &op, const char *call)
{
    ncclResult_t rc = usable(op.c, call);
    if (rc != ncclSuccess)
        return rc;
    ncclComm *c = op.c;
    size_t es = type_size(op.type), n = (size_t)c->w->n;
    if (!es)
        return say(c, ncclInvalidArgument, "%s: invalid data type %d", call, (int)op.type);
    if ((unsigned)op.red >= (unsigned)ncclNumOps)
        return say(c, ncclInvalidArgument, "%s: invalid reduction %d", call, (int)op.red);
    if (!emu::stream_ok(op.stream))
        return say(c, ncclUnhandledCudaError, "%s: stream %p is not a live CUDA stream", call, (void *)op.stream);
    bool rooted = op.kind == BROADCAST || op.kind == REDUCE || op.kind == SEND || op.kind == RECV;
    if (rooted && (op.peer < 0 || op.peer >= c->w->n))
        return say(c, ncclInvalidArgument, "%s: rank %d of a world of %d", call, op.peer, c->w->n);
    size_t in = op.count * es, out = op.count * es;
    if (op.kind == REDUCE_SCATTER)
        in *= n;
    if (op.kind == ALL_GATHER)
        out *= n;
    bool reads = op.kind != RECV && !((op.kind == BROADCAST) && op.peer != c->rank);
    bool writes = op.kind != SEND && !(op.kind == REDUCE && op.peer != c->rank);
    /* (another GPU's memory would fault NCCL's kernel, as the host's would) */
    if (reads && in && emu::device_of(op.send, in) != c->device)
        return say(c, ncclInvalidArgument, "%s: sendbuff [%p, +%zu) is not memory of CUDA device %d", call, op.send,
                   in, c->device);
    if (writes && out && emu::device_of(op.recv, out) != c->device)
        return say(c, ncclInvalidArgument, "%s: recvbuff [%p, +%zu) is not memory of CUDA device %d", call, op.recv,
                   out, c->device);
    if (reads && writes && overlap(op.send, in, op.recv, out)) {
        const char *s = (const char *)op.send;
        const char *r = (const char *)op.recv;
        bool in_place = op.kind == REDUCE_SCATTER ? r == s + (size_t)c->rank * out
                        : op.kind == ALL_GATHER   ? s == r + (size_t)c->rank * in
                                                  : s == r;
        if (!in_place)
            return say(c, ncclInvalidArgument,
                       "%s: sendbuff [%p, +%zu) and recvbuff [%p, +%zu) overlap, not in NCCL's in-place form", call,
                       op.send, in, op.recv, out);
    }
    return ncclSuccess;
}

/* Launches a group's operations (under the lock): one item per stream. */
ncclResult_t launch(std::vector<Op *> &ops)
{
    bool nonblocking = false;
    std::vector<Item *> items;
    for (Op *op : ops) {
        Item *it = nullptr;
        for (Item *x : items)
            if (x->stream == op->stream)
                it = x;
        if (!it) {
            it = new Item;
            it->stream = op->stream;
            items.push_back(it);
        }
        op->item = it;
        it->ops.push_back(op);
        it->left++;
        op->c->live.insert(op);
        if (!op->c->blocking) {
            op->c->launching = true;
            op->c->launch_polls = 1;
        }
        nonblocking |= !op->c->blocking;
    }
    ops.clear();
    for (Item *it : items)
        emu::async_enqueue(it->stream, it);
    return nonblocking ? ncclInProgress : ncclSuccess;
}

/* An operation: checked, then recorded in the thread's group, else
 * launched alone. */
ncclResult_t call(Kind kind, const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t red,
                  int peer, ncclComm *c, cudaStream_t stream)
{
    Lock lk(emu::async_mutex());
    Op *op = new Op{kind, send, recv, count, type, red, peer, c, stream};
    ncclResult_t rc = check(*op, kind_name[kind]);
    if (rc != ncclSuccess) {
        delete op;
        if (t_depth > 0 && t_group_err == ncclSuccess)
            t_group_err = rc;
        return rc;
    }
    if (count == 0) { /* nothing moves */
        delete op;
        return ncclSuccess;
    }
    op->doomed = emu::fault_here(emu::FAULT_NCCL, kind_name[kind]);
    if (t_depth > 0) {
        t_ops.push_back(op);
        return ncclSuccess;
    }
    std::vector<Op *> one{op};
    return launch(one);
}

/* Forms a split once every rank of the parent world has called it. */
void form_split(World *w, World::Split &sp)
{
    for (const auto &kv : split_groups(sp.color, sp.key)) {
        const std::vector<int> &ranks = kv.second;
        World *nw = new World;
        nw->formed = true;
        for (int r : ranks) {
            ncclComm *child = sp.child[(size_t)r];
            if (!g_comms.count(child))
                continue; /* aborted while forming */
            child->w = nw;
            child->rank = (int)nw->members.size();
            child->state = ncclSuccess;
            nw->members.push_back(child);
            nw->alive++;
        }
        nw->n = (int)nw->members.size();
        if (nw->alive == 0)
            delete nw;
    }
    for (ncclComm *m : w->members)
        if (m)
            m->splitting--;
}

bool blocking_config(const ncclConfig_t *config)
{
    return !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
}

} /* namespace */

namespace enccl {

std::map<int, std::vector<int>> split_groups(const std::vector<int> &color, const std::vector<int> &key)
{
    std::map<int, std::vector<int>> by_color;
    for (size_t r = 0; r < color.size(); r++)
        if (color[r] != NCCL_SPLIT_NOCOLOR)
            by_color[color[r]].push_back((int)r);
    for (auto &kv : by_color)
        std::sort(kv.second.begin(), kv.second.end(), [&key](int a, int b) {
            return key[(size_t)a] != key[(size_t)b] ? key[(size_t)a] < key[(size_t)b] : a < b;
        });
    return by_color;
}

std::condition_variable &formed_cv()
{
    return g_cv;
}

bool comm_alive(ncclComm *c)
{
    return g_comms.count(c) != 0;
}

/* The GPUs must differ. */
void world_formed(World *w, const std::vector<Gpu> &gpu)
{
    g_forming.erase(w->id);
    w->formed = true;
    for (int a = 0; a < w->n; a++)
        for (int b = a + 1; b < w->n; b++)
            if (gpu[(size_t)a] == gpu[(size_t)b]) {
                const Gpu &d = gpu[(size_t)a];
                char why[240];
                snprintf(why, sizeof why, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d%s%s",
                         a, b, d.device, d.host.empty() ? "" : " of host ", d.host.c_str());
                for (ncclComm *m : w->members)
                    fail(m, ncclInvalidUsage, why);
                return;
            }
    for (ncclComm *m : w->members)
        if (m)
            m->state = ncclSuccess;
}

} /* namespace enccl */

/* ---- the API --------------------------------------------------------------- */

extern "C" ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static std::atomic<unsigned long long> counter{0};
    if (!id)
        return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    const char *root = getenv("NCCL_COMM_ID");
    if (root)
        snprintf(id->internal, sizeof id->internal, "NCCL_COMM_ID=%s", root);
    else
        snprintf(id->internal, sizeof id->internal, "emu %d %llu", (int)getpid(), ++counter);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                               ncclConfig_t *config)
{
    if (!comm)
        return say(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return say(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d", rank, nranks);
    if (emu::sticky_error() != cudaSuccess)
        return say(nullptr, ncclUnhandledCudaError, "ncclCommInitRankConfig: the GPU has failed");
    if (emu::fault_here(emu::FAULT_CREATE, "ncclCommInitRankConfig"))
        return say(nullptr, ncclSystemError, "ncclCommInitRankConfig: rank %d of %d failed (EMU_FAIL)", rank, nranks);
    int maker = 0;
    unsigned long long serial = 0;
    if (!node_on() && sscanf(commId.internal, "emu %d %llu", &maker, &serial) == 2 && maker != (int)getpid())
        return say(nullptr, ncclInvalidUsage,
                   "ncclCommInitRankConfig: the id is process %d's (set EMU_NCCL_NODE to join processes)",
                   maker);
    Lock lk(emu::async_mutex());
    std::string key(commId.internal, sizeof commId.internal);
    World *&w = g_forming[key];
    if (!w) {
        w = new World;
        w->id = key;
        w->n = nranks;
        w->members.assign((size_t)nranks, nullptr);
    }
    if (w->n != nranks)
        return say(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: rank %d says %d ranks, another said %d",
                   rank, nranks, w->n);
    if (w->members[(size_t)rank])
        return say(nullptr, ncclInvalidUsage, "ncclCommInitRankConfig: rank %d of this id came twice", rank);
    ncclComm *c = new ncclComm;
    c->w = w;
    c->rank = rank;
    c->device = emu::current_device();
    c->blocking = blocking_config(config);
    w->members[(size_t)rank] = c;
    w->joined++;
    w->alive++;
    g_comms.insert(c);
    *comm = c;
    if (node_on()) { /* (the world forms once every rank's files are there: nccl_node.cpp) */
        ncclResult_t rc = node_join(w, c);
        if (rc != ncclSuccess) {
            *comm = nullptr;
            std::string why = c->last;
            drop(c);
            return say(nullptr, rc, "ncclCommInitRankConfig: %s", why.c_str());
        }
    } else if (w->joined == w->n) {
        std::vector<Gpu> gpu;
        for (ncclComm *m : w->members)
            gpu.push_back(Gpu{m->device, ""});
        world_formed(w, gpu);
        g_cv.notify_all();
    }
    if (!c->blocking)
        return c->state == ncclSuccess ? ncclSuccess : ncclInProgress;
    g_cv.wait(lk, [c] { return c->state != ncclInProgress; });
    return c->state;
}

extern "C" ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                      ncclConfig_t *config)
{
    if (!newcomm)
        return say(nullptr, ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    *newcomm = nullptr;
    Lock lk(emu::async_mutex());
    ncclResult_t rc = usable(comm, "ncclCommSplit");
    if (rc != ncclSuccess)
        return rc;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return say(comm, ncclInvalidArgument, "ncclCommSplit: color %d", color);
    if (emu::fault_here(emu::FAULT_CREATE, "ncclCommSplit"))
        return say(comm, ncclSystemError, "ncclCommSplit: rank %d failed (EMU_FAIL)", comm->rank);
    World *w = comm->w;
    unsigned long long k = comm->splits++;
    ncclComm *child = nullptr;
    if (color != NCCL_SPLIT_NOCOLOR) {
        child = new ncclComm;
        child->device = comm->device;
        child->blocking = blocking_config(config);
        g_comms.insert(child);
        *newcomm = child;
    }
    comm->splitting++;
    if (w->node) {
        node_split(comm, k, color, key, child); /* (forms once every rank's files are there) */
    } else {
        World::Split &sp = w->splits[k];
        if (sp.color.empty()) {
            sp.color.assign((size_t)w->n, NCCL_SPLIT_NOCOLOR);
            sp.key.assign((size_t)w->n, 0);
            sp.child.assign((size_t)w->n, nullptr);
        }
        sp.color[(size_t)comm->rank] = color;
        sp.key[(size_t)comm->rank] = key;
        sp.child[(size_t)comm->rank] = child;
        if (++sp.arrived == w->n) {
            World::Split whole = sp;
            w->splits.erase(k);
            form_split(w, whole);
            g_cv.notify_all();
        }
    }
    if (!blocking_config(config) || !comm->blocking)
        return comm->splitting ? ncclInProgress : ncclSuccess;
    g_cv.wait(lk, [comm] { return comm->splitting == 0; });
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!asyncError)
        return ncclInvalidArgument;
    Lock lk(emu::async_mutex());
    if (alive(comm, "ncclCommGetAsyncError") != ncclSuccess)
        return ncclInvalidArgument;
    if (comm->state != ncclSuccess)
        *asyncError = comm->state;
    else if (comm->splitting || (comm->finalizing && !comm->live.empty()))
        *asyncError = ncclInProgress;
    else if (comm->launching && comm->launch_polls > 0) {
        comm->launch_polls--;
        *asyncError = ncclInProgress;
    } else if (comm->launching) {
        comm->launching = false;
        *asyncError = ncclSuccess;
    } else
        *asyncError = ncclSuccess;
    if (*asyncError == ncclSuccess && emu::sticky_error(comm->device) != cudaSuccess)
        *asyncError = ncclUnhandledCudaError;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    Lock lk(emu::async_mutex());
    if (alive(comm, "ncclCommFinalize") != ncclSuccess)
        return ncclInvalidArgument;
    if (comm->launching && comm->state == ncclSuccess)
        return say(comm, ncclInvalidUsage, "ncclCommFinalize while the communicator's last launch is in progress");
    comm->finalizing = true;
    if (comm->live.empty())
        return ncclSuccess;
    if (!comm->blocking)
        return ncclInProgress;
    lk.unlock();
    for (;;) { /* blocking: until its work is done */
        lk.lock();
        bool done = comm->live.empty();
        lk.unlock();
        if (done)
            return ncclSuccess;
        usleep(100);
    }
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    Lock lk(emu::async_mutex());
    if (alive(comm, "ncclCommDestroy") != ncclSuccess)
        return ncclInvalidArgument;
    if (!comm->live.empty())
        diag("nccl: ncclCommDestroy of rank %d with %zu operations pending (not finalized): they are ended",
             comm->rank, comm->live.size());
    drop(comm);
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    Lock lk(emu::async_mutex());
    if (alive(comm, "ncclCommAbort") != ncclSuccess)
        return ncclInvalidArgument;
    drop(comm);
    return ncclSuccess;
}

extern "C" const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

extern "C" const char *ncclGetLastError(ncclComm_t comm)
{
    static thread_local std::string copy;
    Lock lk(emu::async_mutex());
    copy = comm && g_comms.count(comm) && !comm->last.empty() ? comm->last : t_last;
    return copy.c_str();
}

extern "C" ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    Lock lk(emu::async_mutex());
    if (!count || !g_comms.count(comm) || !comm->w || comm->state == ncclInProgress)
        return ncclInvalidArgument;
    *count = comm->w->n;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    Lock lk(emu::async_mutex());
    if (!device || !g_comms.count(comm))
        return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    Lock lk(emu::async_mutex());
    if (!rank || !g_comms.count(comm) || !comm->w || comm->state == ncclInProgress)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return call(REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

extern "C" ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      int root, ncclComm_t comm, cudaStream_t stream)
{
    return call(BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

extern "C" ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return call(ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

extern "C" ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream)
{
    return call(REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

extern "C" ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return call(ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

extern "C" ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream)
{
    return call(SEND, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream);
}

extern "C" ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                 cudaStream_t stream)
{
    return call(RECV, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}

extern "C" ncclResult_t ncclGroupStart(void)
{
    t_depth++;
    return ncclSuccess;
}

extern "C" ncclResult_t ncclGroupEnd(void)
{
    if (t_depth == 0)
        return say(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t_depth > 0)
        return ncclSuccess;
    Lock lk(emu::async_mutex());
    ncclResult_t err = t_group_err;
    t_group_err = ncclSuccess;
    std::vector<Op *> ops;
    ops.swap(t_ops);
    for (Op *op : ops) /* a communicator may have gone since its call */
        if (err == ncclSuccess)
            err = usable(op->c, "ncclGroupEnd");
    if (err != ncclSuccess) {
        for (Op *op : ops)
            delete op;
        return err;
    }
    return ops.empty() ? ncclSuccess : launch(ops);
}
