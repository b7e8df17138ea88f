/*
 * meshrun.c: the `meshrun` command, which executes plans made by meshc.
 *
 * A thin program over libmesh's public API (mesh.h, and nothing else of
 * libmesh's). `meshrun FILE.plan` loads and checks the plan, then trains it
 * on its ranks (mesh_run_ranks): threads of this process, or, started by
 * mpirun -n N or srun, this process's one rank; each reads its slice of
 * the token shards through a mesh_data stream, and rank 0 prints a line per
 * logged step. In a job of several processes, the others print only what
 * went wrong on their own rank. `meshrun sample` writes text from a
 * checkpoint; `meshrun tokenize` makes token shards.
 *
 * Exit status: 0 for --help, --version and a finished run; 1 when a file
 * cannot be read or is not valid, a plan cannot run yet, the device asked
 * for (--device) cannot be used, or the loss stops being finite; 2 for
 * usage errors.
 */
#include <errno.h>  /* defines: errno */
#include <stdatomic.h> /* defines: atomic_int */
#include <glob.h>   /* defines: glob */
#include <math.h>   /* defines: isfinite */
#include <stdarg.h> /* defines: va_list */
#include <stdio.h>  /* defines: printf, fprintf, fopen */
#include <stdlib.h> /* defines: malloc, free, strtod, setenv */
#include <string.h> /* defines: strcmp, strncmp, strerror */
#include <time.h>   /* defines: clock_gettime */
#include <unistd.h> /* defines: isatty */

#include "mesh.h" /* defines: the whole libmesh API */

static const char usage_text[] =
    "usage: meshrun [options] FILE.plan\n"
    "       meshrun sample FILE.plan --checkpoint DIR [--prompt TEXT] [--tokens N]\n"
    "       meshrun tokenize [--bpe DIR] TEXT... -o SHARD.bin [--val VAL.bin]\n"
    "\n"
    "Train the plan compiled by meshc on CPU, its ranks as threads of this\n"
    "process, or one rank per process under mpirun -n N or srun --mpi=pmix\n"
    "-n N (N: the plan's ranks): the data is the token shards given by --data,\n"
    "else the files matching the plan's train.data; each data-parallel rank\n"
    "reads its slice.\n"
    "\n"
    "meshrun tokenize turns text files into one token shard (llm.c's format:\n"
    "a 1024-byte header, then uint16 tokens) with the byte-level tokenizer\n"
    "(vocabulary 256), or with GPT-2's BPE given --bpe DIR holding OpenAI's\n"
    "encoder.json and vocab.bpe (each file then starts with <|endoftext|>).\n"
    "--val VAL.bin puts the last 5% of the tokens in a validation shard.\n"
    "\n"
    "options:\n"
    "  --data FILES   the token shards to train on: a path, or a glob such as\n"
    "                 'data/train_*.bin' (every match, in sorted order)\n"
    "  --val FILES    the validation shards (else the plan's train.val_data)\n"
    "  --steps N      train N steps instead of the plan's train.steps (the\n"
    "                 learning-rate schedule stays the plan's)\n"
    "  --checkpoint DIR  save checkpoints there (every train.checkpoint_every\n"
    "                 steps and at the end; else the plan's checkpoint_dir)\n"
    "  --resume       continue from DIR's latest checkpoint (and data position)\n"
    "  --metrics FILE append a JSON line per logged step (and validation) to FILE\n"
    "  --skip-nonfinite  skip a step whose loss or gradient is not finite (at\n"
    "                 most 5 in a row) instead of stopping\n"
    "  --threads N    BLAS threads (default: the cores this process may use)\n"
    "  --device D     what to train on: auto (default), cpu or cuda. auto takes\n"
    "                 the GPUs when there are (as cuda does; ranks as threads\n"
    "                 outnumbering them: the CPU), else the CPU, and prints a\n"
    "                 line saying why; cuda trains a rank per GPU (fp32, bf16\n"
    "                 or fp16; NCCL between them; ranks as threads take GPU 0,\n"
    "                 1, ..., ranks as processes their local rank's) and stops\n"
    "                 with an error before training when there is no GPU or a\n"
    "                 plan it does not run\n"
    "  --deterministic  data-parallel ranks add their gradients in turn, in the\n"
    "                 one-rank order: the one-rank losses bit for bit (dp, ZeRO 0)\n"
    "  --no-overlap   run each collective in its turn: the gradient sync after\n"
    "                 backward, not during it; ZeRO's reduce-scatters and\n"
    "                 gathers when due, not a layer behind or ahead, nor into\n"
    "                 the next step (the same numbers)\n"
    "  --profile      time each kind of work of rank 0's steps (matmul forward,\n"
    "                 attention backward, optimizer...: on a GPU from CUDA events\n"
    "                 around each op) and print the table at the end\n"
    "  --local-rank=N accepted and ignored (torchrun's)\n"
    "  --prompt TEXT, --tokens N (200), --temperature T (0.8), --seed S (0),\n"
    "  --bpe DIR (GPT-2 BPE for a model that is not byte-level)\n"
    "                 what meshrun sample starts from and how it draws\n"
    "  -h, --help     print this help and exit\n"
    "  --version      print the version and exit\n";

/* The job that started this process (mesh_job_info): in one of several
 * processes, only rank 0 prints errors that every process meets alike. */
static int job_rank, job_processes = 1;
static const char *job_launcher = "none";

/* Print a one-line error and the usage to stderr; return the usage status. */
static int usage_error(const char *what, const char *arg)
{
    if (job_rank != 0) return 2;
    fprintf(stderr, "meshrun: error: %s%s%s%s\n", what, arg ? " '" : "",
            arg ? arg : "", arg ? "'" : "");
    fputs(usage_text, stderr);
    return 2;
}

/* Prints "meshrun: error: ..." to stderr, in one write (under mpirun the
 * launcher's own lines go to the same place). */
static void vfail(const char *fmt, va_list ap)
{
    char line[4096];
    int k = snprintf(line, sizeof line, "meshrun: error: ");
    vsnprintf(line + k, sizeof line - (size_t)k - 1, fmt, ap);
    size_t n = strlen(line);
    line[n] = '\n';
    line[n + 1] = '\0';
    fputs(line, stderr);
}

/* The same on any rank. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void fail_here(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(fmt, ap);
    va_end(ap);
}

/* The same (on rank 0 of a job of several processes); returns the
 * failure status, 1. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int fail(const char *fmt, ...)
{
    va_list ap;
    if (job_rank != 0) return 1;
    va_start(ap, fmt);
    vfail(fmt, ap);
    va_end(ap);
    return 1;
}

/* Options of a run. */
typedef struct run_opts {
    const char *data;   /* --data: shards, instead of the plan's */
    const char *val;    /* --val: the validation shards, instead of the plan's */
    long long steps;    /* --steps: instead of the plan's (0: the plan's) */
    const char *ckpt;   /* --checkpoint: the checkpoint folder, instead of the plan's */
    int resume;         /* --resume: continue from the folder's latest checkpoint */
    int sample;         /* meshrun sample */
    const char *prompt; /* --prompt */
    long long tokens;   /* --tokens: how many to generate */
    double temperature; /* --temperature */
    long long seed;     /* --seed */
    const char *metrics; /* --metrics: JSON lines appended there */
    const char *bpe;    /* --bpe: sample's GPT-2 BPE files */
    int skip_nonfinite; /* --skip-nonfinite: skip such a step instead of stopping */
    int threads;        /* --threads: OpenBLAS threads (0: all the process may use) */
    mesh_device_kind device; /* --device: auto (the default), cpu, cuda */
    int profile;        /* --profile: rank 0's step by kind of work, at the end */
} run_opts;

/* Whether the plan's pattern for `what` (data, val_data) matches a file;
 * says how to make one when it does not. */
static int plan_files_exist(const char *pattern, const char *what)
{
    glob_t g;
    int found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    if (!found)
        fail("no file matches the plan's %s '%s'; make a shard with `meshrun tokenize TEXT -o SHARD.bin` "
             "and pass --%s SHARD.bin", what, pattern, strcmp(what, "data") ? "val" : "data");
    return found;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The device notice (--device auto: what it chose, and why), the ranks,
 * the data line (the shard, or the pattern and how many shards it named)
 * and the memory. */
static void print_start(const mesh_plan_info *pi, const run_opts *o, mesh_context *ctx, mesh_data *data,
                        const char *pattern, long long steps)
{
    int shards;
    uint64_t tokens;
    const char *first;
    size_t allocated, planned;
    char count[32] = "";
    mesh_data_info(data, &shards, &tokens, NULL);
    mesh_data_shard(data, 0, &first, NULL);
    mesh_context_memory(ctx, &allocated, &planned);
    if (shards > 1) snprintf(count, sizeof count, "%d shards, ", shards);
    mesh_device_kind on = MESH_DEVICE_CPU;
    if (o->device != MESH_DEVICE_CPU) {
        const char *why = "";
        mesh_context_device(ctx, &on, &why);
        printf("meshrun: %s\n", why);
    }
    int threads = job_processes == 1;
    if (pi->world > 1)
        printf("meshrun: %d ranks (dp %d x tp %d x pp %d x ep %d)%s%s%s\n", pi->world, pi->dp, pi->tp, pi->pp,
               pi->ep, threads ? " as threads of this process" : ", one per process (", threads ? "" : job_launcher,
               threads ? "" : ")");
    printf("meshrun: training %s on %s (%s%llu tokens): %lld steps of %d x %d tokens\n",
           pi->source[0] ? pi->source : "the plan", shards > 1 ? pattern : first, count,
           (unsigned long long)tokens, steps, pi->global_batch, pi->seq_len);
    if (allocated == planned)
        printf("meshrun: memory: %.1f MB in one arena, as the plan's memory plan says\n", (double)allocated / 1e6);
    else
        printf("meshrun: memory: %.1f MB in one arena (the plan's memory plan: %.1f MB with 2-byte %s; the CPU "
               "keeps %s values in 4-byte words)\n", (double)allocated / 1e6, (double)planned / 1e6, pi->precision,
               pi->precision);
    const char *tf32 = getenv("MESH_TF32");
    if (on == MESH_DEVICE_CUDA && strcmp(pi->precision, "fp32") == 0 && tf32 && strcmp(tf32, "1") == 0)
        printf("meshrun: fp32: the products (linear layers, experts, the attention's tiles) on TF32 tensor cores "
               "(MESH_TF32=1): their operands rounded to 10 bits of mantissa, sums in fp32\n");
    if (strcmp(pi->precision, "fp32") != 0)
        printf("meshrun: %s: activations, weights and gradients rounded to %s after every op, fp32 master "
               "weights and AdamW state%s\n", pi->precision, pi->precision,
               strcmp(pi->precision, "fp16") == 0 ? ", loss scaling" : "");
}

/* A run's settings, shared by its ranks' threads. */
typedef struct train_job {
    const mesh_plan *plan;
    const mesh_plan_info *pi;
    const run_opts *o;
    const char *pattern, *vpattern, *ckpt;
    atomic_int reported; /* a rank printed why the run stops */
} train_job;

/* Prints the error of a rank that fails on its own (on any process);
 * returns st. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static mesh_status rank_fail(train_job *j, mesh_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(fmt, ap);
    va_end(ap);
    atomic_store(&j->reported, 1);
    return st;
}

/* Logs a step: "step N/M | loss ... | lr ... | norm ... | ms | tok/s |
 * TFLOP/s | mem" (rank 0's model TFLOP/s: mesh_step_stats.model_flops
 * over the step's time). */
static void log_step(FILE *metrics, mesh_context *ctx, const mesh_step_stats *st, long long steps, double ms,
                     double step_tokens)
{
    size_t allocated;
    mesh_context_memory(ctx, &allocated, NULL);
    char scale[48] = "";
    if (st->loss_scale != 1.0) snprintf(scale, sizeof scale, " | scale %g", st->loss_scale);
    printf("step %lld/%lld | loss %.4f | lr %.2e | norm %.4f%s | %.1f ms | %.1fk tok/s | %.3g TFLOP/s | mem %.0f MB\n",
           st->step, steps, st->loss, st->lr, st->grad_norm, scale, ms, step_tokens / ms,
           st->model_flops / 1e9 / ms, (double)allocated / 1e6);
    fflush(stdout);
    if (metrics) {
        /* JSON has no infinity: fp16's overflowed norm is null */
        char norm[32] = "null";
        if (isfinite(st->grad_norm)) snprintf(norm, sizeof norm, "%.6f", st->grad_norm);
        if (st->loss_scale != 1.0) snprintf(scale, sizeof scale, ", \"loss_scale\": %g", st->loss_scale);
        fprintf(metrics, "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %s%s%s, "
                "\"ms\": %.3f, \"comm_ms\": %.3f, \"model_flops\": %.0f, \"tflops\": %.4g, \"tokens_per_s\": %.1f}\n",
                st->step, st->loss, st->lr, norm, scale, st->skipped ? ", \"skipped\": true" : "", ms, st->comm_ms,
                st->model_flops, st->model_flops / 1e9 / ms, 1e3 * step_tokens / ms);
        fflush(metrics);
    }
}

/* The bytes rank 0 sent per step, beside the plan's prediction; then the
 * time its collectives took in its turn and, those overlapped, on its
 * communication thread (gpu: the GPU's own, as mesh_context_comm_ms and
 * mesh_context_overlap_ms measure them when NCCL's calls are ordered). */
static void print_sent(mesh_context *ctx, int gpu)
{
    char what[48];
    double bytes, planned, ms;
    long long untimed = 0;
    for (int k = 0; mesh_context_sent(ctx, k, what, sizeof what, &bytes, &planned) == MESH_OK; k++) {
        if (k == 0) printf("meshrun: bytes rank 0 sent per step (the plan's):");
        if (planned >= 0) printf("%s %s %.0f (%.0f)", k ? "," : "", what, bytes, planned);
        else printf("%s %s %.0f", k ? "," : "", what, bytes);
        if (mesh_context_sent(ctx, k + 1, what, sizeof what, &bytes, &planned) != MESH_OK) putchar('\n');
    }
    for (int k = 0; mesh_context_sent(ctx, k, what, sizeof what, &bytes, &planned) == MESH_OK &&
                    mesh_context_comm_ms(ctx, k, &ms, NULL, &untimed) == MESH_OK; k++) {
        if (k == 0)
            printf("meshrun: time rank 0's collectives took per step in its turn, %s:", gpu ? "on the GPU" : "on the host");
        printf("%s %s %.2f ms", k ? "," : "", what, ms);
        if (mesh_context_sent(ctx, k + 1, what, sizeof what, &bytes, &planned) != MESH_OK) {
            if (untimed > 0) printf(" (%lld calls untimed: the GPU was far behind)", untimed);
            putchar('\n');
        }
    }
    int shown = 0; /* the overlapped ones, by entry: those that ran on the communication thread */
    double calls;
    for (int k = 0; mesh_context_sent(ctx, k, what, sizeof what, &bytes, &planned) == MESH_OK &&
                    mesh_context_overlap_ms(ctx, k, &ms, &calls) == MESH_OK; k++) {
        if (calls <= 0) continue;
        if (!shown++)
            printf("meshrun: time rank 0's collectives took per step on its communication thread, %s:",
                   gpu ? "on the GPU" : "on the host");
        printf("%s %s %.2f ms", shown > 1 ? "," : "", what, ms);
    }
    if (shown) putchar('\n');
    fflush(stdout);
}

/* --profile: rank 0's step by kind of work (mesh_context_profile), the
 * most costly first, with the model TFLOP/s of the matmuls and attention,
 * beside the step's own time (step_ms: the mean of mesh_train_step's over
 * the same steps). */
static void print_profile(mesh_context *ctx, int gpu, double step_ms)
{
    enum { MAX_ROWS = 128 };
    mesh_profile_entry rows[MAX_ROWS], t;
    int n = 0;
    while (n < MAX_ROWS && mesh_context_profile(ctx, n, sizeof rows[n], &rows[n]) == MESH_OK) n++;
    if (n == 0) {
        printf("meshrun: profile: nothing timed (a step after the first is needed: the first warms up)\n");
        return;
    }
    for (int i = 1; i < n; i++) /* the most costly first */
        for (int k = i; k > 0 && rows[k].ms > rows[k - 1].ms; k--) {
            t = rows[k];
            rows[k] = rows[k - 1];
            rows[k - 1] = t;
        }
    double total = 0, gflop = 0;
    for (int i = 0; i < n; i++) total += rows[i].ms, gflop += rows[i].gflop;
    printf("meshrun: profile of rank 0's steps after the first (%lld), %s, per step:\n", rows[0].steps,
           gpu ? "the GPU's time from CUDA events" : "the host's time");
    printf("meshrun:   %-28s %10s %7s %9s %9s\n", "work", "ms", "%", "calls", "TFLOP/s");
    for (int i = 0; i < n; i++) {
        char tf[24] = "-";
        if (rows[i].gflop > 0 && rows[i].ms > 0) snprintf(tf, sizeof tf, "%.2f", rows[i].gflop / rows[i].ms);
        printf("meshrun:   %-28s %10.3f %6.1f%% %9.1f %9s\n", rows[i].what, rows[i].ms,
               step_ms > 0 ? 100 * rows[i].ms / step_ms : 0.0, rows[i].calls, tf);
    }
    printf("meshrun:   %-28s %10.3f %6.1f%% of the step's %.3f ms (the rest: %s)\n", "all of the above", total,
           step_ms > 0 ? 100 * total / step_ms : 0.0, step_ms,
           gpu ? "the GPU idle: the host behind, waits for other streams" : "the host between the calls");
    if (step_ms > 0 && gflop > 0)
        printf("meshrun:   model FLOPs (matmuls, attention, experts): %.1f GFLOP a step, %.2f TFLOP/s over the step\n", gflop,
               gflop / step_ms);
    if (rows[0].untimed > 0) printf("meshrun:   (%lld brackets untimed: the GPU was far behind)\n", rows[0].untimed);
    fflush(stdout);
}

/* One rank's training: every rank reads its slice of each global batch;
 * rank 0 prints, validates and saves checkpoints. A rank stopped because
 * another failed returns quietly (MESH_ERR_RANK): the one that failed says
 * why, and with a process per rank each process then says what it saw
 * (train). */
static mesh_status train_rank(mesh_context *ctx, int rank, void *ud)
{
    train_job *j = ud;
    const mesh_plan_info *pi = j->pi;
    const run_opts *o = j->o;
    int lead = rank == 0, data_rank;
    mesh_data *data = NULL, *val = NULL;
    FILE *metrics = NULL;
    int *in = NULL, *tg = NULL;
    mesh_status rc = MESH_OK;
    mesh_context_rank(ctx, NULL, &data_rank, NULL);
    if (mesh_data_open(j->plan, j->pattern, data_rank, &data) != MESH_OK ||
        (j->vpattern && mesh_data_open(j->plan, j->vpattern, data_rank, &val) != MESH_OK)) {
        rc = rank_fail(j, MESH_ERR_IO, "%s", mesh_last_error());
        goto out;
    }
    size_t n = (size_t)pi->micro_batches * (size_t)pi->micro_batch * (size_t)pi->seq_len;
    if (!(in = malloc(n * sizeof *in)) || !(tg = malloc(n * sizeof *tg))) {
        rc = rank_fail(j, MESH_ERR_NOMEM, "out of memory");
        goto out;
    }
    long long steps = o->steps > 0 ? o->steps : pi->steps, first = 1;
    if (lead) print_start(pi, o, ctx, data, j->pattern, steps);
    if (j->ckpt && mesh_checkpoint_claim(ctx, j->ckpt) != MESH_OK) { /* another job's folder: before training */
        rc = rank_fail(j, MESH_ERR_IO, "%s", mesh_last_error());
        goto out;
    }
    if (o->resume) {
        if (mesh_checkpoint_load_with(ctx, j->ckpt, data) != MESH_OK) { /* the step and the data position too */
            rc = rank_fail(j, MESH_ERR_IO, "%s", mesh_last_error());
            goto out;
        }
        mesh_context_step(ctx, &first);
        if (lead) printf("meshrun: resumed from %s after step %lld\n", j->ckpt, first);
        first++;
    }
    if (lead && o->metrics && !(metrics = fopen(o->metrics, "a"))) {
        rc = rank_fail(j, MESH_ERR_IO, "cannot open '%s': %s", o->metrics, strerror(errno));
        goto out;
    }
    long long every = pi->log_every > 0 ? pi->log_every : 1;
    long long eval_every = pi->eval_every > 0 ? pi->eval_every : 10 * every;
    double step_tokens = (double)pi->global_batch * pi->seq_len;
    /* no progress bar when a launcher forwards the output (mpirun, through a terminal) */
    int tty = lead && job_processes == 1 && isatty(STDOUT_FILENO), skipped = 0;
    double overlap_ms = 0, wait_ms = 0, overlap_steps = 0; /* rank 0's, for the summary */
    double train_s = 0, train_steps = 0; /* mesh_train_step's time after the first step */
    double t0 = now_s();
    for (long long step = first; rc == MESH_OK && step <= steps; step++) {
        mesh_step_stats st;
        mesh_data_next(data, in, tg);
        double ts = now_s();
        mesh_status s = mesh_train_step(ctx, in, tg, &st);
        if (step > first) { /* (the profile's steps: the first warms up) */
            train_s += now_s() - ts;
            train_steps++;
        }
        if (s == MESH_ERR_RANK) {
            rc = s;
            break;
        }
        if (s != MESH_OK) { /* not finite: the same on every rank */
            if (o->skip_nonfinite && ++skipped <= 5) {
                if (lead)
                    printf("step %lld/%lld | skipped: the loss (%g) or the gradient norm (%g) is not "
                           "finite; the parameters are unchanged\n", step, steps, st.loss, st.grad_norm);
                continue;
            }
            rc = s;
            if (lead)
                rank_fail(j, s, "step %lld: the loss (%g) or the gradient norm (%g) is not finite; stopping%s", step,
                          st.loss, st.grad_norm, o->skip_nonfinite ? " after 5 skipped steps in a row" : "");
            break;
        }
        skipped = 0;
        if (step > first && st.overlapped > 0) { /* (the first step warms up) */
            overlap_ms += st.overlap_ms;
            wait_ms += st.wait_ms;
            overlap_steps++;
        }
        if (step == first && lead && st.overlapped > 0) {
            printf("meshrun: overlap: %d collective%s a step run on a communication thread while the rank "
                   "computes (--no-overlap: in turn)\n", st.overlapped, st.overlapped == 1 ? "" : "s");
            fflush(stdout);
        }
        if (st.skipped && lead) { /* fp16: an overflow, the same on every rank */
            printf("%sstep %lld/%lld | skipped: the gradients overflowed fp16 at loss scale %g; the parameters are "
                   "unchanged\n", tty ? "\r" : "", step, steps, st.loss_scale);
            fflush(stdout);
        }
        if (lead) { /* rank 0 logs and validates */
            if (tty && step % every != 0 && step != steps) { /* a progress bar, on a terminal only */
                long long done = 20 * (step % every) / every;
                printf("\r  [%.*s%.*s] step %lld/%lld", (int)done, "####################", (int)(20 - done),
                       "....................", step, steps);
                fflush(stdout);
            }
            if (tty && (step % every == 0 || step == steps)) printf("\r%60s\r", "");
            if (step % every == 0 || step == 1 || step == steps) {
                double t1 = now_s(), ms = 1e3 * (t1 - t0) / (double)(step % every ? step % every : every);
                if (step == 1) ms = 1e3 * (t1 - t0);
                log_step(metrics, ctx, &st, steps, ms, step_tokens);
                t0 = t1;
            }
        }
        /* every rank validates its slice of the first 8 global batches of the
         * validation shards (the same sequences on any mesh), each time */
        if (val && (step % eval_every == 0 || step == steps)) {
            double vl = 0;
            mesh_status vs = mesh_data_seek(val, 0);
            if (vs == MESH_OK) vs = mesh_evaluate(ctx, val, 8 * pi->micro_batches, &vl);
            if (vs != MESH_OK) {
                rc = vs == MESH_ERR_RANK ? vs : rank_fail(j, MESH_ERR_IO, "%s", mesh_last_error());
                break;
            }
            if (lead) {
                printf("step %lld/%lld | val loss %.4f\n", step, steps, vl);
                fflush(stdout);
            }
            if (metrics) {
                fprintf(metrics, "{\"step\": %lld, \"val_loss\": %.6f}\n", step, vl);
                fflush(metrics);
            }
            t0 = now_s();
        }
        if (j->ckpt && ((pi->checkpoint_every > 0 && step % pi->checkpoint_every == 0) || step == steps)) {
            /* every rank (ZeRO's optimizer shards are gathered), rank 0 writes */
            mesh_status cs = mesh_checkpoint_save_with(ctx, j->ckpt, data); /* with the data position */
            if (cs == MESH_ERR_RANK)
                rc = cs;
            else if (cs != MESH_OK)
                rc = rank_fail(j, MESH_ERR_IO, "step %lld: %s", step, mesh_last_error());
            else if (lead)
                printf("step %lld/%lld | checkpoint %s/step-%08lld\n", step, steps, j->ckpt, step);
            t0 = now_s();
        }
    }
    int gpu_times = 0; /* NCCL's calls ordered on the GPU: the times are the GPU's own */
    mesh_context_times_on_gpu(ctx, &gpu_times);
    if (lead && rc == MESH_OK) print_sent(ctx, gpu_times);
    size_t kbytes = 0;
    if (lead && rc == MESH_OK && mesh_context_kernel_memory(ctx, &kbytes) == MESH_OK && kbytes > 0)
        printf("meshrun: rank 0's kernels held %.1f MB (%zu bytes) of device memory beside the arena, which the plan "
               "does not predict (cuBLASLt's workspace, their scratch at its largest)\n", (double)kbytes / 1e6, kbytes);
    char tuning[256];
    if (lead && rc == MESH_OK && mesh_context_gemm_tuning(ctx, tuning, sizeof tuning) == MESH_OK) {
        printf("meshrun: rank 0's matmul algorithms (MESH_GEMM_TUNE=1): %s\n", tuning);
        fflush(stdout);
    }
    char attn[800];
    if (lead && rc == MESH_OK && mesh_context_attention_cudnn(ctx, attn, sizeof attn) == MESH_OK) {
        const char *mode = getenv("MESH_ATTN_CUDNN");
        printf("meshrun: rank 0's attention (MESH_ATTN_CUDNN=%s): %s\n", mode && strcmp(mode, "fwd") == 0 ? "fwd" : "1",
               attn);
        fflush(stdout);
    }
    if (lead && rc == MESH_OK && o->profile) {
        mesh_device_kind on = MESH_DEVICE_CPU;
        mesh_context_device(ctx, &on, NULL);
        print_profile(ctx, on == MESH_DEVICE_CUDA, train_steps > 0 ? 1e3 * train_s / train_steps : 0);
    }
    if (lead && rc == MESH_OK && overlap_steps > 0) {
        double ran = overlap_ms / overlap_steps, waited = wait_ms / overlap_steps;
        double hidden = ran > 0 && waited < ran ? 100 * (ran - waited) / ran : 0;
        if (gpu_times)
            printf("meshrun: overlap: rank 0's collectives on its communication stream ran %.2f ms a step on the GPU; "
                   "the rank waited for them %.2f ms (its compute stream on the GPU, its host until each was "
                   "enqueued: %.0f%% hidden behind compute)\n", ran, waited, hidden);
        else
            printf("meshrun: overlap: rank 0's communication thread ran %.2f ms a step; the rank waited for it %.2f "
                   "ms (%.0f%% hidden behind compute)\n", ran, waited, hidden);
    }
out:
    if (metrics) fclose(metrics);
    free(in);
    free(tg);
    mesh_data_free(data);
    mesh_data_free(val);
    return rc;
}

/* Trains the plan on all its ranks, each a thread of this process. */
static int train(const mesh_plan *plan, const mesh_plan_info *pi, const run_opts *o)
{
    train_job j = {plan, pi, o, o->data ? o->data : pi->data, o->val ? o->val : pi->val_data,
                   o->ckpt ? o->ckpt : pi->checkpoint_dir, 0};
    if (!j.pattern) return fail("the plan names no data (train.data); pass --data SHARD.bin");
    if ((!o->data && !plan_files_exist(j.pattern, "data")) ||
        (!o->val && j.vpattern && !plan_files_exist(j.vpattern, "val_data")))
        return 1;
    if (o->resume && !j.ckpt) return fail("--resume needs --checkpoint DIR or the plan's train.checkpoint_dir");
    mesh_status st = mesh_run_ranks(plan, train_rank, &j);
    /* stopped by another rank's failure, every process of a job of
     * several says what it saw, not rank 0's alone: rank 0 may be the one
     * that failed (killed, or stopped: then no one else would say a word);
     * what every rank finds alike (a plan for another world), rank 0 says */
    if (st == MESH_ERR_RANK && !atomic_load(&j.reported))
        fail_here("%s: %s", pi->source[0] ? pi->source : "plan", mesh_last_error());
    else if (st != MESH_OK && !atomic_load(&j.reported))
        fail("%s: %s", pi->source[0] ? pi->source : "plan", mesh_last_error());
    return st == MESH_OK ? 0 : 1;
}

/* meshrun sample: prints the prompt and what the model writes after it
 * (bytes, or GPT-2 BPE tokens with --bpe DIR). */
typedef struct sample_job {
    const mesh_plan_info *pi;
    const run_opts *o;
    const char *ckpt;
    int failed; /* rank 0 printed why */
} sample_job;

/* Rank 0 writes; the others (a data-parallel plan's copies) have nothing to do. */
static mesh_status sample_rank(mesh_context *ctx, int rank, void *ud)
{
    sample_job *j = ud;
    const mesh_plan_info *pi = j->pi;
    const run_opts *o = j->o;
    if (rank != 0) return MESH_OK;
    mesh_tokenizer *tok = NULL;
    const char *prompt = o->prompt ? o->prompt : "\n";
    size_t len = strlen(prompt), n = 0;
    int *ids = malloc((len + (size_t)o->tokens + 1) * sizeof *ids), rc = 1, vocab = 0;
    if (mesh_checkpoint_load_params(ctx, j->ckpt) != MESH_OK || mesh_tokenizer_load(o->bpe, &tok) != MESH_OK) {
        fail("%s", mesh_last_error());
        goto out;
    }
    mesh_tokenizer_info(tok, &vocab, NULL);
    if (!o->bpe && pi->vocab != 256)
        fail("a model that is not byte-level needs --bpe DIR to read and write text (vocabulary %d)",
             pi->vocab);
    else if (o->bpe && pi->vocab < vocab)
        fail("the BPE vocabulary is larger than the model's (vocabulary %d)", pi->vocab);
    else if (!ids)
        fail("out of memory");
    else if (mesh_tokenizer_encode(tok, prompt, len, ids, len, &n) != MESH_OK)
        fail("%s", mesh_last_error());
    else if (n == 0)
        fail("the prompt is empty");
    else
        rc = 0;
    if (rc == 0) fputs(prompt, stdout);
    for (size_t total = n + (size_t)o->tokens; rc == 0 && n < total; n++) {
        char text[256];
        size_t got = 0;
        if (mesh_sample_next(ctx, ids, n, o->temperature, (uint64_t)o->seed, &ids[n]) != MESH_OK) {
            rc = fail("%s", mesh_last_error());
            break;
        }
        mesh_tokenizer_decode(tok, &ids[n], 1, text, sizeof text, &got);
        fwrite(text, 1, got < sizeof text ? got : sizeof text, stdout);
        fflush(stdout);
    }
    if (rc == 0) putchar('\n');
out:
    free(ids);
    mesh_tokenizer_free(tok);
    j->failed = rc != 0;
    return rc ? MESH_ERR_IO : MESH_OK;
}

static int sample(const mesh_plan *plan, const mesh_plan_info *pi, const run_opts *o)
{
    sample_job j = {pi, o, o->ckpt ? o->ckpt : pi->checkpoint_dir, 0};
    if (!j.ckpt) return fail("sample needs --checkpoint DIR (or the plan's train.checkpoint_dir)");
    if (pi->tp > 1)
        return fail("sample: with tp = %d each rank holds a slice of the logits; compile this model with tp = 1 and "
                    "sample from that plan (checkpoints hold whole parameters, so any mesh's loads into any other)",
                    pi->tp);
    mesh_status st = mesh_run_ranks(plan, sample_rank, &j);
    if (st != MESH_OK && !j.failed) fail("%s", mesh_last_error());
    return st == MESH_OK ? 0 : 1;
}

/* Settles the device (--device; cuda without a GPU it can train on stops
 * here), then trains the plan or samples from it. Several GPUs: CUDA
 * loads kernels eagerly unless CUDA_MODULE_LOADING says otherwise. Its
 * default since 12.2, lazy loading, loads a kernel at its first launch,
 * which may wait for the GPU's work to drain while holding the context's
 * lock; with NCCL kernels in flight waiting for peers whose own launches
 * wait in the same way, a job can deadlock in its first step (the hazard
 * NVIDIA's lazy-loading guide describes for kernels that wait on one
 * another). Before the device's probe: CUDA reads it as it starts. */
static int run_plan(mesh_plan *plan, const run_opts *o)
{
    mesh_plan_info pi;
    mesh_plan_get_info(plan, sizeof pi, &pi);
    if (o->device != MESH_DEVICE_CPU && pi.world > 1) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    if (mesh_set_device(o->device) != MESH_OK) return fail("%s", mesh_last_error());
    /* --threads; else the cores this process may use, shared by the ranks
     * it runs as threads (mesh_run_ranks) */
    if (o->threads > 0) mesh_set_threads(o->threads);
    return o->sample ? sample(plan, &pi, o) : train(plan, &pi, o);
}

/* Reads a whole file; prints the error and returns NULL on failure. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t cap = 0;
    *len = 0;
    if (!f) {
        fail("cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    for (size_t got = 1; got > 0;) {
        if (*len == cap) {
            char *grown = realloc(text, cap = cap ? 2 * cap : (size_t)1 << 16);
            if (!grown) break;
            text = grown;
        }
        got = fread(text + *len, 1, cap - *len, f);
        *len += got;
    }
    if (!text || *len == cap || ferror(f)) {
        fail(ferror(f) ? "cannot read '%s'" : "out of memory reading '%s'", path);
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

/* Appends one file's tokens to *ids: the end-of-text id first when the
 * tokenizer has one (as llm.c marks documents), then the text's. */
static int tokenize_file(const char *path, const mesh_tokenizer *tok, int eot, int **ids, size_t *n)
{
    size_t len = 0, got = 0;
    char *text = read_file(path, &len);
    if (!text) return 1;
    int *grown = realloc(*ids, (*n + len + 1) * sizeof *grown); /* no tokenizer gives more ids than bytes */
    int rc = grown ? 0 : fail("out of memory");
    if (grown) *ids = grown;
    if (rc == 0 && eot >= 0) (*ids)[(*n)++] = eot;
    if (rc == 0 && mesh_tokenizer_encode(tok, text, len, *ids + *n, len, &got) != MESH_OK)
        rc = fail("%s: %s", path, mesh_last_error());
    *n += rc == 0 ? got : 0;
    free(text);
    return rc;
}

/* meshrun tokenize [--bpe DIR] TEXT... -o SHARD.bin [--val VAL.bin] */
static int tokenize(int argc, char **argv)
{
    const char *out = NULL, *bpe_dir = NULL, *val = NULL;
    int n_in = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--bpe") == 0 || strcmp(argv[i], "--val") == 0) {
            if (i + 1 >= argc) return usage_error("this option needs a value:", argv[i]);
            if (argv[i][1] == 'o') out = argv[++i];
            else if (argv[i][2] == 'v') val = argv[++i];
            else bpe_dir = argv[++i];
        } else if (strcmp(argv[i], "--bytes") == 0) {
            bpe_dir = NULL;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return usage_error("unknown tokenize option", argv[i]);
        } else {
            argv[n_in++] = argv[i];
        }
    }
    if (!out || n_in == 0) return usage_error("tokenize needs text files and -o SHARD.bin", NULL);
    mesh_tokenizer *tok = NULL;
    int vocab = 0, eot = -1, rc = 0, *ids = NULL;
    size_t n = 0;
    if (mesh_tokenizer_load(bpe_dir, &tok) != MESH_OK) return fail("%s", mesh_last_error());
    mesh_tokenizer_info(tok, &vocab, &eot);
    if (vocab > 65536)
        rc = fail("%s: a vocabulary of %d does not fit shards' uint16 tokens", bpe_dir, vocab);
    for (int i = 0; rc == 0 && i < n_in; i++) rc = tokenize_file(argv[i], tok, eot, &ids, &n);
    /* --val: the last 5% of the tokens go to the validation shard */
    size_t n_val = val ? n / 20 : 0, n_train = n - n_val;
    if (rc == 0 && (mesh_shard_write(out, ids, n_train) != MESH_OK ||
                    (val && mesh_shard_write(val, ids + n_train, n_val) != MESH_OK)))
        rc = fail("%s", mesh_last_error());
    if (rc == 0)
        printf("meshrun: %s: %zu tokens (%s, vocabulary %d)\n", out, n_train,
               bpe_dir ? "GPT-2 BPE" : "byte-level", vocab);
    if (rc == 0 && val) printf("meshrun: %s: %zu tokens (the last 5%%, for validation)\n", val, n_val);
    free(ids);
    mesh_tokenizer_free(tok);
    return rc;
}

/* Reads a number option's value; returns -1 (after the usage error) if bad. */
static int number(const char *opt, const char *text, double lo, double *out)
{
    char *end;
    *out = strtod(text, &end);
    if (end == text || *end || !(*out >= lo)) {
        usage_error(opt, text);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (mesh_job_info(&job_rank, &job_processes, &job_launcher) != MESH_OK) return fail("%s", mesh_last_error());
    if (argc >= 2 && strcmp(argv[1], "tokenize") == 0) return tokenize(argc - 2, argv + 2);
    const char *plan_path = NULL;
    int options_done = 0;
    run_opts opts = {0};
    opts.device = MESH_DEVICE_AUTO;
    opts.tokens = 200;
    opts.temperature = 0.8;
    int first = 1;
    if (argc >= 2 && strcmp(argv[1], "sample") == 0) opts.sample = 1, first = 2;

    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && arg[0] == '-' && arg[1] != '\0') {
            static const char *const valued[] = {"--data", "--val", "--steps", "--checkpoint", "--prompt",
                                                 "--tokens", "--temperature", "--seed", "--metrics",
                                                 "--threads", "--bpe", "--device"};
            int v = -1;
            for (int k = 0; k < (int)(sizeof valued / sizeof valued[0]); k++)
                if (strcmp(arg, valued[k]) == 0) v = k;
            double x;
            if (v >= 0 && i + 1 >= argc) return usage_error("this option needs a value:", arg);
            if (v >= 0) i++;
            switch (v) {
            case 0: opts.data = argv[i]; continue;
            case 1: opts.val = argv[i]; continue;
            case 2:
                if (number("--steps needs a positive number, not", argv[i], 1, &x)) return 2;
                opts.steps = (long long)x;
                continue;
            case 3: opts.ckpt = argv[i]; continue;
            case 4: opts.prompt = argv[i]; continue;
            case 5:
                if (number("--tokens needs a number, not", argv[i], 0, &x)) return 2;
                opts.tokens = (long long)x;
                continue;
            case 6:
                if (number("--temperature needs a number >= 0, not", argv[i], 0, &opts.temperature)) return 2;
                continue;
            case 7:
                if (number("--seed needs a number, not", argv[i], 0, &x)) return 2;
                opts.seed = (long long)x;
                continue;
            case 8: opts.metrics = argv[i]; continue;
            case 10: opts.bpe = argv[i]; continue;
            case 9:
                if (number("--threads needs a number >= 1, not", argv[i], 1, &x)) return 2;
                opts.threads = (int)x;
                continue;
            case 11:
                if (strcmp(argv[i], "auto") == 0) opts.device = MESH_DEVICE_AUTO;
                else if (strcmp(argv[i], "cpu") == 0) opts.device = MESH_DEVICE_CPU;
                else if (strcmp(argv[i], "cuda") == 0) opts.device = MESH_DEVICE_CUDA;
                else return usage_error("--device needs auto, cpu or cuda, not", argv[i]);
                continue;
            default: break;
            }
            if (strcmp(arg, "--") == 0) {
                options_done = 1;
            } else if (strncmp(arg, "--local-rank=", 13) == 0 || strncmp(arg, "--local_rank=", 13) == 0) {
                continue; /* torchrun's; the rank comes from the environment */
            } else if (strcmp(arg, "--resume") == 0) {
                opts.resume = 1;
            } else if (strcmp(arg, "--skip-nonfinite") == 0) {
                opts.skip_nonfinite = 1;
            } else if (strcmp(arg, "--profile") == 0) {
                opts.profile = 1;
                mesh_set_profile(1);
            } else if (strcmp(arg, "--deterministic") == 0) {
                mesh_set_deterministic(1);
            } else if (strcmp(arg, "--no-overlap") == 0) {
                mesh_set_overlap(0);
            } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
                fputs(usage_text, stdout);
                return 0;
            } else if (strcmp(arg, "--version") == 0) {
                printf("meshrun %s\n", mesh_version());
                return 0;
            } else {
                return usage_error("unknown option", arg);
            }
        } else if (plan_path) {
            return usage_error("more than one plan file given:", arg);
        } else {
            plan_path = arg;
        }
    }
    if (!plan_path)
        return usage_error("no plan file given", NULL);
    mesh_plan *plan;
    if (mesh_plan_load(plan_path, &plan) != MESH_OK) return fail("%s", mesh_last_error());
    int rc = run_plan(plan, &opts);
    mesh_plan_free(plan);
    return rc;
}
