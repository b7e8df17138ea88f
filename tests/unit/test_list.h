/*
 * test_list.h: every unit test, one TEST(name) line each, in run order.
 *
 * No include guard: unit.h includes it to declare test_<name>, runner.c to
 * build the table. A test is written as TEST_IMPL(name) { ... } in
 * tests/unit/test_<area>.c; the Makefile links every tests/unit/test_*.c.
 */

/* runtime: test_runtime.c */
TEST(version_matches_header)
TEST(status_codes_are_stable)
TEST(status_str_names_each_code)
TEST(status_str_unknown_code)
TEST(alloc_default_roundtrip)
