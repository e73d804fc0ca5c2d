// Element types: the 12 dtypes sharded tensors support, their sizes and
// names, and the 16-bit floating-point formats (IEEE half and bfloat16).
//
// Everything here is a pure function of its arguments and thread-safe.
#ifndef TESSERA_COMMON_DTYPE_H_
#define TESSERA_COMMON_DTYPE_H_

#include <complex>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kComplex64,
  kComplex128,
  kFloat16,
  kBFloat16,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
};

// Every dtype, in the order above (the reference test's order).
inline constexpr DType kAllDTypes[] = {
    DType::kFloat32, DType::kFloat64,  DType::kComplex64, DType::kComplex128,
    DType::kFloat16, DType::kBFloat16, DType::kUInt8,     DType::kInt8,
    DType::kInt16,   DType::kInt32,    DType::kInt64,     DType::kBool,
};

// Bytes per element.
size_t ElementSize(DType dtype);
// Canonical name without the "torch." prefix: "float32", "bfloat16", ...
absl::string_view DTypeName(DType dtype);
std::ostream& operator<<(std::ostream& os, DType dtype);
// Parses a canonical name, a PyTorch alias ("float", "double", "half",
// "cfloat", "cdouble", "short", "int", "long") or either with a "torch."
// prefix. INVALID_ARGUMENT naming the string otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

bool IsFloatingPoint(DType dtype);  // float16/32/64 and bfloat16.
bool IsComplex(DType dtype);

// IEEE 754 binary16, stored as its bit pattern.
struct Half {
  uint16_t bits = 0;
};
// bfloat16: the upper 16 bits of a float32, stored as its bit pattern.
struct BFloat16 {
  uint16_t bits = 0;
};

// Conversions round to nearest, ties to even, as CUDA's __float2half_rn and
// PyTorch's c10::BFloat16 do; overflow gives infinity and NaN stays NaN.
Half FloatToHalf(float value);
float HalfToFloat(Half value);
BFloat16 FloatToBFloat16(float value);
float BFloat16ToFloat(BFloat16 value);

// Maps a C++ element type to its DType: DTypeOf<float>::value.
template <typename T>
struct DTypeOf;
#define TESSERA_DTYPE_OF_(type, dtype)           \
  template <>                                    \
  struct DTypeOf<type> {                         \
    static constexpr DType value = DType::dtype; \
  }
TESSERA_DTYPE_OF_(float, kFloat32);
TESSERA_DTYPE_OF_(double, kFloat64);
TESSERA_DTYPE_OF_(std::complex<float>, kComplex64);
TESSERA_DTYPE_OF_(std::complex<double>, kComplex128);
TESSERA_DTYPE_OF_(Half, kFloat16);
TESSERA_DTYPE_OF_(BFloat16, kBFloat16);
TESSERA_DTYPE_OF_(uint8_t, kUInt8);
TESSERA_DTYPE_OF_(int8_t, kInt8);
TESSERA_DTYPE_OF_(int16_t, kInt16);
TESSERA_DTYPE_OF_(int32_t, kInt32);
TESSERA_DTYPE_OF_(int64_t, kInt64);
TESSERA_DTYPE_OF_(bool, kBool);
#undef TESSERA_DTYPE_OF_

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with the C++ element type T of `dtype` and returns
// its result; lets typed loops be written once for all 12 dtypes.
template <typename Fn>
decltype(auto) DispatchDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(TypeTag<float>{});
    case DType::kFloat64:
      return fn(TypeTag<double>{});
    case DType::kComplex64:
      return fn(TypeTag<std::complex<float>>{});
    case DType::kComplex128:
      return fn(TypeTag<std::complex<double>>{});
    case DType::kFloat16:
      return fn(TypeTag<Half>{});
    case DType::kBFloat16:
      return fn(TypeTag<BFloat16>{});
    case DType::kUInt8:
      return fn(TypeTag<uint8_t>{});
    case DType::kInt8:
      return fn(TypeTag<int8_t>{});
    case DType::kInt16:
      return fn(TypeTag<int16_t>{});
    case DType::kInt32:
      return fn(TypeTag<int32_t>{});
    case DType::kInt64:
      return fn(TypeTag<int64_t>{});
    case DType::kBool:
      break;
  }
  return fn(TypeTag<bool>{});
}

// Converts a double to element type T (real part for complex types, != 0
// for bool), and back (real part).
template <typename T>
T FromDouble(double value) {
  if constexpr (std::is_same_v<T, Half>) {
    return FloatToHalf(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return FloatToBFloat16(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, bool>) {
    return value != 0;
  } else if constexpr (std::is_same_v<T, std::complex<float>>) {
    return T(static_cast<float>(value), 0.0f);
  } else if constexpr (std::is_same_v<T, std::complex<double>>) {
    return T(value, 0.0);
  } else if constexpr (std::is_integral_v<T>) {
    // Through int64, so that a negative value wraps into an unsigned type;
    // a value int64 cannot hold is undefined (Tensor::Full refuses it).
    return static_cast<T>(static_cast<int64_t>(value));
  } else {
    return static_cast<T>(value);
  }
}

template <typename T>
double ToDouble(T value) {
  if constexpr (std::is_same_v<T, Half>) {
    return HalfToFloat(value);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16ToFloat(value);
  } else if constexpr (std::is_same_v<T, std::complex<float>> ||
                       std::is_same_v<T, std::complex<double>>) {
    return value.real();
  } else {
    return static_cast<double>(value);
  }
}

}  // namespace tessera

#endif  // TESSERA_COMMON_DTYPE_H_
