/*
 * mesh.h: the public C API of libmesh, the mesh runtime library.
 *
 * This header is the whole API. Anything not declared here is not API: other
 * headers, internal symbols and file formats may change in any release.
 *
 * Ownership: the caller owns buffers it passes in; libmesh owns what it
 * returns until the matching _free. (Strings returned by mesh_version and
 * mesh_status_str are static and are never freed.)
 *
 * Every function declared here is thread-safe on distinct objects; one
 * context is used by one thread at a time. A failing call returns a status
 * and leaves a message for mesh_last_error() (per thread).
 */
#ifndef MESH_H
#define MESH_H

#include <stddef.h> /* defines: size_t */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versions ---------------------------------------------------------- */

/* The version of this header. The Makefile reads these three lines, so keep
 * each on its own line as "#define NAME NUMBER". */
#define MESH_VERSION_MAJOR 0
#define MESH_VERSION_MINOR 1
#define MESH_VERSION_PATCH 0

/* One comparable number: major * 10000 + minor * 100 + patch (0.1.0 is 100). */
#define MESH_VERSION_NUM \
    (MESH_VERSION_MAJOR * 10000 + MESH_VERSION_MINOR * 100 + MESH_VERSION_PATCH)

/* The version of the linked library as "MAJOR.MINOR.PATCH". Compare
 * mesh_version_num() with MESH_VERSION_NUM to detect a library that does not
 * match the header you compiled against. */
const char *mesh_version(void);
int mesh_version_num(void);

/* ---- Status codes -------------------------------------------------------- */

/* X(NAME, message): one line per code. Codes are numbered in list order from
 * MESH_OK = 0; new codes are only ever appended, so values stay stable. */
#define MESH_STATUS_LIST(X)                                   \
    X(OK,              "ok")                                  \
    X(ERR_INVALID_ARG, "invalid argument")                    \
    X(ERR_NOMEM,       "out of memory")                       \
    X(ERR_IO,          "input/output error")                  \
    X(ERR_PARSE,       "parse error")                         \
    X(ERR_CHECK,       "check failed")                        \
    X(ERR_UNSUPPORTED, "not supported")                       \
    X(ERR_INTERNAL,    "internal error")

typedef enum mesh_status {
#define MESH_STATUS_ENUM_(name, message) MESH_##name,
    MESH_STATUS_LIST(MESH_STATUS_ENUM_)
#undef MESH_STATUS_ENUM_
} mesh_status;

/* The message of a status code from MESH_STATUS_LIST, or "unknown status" for
 * any other value. */
const char *mesh_status_str(mesh_status status);

/* ---- Allocation ---------------------------------------------------------- */

/* An allocator hook, as Lua's lua_Alloc. libmesh calls it as
 * f(ud, ptr, old_size, new_size), where ud is the pointer registered with it:
 *   - new_size == 0: free ptr (which may be NULL) and return NULL;
 *   - ptr == NULL, new_size > 0: allocate new_size bytes (old_size is 0);
 *   - ptr != NULL, new_size > 0: resize the old_size-byte block at ptr to
 *     new_size bytes, keeping its contents up to the smaller size.
 * On failure it returns NULL and leaves ptr untouched. Freeing never fails. */
typedef void *(*mesh_alloc_fn)(void *ud, void *ptr, size_t old_size,
                               size_t new_size);

/* The default allocator: realloc and free from the C library; it ignores ud
 * and old_size. Contexts (mesh_context_create_with) take their buffers
 * from a hook, this one when given NULL. */
void *mesh_alloc_default(void *ud, void *ptr, size_t old_size,
                         size_t new_size);

/* ---- Compiling .mesh text ------------------------------------------------ */

/* A diagnostic, rendered as meshc prints it: "file:line:col: error: ..."
 * with the source line and a caret (several lines, '\n'-terminated). level:
 * 0 error, 1 warning, 2 note. The text is valid during the call only. */
typedef void (*mesh_diag_fn)(void *ud, int level, const char *text);

/* Options of mesh_compile. Start from MESH_COMPILE_OPTIONS_INIT; `size`
 * versions the struct (fields are only ever added at the end). */
typedef struct mesh_compile_options {
    size_t size;                     /* sizeof(mesh_compile_options) */
    const char *const *sets;         /* "KEY=VALUE" overrides, as meshc --set */
    int n_sets;
    const char *const *include_dirs; /* import search folders, as meshc -I */
    int n_include;
    const char *std_dir;             /* the folder holding std/; NULL: the
                                        source tree's lang/ this libmesh was
                                        built from */
    mesh_diag_fn diag;               /* NULL: diagnostics are dropped */
    void *diag_ud;
} mesh_compile_options;

#define MESH_COMPILE_OPTIONS_INIT \
    {sizeof(mesh_compile_options), NULL, 0, NULL, 0, NULL, NULL, NULL}

/* Compiles the .mesh source text (len bytes; `name` is the file name that
 * diagnostics and relative imports use) into a plan, in memory: on MESH_OK
 * *plan holds the plan file's text (YAML, as meshc writes it) and *plan_len
 * its length; free it with mesh_free. Errors in the source are reported
 * through opt->diag and return MESH_ERR_CHECK; *plan is then NULL. opt may
 * be NULL (no overrides, diagnostics dropped). */
mesh_status mesh_compile(const char *name, const char *source, size_t len,
                         const mesh_compile_options *opt, char **plan,
                         size_t *plan_len);

/* Frees memory that libmesh returned to the caller (NULL does nothing). */
void mesh_free(void *p);

/* The message of the last call that failed in this thread (a file name, a
 * line, what was wrong), or "" when none has. Valid until the thread's next
 * failing call. */
const char *mesh_last_error(void);

/* ---- Plans and contexts -------------------------------------------------- */

/* A plan, loaded and checked (every field, the format version). */
typedef struct mesh_plan mesh_plan;

/* One rank's execution of a plan: its parameters, gradients, optimizer
 * state and activations. Today a context runs plans of one rank (mesh
 * 1x1x1x1) on the CPU; mesh_context_create refuses others with
 * MESH_ERR_UNSUPPORTED and says why. A context is used by one thread at a
 * time. */
typedef struct mesh_context mesh_context;

/* Loads a plan file written by meshc (or mesh_compile's text). */
mesh_status mesh_plan_load(const char *path, mesh_plan **out);
mesh_status mesh_plan_from_memory(const char *text, size_t len, mesh_plan **out);
void mesh_plan_free(mesh_plan *plan);

/* The batch a step takes: micro_batches micro-batches of micro_batch
 * sequences of seq_len tokens, each a token id below vocab. Any pointer
 * may be NULL. */
mesh_status mesh_plan_batch(const mesh_plan *plan, int *micro_batch, int *micro_batches,
                            int *seq_len, int *vocab);

/* Creates rank `rank`'s context and initialises the parameters from the
 * plan's seed (the same values on any mesh). The plan must outlive it. */
mesh_status mesh_context_create(const mesh_plan *plan, int rank, mesh_context **out);

/* The same, with the context's buffers (parameters, gradients, optimizer
 * state, activations) taken from an allocator hook (NULL: the default). */
mesh_status mesh_context_create_with(const mesh_plan *plan, int rank, mesh_alloc_fn alloc, void *ud,
                                     mesh_context **out);
void mesh_context_free(mesh_context *ctx);

/* What a training step reports. */
typedef struct mesh_step_stats {
    double loss;      /* mean over the step's micro-batches */
    double grad_norm; /* global norm before clipping */
    double lr;        /* the learning rate used */
    long long step;   /* steps taken, this one included */
} mesh_step_stats;

/* One training step: micro_batches x micro_batch x seq_len input ids and
 * as many target ids (mesh_plan_batch), gradients accumulated over the
 * micro-batches, clipped, one AdamW step at the plan's schedule. A loss or
 * gradient that is not finite leaves the parameters unchanged and returns
 * MESH_ERR_CHECK. stats may be NULL. */
mesh_status mesh_train_step(mesh_context *ctx, const int *inputs, const int *targets,
                            mesh_step_stats *stats);

/* Forward only, one micro-batch (micro_batch x seq_len ids): the mean
 * loss, and when logits is not NULL the logits, micro_batch x seq_len rows
 * of vocab floats (the padded columns left out), written to logits[0..n). */
mesh_status mesh_forward(mesh_context *ctx, const int *inputs, const int *targets, double *loss,
                         float *logits, size_t n);

/* Parameters by global name ("wte", "h.3.gpt2_block.w_qkv"): n must be the
 * parameter's element count (mesh_param_info). */
mesh_status mesh_param_info(const mesh_context *ctx, int index, const char **name, size_t *n);
mesh_status mesh_param_read(mesh_context *ctx, const char *name, float *out, size_t n);
mesh_status mesh_param_write(mesh_context *ctx, const char *name, const float *in, size_t n);

/* Checkpoints (docs/runtime.md): save writes DIR/step-N atomically and
 * points DIR/latest at it; load reads a step folder, or DIR's latest,
 * with the optimizer state and the step count. */
mesh_status mesh_checkpoint_save(mesh_context *ctx, const char *dir);
mesh_status mesh_checkpoint_load(mesh_context *ctx, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* MESH_H */
