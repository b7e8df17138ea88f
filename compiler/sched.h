/* sched.h — pipeline schedules: the per-stage order of forward and backward
 * micro-batch units, and the sends/receives between stages.
 *
 * A schedule is a pure function of (kind, pp, micro-batches m, virtual
 * chunks v). Stage s holds model chunks s, s+pp, s+2pp, ... (Megatron's
 * interleaved assignment); with v = 1 it holds chunk s. Every unit runs
 * one micro-batch through one chunk, forward or backward. Forward of chunk
 * c > 0 receives activations from the stage holding chunk c-1; backward of
 * chunk c < pp*v-1 receives gradients from the stage holding chunk c+1.
 * A receive sits right before the unit that needs the data and a send right
 * after the unit that made it; when both chunks live on one stage (pp = 1)
 * the data stays local and there is neither. Sends are buffered (they never
 * wait); a receive waits until its send was issued.
 *
 * Ownership: sched_build fills a caller-provided struct; sched_free releases
 * what it allocated (and is a no-op on a zeroed or freed struct).
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
    long long *chunk_layers; /* layer-stack iterations run by each of the pp*v chunks,
                                set by the compiler (compile.c); NULL: not assigned.
                                sched_free frees it. */
} sched;

/* Builds the schedule; returns 0, or -1 with a message in err (size n) when
 * the parameters are invalid (pp < 1, m < 1, v < 1, v > 1 without
 * interleaved, 1f1b/interleaved with m < pp, interleaved with m % pp != 0)
 * or memory runs out; *out is then zeroed.
 *
 *   GPIPE        all forwards, then all backwards, each in micro order
 *                (PyTorch ScheduleGPipe).
 *   1F1B         pp-stage-1 warm-up forwards, then one forward and one
 *                backward in turn, then the cool-down backwards
 *                (PipeDream-flush; Narayanan et al. 2021, fig. 4 top).
 *   INTERLEAVED  Megatron-core's interleaved 1F1B: micro-batches go in
 *                groups of pp through local chunk 0, 1, .. v-1 (backwards
 *                through v-1 .. 0); min(m*v, (pp-stage-1)*2 + (v-1)*pp)
 *                warm-up forwards, then 1F1B, then the cool-down. */
int sched_build(sched *out, sched_kind kind, int pp, int m, int v, char *err, int n);
void sched_free(sched *s);

/* Layer-stack iterations run by `chunk` (of pp*v): chunk_layers[chunk], or
 * an equal share of `total` when none were assigned. */
long long sched_chunk_layers(const sched *s, int chunk, long long total);

/* Simulates the schedule with forward cost tf and backward cost tb per
 * unit (sends/receives free, a receive waits for its send) and returns the
 * makespan; *bubble (may be NULL) gets the idle fraction of the busiest
 * stage: (makespan - busy) / makespan. For GPipe and 1F1B this equals
 * (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1), and the makespan is
 * (v*m+p-1)(tf+tb), for any tf and tb (tests/unit/test_sched.c checks
 * several ratios). Returns -1 (and *bubble = -1) when some receive can
 * never complete, which no schedule from sched_build does. */
double sched_simulate(const sched *s, double tf, double tb, double *bubble);

/* The same, also recording when each unit starts and ends: start[st][i]
 * and end[st][i] for unit i of stage st (arrays of stages[st].n_units that
 * the caller provides; either may be NULL). A receive starts when its stage
 * reaches it and ends when the data is there; a send takes no time. */
double sched_simulate_units(const sched *s, double tf, double tb, double *const *start,
                            double *const *end, double *bubble);

/* Peak number of micro-batches whose activations a stage holds at once
 * (forwards run whose backward has not): min(pp - stage, m) for 1F1B, m for
 * GPipe. With v > 1 it counts (micro, chunk) pairs, each 1/v of a stage's
 * layers. -1 for a stage out of range. */
int sched_peak_inflight(const sched *s, int stage);
/* The same over a list of units (a plan's stage). */
int sched_units_peak_inflight(const sched_unit *units, int n);

/* --dump=schedule: one line per stage, "stage 0: F0.0 >a0.0@1 ...", units
 * as F3.1 (forward, micro 3, chunk 1), B3.1, and sends/receives as >a3.1@2
 * (send activations of micro 3 out of chunk 1 to stage 2), <a3.1@0
 * (receive activations of micro 3 into chunk 1 from stage 0), >g3.1@0
 * (send input-gradients of chunk 1) and <g3.1@2 (receive output-gradients
 * of chunk 1). */
void sched_dump(const sched *s, FILE *out);

/* One unit as sched_dump writes it ("F3.1", ">a3.1@2") into buf (size n). */
void sched_unit_str(const sched_unit *u, char *buf, size_t n);

/* "gpipe", "1f1b" or "interleaved". */
const char *sched_kind_name(sched_kind kind);

#endif
