// NumPy .npy files (format versions 1.0, 2.0 and 3.0): what `tessera fetch`
// and `tessera read` write and `tessera write` reads, so that tensors move
// to and from numpy with np.save / np.load.
//
// Supported: little-endian, C-order arrays of float16, float32, float64,
// complex64, complex128, int8, int16, int32, int64, uint8 and bool
// ('<f2', '<f4', '<f8', '<c8', '<c16', '|i1', '<i2', '<i4', '<i8', '|u1',
// '|b1'). bfloat16 has no numpy dtype and is rejected on write (convert it
// first, e.g. to float32). Debian ships no maintained C++ .npy library
// (xtensor's reader is an internal detail of a template library that
// needs the element type at compile time), hence this small one.
//
// Failure: a file that is not a well-formed .npy, or one this reader does
// not support (big-endian, Fortran order, structured or other dtypes,
// truncated data, bool bytes other than 0 and 1) is INVALID_ARGUMENT with a
// one-line message naming the file and the problem. A missing file is
// NOT_FOUND, other I/O errors PERMISSION_DENIED or INTERNAL (with strerror).
//
// All functions are thread-safe (no shared state); none throws.
#ifndef TESSERA_CLIENT_NPY_H_
#define TESSERA_CLIENT_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/tensor/tensor.h"
#include "io/output_file.h"

namespace tessera {

// What the header of a .npy file says.
struct NpyHeader {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // empty for a 0-d array
  // Bytes from the start of the file to the array data (a multiple of 16
  // for files numpy wrote; 64 for those WriteNpy writes).
  int64_t data_offset = 0;
};

// The numpy type string of `dtype` ("<f4"); INVALID_ARGUMENT for bfloat16.
absl::StatusOr<std::string> NpyDescr(DType dtype);

// Parses the preamble (magic, version, header length) and the header dict
// at the start of `prefix`, which holds at least the whole header (the
// file's first data_offset bytes; more is ignored). INVALID_ARGUMENT when
// it is malformed or unsupported; OUT_OF_RANGE when `prefix` is too short
// to hold the header its preamble announces.
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view prefix);

// The preamble and header of an array of `dtype` and `shape`, padded so
// that the data starts at a multiple of 64 bytes: version 1.0, or 2.0 when
// the header does not fit 1.0's 16-bit length. INVALID_ARGUMENT for
// bfloat16 or a negative size.
absl::StatusOr<std::string> EncodeNpyHeader(DType dtype,
                                            absl::Span<const int64_t> shape);

// A whole .npy file held in memory -> a new contiguous CPU tensor. Bytes
// after the array data are ignored, as numpy does.
absl::StatusOr<Tensor> ParseNpy(absl::string_view contents);

// A contiguous copy of `tensor` (CPU or CUDA) as .npy bytes.
absl::StatusOr<std::string> EncodeNpy(const Tensor& tensor);

// Reads the .npy file at `path` into a new contiguous CPU tensor, reading
// the data straight into the tensor (no second copy of the file). "-" is
// standard input; a pipe or FIFO is read as it comes (its header is not
// checked against a size first: a stream that ends early is "truncated").
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// Writes `tensor` as .npy into `file` and commits it: a file is replaced
// atomically (a failed write leaves no partial file), a device, a FIFO or
// "-" (standard output) is written in place (io/output_file.h).
absl::Status WriteNpy(OutputFile& file, const Tensor& tensor);
// OutputFile::Open(path, 0666), its error prefixed "cannot write '<path>'":
// opened before the work that makes the tensor, so that a directory, a
// missing parent or a FIFO nobody reads fails before it (`tessera fetch`).
absl::StatusOr<OutputFile> OpenNpyOutput(const std::string& path);
// WriteNpy into OpenNpyOutput(path).
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace tessera

#endif  // TESSERA_CLIENT_NPY_H_
