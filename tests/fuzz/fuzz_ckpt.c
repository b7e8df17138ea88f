/* fuzz_ckpt.c — libFuzzer harness for loading checkpoints
 * (runtime/checkpoint.c: the safetensors header's JSON, the tensors'
 * names, shapes and offsets, the metadata).
 *
 * A small GPT (one rank, CPU) saves a checkpoint once; each input then
 * stands for one of its two files: its first byte picks which (even:
 * model.safetensors, odd: optim.safetensors), the rest is the file's bytes,
 * the other file kept as saved. mesh_checkpoint_load must refuse it with a
 * message or load it, and after a load the model must take a training step
 * (whatever its numbers): no crash, no read out of bounds (ASan, UBSan),
 * no leak. With MESH_FUZZ_SEEDS=DIR the saved files are written there, as
 * inputs, first (make fuzz-ckpt's corpus).
 *
 *   make fuzz-ckpt      (FUZZ_SECONDS=600)
 */
#include <stdint.h> /* uint8_t */
#include <stdio.h>  /* FILE, fopen, snprintf */
#include <stdlib.h> /* getenv, malloc, mkdtemp */
#include <string.h> /* strlen */

#include "mesh.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char model_src[] =
    "import \"std/transformer.mesh\"\n"
    "model tiny {\n"
    "  vocab = 16\n  context = 8\n  dim = 8\n  heads = 2\n  layers = 1\n"
    "  input tokens : int[batch, seq]\n  input targets : int[batch, seq]\n"
    "  param wte : [vocab, dim] = normal(0.5)\n  param wpe : [context, dim] = normal(0.5)\n"
    "  x = embed(tokens, wte) + embed(arange(seq), wpe)\n"
    "  repeat layers as h { x = gpt2_block(x, heads: heads, n_layers: layers) }\n"
    "  param ln_f_w : [dim] = ones\n  param ln_f_b : [dim] = zeros\n"
    "  loss = cross_entropy(layernorm(x, ln_f_w, ln_f_b) @ transpose(wte), targets)\n"
    "}\n"
    "mesh { dp = 1 }\n"
    "train { global_batch = 2  seq_len = 8  steps = 10  optimizer = adamw(lr: 1e-2) }\n";

static mesh_plan *plan;
static mesh_context *ctx;
static char step_dir[256];
static char *saved[2]; /* model, optim: as saved */
static size_t saved_len[2];
static const char *const file_name[2] = {"model.safetensors", "optim.safetensors"};
static int ids[2 * 8 + 1];

static void die(const char *what)
{
    fprintf(stderr, "fuzz_ckpt: %s: %s\n", what, mesh_last_error());
    exit(1);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL &&
            fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        *len = (size_t)n;
    }
    fclose(f);
    return buf;
}

static int put(const char *path, const void *a, size_t na, const void *b, size_t nb)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(a, 1, na, f) == na && fwrite(b, 1, nb, f) == nb;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mesh_set_threads(1);
    mesh_set_device(MESH_DEVICE_CPU);
    char *text = NULL;
    size_t len = 0;
    if (mesh_compile("tiny.mesh", model_src, strlen(model_src), NULL, &text, &len) != MESH_OK) die("compile");
    if (mesh_plan_from_memory(text, len, &plan) != MESH_OK) die("plan");
    mesh_free(text);
    if (mesh_context_create(plan, 0, &ctx) != MESH_OK) die("context");
    for (int i = 0; i < (int)(sizeof ids / sizeof ids[0]); i++) ids[i] = i % 16;
    if (mesh_train_step(ctx, ids, ids + 1, NULL) != MESH_OK) die("step"); /* moments worth saving */
    static char dir[] = "/tmp/fuzz_ckpt.XXXXXX";
    if (!mkdtemp(dir) || mesh_checkpoint_save(ctx, dir) != MESH_OK) die("save");
    snprintf(step_dir, sizeof step_dir, "%s/step-00000001", dir);
    const char *seeds = getenv("MESH_FUZZ_SEEDS");
    for (int k = 0; k < 2; k++) {
        char path[320];
        snprintf(path, sizeof path, "%s/%s", step_dir, file_name[k]);
        if (!(saved[k] = slurp(path, &saved_len[k]))) die(path);
        char sel = (char)k;
        snprintf(path, sizeof path, "%s/seed-%s", seeds ? seeds : "", file_name[k]);
        if (seeds && put(path, &sel, 1, saved[k], saved_len[k]) != 0) die(path);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int k = data[0] & 1;
    char path[320];
    for (int j = 0; j < 2; j++) {
        snprintf(path, sizeof path, "%s/%s", step_dir, file_name[j]);
        int rc = j == k ? put(path, data + 1, size - 1, "", 0) : put(path, saved[j], saved_len[j], "", 0);
        if (rc != 0) die(path);
    }
    if (mesh_checkpoint_load(ctx, step_dir) == MESH_OK) (void)mesh_train_step(ctx, ids, ids + 1, NULL);
    return 0;
}
