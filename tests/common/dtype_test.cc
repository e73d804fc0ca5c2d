#include "common/dtype.h"

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/base/casts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

uint16_t HalfBits(float value) { return FloatToHalf(value).bits; }
uint16_t BF16Bits(float value) { return FloatToBFloat16(value).bits; }

TEST(DTypeTest, ElementSizes) {
  EXPECT_EQ(ElementSize(DType::kFloat32), 4u);
  EXPECT_EQ(ElementSize(DType::kFloat64), 8u);
  EXPECT_EQ(ElementSize(DType::kComplex64), 8u);
  EXPECT_EQ(ElementSize(DType::kComplex128), 16u);
  EXPECT_EQ(ElementSize(DType::kFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kUInt8), 1u);
  EXPECT_EQ(ElementSize(DType::kInt8), 1u);
  EXPECT_EQ(ElementSize(DType::kInt16), 2u);
  EXPECT_EQ(ElementSize(DType::kInt32), 4u);
  EXPECT_EQ(ElementSize(DType::kInt64), 8u);
  EXPECT_EQ(ElementSize(DType::kBool), 1u);
}

TEST(DTypeTest, ElementSizeMatchesDispatchedType) {
  for (DType dtype : kAllDTypes) {
    const size_t size = DispatchDType(dtype, [](auto tag) {
      using T = typename decltype(tag)::type;
      return sizeof(T);
    });
    EXPECT_EQ(size, ElementSize(dtype)) << DTypeName(dtype);
    const DType round_trip = DispatchDType(dtype, [](auto tag) {
      using T = typename decltype(tag)::type;
      return DTypeOf<T>::value;
    });
    EXPECT_EQ(round_trip, dtype) << DTypeName(dtype);
  }
}

TEST(DTypeTest, Names) {
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(DType::kFloat64), "float64");
  EXPECT_EQ(DTypeName(DType::kComplex64), "complex64");
  EXPECT_EQ(DTypeName(DType::kComplex128), "complex128");
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kUInt8), "uint8");
  EXPECT_EQ(DTypeName(DType::kInt8), "int8");
  EXPECT_EQ(DTypeName(DType::kInt16), "int16");
  EXPECT_EQ(DTypeName(DType::kInt32), "int32");
  EXPECT_EQ(DTypeName(DType::kInt64), "int64");
  EXPECT_EQ(DTypeName(DType::kBool), "bool");
}

TEST(DTypeTest, ParseCanonicalNamesWithAndWithoutPrefix) {
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    ASSERT_OK_AND_ASSIGN(DType parsed, ParseDType(name));
    EXPECT_EQ(parsed, dtype) << name;
    ASSERT_OK_AND_ASSIGN(DType prefixed, ParseDType("torch." + name));
    EXPECT_EQ(prefixed, dtype) << name;
  }
}

TEST(DTypeTest, ParseAliases) {
  const struct {
    const char* name;
    DType dtype;
  } kCases[] = {
      {"float", DType::kFloat32},      {"torch.float", DType::kFloat32},
      {"double", DType::kFloat64},     {"torch.double", DType::kFloat64},
      {"cfloat", DType::kComplex64},   {"torch.cfloat", DType::kComplex64},
      {"cdouble", DType::kComplex128}, {"torch.cdouble", DType::kComplex128},
      {"half", DType::kFloat16},       {"torch.half", DType::kFloat16},
      {"short", DType::kInt16},        {"torch.short", DType::kInt16},
      {"int", DType::kInt32},          {"torch.int", DType::kInt32},
      {"long", DType::kInt64},         {"torch.long", DType::kInt64},
  };
  for (const auto& c : kCases) {
    ASSERT_OK_AND_ASSIGN(DType parsed, ParseDType(c.name));
    EXPECT_EQ(parsed, c.dtype) << c.name;
  }
}

TEST(DTypeTest, ParseErrorNamesTheString) {
  for (const char* bad : {"float8", "torch.quint8", "", "Float32", "torch.",
                          " float32", "float32 "}) {
    EXPECT_THAT(ParseDType(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(std::string("'") + bad + "'")))
        << bad;
  }
  EXPECT_THAT(
      ParseDType("torch.float8_e4m3fn"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("torch.float8_e4m3fn"), HasSubstr("bfloat16"))));
}

TEST(DTypeTest, Categories) {
  for (DType dtype : kAllDTypes) {
    const bool floating = dtype == DType::kFloat32 ||
                          dtype == DType::kFloat64 ||
                          dtype == DType::kFloat16 || dtype == DType::kBFloat16;
    const bool complex =
        dtype == DType::kComplex64 || dtype == DType::kComplex128;
    EXPECT_EQ(IsFloatingPoint(dtype), floating) << DTypeName(dtype);
    EXPECT_EQ(IsComplex(dtype), complex) << DTypeName(dtype);
  }
}

TEST(DTypeTest, FromDoubleAndToDouble) {
  EXPECT_EQ(FromDouble<float>(1.5), 1.5f);
  EXPECT_EQ(FromDouble<int32_t>(-7.0), -7);
  EXPECT_EQ(FromDouble<uint8_t>(200.0), 200);
  EXPECT_TRUE(FromDouble<bool>(0.5));
  EXPECT_FALSE(FromDouble<bool>(0.0));
  EXPECT_EQ(FromDouble<std::complex<float>>(2.0),
            std::complex<float>(2.0f, 0.0f));
  EXPECT_EQ(FromDouble<Half>(1.0).bits, 0x3C00);
  EXPECT_EQ(FromDouble<BFloat16>(1.0).bits, 0x3F80);
  EXPECT_EQ(ToDouble(Half{0x3C00}), 1.0);
  EXPECT_EQ(ToDouble(BFloat16{0xC000}), -2.0);
  EXPECT_EQ(ToDouble(std::complex<double>(3.0, 4.0)), 3.0);
  EXPECT_EQ(ToDouble(int64_t{-5}), -5.0);
  EXPECT_EQ(ToDouble(true), 1.0);
}

TEST(HalfTest, ExactValues) {
  EXPECT_EQ(HalfBits(0.0f), 0x0000);
  EXPECT_EQ(HalfBits(-0.0f), 0x8000);
  EXPECT_EQ(HalfBits(1.0f), 0x3C00);
  EXPECT_EQ(HalfBits(-2.0f), 0xC000);
  EXPECT_EQ(HalfBits(0.5f), 0x3800);
  EXPECT_EQ(HalfBits(65504.0f), 0x7BFF);  // Largest finite half.
  EXPECT_EQ(HalfBits(-65504.0f), 0xFBFF);
  EXPECT_EQ(HalfBits(0x1p-14f), 0x0400);    // Smallest normal.
  EXPECT_EQ(HalfBits(0x1p-24f), 0x0001);    // Smallest subnormal.
  EXPECT_EQ(HalfBits(0x3FFp-24f), 0x03FF);  // Largest subnormal.
  EXPECT_EQ(HalfBits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(HalfBits(-std::numeric_limits<float>::infinity()), 0xFC00);
}

TEST(HalfTest, OverflowGoesToInfinity) {
  // 65520 is halfway between 65504 and 65536 (= 2^16, not representable):
  // ties-to-even rounds up, i.e. to infinity.
  EXPECT_EQ(HalfBits(65519.996f), 0x7BFF);
  EXPECT_EQ(HalfBits(65520.0f), 0x7C00);
  EXPECT_EQ(HalfBits(-65520.0f), 0xFC00);
  EXPECT_EQ(HalfBits(1e10f), 0x7C00);
  EXPECT_EQ(HalfBits(std::numeric_limits<float>::max()), 0x7C00);
}

TEST(HalfTest, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1.0 and 1 + 2^-10: the even one is 1.0.
  EXPECT_EQ(HalfBits(1.0f + 0x1p-11f), 0x3C00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: even is 2^-9.
  EXPECT_EQ(HalfBits(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(HalfToFloat(Half{0x3C02}), 1.0f + 0x1p-9f);
  // Just above the halfway point rounds up.
  EXPECT_EQ(HalfBits(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  // Just below 1 + 2^-10 rounds to it.
  EXPECT_EQ(HalfBits(1.0f + 0x1p-10f - 0x1p-20f), 0x3C01);
  // Subnormals: 2^-25 ties to 0; 3 * 2^-25 ties to 2 * 2^-24.
  EXPECT_EQ(HalfBits(0x1p-25f), 0x0000);
  EXPECT_EQ(HalfBits(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(HalfBits(0x1p-25f + 0x1p-30f), 0x0001);
  EXPECT_EQ(HalfBits(-0x1p-26f), 0x8000);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(HalfBits(0x7FFp-25f), 0x0400);
}

TEST(HalfTest, NaNStaysNaN) {
  const Half h = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(h.bits & 0x7C00, 0x7C00);
  EXPECT_NE(h.bits & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(HalfToFloat(h)));
  // A NaN whose payload lives only in the low float bits stays a NaN too.
  EXPECT_TRUE(
      std::isnan(HalfToFloat(FloatToHalf(absl::bit_cast<float>(0x7F800001)))));
  EXPECT_TRUE(
      std::isnan(HalfToFloat(FloatToHalf(absl::bit_cast<float>(0xFF800001)))));
  EXPECT_TRUE(std::isnan(HalfToFloat(Half{0x7E00})));
  EXPECT_TRUE(std::isnan(HalfToFloat(Half{0xFC01})));
}

TEST(HalfTest, ToFloatExactValues) {
  EXPECT_EQ(HalfToFloat(Half{0x3C00}), 1.0f);
  EXPECT_EQ(HalfToFloat(Half{0x7BFF}), 65504.0f);
  EXPECT_EQ(HalfToFloat(Half{0x0001}), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(Half{0x03FF}), 0x3FFp-24f);
  EXPECT_EQ(HalfToFloat(Half{0x8001}), -0x1p-24f);
  EXPECT_EQ(HalfToFloat(Half{0x7C00}), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(HalfToFloat(Half{0x8000})));
  EXPECT_EQ(HalfToFloat(Half{0x3555}), 0x1.554p-2f);
}

TEST(HalfTest, RoundTripsEveryBitPattern) {
  int nans = 0;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const Half h{static_cast<uint16_t>(bits)};
    const float f = HalfToFloat(h);
    const bool is_nan = (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0;
    if (is_nan) {
      ++nans;
      EXPECT_TRUE(std::isnan(f)) << std::hex << bits;
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f).bits, bits) << std::hex << bits;
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(HalfTest, MatchesDoubleRoundingOnAGridOfFloats) {
  // Every float in [2^-26, 2^17) that is a multiple of its own 2^-16 ulp
  // grid: compare against rounding computed in double with nearbyint.
  for (uint32_t bits = absl::bit_cast<uint32_t>(0x1p-26f);
       bits < absl::bit_cast<uint32_t>(0x1p17f); bits += 0x1F3) {
    const float f = absl::bit_cast<float>(bits);
    const double x = f;
    double expected;
    const int exponent = std::ilogb(x);
    // Half's quantum: 2^(e-10) for normals, 2^-24 below 2^-14.
    const int quantum_exp = std::max(exponent, -14) - 10;
    expected = std::nearbyint(std::ldexp(x, -quantum_exp));
    expected = std::ldexp(expected, quantum_exp);
    const float got = HalfToFloat(FloatToHalf(f));
    if (expected >= 65520.0) {
      EXPECT_TRUE(std::isinf(got)) << f;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << f;
    }
  }
}

TEST(BFloat16Test, ExactValues) {
  EXPECT_EQ(BF16Bits(1.0f), 0x3F80);
  EXPECT_EQ(BF16Bits(-2.0f), 0xC000);
  EXPECT_EQ(BF16Bits(0.0f), 0x0000);
  EXPECT_EQ(BF16Bits(-0.0f), 0x8000);
  EXPECT_EQ(BF16Bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(BFloat16ToFloat(BFloat16{0x3F80}), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(BFloat16{0x7F7F}), 0x1.FEp127f);  // Max finite.
  EXPECT_EQ(BFloat16ToFloat(BFloat16{0x0001}), 0x1p-133f);    // Min subnormal.
}

TEST(BFloat16Test, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1.0 and 1 + 2^-7: ties to even 1.0.
  EXPECT_EQ(BF16Bits(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 2^-6.
  EXPECT_EQ(BF16Bits(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(BF16Bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(BF16Bits(-(1.0f + 0x1p-8f + 0x1p-20f)), 0xBF81);
  // Rounding past the largest finite value overflows to infinity.
  EXPECT_EQ(BF16Bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(BF16Bits(0x1.FEp127f), 0x7F7F);
}

TEST(BFloat16Test, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(
      FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  // Payload only in the low 16 bits: truncation alone would give infinity.
  EXPECT_TRUE(std::isnan(
      BFloat16ToFloat(FloatToBFloat16(absl::bit_cast<float>(0x7F800001)))));
  EXPECT_TRUE(std::isnan(
      BFloat16ToFloat(FloatToBFloat16(absl::bit_cast<float>(0xFFFFFFFF)))));
}

TEST(BFloat16Test, RoundTripsEveryBitPattern) {
  int nans = 0;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const BFloat16 b{static_cast<uint16_t>(bits)};
    const float f = BFloat16ToFloat(b);
    EXPECT_EQ(absl::bit_cast<uint32_t>(f), bits << 16);
    if (std::isnan(f)) {
      ++nans;
      EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(f))));
      continue;
    }
    ASSERT_EQ(FloatToBFloat16(f).bits, bits) << std::hex << bits;
  }
  EXPECT_EQ(nans, 2 * 127);
}

}  // namespace
}  // namespace tessera
