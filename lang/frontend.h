/* frontend.h — the front end as one object: load a .mesh file with its
 * imports, apply --set overrides, check, and print results. Used by meshc
 * and the fuzz harness; internal to mesh (not part of mesh.h).
 *
 * Every problem in the input is a diagnostic, never a crash: files are
 * read only if regular and at most FE_MAX_FILE bytes, and memory exhaustion
 * inside the front end unwinds to the entry point (status FE_NOMEM).
 */
#ifndef MESH_FRONTEND_H
#define MESH_FRONTEND_H

#include <stddef.h> /* size_t */
#include <stdint.h> /* int64_t */
#include <stdio.h>  /* FILE */

#include "diag.h"
#include "graph.h"

enum { FE_MAX_FILE = 4 << 20, FE_MAX_IMPORT_DEPTH = 64 };

typedef enum fe_status { FE_OK = 0, FE_ERRORS = 1, FE_USAGE = 2, FE_NOMEM = 3 } fe_status;

typedef struct fe_options {
    const char *const *include_dirs; /* -I folders, searched in order */
    int n_include;
    const char *std_dir;             /* the folder holding std/, or NULL */
    diag_fn diag;                    /* where diagnostics go */
    void *diag_ud;
} fe_options;

typedef struct fe fe;

fe *fe_new(const fe_options *o);
void fe_free(fe *f);                                       /* NULL is a no-op */
fe_status fe_add_set(fe *f, const char *key_value);         /* before fe_load_* */
fe_status fe_load_file(fe *f, const char *path);
fe_status fe_load_buffer(fe *f, const char *name, const char *data, size_t len);
fe_status fe_check(fe *f);                                 /* FE_ERRORS if any error */
int fe_error_count(const fe *f);
int fe_warning_count(const fe *f);

/* train.bucket_size's default: 25 million elements a gradient bucket
 * (Megatron-LM and PyTorch DDP bucket their gradient sync alike). */
#define FE_BUCKET_SIZE 25000000LL

/* What the compiler needs after a successful fe_check. */
typedef struct fe_setup {
    long long dp, tp, pp, ep, world;
    long long global_batch, micro_batch, seq_len, steps, micro_batches; /* micro_batches per data-parallel rank */
    int schedule;            /* 0 gpipe, 1 1f1b, 2 interleaved */
    int virtual_stages, zero, precision; /* precision: 0 fp32, 1 bf16, 2 fp16 */
    int recompute, sequence_parallel;
    long long bucket_size;   /* elements of a gradient bucket (train.bucket_size) */
    double loss_scale;       /* fp16: 0 dynamic, else the fixed scale */
    long long layers;        /* layer-stack count, 0 if none */
    long long memory_limit;  /* train.memory_limit in bytes per rank, 0 if none */
    double lr, beta1, beta2, eps, weight_decay, clip; /* the optimizer: adamw */
    int lr_schedule;         /* 0 constant, 1 cosine, 2 linear */
    long long warmup;
    double min_lr;
    long long seed, log_every, eval_every, checkpoint_every;
    const char *data, *val_data, *checkpoint_dir; /* NULL if not given */
    int stage_mode;          /* train.stage_layers: 0 equal split, 1 balanced by compute, 2 explicit */
    int n_stage_layers;      /* 2: the layers of each pipeline chunk (owned by the fe) */
    const int64_t *stage_layers;
    loc memory_limit_at;     /* where it is written */
} fe_setup;

/* 124475904 -> "124,475,904" in buf (size bytes; cut to fit). */
void fe_commas(long long v, char *buf, size_t size);

/* "80GiB", "512MiB", "1.5TB", "123456" -> bytes, or -1. */
long long fe_parse_bytes(const char *text);

const graph *fe_graph(const fe *f);          /* valid after fe_check == FE_OK */
void fe_error_at(fe *f, loc l, const char *msg); /* a diagnostic from a later stage */
fe_setup fe_get_setup(const fe *f);

void fe_dump_ast(fe *f, FILE *out);
void fe_dump_params(fe *f, FILE *out);
void fe_summary(fe *f, FILE *out);

#endif
