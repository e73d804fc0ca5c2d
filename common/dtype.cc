#include "common/dtype.h"

#include <cmath>

#include "absl/base/casts.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tessera {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  absl::string_view name;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kFloat32, 4, "float32"},     {DType::kFloat64, 8, "float64"},
    {DType::kComplex64, 8, "complex64"}, {DType::kComplex128, 16, "complex128"},
    {DType::kFloat16, 2, "float16"},     {DType::kBFloat16, 2, "bfloat16"},
    {DType::kUInt8, 1, "uint8"},         {DType::kInt8, 1, "int8"},
    {DType::kInt16, 2, "int16"},         {DType::kInt32, 4, "int32"},
    {DType::kInt64, 8, "int64"},         {DType::kBool, 1, "bool"},
};

struct Alias {
  absl::string_view name;
  DType dtype;
};

// PyTorch's alternative spellings (torch.float is torch.float32, ...).
constexpr Alias kAliases[] = {
    {"float", DType::kFloat32},    {"double", DType::kFloat64},
    {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128},
    {"half", DType::kFloat16},     {"short", DType::kInt16},
    {"int", DType::kInt32},        {"long", DType::kInt64},
};

const DTypeInfo& Info(DType dtype) { return kInfo[static_cast<size_t>(dtype)]; }

}  // namespace

size_t ElementSize(DType dtype) { return Info(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  absl::string_view bare = name;
  absl::ConsumePrefix(&bare, "torch.");
  for (const DTypeInfo& info : kInfo) {
    if (info.name == bare) return info.dtype;
  }
  for (const Alias& alias : kAliases) {
    if (alias.name == bare) return alias.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "Unknown dtype '", name,
      "'; expected one of float32, float64, complex64, complex128, float16, "
      "bfloat16, uint8, int8, int16, int32, int64, bool"));
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
         dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

bool IsComplex(DType dtype) {
  return dtype == DType::kComplex64 || dtype == DType::kComplex128;
}

Half FloatToHalf(float value) {
  const uint32_t bits = absl::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN; keep NaNs quiet and non-zero.
    const uint16_t payload = abs > 0x7f800000u ? 0x0200u : 0;
    return Half{static_cast<uint16_t>(sign | 0x7c00u | payload)};
  }
  if (abs >= 0x477ff000u) {  // Rounds to >= 65536: overflow to infinity.
    return Half{static_cast<uint16_t>(sign | 0x7c00u)};
  }
  if (abs < 0x38800000u) {  // Below the smallest normal half (2^-14).
    // Scale so the subnormal's integer significand is the float's integer
    // part; the FPU's own round-to-nearest-even does the rounding.
    const float scaled = absl::bit_cast<float>(abs) * 16777216.0f;  // * 2^24
    const uint16_t mantissa = static_cast<uint16_t>(std::nearbyint(scaled));
    return Half{static_cast<uint16_t>(sign | mantissa)};
  }
  // Normal: rebias the exponent (127 -> 15) and round 13 dropped bits.
  uint32_t rebased = abs - ((127u - 15u) << 23);
  const uint32_t lsb = (rebased >> 13) & 1u;
  rebased += 0x0fffu + lsb;
  return Half{static_cast<uint16_t>(sign | (rebased >> 13))};
}

float HalfToFloat(Half value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0) {  // Zero or subnormal: mantissa * 2^-24.
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {  // Inf or NaN.
    return absl::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return absl::bit_cast<float>(sign | ((exponent + 127u - 15u) << 23) |
                               (mantissa << 13));
}

BFloat16 FloatToBFloat16(float value) {
  const uint32_t bits = absl::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN.
    return BFloat16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return BFloat16{static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16)};
}

float BFloat16ToFloat(BFloat16 value) {
  return absl::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

std::ostream& operator<<(std::ostream& os, DType dtype) {
  return os << DTypeName(dtype);
}

}  // namespace tessera
