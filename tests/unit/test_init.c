/*
 * test_init.c: deterministic initialisation (runtime/init.c): the
 * generator against published Philox-4x32-10 test vectors, independence
 * from how a parameter is sliced, and the distribution.
 */
#include <math.h>   /* sqrt */
#include <string.h> /* memcmp */

#include "init.h" /* defines: mesh__init_* */
#include "unit.h" /* defines: TEST_IMPL, ASSERT_* */

/* Random123's known-answer vectors for philox4x32_10 (kat_vectors):
 * counter 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8; all-ones ->
 * 408f276d 41c83b0e a20bc7c6 6d5451fd. Our counter holds words 0-1 of the
 * 128-bit counter (2 and 3 are zero), so the zero vector applies directly. */
TEST_IMPL(init_philox_known_answer)
{
    uint32_t o[4];
    mesh__philox(o, 0, 0);
    ASSERT_UINT_EQ(o[0], 0x6627e8d5u);
    ASSERT_UINT_EQ(o[1], 0xe169c58du);
    ASSERT_UINT_EQ(o[2], 0xbc57ac4cu);
    ASSERT_UINT_EQ(o[3], 0x9b00dbd8u);
}

/* Any slice equals the same elements of the whole: sharding-independent. */
TEST_IMPL(init_slices_match_the_whole)
{
    enum { N = 1000 };
    static float whole[N], part[N];
    uint64_t key = mesh__init_key(1337, "h.3.gpt2_block.w_qkv");
    mesh__init_normal(whole, N, 0, key, 0.02f);
    for (size_t first = 0; first < N; first += 137) {
        size_t n = N - first < 137 ? N - first : 137;
        mesh__init_normal(part, n, first, key, 0.02f);
        ASSERT_INT_EQ(memcmp(part, whole + first, n * sizeof *part), 0);
    }
    /* another name or seed gives other values */
    mesh__init_normal(part, N, 0, mesh__init_key(1337, "h.3.gpt2_block.w_o"), 0.02f);
    ASSERT_INT_NE(memcmp(part, whole, N * sizeof *part), 0);
    mesh__init_normal(part, N, 0, mesh__init_key(1338, "h.3.gpt2_block.w_qkv"), 0.02f);
    ASSERT_INT_NE(memcmp(part, whole, N * sizeof *part), 0);
}

/* Mean 0 and standard deviation std, to sampling accuracy. */
TEST_IMPL(init_normal_moments)
{
    enum { N = 200000 };
    static float x[N];
    mesh__init_normal(x, N, 0, mesh__init_key(42, "w"), 0.02f);
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    double mean = s / N, sd = sqrt(s2 / N - mean * mean);
    ASSERT_INT_LT((long long)(fabs(mean) * 1e6), (long long)(4 * 0.02 / sqrt(N) * 1e6)); /* 4 sigma */
    ASSERT_INT_LT((long long)(fabs(sd - 0.02) * 1e6), (long long)(0.02 * 0.01 * 1e6));   /* 1% */
}
