/*
 * gpu_tests.h: what the CUDA kernels' op tests share: the runner
 * (gpu_tests.c, whose head comment describes the program), the harness
 * (gpu_tests_harness.c: the case in hand, the buffers freed after each
 * case, random inputs, the checks against the CPU reference), and the
 * cases by kind of op (gpu_tests_matmul.c, _layers.c, _loss_adamw.c,
 * _attention.c, _moe.c, and _sweep.c, random shapes over the others'
 * shapes).
 */
#ifndef MESH_GPU_TESTS_H
#define MESH_GPU_TESTS_H

#include <stddef.h> /* defines: size_t */
#include <stdint.h> /* defines: int32_t */
#include <stdio.h>  /* defines: fprintf (KC) */

#include <cuda_runtime_api.h> /* defines: cudaError_t */

#include "kcpu.h"  /* defines: kcpu_* (the reference) */
#include "kcuda.h" /* defines: kcuda_* */

/* Each case's tolerance of the largest relative error (gpu_tests.c's head). */
#define TOL_F32 1e-5
#define TOL_BF16 2e-2
#define TOL_F16 5e-3 /* 3 more mantissa bits than bf16 */
#define TOL_TF32 TOL_F16 /* fp32 products of TF32 operands: fp16's mantissa */

/* Fail the case when a kcuda call returns non-zero (and leave it). */
#define KC(call)                                                               \
    do {                                                                       \
        int kc_rc_ = (call);                                                   \
        if (kc_rc_ != 0) {                                                     \
            fprintf(stderr, "# %s:%d: %s%s returned %d: %s\n", __FILE__,       \
                    __LINE__, cur_shape, #call, kc_rc_, kcuda_last_error());   \
            cur_bad = 1;                                                       \
            return;                                                            \
        }                                                                      \
    } while (0)

/* ---- the case in hand (gpu_tests_harness.c) ------------------------------ */

extern int cur_bad;         /* a check or a call failed */
extern double cur_err;      /* the largest error seen */
extern double cur_tol;      /* the case's tolerance */
extern double cur_floor;    /* rel_err's least magnitude: where a result is a
                             * cancellation (the attention's dq and dk at
                             * T 1 are 0 but for rounding), the scale of its
                             * terms, not of the noise left */
extern char cur_shape[160]; /* the sweep's shape in hand ("" elsewhere) */
extern kcuda_ctx *ctx;      /* one context for every case */

/* ---- the harness (gpu_tests_harness.c; each described there) ------------- */

double tol_of(kcuda_dtype dt);
kcpu_precision prec_of(kcuda_dtype dt);
void cuda_or_die(cudaError_t e, const char *what);
void *hmem(size_t bytes);
float *hf(size_t n);
void *dmem(size_t bytes);
void free_all(void);
float frand(void);
int irand(int n);
float *rnd(size_t n, float scale, kcuda_dtype dt);
void *up(const float *x, size_t n, kcuda_dtype dt);
void *up_i32(const int32_t *x, size_t n);
float *down(const void *d, size_t n, kcuda_dtype dt);
void *down_raw(const void *d, size_t bytes);
void note(double e);
void expect(const char *what, const float *got, const float *want, size_t n);
void expect_dev(const char *what, const void *d, const float *want, size_t n, kcuda_dtype dt);
void expect_bits(const char *what, const void *got, const void *want, size_t bytes);
void expect_ints(const char *what, const int *got, const int *want, size_t n);
void *snapshot(const void *d, size_t n, kcuda_dtype dt);
int emulated(void);

/* ---- what the cases' files share (each described where it is defined) ---- */

/* gpu_tests_matmul.c */
void matmul_case(kcuda_dtype dt, int M, int K, int N, int wt, int bias, int gelu);
void on_tf32(const char *what, void (*body)(kcuda_dtype));
/* gpu_tests_layers.c */
void norm_case(kcuda_dtype dt, kcuda_dtype wdt, int rows, int C, int rms, int add);
enum { ACT_GELU, ACT_SILU, ACT_SWIGLU }; /* act_case's kinds */
void act_case(kcuda_dtype dt, int kind, size_t n, float scale);
void embed_case(kcuda_dtype dt, kcuda_dtype tdt, int n, int V, int C, int row0, int rows);
/* gpu_tests_loss_adamw.c */
void ce_case(kcuda_dtype dt, int N, int V, int Vp, int fused, int ninf);
/* gpu_tests_attention.c */
void attn_case(kcuda_dtype dt, int B, int T, int H, int KV, int d, int causal, int packed);

/* ---- the cases (the runner's table, gpu_tests.c) ------------------------- */

/* gpu_tests_matmul.c */
void t_matmul(kcuda_dtype dt);
void t_bias_backward(kcuda_dtype dt);
void t_matmul_assign(kcuda_dtype dt);
void t_matmul_f32_dw(kcuda_dtype dt);
void t_matmul_gelu(kcuda_dtype dt);
void t_matmul_tf32(kcuda_dtype dt);
void t_matmul_refused(kcuda_dtype dt);
void t_matmul_tuned(kcuda_dtype dt);
void t_matmul_wt(kcuda_dtype dt);
/* gpu_tests_layers.c */
void t_layernorm(kcuda_dtype dt);
void t_rmsnorm(kcuda_dtype dt);
void t_norm_f32_grads(kcuda_dtype dt);
void t_add_layernorm(kcuda_dtype dt);
void t_add_rmsnorm(kcuda_dtype dt);
void t_gelu(kcuda_dtype dt);
void t_silu(kcuda_dtype dt);
void t_swiglu(kcuda_dtype dt);
void t_add(kcuda_dtype dt);
void t_bcast_f32_grads(kcuda_dtype dt);
void t_rope(kcuda_dtype dt);
void t_embedding_f32_grads(kcuda_dtype dt);
void t_embedding(kcuda_dtype dt);
void t_convert(kcuda_dtype dt);
void t_arange(kcuda_dtype dt);
/* gpu_tests_loss_adamw.c */
void t_crossentropy(kcuda_dtype dt);
void t_crossentropy_fused(kcuda_dtype dt);
void t_crossentropy_shard(kcuda_dtype dt);
void t_crossentropy_exchange(kcuda_dtype dt);
void t_adamw(kcuda_dtype dt);
void t_adamw_f32_grads(kcuda_dtype dt);
void t_global_norm(kcuda_dtype dt);
void t_sum_squares_many(kcuda_dtype dt);
void t_adamw_many(kcuda_dtype dt);
/* gpu_tests_attention.c */
void t_attention(kcuda_dtype dt);
void t_attention_atomic_dq(kcuda_dtype dt);
void t_attention_dq_turns(kcuda_dtype dt);
void t_attention_qkv(kcuda_dtype dt);
void t_attention_tf32(kcuda_dtype dt);
void t_attention_cudnn(kcuda_dtype dt);
/* gpu_tests_moe.c */
void t_moe(kcuda_dtype dt);
/* gpu_tests_sweep.c */
void t_sweep(kcuda_dtype dt);

#endif
