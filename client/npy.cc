#include "client/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "io/errno.h"
#include "io/file.h"
#include "io/unique_fd.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "client/npy.cc assumes a little-endian host"
#endif

namespace tessera {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// numpy 2 refuses headers over 10,000 bytes unless told otherwise; allow
// more (very high-dimensional shapes) but never an absurd allocation.
constexpr uint32_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kAlignment = 64;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("not a valid .npy file: ", what));
}

// The type strings of the dtypes .npy can hold; bfloat16 has none.
struct DescrEntry {
  DType dtype;
  absl::string_view kind_and_size;  // without the byte-order character
};
constexpr DescrEntry kDescrs[] = {
    {DType::kFloat16, "f2"},     {DType::kFloat32, "f4"},
    {DType::kFloat64, "f8"},     {DType::kComplex64, "c8"},
    {DType::kComplex128, "c16"}, {DType::kInt8, "i1"},
    {DType::kInt16, "i2"},       {DType::kInt32, "i4"},
    {DType::kInt64, "i8"},       {DType::kUInt8, "u1"},
    {DType::kBool, "b1"},
};

absl::StatusOr<DType> DTypeFromDescr(absl::string_view descr) {
  if (descr.size() < 2) {
    return Malformed(absl::StrCat("unknown dtype '", descr, "'"));
  }
  const char order = descr[0];
  const absl::string_view kind_and_size = descr.substr(1);
  if (order != '<' && order != '>' && order != '|' && order != '=') {
    return Malformed(absl::StrCat("unknown dtype '", descr, "'"));
  }
  for (const DescrEntry& entry : kDescrs) {
    if (entry.kind_and_size != kind_and_size) continue;
    const bool single_byte = ElementSize(entry.dtype) == 1;
    if (order == '>' && !single_byte) {
      return absl::InvalidArgumentError(
          absl::StrCat("big-endian .npy data ('", descr,
                       "') is not supported; save arr.astype('<", kind_and_size,
                       "') instead"));
    }
    if (order == '|' && !single_byte) {
      return Malformed(
          absl::StrCat("dtype '", descr, "' needs a byte order ('<' or '>')"));
    }
    return entry.dtype;
  }
  if (kind_and_size == "u2" || kind_and_size == "u4" || kind_and_size == "u8") {
    return absl::InvalidArgumentError(absl::StrCat(
        ".npy dtype '", descr,
        "' (unsigned wider than 8 bits) is not supported; convert it to a "
        "signed type (e.g. arr.astype('<i8'))"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      ".npy dtype '", descr,
      "' is not supported (float16/32/64, complex64/128, int8/16/32/64, "
      "uint8 and bool are)"));
}

// A value of the header dict: a string, a bool or a tuple of integers.
using HeaderValue = std::variant<std::string, bool, std::vector<int64_t>>;

// Parses the Python literal numpy writes as the header, e.g.
// "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }".
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<std::vector<std::pair<std::string, HeaderValue>>> Dict() {
    std::vector<std::pair<std::string, HeaderValue>> entries;
    SkipSpace();
    if (!Consume('{')) return Malformed("the header is not a Python dict");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      ASSIGN_OR_RETURN(std::string key, String());
      SkipSpace();
      if (!Consume(':')) {
        return Malformed(absl::StrCat("expected ':' after '", key, "'"));
      }
      SkipSpace();
      ASSIGN_OR_RETURN(HeaderValue value, Value(key));
      entries.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (Consume('}')) break;
      if (!Consume(',')) return Malformed("expected ',' or '}' in the header");
    }
    SkipSpace();
    if (pos_ != text_.size()) {
      return Malformed("unexpected text after the header dict");
    }
    return entries;
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    const size_t end = pos_ + word.size();
    if (end < text_.size() &&
        (absl::ascii_isalnum(text_[end]) || text_[end] == '_')) {
      return false;
    }
    pos_ = end;
    return true;
  }

  absl::StatusOr<std::string> String() {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Malformed("expected a quoted string in the header");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) {
      return Malformed("unterminated string in the header");
    }
    std::string value(text_.substr(pos_, end - pos_));
    if (value.find('\\') != std::string::npos) {
      return Malformed("escapes in header strings are not supported");
    }
    pos_ = end + 1;
    return value;
  }

  absl::StatusOr<std::vector<int64_t>> Tuple(absl::string_view key) {
    std::vector<int64_t> values;
    while (true) {
      SkipSpace();
      if (Consume(')')) return values;
      const size_t start = pos_;
      while (pos_ < text_.size() &&
             (absl::ascii_isdigit(text_[pos_]) || text_[pos_] == '-')) {
        ++pos_;
      }
      int64_t value = 0;
      if (!absl::SimpleAtoi(text_.substr(start, pos_ - start), &value)) {
        return Malformed(
            absl::StrCat("'", key, "' must be a tuple of integers"));
      }
      Consume('L');  // Python 2 longs, in files written long ago.
      values.push_back(value);
      SkipSpace();
      if (Consume(')')) return values;
      if (!Consume(',')) {
        return Malformed(
            absl::StrCat("'", key, "' must be a tuple of integers"));
      }
    }
  }

  absl::StatusOr<HeaderValue> Value(absl::string_view key) {
    if (pos_ >= text_.size()) return Malformed("the header ends early");
    const char c = text_[pos_];
    if (c == '\'' || c == '"') {
      ASSIGN_OR_RETURN(std::string value, String());
      return HeaderValue(std::move(value));
    }
    if (c == '(') {
      ++pos_;
      ASSIGN_OR_RETURN(std::vector<int64_t> values, Tuple(key));
      return HeaderValue(std::move(values));
    }
    if (ConsumeWord("True")) return HeaderValue(true);
    if (ConsumeWord("False")) return HeaderValue(false);
    if (c == '[' && key == "descr") {
      return absl::InvalidArgumentError(
          ".npy files of structured dtypes are not supported");
    }
    return Malformed(absl::StrCat("unsupported value for '", key, "'"));
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

uint32_t LoadLittleEndian(const char* bytes, int width) {
  uint32_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

// The preamble: the header's length and where the header starts, from the
// first 12 bytes (fewer for version 1.0).
struct Preamble {
  uint32_t header_bytes = 0;
  size_t header_start = 0;
};

absl::StatusOr<Preamble> ParsePreamble(absl::string_view prefix) {
  if (prefix.size() < kMagicSize + 2 ||
      prefix.substr(0, kMagicSize) != absl::string_view(kMagic, kMagicSize)) {
    return Malformed("missing the \\x93NUMPY magic string");
  }
  const int major = static_cast<unsigned char>(prefix[6]);
  const int minor = static_cast<unsigned char>(prefix[7]);
  Preamble preamble;
  int width = 0;
  if (major == 1 && minor == 0) {
    width = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    width = 4;
  } else {
    return Malformed(absl::StrCat("unsupported format version ", major, ".",
                                  minor, " (1.0, 2.0 and 3.0 are supported)"));
  }
  preamble.header_start = kMagicSize + 2 + width;
  if (prefix.size() < preamble.header_start) {
    return Malformed("the file ends inside its preamble");
  }
  preamble.header_bytes =
      LoadLittleEndian(prefix.data() + kMagicSize + 2, width);
  if (preamble.header_bytes > kMaxHeaderBytes) {
    return Malformed(absl::StrCat("a header of ", preamble.header_bytes,
                                  " bytes is larger than the ", kMaxHeaderBytes,
                                  " allowed"));
  }
  return preamble;
}

absl::StatusOr<NpyHeader> ParseHeaderText(absl::string_view text,
                                          int64_t data_offset) {
  HeaderParser parser(text);
  ASSIGN_OR_RETURN(auto entries, parser.Dict());
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
  for (auto& [key, value] : entries) {
    if (key == "descr" && !descr.has_value()) {
      if (const auto* s = std::get_if<std::string>(&value)) {
        descr = *s;
        continue;
      }
      return Malformed("'descr' must be a string");
    }
    if (key == "fortran_order" && !fortran_order.has_value()) {
      if (const auto* b = std::get_if<bool>(&value)) {
        fortran_order = *b;
        continue;
      }
      return Malformed("'fortran_order' must be True or False");
    }
    if (key == "shape" && !shape.has_value()) {
      if (auto* t = std::get_if<std::vector<int64_t>>(&value)) {
        shape = std::move(*t);
        continue;
      }
      return Malformed("'shape' must be a tuple of integers");
    }
    return Malformed(absl::StrCat("unexpected or repeated key '", key, "'"));
  }
  if (!descr.has_value() || !fortran_order.has_value() || !shape.has_value()) {
    return Malformed("the header needs 'descr', 'fortran_order' and 'shape'");
  }
  NpyHeader header;
  ASSIGN_OR_RETURN(header.dtype, DTypeFromDescr(*descr));
  int64_t non_trivial_dims = 0;
  for (int64_t size : *shape) {
    if (size < 0) {
      return Malformed(absl::StrCat("negative size in shape (",
                                    absl::StrJoin(*shape, ", "), ")"));
    }
    if (size != 1) ++non_trivial_dims;
  }
  // numpy marks 1-d arrays C-contiguous and writes them with False, but a
  // Fortran-order array whose layout equals C order is harmless too.
  if (*fortran_order && non_trivial_dims > 1) {
    return absl::InvalidArgumentError(
        "Fortran-order .npy arrays are not supported; save "
        "np.ascontiguousarray(arr) instead");
  }
  const std::optional<int64_t> numel = CheckedProduct(*shape);
  int64_t nbytes = 0;
  if (!numel.has_value() ||
      __builtin_mul_overflow(
          *numel, static_cast<int64_t>(ElementSize(header.dtype)), &nbytes)) {
    return Malformed(
        absl::StrCat("shape (", absl::StrJoin(*shape, ", "), ") is too large"));
  }
  header.shape = std::move(*shape);
  header.data_offset = data_offset;
  return header;
}

// The array's data size, for a header ParseNpyHeader accepted (its size
// fits in int64).
int64_t DataBytes(const NpyHeader& header) {
  return CheckedProduct(header.shape).value_or(0) *
         static_cast<int64_t>(ElementSize(header.dtype));
}

// INVALID_ARGUMENT unless `available` bytes hold the array's data: checked
// before the array is allocated, so that a header cannot ask for memory its
// file does not back.
absl::Status CheckDataBytes(const NpyHeader& header, int64_t available) {
  const int64_t nbytes = DataBytes(header);
  if (available >= nbytes) return absl::OkStatus();
  return Malformed(absl::StrCat("truncated: the header promises ", nbytes,
                                " data bytes, the file holds ",
                                std::max<int64_t>(available, 0)));
}

absl::Status CheckBoolBytes(const Tensor& tensor) {
  if (tensor.dtype() != DType::kBool || tensor.numel() == 0) {
    return absl::OkStatus();
  }
  const auto* bytes = static_cast<const unsigned char*>(tensor.data_ptr());
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    if (bytes[i] > 1) {
      return Malformed(absl::StrCat("bool element ", i, " holds byte ",
                                    static_cast<int>(bytes[i]),
                                    " (only 0 and 1 are bools)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> HostContiguous(const Tensor& tensor) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError("cannot save an undefined tensor");
  }
  if (tensor.device().is_cpu()) return tensor.Contiguous();
  return tensor.To(Device::Cpu());
}

// A descriptor of this process's standard input of its own (ReadNpy's
// "-"), so that closing it leaves fd 0 open.
absl::StatusOr<UniqueFd> DuplicateStandardInput() {
  const int fd = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoError(errno, "standard input");
  return UniqueFd(fd);
}

}  // namespace

absl::StatusOr<std::string> NpyDescr(DType dtype) {
  for (const DescrEntry& entry : kDescrs) {
    if (entry.dtype == dtype) {
      return absl::StrCat(ElementSize(dtype) == 1 ? "|" : "<",
                          entry.kind_and_size);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      DTypeName(dtype),
      " has no numpy dtype and cannot be stored in a .npy file; convert it "
      "first (e.g. to float32)"));
}

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view prefix) {
  ASSIGN_OR_RETURN(Preamble preamble, ParsePreamble(prefix));
  const size_t end = preamble.header_start + preamble.header_bytes;
  if (prefix.size() < end) {
    return absl::OutOfRangeError(absl::StrCat("the .npy header needs ", end,
                                              " bytes, got ", prefix.size()));
  }
  return ParseHeaderText(
      prefix.substr(preamble.header_start, preamble.header_bytes),
      static_cast<int64_t>(end));
}

absl::StatusOr<std::string> EncodeNpyHeader(DType dtype,
                                            absl::Span<const int64_t> shape) {
  ASSIGN_OR_RETURN(std::string descr, NpyDescr(dtype));
  for (int64_t size : shape) {
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot encode negative size in shape [",
                       absl::StrJoin(shape, ", "), "]"));
    }
  }
  std::string shape_text;
  if (shape.size() == 1) {
    shape_text = absl::StrCat("(", shape[0], ",)");
  } else {
    shape_text = absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
  }
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape_text, ", }");
  // The header ends in '\n' and is padded with spaces so that the data
  // starts aligned; numpy's formula, which always pads at least one byte.
  auto header_bytes_after = [&](size_t preamble_bytes) {
    const size_t unpadded = dict.size() + 1;
    return unpadded + kAlignment - (preamble_bytes + unpadded) % kAlignment;
  };
  int major = 1;
  size_t header_bytes = header_bytes_after(kMagicSize + 2 + 2);
  if (header_bytes > 0xffff) {
    major = 2;
    header_bytes = header_bytes_after(kMagicSize + 2 + 4);
  }
  std::string out(kMagic, kMagicSize);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  const int width = major == 1 ? 2 : 4;
  for (int i = 0; i < width; ++i) {
    out.push_back(static_cast<char>((header_bytes >> (8 * i)) & 0xff));
  }
  out += dict;
  out.append(header_bytes - dict.size() - 1, ' ');
  out.push_back('\n');
  return out;
}

absl::StatusOr<Tensor> ParseNpy(absl::string_view contents) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(contents);
  if (absl::IsOutOfRange(header.status())) {
    return Malformed("the file ends inside its header");
  }
  RETURN_IF_ERROR(header.status());
  RETURN_IF_ERROR(CheckDataBytes(
      *header, static_cast<int64_t>(contents.size()) - header->data_offset));
  ASSIGN_OR_RETURN(
      Tensor tensor,
      Tensor::Empty(header->shape, TensorOptions().WithDType(header->dtype)));
  const size_t nbytes = tensor.nbytes();
  if (nbytes > 0) {
    std::memcpy(tensor.data_ptr(), contents.data() + header->data_offset,
                nbytes);
  }
  RETURN_IF_ERROR(CheckBoolBytes(tensor));
  return tensor;
}

absl::StatusOr<std::string> EncodeNpy(const Tensor& tensor) {
  ASSIGN_OR_RETURN(Tensor host, HostContiguous(tensor));
  ASSIGN_OR_RETURN(std::string out,
                   EncodeNpyHeader(host.dtype(), host.sizes()));
  if (host.nbytes() > 0) {
    out.append(static_cast<const char*>(host.data_ptr()), host.nbytes());
  }
  return out;
}

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  const std::string what = absl::StrCat("cannot read '", path, "'");
  absl::StatusOr<UniqueFd> fd =
      path == "-" ? DuplicateStandardInput() : OpenFile(path, O_RDONLY);
  if (!fd.ok()) return Annotate(fd.status(), what);
  struct stat info;
  if (::fstat(fd->get(), &info) != 0) {
    return Annotate(ErrnoError(errno, absl::StrCat("stat ", path)), what);
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is a directory, not a .npy file"));
  }
  // A pipe (standard input, a FIFO) is read as it comes: no seeking back,
  // no size to check the header against before the data arrives.
  const bool seekable = S_ISREG(info.st_mode) || S_ISBLK(info.st_mode);
  // The preamble, then the header it announces.
  std::string prefix(kMagicSize + 2 + 4, '\0');
  absl::StatusOr<size_t> got =
      ReadAll(fd->get(), prefix.data(), prefix.size(), path);
  if (!got.ok()) return Annotate(got.status(), what);
  prefix.resize(*got);
  absl::StatusOr<Preamble> preamble = ParsePreamble(prefix);
  if (!preamble.ok()) return Annotate(preamble.status(), path);
  const size_t end = preamble->header_start + preamble->header_bytes;
  if (end > prefix.size()) {
    const size_t have = prefix.size();
    prefix.resize(end);
    got = ReadAll(fd->get(), prefix.data() + have, end - have, path);
    if (!got.ok()) return Annotate(got.status(), what);
    if (*got < end - have) {
      return Annotate(Malformed("the file ends inside its header"), path);
    }
  }
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(prefix);
  if (!header.ok()) return Annotate(header.status(), path);
  // Data right after the header. A file: rewind the bytes of a short
  // header that the fixed-size first read took past it, and check the file
  // holds the data before allocating it. A pipe: those bytes are the
  // data's first.
  size_t ahead = 0;
  if (seekable) {
    if (::lseek(fd->get(), header->data_offset, SEEK_SET) < 0) {
      return ErrnoError(errno, absl::StrCat("cannot seek in '", path, "'"));
    }
    absl::StatusOr<int64_t> file_size = FileSize(fd->get(), path);
    if (!file_size.ok()) return Annotate(file_size.status(), what);
    absl::Status backed =
        CheckDataBytes(*header, *file_size - header->data_offset);
    if (!backed.ok()) return Annotate(backed, path);
  } else {
    ahead = prefix.size() - static_cast<size_t>(header->data_offset);
  }
  ASSIGN_OR_RETURN(
      Tensor tensor,
      Tensor::Empty(header->shape, TensorOptions().WithDType(header->dtype)));
  const size_t nbytes = tensor.nbytes();
  ahead = std::min(ahead, nbytes);
  if (ahead > 0) {
    std::memcpy(tensor.data_ptr(), prefix.data() + header->data_offset, ahead);
  }
  if (nbytes > ahead) {
    got = ReadAll(fd->get(), static_cast<char*>(tensor.data_ptr()) + ahead,
                  nbytes - ahead, path);
    if (!got.ok()) return Annotate(got.status(), what);
    if (ahead + *got < nbytes) {
      return Annotate(
          Malformed(absl::StrCat("truncated: the header promises ", nbytes,
                                 " data bytes, the file holds ", ahead + *got)),
          path);
    }
  }
  absl::Status bools = CheckBoolBytes(tensor);
  if (!bools.ok()) return Annotate(bools, path);
  return tensor;
}

absl::Status WriteNpy(OutputFile& file, const Tensor& tensor) {
  const std::string what = absl::StrCat("cannot write '", file.path(), "'");
  absl::StatusOr<Tensor> host = HostContiguous(tensor);
  if (!host.ok()) return Annotate(host.status(), what);
  ASSIGN_OR_RETURN(std::string header,
                   EncodeNpyHeader(host->dtype(), host->sizes()));
  absl::Status status = file.Append(header.data(), header.size());
  if (status.ok() && host->nbytes() > 0) {
    status = file.Append(host->data_ptr(), host->nbytes());
  }
  if (status.ok()) status = file.Commit();
  return Annotate(status, what);
}

absl::StatusOr<OutputFile> OpenNpyOutput(const std::string& path) {
  absl::StatusOr<OutputFile> file = OutputFile::Open(path, 0666);
  if (!file.ok()) {
    return Annotate(file.status(), absl::StrCat("cannot write '", path, "'"));
  }
  return file;
}

absl::Status WriteNpy(const std::string& path, const Tensor& tensor) {
  ASSIGN_OR_RETURN(OutputFile file, OpenNpyOutput(path));
  return WriteNpy(file, tensor);
}

}  // namespace tessera
