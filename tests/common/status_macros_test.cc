#include "common/status_macros.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::Eq;

absl::StatusOr<int> HalfOf(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, HalfOf(x));
  ASSIGN_OR_RETURN(int quarter, HalfOf(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(HalfOf(x));
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagatesErrorsAndValues) {
  EXPECT_THAT(Quarter(8), IsOk());
  EXPECT_EQ(2, *Quarter(8));
  EXPECT_THAT(Quarter(6),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("odd")));
  EXPECT_THAT(CheckEven(4), IsOk());
  EXPECT_THAT(CheckEven(3),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("odd")));
}

}  // namespace
}  // namespace tessera
