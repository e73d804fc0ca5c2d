// GoogleTest matchers for absl::Status and absl::StatusOr (Abseil 20220623
// ships none):
//   EXPECT_THAT(status, IsOk());
//   EXPECT_THAT(status_or, StatusIs(absl::StatusCode::kInvalidArgument,
//                                   HasSubstr("overlap")));
//   ASSERT_OK_AND_ASSIGN(auto value, MakeValue());
#ifndef TESSERA_TESTS_TESTING_STATUS_MATCHERS_H_
#define TESSERA_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::testing {

using ::tessera::internal_status::GetStatus;

MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  if (!status.ok()) *result_listener << "status is " << status;
  return status.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

// For an absl::StatusOr<T>: OK, and its value matches `value_matcher`.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace tessera::testing

#define TESSERA_TEST_CONCAT_INNER_(a, b) a##b
#define TESSERA_TEST_CONCAT_(a, b) TESSERA_TEST_CONCAT_INNER_(a, b)
#define TESSERA_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                       \
  ASSERT_TRUE(tmp.ok()) << tmp.status();                   \
  lhs = std::move(tmp).value()
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  TESSERA_ASSERT_OK_AND_ASSIGN_IMPL_(   \
      TESSERA_TEST_CONCAT_(tessera_test_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK(expr) ASSERT_THAT(expr, ::tessera::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT(expr, ::tessera::testing::IsOk())

#endif  // TESSERA_TESTS_TESTING_STATUS_MATCHERS_H_
