/*
 * gpu_tests_sweep.c: random shapes through the other files' case
 * shapes (matmul_case, norm_case, act_case, embed_case, ce_case,
 * attn_case), each named in cur_shape while it runs.
 */
#include <stdio.h>  /* defines: snprintf */
#include <stdlib.h> /* defines: getenv, atoi */

#include "gpu_tests.h"

/* ---- cases: random shapes ---------------------------------------------- */

/* A uniform integer in [lo, hi]. */
static int pick(int lo, int hi)
{
    return lo + irand(hi - lo + 1);
}

/* The fixed cases above pick their shapes; this one draws them, from the
 * tests' fixed seed (the same shapes every run): GPU_TESTS_SWEEP shapes
 * (default 30) of matmuls (plain, with the transposed weight, with bias
 * and GELU), norms (with the residual add), attention (packed or not,
 * grouped-query, causal or not, any head size up to 128), embeddings (a
 * vocabulary shard), cross-entropy (fused or not, padded vocabularies)
 * and the activations, each from 1 element up, checked as their cases
 * are. A failure names its shape. */
void t_sweep(kcuda_dtype dt)
{
    const char *env = getenv("GPU_TESTS_SWEEP");
    int n = env ? atoi(env) : 30;
    for (int i = 0; i < n && !cur_bad; i++) {
        int kind = i % 6;
        if (kind == 0) {
            int M = pick(1, 96), K = pick(1, 96), N = pick(1, 96);
            int wt = irand(2), bias = irand(2), gelu = !wt && irand(3) == 0;
            snprintf(cur_shape, sizeof cur_shape,
                     "matmul M %d K %d N %d%s%s%s: ", M, K, N,
                     wt ? " wt" : "", bias ? " bias" : "", gelu ? " gelu" : "");
            matmul_case(dt, M, K, N, wt, bias || gelu, gelu);
        } else if (kind == 1) {
            int rows = pick(1, 70), C = pick(1, 300), rms = irand(2);
            int add = irand(2);
            kcuda_dtype wdt = dt != KCUDA_F32 && irand(2) ? KCUDA_F32 : dt;
            snprintf(cur_shape, sizeof cur_shape, "norm rows %d C %d%s%s%s: ",
                     rows, C, rms ? " rms" : "", add ? " add" : "",
                     wdt != dt ? " fp32 dw" : "");
            norm_case(dt, wdt, rows, C, rms, add);
        } else if (kind == 2) {
            int KV = pick(1, 3), H = KV * pick(1, 3), B = pick(1, 2);
            int T = pick(1, 90), d = pick(1, 128), causal = irand(4) != 0;
            int packed = irand(2);
            snprintf(cur_shape, sizeof cur_shape,
                     "attention B %d T %d H %d KV %d d %d%s%s: ", B, T, H, KV,
                     d, causal ? " causal" : "", packed ? " packed" : "");
            attn_case(dt, B, T, H, KV, d, causal, packed);
        } else if (kind == 3) {
            int V = pick(1, 60), C = pick(1, 40), row0 = irand(V);
            int rows = pick(1, V - row0), tokens = pick(1, 200);
            snprintf(cur_shape, sizeof cur_shape,
                     "embedding n %d V %d C %d rows %d..%d: ", tokens, V, C,
                     row0, row0 + rows);
            embed_case(dt, dt, tokens, V, C, row0, rows);
        } else if (kind == 4) {
            int N = pick(1, 24), V = pick(1, 1200), Vp = V + irand(40);
            int fused = irand(2);
            snprintf(cur_shape, sizeof cur_shape,
                     "crossentropy N %d V %d Vp %d%s: ", N, V, Vp,
                     fused ? " fused" : "");
            ce_case(dt, N, V, Vp, fused, 0);
        } else {
            int act = irand(3), len = pick(1, 5000);
            snprintf(cur_shape, sizeof cur_shape, "%s n %d: ",
                     act == ACT_GELU ? "gelu" : act == ACT_SILU ? "silu"
                                                                : "swiglu",
                     len);
            act_case(dt, act, (size_t)len, 6.0f);
        }
        if (cudaDeviceSynchronize() != cudaSuccess)
            break; /* (main reports the device's error) */
        free_all();
    }
    if (!cur_bad)
        cur_shape[0] = 0;
}
