/* CPU kernels, dense ops: test_kcpu_dense.c (one TEST(name) per line) */
