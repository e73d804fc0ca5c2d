// Tensor names (common/tensor_name.h): the rule, and how any string given
// as a name is shown in messages: whole when it could be a name, its first
// bytes and its length when not; lists cut to their first few.
#include "common/tensor_name.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/repeated_field.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(TensorNameTest, ValidNamesPassAndOthersAreNamedShort) {
  for (const std::string& name :
       {std::string("w"), std::string("layer.0_attn-qkv"),
        std::string(kMaxTensorNameLength, 'x')}) {
    EXPECT_THAT(ValidateTensorName(name), IsOk()) << name;
  }
  for (const std::string& name :
       {std::string(), std::string("a b"), std::string("a/b"),
        std::string("\xff"), std::string(kMaxTensorNameLength + 1, 'x')}) {
    EXPECT_THAT(ValidateTensorName(name),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("a name is 1 to 128 characters")))
        << name;
  }
  // Bytes that are no text are escaped; a huge name is shown by its start.
  EXPECT_THAT(
      ValidateTensorName("a\nb"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"a\\nb\"")));
  const absl::Status huge = ValidateTensorName(std::string(1 << 20, 'n'));
  EXPECT_LT(huge.message().size(), 256u);
  EXPECT_THAT(
      huge, StatusIs(absl::StatusCode::kInvalidArgument,
                     HasSubstr(std::string(64, 'n') + "...(1048576 bytes)\"")));
}

TEST(TensorNameTest, ShownNameKeepsAnythingANameCanBe) {
  EXPECT_EQ(ShownName(""), "");
  EXPECT_EQ(ShownName("w"), "w");
  const std::string longest(kMaxTensorNameLength, 'x');
  EXPECT_EQ(ShownName(longest), longest);
  EXPECT_EQ(ShownName(longest + "y"), std::string(64, 'x') + "...(129 bytes)");
}

TEST(TensorNameTest, ShownTextCutsAnyTextPastItsLongest) {
  EXPECT_EQ(ShownText("ckpt/a", 4096, 256), "ckpt/a");
  EXPECT_EQ(ShownText(std::string(4097, 'p'), 4096, 3), "ppp...(4097 bytes)");
}

TEST(TensorNameTest, ShownNamesCutsTheListAndEachName) {
  EXPECT_EQ(ShownNames(std::vector<std::string>{}), "");
  EXPECT_EQ(ShownNames(std::vector<std::string>{"a", "b"}), "a, b");
  EXPECT_EQ(ShownNames(std::vector<std::string>{"a", "b", "c", "d", "e"}),
            "a, b, c and 2 more");
  EXPECT_EQ(ShownNames(std::vector<std::string>{"a", "b", "c"}, ","), "a,b,c");
  EXPECT_EQ(ShownNames(std::vector<std::string>{"a", "b"}, ",", 1),
            "a and 1 more");
  // A protobuf repeated field, as a request's names arrive.
  google::protobuf::RepeatedPtrField<std::string> names;
  for (int i = 0; i < 10000; ++i) *names.Add() = std::string(1 << 10, 'z');
  const std::string shown = ShownNames(names, ",");
  EXPECT_LT(shown.size(), 300u);
  EXPECT_THAT(shown, HasSubstr("...(1024 bytes) and 9997 more"));
  EXPECT_THAT(shown, Not(HasSubstr(std::string(65, 'z'))));
}

}  // namespace
}  // namespace tessera
