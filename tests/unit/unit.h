/*
 * unit.h: declarations and typed asserts for the unit tests.
 *
 * Each test runs in its own child process (see runner.c), so a failed assert
 * just reports and exits: the runner prints `not ok` and moves on. Asserts
 * are typed and print both operands, like libuv's ASSERT_EQ.
 */
#ifndef MESH_UNIT_H
#define MESH_UNIT_H

#include <stdint.h> /* defines: intmax_t, uintmax_t */
#include <string.h> /* defines: strcmp */

#define TEST_IMPL(name) void test_##name(void)

#define TEST(name) TEST_IMPL(name);
#include "test_list.h"
#undef TEST

/* Report a failed assert (prefixed "# file:line: ") and end the test. */
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 3, 4)))
#endif
void unit_fail(const char *file, int line, const char *fmt, ...);

#define UNIT_CMP_(type, fmt, a, op, b)                                      \
    do {                                                                    \
        type unit_a_ = (type)(a);                                           \
        type unit_b_ = (type)(b);                                           \
        if (!(unit_a_ op unit_b_))                                          \
            unit_fail(__FILE__, __LINE__, "%s %s %s: " fmt " vs " fmt, #a,  \
                      #op, #b, unit_a_, unit_b_);                           \
    } while (0)

/* Signed integers (and enums), compared as intmax_t. */
#define ASSERT_INT_EQ(a, b) UNIT_CMP_(intmax_t, "%jd", a, ==, b)
#define ASSERT_INT_NE(a, b) UNIT_CMP_(intmax_t, "%jd", a, !=, b)
#define ASSERT_INT_LT(a, b) UNIT_CMP_(intmax_t, "%jd", a, <, b)
#define ASSERT_INT_GE(a, b) UNIT_CMP_(intmax_t, "%jd", a, >=, b)
/* Sizes and other unsigned integers, compared as uintmax_t. */
#define ASSERT_UINT_EQ(a, b) UNIT_CMP_(uintmax_t, "%ju", a, ==, b)
/* Pointers by address. */
#define ASSERT_PTR_EQ(a, b) UNIT_CMP_(const void *, "%p", a, ==, b)
#define ASSERT_NULL(a) ASSERT_PTR_EQ(a, NULL)
#define ASSERT_NOT_NULL(a) UNIT_CMP_(const void *, "%p", a, !=, NULL)

/* NUL-terminated strings by content; NULL equals only NULL. */
#define ASSERT_STR_EQ(a, b)                                                 \
    do {                                                                    \
        const char *unit_a_ = (a);                                          \
        const char *unit_b_ = (b);                                          \
        if (unit_a_ != unit_b_ &&                                           \
            (!unit_a_ || !unit_b_ || strcmp(unit_a_, unit_b_) != 0))        \
            unit_fail(__FILE__, __LINE__, "%s == %s: \"%s\" vs \"%s\"", #a, \
                      #b, unit_a_ ? unit_a_ : "(null)",                     \
                      unit_b_ ? unit_b_ : "(null)");                        \
    } while (0)
#define ASSERT_STR_NE(a, b)                                                 \
    do {                                                                    \
        const char *unit_a_ = (a);                                          \
        const char *unit_b_ = (b);                                          \
        if (unit_a_ == unit_b_ ||                                           \
            (unit_a_ && unit_b_ && strcmp(unit_a_, unit_b_) == 0))          \
            unit_fail(__FILE__, __LINE__, "%s != %s: \"%s\" vs \"%s\"", #a, \
                      #b, unit_a_ ? unit_a_ : "(null)",                     \
                      unit_b_ ? unit_b_ : "(null)");                        \
    } while (0)

#endif /* MESH_UNIT_H */
