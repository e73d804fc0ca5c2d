#include "common/device.h"

#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

// A non-negative decimal int without sign or spaces (Python's isdigit()).
std::optional<int> ParseOrdinal(absl::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  int value = 0;
  if (!absl::SimpleAtoi(text, &value)) return std::nullopt;
  return value;
}

absl::Status RemoteParseError(absl::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat(
      "Could not parse remote_device: ", text,
      ". The valid format is '<workername>/<device>' or "
      "'rank:<rank>/<device>' or '<workername>' or 'rank:<rank>'"));
}

}  // namespace

absl::StatusOr<Device> Device::Create(Type type, std::optional<int> index) {
  if (index.has_value() && *index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Device index must not be negative, got ", *index));
  }
  if (type == Type::kMeta && index.has_value()) {
    return absl::InvalidArgumentError("The meta device takes no index");
  }
  return Device(type, index);
}

absl::StatusOr<Device> Device::Parse(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  std::optional<int> index;
  if (parts.size() == 2) {
    index = ParseOrdinal(parts[1]);
  }
  const bool index_ok = parts.size() == 1 || index.has_value();
  if (index_ok && parts.size() <= 2) {
    if (parts[0] == "cpu") return Device(Type::kCpu, index);
    if (parts[0] == "cuda") return Device(Type::kCuda, index);
    if (parts[0] == "meta" && parts.size() == 1) return Meta();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Invalid device string: '", text, "'"));
}

std::string Device::ToString() const {
  absl::string_view name = "cpu";
  if (type_ == Type::kCuda) name = "cuda";
  if (type_ == Type::kMeta) name = "meta";
  if (!index_.has_value()) return std::string(name);
  return absl::StrCat(name, ":", *index_);
}

absl::StatusOr<RemoteDevice> RemoteDevice::Parse(absl::string_view text) {
  const std::vector<absl::string_view> fields = absl::StrSplit(text, '/');
  std::optional<std::string> worker;
  absl::string_view device_text;
  if (fields.size() == 2) {
    worker = std::string(fields[0]);
    device_text = fields[1];
  } else if (fields.size() == 1) {
    if (Device::Parse(fields[0]).ok()) {
      device_text = fields[0];
    } else {
      worker = std::string(fields[0]);
      device_text = "cpu";
    }
  } else {
    return RemoteParseError(text);
  }
  if (worker.has_value() && worker->empty()) return RemoteParseError(text);

  absl::StatusOr<Device> device = Device::Parse(device_text);
  if (!device.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Could not parse remote_device: ", text, ". ",
                     device.status().message()));
  }

  std::optional<int> rank;
  if (worker.has_value()) {
    const std::vector<absl::string_view> owner = absl::StrSplit(*worker, ':');
    if (owner.size() == 2) {
      rank = owner[0] == "rank" ? ParseOrdinal(owner[1]) : std::nullopt;
      if (!rank.has_value()) return RemoteParseError(text);
      worker.reset();
    } else if (owner.size() > 2) {
      return RemoteParseError(text);
    }
  }
  return RemoteDevice(rank, std::move(worker), *device);
}

std::string RemoteDevice::ToString() const {
  if (worker_.has_value())
    return absl::StrCat(*worker_, "/", device_.ToString());
  if (rank_.has_value()) {
    return absl::StrCat("rank:", *rank_, "/", device_.ToString());
  }
  return device_.ToString();
}

std::ostream& operator<<(std::ostream& os, const Device& device) {
  return os << device.ToString();
}

std::ostream& operator<<(std::ostream& os, const RemoteDevice& device) {
  return os << device.ToString();
}

}  // namespace tessera
