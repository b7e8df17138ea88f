/* threads.c — the cores the CPU kernels may use (kcpu.h; how many they do
 * use is gemm.c's kcpu_set_threads). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>  /* sched_getaffinity */
#include <unistd.h> /* sysconf */

#include "kcpu.h"

int kcpu_threads_available(void)
{
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) > 0) return CPU_COUNT(&cpus);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
