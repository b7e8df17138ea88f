/* comm_nccl_none.c — comm.h's NCCL calls in a build without CUDA (make
 * CUDA=0, the default): the constructors say libmesh has no CUDA, and the
 * rest do nothing, as no NCCL handle can exist. comm_nccl.c and its files
 * are the backend, built with CUDA=1.
 */
#include <stdio.h> /* defines: snprintf */

#include "comm.h"
#include "device.h" /* defines: dev_cuda_probe: why no GPU is usable */

#define NO_CUDA "this libmesh was built without CUDA (make CUDA=1)"

int comm_nccl_available(char *why, size_t n)
{
    return dev_cuda_probe(why, n, NULL, 0); /* device_cuda.c: built without CUDA */
}

comm *comm_nccl_world(int rank, int size, int device, double timeout_s, char *err, size_t n)
{
    (void)rank;
    (void)size;
    (void)device;
    (void)timeout_s;
    snprintf(err, n, "%s", NO_CUDA);
    return NULL;
}

int comm_nccl_set_elements(comm *c, int type)
{
    (void)c;
    (void)type;
    return -1;
}

int comm_nccl_own_thread(comm *c)
{
    (void)c; /* no NCCL handle exists in this build */
    return 0;
}

int comm_nccl_order(comm *c, void *stream)
{
    (void)c;
    (void)stream;
    return -1;
}

int comm_nccl_watch(void *ud, double waited_s, char *why, size_t n)
{
    (void)ud;
    (void)waited_s;
    (void)why;
    (void)n;
    return 0;
}

int comm_nccl_flush(comm *c)
{
    (void)c;
    return 0;
}

int comm_nccl_channels(comm *c, int ring)
{
    (void)c; /* no NCCL handle exists in this build: nothing to do */
    (void)ring;
    return 0;
}

int comm_nccl_defer(comm *c)
{
    (void)c; /* no NCCL handle exists in this build */
    return -1;
}

int comm_nccl_wait_event(comm *c, void *event)
{
    (void)c;
    (void)event;
    return -1;
}

int comm_nccl_record_event(comm *c, void *event)
{
    (void)c;
    (void)event;
    return -1;
}

void comm_nccl_thread_on_gpu(comm *c)
{
    (void)c; /* no NCCL handle exists in this build */
}

int comm_nccl_progress(comm *c, double waited_s)
{
    (void)c;
    (void)waited_s;
    return 0;
}

comm *comm_nccl_world_mpi(comm *boot, int device, double timeout_s, char *err, size_t n)
{
    (void)boot;
    (void)device;
    (void)timeout_s;
    snprintf(err, n, "%s", NO_CUDA);
    return NULL;
}

