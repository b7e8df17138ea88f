/*
 * gpu_tests.c: every CUDA kernel (kernels/cuda, kcuda.h) against the CPU
 * reference (kernels/cpu, kcpu.h) on the same random inputs, forward and
 * backward, in fp32, bf16 and fp16.
 *
 * usage: gpu_tests [SUBSTRING...]   (no arguments: every case, in order)
 * GPU_TESTS_SKIP="SUBSTRING..." skips the cases whose names contain one
 * (each reported `ok N - name # SKIP GPU_TESTS_SKIP`, counted as passed:
 * the emulation's ThreadSanitizer run leaves out the fp16 cases, the bf16
 * ones' code with another type). GPU_TESTS_AFTER=NAME runs only the
 * cases after the one named NAME (exactly), in order: what a device error
 * or a crash in NAME left unrun (tests/gpu/run.sh's gpu_tests step runs
 * them so, in a new process). GPU_TESTS_ABORT=NAME aborts the process as
 * the case NAME starts (a test of that step's recovery, as a crash).
 *
 * Output is TAP-like, as the unit tests': `ok N - name (err E, tol T)` or
 * `not ok N - name ...` (details on stderr, prefixed "# "), each case
 * announced first by `# case NAME` (so that a crash or a hang names it),
 * then `# N passed, N failed`; after a device error, which is sticky,
 * the cases left are not run and count as failed, said first by
 * `# stopped after NAME: ...`. The error of a tensor is its largest absolute
 * difference over its largest reference magnitude; the tolerance is 1e-5
 * in fp32, 2e-2 in bf16 and 5e-3 in fp16 (where the inputs are rounded to
 * the 2-byte type first and the CPU runs on the rounded values), 0 where
 * the GPU promises the CPU's
 * bits (AdamW, integer routing arrays). Cases that promise determinism run
 * twice and compare the bits.
 *
 * Without a usable GPU (no driver, no device: kcuda_available says why) it
 * prints `SKIP gpu: no GPU (<reason>)` and exits 0. Exit status: 0 when all
 * passed, 1 if any failed.
 *
 * The cases are in gpu_tests_*.c by kind of op, the harness they share in
 * gpu_tests_harness.c (gpu_tests.h); this file is the runner.
 */
#include <stdio.h>  /* defines: printf, fprintf */
#include <stdlib.h> /* defines: getenv, exit */
#include <string.h> /* defines: strstr, strcmp */

#include "gpu_tests.h"

/* ---- the runner ----------------------------------------------------------- */

typedef struct gpu_case {
    const char *name;
    void (*fn)(kcuda_dtype);
    kcuda_dtype dt;
} gpu_case;

static const gpu_case cases[] = {
    {"convert", t_convert, KCUDA_F32},
    {"arange", t_arange, KCUDA_F32},
    {"matmul_f32", t_matmul, KCUDA_F32},
    {"matmul_bf16", t_matmul, KCUDA_BF16},
    {"matmul_f16", t_matmul, KCUDA_F16},
    {"bias_backward_f32", t_bias_backward, KCUDA_F32},
    {"bias_backward_bf16", t_bias_backward, KCUDA_BF16},
    {"bias_backward_f16", t_bias_backward, KCUDA_F16},
    {"matmul_f32_dw_bf16", t_matmul_f32_dw, KCUDA_BF16},
    {"matmul_f32_dw_f16", t_matmul_f32_dw, KCUDA_F16},
    {"matmul_gelu_f32", t_matmul_gelu, KCUDA_F32},
    {"matmul_gelu_bf16", t_matmul_gelu, KCUDA_BF16},
    {"matmul_gelu_f16", t_matmul_gelu, KCUDA_F16},
    {"matmul_refused_bf16", t_matmul_refused, KCUDA_BF16},
    {"matmul_assign_f32", t_matmul_assign, KCUDA_F32},
    {"matmul_assign_bf16", t_matmul_assign, KCUDA_BF16},
    {"matmul_refused_f32", t_matmul_refused, KCUDA_F32},
    {"matmul_tuned_f32", t_matmul_tuned, KCUDA_F32},
    {"matmul_tuned_bf16", t_matmul_tuned, KCUDA_BF16},
    {"matmul_tuned_f16", t_matmul_tuned, KCUDA_F16},
    {"matmul_wt_f32", t_matmul_wt, KCUDA_F32},
    {"matmul_wt_bf16", t_matmul_wt, KCUDA_BF16},
    {"matmul_wt_f16", t_matmul_wt, KCUDA_F16},
    {"layernorm_f32", t_layernorm, KCUDA_F32},
    {"layernorm_bf16", t_layernorm, KCUDA_BF16},
    {"layernorm_f16", t_layernorm, KCUDA_F16},
    {"rmsnorm_f32", t_rmsnorm, KCUDA_F32},
    {"rmsnorm_bf16", t_rmsnorm, KCUDA_BF16},
    {"rmsnorm_f16", t_rmsnorm, KCUDA_F16},
    {"norm_f32_grads_bf16", t_norm_f32_grads, KCUDA_BF16},
    {"norm_f32_grads_f16", t_norm_f32_grads, KCUDA_F16},
    {"add_layernorm_f32", t_add_layernorm, KCUDA_F32},
    {"add_layernorm_bf16", t_add_layernorm, KCUDA_BF16},
    {"add_layernorm_f16", t_add_layernorm, KCUDA_F16},
    {"add_rmsnorm_f32", t_add_rmsnorm, KCUDA_F32},
    {"add_rmsnorm_bf16", t_add_rmsnorm, KCUDA_BF16},
    {"add_rmsnorm_f16", t_add_rmsnorm, KCUDA_F16},
    {"gelu_f32", t_gelu, KCUDA_F32},
    {"gelu_bf16", t_gelu, KCUDA_BF16},
    {"gelu_f16", t_gelu, KCUDA_F16},
    {"silu_f32", t_silu, KCUDA_F32},
    {"silu_bf16", t_silu, KCUDA_BF16},
    {"silu_f16", t_silu, KCUDA_F16},
    {"swiglu_f32", t_swiglu, KCUDA_F32},
    {"swiglu_bf16", t_swiglu, KCUDA_BF16},
    {"swiglu_f16", t_swiglu, KCUDA_F16},
    {"add_f32", t_add, KCUDA_F32},
    {"add_bf16", t_add, KCUDA_BF16},
    {"add_f16", t_add, KCUDA_F16},
    {"add_broadcast_f32_grads_bf16", t_bcast_f32_grads, KCUDA_BF16},
    {"add_broadcast_f32_grads_f16", t_bcast_f32_grads, KCUDA_F16},
    {"rope_f32", t_rope, KCUDA_F32},
    {"rope_bf16", t_rope, KCUDA_BF16},
    {"rope_f16", t_rope, KCUDA_F16},
    {"embedding_f32", t_embedding, KCUDA_F32},
    {"embedding_bf16", t_embedding, KCUDA_BF16},
    {"embedding_f16", t_embedding, KCUDA_F16},
    {"embedding_f32_grads_bf16", t_embedding_f32_grads, KCUDA_BF16},
    {"embedding_f32_grads_f16", t_embedding_f32_grads, KCUDA_F16},
    {"crossentropy_f32", t_crossentropy, KCUDA_F32},
    {"crossentropy_bf16", t_crossentropy, KCUDA_BF16},
    {"crossentropy_f16", t_crossentropy, KCUDA_F16},
    {"crossentropy_fused_f32", t_crossentropy_fused, KCUDA_F32},
    {"crossentropy_fused_bf16", t_crossentropy_fused, KCUDA_BF16},
    {"crossentropy_fused_f16", t_crossentropy_fused, KCUDA_F16},
    {"crossentropy_shard_f32", t_crossentropy_shard, KCUDA_F32},
    {"crossentropy_shard_bf16", t_crossentropy_shard, KCUDA_BF16},
    {"crossentropy_shard_f16", t_crossentropy_shard, KCUDA_F16},
    {"crossentropy_exchange", t_crossentropy_exchange, KCUDA_F32},
    {"adamw_f32", t_adamw, KCUDA_F32},
    {"adamw_bf16_grads", t_adamw, KCUDA_BF16},
    {"adamw_f16_grads", t_adamw, KCUDA_F16},
    {"adamw_f32_grads_bf16_weights", t_adamw_f32_grads, KCUDA_BF16},
    {"adamw_f32_grads_f16_weights", t_adamw_f32_grads, KCUDA_F16},
    {"global_norm_f32", t_global_norm, KCUDA_F32},
    {"global_norm_bf16", t_global_norm, KCUDA_BF16},
    {"global_norm_f16", t_global_norm, KCUDA_F16},
    {"attention_f32", t_attention, KCUDA_F32},
    {"attention_bf16", t_attention, KCUDA_BF16},
    {"attention_f16", t_attention, KCUDA_F16},
    {"attention_atomic_dq_bf16", t_attention_atomic_dq, KCUDA_BF16},
    {"attention_atomic_dq_f16", t_attention_atomic_dq, KCUDA_F16},
    {"attention_dq_turns_bf16", t_attention_dq_turns, KCUDA_BF16},
    {"attention_dq_turns_f16", t_attention_dq_turns, KCUDA_F16},
    {"attention_qkv_f32", t_attention_qkv, KCUDA_F32},
    {"attention_qkv_bf16", t_attention_qkv, KCUDA_BF16},
    {"attention_qkv_f16", t_attention_qkv, KCUDA_F16},
    {"attention_cudnn_bf16", t_attention_cudnn, KCUDA_BF16},
    {"attention_cudnn_f16", t_attention_cudnn, KCUDA_F16},
    {"moe_f32", t_moe, KCUDA_F32},
    {"moe_bf16", t_moe, KCUDA_BF16},
    {"moe_f16", t_moe, KCUDA_F16},
    {"sweep_f32", t_sweep, KCUDA_F32},
    {"sweep_bf16", t_sweep, KCUDA_BF16},
    {"sweep_f16", t_sweep, KCUDA_F16},
    /* (after the sweeps: their shapes are drawn from the same sequence) */
    {"matmul_tf32", t_matmul_tf32, KCUDA_F32},
    {"attention_tf32", t_attention_tf32, KCUDA_F32},
    {"sum_squares_many_f32", t_sum_squares_many, KCUDA_F32},
    {"sum_squares_many_bf16", t_sum_squares_many, KCUDA_BF16},
    {"sum_squares_many_f16", t_sum_squares_many, KCUDA_F16},
    {"adamw_many_f32", t_adamw_many, KCUDA_F32},
    {"adamw_many_bf16", t_adamw_many, KCUDA_BF16},
    {"adamw_many_f16", t_adamw_many, KCUDA_F16},
};

enum { NCASES = sizeof cases / sizeof cases[0] };

/* 1 when no filter is given or the name contains one of them. */
static int selected(const char *name, int argc, char **argv)
{
    if (argc < 2)
        return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i]))
            return 1;
    return 0;
}

/* 1 when the name contains one of GPU_TESTS_SKIP's words. */
static int skipped(const char *name)
{
    const char *s = getenv("GPU_TESTS_SKIP");
    char word[64];
    int len;
    while (s && sscanf(s, " %63s%n", word, &len) == 1) {
        if (strstr(name, word))
            return 1;
        s += len;
    }
    return 0;
}

int main(int argc, char **argv)
{
    char why[256];
    int passed = 0, failed = 0, n = 0, planned = 0;
    if (!kcuda_available(why, sizeof why)) {
        printf("SKIP gpu: no GPU (%s)\n", why);
        return 0;
    }
    if (kcuda_ctx_create(&ctx) != 0) {
        printf("not ok 1 - kcuda_ctx_create: %s\n# 0 passed, 1 failed\n",
               kcuda_last_error());
        return 1;
    }
    {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            printf("# device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major,
                   prop.minor, prop.multiProcessorCount);
    }
    kcpu_set_threads(1);
    /* (GPU_TESTS_AFTER: the cases up to it are not run, nor planned) */
    const char *after = getenv("GPU_TESTS_AFTER"), *crash = getenv("GPU_TESTS_ABORT");
    int first = 0;
    if (after && *after) {
        while (first < NCASES && strcmp(cases[first].name, after) != 0)
            first++;
        if (first == NCASES) {
            printf("GPU_TESTS_AFTER=%s: no case of that name\n# 0 passed, 1 failed\n", after);
            kcuda_ctx_free(ctx);
            return 2;
        }
        first++;
    }
    for (int i = first; i < NCASES; i++)
        planned += selected(cases[i].name, argc, argv);
    printf("1..%d\n", planned);
    for (int i = first; i < NCASES; i++) {
        if (!selected(cases[i].name, argc, argv))
            continue;
        n++;
        if (skipped(cases[i].name)) {
            printf("ok %d - %s # SKIP GPU_TESTS_SKIP\n", n, cases[i].name);
            passed++;
            continue;
        }
        printf("# case %s\n", cases[i].name);
        fflush(stdout);
        if (crash && strcmp(crash, cases[i].name) == 0)
            abort();
        cur_bad = 0;
        cur_err = 0.0;
        cur_floor = 0.0;
        cur_tol = tol_of(cases[i].dt);
        cases[i].fn(cases[i].dt);
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            fprintf(stderr, "# %s: %sthe device reports: %s\n",
                    cases[i].name, cur_shape, cudaGetErrorString(e));
            cur_bad = 1;
        }
        free_all();
        cur_shape[0] = 0;
        if (cur_bad)
            failed++;
        else
            passed++;
        printf("%sok %d - %s (err %.2g, tol %.0e)\n", cur_bad ? "not " : "", n,
               cases[i].name, cur_err, cur_tol);
        fflush(stdout);
        if (e != cudaSuccess) { /* a sticky error: later cases cannot run */
            printf("# stopped after %s: the device's error is sticky; %d cases not run\n",
                   cases[i].name, planned - n);
            break;
        }
    }
    kcuda_ctx_free(ctx);
    printf("# %d passed, %d failed\n", passed, failed + (planned - n));
    return failed || n < planned ? 1 : 0;
}
