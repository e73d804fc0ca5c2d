// Tensor names: the rule every name follows, and how a name a caller gave
// is shown in messages and log lines.
//
// A name is 1 to kMaxTensorNameLength characters of [A-Za-z0-9_.-]
// (ValidateTensorName; the daemons refuse any other at create). Any
// string may still arrive where a name is expected (a hostile or mistaken
// caller, a name of megabytes), and the daemons and the client library
// echo names in errors and log lines: ShownName and ShownNames bound what
// one name, or a list of them, adds to a message, so that no request can
// make a daemon write megabytes of log lines or a client an error of
// megabytes. A valid name is always shown whole.
//
// Pure functions; thread-safe.
#ifndef TESSERA_COMMON_TENSOR_NAME_H_
#define TESSERA_COMMON_TENSOR_NAME_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {

inline constexpr size_t kMaxTensorNameLength = 128;

// OK for a valid name; INVALID_ARGUMENT "invalid tensor name "...": a name
// is 1 to 128 characters of [A-Za-z0-9_.-]" otherwise (the name shown by
// ShownName, its bytes hex-escaped).
absl::Status ValidateTensorName(absl::string_view name);

// `text` as given when it is at most `longest` bytes; else its first
// `shown` bytes and "...(N bytes)". For any text a caller gave that a
// message quotes (a checkpoint path: ShownText(path, PATH_MAX, 256)).
std::string ShownText(absl::string_view text, size_t longest, size_t shown);

// ShownText(name, kMaxTensorNameLength, 64). Not escaped: a caller quoting
// it into a log line escapes the result.
std::string ShownName(absl::string_view name);

// The first `shown` of `names` (any container of strings with size():
// a vector, a protobuf repeated field), each ShownName, joined by
// `separator`, then " and N more" when there are more.
template <typename Names>
std::string ShownNames(const Names& names, absl::string_view separator = ", ",
                       size_t shown = 3) {
  std::string text;
  size_t i = 0;
  for (const auto& name : names) {
    if (i == shown) break;
    if (i++ > 0) absl::StrAppend(&text, separator);
    absl::StrAppend(&text, ShownName(name));
  }
  const size_t total = static_cast<size_t>(names.size());
  if (total > shown) absl::StrAppend(&text, " and ", total - shown, " more");
  return text;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_TENSOR_NAME_H_
