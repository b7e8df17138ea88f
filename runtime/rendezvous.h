/* rendezvous.h — a small TCP rendezvous for the processes of one job
 * (internal to libmesh): rank 0 listens on host:port, the others connect
 * and say who they are, and once all have come they can gather small
 * blobs from one another (addresses, an NCCL unique id). What torchrun's
 * TCPStore does for PyTorch, without its protocol (which is torch's own).
 *
 * Every wait ends after the timeout given to rdv_open, with a message
 * that says what did not come. A rendezvous serves one job at a time on
 * its port.
 */
#ifndef MESH_RENDEZVOUS_H
#define MESH_RENDEZVOUS_H

#include <stddef.h>     /* size_t */
#include <sys/socket.h> /* struct sockaddr, socklen_t */

typedef struct rdv rdv;

/* Rank `rank` of `size` joins the rendezvous at host:port (rank 0 listens
 * there, the others connect, retrying up to timeout_s). NULL with the
 * reason in err ("rendezvous at HOST:PORT: ...") on failure. */
rdv *rdv_open(const char *host, int port, int rank, int size, double timeout_s, char *err, size_t n);

/* Every rank's `bytes` bytes of in, into out[size x bytes] in rank order,
 * on every rank. 0, or -1 with err. */
int rdv_all_gather(rdv *r, const void *in, void *out, size_t bytes, char *err, size_t n);

/* Closes the connections; rdv_close(NULL) does nothing. */
void rdv_close(rdv *r);

/* The address from the environment: MESH_MASTER_ADDR else MASTER_ADDR
 * (default 127.0.0.1); port MESH_PORT, else MASTER_PORT + 1 (torchrun's
 * agent may already own MASTER_PORT with its TCPStore: never bind it),
 * else 29501. 0, or -1 with the reason in err if a variable is
 * malformed. */
int rdv_env_address(char *host, size_t host_n, int *port, char *err, size_t n);

/* ---- socket helpers, shared with the TCP communicator (comm_tcp.c) ----- */
/* Deadlines are comm_now() seconds (comm.h). */

/* What rdv_read and rdv_write return: 0, or one of these (errno holds
 * the cause of RDV_ERROR). */
enum { RDV_TIMEOUT = -1, RDV_CLOSED = -2, RDV_ERROR = -3 };

/* Waits until fd is ready for events (POLLIN, POLLOUT) or the deadline:
 * 1 ready, 0 past the deadline, -1 poll failed. */
int rdv_wait(int fd, short events, double until);

/* All n bytes from or to the non-blocking socket fd before the deadline. */
int rdv_read(int fd, void *buf, size_t n, double until);
int rdv_write(int fd, const void *buf, size_t n, double until);

/* A non-blocking socket connected to sa before the deadline, or -1 with
 * errno. */
int rdv_connect(const struct sockaddr *sa, socklen_t len, double until);

/* Makes fd non-blocking; 0, or -1 with errno. */
int rdv_nonblocking(int fd);

#endif
