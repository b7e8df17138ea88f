/* sched.h — pipeline schedules: the per-stage order of forward and backward
 * micro-batch units, and the sends/receives between stages.
 *
 * A schedule is a pure function of (kind, pp, micro-batches m, virtual
 * chunks v). Stage s holds model chunks s, s+pp, s+2pp, ... (Megatron's
 * interleaved assignment); with v = 1 it holds chunk s. Every unit runs
 * one micro-batch through one chunk, forward or backward. Forward of chunk
 * c > 0 receives activations from the stage holding chunk c-1; backward of
 * chunk c < pp*v-1 receives gradients from the stage holding chunk c+1.
 */
#ifndef MESH_SCHED_H
#define MESH_SCHED_H

#include <stdio.h> /* FILE */

typedef enum sched_kind { SCHED_KIND_GPIPE, SCHED_KIND_1F1B, SCHED_KIND_INTERLEAVED } sched_kind;

typedef enum sched_op {
    SCHED_FWD,       /* forward of (micro, chunk) */
    SCHED_BWD,       /* backward of (micro, chunk) */
    SCHED_SEND_ACT,  /* send activations of (micro, chunk) to `peer` stage */
    SCHED_RECV_ACT,  /* receive activations for (micro, chunk) from `peer` */
    SCHED_SEND_GRAD, /* send input-gradients of (micro, chunk) to `peer` */
    SCHED_RECV_GRAD  /* receive output-gradients for (micro, chunk) from `peer` */
} sched_op;

typedef struct sched_unit {
    sched_op op;
    int micro;  /* 0 .. m-1 */
    int chunk;  /* global model chunk 0 .. pp*v-1 */
    int peer;   /* stage for send/recv, -1 otherwise */
} sched_unit;

typedef struct sched_stage {
    sched_unit *units; /* in execution order */
    int n_units;
} sched_stage;

typedef struct sched {
    sched_kind kind;
    int pp, m, v;
    sched_stage *stages; /* pp entries */
} sched;

/* Builds the schedule; returns 0, or -1 with a message in err (size n) when
 * the parameters are invalid (pp < 1, m < 1, v < 1, v > 1 without
 * interleaved, 1f1b/interleaved with m < pp, interleaved with m % pp != 0). */
int sched_build(sched *out, sched_kind kind, int pp, int m, int v, char *err, int n);
void sched_free(sched *s);

/* Simulates the schedule with forward cost tf and backward cost tb per
 * unit (sends/receives free, a receive waits for its send) and returns the
 * makespan; *bubble gets the idle fraction of the busiest stage:
 * (makespan - busy) / makespan. For 1F1B with tb = 2 tf this equals
 * (p-1)/(m+p-1); interleaved (p-1)/(v*m+p-1). */
double sched_simulate(const sched *s, double tf, double tb, double *bubble);

/* Peak number of micro-batches whose activations a stage holds at once. */
int sched_peak_inflight(const sched *s, int stage);

/* --dump=schedule: one line per stage, units as F3.1 (forward, micro 3,
 * chunk 1), B3.1, and sends/receives as >a3.1@2 / <a3.1@0 / >g / <g. */
void sched_dump(const sched *s, FILE *out);

#endif
