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
#include <stdint.h> /* defines: uint64_t */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versions ----------------------------------------------------------- */

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

/* ---- Status codes ------------------------------------------------------- */

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
    X(ERR_INTERNAL,    "internal error")                      \
    X(ERR_RANK,        "another rank failed")

typedef enum mesh_status {
#define MESH_STATUS_ENUM_(name, message) MESH_##name,
    MESH_STATUS_LIST(MESH_STATUS_ENUM_)
#undef MESH_STATUS_ENUM_
} mesh_status;

/* The message of a status code from MESH_STATUS_LIST, or "unknown status" for
 * any other value. */
const char *mesh_status_str(mesh_status status);

/* ---- Allocation --------------------------------------------------------- */

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

/* ---- Compiling .mesh text ----------------------------------------------- */

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

/* ---- Plans and contexts ------------------------------------------------- */

/* A plan, loaded and checked (every field, the format version). */
typedef struct mesh_plan mesh_plan;

/* One rank's execution of a plan: its parameters, gradients, optimizer
 * state and activations. Today a context runs plans of one rank (mesh
 * 1x1x1x1) on the CPU; mesh_context_create refuses others with
 * MESH_ERR_UNSUPPORTED and says why. A context is used by one thread at a
 * time. */
typedef struct mesh_context mesh_context;

/* A stream of training batches read from token shards (Data, below). */
typedef struct mesh_data mesh_data;

/* Loads a plan file written by meshc (or mesh_compile's text). */
mesh_status mesh_plan_load(const char *path, mesh_plan **out);
mesh_status mesh_plan_from_memory(const char *text, size_t len, mesh_plan **out);
void mesh_plan_free(mesh_plan *plan);

/* The batch a step takes on one data-parallel rank: micro_batches
 * micro-batches of micro_batch sequences of seq_len tokens, each a token
 * id below vocab (the model's vocabulary, without any padding). Any
 * pointer may be NULL. */
mesh_status mesh_plan_batch(const mesh_plan *plan, int *micro_batch, int *micro_batches,
                            int *seq_len, int *vocab);

/* A plan's settings (docs/plan.md). Strings belong to the plan. The struct
 * only grows at its end: pass sizeof(mesh_plan_info) as `size`, and a
 * newer libmesh fills only the fields your header knows. */
typedef struct mesh_plan_info {
    const char *source;             /* the .mesh file it was compiled from ("" if unknown) */
    int world, dp, tp, pp, ep;      /* ranks in all, and the mesh's axes */
    int global_batch;               /* sequences per step, all data-parallel ranks together */
    int micro_batch, micro_batches, seq_len, vocab; /* as mesh_plan_batch */
    long long steps;                /* train.steps */
    double lr, min_lr;              /* the peak and the final learning rate */
    long long warmup;               /* steps of linear warmup */
    const char *lr_schedule;        /* "constant", "cosine" or "linear" */
    const char *precision;          /* "fp32", "bf16" or "fp16" */
    long long seed;                 /* parameters' initialisation */
    long long log_every, eval_every, checkpoint_every; /* 0 where the plan sets none */
    const char *data, *val_data, *checkpoint_dir;      /* NULL where the plan names none */
} mesh_plan_info;

mesh_status mesh_plan_get_info(const mesh_plan *plan, size_t size, mesh_plan_info *info);

/* Creates rank `rank`'s context and initialises the parameters from the
 * plan's seed (the same values on any mesh). The plan must outlive it. A
 * plan of several ranks gets its contexts from mesh_run_ranks. */
mesh_status mesh_context_create(const mesh_plan *plan, int rank, mesh_context **out);

/* The same, with the context's buffers (parameters, gradients, optimizer
 * state, activations) taken from an allocator hook (NULL: the default). */
mesh_status mesh_context_create_with(const mesh_plan *plan, int rank, mesh_alloc_fn alloc, void *ud,
                                     mesh_context **out);
void mesh_context_free(mesh_context *ctx);

/* Steps taken: 0 after mesh_context_create, the checkpoint's after
 * mesh_checkpoint_load, one more after each mesh_train_step. */
mesh_status mesh_context_step(const mesh_context *ctx, long long *step);

/* Bytes of the context's arena (its one allocation for parameters,
 * gradients, optimizer state, saved activations and workspace, laid out by
 * the plan's memory plan), and the bytes the plan's memory plan gives this
 * rank (0 when it has none). They are equal, but for a bf16 or fp16 plan,
 * which the CPU runtime lays out and computes in fp32. Either pointer may
 * be NULL. */
mesh_status mesh_context_memory(const mesh_context *ctx, size_t *allocated, size_t *planned);

/* Device memory this rank's kernels hold beside the arena, which the
 * plan's memory plan does not predict: on a GPU cuBLASLt's workspace
 * (32 MiB), the kernels' scratch (grown at an op's first call to what it
 * asks, and kept: the attention backward's per-row sums, cuDNN's
 * workspace, the norms' partial sums...) and the executor's small
 * buffers; 0 on a CPU. */
mesh_status mesh_context_kernel_memory(const mesh_context *ctx, size_t *bytes);

/* What this rank sent per training step (the mean over the steps taken),
 * entry `index` (0, 1, ... until MESH_ERR_INVALID_ARG): its name in what
 * ("all-reduce(tp)", "reduce-scatter(dp)", "all-to-all(ep)", "send(pp)";
 * n bytes at most), the bytes (each collective counted as its whole
 * tensor, as meshc --stats does) and the plan's prediction for this rank's
 * stage (-1 when the plan has none: meshc did not simulate its ranks). */
mesh_status mesh_context_sent(const mesh_context *ctx, int index, char *what, size_t n, double *bytes,
                              double *planned);

/* The time per training step (the mean over the steps taken, in
 * milliseconds) that entry `index` of mesh_context_sent's table took in
 * this rank's turn, and the calls a step it is the time of (calls may be
 * NULL): its collectives that were not overlapped with
 * compute (tensor parallelism's sums and conversions, moe's all-to-alls,
 * the pipeline's sends and receives as "send(pp)", the gradient sums,
 * reduce-scatters and gathers of --no-overlap or of a group that has no
 * communication queue; those run on the communication thread are
 * mesh_step_stats' overlap_ms). On a GPU whose NCCL calls are ordered on
 * its streams (the default over NCCL), the GPU's own time running them
 * on the compute stream, from CUDA events recorded around each call (an
 * NCCL send goes out with the rank's next call and counts there), as far
 * as the GPU has finished them; else the host's time in each call. Both
 * include the time a call waits for the group's other ranks (a
 * pipeline's bubble, an uneven load). untimed (may be NULL): calls of
 * every entry that went untimed because the GPU was 256 collectives
 * behind the host. MESH_ERR_INVALID_ARG past the last entry. */
mesh_status mesh_context_comm_ms(mesh_context *ctx, int index, double *ms, double *calls, long long *untimed);

/* The same for the entry's collectives that ran on the communication
 * thread while the rank computed (mesh_set_overlap: the gradient sums of
 * backward, ZeRO's reduce-scatters and gathers): their time per step by
 * entry, which mesh_step_stats' overlap_ms adds up over every entry. On a
 * GPU whose NCCL calls are ordered, the GPU's time on the communication
 * stream (as far as it has finished them; calls that found the GPU 256
 * behind go untimed, as overlap_ms's); else the host's time in each call.
 * calls (may be NULL): their number per step. MESH_ERR_INVALID_ARG past
 * the last entry. */
mesh_status mesh_context_overlap_ms(mesh_context *ctx, int index, double *ms, double *calls);

/* What the tuning of this rank's matmuls' cuBLASLt algorithms did so far
 * (MESH_GEMM_TUNE=1 on a GPU: docs/gpu.md), in words, into buf (n bytes,
 * truncated): "16 shapes tuned, 39 candidates timed; set aside: ...".
 * MESH_ERR_UNSUPPORTED where the rank's kernels are not a GPU's or the
 * tuning is off. */
mesh_status mesh_context_gemm_tuning(mesh_context *ctx, char *buf, size_t n);

/* What this rank's attention did on cuDNN's fused kernels so far
 * (MESH_ATTN_CUDNN=1 on a GPU: docs/gpu.md), in words, into buf (n bytes,
 * truncated): "cuDNN 9.19.0: 24 forward and 24 backward calls on it, 0
 * and 0 on ours; 2 plans built, 0 refused", then why a call was left to
 * mesh's own kernels or a graph refused, if one was. MESH_ERR_UNSUPPORTED
 * where the rank's kernels are not a GPU's or it is off. */
mesh_status mesh_context_attention_cudnn(mesh_context *ctx, char *buf, size_t n);

/* *on_gpu: 1 when this rank's NCCL calls are ordered on its GPU's streams
 * (the default over NCCL), so that the collectives' times
 * (mesh_context_comm_ms, mesh_step_stats' overlap_ms and wait_ms) are the
 * GPU's own, from CUDA events; 0 when they are the host's (the CPU,
 * MESH_NCCL_BLOCKING=1, ranks sharing a GPU). */
mesh_status mesh_context_times_on_gpu(const mesh_context *ctx, int *on_gpu);

/* An entry of the op profile (mesh_context_profile). The struct grows
 * only at its end. */
typedef struct mesh_profile_entry {
    char what[48];     /* "matmul forward", "attention backward", "layernorm recompute",
                          "optimizer", "collectives in turn" */
    double ms;         /* its time per step, milliseconds */
    double calls;      /* its brackets per step */
    double gflop;      /* its model GFLOP per step, as FlashAttention and Megatron-LM count
                          them: a matmul's 2 M K N forward and twice that backward,
                          attention's 4 B H T^2 d forward (half of it causal) and 2.5 times
                          that backward, a recomputation's its forward's; 0 for other work */
    long long steps;   /* the steps the means are of */
    long long untimed; /* brackets, of every entry, that went untimed because the GPU was 4096
                          behind the host */
} mesh_profile_entry;

/* The op profile of a context created after mesh_set_profile(1): entry
 * `index` (0, 1, ... until MESH_ERR_INVALID_ARG) of where this rank's
 * training steps spent their time, the mean over the steps taken but the
 * first (its warm-up), in the order of the graph's ops, then the
 * optimizer and the collectives (size: sizeof(mesh_profile_entry)). An
 * op's time is its node's kernels' (a matmul's includes the bias add and
 * GELU its kernel computes, and in the backward the GELU's: cuBLASLt's
 * epilogues), and the collectives it makes itself (moe's all-to-alls);
 * "optimizer" is the gradient's norm and AdamW; "collectives in turn"
 * those the rank waits for (the pipeline's transfers included; those
 * overlapped with compute are mesh_step_stats' overlap_ms). On a GPU
 * each is the GPU's own time on the compute stream, from CUDA events
 * recorded around it (the GPU's idle time between them is in none); the
 * call waits for the GPU to finish the step's work. On the CPU, the
 * host's time in the calls. MESH_ERR_INVALID_ARG past the last entry,
 * when the context was created without the profile, or before its second
 * step. */
mesh_status mesh_context_profile(mesh_context *ctx, int index, size_t size, mesh_profile_entry *entry);

/* What a training step reports. */
typedef struct mesh_step_stats {
    double loss;      /* mean over the step's micro-batches */
    double grad_norm; /* global norm before clipping */
    double lr;        /* the learning rate used */
    long long step;   /* steps taken, this one included */
    double loss_scale; /* the loss scale of the step's backward: 1 but with fp16 */
    int skipped;      /* fp16: the scaled gradients overflowed, so the step changed nothing
                         but the loss scale (halved when dynamic); 0 otherwise */
    int overlapped;   /* this rank's collectives that ran on a communication thread while it
                         computed (mesh_set_overlap): gradient sums during backward, ZeRO-2/3's
                         reduce-scatters, ZeRO-3's gathers of the next layer, ZeRO-1/2's gathers
                         after AdamW (which run into the next step); 0 without data parallelism */
    double overlap_ms; /* the time those collectives ran on the communication thread. On a
                          GPU whose NCCL calls are ordered on its streams (the default over
                          NCCL), the GPU's own time running them on the communication
                          stream, from CUDA events (each from its stream's wait for the
                          kernels before it to its end) */
    double wait_ms;   /* the time this rank waited for them: overlap_ms - wait_ms was hidden
                         behind its compute. On a GPU whose NCCL calls are ordered, the
                         compute stream's waits for them, from CUDA events, and the host's
                         until each was enqueued. Either time on a GPU counts what the GPU
                         has finished when the step returns: a collective still running
                         then counts in the next step's (and one that finds the GPU 256
                         collectives behind the host is not timed, rather than wait) */
    double comm_ms;   /* the time of the collectives this rank made in its turn during the step
                         (not overlapped; per kind and axis: mesh_context_comm_ms, whose
                         words apply): on a GPU what it has finished when the step returns */
    double model_flops; /* the model FLOPs this rank computed in the step, forward and
                           backward, recomputation not counted: its matmuls' (2 M K N
                           forward, twice that backward), its attention's (4 B H T^2 d
                           forward, half of it causal, 2.5 times that backward:
                           FlashAttention's count) and its moe experts' (each token's
                           top-k products); its TFLOP/s are model_flops / 1e9 / the step's
                           ms. Ranks of one pipeline stage do the same work; stages differ */
} mesh_step_stats;

/* One training step: micro_batches x micro_batch x seq_len input ids and
 * as many target ids (mesh_plan_batch, mesh_data_next), gradients
 * accumulated over the micro-batches, clipped, one AdamW step at the
 * plan's schedule. With precision fp16 an overflow of the scaled gradients
 * skips the step (stats->skipped) and returns MESH_OK, as PyTorch's
 * GradScaler does. A loss or gradient that is not finite leaves the
 * parameters unchanged and returns MESH_ERR_CHECK; the step still counts
 * (stats->step, the schedule), so the caller may skip it and go on with
 * the next batch, or stop. A step that fails with MESH_ERR_RANK (a
 * collective failed, or this rank's GPU) is the context's last: later
 * train steps, forward passes and checkpoint saves (which would write a
 * half-updated state) return MESH_ERR_RANK at once, and
 * mesh_run_ranks counts the rank as failed even if its fn returns
 * MESH_OK. stats may be NULL. */
mesh_status mesh_train_step(mesh_context *ctx, const int *inputs, const int *targets,
                            mesh_step_stats *stats);

/* Forward only, one micro-batch (micro_batch x seq_len ids): the mean
 * loss, and when logits is not NULL the logits, micro_batch x seq_len rows
 * of vocab floats (the padded columns left out), written to logits[0..n).
 * With tensor parallelism every rank of the tp group calls it (so does
 * mesh_evaluate), and the logits, split over them, are refused
 * (MESH_ERR_UNSUPPORTED), as by mesh_next_logits and mesh_sample_next.
 * A collective or device failure is MESH_ERR_RANK (*loss NaN). */
mesh_status mesh_forward(mesh_context *ctx, const int *inputs, const int *targets, double *loss,
                         float *logits, size_t n);

/* Parameters by global name ("wte", "h.3.gpt2_block.w_qkv"), whole: n must
 * be the parameter's element count (mesh_param_info). With tensor
 * parallelism a rank holds a slice: every rank of the context's tp group
 * calls mesh_param_read (it gathers the slices); mesh_param_write keeps
 * this rank's slice of the whole array. */
mesh_status mesh_param_info(const mesh_context *ctx, int index, const char **name, size_t *n);
mesh_status mesh_param_read(mesh_context *ctx, const char *name, float *out, size_t n);
mesh_status mesh_param_write(mesh_context *ctx, const char *name, const float *in, size_t n);

/* ---- Data --------------------------------------------------------------- */

/* Opens the token shards `pattern` names (a path, or a glob such as
 * "data/train_*.bin": every match, in sorted order) as the training
 * stream of data-parallel rank dp_rank (0 .. dp x ep - 1) of the plan.
 * Shards are llm.c's (magic 20240520, version 1, uint16 tokens), mapped
 * with mmap and checked: magic, version, size, and every token below the
 * plan's vocabulary. Errors name the file: MESH_ERR_IO (no file matches,
 * cannot open), MESH_ERR_PARSE (not a shard, truncated), MESH_ERR_CHECK (a
 * token outside the vocabulary, no sequence fits). The plan is only read
 * during the call.
 *
 * Each shard is cut into windows of seq_len tokens (the targets are the
 * next tokens), numbered through the shards in order; a step's global
 * batch is the global_batch windows from the cursor on, the stream
 * wrapping around at its end, and each rank takes its own slice of it
 * (docs/runtime.md). */
mesh_status mesh_data_open(const mesh_plan *plan, const char *pattern, int dp_rank, mesh_data **out);
void mesh_data_free(mesh_data *data);

/* Fills one step's batch for this rank (micro_batches x micro_batch x
 * seq_len inputs and as many targets, as mesh_train_step takes them) and
 * moves the cursor on by the plan's global_batch. */
mesh_status mesh_data_next(mesh_data *data, int *inputs, int *targets);

/* The cursor: global sequences read (by all data-parallel ranks), e.g.
 * steps x global_batch. Seeking to a position tell returned repeats the
 * batches from there; any value is valid (it wraps around). */
mesh_status mesh_data_tell(const mesh_data *data, uint64_t *pos);
mesh_status mesh_data_seek(mesh_data *data, uint64_t pos);

/* The stream's shards, their tokens, and the sequences of one pass (an
 * epoch); shard `index`'s path and tokens. Pointers may be NULL; the path
 * lives as long as the stream. */
mesh_status mesh_data_info(const mesh_data *data, int *shards, uint64_t *tokens, uint64_t *sequences);
mesh_status mesh_data_shard(const mesh_data *data, int index, const char **path, uint64_t *tokens);

/* The mean forward loss over the next micro_batches micro-batches of the
 * stream: every rank of a plan of several calls it (collective), each on
 * its data-parallel slice, and gets the mean over all of them (the cursor
 * moves past all ranks' slices). Seek to 0 first to evaluate the same
 * sequences each time, as meshrun's validation does with 8 global
 * batches (8 x the plan's micro-batches per step). */
mesh_status mesh_evaluate(mesh_context *ctx, mesh_data *data, int micro_batches, double *loss);

/* Writes ids[0..n) (each 0..65535) as a token shard in llm.c's format,
 * through a temporary file renamed into place. */
mesh_status mesh_shard_write(const char *path, const int *ids, size_t n);

/* ---- Checkpoints -------------------------------------------------------- */

/* docs/runtime.md: save writes DIR/step-N atomically (parameters, AdamW's
 * state, the step count) and points DIR/latest at it; load reads a step
 * folder, or DIR's latest, and restores all of it. With several ranks
 * (mesh_run_ranks) every rank calls save (ZeRO's shards of the optimizer
 * state are gathered) and rank 0 writes; every rank calls load. */
mesh_status mesh_checkpoint_save(mesh_context *ctx, const char *dir);
mesh_status mesh_checkpoint_load(mesh_context *ctx, const char *path);

/* The same, with a data stream's cursor saved in the checkpoint, and
 * restored into the stream, so a resumed run reads exactly the batches an
 * uninterrupted one would have. data may be NULL; a checkpoint saved
 * without a cursor restores step x global_batch. */
mesh_status mesh_checkpoint_save_with(mesh_context *ctx, const char *dir, const mesh_data *data);
mesh_status mesh_checkpoint_load_with(mesh_context *ctx, const char *path, mesh_data *data);

/* Claims dir for this job's checkpoints before its first save: rank 0
 * makes the folder and locks it (DIR/.lock) until mesh_context_free, so
 * that another job saving there is refused (MESH_ERR_IO, naming the
 * holder) rather than writing over this one's steps. A save claims its
 * folder too; claiming at the start refuses a second job before it
 * trains. Every rank calls it. */
mesh_status mesh_checkpoint_claim(mesh_context *ctx, const char *dir);

/* Only the parameters (model.safetensors), for sampling or fine-tuning:
 * the step count and the optimizer state stay as they are. */
mesh_status mesh_checkpoint_load_params(mesh_context *ctx, const char *path);

/* ---- Tokenizers --------------------------------------------------------- */

/* A tokenizer: byte-level, or GPT-2's BPE. */
typedef struct mesh_tokenizer mesh_tokenizer;

/* dir NULL: the byte-level tokenizer (an id per byte, vocabulary 256).
 * Else GPT-2's BPE from OpenAI's DIR/encoder.json and DIR/vocab.bpe;
 * errors name the file (and line:col). */
mesh_status mesh_tokenizer_load(const char *dir, mesh_tokenizer **out);
void mesh_tokenizer_free(mesh_tokenizer *tok);

/* The vocabulary (ids are below it) and the end-of-text id
 * (<|endoftext|>; -1 when there is none, as for bytes). Either may be NULL. */
mesh_status mesh_tokenizer_info(const mesh_tokenizer *tok, int *vocab, int *eot);

/* Encodes len bytes of text into ids[0..cap), the count in *n. No
 * tokenizer gives more ids than bytes, so cap = len always suffices (a
 * smaller one that is too small is MESH_ERR_INVALID_ARG, *n saying how
 * many are needed). BPE refuses text that is not UTF-8 (MESH_ERR_PARSE,
 * naming the byte). */
mesh_status mesh_tokenizer_encode(const mesh_tokenizer *tok, const char *text, size_t len, int *ids,
                                  size_t cap, size_t *n);

/* Decodes ids[0..n) into out[0..cap) and sets *len to the whole length
 * (which may exceed cap); ids outside the vocabulary decode to nothing. */
mesh_status mesh_tokenizer_decode(const mesh_tokenizer *tok, const int *ids, size_t n, char *out,
                                  size_t cap, size_t *len);

/* ---- Sampling ----------------------------------------------------------- */

/* The logits of the token after ids[0..n) (n >= 1; the forward runs on the
 * last seq_len ids): vocab floats, vocab being the plan's (mesh_plan_batch). */
mesh_status mesh_next_logits(mesh_context *ctx, const int *ids, size_t n, float *logits, size_t vocab);

/* Draws the token after ids[0..n) from the softmax of those logits divided
 * by temperature (0: the most likely token), with a Philox uniform for
 * (seed, n): the same seed and ids give the same token. */
mesh_status mesh_sample_next(mesh_context *ctx, const int *ids, size_t n, double temperature,
                             uint64_t seed, int *next);

/* ---- Several ranks -------------------------------------------------------- */

/* What mesh_run_ranks runs on each rank, with that rank's context. */
typedef mesh_status (*mesh_rank_fn)(mesh_context *ctx, int rank, void *ud);

/* Runs fn once per rank of the plan's world, with that rank's context,
 * and returns when all have. How depends on how the process was started
 * (mesh_job_info):
 *   - one process (no launcher, or a job of one): every rank is a thread
 *     of this process (the contexts talk through shared-memory
 *     collectives). A rank whose fn fails stops the others: their next
 *     collective fails with MESH_ERR_RANK, naming it; so does a rank that
 *     does not reach a collective within MESH_COLLECTIVE_TIMEOUT_S seconds
 *     (default 600). Unless mesh_set_threads was called, each rank's
 *     kernels use the process's cores divided by the ranks.
 *   - a job of several processes (mpirun -n N, srun --mpi=pmix): this
 *     process is one rank of it, and fn runs once, on this thread, for
 *     that rank; the ranks talk through MPI, which is initialised here (and
 *     finalised at exit) unless the program did it. The job must have as
 *     many processes as the plan has ranks (else MESH_ERR_INVALID_ARG).
 *     A rank whose fn fails while the others go on (or whose process
 *     exits during fn), or a collective that waits longer than
 *     MESH_COLLECTIVE_TIMEOUT_S, stops the whole job
 *     (MPI_Abort: the launcher exits with status 3), with a line on
 *     stderr naming the rank; when every rank's fn fails, each returns
 *     its own status instead.
 *   - a job that no MPI launcher started but whose processes have
 *     torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: the same,
 *     the ranks talking over TCP (they meet at MASTER_ADDR, port MESH_PORT
 *     else MASTER_PORT + 1); a failing, killed or stuck rank makes every
 *     other return MESH_ERR_RANK naming it.
 * Returns MESH_OK, or the first failing rank's status, whose message
 * mesh_last_error gives ("rank R: ..."); in a job of several processes, a
 * rank that did not fail itself returns MESH_ERR_RANK naming the first
 * that did. The contexts are freed on return. A plan of one rank in one
 * process runs fn on this thread. */
mesh_status mesh_run_ranks(const mesh_plan *plan, mesh_rank_fn fn, void *ud);

/* This process's place in the job that started it, from the launcher's
 * variables, the first of these whose variables are set: torchrun (RANK,
 * WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE),
 * PMIx (PMIX_RANK), PMI (PMI_RANK, PMI_SIZE), SLURM (SLURM_PROCID,
 * SLURM_NTASKS). *rank is its rank among the processes, *processes their
 * count (0 where the launcher does not say: PMIX_RANK without
 * SLURM_NTASKS), *launcher "torchrun", "mpirun", "pmix", "pmi", "srun",
 * or "none" (rank 0 of 1). A variable that is not a number is
 * MESH_ERR_INVALID_ARG. Any pointer may be NULL. */
mesh_status mesh_job_info(int *rank, int *processes, const char **launcher);

/* A context's rank in its plan's world, and which part of each global
 * batch it reads: data_rank of data_ranks (dp x ep; mesh_data_open's
 * dp_rank). Any output pointer may be NULL. */
mesh_status mesh_context_rank(const mesh_context *ctx, int *rank, int *data_rank, int *data_ranks);

/* ---- Process settings --------------------------------------------------- */

/* Threads of the CPU kernels (OpenBLAS), for the whole process; 0: the
 * cores this process may run on (its affinity mask). */
mesh_status mesh_set_threads(int n);

/* For the contexts created after it: with on, a plan's data-parallel
 * ranks add their gradients and losses one rank after another, in the
 * one-rank order, so a data-parallel mesh (dp, and dp x pp; ZeRO 0)
 * gives the one-rank losses bit for bit; the ranks then compute their
 * backward passes in turn, not at once. Off by default. */
mesh_status mesh_set_deterministic(int on);

/* For the contexts created after it: with on (the default), a step sums
 * each param's gradient over its data-parallel ranks while backward goes
 * on (issued as soon as the last micro-batch's backward has finished it,
 * run by a communication thread of the rank), as DDP and Megatron-LM
 * overlap their gradient buckets; with ZeRO-2/3 a layer's reduce-scatters
 * run while the layer below computes; with ZeRO-3 the next layer's params
 * are gathered while a layer computes (FSDP's prefetch); with ZeRO-1/2 the
 * updated params are gathered while the next step's forward begins (each
 * layer waits for its own). Off, each in turn. The numbers are the same
 * bits either way (on GPUs: NCCL's sums, the same calls on a copy of the
 * group). The deterministic order and MPI without MPI_THREAD_MULTIPLE run
 * in turn. On GPUs the communication thread uses an NCCL communicator
 * and stream of its own, beside the compute stream. */
mesh_status mesh_set_overlap(int on);

/* For the contexts created after it: with on, each rank times its
 * training steps by kind of work (mesh_context_profile). Off by default:
 * on a GPU it records two CUDA events around every op. */
mesh_status mesh_set_profile(int on);

/* The device contexts train on. */
typedef enum mesh_device_kind {
    MESH_DEVICE_AUTO, /* a GPU when one is usable and training on it is built, else the CPU */
    MESH_DEVICE_CPU,
    MESH_DEVICE_CUDA  /* an NVIDIA GPU, through CUDA (a libmesh built with make CUDA=1) */
} mesh_device_kind;

/* Chooses the device of the contexts created after it, for the whole
 * process (meshrun --device):
 *   - MESH_DEVICE_AUTO, the default: GPU 0 (several ranks: a GPU each, as
 *     MESH_DEVICE_CUDA) when a GPU is usable, "a GPU is present: running
 *     on NAME (--device cpu trains on the CPU)"; else the CPU, "no GPU
 *     (REASON): running on the CPU". A context whose ranks are threads of
 *     this process, more of them than its GPUs, runs AUTO's GPU choice on
 *     the CPU instead (mesh_context_device says why).
 *   - MESH_DEVICE_CPU: the CPU.
 *   - MESH_DEVICE_CUDA: GPU 0 (several ranks: a GPU each), "the GPU was
 *     asked for: running on NAME"; it runs every plan the CPU runs (a
 *     plan neither runs yet is refused with MESH_ERR_UNSUPPORTED). With
 *     no usable GPU MESH_ERR_UNSUPPORTED, with the message "--device
 *     cuda: no GPU (REASON)" (REASON: "no CUDA driver (...)", "this
 *     libmesh was built without CUDA (make CUDA=1)", ...).
 * Any other value is MESH_ERR_INVALID_ARG. A failing call keeps the
 * previous choice. Whether a GPU is usable is asked without crashing
 * where there is no CUDA driver. Call it before creating contexts, not
 * while another thread creates them. */
mesh_status mesh_set_device(mesh_device_kind kind);

/* What the contexts created now run on (*chosen) and the one-line reason
 * (*why: static text, valid until the next mesh_set_device). Without a
 * mesh_set_device, the first call (or the first context) settles
 * MESH_DEVICE_AUTO's choice. Either pointer may be NULL. */
mesh_status mesh_device_info(mesh_device_kind *chosen, const char **why);

/* What ctx runs on (*kind) and the one-line reason (*why, the process's
 * as mesh_device_info gives it, or why this context differs from it;
 * valid while ctx lives). Either pointer may be NULL. */
mesh_status mesh_context_device(const mesh_context *ctx, mesh_device_kind *kind, const char **why);

#ifdef __cplusplus
}
#endif

#endif /* MESH_H */
