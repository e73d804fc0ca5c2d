// client/npy.h: round trips of every dtype .npy can hold, headers as
// numpy writes them (versions 1.0, 2.0, 3.0, old 16-byte alignment, Python
// 2 longs), and malformed or unsupported files.
#include "client/npy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <complex>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The preamble and header numpy (>= 1.9, 64-byte alignment) writes for
// np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)).
std::string NumpyHeaderF4x2x3() {
  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  std::string header =
      dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
  return std::string("\x93NUMPY\x01\x00", 8) +
         std::string(1, static_cast<char>(header.size())) + std::string(1, 0) +
         header;
}

// A version-1.0 file with `dict` as header (16-byte alignment, as numpy
// before 1.9 wrote) and `data` after it.
std::string NpyFile(absl::string_view dict, absl::string_view data,
                    int major = 1) {
  const size_t preamble = major == 1 ? 10 : 12;
  size_t header_bytes = dict.size() + 1;
  header_bytes += (16 - (preamble + header_bytes) % 16) % 16;
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (size_t i = 0; i < preamble - 8; ++i) {
    out.push_back(static_cast<char>((header_bytes >> (8 * i)) & 0xff));
  }
  absl::StrAppend(&out, dict);
  out.append(header_bytes - dict.size() - 1, ' ');
  out.push_back('\n');
  absl::StrAppend(&out, data);
  return out;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

std::string TempPath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/tessera_npy_",
                      ::getpid(), "_", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A tensor of `dtype` and `sizes` whose elements differ from each other
// (and, for bool, alternate), to catch swapped or misplaced bytes.
Tensor Sample(DType dtype, std::vector<int64_t> sizes) {
  Tensor ramp =
      Tensor::Empty(sizes, TensorOptions().WithDType(DType::kFloat64)).value();
  for (int64_t i = 0; i < ramp.numel(); ++i) {
    ramp.data<double>()[i] = dtype == DType::kBool ? (i % 3 == 0) : i - 7.5;
  }
  return ramp.ToDType(dtype).value();
}

class NpyRoundTripTest : public ::testing::TestWithParam<DType> {};

TEST_P(NpyRoundTripTest, EncodeThenParse) {
  for (std::vector<int64_t> sizes :
       std::vector<std::vector<int64_t>>{{}, {5}, {3, 4}, {2, 3, 4}, {0, 3}}) {
    const Tensor tensor = Sample(GetParam(), sizes);
    absl::StatusOr<std::string> bytes = EncodeNpy(tensor);
    ASSERT_THAT(bytes, IsOk());
    absl::StatusOr<NpyHeader> header = ParseNpyHeader(*bytes);
    ASSERT_THAT(header, IsOk());
    EXPECT_EQ(header->dtype, GetParam());
    EXPECT_EQ(header->shape, sizes);
    EXPECT_EQ(header->data_offset % 64, 0);
    EXPECT_EQ(bytes->size(), header->data_offset + tensor.nbytes());
    absl::StatusOr<Tensor> parsed = ParseNpy(*bytes);
    ASSERT_THAT(parsed, IsOk());
    EXPECT_TRUE(Equal(*parsed, tensor)) << parsed->DebugString();
  }
}

TEST_P(NpyRoundTripTest, WriteThenRead) {
  const std::string path =
      TempPath(absl::StrCat(DTypeName(GetParam()), ".npy"));
  const Tensor tensor = Sample(GetParam(), {4, 5});
  ASSERT_THAT(WriteNpy(path, tensor), IsOk());
  absl::StatusOr<Tensor> read = ReadNpy(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_TRUE(Equal(*read, tensor));
  EXPECT_EQ(ReadFile(path), EncodeNpy(tensor).value());
  ::unlink(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(EveryNpyDType, NpyRoundTripTest,
                         ::testing::Values(DType::kFloat16, DType::kFloat32,
                                           DType::kFloat64, DType::kComplex64,
                                           DType::kComplex128, DType::kInt8,
                                           DType::kInt16, DType::kInt32,
                                           DType::kInt64, DType::kUInt8,
                                           DType::kBool),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(NpyTest, DescrOfEveryDType) {
  EXPECT_EQ(NpyDescr(DType::kFloat16).value(), "<f2");
  EXPECT_EQ(NpyDescr(DType::kFloat32).value(), "<f4");
  EXPECT_EQ(NpyDescr(DType::kFloat64).value(), "<f8");
  EXPECT_EQ(NpyDescr(DType::kComplex64).value(), "<c8");
  EXPECT_EQ(NpyDescr(DType::kComplex128).value(), "<c16");
  EXPECT_EQ(NpyDescr(DType::kInt8).value(), "|i1");
  EXPECT_EQ(NpyDescr(DType::kInt16).value(), "<i2");
  EXPECT_EQ(NpyDescr(DType::kInt32).value(), "<i4");
  EXPECT_EQ(NpyDescr(DType::kInt64).value(), "<i8");
  EXPECT_EQ(NpyDescr(DType::kUInt8).value(), "|u1");
  EXPECT_EQ(NpyDescr(DType::kBool).value(), "|b1");
  EXPECT_THAT(NpyDescr(DType::kBFloat16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bfloat16 has no numpy dtype")));
}

TEST(NpyTest, EncodesTheHeaderNumpyWrites) {
  EXPECT_EQ(EncodeNpyHeader(DType::kFloat32, {2, 3}).value(),
            NumpyHeaderF4x2x3());
  const std::string one_d = EncodeNpyHeader(DType::kInt64, {7}).value();
  EXPECT_THAT(one_d, HasSubstr("'shape': (7,), }"));
  const std::string zero_d = EncodeNpyHeader(DType::kBool, {}).value();
  EXPECT_THAT(zero_d, HasSubstr("{'descr': '|b1', 'fortran_order': False, "
                                "'shape': (), }"));
  EXPECT_THAT(
      EncodeNpyHeader(DType::kBFloat16, {2}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bfloat16")));
  EXPECT_THAT(
      EncodeNpyHeader(DType::kFloat32, {2, -1}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST(NpyTest, ParsesANumpyFile) {
  const std::vector<float> values = {0, 1, 2, 3, 4, 5};
  absl::StatusOr<Tensor> tensor = ParseNpy(NumpyHeaderF4x2x3() + Bytes(values));
  ASSERT_THAT(tensor, IsOk());
  EXPECT_EQ(tensor->dtype(), DType::kFloat32);
  EXPECT_THAT(tensor->sizes(), ElementsAre(2, 3));
  EXPECT_EQ(tensor->data<float>()[4], 4.0f);
}

TEST(NpyTest, ParsesOtherHeaderSpellings) {
  const std::vector<int64_t> values = {10, 20, 30, 40, 50, 60};
  // Keys in another order, double quotes, no trailing comma, Python 2
  // longs, 16-byte alignment, '<' on a single-byte type.
  absl::StatusOr<Tensor> tensor = ParseNpy(
      NpyFile("{\"shape\": (3L, 2L), 'fortran_order': False, 'descr': '<i8'}",
              Bytes(values)));
  ASSERT_THAT(tensor, IsOk());
  EXPECT_THAT(tensor->sizes(), ElementsAre(3, 2));
  EXPECT_EQ(tensor->data<int64_t>()[5], 60);

  const std::vector<uint8_t> bytes = {1, 2, 3};
  for (int major : {1, 2, 3}) {
    tensor = ParseNpy(
        NpyFile("{'descr': '<u1', 'fortran_order': False, 'shape': (3,), }",
                Bytes(bytes), major));
    ASSERT_THAT(tensor, IsOk()) << major;
    EXPECT_EQ(tensor->dtype(), DType::kUInt8);
    EXPECT_EQ(tensor->data<uint8_t>()[2], 3);
  }
  // A 1-d array marked Fortran order has C order's layout.
  tensor = ParseNpy(
      NpyFile("{'descr': '<u1', 'fortran_order': True, 'shape': (3, 1), }",
              Bytes(bytes)));
  EXPECT_THAT(tensor, IsOk());
  // Bytes after the data are ignored, as numpy does.
  tensor = ParseNpy(
      NpyFile("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }",
              Bytes(bytes)));
  ASSERT_THAT(tensor, IsOk());
  EXPECT_THAT(tensor->sizes(), ElementsAre(2));
}

struct MalformedCase {
  const char* name;
  std::string contents;
  const char* message;
};

TEST(NpyTest, MalformedFilesAreInvalidArgument) {
  const std::string f4 = Bytes(std::vector<float>{1, 2, 3, 4, 5, 6});
  const std::vector<MalformedCase> cases = {
      {"empty", "", "magic"},
      {"not npy", "PK\x03\x04 a zip file, not an npy file", "magic"},
      {"version", std::string("\x93NUMPY\x04\x00\x10\x00", 10), "version 4.0"},
      {"short preamble", std::string("\x93NUMPY\x02\x00\x10", 9), "preamble"},
      {"short header", NumpyHeaderF4x2x3().substr(0, 40), "header"},
      {"big endian",
       NpyFile("{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", f4),
       "big-endian"},
      {"fortran",
       NpyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
               f4),
       "Fortran-order"},
      {"unsigned 32",
       NpyFile("{'descr': '<u4', 'fortran_order': False, 'shape': (6,), }", f4),
       "'<u4'"},
      {"object",
       NpyFile("{'descr': '|O', 'fortran_order': False, 'shape': (6,), }", f4),
       "'|O'"},
      {"unaligned order",
       NpyFile("{'descr': '|f4', 'fortran_order': False, 'shape': (6,), }", f4),
       "byte order"},
      {"structured",
       NpyFile("{'descr': [('a', '<f4')], 'fortran_order': False, "
               "'shape': (6,), }",
               f4),
       "structured"},
      {"missing key", NpyFile("{'descr': '<f4', 'shape': (6,), }", f4),
       "'fortran_order'"},
      {"extra key",
       NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), "
               "'x': 'y'}",
               f4),
       "unexpected or repeated key 'x'"},
      {"bad value",
       NpyFile("{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}", f4),
       "unsupported value for 'fortran_order'"},
      {"repeated key",
       NpyFile("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
               "'shape': (6,)}",
               f4),
       "repeated key 'descr'"},
      {"not a dict", NpyFile("['descr', '<f4']", f4), "not a Python dict"},
      {"stray quote",
       NpyFile("{'descr': '<f4, 'fortran_order': False, 'shape': (6,)}", f4),
       "expected ',' or '}'"},
      {"unterminated", NpyFile("{'descr': '<f4}", f4), "unterminated string"},
      {"no colon", NpyFile("{'descr' '<f4'}", f4), "expected ':' after"},
      {"bad shape",
       NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (6, x)}", f4),
       "tuple of integers"},
      {"negative shape",
       NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", f4),
       "negative size"},
      {"huge shape",
       NpyFile("{'descr': '<f4', 'fortran_order': False, "
               "'shape': (4611686018427387904, 4)}",
               f4),
       "too large"},
      {"trailing text",
       NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", f4),
       "after the header"},
      {"truncated",
       NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }", f4),
       "truncated: the header promises 28 data bytes, the file holds 24"},
      // Found by npy_fuzz: a shape the data does not back is refused
      // before the array is allocated (6 PB here; ASan aborted on it).
      {"shape larger than the file",
       NpyFile("{'descr': '<f8', 'fortran_order': False, "
               "'shape': (777777777777732, ), }",
               f4),
       "truncated: the header promises 6222222222221856 data bytes, the "
       "file holds 24"},
      {"bool byte",
       NpyFile("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
               std::string("\x01\x00\x02", 3)),
       "bool element 2 holds byte 2"},
  };
  for (const MalformedCase& test : cases) {
    EXPECT_THAT(
        ParseNpy(test.contents),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(test.message)))
        << test.name;
    // The same from a file, with the path in the message.
    const std::string path = TempPath("malformed.npy");
    std::ofstream(path, std::ios::binary) << test.contents;
    EXPECT_THAT(
        ReadNpy(path),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 ::testing::AllOf(HasSubstr(path), HasSubstr(test.message))))
        << test.name;
    ::unlink(path.c_str());
  }
}

TEST(NpyTest, HeaderNeedsTheWholePrefix) {
  const std::string header = NumpyHeaderF4x2x3();
  EXPECT_THAT(ParseNpyHeader(header.substr(0, 60)),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("128 bytes")));
  EXPECT_THAT(ParseNpyHeader(header), IsOk());
}

TEST(NpyTest, FileErrors) {
  EXPECT_THAT(ReadNpy(TempPath("does_not_exist.npy")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("No such file or directory")));
  EXPECT_THAT(ReadNpy("/"), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("is a directory")));
  const Tensor tensor = Sample(DType::kFloat32, {2});
  EXPECT_THAT(WriteNpy("/nonexistent-dir/x.npy", tensor),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/nonexistent-dir/x.npy")));
  EXPECT_THAT(
      WriteNpy(TempPath("bf16.npy"), Sample(DType::kBFloat16, {2})),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bfloat16")));
  EXPECT_NE(::access(TempPath("bf16.npy").c_str(), F_OK), 0);
}

// `tessera write -i -`: a pipe is read as it comes, with no seek back over
// the bytes a short header's first read took past it and no size to check
// first; one that ends early is truncated.
TEST(NpyTest, ReadsAPipeAsItComes) {
  const std::string fifo = TempPath("pipe.npy");
  for (const std::vector<int64_t>& sizes :
       std::vector<std::vector<int64_t>>{{}, {3}, {300, 7}, {0, 2}}) {
    for (const bool whole : {true, false}) {
      const Tensor tensor = Sample(DType::kFloat32, sizes);
      std::string bytes = EncodeNpy(tensor).value();
      if (!whole && tensor.nbytes() == 0) continue;
      if (!whole) bytes.resize(bytes.size() - 3);
      ::unlink(fifo.c_str());
      ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
      std::thread writer([&] {
        std::ofstream out(fifo, std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      });
      absl::StatusOr<Tensor> read = ReadNpy(fifo);
      writer.join();
      if (whole) {
        ASSERT_THAT(read, IsOk()) << sizes.size();
        EXPECT_TRUE(Equal(*read, tensor));
      } else {
        EXPECT_THAT(read, StatusIs(absl::StatusCode::kInvalidArgument,
                                   HasSubstr("truncated")));
      }
    }
  }
  ::unlink(fifo.c_str());
}

TEST(NpyTest, WritesNonContiguousTensorsInCOrder) {
  const Tensor tensor = Sample(DType::kInt32, {3, 4});
  const Tensor transposed = tensor.T().value();
  absl::StatusOr<Tensor> parsed = ParseNpy(EncodeNpy(transposed).value());
  ASSERT_THAT(parsed, IsOk());
  EXPECT_THAT(parsed->sizes(), ElementsAre(4, 3));
  EXPECT_TRUE(Equal(*parsed, transposed.Contiguous().value()));
  EXPECT_EQ(parsed->data<int32_t>()[1], tensor.data<int32_t>()[4]);
}

}  // namespace
}  // namespace tessera
