/* embed.c: train a model from a C program through libmesh's API.
 *
 *   cc -std=c11 embed.c $(pkg-config --cflags --libs mesh) -o embed
 *   ./embed examples/gpt-tiny.plan examples/data/devils-dictionary.txt 30 [CKPT_DIR]
 *
 * Loads a byte-level plan, trains STEPS steps on windows of the text file,
 * prints the loss, and saves a checkpoint when given a folder. */
#include <mesh.h>
#include <stdio.h>
#include <stdlib.h>

static int check(mesh_status st, const char *what)
{
    if (st != MESH_OK) fprintf(stderr, "embed: %s: %s: %s\n", what, mesh_status_str(st), mesh_last_error());
    return st != MESH_OK;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: embed FILE.plan TEXT STEPS [CKPT_DIR]\n");
        return 2;
    }
    mesh_plan *plan;
    mesh_context *ctx;
    int mb, m, seq, vocab;
    if (check(mesh_plan_load(argv[1], &plan), "loading the plan")) return 1;
    mesh_plan_batch(plan, &mb, &m, &seq, &vocab);
    if (check(mesh_context_create(plan, 0, &ctx), "creating the context")) return 1;
    FILE *f = fopen(argv[2], "rb");
    static unsigned char text[1 << 22];
    size_t len = f ? fread(text, 1, sizeof text, f) : 0, n = (size_t)m * mb * seq;
    if (f) fclose(f);
    int *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg), rc = len < n + 1 || vocab != 256;
    if (rc) fprintf(stderr, "embed: need a byte-level plan and a text of over %zu bytes\n", n);
    for (int step = 0; !rc && step < atoi(argv[3]); step++) {
        size_t at = (size_t)step * n % (len - n - 1);   /* the step's window of text */
        for (size_t k = 0; k < n; k++) in[k] = text[at + k], tg[k] = text[at + k + 1];
        mesh_step_stats st;
        rc = check(mesh_train_step(ctx, in, tg, &st), "training");
        if (!rc) printf("step %lld loss %.4f lr %.2e\n", st.step, st.loss, st.lr);
    }
    const char *name;
    size_t count;
    if (!rc && !check(mesh_param_info(ctx, 0, &name, &count), "parameter 0")) {
        float *w = malloc(count * sizeof *w);   /* read a parameter by its global name */
        if (w && !check(mesh_param_read(ctx, name, w, count), "reading")) printf("%s[0] = %.5f\n", name, w[0]);
        free(w);
    }
    if (!rc && argc > 4) rc = check(mesh_checkpoint_save(ctx, argv[4]), "saving");
    free(in);
    free(tg);
    mesh_context_free(ctx);
    mesh_plan_free(plan);
    return rc;
}
