#include "server/daemon/op_outcomes.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/wire_format_lite.h"
#include "server/daemon/control_ops.h"

namespace tessera::control_internal {
namespace {

// "CreateTensor 'a'" for messages.
std::string Named(const v1::CommittedOp& record) {
  if (record.tensor().empty()) return record.method();
  return absl::StrCat(record.method(), " '", absl::CEscape(record.tensor()),
                      "'");
}

// The tensor id an op's result names, for a later retry (create, reshard).
std::string TensorIdOf(const v1::ControlOp& op, const OpResult& result) {
  if (op.has_create_tensor() || op.has_reshard()) {
    return result.info.tensor_id();
  }
  return "";
}

// Drops the oldest of `order` (and their entries in `map`) beyond the
// limit.
template <typename Map>
void Trim(std::deque<std::string>& order, Map& map) {
  while (order.size() > kRememberedOps) {
    map.erase(order.front());
    order.pop_front();
  }
}

}  // namespace

std::pair<OpOutcomes::KeptResult, size_t> OpOutcomes::Keep(
    const OpResult& result) {
  std::pair<KeptResult, size_t> kept;
  KeptResult& out = kept.first;
  size_t& bytes = kept.second;
  out.info = result.info.SerializeAsString();
  bytes += out.info.size();
  out.names = result.names;
  for (const std::string& name : out.names) bytes += name.size();
  out.infos.reserve(result.infos.size());
  for (const v1::TensorInfo& info : result.infos) {
    out.infos.push_back(info.SerializeAsString());
    bytes += out.infos.back().size();
  }
  out.group = result.group.SerializeAsString();
  bytes += out.group.size();
  return kept;
}

std::optional<OpResult> OpOutcomes::Parse(const KeptResult& kept) {
  OpResult result;
  if (!result.info.ParseFromString(kept.info) ||
      !result.group.ParseFromString(kept.group)) {
    return std::nullopt;
  }
  result.names = kept.names;
  result.infos.resize(kept.infos.size());
  for (size_t i = 0; i < kept.infos.size(); ++i) {
    if (!result.infos[i].ParseFromString(kept.infos[i])) return std::nullopt;
  }
  return result;
}

bool OpOutcomes::Remembers(const v1::ControlOp& op) {
  return !op.client_request_id().empty() && !op.has_gather() &&
         op.request_case() != v1::ControlOp::REQUEST_NOT_SET;
}

uint64_t OpOutcomes::Digest(const v1::ControlOp& op) {
  // The request alone: who coordinated it, when it gives up and its ids
  // differ between a call and its retry. The bytes are those of `op` with
  // every other field cleared (the request field, tagged), without copying
  // `op`: a CreateTensors request holds every tensor's spec.
  const google::protobuf::Reflection* reflection = op.GetReflection();
  const google::protobuf::FieldDescriptor* field =
      reflection->GetOneofFieldDescriptor(
          op, v1::ControlOp::descriptor()->FindOneofByName("request"));
  std::string bytes;
  if (field != nullptr) {
    const google::protobuf::Message& request =
        reflection->GetMessage(op, field);
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    coded.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
        field->number(),
        google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint32(static_cast<uint32_t>(request.ByteSizeLong()));
    request.SerializeWithCachedSizes(&coded);
  }
  return Checksum64(bytes.data(), bytes.size());
}

std::optional<Replayed> OpOutcomes::Replay(const v1::ControlOp& op) const {
  if (!Remembers(op)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = committed_.find(op.client_request_id());
  if (it == committed_.end()) return std::nullopt;
  const v1::CommittedOp& record = it->second.committed;
  // Only a retry pays for the digest.
  if (record.request_digest() != Digest(op)) {
    return Replayed{
        absl::InvalidArgumentError(absl::StrCat(
            OpName(op), ": request id ", op.client_request_id(),
            " was used by another operation, ", Named(record), " (log entry ",
            record.log_entry(), "); give each operation an id of its own")),
        {},
        record.log_entry()};
  }
  if (it->second.result.has_value()) {
    std::optional<OpResult> result = Parse(*it->second.result);
    if (result.has_value()) {
      return Replayed{absl::OkStatus(), *std::move(result), record.log_entry()};
    }
  }
  return WithoutResult(record);
}

Replayed OpOutcomes::WithoutResult(const v1::CommittedOp& record) const {
  Replayed replayed;
  replayed.first_entry = record.log_entry();
  if (record.method() == "DeleteTensor") return replayed;
  if (!record.tensor_id().empty()) {
    absl::StatusOr<v1::TensorInfo> now = table_->Describe(record.tensor());
    if (now.ok() && now->tensor_id() == record.tensor_id()) {
      replayed.result.info = *std::move(now);
      return replayed;
    }
  }
  replayed.status = absl::FailedPreconditionError(absl::StrCat(
      Named(record), " with request id ", record.client_request_id(),
      " committed at log entry ", record.log_entry(),
      " (it is not run again); this daemon did not run it and keeps no "
      "copy of its result",
      record.tensor_id().empty() ? "" : ", and the tensor changed since",
      ": list or describe the tensors to see them now"));
  return replayed;
}

void OpOutcomes::Committed(const v1::ControlOp& op, int64_t n,
                           const OpResult& result) {
  if (!Remembers(op)) return;
  Record record;
  record.committed.set_client_request_id(op.client_request_id());
  record.committed.set_log_entry(n);
  record.committed.set_request_digest(Digest(op));
  record.committed.set_method(OpName(op));
  record.committed.set_tensor(OpTensor(op));
  record.committed.set_tensor_id(TensorIdOf(op, result));
  auto [kept, bytes] = Keep(result);
  if (bytes <= kRememberedResultBytes) {
    record.result = std::move(kept);
    record.result_bytes = bytes;
  }
  absl::MutexLock lock(&mu_);
  failed_.erase(op.client_request_id());
  auto it = committed_.find(op.client_request_id());
  if (it != committed_.end()) {
    result_bytes_ -= it->second.result_bytes;
    it->second = std::move(record);
  } else {
    committed_.emplace(op.client_request_id(), std::move(record));
    committed_order_.push_back(op.client_request_id());
  }
  result_bytes_ += committed_.at(op.client_request_id()).result_bytes;
  TrimLocked();
}

void OpOutcomes::TrimLocked() {
  while (committed_order_.size() > kRememberedOps) {
    auto it = committed_.find(committed_order_.front());
    if (it != committed_.end()) {
      result_bytes_ -= it->second.result_bytes;
      committed_.erase(it);
    }
    committed_order_.pop_front();
  }
  // Results go oldest first; the records stay (retries are still told).
  for (auto id = committed_order_.begin();
       result_bytes_ > kRememberedResultBytes && id != committed_order_.end();
       ++id) {
    Record& record = committed_.at(*id);
    result_bytes_ -= record.result_bytes;
    record.result_bytes = 0;
    record.result.reset();
  }
}

void OpOutcomes::Failed(const v1::ControlOp& op, int64_t n,
                        const absl::Status& status) {
  if (!Remembers(op)) return;
  v1::OperationStatus failed;
  failed.set_request_id(op.client_request_id());
  failed.set_state(v1::OperationStatus::STATE_FAILED);
  failed.set_method(OpName(op));
  failed.set_tensor(OpTensor(op));
  failed.set_log_entry(n);
  failed.set_code(static_cast<int>(status.code()));
  failed.set_message(std::string(status.message()));
  absl::MutexLock lock(&mu_);
  if (committed_.contains(op.client_request_id())) return;
  auto [it, added] =
      failed_.insert_or_assign(op.client_request_id(), std::move(failed));
  if (added) failed_order_.push_back(op.client_request_id());
  Trim(failed_order_, failed_);
}

std::vector<v1::CommittedOp> OpOutcomes::Export() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::CommittedOp> records;
  records.reserve(committed_order_.size());
  for (const std::string& id : committed_order_) {
    records.push_back(committed_.at(id).committed);
  }
  return records;
}

void OpOutcomes::Adopt(
    const google::protobuf::RepeatedPtrField<v1::CommittedOp>& records,
    const absl::flat_hash_set<std::string>& dropped_tensor_ids) {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<std::string, Record> adopted;
  std::deque<std::string> order;
  for (const v1::CommittedOp& committed : records) {
    if (committed.client_request_id().empty() ||
        adopted.contains(committed.client_request_id()) ||
        (!committed.tensor_id().empty() &&
         dropped_tensor_ids.contains(committed.tensor_id()))) {
      continue;
    }
    Record record;
    record.committed = committed;
    // The result stays where this daemon ran the same entry.
    auto mine = committed_.find(committed.client_request_id());
    if (mine != committed_.end() &&
        mine->second.committed.log_entry() == committed.log_entry()) {
      record.result = std::move(mine->second.result);
      record.result_bytes = mine->second.result_bytes;
    }
    order.push_back(committed.client_request_id());
    adopted.emplace(committed.client_request_id(), std::move(record));
  }
  committed_ = std::move(adopted);
  committed_order_ = std::move(order);
  result_bytes_ = 0;
  for (const auto& [id, record] : committed_) {
    result_bytes_ += record.result_bytes;
  }
  TrimLocked();
  for (const std::string& id : committed_order_) failed_.erase(id);
}

std::optional<v1::OperationStatus> OpOutcomes::Find(
    const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  if (auto it = committed_.find(request_id); it != committed_.end()) {
    const v1::CommittedOp& record = it->second.committed;
    v1::OperationStatus status;
    status.set_request_id(request_id);
    status.set_state(v1::OperationStatus::STATE_COMMITTED);
    status.set_method(record.method());
    status.set_tensor(record.tensor());
    status.set_log_entry(record.log_entry());
    return status;
  }
  if (auto it = failed_.find(request_id); it != failed_.end()) {
    return it->second;
  }
  return std::nullopt;
}

}  // namespace tessera::control_internal
