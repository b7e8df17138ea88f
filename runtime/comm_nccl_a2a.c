/* comm_nccl_a2a.c — the NCCL communicator's all-to-all
 * (comm_nccl_impl.h): a group of sends and receives after each rank's
 * counts reach its peers; the counts checked before the data moves, or,
 * in an ordered world, sent ahead of it on the handle's stream and checked
 * once they are back (comm_nccl_wait.c's nccl__check_counts).
 */
#include <limits.h> /* defines: INT_MAX */
#include <stdlib.h> /* defines: malloc, free */
#include <string.h> /* defines: memset */

#include "comm_nccl_impl.h"

/* In an NCCL group the caller opened: the counts on m's device buffer
 * ([p] this rank's, then [p] received from each peer) go to and come from
 * every peer; the first failure. */
static ncclResult_t counts_exchange(ncomm *m)
{
    int p = m->c.size;
    ncclResult_t rc = ncclSuccess;
    for (int q = 0; q < p && !nccl__failed(rc); q++) {
        rc = ncclSend(m->dev + q, 1, ncclUint64, q, m->nc, m->stream);
        if (!nccl__failed(rc)) rc = ncclRecv(m->dev + p + q, 1, ncclUint64, q, m->nc, m->stream);
    }
    nccl__mark(m, "all-to-all");
    return rc;
}

/* Every rank learns what each peer sends it; -1 on every rank when one
 * expected other counts (the lowest such rank says which): the threads and
 * MPI backends' check, on the device. */
static int a2a_counts(ncomm *m, const size_t *send, const size_t *recv)
{
    const char *op = "all-to-all";
    int p = m->c.size, bad = -1;
    uint64_t *mine = m->host, *theirs = m->host + p;
    int32_t flag;
    for (int q = 0; q < p; q++) mine[q] = send[q];
    if (nccl__copy_wait(m, op, m->dev, mine, (size_t)p * sizeof *mine, cudaMemcpyHostToDevice) != 0) return -1;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl__nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    rc = counts_exchange(m);
    if (nccl__close_group(m, op, "ncclSend/ncclRecv of the counts", rc, m) != 0 ||
        nccl__copy_wait(m, op, theirs, m->dev + p, (size_t)p * sizeof *theirs, cudaMemcpyDeviceToHost) != 0)
        return -1;
    for (int q = p - 1; q >= 0; q--)
        if (theirs[q] != recv[q]) bad = q;
    /* the lowest rank that expected other counts, on every rank */
    int32_t *dflag = (int32_t *)(m->dev + 2 * (size_t)p), *hflag = (int32_t *)(m->host + 2 * (size_t)p);
    *hflag = bad >= 0 ? m->c.rank : INT_MAX;
    if (nccl__copy_wait(m, op, dflag, hflag, sizeof *hflag, cudaMemcpyHostToDevice) != 0 ||
        nccl__issued(m, op, "ncclAllReduce",
               LONE(m, ncclAllReduce(dflag, dflag, 1, ncclInt32, ncclMin, m->nc, m->stream))) != 0 ||
        nccl__copy_wait(m, op, hflag, dflag, sizeof *hflag, cudaMemcpyDeviceToHost) != 0)
        return -1;
    flag = *hflag;
    if (bad >= 0)
        return comm_fail(&m->c, op, "rank %d expected %zu floats from rank %d, which sends %llu", m->c.rank,
                         recv[bad], bad, (unsigned long long)theirs[bad]);
    if (flag != INT_MAX) return comm_fail(&m->c, op, "rank %d expected other counts", (int)flag);
    return 0;
}

/* The handle's checks (a2a_check), all made at its first ordered
 * all-to-all (a pinned allocation can take a while; not in every call):
 * one pinned block, one block of expected counts, an event each. 0, or -1
 * (not aborting: nothing is enqueued yet). */
static int check_alloc(ncomm *m)
{
    size_t p = (size_t)m->c.size;
    uint64_t *host = NULL;
    size_t *want = malloc(A2A_CHECKS * p * sizeof *want);
    cudaError_t ce = want ? cudaMallocHost((void **)&host, A2A_CHECKS * 2 * p * sizeof *host) : cudaSuccess;
    if (ce != cudaSuccess) host = NULL;
    for (int i = 0; want && ce == cudaSuccess && i < A2A_CHECKS; i++) {
        ce = cudaEventCreateWithFlags(&m->chk[i].back, cudaEventDisableTiming);
        if (ce != cudaSuccess) m->chk[i].back = NULL;
        m->chk[i].host = host + (size_t)i * 2 * p;
        m->chk[i].want = want + (size_t)i * p;
    }
    if (want && ce == cudaSuccess) return 0;
    for (int i = 0; i < A2A_CHECKS; i++) {
        if (m->chk[i].back) (void)cudaEventDestroy(m->chk[i].back);
        memset(&m->chk[i], 0, sizeof m->chk[i]);
    }
    if (host) (void)cudaFreeHost(host);
    free(want);
    return comm_fail(&m->c, "all-to-all", "the counts' checks: %s",
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "out of memory");
}

/* Ordered world: the counts go to the peers and theirs come back on m's
 * stream, ahead of the data, and are checked once back (nccl__check_counts, at
 * the world's next call or wait): the host waits for neither. */
static int a2a_counts_later(ncomm *m, const size_t *send, const size_t *recv)
{
    const char *op = "all-to-all";
    int p = m->c.size;
    a2a_check *k = &m->chk[m->chk_next];
    if (k->pending && (nccl__wait_gpu(m, op, k->back) != 0 || nccl__check_counts(m) != 0))
        return -1; /* the ring is full */
    if (!k->host && check_alloc(m) != 0) return -1;
    for (int q = 0; q < p; q++) k->host[q] = send[q], k->want[q] = recv[q];
    cudaError_t ce = cudaMemcpyAsync(m->dev, k->host, (size_t)p * sizeof *k->host, cudaMemcpyHostToDevice, m->stream);
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaMemcpyAsync", ce);
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl__nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    rc = counts_exchange(m);
    ncclResult_t end = nccl__group_end();
    if (nccl__failed(rc)) return nccl__nccl_fail(m->nc, m, op, "ncclSend/ncclRecv of the counts", rc);
    if (nccl__failed(end)) return nccl__nccl_fail(m->nc, m, op, "ncclGroupEnd", end);
    if (nccl__wait_for(m, op, 0) != 0) return -1; /* enqueued: the copy back follows it on the stream */
    ce = cudaMemcpyAsync(k->host + p, m->dev + p, (size_t)p * sizeof *k->host, cudaMemcpyDeviceToHost, m->stream);
    if (ce == cudaSuccess) ce = cudaEventRecord(k->back, m->stream);
    if (ce != cudaSuccess) return nccl__cuda_fail(m, op, "cudaMemcpyAsync", ce);
    k->pending = 1;
    m->chk_next = (m->chk_next + 1) % A2A_CHECKS;
    return 0;
}

/* send[q] floats of in (peers' parts in rank order) to q, recv[q] from q
 * into out: a group of ncclSend/ncclRecv, after the counts are checked
 * (outside a group). */
int nccl__all_to_all(comm *c, const float *in, const size_t *send, float *out, const size_t *recv)
{
    const char *op = "all-to-all";
    ncomm *m = (ncomm *)c;
    size_t ns = 0, nr = 0;
    for (int q = 0; q < c->size; q++) {
        ns += send[q];
        nr += recv[q];
    }
    if (nccl__on_device(m, op, in, ns) != 0 || nccl__on_device(m, op, out, nr) != 0 || nccl__begin(m, op) != 0)
        return -1;
    /* (on m's stream after the caller's work: begin) */
    if (!m->w->group && (m->w->ordered ? a2a_counts_later(m, send, recv) : a2a_counts(m, send, recv)) != 0)
        return -1;
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess) return nccl__nccl_fail(m->nc, m, op, "ncclGroupStart", rc);
    size_t at = 0, rat = 0;
    for (int q = 0; q < c->size && !nccl__failed(rc); q++) {
        if (send[q]) rc = ncclSend(nccl__fat(m, in, at), send[q], nccl__ftype(m), q, m->nc, m->stream);
        if (recv[q] && !nccl__failed(rc))
            rc = ncclRecv(nccl__fat(m, out, rat), recv[q], nccl__ftype(m), q, m->nc, m->stream);
        at += send[q];
        rat += recv[q];
    }
    nccl__mark(m, op);
    return nccl__close_group(m, op, "ncclSend/ncclRecv", rc, m); /* in the caller's group, only closes ours */
}
