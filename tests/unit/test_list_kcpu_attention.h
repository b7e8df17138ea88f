/* CPU kernels, attention, rope and moe: test_kcpu_attention.c (one TEST(name) per line) */
