/*
 * test_device.c: devices (runtime/device*.c) and the choice of one
 * (mesh_set_device, mesh_device_info in runtime/api.c).
 *
 * The CPU device's calls round-trip bytes; an allocation that fails (a
 * test hook makes the CPU's fail) says how much was asked, what the plan
 * predicts and what the device has. Without a GPU (a build without CUDA,
 * or no driver or device) the probe says why and the public choice falls
 * back to the CPU with that reason, while asking for CUDA is a clear error;
 * the choice's rules are also checked with a GPU made up.
 */
#include <pthread.h>    /* pthread_create: another thread's touch */
#include <signal.h>     /* sigaction: a fault ends a probe */
#include <stdint.h>     /* uintptr_t */
#include <stdio.h>      /* snprintf, sscanf */
#include <stdlib.h>     /* setenv */
#include <string.h>     /* memset, memcmp, strncmp, strlen */
#include <sys/types.h>  /* pid_t */
#include <sys/wait.h>   /* waitpid */
#include <unistd.h>     /* fork, _exit, pipe, read, write */

#include "api_impl.h" /* struct mesh_context: the device a context records */
#include "comm.h"     /* comm_nccl_available: the same probe */
#include "device.h"   /* defines: dev_*, dev_cuda_probe, dev_choose */
#include "fixture.h"  /* defines: fixture_plan */
#include "mesh.h"     /* mesh_set_device, mesh_device_info */
#include "unit.h"     /* defines: TEST_IMPL, ASSERT_* */

#define NO_CUDA "this libmesh was built without CUDA (make CUDA=1)"

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* alloc, memset and the three copies through d's table, byte for byte,
 * on a stream of its own and on the default one; events and memory info. */
static void round_trip(dev *d)
{
    enum { N = 1000 };
    unsigned char host[N], back[N];
    void *a = NULL, *b = NULL, *z = &a;
    ASSERT_INT_EQ(dev_alloc(d, &a, N), MESH_OK);
    ASSERT_INT_EQ(dev_alloc(d, &b, N), MESH_OK);
    ASSERT_NOT_NULL(a);
    ASSERT_NOT_NULL(b);
    ASSERT_UINT_EQ((uintptr_t)a % DEV_ALIGN, 0);
    ASSERT_UINT_EQ((uintptr_t)b % DEV_ALIGN, 0);
    ASSERT_INT_EQ(dev_alloc(d, &z, 0), MESH_OK); /* nothing to allocate */
    ASSERT_NULL(z);

    dev_stream *s = NULL;
    ASSERT_INT_EQ(dev_stream_create(d, &s), MESH_OK);
    for (int k = 0; k < N; k++) host[k] = (unsigned char)(k * 7 + 3);
    ASSERT_INT_EQ(dev_memset(d, b, 0x5a, N, s), MESH_OK);
    ASSERT_INT_EQ(dev_copy(d, back, b, N, DEV_DEVICE_TO_HOST, s), MESH_OK);
    ASSERT_INT_EQ(dev_stream_sync(d, s), MESH_OK);
    for (int k = 0; k < N; k++) ASSERT_INT_EQ(back[k], 0x5a);
    ASSERT_INT_EQ(dev_copy(d, a, host, N, DEV_HOST_TO_DEVICE, s), MESH_OK);
    ASSERT_INT_EQ(dev_stream_sync(d, s), MESH_OK);
    ASSERT_INT_EQ(dev_copy(d, b, a, N, DEV_DEVICE_TO_DEVICE, NULL), MESH_OK); /* the default stream */
    ASSERT_INT_EQ(dev_stream_sync(d, NULL), MESH_OK);
    memset(back, 0, sizeof back);
    ASSERT_INT_EQ(dev_copy(d, back, b, N, DEV_DEVICE_TO_HOST, s), MESH_OK);
    ASSERT_INT_EQ(dev_copy(d, back, b, 0, DEV_DEVICE_TO_HOST, s), MESH_OK); /* no bytes: nothing */

    /* an event after the copy: done once the stream is, waited for */
    dev_event *e = NULL;
    int done = 0;
    ASSERT_INT_EQ(dev_event_create(d, &e), MESH_OK);
    ASSERT_INT_EQ(dev_event_record(d, e, s), MESH_OK);
    ASSERT_INT_EQ(dev_event_wait(d, NULL, e), MESH_OK);
    ASSERT_INT_EQ(dev_stream_sync(d, s), MESH_OK);
    ASSERT_INT_EQ(dev_event_query(d, e, &done), MESH_OK);
    ASSERT_INT_EQ(done, 1);
    ASSERT_INT_EQ(memcmp(back, host, N), 0);

    /* timed events: the time between two points of a stream (0 on a
     * synchronous device); one made without timing cannot be timed */
    dev_event *t0 = NULL, *t1 = NULL;
    double ms = -1;
    ASSERT_INT_EQ(dev_event_create_timed(d, &t0), MESH_OK);
    ASSERT_INT_EQ(dev_event_create_timed(d, &t1), MESH_OK);
    ASSERT_INT_EQ(dev_event_record(d, t0, s), MESH_OK);
    ASSERT_INT_EQ(dev_copy(d, b, a, N, DEV_DEVICE_TO_DEVICE, s), MESH_OK);
    ASSERT_INT_EQ(dev_event_record(d, t1, s), MESH_OK);
    ASSERT_INT_EQ(dev_stream_sync(d, s), MESH_OK);
    ASSERT_INT_EQ(dev_event_elapsed(d, t0, t1, &ms), MESH_OK);
    ASSERT_INT_EQ(ms >= 0 && ms < 10e3, 1);
    if (!d->v->event_elapsed) ASSERT_INT_EQ(ms == 0, 1);
    ASSERT_INT_EQ(dev_event_elapsed(d, t0, NULL, &ms), MESH_ERR_INVALID_ARG);
    if (d->v->event_elapsed) {
        ASSERT_INT_NE(dev_event_elapsed(d, e, t1, &ms), MESH_OK);
        ASSERT_NOT_NULL(strstr(dev_last_error(d), "cudaEventElapsedTime"));
    }
    dev_event_destroy(d, t0);
    dev_event_destroy(d, t1);

    /* bad arguments are refused, with the device named */
    char want[300];
    snprintf(want, sizeof want, "%s: copy of 4 bytes: NULL buffer", d->name);
    ASSERT_INT_EQ(dev_copy(d, NULL, a, 4, DEV_HOST_TO_DEVICE, s), MESH_ERR_INVALID_ARG);
    ASSERT_STR_EQ(dev_last_error(d), want);
    ASSERT_INT_EQ(dev_copy(d, b, a, 4, (dev_copy_kind)9, s), MESH_ERR_INVALID_ARG);
    ASSERT_INT_EQ(dev_event_query(d, NULL, &done), MESH_ERR_INVALID_ARG);

    size_t free_bytes = 0, total = 0;
    ASSERT_INT_EQ(dev_mem_info(d, &free_bytes, &total), MESH_OK);
    ASSERT_INT_LT(0, (intmax_t)(total / 4096));
    ASSERT_INT_GE((intmax_t)(total / 4096), (intmax_t)(free_bytes / 4096));

    dev_event_destroy(d, e);
    dev_event_destroy(d, NULL);
    dev_stream_destroy(d, s);
    dev_stream_destroy(d, NULL);
    dev_free(d, a);
    dev_free(d, b);
    dev_free(d, NULL);
}

TEST_IMPL(device_cpu_round_trips)
{
    char err[256] = "x";
    dev *d = NULL;
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_CPU, 0, &d, err, sizeof err), MESH_OK);
    ASSERT_STR_EQ(err, "");
    ASSERT_STR_EQ(d->name, "cpu");
    ASSERT_STR_EQ(d->v->name, "cpu");
    round_trip(d);
    dev_close(d);
    dev_close(NULL);

    /* the CPU is device 0 only; a kind that is none */
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_CPU, 1, &d, err, sizeof err), MESH_ERR_INVALID_ARG);
    ASSERT_NULL(d);
    ASSERT_STR_EQ(err, "cpu: no device 1");
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_AUTO, 0, &d, err, sizeof err), MESH_ERR_INVALID_ARG);
    ASSERT_STR_EQ(err, "device kind 0 is neither the CPU nor CUDA");
}

/* ---- the guarded test device: its memory faults outside its calls ---- */

enum { GUARD_FAULT = 42, GUARD_SETUP = 3 }; /* a probe's exit status: it faulted; it could not start */

static void guard_on_fault(int sig)
{
    (void)sig;
    _exit(GUARD_FAULT);
}

static void *guard_touch(void *p)
{
    return (void *)(uintptr_t)((volatile unsigned char *)p)[0];
}

/* another thread's touch, once fd (a pipe) says go; the thread starts
 * before the memory is opened (a new thread has its maker's rights) */
static int guard_go[2];
static void *guard_touch_on_go(void *p)
{
    char c;
    if (read(guard_go[0], &c, 1) != 1) _exit(GUARD_SETUP);
    return guard_touch(p);
}

/* In a child process (with mprotect, not keys, if plain): opens a guarded
 * device, does what it allows, then probe `what`'s touch; exits
 * GUARD_FAULT if that faulted, 0 if not, 10 + dev_guard_keyed() for
 * probe 0. */
static void guard_probe_child(int plain, int what)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = guard_on_fault;
    if (sigaction(SIGSEGV, &sa, NULL) != 0) _exit(GUARD_SETUP);
    if (plain) setenv("MESH_GUARD_NO_PKEYS", "1", 1);
    char err[256];
    dev *d = NULL;
    void *p = NULL, *q = NULL;
    unsigned char host[64], back[64];
    for (int i = 0; i < 64; i++) host[i] = (unsigned char)(i * 7 + 1);
    if (dev_open_guarded(&d, err, sizeof err) != MESH_OK || dev_alloc(d, &p, 4096) != MESH_OK ||
        dev_alloc(d, &q, 4096) != MESH_OK)
        _exit(GUARD_SETUP);
    if (what == 0) _exit(10 + dev_guard_keyed());
    /* what it allows: its copies and memsets, and touches inside dev_guard (nested) */
    if (dev_memset(d, p, 0, 4096, NULL) != MESH_OK || dev_copy(d, p, host, 64, DEV_HOST_TO_DEVICE, NULL) != MESH_OK)
        _exit(GUARD_SETUP);
    dev_guard(d, 1);
    dev_guard(d, 1);
    ((volatile unsigned char *)p)[100] = 9;
    dev_guard(d, 0);
    ((volatile unsigned char *)p)[101] = 8; /* still open: one level left */
    dev_guard(d, 0);
    if (dev_copy(d, back, p, 64, DEV_DEVICE_TO_HOST, NULL) != MESH_OK || memcmp(back, host, 64) != 0)
        _exit(GUARD_SETUP);
    switch (what) {
    case 1: ((volatile unsigned char *)p)[0] = 1; break; /* the host writes */
    case 2: (void)guard_touch(p); break;                  /* the host reads */
    case 3: { /* another thread reads while this one has it open */
        pthread_t t;
        if (pipe(guard_go) != 0 || pthread_create(&t, NULL, guard_touch_on_go, p) != 0) _exit(GUARD_SETUP);
        dev_guard(d, 1);
        if (write(guard_go[1], "g", 1) != 1) _exit(GUARD_SETUP);
        pthread_join(t, NULL);
        dev_guard(d, 0);
        break;
    }
    case 4: /* a freed buffer, inside dev_guard */
        dev_free(d, q);
        dev_guard(d, 1);
        (void)guard_touch(q);
        dev_guard(d, 0);
        break;
    }
    _exit(0);
}

static int guard_probe(int plain, int what)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) unit_fail(__FILE__, __LINE__, "fork failed");
    if (pid == 0) guard_probe_child(plain, what);
    int st;
    if (waitpid(pid, &st, 0) != pid) unit_fail(__FILE__, __LINE__, "waitpid failed");
    if (!WIFEXITED(st) || WEXITSTATUS(st) == GUARD_SETUP)
        unit_fail(__FILE__, __LINE__, "guard probe %d (%s): status %#x", what, plain ? "mprotect" : "default", st);
    return WEXITSTATUS(st);
}

/* The guarded device (device_guard.c) is what the guarded executor tests
 * rest on: its memory faults when the host touches it but through the
 * device's copies, memsets and dev_guard's brackets, with mprotect and,
 * where the CPU has them, with a protection key (then another thread's
 * touch faults too while this one has the memory open); a freed buffer's
 * faults inside a bracket too. */
TEST_IMPL(device_guarded_memory_faults_outside_its_calls)
{
    for (int plain = 0; plain < 2; plain++) {
        int keyed = guard_probe(plain, 0) - 10;
        if (plain) ASSERT_INT_EQ(keyed, 0);
        if (!plain && !keyed) fprintf(stderr, "# no protection keys here: the default is mprotect too\n");
        ASSERT_INT_EQ(guard_probe(plain, 1), GUARD_FAULT);
        ASSERT_INT_EQ(guard_probe(plain, 2), GUARD_FAULT);
        ASSERT_INT_EQ(guard_probe(plain, 3), (keyed ? GUARD_FAULT : 0)); /* mprotect: open to every thread */
        ASSERT_INT_EQ(guard_probe(plain, 4), GUARD_FAULT); /* (mprotect: the last buffer, above what opens) */
    }
}

/* The out-of-memory text, and a failing allocation (the CPU's test hook)
 * that carries it with the plan's prediction and the device's memory. */
TEST_IMPL(device_out_of_memory_message)
{
    char text[400];
    dev_oom_text(text, sizeof text, "cudaMalloc", 1073741824, 2147483648u, 0, 1, 524288000, 150754820096ull);
    ASSERT_STR_EQ(text, "cudaMalloc: out of device memory allocating 1073741824 bytes (the plan predicts "
                        "2147483648 bytes per rank; the device has 524288000 free of 150754820096)");
    dev_oom_text(text, sizeof text, "cudaMalloc", 1073741824, 2147483648u, 33554432, 1, 524288000, 150754820096ull);
    ASSERT_STR_EQ(text, "cudaMalloc: out of device memory allocating 1073741824 bytes (the plan predicts "
                        "2147483648 bytes per rank, and the kernels hold 33554432 more; the device has 524288000 "
                        "free of 150754820096)");
    dev_oom_text(text, sizeof text, "cudaMalloc", 4096, 0, 0, 1, 0, 8192);
    ASSERT_STR_EQ(text, "cudaMalloc: out of device memory allocating 4096 bytes (the device has 0 free of 8192)");
    dev_oom_text(text, sizeof text, "cudaMalloc", 4096, 0, 64, 1, 0, 8192);
    ASSERT_STR_EQ(text, "cudaMalloc: out of device memory allocating 4096 bytes (the kernels hold 64 bytes; the "
                        "device has 0 free of 8192)");
    dev_oom_text(text, sizeof text, "cudaMalloc", 4096, 100, 0, 0, 0, 0);
    ASSERT_STR_EQ(text,
                  "cudaMalloc: out of device memory allocating 4096 bytes (the plan predicts 100 bytes per rank)");
    dev_oom_text(text, sizeof text, NULL, 4096, 0, 0, 0, 0, 0);
    ASSERT_STR_EQ(text, "out of device memory allocating 4096 bytes");

    dev *d = NULL;
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_CPU, 0, &d, NULL, 0), MESH_OK);
    dev_set_planned(d, 123456);
    d->fail_alloc = 1;
    void *p = &d;
    ASSERT_INT_EQ(dev_alloc(d, &p, 1 << 20), MESH_ERR_NOMEM);
    ASSERT_NULL(p);
    const char *want = "cpu: posix_memalign: out of device memory allocating 1048576 bytes (the plan predicts "
                       "123456 bytes per rank; the device has ";
    const char *msg = dev_last_error(d);
    if (!starts_with(msg, want)) ASSERT_STR_EQ(msg, want);
    unsigned long long f = 0, t = 0;
    char end = 0;
    ASSERT_INT_EQ(sscanf(msg + strlen(want), "%llu free of %llu%c", &f, &t, &end), 3);
    ASSERT_INT_EQ(end, ')');
    ASSERT_INT_GE((intmax_t)(t / 4096), (intmax_t)(f / 4096));
    ASSERT_INT_LT(0, (intmax_t)(t / 4096));
    d->fail_alloc = 0; /* the hook off, the same call succeeds */
    ASSERT_INT_EQ(dev_alloc(d, &p, 1 << 20), MESH_OK);
    dev_free(d, p);
    dev_close(d);
}

/* No GPU here (or one): the probe says which, the same as the NCCL
 * backend's, and opening a CUDA device fails with the reason. */
TEST_IMPL(device_cuda_probe_says_why)
{
    char why[320] = "x", name[256] = "x", err[400] = "";
    int gpu = dev_cuda_probe(why, sizeof why, name, sizeof name);
    ASSERT_INT_EQ(dev_cuda_probe(NULL, 0, NULL, 0), gpu);
    char nccl_why[320] = "";
    ASSERT_INT_EQ(comm_nccl_available(nccl_why, sizeof nccl_why), gpu);
    ASSERT_STR_EQ(nccl_why, why);
    dev *d = NULL;
    if (gpu) {
        ASSERT_STR_EQ(why, "");
        ASSERT_STR_NE(name, "");
        printf("# GPU: %s\n", name);
        return;
    }
    ASSERT_STR_EQ(name, "");
    /* built without CUDA, or no driver (this machine), or no device */
    if (strcmp(why, NO_CUDA) != 0 && !starts_with(why, "no CUDA driver (") &&
        !starts_with(why, "cudaGetDeviceCount: ") && !starts_with(why, "no CUDA device"))
        ASSERT_STR_EQ(why, "no CUDA driver (...)");
    char want[400];
    snprintf(want, sizeof want, "cuda:0: no GPU (%s)", why);
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_CUDA, 0, &d, err, sizeof err), MESH_ERR_UNSUPPORTED);
    ASSERT_NULL(d);
    ASSERT_STR_EQ(err, want);
}

/* a watch that counts its calls, and fails once told to */
typedef struct watch_count {
    int calls, fail;
} watch_count;

static int count_watch(void *ud, double waited_s, char *why, size_t n)
{
    watch_count *w = ud;
    (void)waited_s;
    w->calls++;
    if (!w->fail) return 0;
    snprintf(why, n, "rank 1 is gone");
    return -1;
}

/* A watched device's copies to and from the host go through its
 * page-locked staging in pieces (a pageable copy may wait inside the CUDA
 * call, where no watch runs): the bytes arrive, each piece's wait asks the
 * watch, and a watch that fails fails the copy with its reason. */
static void watched_round_trip(dev *d)
{
    size_t n = (9u << 20) + 123; /* three pieces of the staging */
    unsigned char *host = malloc(n), *back = malloc(n);
    void *a = NULL;
    ASSERT_NOT_NULL(host);
    ASSERT_NOT_NULL(back);
    for (size_t k = 0; k < n; k++) host[k] = (unsigned char)(k * 13 + k / 4099);
    ASSERT_INT_EQ(dev_alloc(d, &a, n), MESH_OK);
    watch_count w = {0, 0};
    dev_set_watch(d, count_watch, &w);
    ASSERT_INT_EQ(dev_copy(d, a, host, n, DEV_HOST_TO_DEVICE, NULL), MESH_OK);
    ASSERT_INT_EQ(dev_copy(d, back, a, n, DEV_DEVICE_TO_HOST, NULL), MESH_OK);
    ASSERT_INT_EQ(memcmp(host, back, n), 0);
    ASSERT_INT_GE(w.calls, 3 + 2); /* three pieces back, two waits before the staging's reuse going there */
    w.fail = 1;
    ASSERT_INT_EQ(dev_copy(d, back, a, 64, DEV_DEVICE_TO_HOST, NULL), MESH_ERR_RANK);
    if (!strstr(dev_last_error(d), "rank 1 is gone")) unit_fail(__FILE__, __LINE__, "%s", dev_last_error(d));
    dev_set_watch(d, NULL, NULL);
    ASSERT_INT_EQ(dev_copy(d, back, a, 64, DEV_DEVICE_TO_HOST, NULL), MESH_OK); /* unwatched: as before */
    ASSERT_INT_EQ(dev_stream_sync(d, NULL), MESH_OK);
    dev_free(d, a);
    free(host);
    free(back);
}

/* With a GPU (else nothing: device_cuda_probe_says_why said why): the
 * same round trips on device 0, an allocation larger than the device says
 * how much it has, and the watched round trips. */
TEST_IMPL(device_cuda_round_trips)
{
    char name[256], err[400] = "x", want[600];
    if (!dev_cuda_probe(NULL, 0, name, sizeof name)) return;
    dev *d = NULL;
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_CUDA, 0, &d, err, sizeof err), MESH_OK);
    ASSERT_STR_EQ(err, "");
    snprintf(want, sizeof want, "cuda:0 (%s)", name);
    ASSERT_STR_EQ(d->name, want);
    round_trip(d);
    size_t free_bytes = 0, total = 0;
    ASSERT_INT_EQ(dev_mem_info(d, &free_bytes, &total), MESH_OK);
    void *p = &d;
    dev_set_planned(d, 1000);
    ASSERT_INT_EQ(dev_alloc(d, &p, 2 * total), MESH_ERR_NOMEM);
    ASSERT_NULL(p);
    snprintf(want, sizeof want, "cuda:0 (%s): cudaMalloc: out of device memory allocating %zu bytes (the plan "
             "predicts 1000 bytes per rank; the device has ", name, 2 * total);
    if (!starts_with(dev_last_error(d), want)) ASSERT_STR_EQ(dev_last_error(d), want);
    printf("# %s\n", dev_last_error(d));
    round_trip(d); /* the failure left the device usable */
    watched_round_trip(d);
    dev_close(d);
    ASSERT_INT_EQ(dev_open(MESH_DEVICE_CUDA, 4096, &d, err, sizeof err), MESH_ERR_UNSUPPORTED);
    ASSERT_INT_EQ(strncmp(err, "cuda:4096: no such device: this process sees ", 45), 0);
}

/* The rules of the choice, with and without a (made-up) GPU. */
TEST_IMPL(device_choose_rules)
{
    char why[400];
    mesh_device_kind k = MESH_DEVICE_CUDA;
    ASSERT_INT_EQ(dev_choose(MESH_DEVICE_AUTO, 0, "no CUDA driver (x)", &k, why, sizeof why), MESH_OK);
    ASSERT_INT_EQ(k, MESH_DEVICE_CPU);
    ASSERT_STR_EQ(why, "no GPU (no CUDA driver (x)): running on the CPU");
    ASSERT_INT_EQ(dev_choose(MESH_DEVICE_AUTO, 1, "NVIDIA H200", &k, why, sizeof why), MESH_OK);
    ASSERT_INT_EQ(k, MESH_DEVICE_CUDA);
    ASSERT_STR_EQ(why, "a GPU is present: running on NVIDIA H200 (--device cpu trains on the CPU)");
    ASSERT_INT_EQ(dev_choose(MESH_DEVICE_CPU, 1, "NVIDIA H200", &k, why, sizeof why), MESH_OK);
    ASSERT_INT_EQ(k, MESH_DEVICE_CPU);
    ASSERT_STR_EQ(why, "the CPU was asked for: running on the CPU");
    k = MESH_DEVICE_AUTO;
    ASSERT_INT_EQ(dev_choose(MESH_DEVICE_CUDA, 0, NO_CUDA, &k, why, sizeof why), MESH_ERR_UNSUPPORTED);
    ASSERT_INT_EQ(k, MESH_DEVICE_AUTO); /* untouched */
    ASSERT_STR_EQ(why, "--device cuda: no GPU (" NO_CUDA ")");
    ASSERT_INT_EQ(dev_choose(MESH_DEVICE_CUDA, 1, "NVIDIA H200", &k, why, sizeof why), MESH_OK);
    ASSERT_INT_EQ(k, MESH_DEVICE_CUDA);
    ASSERT_STR_EQ(why, "the GPU was asked for: running on NVIDIA H200");
    ASSERT_INT_EQ(dev_choose((mesh_device_kind)7, 0, "", &k, why, sizeof why), MESH_ERR_INVALID_ARG);
    ASSERT_STR_EQ(why, "device kind 7 is not one of MESH_DEVICE_AUTO, MESH_DEVICE_CPU, MESH_DEVICE_CUDA");
}

/* The public choice on this machine: AUTO runs on the GPU if there is
 * one, else on the CPU, and says why; CUDA is refused naming the reason
 * without a GPU (the choice stays) and taken with one, CPU is taken; a
 * context records the device and the reason. */
TEST_IMPL(device_selection_public)
{
    char reason[320], name[256], want[600];
    int gpu = dev_cuda_probe(reason, sizeof reason, name, sizeof name);
    mesh_device_kind k = MESH_DEVICE_CUDA;
    const char *why = NULL;

    /* nothing set: AUTO's choice */
    ASSERT_INT_EQ(mesh_device_info(&k, &why), MESH_OK);
    ASSERT_INT_EQ(k, gpu ? MESH_DEVICE_CUDA : MESH_DEVICE_CPU);
    if (gpu)
        snprintf(want, sizeof want, "a GPU is present: running on %s (--device cpu trains on the CPU)", name);
    else
        snprintf(want, sizeof want, "no GPU (%s): running on the CPU", reason);
    ASSERT_STR_EQ(why, want);
    ASSERT_INT_EQ(mesh_device_info(NULL, NULL), MESH_OK);

    mesh_plan *mp = fixture_plan(NULL, 0);
    mesh_context *ctx = NULL;
    const char *cwhy = NULL;
    ASSERT_INT_EQ(mesh_context_create(mp, 0, &ctx), MESH_OK);
    ASSERT_INT_EQ(ctx->device, gpu ? MESH_DEVICE_CUDA : MESH_DEVICE_CPU);
    ASSERT_INT_EQ(mesh_context_device(ctx, &k, &cwhy), MESH_OK);
    ASSERT_INT_EQ(k, ctx->device);
    ASSERT_STR_EQ(cwhy, want);
    ASSERT_INT_EQ(mesh_context_device(ctx, NULL, NULL), MESH_OK);
    mesh_context_free(ctx);
    ASSERT_INT_EQ(mesh_context_device(NULL, &k, &cwhy), MESH_ERR_INVALID_ARG);
    ASSERT_STR_EQ(mesh_last_error(), "mesh_context_device: NULL context");

    /* CUDA: without a GPU refused, the reason said, the choice stays
     * AUTO's; with one taken, and a context trains there */
    if (!gpu) {
        ASSERT_INT_EQ(mesh_set_device(MESH_DEVICE_CUDA), MESH_ERR_UNSUPPORTED);
        snprintf(want, sizeof want, "--device cuda: no GPU (%s)", reason);
        ASSERT_STR_EQ(mesh_last_error(), want);
        ASSERT_INT_EQ(mesh_device_info(&k, &why), MESH_OK);
        ASSERT_INT_EQ(k, MESH_DEVICE_CPU);
        ASSERT_INT_EQ(strncmp(why, "no GPU (", 8), 0);
    } else {
        ASSERT_INT_EQ(mesh_set_device(MESH_DEVICE_CUDA), MESH_OK);
        ASSERT_INT_EQ(mesh_device_info(&k, &why), MESH_OK);
        ASSERT_INT_EQ(k, MESH_DEVICE_CUDA);
        ASSERT_INT_EQ(mesh_context_create(mp, 0, &ctx), MESH_OK);
        ASSERT_INT_EQ(ctx->device, MESH_DEVICE_CUDA);
        mesh_context_free(ctx);
    }

    /* CPU: taken */
    ASSERT_INT_EQ(mesh_set_device(MESH_DEVICE_CPU), MESH_OK);
    ASSERT_INT_EQ(mesh_device_info(&k, &why), MESH_OK);
    ASSERT_INT_EQ(k, MESH_DEVICE_CPU);
    ASSERT_STR_EQ(why, "the CPU was asked for: running on the CPU");
    ASSERT_INT_EQ(mesh_context_create(mp, 0, &ctx), MESH_OK);
    ASSERT_INT_EQ(ctx->device, MESH_DEVICE_CPU);
    ASSERT_INT_EQ(mesh_context_device(ctx, &k, &cwhy), MESH_OK);
    ASSERT_STR_EQ(cwhy, "the CPU was asked for: running on the CPU");
    mesh_context_free(ctx);

    /* AUTO again, and a kind that is none */
    ASSERT_INT_EQ(mesh_set_device(MESH_DEVICE_AUTO), MESH_OK);
    ASSERT_INT_EQ(mesh_device_info(&k, &why), MESH_OK);
    ASSERT_INT_EQ(strncmp(why, gpu ? "a GPU is present: running on " : "no GPU (", gpu ? 29 : 8), 0);
    ASSERT_INT_EQ(mesh_set_device((mesh_device_kind)42), MESH_ERR_INVALID_ARG);
    ASSERT_STR_EQ(mesh_last_error(),
                  "device kind 42 is not one of MESH_DEVICE_AUTO, MESH_DEVICE_CPU, MESH_DEVICE_CUDA");
    mesh_plan_free(mp);
}
