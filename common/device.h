// Devices: a local Device ("cpu", "cuda:3", "meta") and a RemoteDevice that
// also names its owner ("rank:3/cuda:3", "worker2/cuda:2"), with the text
// forms PyTorch uses. Printing a parsed device gives back the canonical
// string ("rank:0/cpu" -> "rank:0/cpu"; a bare "worker0" prints as
// "worker0/cpu", as torch.distributed._remote_device does).
//
// Value types; all functions are thread-safe.
#ifndef TESSERA_COMMON_DEVICE_H_
#define TESSERA_COMMON_DEVICE_H_

#include <optional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

class Device {
 public:
  enum class Type : uint8_t { kCpu, kCuda, kMeta };

  // The CPU. Default-constructed devices are the CPU too.
  Device() = default;
  static Device Cpu() { return Device(Type::kCpu, std::nullopt); }
  static Device Cuda(std::optional<int> index = std::nullopt) {
    return Device(Type::kCuda, index);
  }
  static Device Meta() { return Device(Type::kMeta, std::nullopt); }
  // Builds a device from its parts. INVALID_ARGUMENT for a negative index.
  static absl::StatusOr<Device> Create(Type type, std::optional<int> index);

  // Parses "cpu", "cpu:0", "cuda", "cuda:N", "meta". INVALID_ARGUMENT
  // "Invalid device string: '<text>'" otherwise.
  static absl::StatusOr<Device> Parse(absl::string_view text);

  Type type() const { return type_; }
  // The ordinal, absent for "cuda" (the current device) and for "cpu".
  std::optional<int> index() const { return index_; }
  bool is_cpu() const { return type_ == Type::kCpu; }
  bool is_cuda() const { return type_ == Type::kCuda; }
  bool is_meta() const { return type_ == Type::kMeta; }

  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type_ == b.type_ && a.index_ == b.index_;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }

 private:
  Device(Type type, std::optional<int> index) : type_(type), index_(index) {}

  Type type_ = Type::kCpu;
  std::optional<int> index_;
};

// A device on a named owner: either a global rank or a worker name (or
// neither, for a bare local device).
class RemoteDevice {
 public:
  // Parses '<workername>/<device>', 'rank:<rank>/<device>', '<workername>'
  // (device cpu), 'rank:<rank>' (device cpu) or a bare '<device>'.
  // INVALID_ARGUMENT with PyTorch's message "Could not parse remote_device:
  // <text>. The valid format is ..." otherwise.
  static absl::StatusOr<RemoteDevice> Parse(absl::string_view text);

  static RemoteDevice ForRank(int rank, Device device) {
    return RemoteDevice(rank, std::nullopt, device);
  }
  static RemoteDevice ForWorker(std::string worker_name, Device device) {
    return RemoteDevice(std::nullopt, std::move(worker_name), device);
  }
  static RemoteDevice Local(Device device) {
    return RemoteDevice(std::nullopt, std::nullopt, device);
  }

  // The owner's global rank when given in "rank:<N>" form.
  std::optional<int> rank() const { return rank_; }
  // The owner's worker name when given in "<workername>" form.
  const std::optional<std::string>& worker_name() const { return worker_; }
  const Device& device() const { return device_; }

  std::string ToString() const;

  friend bool operator==(const RemoteDevice& a, const RemoteDevice& b) {
    return a.rank_ == b.rank_ && a.worker_ == b.worker_ &&
           a.device_ == b.device_;
  }
  friend bool operator!=(const RemoteDevice& a, const RemoteDevice& b) {
    return !(a == b);
  }

 private:
  RemoteDevice(std::optional<int> rank, std::optional<std::string> worker,
               Device device)
      : rank_(rank), worker_(std::move(worker)), device_(device) {}

  std::optional<int> rank_;
  std::optional<std::string> worker_;
  Device device_;
};

std::ostream& operator<<(std::ostream& os, const Device& device);
std::ostream& operator<<(std::ostream& os, const RemoteDevice& device);

}  // namespace tessera

#endif  // TESSERA_COMMON_DEVICE_H_
