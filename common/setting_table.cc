#include "common/setting_table.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace tessera {

absl::StatusOr<int> SettingValue::ToInt() const {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " must be an integer, got '", text, "'"));
  }
  return value;
}

absl::StatusOr<double> SettingValue::ToNumber() const {
  double value = 0;
  if (!absl::SimpleAtod(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " must be a number, got '", text, "'"));
  }
  return value;
}

absl::StatusOr<int> SettingValue::ToIntIn(int min, int max) const {
  // Parsed as 64 bits, so that a whole number beyond int ("--nproc
  // 2147483648") is told its range, not that it is no integer.
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) return ToInt().status();
  RETURN_IF_ERROR(SettingInRange(source, value, min, max));
  return static_cast<int>(value);
}

absl::StatusOr<bool> SettingValue::ToBool() const {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower != "true" && lower != "false") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " must be true or false; got '", text, "'"));
  }
  return lower == "true";
}

absl::Status SettingInRange(absl::string_view source, int64_t value, int min,
                            int max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " must be in [", min, ", ", max, "], got ", value));
  }
  return absl::OkStatus();
}

namespace setting_table_internal {

std::optional<SettingValue> FromEnvironment(
    const std::vector<std::string>& variables, const SettingGetenv& getenv) {
  if (!getenv) return std::nullopt;
  for (const std::string& name : variables) {
    std::optional<std::string> value = getenv(name);
    if (value.has_value() && !value->empty()) {
      return SettingValue{name, *std::move(value)};
    }
  }
  return std::nullopt;
}

std::string HelpLine(const std::string& help,
                     const std::vector<std::string>& variables,
                     const std::string& default_help) {
  std::vector<std::string> notes;
  if (!variables.empty()) {
    notes.push_back(absl::StrCat("env ", absl::StrJoin(variables, ", ")));
  }
  if (!default_help.empty()) {
    notes.push_back(absl::StrCat("default ", default_help));
  }
  if (notes.empty()) return help;
  return absl::StrCat(help, " [", absl::StrJoin(notes, "; "), "]");
}

std::string MissingMessage(const std::string& flag, const std::string& what,
                           const std::vector<std::string>& variables) {
  if (variables.empty()) return absl::StrCat(flag, " is required");
  std::string message =
      absl::StrCat("no ", what, ": pass ", flag, " or set ", variables[0]);
  if (variables.size() > 1) {
    absl::StrAppend(&message, " (or ",
                    absl::StrJoin(variables.begin() + 1, variables.end(), ", "),
                    ")");
  }
  return message;
}

}  // namespace setting_table_internal
}  // namespace tessera
