/* nccl_impl.h (CPU emulation, tests/gpu/emu): what the emulated NCCL's two
 * files share: nccl.cpp (the API, and worlds whose ranks are threads of
 * this process) and nccl_node.cpp (worlds whose ranks may be processes of
 * one emulated node, through files in EMU_NCCL_NODE). Everything here is
 * used under the streams' lock (internal.h: async_mutex). */
#ifndef EMU_NCCL_IMPL_H
#define EMU_NCCL_IMPL_H

#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace enccl {

enum Kind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, REDUCE, SEND, RECV };
extern const char *const kind_name[];

struct Item; /* a stream's queue item: the operations of one launch on it */
struct Node; /* a world's files, when it spans processes (nccl_node.cpp) */

} /* namespace enccl */

struct Op;
struct World;

struct ncclComm {
    World *w = nullptr; /* none while a split is forming it */
    int rank = -1, device = 0;
    bool blocking = true;
    ncclResult_t state = ncclInProgress; /* InProgress until formed; then Success or an error */
    int splitting = 0;                   /* splits of it not yet formed */
    bool launching = false; /* a non-blocking launch said ncclInProgress: until GetAsyncError says ncclSuccess */
    int launch_polls = 0;   /* GetAsyncError's ncclInProgress answers left (the enqueue) */
    bool finalizing = false;
    unsigned long long colls = 0, splits = 0;
    std::map<int, unsigned long long> sent, received; /* per peer */
    std::set<Op *> live;                              /* its operations not yet done */
    std::string last;                                 /* ncclGetLastError */
};

struct Op {
    enccl::Kind kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t red;
    int peer; /* root, or the other rank of a send or receive */
    ncclComm *c;
    cudaStream_t stream;
    enccl::Item *item = nullptr;
    bool posted = false, done = false;
    bool doomed = false; /* EMU_FAIL=nccl:N (fault.cpp): never posted, so never done */
    unsigned long long seq = 0; /* its collective's, or its transfer's between the two ranks */
};

struct World {
    std::string id; /* while forming */
    int n = 0, joined = 0, alive = 0; /* (joined, alive: of this process's members) */
    bool formed = false;
    std::vector<ncclComm *> members; /* this process's, at their ranks */
    struct Coll {
        std::vector<Op *> ops;
        int posted = 0;
    };
    std::map<unsigned long long, Coll> colls;
    std::map<std::pair<int, int>, std::deque<Op *>> sends, recvs; /* (from, to) */
    struct Split {
        std::vector<int> color, key;
        std::vector<ncclComm *> child;
        int arrived = 0;
    };
    std::map<unsigned long long, Split> splits;
    enccl::Node *node = nullptr; /* set: its ranks meet through files (nccl_node.cpp) */
};

namespace enccl {

/* ---- nccl.cpp ---- */

/* c fails from now on (its first error stays). */
void fail(ncclComm *c, ncclResult_t rc, const std::string &why);
/* op is done (or ended by an abort): its item too once all of its are. */
void finish(Op *op);
size_t type_size(ncclDataType_t t);
/* What rank r of n receives from a collective whose every rank's input is
 * in (in rank order): empty when it receives nothing. */
void collective_output(const Op &a, const std::vector<const char *> &in, int r, int n, std::vector<char> &out);
/* Why two ranks' calls of one collective do not agree, or "". */
std::string disagreement(const Op &a, int ra, const Op &b, int rb);
/* A rank's GPU: its device number on its machine (EMU_NCCL_HOST, "" for
 * this one: a process's threads share their machine). */
struct Gpu {
    int device = 0;
    std::string host;
    bool operator==(const Gpu &o) const { return device == o.device && host == o.host; }
};
/* w has all its ranks, on gpu[rank]: its members' states are set (they
 * fail if two share a GPU of one machine). */
void world_formed(World *w, const std::vector<Gpu> &gpu);
/* 1 when c is a communicator not destroyed nor aborted. */
bool comm_alive(ncclComm *c);
/* A split's worlds: color -> the parent ranks of that color, ordered by
 * key, then by parent rank (NCCL_SPLIT_NOCOLOR's in none). */
std::map<int, std::vector<int>> split_groups(const std::vector<int> &color, const std::vector<int> &key);
/* Woken when a world or a split has formed (blocking calls wait). */
std::condition_variable &formed_cv();

/* ---- nccl_node.cpp ---- */

/* EMU_NCCL_NODE (a folder the processes share): worlds form and meet
 * through files there, so that their ranks may be processes, of one
 * emulated machine or, with EMU_NCCL_HOST naming each process's, of
 * several (the folder standing for their network). Unset: worlds are of
 * this process's threads only. */
bool node_on();
/* c (of w, not yet formed) joins: its files say it is alive and on which
 * GPU; the world forms once every rank's are there. ncclInvalidUsage if
 * its rank came already. */
ncclResult_t node_join(World *w, ncclComm *c);
/* op, first of its stream, meets its peers' through files (or waits). */
void node_post(Op *op);
/* op ends unmet (an abort): it no longer waits. */
void node_unpost(Op *op);
/* parent's k-th split, with its color and key (child: NULL for
 * NCCL_SPLIT_NOCOLOR): forms once every rank of the world has come. */
void node_split(ncclComm *parent, unsigned long long k, int color, int key, ncclComm *child);
/* c leaves its world (abort, destroy, or a failed init); the last rank out
 * removes the world's files. */
void node_leave(ncclComm *c);
/* w (this process's last member gone) is deleted: nothing may wait on it. */
void node_forget(World *w);

} /* namespace enccl */

#endif
