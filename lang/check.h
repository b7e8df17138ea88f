/* check.h — the semantic checker's shared state (internal to lang/).
 *
 * The checker evaluates a parsed program: top-level constants, then the
 * mesh, then the train section, then the model, inlining block calls with
 * concrete shapes. It reports every problem it finds (see docs/language.md,
 * "Checks") and records what the summary and `--dump=params` print.
 */
#ifndef MESH_CHECK_H
#define MESH_CHECK_H

#include "ast.h"
#include "graph.h"
#include "value.h"

typedef enum axis_id { AX_DP, AX_TP, AX_PP, AX_EP, AX_COUNT } axis_id;

typedef enum bkind { B_CONST, B_TENSOR, B_PARAM, B_INPUT, B_BLOCK } bkind;

typedef struct binding binding;
struct binding {
    const char *name;
    bkind kind;
    value v;
    loc decl;
    const ast_node *node; /* B_BLOCK: the block; B_PARAM: the declaration */
    int used;
    int bad;              /* B_BLOCK: its declaration had errors; calls are not checked */
    binding *next;        /* hash chain */
    binding *order;       /* definition order within the scope */
};

typedef struct scope scope;
struct scope {
    scope *parent;
    int barrier;           /* a model or block body: assignments stop here */
    binding **buckets;
    int n_buckets, count;
    binding *first, *last; /* in definition order */
};

/* One annotation of a parameter or activation, evaluated. */
typedef struct placement {
    int axis;      /* axis_id */
    int dim;       /* split dimension (normalised), -1 for replicate */
} placement;

/* A declared parameter, for counting and --dump=params. */
typedef struct pinfo pinfo;
struct pinfo {
    const char *name;      /* global name, e.g. h.{0..11}.gpt2_block.w_qkv */
    value shape;
    int64_t mult;          /* how many copies (product of enclosing repeats) */
    placement place[4];
    int n_place;
    const char *init;      /* printable init, e.g. normal(0.02) */
    pinfo *next;
};

/* A `--set key=value` override. */
typedef struct set_item {
    const char *section;   /* "mesh", "train", "model" or NULL (top level) */
    const char *key;
    ast_node *value;
    loc where;             /* the whole key=value */
    int used;
} set_item;

/* An enclosing block call, for notes and parameter names. */
typedef struct frame frame;
struct frame {
    const ast_node *block;
    loc call;
    const char *prefix;    /* parameter-name prefix inside this call */
    int64_t mult;          /* product of enclosing repeat counts */
    scope *names_used;     /* block names called in this scope (for _2 suffixes) */
    frame *up;
};

typedef enum stage_mode { STAGE_EQUAL, STAGE_BALANCED, STAGE_EXPLICIT } stage_mode;
typedef enum schedule_id { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED } schedule_id;
typedef enum precision_id { PREC_FP32, PREC_BF16, PREC_FP16 } precision_id;

typedef struct train_cfg {
    int64_t global_batch, micro_batch, seq_len, steps;
    int schedule, virtual_stages, zero, precision, recompute, sequence_parallel;
    int64_t bucket_size;     /* elements of a gradient bucket (the data-parallel sync's unit) */
    double loss_scale;       /* 0 = dynamic */
    double lr, beta1, beta2, eps, weight_decay, clip;
    const char *lr_schedule; /* constant, cosine, linear */
    int64_t warmup;
    double min_lr;
    int64_t seed, eval_every, log_every, checkpoint_every;
    const char *data, *val_data, *checkpoint_dir;
    long long memory_limit;  /* bytes per rank, 0 = none */
    int stage_mode;          /* STAGE_EQUAL, STAGE_BALANCED, STAGE_EXPLICIT */
    int64_t *stage_layers;   /* STAGE_EXPLICIT: layers per pipeline chunk */
    int n_stage_layers;
    loc stage_layers_at;
    loc memory_limit_at;
    int ok;                  /* batch and seq_len are known */
} train_cfg;

typedef struct checker {
    arena *arena;
    diag_sink *diag;
    ast_node **files;        /* parsed files, imports first; the main file is last */
    int n_files;
    scope *globals;          /* top-level constants and blocks */
    set_item *sets;
    int n_sets;

    const ast_node *mesh_node, *train_node, *model_node;
    int64_t axis[AX_COUNT];
    int64_t dp_replicate, dp_shard;
    int64_t world;
    train_cfg train;

    /* model results */
    pinfo *params, **params_tail;
    int n_params;
    int64_t total_params;
    int params_overflow;
    int64_t layers;          /* count of the model's layer-stack repeat, 0 if none */
    const ast_node *layers_node;  /* the first top-level repeat: the layer stack */
    const ast_node *second_stack; /* another top-level repeat, if any */
    int has_moe;
    int64_t work;            /* statements evaluated, bounded */
    graph *graph;            /* where the model's dataflow is recorded, or NULL */
    int call_depth;
    frame *frame;
} checker;

enum { CHECK_MAX_CALL_DEPTH = 32, CHECK_MAX_WORK = 200000 };

extern const char *const axis_names[AX_COUNT];

/* check.c */
void check_run(checker *c); /* the whole check; the results land in *c */
scope *scope_new(checker *c, scope *parent);
binding *scope_find_local(const scope *s, const char *name);
binding *scope_find(const scope *s, const char *name);
binding *scope_add(checker *c, scope *s, const char *name, bkind kind, loc decl);
void check_error(checker *c, loc l, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void check_warning(checker *c, loc l, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void check_note(checker *c, loc l, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Reports an unknown name with a "did you mean" when one is close; returns
 * the suggestion (or NULL). */
const char *check_unknown_name(checker *c, loc l, const char *what, const char *name, const scope *s,
                               const char *const *extra, int n_extra);
const set_item *check_find_set(checker *c, const char *section, const char *key);
const char *shape_str(checker *c, const value *v);

/* check_expr.c */
typedef enum eval_mode {
    EVAL_CONST,   /* constants only */
    EVAL_OPTION,  /* constants, bare words and option constructors */
    EVAL_MODEL    /* tensors, ops and block calls too */
} eval_mode;
value eval(checker *c, scope *s, const ast_node *e, eval_mode mode);
enum { CHECK_N_CONST_FNS = 4 };
extern const char *const check_const_fns[CHECK_N_CONST_FNS]; /* round_up, min, max, sqrt */
value value_err(void);
value value_int(int64_t i, loc where);
value value_float(double f, loc where);
int value_as_int(checker *c, const value *v, const char *what, int64_t *out);
int value_as_number(checker *c, const value *v, const char *what, double *out);
const char *value_describe(checker *c, const value *v);

/* check_ops.c */
int ops_is_builtin(const char *name);
extern const int ops_count;
const char *ops_name(int i);
value ops_call(checker *c, scope *s, const ast_node *call);
value ops_binary(checker *c, const ast_node *e, const value *a, const value *b);
value tensor_value(int rank, const int64_t *dims, int is_int, loc where);

/* check_graph.c: recording the dataflow graph (no-ops when c->graph is NULL) */
void graph_note_tensor(checker *c, value *v, g_node *n);   /* appends n, sets v->node */
void graph_note_op(checker *c, const ast_node *call, value *result, const value *args, int n_args,
                   const value *const *named, const char *const *named_names, int n_named);
void graph_note_binary(checker *c, int op, value *result, const value *a, const value *b);

/* check_model.c */
void check_model(checker *c);
value check_block_call(checker *c, scope *caller, const ast_node *call, const ast_node *block);

/* check_resolve.c */
void check_uncalled_blocks(checker *c);

/* check_sections.c */
void check_mesh(checker *c);
void check_train(checker *c);
void check_layout(checker *c);  /* divisibility that needs model + mesh + train */

#endif
