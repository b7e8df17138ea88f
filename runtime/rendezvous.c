/* rendezvous.c — the TCP rendezvous (rendezvous.h).
 *
 * Rank 0 listens on the port, on every address of the host's family (as
 * torch's TCPStore does: a host name that resolves to a loopback address
 * on its own node still works from the others). Every other rank connects
 * to host:port, retrying every 50 ms while rank 0 is not there yet, and
 * sends its hello {magic, rank, size}. Rank 0 accepts until every rank
 * has come (a connection that says nothing within a few seconds, or
 * something else, is a stranger and is dropped), checks that the ranks
 * agree on the size and that no rank came twice, and answers each
 * {magic, size}. An all-gather: each rank sends {bytes} and its bytes to
 * rank 0, which sends every rank all of them. Numbers travel in the
 * sender's byte order (the processes of a job share it; the magic number
 * catches one that does not).
 *
 * The sockets are non-blocking and every wait is a poll() with a deadline.
 */
#include "rendezvous.h"

#include "comm.h" /* comm_now, comm_sleep */

#include <arpa/inet.h>  /* htons, htonl */
#include <errno.h>      /* errno, EAGAIN, EINPROGRESS, ... */
#include <fcntl.h>      /* fcntl, O_NONBLOCK */
#include <netdb.h>      /* getaddrinfo, gai_strerror */
#include <netinet/in.h> /* sockaddr_in, sockaddr_in6, IPV6_V6ONLY */
#include <poll.h>       /* poll */
#include <stdarg.h>     /* va_list */
#include <stdint.h>     /* uint32_t, uint64_t */
#include <stdio.h>      /* snprintf */
#include <stdlib.h>     /* calloc, free, getenv, strtol */
#include <string.h>     /* memcpy, strerror, strlen */
#include <unistd.h>     /* close */

enum { HELLO_MAGIC = 0x6d726476 /* "mrdv" */ };
static const double STRANGER_S = 5; /* a connection's time to say hello */

struct rdv {
    int rank, size;
    int *fd;          /* rank 0: fd[q], rank q's connection (fd[0] unused); others: fd[0], to rank 0 */
    double timeout;
    char where[300];  /* "rendezvous at HOST:PORT" */
};

/* ---- socket helpers ----------------------------------------------------- */


int rdv_wait(int fd, short events, double until)
{
    for (;;) {
        double left = until - comm_now();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, left > 1e6 ? 1000000000 : (int)(left * 1e3) + 1);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

int rdv_nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int rdv_read(int fd, void *buf, size_t n, double until)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) return RDV_CLOSED;
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) return RDV_CLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return RDV_ERROR;
        int w = rdv_wait(fd, POLLIN, until);
        if (w <= 0) return w == 0 ? RDV_TIMEOUT : RDV_ERROR;
    }
    return 0;
}

int rdv_write(int fd, const void *buf, size_t n, double until)
{
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k >= 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (errno == EINTR) continue;
        if (errno == EPIPE || errno == ECONNRESET) return RDV_CLOSED;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return RDV_ERROR;
        int w = rdv_wait(fd, POLLOUT, until);
        if (w <= 0) return w == 0 ? RDV_TIMEOUT : RDV_ERROR;
    }
    return 0;
}

int rdv_connect(const struct sockaddr *sa, socklen_t len, double until)
{
    int fd = socket(sa->sa_family, SOCK_STREAM, 0), e = 0;
    if (fd < 0) return -1;
    if (rdv_nonblocking(fd) != 0) goto fail;
    if (connect(fd, sa, len) == 0) return fd;
    if (errno != EINPROGRESS && errno != EINTR) goto fail;
    int w = rdv_wait(fd, POLLOUT, until);
    if (w <= 0) {
        if (w == 0) errno = ETIMEDOUT;
        goto fail;
    }
    socklen_t el = sizeof e;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) goto fail;
    if (e == 0) return fd;
    errno = e;
fail:
    e = errno;
    close(fd);
    errno = e;
    return -1;
}

/* ---- the rendezvous ----------------------------------------------------- */

/* "rendezvous at HOST:PORT: WHY" into err; returns -1. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int say(const rdv *r, char *err, size_t n, const char *fmt, ...)
{
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(err, n, "%s: %s", r->where, why);
    return -1;
}

/* What a failed read or write from rank q means. */
static const char *io_why(int rc)
{
    return rc == RDV_TIMEOUT ? "timed out" : rc == RDV_CLOSED ? "the connection closed" : strerror(errno);
}

/* Rank 0's listening socket on the port, on every address of the
 * family host resolves to; -1 with err. */
static int listen_on(const rdv *r, const char *host, int port, char *err, size_t n)
{
    struct addrinfo hints = {0}, *ai = NULL;
    char ps[16];
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai), fd = -1, why = EAFNOSUPPORT;
    if (rc != 0) return say(r, err, n, "cannot resolve '%s': %s", host, gai_strerror(rc));
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        struct sockaddr_storage ss;
        socklen_t len = 0;
        memset(&ss, 0, sizeof ss);
        if (a->ai_family == AF_INET) {
            struct sockaddr_in *s = (struct sockaddr_in *)&ss;
            s->sin_family = AF_INET;
            s->sin_port = htons((uint16_t)port);
            s->sin_addr.s_addr = htonl(INADDR_ANY);
            len = sizeof *s;
        } else if (a->ai_family == AF_INET6) {
            struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
            s->sin6_family = AF_INET6;
            s->sin6_port = htons((uint16_t)port);
            s->sin6_addr = in6addr_any;
            len = sizeof *s;
        } else {
            continue;
        }
        int one = 1, zero = 0;
        if ((fd = socket(a->ai_family, SOCK_STREAM, 0)) < 0) {
            why = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* a previous job's TIME_WAIT */
        if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, r->size) != 0 || rdv_nonblocking(fd) != 0) {
            why = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return say(r, err, n, "rank 0 cannot listen on port %d: %s%s", port, strerror(why),
                   why == EADDRINUSE ? " (another job's rendezvous, or torchrun's store? set MESH_PORT to a free port)"
                                     : "");
    return fd;
}

/* Rank 0: accepts every other rank's hello, then answers them all. */
static int gather_ranks(rdv *r, int lfd, double until, char *err, size_t n)
{
    int arrived = 1;
    while (arrived < r->size) {
        int w = rdv_wait(lfd, POLLIN, until);
        if (w < 0) return say(r, err, n, "waiting for the ranks: %s", strerror(errno));
        if (w == 0) {
            char missing[160] = "";
            size_t at = 0;
            for (int q = 1; q < r->size && at + 16 < sizeof missing; q++)
                if (r->fd[q] < 0) at += (size_t)snprintf(missing + at, sizeof missing - at, "%s%d", at ? ", " : "", q);
            return say(r, err, n, "%d of %d ranks came within %g s (missing: %s%s); are they started, with the "
                       "same address and port?", arrived, r->size, r->timeout, missing,
                       at + 16 >= sizeof missing ? ", ..." : "");
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
            return say(r, err, n, "accept: %s", strerror(errno));
        }
        uint32_t h[3] = {0, 0, 0};
        double hello_by = comm_now() + STRANGER_S;
        if (rdv_nonblocking(fd) != 0 || rdv_read(fd, h, sizeof h, hello_by < until ? hello_by : until) != 0 ||
            h[0] != HELLO_MAGIC) {
            close(fd); /* a stranger, or a rank that died on the way */
            continue;
        }
        int bad = h[2] != (uint32_t)r->size ? say(r, err, n, "rank %u says the job has %u ranks, rank 0 says %d "
                                                   "(WORLD_SIZE differs)", h[1], h[2], r->size)
                : h[1] == 0 || h[1] >= (uint32_t)r->size ? say(r, err, n, "a process says it is rank %u of %d", h[1],
                                                               r->size)
                : r->fd[h[1]] >= 0 ? say(r, err, n, "two processes say they are rank %u", h[1])
                                    : 0;
        if (bad) {
            close(fd);
            return -1;
        }
        r->fd[h[1]] = fd;
        arrived++;
    }
    uint32_t answer[2] = {HELLO_MAGIC, (uint32_t)r->size};
    for (int q = 1; q < r->size; q++) {
        int rc = rdv_write(r->fd[q], answer, sizeof answer, until);
        if (rc != 0) return say(r, err, n, "answering rank %d: %s", q, io_why(rc));
    }
    return 0;
}

/* Another rank: connects to rank 0 (retrying until it listens), says
 * hello and waits for the answer. */
static int join(rdv *r, const char *host, int port, double until, char *err, size_t n)
{
    char ps[16];
    int fd = -1, last = ECONNREFUSED;
    snprintf(ps, sizeof ps, "%d", port);
    while (fd < 0) {
        struct addrinfo hints = {0}, *ai = NULL;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        int rc = getaddrinfo(host, ps, &hints, &ai);
        if (rc != 0 && rc != EAI_AGAIN) return say(r, err, n, "cannot resolve '%s': %s", host, gai_strerror(rc));
        for (struct addrinfo *a = rc == 0 ? ai : NULL; a && fd < 0; a = a->ai_next) {
            double by = comm_now() + 2;
            if ((fd = rdv_connect(a->ai_addr, a->ai_addrlen, by < until ? by : until)) < 0 &&
                (errno != ETIMEDOUT || comm_now() < until))
                last = errno; /* not the end of the time given: what came before */
        }
        if (rc == 0) freeaddrinfo(ai);
        if (fd >= 0) break;
        if (comm_now() >= until)
            return say(r, err, n, "rank 0 did not answer within %g s (%s)", r->timeout,
                       rc == EAI_AGAIN ? gai_strerror(rc) : strerror(last));
        comm_sleep(0.05);
    }
    r->fd[0] = fd;
    uint32_t hello[3] = {HELLO_MAGIC, (uint32_t)r->rank, (uint32_t)r->size}, answer[2] = {0, 0};
    int rc = rdv_write(fd, hello, sizeof hello, until);
    if (rc == 0) rc = rdv_read(fd, answer, sizeof answer, until);
    if (rc == RDV_TIMEOUT)
        return say(r, err, n, "rank 0 did not start the job within %g s: not every rank came (are all %d started, "
                   "with the same address and port?)", r->timeout, r->size);
    if (rc == RDV_CLOSED)
        return say(r, err, n, "rank 0 closed the connection (it refused this rank, or failed: its output says why)");
    if (rc != 0) return say(r, err, n, "talking to rank 0: %s", strerror(errno));
    if (answer[0] != HELLO_MAGIC || answer[1] != (uint32_t)r->size)
        return say(r, err, n, "rank 0 answered something else (another program on that port?)");
    return 0;
}

rdv *rdv_open(const char *host, int port, int rank, int size, double timeout_s, char *err, size_t n)
{
    if (!host || size < 1 || rank < 0 || rank >= size || port < 1 || port > 65535) {
        snprintf(err, n, "rendezvous at %s:%d: rank %d of %d: bad arguments", host ? host : "(null)", port, rank,
                 size);
        return NULL;
    }
    rdv *r = calloc(1, sizeof *r);
    if (r) r->fd = malloc((size_t)size * sizeof *r->fd);
    if (!r || !r->fd) {
        free(r);
        snprintf(err, n, "rendezvous at %s:%d: out of memory", host, port);
        return NULL;
    }
    for (int q = 0; q < size; q++) r->fd[q] = -1;
    r->rank = rank;
    r->size = size;
    r->timeout = timeout_s > 0 ? timeout_s : 600;
    snprintf(r->where, sizeof r->where, "rendezvous at %s:%d", host, port);
    if (size == 1) return r;
    double until = comm_now() + r->timeout;
    int rc;
    if (rank == 0) {
        int lfd = listen_on(r, host, port, err, n);
        rc = lfd < 0 ? -1 : gather_ranks(r, lfd, until, err, n);
        if (lfd >= 0) close(lfd);
    } else {
        rc = join(r, host, port, until, err, n);
    }
    if (rc != 0) {
        rdv_close(r);
        return NULL;
    }
    return r;
}

int rdv_all_gather(rdv *r, const void *in, void *out, size_t bytes, char *err, size_t n)
{
    unsigned char *all = out;
    double until = comm_now() + r->timeout;
    size_t total = bytes * (size_t)r->size;
    int rc = 0;
    if (all + (size_t)r->rank * bytes != in) memcpy(all + (size_t)r->rank * bytes, in, bytes);
    if (r->size == 1) return 0;
    if (r->rank != 0) {
        uint64_t len = bytes;
        if ((rc = rdv_write(r->fd[0], &len, sizeof len, until)) == 0 && (rc = rdv_write(r->fd[0], in, bytes, until)) == 0)
            rc = rdv_read(r->fd[0], all, total, until);
        if (rc == 0 && memcmp(all + (size_t)r->rank * bytes, in, bytes) != 0)
            return say(r, err, n, "all-gather: rank 0 sent back other bytes than this rank's");
        return rc == 0 ? 0 : say(r, err, n, "all-gather with rank 0: %s", io_why(rc));
    }
    for (int q = 1; q < r->size; q++) {
        uint64_t len = 0;
        if ((rc = rdv_read(r->fd[q], &len, sizeof len, until)) == 0 && len != bytes)
            return say(r, err, n, "all-gather: rank %d gives %llu bytes, rank 0 %zu", q, (unsigned long long)len,
                       bytes);
        if (rc == 0) rc = rdv_read(r->fd[q], all + (size_t)q * bytes, bytes, until);
        if (rc != 0) return say(r, err, n, "all-gather: waiting for rank %d: %s", q, io_why(rc));
    }
    for (int q = 1; q < r->size; q++)
        if ((rc = rdv_write(r->fd[q], all, total, until)) != 0)
            return say(r, err, n, "all-gather: sending to rank %d: %s", q, io_why(rc));
    return 0;
}

void rdv_close(rdv *r)
{
    if (!r) return;
    for (int q = 0; q < r->size; q++)
        if (r->fd[q] >= 0) close(r->fd[q]);
    free(r->fd);
    free(r);
}

/* The port in variable name, from lo to hi; 1 if set, 0 if not, -1
 * (with err) if it is no such number. */
static int env_port(const char *name, int hi, int *port, const char *hint, char *err, size_t n)
{
    const char *s = getenv(name);
    char *end;
    if (!s) return 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 1 || v > hi) {
        snprintf(err, n, "%s='%s' is not a port (1 to %d)%s", name, s, hi, hint);
        return -1;
    }
    *port = (int)v;
    return 1;
}

int rdv_env_address(char *host, size_t host_n, int *port, char *err, size_t n)
{
    const char *name = "MESH_MASTER_ADDR", *h = getenv(name);
    if (!h || !*h) h = getenv(name = "MASTER_ADDR");
    if (!h || !*h) h = "127.0.0.1";
    if (strlen(h) >= host_n) {
        snprintf(err, n, "%s is %zu characters long: too long for a host name", name, strlen(h));
        return -1;
    }
    int rc = env_port("MESH_PORT", 65535, port, "", err, n);
    if (rc == 0) {
        rc = env_port("MASTER_PORT", 65534, port, "; the rendezvous uses MASTER_PORT + 1 (set MESH_PORT to choose "
                      "another)", err, n);
        if (rc > 0) ++*port; /* torchrun's agent may own MASTER_PORT itself */
        else if (rc == 0) *port = 29501;
    }
    if (rc < 0) return -1;
    memcpy(host, h, strlen(h) + 1);
    return 0;
}
