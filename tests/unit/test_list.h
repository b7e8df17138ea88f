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

/* front end: test_lang.c */
TEST(arena_alloc_zeroed_and_aligned)
TEST(diag_caret_under_utf8_and_tabs)
TEST(diag_long_line_window)
TEST(diag_dedup_with_notes)
TEST(diag_stops_after_limit)
TEST(suggest_close_names_only)
TEST(frontend_checks_buffer)
TEST(frontend_set_is_checked)
TEST(frontend_reports_every_error)
TEST(frontend_refuses_huge_buffer)
