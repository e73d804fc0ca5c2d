// Test tensors whose bytes differ from element to element and from seed to
// seed, and their row-major bytes: the transport tests send one and compare
// what arrives byte for byte.
#ifndef TESSERA_TESTS_TESTING_FILLED_H_
#define TESSERA_TESTS_TESTING_FILLED_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera::testing {

// A tensor of `sizes` and `dtype` filled from an xorshift stream of `seed`;
// bool elements hold 0/1 only.
inline Tensor Filled(std::vector<int64_t> sizes, DType dtype,
                     uint64_t seed = 7) {
  absl::StatusOr<Tensor> tensor =
      Tensor::Empty(std::move(sizes), TensorOptions().WithDType(dtype));
  EXPECT_OK(tensor.status());
  auto* out = static_cast<uint8_t*>(tensor->data_ptr());
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < tensor->nbytes(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = dtype == DType::kBool ? (x & 1) : static_cast<uint8_t>(x >> 32);
  }
  return *tensor;
}

// The bytes of `tensor` in row-major order.
inline std::string RowMajorBytes(const Tensor& tensor) {
  absl::StatusOr<Tensor> contiguous = tensor.Contiguous();
  EXPECT_OK(contiguous.status());
  return std::string(static_cast<const char*>(contiguous->data_ptr()),
                     contiguous->nbytes());
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_FILLED_H_
