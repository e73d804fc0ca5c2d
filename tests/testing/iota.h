// A float32 matrix holding its row-major index, and the check that a
// tensor is a box of one: the end-to-end tests write one and read boxes
// back through every path. IotaInt64: an int64 tensor of any sizes, for
// the transport tests.
#ifndef TESSERA_TESTS_TESTING_IOTA_H_
#define TESSERA_TESTS_TESTING_IOTA_H_

#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {

// rows x cols float32 holding its row-major index (exact in float32).
inline Tensor Iota(int64_t rows, int64_t cols) {
  std::vector<float> values(rows * cols);
  std::iota(values.begin(), values.end(), 0.0f);
  return *Tensor::FromVector<float>(values, {rows, cols});
}

// An int64 tensor with element i = base + i (host memory; shared when
// host memory sharing is on and it is large enough).
inline Tensor IotaInt64(const std::vector<int64_t>& sizes, int64_t base = 0) {
  absl::StatusOr<Tensor> tensor =
      Tensor::Empty(sizes, TensorOptions().WithDType(DType::kInt64));
  EXPECT_OK(tensor.status());
  for (int64_t i = 0; i < tensor->numel(); ++i) {
    tensor->data<int64_t>()[i] = base + i;
  }
  return *tensor;
}

// Checks that `t` (contiguous, on any device) is the box
// [r0, r0 + rows) x [c0, c0 + cols) of Iota(*, cols_all).
inline void ExpectIotaBox(const Tensor& t, int64_t r0, int64_t c0,
                          int64_t cols_all) {
  ASSERT_EQ(t.dim(), 2);
  ASSERT_TRUE(t.is_contiguous());
  ASSERT_OK_AND_ASSIGN(const Tensor host, t.To(Device::Cpu()));
  const float* v = host.data<float>();
  for (int64_t r = 0; r < host.sizes()[0]; ++r) {
    for (int64_t c = 0; c < host.sizes()[1]; ++c) {
      ASSERT_EQ(v[r * host.sizes()[1] + c],
                static_cast<float>((r0 + r) * cols_all + c0 + c))
          << "at " << r << ", " << c;
    }
  }
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_IOTA_H_
