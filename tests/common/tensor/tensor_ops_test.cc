// Dense kernels against values worked out by hand.
#include "common/tensor/tensor_ops.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;
using Sizes = std::vector<int64_t>;

template <typename T>
Tensor Make(std::vector<T> values, Sizes sizes) {
  auto t = Tensor::FromVector<T>(values, sizes);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Tensor();
}

template <typename T>
void ExpectNear(const Tensor& expected, const Tensor& actual) {
  ASSERT_EQ(expected.dtype(), actual.dtype());
  ASSERT_EQ(expected.sizes(), actual.sizes());
  ASSERT_OK_AND_ASSIGN(Tensor a, actual.Contiguous());
  for (int64_t i = 0; i < expected.numel(); ++i) {
    EXPECT_NEAR(expected.data<T>()[i], a.data<T>()[i], 1e-6) << "at " << i;
  }
}

TEST(AsinTest, Float32AndFloat64) {
  const double pi = std::acos(-1.0);
  ASSERT_OK_AND_ASSIGN(Tensor f, Asin(Make<float>({0, 0.5f, -1, 1}, {2, 2})));
  ExpectNear<float>(
      Make<float>({0, float(pi / 6), float(-pi / 2), float(pi / 2)}, {2, 2}),
      f);
  ASSERT_OK_AND_ASSIGN(Tensor d, Asin(Make<double>({0.5, -0.5}, {2})));
  ExpectNear<double>(Make<double>({pi / 6, -pi / 6}, {2}), d);
}

TEST(AsinTest, NonContiguousInput) {
  // [[0, 1], [0.5, -1]] transposed is [[0, 0.5], [1, -1]].
  ASSERT_OK_AND_ASSIGN(Tensor t,
                       Make<double>({0, 1, 0.5, -1}, {2, 2}).Transpose(0, 1));
  ASSERT_OK_AND_ASSIGN(Tensor out, Asin(t));
  const double pi = std::acos(-1.0);
  ExpectNear<double>(Make<double>({0, pi / 6, pi / 2, -pi / 2}, {2, 2}), out);
}

TEST(AsinTest, OtherDTypesAreUnimplemented) {
  EXPECT_THAT(Asin(Make<int64_t>({1, 2}, {2})),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("asin: not implemented for int64")));
}

TEST(LinearTest, WithAndWithoutBias) {
  const Tensor x = Make<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor w = Make<float>({1, 0, -1, 2, 1, 0}, {2, 3});
  // x . w^T = [[1 - 3, 2 + 2], [4 - 6, 8 + 5]].
  ASSERT_OK_AND_ASSIGN(Tensor y, Linear(x, w));
  EXPECT_TRUE(Equal(Make<float>({-2, 4, -2, 13}, {2, 2}), y));
  ASSERT_OK_AND_ASSIGN(y, Linear(x, w, Make<float>({10, 20}, {2})));
  EXPECT_TRUE(Equal(Make<float>({8, 24, 8, 33}, {2, 2}), y));
}

TEST(LinearTest, LeadingDimensionsAndFloat64) {
  const Tensor x = Make<double>({1, 2, 3, 4, 5, 6}, {2, 1, 3});
  const Tensor w = Make<double>({1, 0, -1, 2, 1, 0}, {2, 3});
  ASSERT_OK_AND_ASSIGN(Tensor y, Linear(x, w, Make<double>({0.5, 0.25}, {2})));
  EXPECT_TRUE(Equal(Make<double>({-1.5, 4.25, -1.5, 13.25}, {2, 1, 2}), y));
}

TEST(LinearTest, Errors) {
  ASSERT_OK_AND_ASSIGN(Tensor x, Tensor::Zeros({15, 31}));
  ASSERT_OK_AND_ASSIGN(Tensor w, Tensor::Zeros({16, 32}));
  EXPECT_THAT(Linear(x, w),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mat1 and mat2 shapes cannot be multiplied "
                                 "(15x31 and 32x16)")));
  ASSERT_OK_AND_ASSIGN(
      Tensor w64,
      Tensor::Zeros({16, 31}, TensorOptions().WithDType(DType::kFloat64)));
  EXPECT_THAT(Linear(x, w64), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("same dtype")));
  ASSERT_OK_AND_ASSIGN(Tensor w31, Tensor::Zeros({16, 31}));
  ASSERT_OK_AND_ASSIGN(Tensor bad_bias, Tensor::Zeros({15}));
  EXPECT_THAT(Linear(x, w31, bad_bias),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bias has size [15], but should be [16]")));
}

TEST(EmbeddingBagTest, SumsEachBag) {
  const Tensor w = Make<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  // Bags {0, 2}, {3, 3}, {1, 0}.
  ASSERT_OK_AND_ASSIGN(
      Tensor out, EmbeddingBag(Make<int64_t>({0, 2, 3, 3, 1, 0}, {3, 2}), w));
  EXPECT_TRUE(Equal(Make<float>({6, 8, 14, 16, 4, 6}, {3, 2}), out));
  ASSERT_OK_AND_ASSIGN(
      out, EmbeddingBag(Make<int32_t>({0, 2, 3, 3, 1, 0}, {3, 2}), w, "sum"));
  EXPECT_TRUE(Equal(Make<float>({6, 8, 14, 16, 4, 6}, {3, 2}), out));
}

TEST(EmbeddingBagTest, RowsOfAShardSkipOtherIndices) {
  // Rows 2 and 3 of the table above.
  const Tensor rows = Make<double>({5, 6, 7, 8}, {2, 2});
  ASSERT_OK_AND_ASSIGN(
      Tensor out,
      EmbeddingBagRows(Make<int64_t>({0, 2, 3, 3, 1, 0}, {3, 2}), rows, 2));
  EXPECT_TRUE(Equal(Make<double>({5, 6, 14, 16, 0, 0}, {3, 2}), out));
}

TEST(EmbeddingBagTest, Errors) {
  const Tensor w = Make<float>({1, 2, 3, 4}, {2, 2});
  EXPECT_THAT(EmbeddingBag(Make<int64_t>({0, 2}, {1, 2}), w),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("index out of range in self")));
  EXPECT_THAT(EmbeddingBag(Make<int64_t>({-1, 0}, {1, 2}), w),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("index out of range in self")));
  const Tensor bags = Make<int64_t>({0, 1}, {1, 2});
  EXPECT_THAT(EmbeddingBag(bags, w, "mean"),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("mean")));
  EXPECT_THAT(EmbeddingBag(bags, w, "avg"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mode has to be one of sum, mean or max")));
  EXPECT_THAT(EmbeddingBag(Make<int64_t>({0, 1}, {2}), w),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("offsets")));
  EXPECT_THAT(EmbeddingBag(Make<float>({0, 1}, {1, 2}), w),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("int64 or int32")));
}

TEST(CheckArgsTest, AgainstAWeightShapeOnly) {
  ASSERT_OK_AND_ASSIGN(Tensor x, Tensor::Zeros({15, 31}));
  EXPECT_OK(CheckLinearArgs(x, {16, 31}, DType::kFloat32, Tensor()));
  EXPECT_THAT(CheckLinearArgs(x, {16, 32}, DType::kFloat32, Tensor()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("(15x31 and 32x16)")));
  EXPECT_THAT(
      CheckLinearArgs(x, {16, 31}, DType::kFloat64, Tensor()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same dtype")));
  const Tensor bags = Make<int64_t>({0, 5}, {1, 2});
  EXPECT_OK(CheckEmbeddingBagArgs(bags, {6, 2}, DType::kFloat32, "sum"));
  EXPECT_THAT(CheckEmbeddingBagArgs(bags, {5, 2}, DType::kFloat32, "sum"),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("index out of range in self")));
  EXPECT_THAT(CheckEmbeddingBagArgs(bags, {6, 2}, DType::kInt64, "sum"),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("not implemented for int64")));
}

TEST(CatTest, AlongEitherDimension) {
  const Tensor a = Make<int64_t>({1, 2}, {1, 2});
  const Tensor b = Make<int64_t>({3, 4, 5, 6}, {2, 2});
  ASSERT_OK_AND_ASSIGN(Tensor rows, Cat({a, b}));
  EXPECT_TRUE(Equal(Make<int64_t>({1, 2, 3, 4, 5, 6}, {3, 2}), rows));
  ASSERT_OK_AND_ASSIGN(Tensor bt, b.T());
  ASSERT_OK_AND_ASSIGN(Tensor at, a.T());
  // [[1], [2]] next to [[3, 5], [4, 6]].
  ASSERT_OK_AND_ASSIGN(Tensor cols, Cat({at, bt}, -1));
  EXPECT_TRUE(Equal(Make<int64_t>({1, 3, 5, 2, 4, 6}, {2, 3}), cols));
}

TEST(CatTest, Errors) {
  EXPECT_THAT(Cat({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("expected a non-empty list")));
  const Tensor a = Make<float>({1, 2}, {1, 2});
  const Tensor b = Make<float>({3, 4, 5, 6}, {2, 2});
  EXPECT_THAT(Cat({a, b}, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Sizes of tensors must match except in "
                                 "dimension 1. Expected size 1 but got size "
                                 "2 for tensor number 1 in the list.")));
  EXPECT_THAT(
      Cat({a, Make<double>({1, 2}, {1, 2})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same dtype")));
}

TEST(SumTest, AddsInOrder) {
  const Tensor a = Make<float>({1, 2}, {2});
  ASSERT_OK_AND_ASSIGN(
      Tensor out, Sum({a, Make<float>({3, 4}, {2}), Make<float>({5, 6}, {2})}));
  EXPECT_TRUE(Equal(Make<float>({9, 12}, {2}), out));
  // The first operand is not written.
  EXPECT_TRUE(Equal(Make<float>({1, 2}, {2}), a));
  EXPECT_THAT(
      Sum({a, Make<float>({1, 2, 3}, {3})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sizes differ")));
}

}  // namespace
}  // namespace tessera
