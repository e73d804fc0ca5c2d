// A float32 matrix holding its row-major index, and the check that a
// tensor is a box of one: the end-to-end tests write one and read boxes
// back through every path.
#ifndef TESSERA_TESTS_TESTING_IOTA_H_
#define TESSERA_TESTS_TESTING_IOTA_H_

#include <cstdint>
#include <numeric>
#include <vector>

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
