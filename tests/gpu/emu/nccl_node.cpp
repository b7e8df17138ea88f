/* nccl_node.cpp (CPU emulation, tests/gpu/emu): NCCL worlds whose ranks
 * may be processes, as on one node with several GPUs: with EMU_NCCL_NODE
 * set to a folder that the processes share, every world forms and meets
 * through files there (nccl.cpp keeps the API and the worlds of threads).
 *
 * A world has a folder, EMU_NCCL_NODE/w<hash of its id and size>; a world
 * split from it, one named after the parent's, the split and the color.
 * Each file appears whole: it is written under a temporary name, then
 * linked to its names.
 *  - join.R: rank R came, on GPU D of its machine ("D PID HOST", HOST
 *    the process's EMU_NCCL_HOST, empty unset: processes of several
 *    emulated machines may share the folder, which stands for their
 *    network); the world forms when every rank's is there, and fails as
 *    NCCL does when two ranks share a GPU of one machine. alive.R: rank
 *    R has not left; the last rank out removes the folder.
 *  - split.K.R: rank R's color and key for the world's K-th split.
 *  - c.S.F.T: rank F's part of the world's S-th collective, for rank T:
 *    its call (kind, count, type, operation, root) and its input (none for
 *    a broadcast's other ranks). One file, linked once per rank; each rank
 *    reads every rank's, checks that the calls agree, computes its own
 *    output in rank order (nccl.cpp: collective_output, as for threads),
 *    and unlinks its links.
 *  - p.F.T.S: the S-th send from F to T, with its data; r.F.T.S: T's
 *    receive of it has started (with its size). A send is done when its
 *    receive has started, a receive when the data is there, as for
 *    threads; each side checks the sizes agree.
 * Posting writes the files at once; a thread of this process (started
 * with the first such world) then looks for what its ranks wait for, from
 * every 10 us to every 1 ms while nothing comes. A rank that never comes
 * (a process that died) leaves the others waiting, as on a GPU:
 * comm_nccl_wait.c's timeout and abort end it. Everything runs under the
 * streams' lock (internal.h: async_mutex).
 */
#include <dirent.h>   /* opendir */
#include <fcntl.h>    /* open */
#include <sys/stat.h> /* mkdir */
#include <unistd.h>   /* link, unlink, getpid */

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "internal.h"
#include "nccl_impl.h"

namespace enccl {

struct Node {
    std::string dir;
    std::vector<Gpu> gpu; /* per rank, once formed */
    std::set<int> mine;      /* this process's ranks with files here */
};

namespace {

using Lock = std::unique_lock<std::mutex>;

const uint32_t MAGIC = 0x6d4e434cu;

/* What each message file starts with. */
struct Header {
    uint32_t magic;
    int32_t kind, type, red, root, from;
    uint64_t count, seq;
};

struct PendingSplit {
    World *w;
    unsigned long long k;
    struct Local {
        ncclComm *parent, *child; /* child NULL: NCCL_SPLIT_NOCOLOR */
        int rank;                 /* the parent's */
    };
    std::vector<Local> local;
};

/* (Never destroyed: the thread may still look at them while the process
 * exits.) */
struct State {
    std::condition_variable wake;
    std::set<World *> forming;
    std::vector<PendingSplit> splits;
    std::set<Op *> waiting;
    bool thread = false;
    bool exiting = false; /* the process is exiting: the thread stops (at_exit) */
};
State &g = *new State;

uint64_t fnv(const void *p, size_t n, uint64_t h = 1469598103934665603ull)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

std::string folder(uint64_t h)
{
    char name[32];
    snprintf(name, sizeof name, "/w%016llx", (unsigned long long)h);
    return std::string(getenv("EMU_NCCL_NODE")) + name;
}

std::string num(const char *prefix, long long a, long long b = -1, long long c = -1, long long d = -1)
{
    char s[128];
    int n = snprintf(s, sizeof s, "%s.%lld", prefix, a);
    for (long long x : {b, c, d})
        if (x >= 0)
            n += snprintf(s + n, sizeof s - (size_t)n, ".%lld", x);
    return s;
}

bool exists(const std::string &p)
{
    return access(p.c_str(), F_OK) == 0;
}

bool write_all(int fd, const void *p, size_t n)
{
    const char *c = (const char *)p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

/* a then b in a new file of dir, given every name of names at once; false
 * with why (EEXIST in errno: a name was taken). */
bool put(const std::string &dir, const std::vector<std::string> &names, const void *a, size_t an, const void *b,
         size_t bn, std::string &why)
{
    static std::atomic<unsigned long long> count{0};
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/.tmp.%d.%llu", (int)getpid(), ++count);
    std::string t = dir + tmp;
    int fd = open(t.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    bool ok = fd >= 0 && write_all(fd, a, an) && (!bn || write_all(fd, b, bn));
    int err = errno;
    if (fd >= 0)
        close(fd);
    for (size_t i = 0; ok && i < names.size(); i++)
        if (link(t.c_str(), (dir + "/" + names[i]).c_str()) != 0) {
            err = errno;
            ok = false;
            for (size_t j = 0; j < i; j++)
                unlink((dir + "/" + names[j]).c_str());
            why = "cannot make " + dir + "/" + names[i] + ": " + strerror(err);
        }
    if (fd < 0 || (!ok && why.empty()))
        why = "cannot write " + t + ": " + strerror(err);
    unlink(t.c_str());
    errno = err;
    return ok;
}

/* The whole file, or false if it is not there. */
bool slurp(const std::string &p, std::vector<char> &buf)
{
    int fd = open(p.c_str(), O_RDONLY);
    if (fd < 0)
        return false;
    buf.clear();
    char chunk[1 << 16];
    for (;;) {
        ssize_t k = read(fd, chunk, sizeof chunk);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        buf.insert(buf.end(), chunk, chunk + k);
    }
    close(fd);
    return true;
}

bool make_dir(const std::string &d, std::string &why)
{
    const char *root = getenv("EMU_NCCL_NODE");
    if ((mkdir(root, 0700) != 0 && errno != EEXIST) || (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)) {
        why = "cannot make " + d + ": " + strerror(errno);
        return false;
    }
    return true;
}

void loop();

/* At exit, before nccl.cpp's objects are destroyed (registered after
 * them), the thread stops looking: it no longer touches them. (A lock
 * that stays held, by a thread stuck in a kernel, is given up after 1 s.) */
void at_exit()
{
    for (int i = 0; i < 1000; i++) {
        if (emu::async_mutex().try_lock()) {
            g.exiting = true;
            emu::async_mutex().unlock();
            return;
        }
        usleep(1000);
    }
}

void wake()
{
    if (!g.thread) {
        g.thread = true;
        atexit(at_exit);
        std::thread(loop).detach();
    }
    g.wake.notify_one();
}

/* The bytes of rank r's input to op that its peers need. */
size_t input_bytes(const Op &op, int r, int n)
{
    size_t b = op.count * type_size(op.type);
    if (op.kind == REDUCE_SCATTER)
        return b * (size_t)n;
    if (op.kind == BROADCAST && op.peer != r)
        return 0;
    return b;
}

/* w forms if every rank's join file is there. */
bool try_form(World *w)
{
    Node *nd = w->node;
    std::vector<Gpu> gpu((size_t)w->n);
    std::vector<char> buf;
    for (int r = 0; r < w->n; r++) {
        if (!slurp(nd->dir + "/" + num("join", r), buf))
            return false;
        buf.push_back(0);
        int host = 0; /* (where the host's name starts: after "D PID ") */
        if (sscanf(buf.data(), "%d %*d %n", &gpu[(size_t)r].device, &host) < 1 || host <= 0)
            return false;
        gpu[(size_t)r].host.assign(buf.data() + host, strcspn(buf.data() + host, "\n"));
    }
    nd->gpu = gpu;
    g.forming.erase(w);
    world_formed(w, gpu);
    formed_cv().notify_all();
    return true;
}

/* The split forms if every rank's file is there: this process's children
 * join their worlds, formed at once (every rank is known). */
bool try_split(PendingSplit &ps)
{
    World *w = ps.w;
    Node *nd = w->node;
    std::vector<int> color((size_t)w->n), key((size_t)w->n);
    std::vector<char> buf;
    for (int r = 0; r < w->n; r++) {
        if (!slurp(nd->dir + "/" + num("split", (long long)ps.k, r), buf))
            return false;
        buf.push_back(0);
        if (sscanf(buf.data(), "%d %d", &color[(size_t)r], &key[(size_t)r]) != 2)
            return false;
    }
    std::map<int, std::vector<int>> groups = split_groups(color, key);
    std::map<int, World *> made; /* color -> this process's child world */
    for (const PendingSplit::Local &l : ps.local) {
        if (comm_alive(l.parent))
            l.parent->splitting--;
        ncclComm *child = l.child;
        if (!child || !comm_alive(child))
            continue;
        int c = color[(size_t)l.rank];
        const std::vector<int> &ranks = groups[c];
        World *&nw = made[c];
        if (!nw) {
            char tag[96];
            snprintf(tag, sizeof tag, "/split %llu color %d", ps.k, c);
            nw = new World;
            nw->formed = true;
            nw->n = (int)ranks.size();
            nw->members.assign(ranks.size(), nullptr);
            nw->node = new Node;
            nw->node->dir = folder(fnv(tag, strlen(tag), fnv(nd->dir.data(), nd->dir.size())));
            for (int r : ranks)
                nw->node->gpu.push_back(nd->gpu[(size_t)r]);
        }
        int me = (int)(std::find(ranks.begin(), ranks.end(), l.rank) - ranks.begin());
        std::string why;
        child->w = nw;
        child->rank = me;
        nw->members[(size_t)me] = child;
        nw->alive++;
        if (!make_dir(nw->node->dir, why) || !put(nw->node->dir, {num("alive", me)}, "", 0, nullptr, 0, why)) {
            fail(child, ncclSystemError, why);
            continue;
        }
        nw->node->mine.insert(me);
        child->state = ncclSuccess;
    }
    formed_cv().notify_all();
    return true;
}

void done(Op *op)
{
    g.waiting.erase(op);
    finish(op);
}

/* op is met if what it waits for is there: then done. */
bool try_op(Op *op)
{
    ncclComm *c = op->c;
    World *w = c->w;
    const std::string &dir = w->node->dir;
    int me = c->rank, n = w->n;
    size_t mine = op->count * type_size(op->type);
    std::vector<char> buf;
    if (op->kind == SEND || op->kind == RECV) {
        bool send = op->kind == SEND;
        std::string p = dir + "/" + num(send ? "r" : "p", send ? me : op->peer, send ? op->peer : me, (long long)op->seq);
        if (!slurp(p, buf))
            return false;
        unlink(p.c_str());
        Header h;
        memcpy(&h, buf.data(), std::min(buf.size(), sizeof h));
        size_t theirs = buf.size() < sizeof h || h.magic != MAGIC ? (size_t)-1 : h.count * type_size((ncclDataType_t)h.type);
        if (theirs != mine) {
            char why[200];
            snprintf(why, sizeof why, "transfer #%llu from rank %d to rank %d: %zu bytes sent, %zu received", op->seq,
                     send ? me : op->peer, send ? op->peer : me, send ? mine : theirs, send ? theirs : mine);
            fail(c, ncclInvalidUsage, why);
        } else if (!send && mine) {
            memmove(op->recv, buf.data() + sizeof h, mine);
        }
        done(op);
        return true;
    }
    std::vector<std::string> names;
    for (int q = 0; q < n; q++) {
        names.push_back(dir + "/" + num("c", (long long)op->seq, q, me));
        if (!exists(names.back()))
            return false;
    }
    std::vector<std::vector<char>> all((size_t)n);
    std::vector<const char *> in;
    std::string why;
    for (int q = 0; q < n; q++) {
        std::vector<char> &b = all[(size_t)q];
        if (!slurp(names[(size_t)q], b) || b.size() < sizeof(Header)) {
            why = "cannot read " + names[(size_t)q];
            break;
        }
        unlink(names[(size_t)q].c_str());
        Header h;
        memcpy(&h, b.data(), sizeof h);
        Op theirs = *op;
        theirs.kind = (Kind)h.kind;
        theirs.type = (ncclDataType_t)h.type;
        theirs.red = (ncclRedOp_t)h.red;
        theirs.peer = h.root;
        theirs.count = h.count;
        why = h.magic != MAGIC ? "a bad file: " + names[(size_t)q] : disagreement(*op, me, theirs, q);
        if (why.empty() && b.size() - sizeof h != input_bytes(theirs, q, n))
            why = "a short file: " + names[(size_t)q];
        if (!why.empty())
            break;
        in.push_back(b.data() + sizeof h);
    }
    if (why.empty()) {
        std::vector<char> out;
        collective_output(*op, in, me, n, out);
        if (!out.empty())
            memcpy(op->recv, out.data(), out.size());
    } else {
        for (const std::string &p : names)
            unlink(p.c_str());
        fail(c, ncclInvalidUsage, why);
    }
    done(op);
    return true;
}

/* One look at everything this process's ranks wait for; true if
 * something moved. */
bool poll()
{
    bool moved = false;
    std::set<World *> forming = g.forming;
    for (World *w : forming)
        if (g.forming.count(w))
            moved |= try_form(w);
    for (size_t i = 0; i < g.splits.size();)
        if (try_split(g.splits[i])) {
            g.splits.erase(g.splits.begin() + (long)i);
            moved = true;
        } else {
            i++;
        }
    std::set<Op *> waiting = g.waiting;
    for (Op *op : waiting)
        if (g.waiting.count(op)) /* (an op done before may have ended others) */
            moved |= try_op(op);
    return moved;
}

void loop()
{
    Lock lk(emu::async_mutex());
    unsigned us = 10;
    for (;;) {
        if (g.exiting)
            return;
        if (g.waiting.empty() && g.forming.empty() && g.splits.empty()) {
            g.wake.wait(lk);
            us = 10;
            continue;
        }
        if (poll()) {
            us = 10;
            continue;
        }
        lk.unlock();
        usleep(us);
        us = std::min(us * 2, 1000u);
        lk.lock();
    }
}

} /* namespace */

bool node_on()
{
    const char *d = getenv("EMU_NCCL_NODE");
    return d && *d;
}

ncclResult_t node_join(World *w, ncclComm *c)
{
    std::string why;
    if (!w->node) {
        uint64_t h = fnv(w->id.data(), w->id.size());
        w->node = new Node;
        w->node->dir = folder(fnv(&w->n, sizeof w->n, h));
    }
    Node *nd = w->node;
    const char *host = getenv("EMU_NCCL_HOST");
    char body[160];
    snprintf(body, sizeof body, "%d %d %.120s\n", c->device, (int)getpid(), host ? host : "");
    if (!make_dir(nd->dir, why))
        return fail(c, ncclSystemError, why), ncclSystemError;
    if (!put(nd->dir, {num("join", c->rank)}, body, strlen(body), nullptr, 0, why)) {
        bool taken = errno == EEXIST;
        fail(c, taken ? ncclInvalidUsage : ncclSystemError,
             taken ? "rank " + std::to_string(c->rank) + " of this id came twice (" + nd->dir + ")" : why);
        return taken ? ncclInvalidUsage : ncclSystemError;
    }
    if (!put(nd->dir, {num("alive", c->rank)}, "", 0, nullptr, 0, why))
        return fail(c, ncclSystemError, why), ncclSystemError;
    nd->mine.insert(c->rank);
    g.forming.insert(w);
    if (!try_form(w))
        wake();
    return ncclSuccess;
}

void node_post(Op *op)
{
    ncclComm *c = op->c;
    World *w = c->w;
    const std::string &dir = w->node->dir;
    int me = c->rank;
    Header h = {MAGIC, op->kind, op->type, op->red, op->peer, me, op->count, op->seq};
    std::vector<std::string> names;
    const void *data = op->send;
    size_t bytes = input_bytes(*op, me, w->n);
    if (op->kind == SEND) {
        names.push_back(num("p", me, op->peer, (long long)op->seq));
    } else if (op->kind == RECV) {
        names.push_back(num("r", op->peer, me, (long long)op->seq));
        bytes = 0;
    } else {
        for (int q = 0; q < w->n; q++)
            names.push_back(num("c", (long long)op->seq, me, q));
    }
    std::string why;
    if (!put(dir, names, &h, sizeof h, data, bytes, why)) {
        fail(c, ncclSystemError, why);
        finish(op);
        return;
    }
    g.waiting.insert(op);
    if (!try_op(op))
        wake();
}

void node_unpost(Op *op)
{
    g.waiting.erase(op);
}

void node_split(ncclComm *parent, unsigned long long k, int color, int key, ncclComm *child)
{
    World *w = parent->w;
    char body[64];
    std::string why;
    snprintf(body, sizeof body, "%d %d\n", color, key);
    if (!put(w->node->dir, {num("split", (long long)k, parent->rank)}, body, strlen(body), nullptr, 0, why)) {
        fail(parent, ncclSystemError, why);
        if (child)
            fail(child, ncclSystemError, why);
        parent->splitting--;
        formed_cv().notify_all();
        return;
    }
    PendingSplit *ps = nullptr;
    for (PendingSplit &x : g.splits)
        if (x.w == w && x.k == k)
            ps = &x;
    if (!ps) {
        g.splits.push_back(PendingSplit{w, k, {}});
        ps = &g.splits.back();
    }
    ps->local.push_back({parent, child, parent->rank});
    if (try_split(*ps)) {
        for (size_t i = 0; i < g.splits.size(); i++)
            if (&g.splits[i] == ps) {
                g.splits.erase(g.splits.begin() + (long)i);
                break;
            }
    } else {
        wake();
    }
}

void node_leave(ncclComm *c)
{
    Node *nd = c->w->node;
    if (!nd->mine.erase(c->rank))
        return;
    unlink((nd->dir + "/" + num("alive", c->rank)).c_str());
    DIR *d = opendir(nd->dir.c_str());
    if (!d)
        return;
    std::vector<std::string> names;
    bool last = true;
    while (struct dirent *e = readdir(d)) {
        if (!strncmp(e->d_name, "alive.", 6))
            last = false;
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            names.push_back(e->d_name);
    }
    closedir(d);
    if (!last)
        return;
    for (const std::string &n : names)
        unlink((nd->dir + "/" + n).c_str());
    rmdir(nd->dir.c_str());
}

void node_forget(World *w)
{
    g.forming.erase(w);
    for (size_t i = 0; i < g.splits.size();)
        if (g.splits[i].w == w)
            g.splits.erase(g.splits.begin() + (long)i);
        else
            i++;
    delete w->node;
    w->node = nullptr;
}

} /* namespace enccl */
