/*
 * meshrun.c: the `meshrun` command, which executes plans made by meshc.
 *
 * `meshrun FILE.plan` loads and validates the plan (compiler/plan.h: magic,
 * format version, every field), then trains it on one CPU rank through the
 * plan interpreter (runtime/exec.h) on a token shard, printing a line per
 * logged step. Plans of more than one rank are refused with a message until
 * the multi-rank runtime lands. `meshrun tokenize` makes token shards.
 *
 * Exit status: 0 for --help, --version and a finished run; 1 when a file
 * cannot be read or is not valid, a plan cannot run yet, or the loss stops
 * being finite; 2 for usage errors.
 */
#include <errno.h>  /* defines: errno */
#include <unistd.h> /* defines: isatty */
#include <stdio.h>  /* defines: printf, fprintf, fopen */
#include <string.h> /* defines: strcmp, strerror */

#include <stdint.h> /* defines: uint16_t */
#include <glob.h>   /* defines: glob */
#include <stdlib.h> /* defines: malloc, free */
#include <time.h>   /* defines: clock_gettime */

#include "mesh.h" /* defines: mesh_version */
#include "bpe.h"  /* defines: mesh__bpe_load, mesh__bpe_encode */
#include "data.h" /* defines: mesh__shard_write, mesh__tokenize_bytes */
#include "checkpoint.h" /* defines: mesh__ckpt_save, mesh__ckpt_load */
#include "exec.h" /* defines: mesh__exec_* */
#include "file.h" /* defines: mesh__read_file */
#include "kcpu.h" /* defines: kcpu_set_threads */
#include "init.h" /* defines: mesh__init_key */
#include "sample.h" /* defines: mesh__sample_next */
#include "plan.h" /* defines: plan_read, plan_free */

static const char usage_text[] =
    "usage: meshrun [options] FILE.plan\n"
    "       meshrun sample FILE.plan --checkpoint DIR [--prompt TEXT] [--tokens N]\n"
    "       meshrun tokenize [--bpe DIR] TEXT... -o SHARD.bin [--val VAL.bin]\n"
    "\n"
    "Train the plan compiled by meshc on one CPU rank: the data is the token\n"
    "shard given by --data, else the first file matching the plan's train.data.\n"
    "\n"
    "meshrun tokenize turns text files into one token shard (llm.c's format:\n"
    "a 1024-byte header, then uint16 tokens) with the byte-level tokenizer\n"
    "(vocabulary 256), or with GPT-2's BPE given --bpe DIR holding OpenAI's\n"
    "encoder.json and vocab.bpe (each file then starts with <|endoftext|>).\n"
    "--val VAL.bin puts the last 5% of the tokens in a validation shard.\n"
    "\n"
    "options:\n"
    "  --data FILE    the token shard to train on\n"
    "  --val FILE     the validation shard (else the plan's train.val_data)\n"
    "  --steps N      train N steps instead of the plan's train.steps (the\n"
    "                 learning-rate schedule stays the plan's)\n"
    "  --checkpoint DIR  save checkpoints there (every train.checkpoint_every\n"
    "                 steps and at the end; else the plan's checkpoint_dir)\n"
    "  --resume       continue from DIR's latest checkpoint\n"
    "  --metrics FILE append a JSON line per logged step (and validation) to FILE\n"
    "  --skip-nonfinite  skip a step whose loss or gradient is not finite (at\n"
    "                 most 5 in a row) instead of stopping\n"
    "  --threads N    BLAS threads (default: the cores this process may use)\n"
    "  --prompt TEXT, --tokens N (200), --temperature T (0.8), --seed S (0),\n"
    "  --bpe DIR (GPT-2 BPE for a model that is not byte-level)\n"
    "                 what meshrun sample starts from and how it draws\n"
    "  -h, --help     print this help and exit\n"
    "  --version      print the version and exit\n";

/* Print a one-line error and the usage to stderr; return the usage status. */
static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "meshrun: error: %s%s%s%s\n", what, arg ? " '" : "",
            arg ? arg : "", arg ? "'" : "");
    fputs(usage_text, stderr);
    return 2;
}

/* Reads a whole file; prints the error and returns NULL on failure. */
static char *read_file(const char *path, size_t *len)
{
    char err[1200];
    char *text = mesh__read_file(path, len, err, sizeof err);
    if (!text) fprintf(stderr, "meshrun: error: %s\n", err);
    return text;
}

/* Options of a training run. */
typedef struct run_opts {
    const char *data;   /* --data: a token shard, instead of the plan's */
    const char *val;    /* --val: the validation shard, instead of the plan's */
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
} run_opts;

/* The shard to read: the option's file, else the first file matching the
 * plan's pattern. Prints the error and returns NULL when there is none;
 * returns NULL quietly when neither is given and the shard is optional. */
static char *data_path(const char *given, const char *pattern, const char *what, int optional)
{
    if (given) return strdup(given);
    if (!pattern) {
        if (!optional)
            fprintf(stderr, "meshrun: error: the plan names no %s (train.%s); pass --%s SHARD.bin\n",
                    what, what, strcmp(what, "data") ? "val" : "data");
        return NULL;
    }
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        fprintf(stderr, "meshrun: error: no file matches the plan's %s '%s'; make a shard with "
                "`meshrun tokenize TEXT -o SHARD.bin` and pass --%s SHARD.bin\n", what, pattern,
                strcmp(what, "data") ? "val" : "data");
        globfree(&g);
        return NULL;
    }
    char *path = strdup(g.gl_pathv[0]);
    globfree(&g);
    return path;
}

/* Mean loss over the first `batches` micro-batches of the validation shard. */
static double val_loss(mesh__exec *ex, const mesh__shard *val, int batches, int mb, int seq,
                       int32_t *in, int32_t *tg)
{
    double sum = 0;
    for (int k = 0; k < batches; k++) {
        mesh__batch(val, 0, batches * mb, batches, k, seq, in, tg);
        sum += mesh__exec_loss(ex, in, tg);
    }
    return sum / batches;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Trains: one line per logged step, "step N/M | loss ... | lr ... | norm
 * ... | ms | tok/s". */
static int train(const plan *p, const run_opts *o)
{
    char err[512];
    char *path = data_path(o->data, p->data, "data", 0);
    if (!path) return 1;
    char *vpath = o->val || p->val_data ? data_path(o->val, p->val_data, "val_data", 1) : NULL;
    if ((o->val || p->val_data) && !vpath) {
        free(path);
        return 1;
    }
    mesh__exec *ex = mesh__exec_create(p, NULL, NULL, err, sizeof err);
    if (!ex) {
        fprintf(stderr, "meshrun: error: %s: %s\n", p->source ? p->source : "plan", err);
        free(path);
        return 1;
    }
    int vocab = 0;
    for (int id = 0; id < p->n_tensors; id++)
        if (p->tensors[id].op == G_EMBED && p->tensors[p->tensors[id].in[0]].op == G_INPUT)
            vocab = (int)p->tensors[p->tensors[id].in[1]].dims[0];
    mesh__shard shard, val = {0};
    int bad = mesh__shard_open(&shard, path, vocab, err, sizeof err) != 0;
    if (!bad && vpath && mesh__shard_open(&val, vpath, vocab, err, sizeof err) != 0) {
        mesh__shard_close(&shard);
        bad = 1;
    }
    if (bad) {
        fprintf(stderr, "meshrun: error: %s\n", err);
        mesh__exec_free(ex);
        free(path);
        free(vpath);
        return 1;
    }
    const fe_setup *s = &p->setup;
    int m = (int)(s->micro_batches > 0 ? s->micro_batches : 1);
    size_t bt = mesh__exec_batch_tokens(ex);
    int seq = (int)s->seq_len, global = (int)s->global_batch;
    int32_t *in = malloc((size_t)m * bt * sizeof *in), *tg = malloc((size_t)m * bt * sizeof *tg);
    long long steps = o->steps > 0 ? o->steps : s->steps;
    long long every = s->log_every > 0 ? s->log_every : 1;
    long long eval_every = s->eval_every > 0 ? s->eval_every : 10 * every;
    int mb = (int)(bt / (size_t)seq), val_batches = 8;
    int rc = in && tg ? 0 : 1;
    if (rc) fputs("meshrun: error: out of memory\n", stderr);
    else
        printf("meshrun: training %s on %s (%zu tokens): %lld steps of %d x %d tokens\n"
               "meshrun: memory: %.1f MB allocated (the plan's memory plan: %.1f MB; this "
               "interpreter keeps every activation, the plan reuses slots)\n",
               p->source ? p->source : "the plan", path, shard.n, steps, global, seq,
               mesh__exec_bytes(ex) / 1e6, p->memory ? (double)p->memory[0].total / 1e6 : 0.0);
    const char *ckpt = o->ckpt ? o->ckpt : p->checkpoint_dir;
    long long first = 1, ck_every = s->checkpoint_every;
    if (rc == 0 && s->precision != 0)
        printf("meshrun: note: the plan asks for %s; this CPU runtime computes in fp32\n",
               s->precision == 1 ? "bf16" : "fp16");
    if (rc == 0 && o->resume) {
        if (!ckpt) {
            fputs("meshrun: error: --resume needs --checkpoint DIR or the plan's train.checkpoint_dir\n", stderr);
            rc = 1;
        } else if (mesh__ckpt_load(ex, ckpt, 1, &first, err, sizeof err) != 0) {
            fprintf(stderr, "meshrun: error: %s\n", err);
            rc = 1;
        } else {
            printf("meshrun: resumed from %s after step %lld\n", ckpt, first);
            first++;
        }
    }
    FILE *metrics = NULL;
    if (rc == 0 && o->metrics && !(metrics = fopen(o->metrics, "a"))) {
        fprintf(stderr, "meshrun: error: cannot open '%s': %s\n", o->metrics, strerror(errno));
        rc = 1;
    }
    int tty = isatty(STDOUT_FILENO), skipped = 0;
    double t0 = now_s();
    for (long long step = first; rc == 0 && step <= steps; step++) {
        for (int k = 0; k < m; k++) /* micro-batch k: the k-th slice of the global batch */
            mesh__batch(&shard, step - 1, global, m, k, seq, in + (size_t)k * bt, tg + (size_t)k * bt);
        mesh__step_stats st;
        if (mesh__exec_train_step(ex, step, in, tg, &st) != 0) {
            if (o->skip_nonfinite && ++skipped <= 5) {
                printf("step %lld/%lld | skipped: the loss (%g) or the gradient norm (%g) is not "
                       "finite; the parameters are unchanged\n", step, steps, st.loss, st.norm);
                continue;
            }
            fprintf(stderr, "meshrun: error: step %lld: the loss (%g) or the gradient norm (%g) is "
                    "not finite; stopping%s\n", step, st.loss, st.norm,
                    o->skip_nonfinite ? " after 5 skipped steps in a row" : "");
            rc = 1;
            break;
        }
        skipped = 0;
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
            printf("step %lld/%lld | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.1fk tok/s | mem %.0f MB\n",
                   step, steps, st.loss, st.lr, st.norm, ms, (double)global * seq / ms,
                   mesh__exec_bytes(ex) / 1e6);
            fflush(stdout);
            if (metrics) {
                fprintf(metrics, "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, "
                        "\"ms\": %.3f, \"tokens_per_s\": %.1f}\n", step, st.loss, st.lr, st.norm, ms,
                        1e3 * global * seq / ms);
                fflush(metrics);
            }
            t0 = t1;
        }
        if (vpath && (step % eval_every == 0 || step == steps)) {
            double vl = val_loss(ex, &val, val_batches, mb, seq, in, tg);
            printf("step %lld/%lld | val loss %.4f\n", step, steps, vl);
            fflush(stdout);
            if (metrics) {
                fprintf(metrics, "{\"step\": %lld, \"val_loss\": %.6f}\n", step, vl);
                fflush(metrics);
            }
            t0 = now_s();
        }
        if (ckpt && ((ck_every > 0 && step % ck_every == 0) || step == steps)) {
            if (mesh__ckpt_save(ex, ckpt, step, err, sizeof err) != 0) {
                fprintf(stderr, "meshrun: error: step %lld: %s\n", step, err);
                rc = 1;
            } else {
                printf("step %lld/%lld | checkpoint %s/step-%08lld\n", step, steps, ckpt, step);
            }
            t0 = now_s();
        }
    }
    if (metrics) fclose(metrics);
    free(in);
    free(tg);
    mesh__shard_close(&shard);
    if (vpath) mesh__shard_close(&val);
    mesh__exec_free(ex);
    free(path);
    free(vpath);
    return rc;
}

static mesh__bpe *load_bpe(const char *dir);

/* meshrun sample: prints the prompt and what the model writes after it
 * (bytes, or GPT-2 BPE tokens with --bpe DIR). */
static int sample(const plan *p, const run_opts *o)
{
    char err[512];
    const char *ckpt = o->ckpt ? o->ckpt : p->checkpoint_dir;
    if (!ckpt) {
        fputs("meshrun: error: sample needs --checkpoint DIR (or the plan's train.checkpoint_dir)\n", stderr);
        return 1;
    }
    mesh__exec *ex = mesh__exec_create(p, NULL, NULL, err, sizeof err);
    long long step = 0;
    if (!ex || mesh__ckpt_load(ex, ckpt, 0, &step, err, sizeof err) != 0) {
        fprintf(stderr, "meshrun: error: %s\n", err);
        mesh__exec_free(ex);
        return 1;
    }
    const plan_tensor *logits = &p->tensors[p->tensors[p->loss].in[0]];
    int vocab = p->tensors[p->loss].vocab > 0 ? (int)p->tensors[p->loss].vocab
                                              : (int)logits->dims[logits->rank - 1];
    mesh__bpe *bpe = o->bpe ? load_bpe(o->bpe) : NULL;
    if ((o->bpe && !bpe) || (!bpe && vocab != 256) || (bpe && vocab < mesh__bpe_vocab(bpe))) {
        if (!o->bpe || bpe)
            fprintf(stderr, "meshrun: error: %s (vocabulary %d)\n", bpe ? "the BPE vocabulary is larger "
                    "than the model's" : "a model that is not byte-level needs --bpe DIR to read and "
                    "write text", vocab);
        mesh__bpe_free(bpe);
        mesh__exec_free(ex);
        return 1;
    }
    const char *prompt = o->prompt ? o->prompt : "\n";
    size_t len = 0, cap = 0;
    int32_t *ids = NULL;
    int rc = 0;
    if (bpe) {
        rc = mesh__bpe_encode(bpe, prompt, strlen(prompt), &ids, &len, &cap, err, sizeof err) != 0;
    } else {
        len = cap = strlen(prompt);
        ids = malloc((len ? len : 1) * sizeof *ids);
        for (size_t k = 0; ids && k < len; k++) ids[k] = (unsigned char)prompt[k];
        if (!ids) snprintf(err, sizeof err, "out of memory");
        rc = !ids;
    }
    size_t total = len + (size_t)o->tokens, bt = mesh__exec_batch_tokens(ex);
    int32_t *grown = rc ? NULL : realloc(ids, (total ? total : 1) * sizeof *ids);
    int32_t *in = malloc(bt * sizeof *in), *tg = malloc(bt * sizeof *tg);
    if (grown) ids = grown;
    if (rc == 0 && (!grown || !in || !tg || len == 0)) {
        snprintf(err, sizeof err, len == 0 ? "the prompt is empty" : "out of memory");
        rc = 1;
    }
    if (rc) fprintf(stderr, "meshrun: error: %s\n", err);
    if (rc == 0) fputs(prompt, stdout);
    uint64_t key = mesh__init_key((uint64_t)o->seed, "meshrun sample");
    for (size_t n = len; rc == 0 && n < total; n++) {
        ids[n] = mesh__sample_next(ex, ids, n, (int)p->setup.seq_len, vocab, o->temperature, key, n,
                                   in, tg);
        char text[256];
        size_t got = bpe ? mesh__bpe_decode(bpe, &ids[n], 1, text, sizeof text) : 1;
        if (!bpe) text[0] = (char)ids[n];
        fwrite(text, 1, got < sizeof text ? got : sizeof text, stdout);
        fflush(stdout);
    }
    mesh__bpe_free(bpe);
    if (rc == 0) putchar('\n');
    free(ids);
    free(in);
    free(tg);
    mesh__exec_free(ex);
    return rc;
}

/* Loads and validates the plan, then trains it. */
static int run_plan(const char *path, const run_opts *o)
{
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) return 1;
    plan p;
    char err[1024];
    int rc = plan_read(&p, text, len, err, sizeof err);
    free(text);
    if (rc != 0) {
        fprintf(stderr, "meshrun: error: %s:%s\n", path, err);
        return 1;
    }
    rc = o->sample ? sample(&p, o) : train(&p, o);
    plan_free(&p);
    return rc;
}

/* Appends one file's tokens to *ids: GPT-2 BPE when bpe is given (the
 * file led by <|endoftext|>, as llm.c marks documents), else bytes. */
static int tokenize_file(const char *path, const mesh__bpe *bpe, int32_t **ids, size_t *n,
                         size_t *cap)
{
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) return 1;
    char err[512] = "out of memory";
    /* room for every id at once: BPE never gives more ids than bytes */
    int32_t *grown = realloc(*ids, (*n + len + 1) * sizeof *grown);
    int rc = grown ? 0 : -1;
    if (grown) *ids = grown, *cap = *n + len + 1;
    int eot = bpe ? mesh__bpe_id(bpe, "<|endoftext|>", 13) : -1;
    if (rc == 0 && eot >= 0) (*ids)[(*n)++] = eot;
    if (rc == 0 && bpe) rc = mesh__bpe_encode(bpe, text, len, ids, n, cap, err, sizeof err);
    else if (rc == 0)
        *n += mesh__tokenize_bytes(text, len, *ids + *n);
    free(text);
    if (rc != 0) fprintf(stderr, "meshrun: error: %s: %s\n", path, err);
    return rc != 0;
}

/* GPT-2's BPE from DIR/encoder.json and DIR/vocab.bpe; NULL after printing
 * the error. */
static mesh__bpe *load_bpe(const char *dir)
{
    char err[1024];
    mesh__bpe *bpe = NULL;
    size_t dn = strlen(dir);
    char *enc = malloc(dn + 16), *mer = malloc(dn + 16);
    if (enc && mer) {
        snprintf(enc, dn + 16, "%s/encoder.json", dir);
        snprintf(mer, dn + 16, "%s/vocab.bpe", dir);
        bpe = mesh__bpe_load(enc, mer, err, sizeof err);
    } else {
        snprintf(err, sizeof err, "out of memory");
    }
    free(enc);
    free(mer);
    if (!bpe) {
        fprintf(stderr, "meshrun: error: %s\n", err);
        return NULL;
    }
    if (mesh__bpe_vocab(bpe) > 65536) {
        fprintf(stderr, "meshrun: error: %s: a vocabulary of %d does not fit shards' uint16 tokens\n",
                dir, mesh__bpe_vocab(bpe));
        mesh__bpe_free(bpe);
        return NULL;
    }
    return bpe;
}

/* meshrun tokenize [--bpe DIR] TEXT... -o SHARD.bin */
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
    mesh__bpe *bpe = NULL;
    char err[1024];
    if (bpe_dir && !(bpe = load_bpe(bpe_dir))) return 1;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (int i = 0; rc == 0 && i < n_in; i++) rc = tokenize_file(argv[i], bpe, &ids, &n, &cap);
    uint16_t *tok = rc == 0 ? malloc((n ? n : 1) * sizeof *tok) : NULL;
    if (rc == 0 && !tok) {
        fputs("meshrun: error: out of memory\n", stderr);
        rc = 1;
    }
    for (size_t k = 0; tok && k < n; k++) tok[k] = (uint16_t)ids[k];
    /* --val: the last 5% of the tokens go to the validation shard */
    size_t n_val = val ? n / 20 : 0, n_train = n - n_val;
    if (tok && mesh__shard_write(out, tok, n_train, err, sizeof err) != 0) {
        fprintf(stderr, "meshrun: error: %s\n", err);
        rc = 1;
    }
    if (tok && rc == 0 && val && mesh__shard_write(val, tok + n_train, n_val, err, sizeof err) != 0) {
        fprintf(stderr, "meshrun: error: %s\n", err);
        rc = 1;
    }
    const char *kind = bpe ? "GPT-2 BPE" : "byte-level";
    int vocab = bpe ? mesh__bpe_vocab(bpe) : 256;
    if (rc == 0) printf("meshrun: %s: %zu tokens (%s, vocabulary %d)\n", out, n_train, kind, vocab);
    if (rc == 0 && val) printf("meshrun: %s: %zu tokens (the last 5%%, for validation)\n", val, n_val);
    free(ids);
    free(tok);
    mesh__bpe_free(bpe);
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
    if (argc >= 2 && strcmp(argv[1], "tokenize") == 0) return tokenize(argc - 2, argv + 2);
    const char *plan_path = NULL;
    int options_done = 0;
    run_opts opts = {0};
    opts.tokens = 200;
    opts.temperature = 0.8;
    int first = 1;
    if (argc >= 2 && strcmp(argv[1], "sample") == 0) opts.sample = 1, first = 2;

    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && arg[0] == '-' && arg[1] != '\0') {
            static const char *const valued[] = {"--data", "--val", "--steps", "--checkpoint", "--prompt",
                                                 "--tokens", "--temperature", "--seed", "--metrics",
                                                 "--threads", "--bpe"};
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
            default: break;
            }
            if (strcmp(arg, "--") == 0) {
                options_done = 1;
            } else if (strcmp(arg, "--resume") == 0) {
                opts.resume = 1;
            } else if (strcmp(arg, "--skip-nonfinite") == 0) {
                opts.skip_nonfinite = 1;
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
    kcpu_set_threads(opts.threads); /* --threads, else the cores this process may use */
    return run_plan(plan_path, &opts);
}
