#include "server/collective/process_group.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, ProcessGroupFactory> factories ABSL_GUARDED_BY(mu);
};

// Backends register themselves (gloo/, nccl/) while the program starts;
// the registry is made on first use, whichever file's initialiser comes
// first.
Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

absl::Status ValidateOptions(const ProcessGroupOptions& options) {
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("process group options: store is null");
  }
  if (options.global_ranks.empty()) {
    return absl::InvalidArgumentError(
        "process group options: global_ranks is empty");
  }
  const int size = static_cast<int>(options.global_ranks.size());
  if (options.rank < 0 || options.rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("process group options: rank ", options.rank,
                     " is out of range [0, ", size, ")"));
  }
  absl::flat_hash_set<int> seen;
  for (int global_rank : options.global_ranks) {
    if (global_rank < 0 || !seen.insert(global_rank).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("process group options: global rank ", global_rank,
                       global_rank < 0 ? " is negative" : " appears twice"));
    }
  }
  if (options.name.empty()) {
    return absl::InvalidArgumentError("process group options: name is empty");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "process group options: timeout must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int> ProcessGroup::GroupRank(int global_rank) const {
  auto it = std::find(global_ranks_.begin(), global_ranks_.end(), global_rank);
  if (it == global_ranks_.end()) return std::nullopt;
  return static_cast<int>(it - global_ranks_.begin());
}

Device ProcessGroup::device() const {
  switch (device_type()) {
    case Device::Type::kCuda:
      return Device::Cuda();
    case Device::Type::kMeta:
      return Device::Meta();
    case Device::Type::kCpu:
      break;
  }
  return Device::Cpu();
}

bool RegisterProcessGroupBackend(const std::string& name,
                                 ProcessGroupFactory factory) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  return registry.factories.emplace(name, std::move(factory)).second;
}

std::vector<std::string> ProcessGroupBackends() {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry.factories) names.push_back(name);
  return names;
}

namespace {

absl::StatusOr<ProcessGroupFactory> FindBackend(absl::string_view backend) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  auto it = registry.factories.find(std::string(backend));
  if (it == registry.factories.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Backend ", backend, " not supported!"));
  }
  return it->second;
}

}  // namespace

absl::Status CheckProcessGroupBackend(absl::string_view backend) {
  return FindBackend(backend).status();
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateProcessGroup(
    absl::string_view backend, const ProcessGroupOptions& options) {
  ASSIGN_OR_RETURN(ProcessGroupFactory factory, FindBackend(backend));
  RETURN_IF_ERROR(ValidateOptions(options));
  return factory(options);
}

absl::StatusOr<std::vector<std::string>> AllGatherBytes(
    ProcessGroup& group, absl::string_view bytes) {
  // One exchange of a fixed-size slot per member: the length, then up to
  // kInlineBytes of the bytes. Payloads that fit (a few shards' metadata,
  // an error) arrive in it; the rest of longer ones follows in a second
  // exchange sized by the lengths every member now knows. Both sizes are
  // the same on every member by construction, so neither exchange agrees
  // on plans first.
  constexpr int64_t kSlotBytes = 1024;
  constexpr int64_t kInlineBytes = kSlotBytes - 8;
  const Device device = group.device();
  const int size = group.size();
  const TensorOptions bytes_on =
      TensorOptions().WithDType(DType::kUInt8).WithDevice(device).Private();
  const TensorOptions bytes_on_host =
      TensorOptions().WithDType(DType::kUInt8).Private();
  const int64_t length = static_cast<int64_t>(bytes.size());
  const int64_t inline_length = std::min(length, kInlineBytes);
  ASSIGN_OR_RETURN(Tensor slot, Tensor::Zeros({kSlotBytes}, bytes_on_host));
  std::memcpy(slot.data_ptr(), &length, sizeof(length));
  if (inline_length > 0) {
    std::memcpy(static_cast<char*>(slot.data_ptr()) + 8, bytes.data(),
                static_cast<size_t>(inline_length));
  }
  if (!device.is_cpu()) {
    ASSIGN_OR_RETURN(slot, slot.To(device));
  }
  ASSIGN_OR_RETURN(Tensor slots, Tensor::Empty({size * kSlotBytes}, bytes_on));
  std::vector<Tensor> slot_views;
  for (int r = 0; r < size; ++r) {
    ASSIGN_OR_RETURN(slot_views.emplace_back(),
                     slots.Narrow(0, r * kSlotBytes, kSlotBytes));
  }
  RETURN_IF_ERROR(group.AllGatherAgreed(slot, slot_views));
  ASSIGN_OR_RETURN(Tensor host_slots, slots.To(Device::Cpu()));
  const char* slot_data = static_cast<const char*>(host_slots.data_ptr());

  std::vector<std::string> result(size);
  std::vector<int64_t> rest(size, 0);
  int64_t total_rest = 0;
  for (int r = 0; r < size; ++r) {
    int64_t theirs;
    std::memcpy(&theirs, slot_data + r * kSlotBytes, sizeof(theirs));
    const int64_t inline_part = std::min(theirs, kInlineBytes);
    // A negative length, or one whose sum with the others overflows, is
    // refused; a merely huge one makes the rest's buffer RESOURCE_EXHAUSTED.
    if (theirs < 0 || theirs - inline_part >
                          std::numeric_limits<int64_t>::max() - total_rest) {
      return absl::DataLossError(
          absl::StrCat("AllGatherBytes: rank ", group.global_ranks()[r],
                       " announced an impossible length (", theirs, ")"));
    }
    result[r].assign(slot_data + r * kSlotBytes + 8,
                     static_cast<size_t>(inline_part));
    rest[r] = theirs - inline_part;
    total_rest += rest[r];
  }
  if (total_rest == 0) return result;

  // The rest, into adjacent views of one buffer.
  ASSIGN_OR_RETURN(
      Tensor input,
      Tensor::FromVector<uint8_t>(
          absl::MakeConstSpan(
              reinterpret_cast<const uint8_t*>(bytes.data()) + inline_length,
              static_cast<size_t>(length - inline_length)),
          {length - inline_length}));
  if (!device.is_cpu()) {
    ASSIGN_OR_RETURN(input, input.To(device));
  }
  ASSIGN_OR_RETURN(Tensor gathered, Tensor::Empty({total_rest}, bytes_on));
  std::vector<Tensor> views;
  int64_t offset = 0;
  for (int r = 0; r < size; offset += rest[r++]) {
    ASSIGN_OR_RETURN(views.emplace_back(), gathered.Narrow(0, offset, rest[r]));
  }
  RETURN_IF_ERROR(group.AllGatherAgreed(input, views));
  ASSIGN_OR_RETURN(Tensor host, gathered.To(Device::Cpu()));
  const char* data = static_cast<const char*>(host.data_ptr());
  offset = 0;
  for (int r = 0; r < size; offset += rest[r++]) {
    result[r].append(data + offset, static_cast<size_t>(rest[r]));
  }
  return result;
}

namespace {

// An error on the wire: one byte of code, then the message.
std::string EncodeError(const absl::Status& error) {
  return absl::StrCat(std::string(1, static_cast<char>(error.code())),
                      error.message());
}

// The error `record` (as EncodeError wrote it) of group member `r`.
absl::Status DecodeError(const ProcessGroup& group, size_t r,
                         absl::string_view record) {
  const auto code =
      static_cast<absl::StatusCode>(static_cast<unsigned char>(record[0]));
  return absl::Status(
      code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
      absl::StrCat("on rank ", group.global_ranks()[r], ": ",
                   record.substr(1)));
}

}  // namespace

absl::StatusOr<std::vector<absl::Status>> AllGatherStatuses(
    ProcessGroup& group, const absl::Status& local) {
  // Empty for OK.
  ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGatherBytes(group, local.ok() ? std::string() : EncodeError(local)));
  std::vector<absl::Status> statuses(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    if (!gathered[r].empty()) {
      statuses[r] = DecodeError(group, r, gathered[r]);
    }
  }
  return statuses;
}

absl::StatusOr<std::vector<std::string>> AllGatherOutcomes(
    ProcessGroup& group, const absl::StatusOr<std::string>& local) {
  // 'O' and the payload, or 'E' and the error.
  ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      AllGatherBytes(
          group, local.ok() ? absl::StrCat("O", *local)
                            : absl::StrCat("E", EncodeError(local.status()))));
  RETURN_IF_ERROR(local.status());
  for (size_t r = 0; r < gathered.size(); ++r) {
    std::string& record = gathered[r];
    if (record.size() >= 2 && record[0] == 'E') {
      return DecodeError(group, r, absl::string_view(record).substr(1));
    }
    if (record.empty() || record[0] != 'O') {
      return absl::DataLossError(absl::StrCat("malformed outcome from rank ",
                                              group.global_ranks()[r]));
    }
    record.erase(0, 1);
  }
  return gathered;
}

absl::Status AllGatherStatus(ProcessGroup& group, const absl::Status& local) {
  ASSIGN_OR_RETURN(std::vector<absl::Status> statuses,
                   AllGatherStatuses(group, local));
  for (absl::Status& status : statuses) {
    if (!status.ok()) return std::move(status);
  }
  return absl::OkStatus();
}

namespace collective {
namespace {

// Checks one tensor argument; `what` names it in messages ("outputs[2]").
absl::Status CheckTensor(const ProcessGroup& group, absl::string_view op,
                         const std::string& what, const Tensor& tensor,
                         DType dtype) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " is undefined"));
  }
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " must be contiguous"));
  }
  if (tensor.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " has dtype ", DTypeName(tensor.dtype()),
                     ", expected ", DTypeName(dtype)));
  }
  const Device device = group.device();
  if (tensor.device().type() != device.type() ||
      (device.index().has_value() &&
       tensor.device().index() != device.index())) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", what, " is on ", tensor.device().ToString(), ", but the ",
        group.backend(), " group moves ", device.ToString(), " tensors"));
  }
  return absl::OkStatus();
}

// Checks one tensor per member; `what` names the list ("outputs").
absl::Status CheckTensorList(const ProcessGroup& group, absl::string_view op,
                             absl::string_view what,
                             absl::Span<const Tensor> tensors, DType dtype) {
  if (static_cast<int>(tensors.size()) != group.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": expected ", group.size(), " ", what,
                     " (one per member), got ", tensors.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    RETURN_IF_ERROR(CheckTensor(group, op, absl::StrCat(what, "[", i, "]"),
                                tensors[i], dtype));
  }
  return absl::OkStatus();
}

absl::Status CheckNoTensors(absl::string_view op, absl::string_view what,
                            absl::Span<const Tensor> tensors) {
  if (tensors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": only the root passes ", what, ", got ", tensors.size()));
}

// Non-member handles (rank -1) have no slot in any per-member list.
absl::Status CheckMember(const ProcessGroup& group, absl::string_view op) {
  if (group.is_member()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      op, ": this process is not a member of group ", group.name()));
}

absl::Status CheckRoot(const ProcessGroup& group, absl::string_view op,
                       int root) {
  if (root >= 0 && root < group.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": invalid root rank ", root, " (group size ", group.size(), ")"));
}

// A member's own share must match itself, or the local copy would overrun.
absl::Status CheckSelfSize(absl::string_view op, const Tensor& sent,
                           const Tensor& received, absl::string_view what) {
  if (sent.nbytes() == received.nbytes()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", what, " holds ", received.nbytes(),
                   " bytes, but this member sends ", sent.nbytes()));
}

TransferPlan EmptyPlan(const ProcessGroup& group, absl::string_view op,
                       DType dtype) {
  TransferPlan plan;
  plan.op = op;
  plan.dtype = dtype;
  plan.send_bytes.assign(group.size(), TransferPlan::kNone);
  plan.recv_bytes.assign(group.size(), TransferPlan::kNone);
  return plan;
}

int64_t Bytes(const Tensor& tensor) {
  return static_cast<int64_t>(tensor.nbytes());
}

}  // namespace

std::vector<int64_t> TransferPlan::Encode() const {
  std::vector<int64_t> encoded;
  encoded.reserve(1 + send_bytes.size() + recv_bytes.size());
  encoded.push_back(static_cast<int64_t>(dtype));
  encoded.insert(encoded.end(), send_bytes.begin(), send_bytes.end());
  encoded.insert(encoded.end(), recv_bytes.begin(), recv_bytes.end());
  return encoded;
}

absl::StatusOr<TransferPlan> PlanBroadcast(const ProcessGroup& group,
                                           const Tensor& tensor, int root) {
  constexpr absl::string_view kOp = "Broadcast";
  RETURN_IF_ERROR(CheckMember(group, kOp));
  RETURN_IF_ERROR(CheckTensor(group, kOp, "tensor", tensor, tensor.dtype()));
  RETURN_IF_ERROR(CheckRoot(group, kOp, root));
  TransferPlan plan = EmptyPlan(group, kOp, tensor.dtype());
  if (group.rank() == root) plan.send_bytes.assign(group.size(), Bytes(tensor));
  plan.recv_bytes[root] = Bytes(tensor);
  return plan;
}

absl::StatusOr<TransferPlan> PlanAllGather(const ProcessGroup& group,
                                           const Tensor& input,
                                           absl::Span<const Tensor> outputs) {
  constexpr absl::string_view kOp = "AllGather";
  RETURN_IF_ERROR(CheckMember(group, kOp));
  RETURN_IF_ERROR(CheckTensor(group, kOp, "input", input, input.dtype()));
  RETURN_IF_ERROR(
      CheckTensorList(group, kOp, "outputs", outputs, input.dtype()));
  RETURN_IF_ERROR(
      CheckSelfSize(kOp, input, outputs[group.rank()], "own output"));
  TransferPlan plan = EmptyPlan(group, kOp, input.dtype());
  plan.send_bytes.assign(group.size(), Bytes(input));
  for (int r = 0; r < group.size(); ++r) plan.recv_bytes[r] = Bytes(outputs[r]);
  return plan;
}

absl::StatusOr<TransferPlan> PlanGather(const ProcessGroup& group,
                                        const Tensor& input,
                                        absl::Span<const Tensor> outputs,
                                        int root) {
  constexpr absl::string_view kOp = "Gather";
  RETURN_IF_ERROR(CheckMember(group, kOp));
  RETURN_IF_ERROR(CheckTensor(group, kOp, "input", input, input.dtype()));
  RETURN_IF_ERROR(CheckRoot(group, kOp, root));
  TransferPlan plan = EmptyPlan(group, kOp, input.dtype());
  plan.send_bytes[root] = Bytes(input);
  if (group.rank() != root) {
    RETURN_IF_ERROR(CheckNoTensors(kOp, "outputs", outputs));
    return plan;
  }
  RETURN_IF_ERROR(
      CheckTensorList(group, kOp, "outputs", outputs, input.dtype()));
  RETURN_IF_ERROR(CheckSelfSize(kOp, input, outputs[root], "own output"));
  for (int r = 0; r < group.size(); ++r) plan.recv_bytes[r] = Bytes(outputs[r]);
  return plan;
}

absl::StatusOr<TransferPlan> PlanScatter(const ProcessGroup& group,
                                         absl::Span<const Tensor> inputs,
                                         const Tensor& output, int root) {
  constexpr absl::string_view kOp = "Scatter";
  RETURN_IF_ERROR(CheckMember(group, kOp));
  RETURN_IF_ERROR(CheckTensor(group, kOp, "output", output, output.dtype()));
  RETURN_IF_ERROR(CheckRoot(group, kOp, root));
  TransferPlan plan = EmptyPlan(group, kOp, output.dtype());
  plan.recv_bytes[root] = Bytes(output);
  if (group.rank() != root) {
    RETURN_IF_ERROR(CheckNoTensors(kOp, "inputs", inputs));
    return plan;
  }
  RETURN_IF_ERROR(
      CheckTensorList(group, kOp, "inputs", inputs, output.dtype()));
  RETURN_IF_ERROR(CheckSelfSize(kOp, inputs[root], output, "output"));
  for (int r = 0; r < group.size(); ++r) plan.send_bytes[r] = Bytes(inputs[r]);
  return plan;
}

absl::StatusOr<TransferPlan> PlanAllToAll(const ProcessGroup& group,
                                          absl::Span<const Tensor> inputs,
                                          absl::Span<const Tensor> outputs) {
  constexpr absl::string_view kOp = "AllToAll";
  RETURN_IF_ERROR(CheckMember(group, kOp));
  if (inputs.empty()) {
    return CheckTensorList(group, kOp, "inputs", inputs, DType::kUInt8);
  }
  const DType dtype = inputs[0].dtype();
  RETURN_IF_ERROR(CheckTensorList(group, kOp, "inputs", inputs, dtype));
  RETURN_IF_ERROR(CheckTensorList(group, kOp, "outputs", outputs, dtype));
  RETURN_IF_ERROR(CheckSelfSize(kOp, inputs[group.rank()],
                                outputs[group.rank()], "own output"));
  TransferPlan plan = EmptyPlan(group, kOp, dtype);
  for (int r = 0; r < group.size(); ++r) {
    plan.send_bytes[r] = Bytes(inputs[r]);
    plan.recv_bytes[r] = Bytes(outputs[r]);
  }
  return plan;
}

absl::StatusOr<int64_t> CheckPlansAgree(absl::string_view op, int size,
                                        absl::Span<const int64_t> plans) {
  const size_t stride = 2 * static_cast<size_t>(size) + 1;
  if (plans.size() != stride * size) {
    return absl::InternalError(absl::StrCat(
        op, ": expected ", stride * size, " plan entries, got ", plans.size()));
  }
  auto dtype = [&](int r) { return plans[r * stride]; };
  auto sends = [&](int from, int to) { return plans[from * stride + 1 + to]; };
  auto expects = [&](int to, int from) {
    return plans[to * stride + 1 + size + from];
  };
  auto dtype_name = [](int64_t value) {
    return value >= 0 && value < static_cast<int64_t>(std::size(kAllDTypes))
               ? std::string(DTypeName(static_cast<DType>(value)))
               : absl::StrCat("dtype #", value);
  };
  auto describe = [](int64_t bytes) {
    return bytes == TransferPlan::kNone ? std::string("nothing")
                                        : absl::StrCat(bytes, " bytes");
  };
  int64_t total = 0;
  for (int from = 0; from < size; ++from) {
    if (dtype(from) != dtype(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": member ", from, " passes ", dtype_name(dtype(from)),
          " tensors, member 0 ", dtype_name(dtype(0))));
    }
    for (int to = 0; to < size; ++to) {
      if (sends(from, to) == expects(to, from)) {
        total += std::max<int64_t>(sends(from, to), 0);
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": member ", from, " sends ", describe(sends(from, to)),
          " to member ", to, ", which expects ", describe(expects(to, from)),
          " (do the members agree on sizes and root?)"));
    }
  }
  return total;
}

}  // namespace collective
}  // namespace tessera
