#include "server/collective/gloo/gloo_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tessera {
namespace {

using collective::TransferPlan;

std::chrono::milliseconds Remaining(absl::Time deadline) {
  // Gloo treats 0 as "no timeout" in places and rejects it in others.
  return std::chrono::milliseconds(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// A Store failure carried through Gloo's code, which only knows exceptions.
class StoreError : public gloo::IoException {
 public:
  explicit StoreError(absl::Status status)
      : gloo::IoException(std::string(status.message())),
        status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// Gloo's rendezvous store over Tessera's. Keys are scoped by group name;
// every wait ends at the rendezvous deadline.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<tessera::Store> store, std::string prefix,
                   absl::Time deadline)
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(
        store_->Set(Scoped(key), absl::string_view(data.data(), data.size())));
    set_keys_.push_back(Scoped(key));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_->Get(
        Scoped(key), std::max(absl::ZeroDuration(), deadline_ - absl::Now()));
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, Remaining(deadline_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> scoped;
    for (const std::string& key : keys) scoped.push_back(Scoped(key));
    const absl::Duration bound =
        std::max(absl::ZeroDuration(),
                 std::min(absl::FromChrono(timeout), deadline_ - absl::Now()));
    Check(store_->Wait(scoped, bound));
  }

  // Deletes the keys this member published; best effort, since a store
  // that fails here has already failed the rendezvous or will be noticed
  // by the next one.
  void DeleteOwnKeys() {
    for (const std::string& key : set_keys_) store_->Delete(key).IgnoreError();
  }

 private:
  std::string Scoped(const std::string& key) const {
    return absl::StrCat(prefix_, key);
  }
  static void Check(const absl::Status& status) {
    if (!status.ok()) throw StoreError(status);
  }

  std::shared_ptr<tessera::Store> store_;
  const std::string prefix_;
  const absl::Time deadline_;
  std::vector<std::string> set_keys_;
};

absl::Status StatusFromIoError(absl::string_view what) {
  const std::string lower = absl::AsciiStrToLower(what);
  if (absl::StrContains(lower, "timeout") ||
      absl::StrContains(lower, "timed out")) {
    return absl::DeadlineExceededError(what);
  }
  return absl::UnavailableError(what);
}

// Runs `fn`, turning whatever Gloo throws into a Status.
absl::Status CatchGloo(absl::FunctionRef<void()> fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const StoreError& e) {
    return e.status();
  } catch (const gloo::IoException& e) {
    return StatusFromIoError(e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(e.what());
  } catch (const gloo::Exception& e) {
    return absl::UnavailableError(e.what());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

// Stands in for the data pointer of empty tensors, which may be null.
uint8_t empty_byte = 0;

uint8_t* BytesOf(const Tensor& tensor) {
  void* data = tensor.data_ptr();
  return data == nullptr ? &empty_byte : static_cast<uint8_t*>(data);
}

// One byte range standing for a list of tensors, as Gloo's v-collectives
// want: the tensors' own memory when they lie back to back (views of one
// buffer, the usual case), otherwise a staging copy.
class PackedBytes {
 public:
  PackedBytes(absl::Span<const Tensor> tensors, bool copy_in)
      : tensors_(tensors) {
    for (const Tensor& t : tensors) {
      counts_.push_back(static_cast<int64_t>(t.nbytes()));
    }
    data_ = Adjacent();
    if (data_ != nullptr) return;
    int64_t total = 0;
    for (int64_t n : counts_) total += n;
    staging_.resize(total);
    data_ = staging_.data();
    if (!copy_in) return;
    for (size_t i = 0, offset = 0; i < tensors_.size();
         offset += counts_[i++]) {
      std::memcpy(data_ + offset, BytesOf(tensors_[i]), counts_[i]);
    }
  }

  uint8_t* data() const { return data_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  uint8_t* at(int i) const {
    int64_t offset = 0;
    for (int j = 0; j < i; ++j) offset += counts_[j];
    return data_ + offset;
  }

  // Copies staged bytes back into the tensors (nothing to do in place).
  void CopyOut() const {
    if (staging_.empty()) return;
    for (size_t i = 0, offset = 0; i < tensors_.size();
         offset += counts_[i++]) {
      std::memcpy(BytesOf(tensors_[i]), data_ + offset, counts_[i]);
    }
  }

 private:
  uint8_t* Adjacent() const {
    uint8_t* base = nullptr;
    uint8_t* next = nullptr;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (counts_[i] == 0) continue;
      uint8_t* data = BytesOf(tensors_[i]);
      if (base == nullptr) base = next = data;
      if (data != next) return nullptr;
      next += counts_[i];
    }
    return base == nullptr ? &empty_byte : base;
  }

  absl::Span<const Tensor> tensors_;
  std::vector<int64_t> counts_;
  std::vector<uint8_t> staging_;
  uint8_t* data_ = nullptr;
};

std::vector<size_t> AsSizes(const std::vector<int64_t>& counts) {
  return std::vector<size_t>(counts.begin(), counts.end());
}

// One point-to-point transfer of a Gather or Scatter.
struct Transfer {
  int peer;
  uint8_t* data;
  size_t nbytes;
};

// Posts every send and receive at once, then waits for all of them, so no
// member waits on another in a fixed order. Empty transfers are skipped on
// both ends (the agreed plan tells both that they are empty).
void PointToPoint(const GlooBackend::Call& call, uint8_t slot_prefix,
                  absl::Span<const Transfer> sends,
                  absl::Span<const Transfer> recvs) {
  const uint64_t slot = gloo::Slot::build(slot_prefix, call.tag);
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> out, in;
  for (const Transfer& t : sends) {
    if (t.nbytes == 0) continue;
    out.push_back(call.context->createUnboundBuffer(t.data, t.nbytes));
    out.back()->send(t.peer, slot);
  }
  for (const Transfer& t : recvs) {
    if (t.nbytes == 0) continue;
    in.push_back(call.context->createUnboundBuffer(t.data, t.nbytes));
    in.back()->recv(t.peer, slot);
  }
  for (auto& buffer : out) {
    if (!buffer->waitSend(Remaining(call.deadline))) {
      GLOO_THROW_IO_EXCEPTION("send aborted");
    }
  }
  for (auto& buffer : in) {
    if (!buffer->waitRecv(Remaining(call.deadline))) {
      GLOO_THROW_IO_EXCEPTION("receive aborted");
    }
  }
}

// The root's own share of a Gather or Scatter never leaves the process.
void CopyLocal(uint8_t* dst, const uint8_t* src, size_t nbytes) {
  if (dst != src && nbytes > 0) std::memcpy(dst, src, nbytes);
}

// Small collectives of small groups go to every member at once: one
// round of messages, where Gloo's ring all-gather takes size - 1 rounds
// and its barrier log2(size), each round a wake-up on both ends. The
// control log pays one all-gather and one barrier per operation
// (docs/control_log.md): with 4 daemons on 2 cores a round is about half
// a millisecond. Every member decides alike, from the group's size and
// the agreed sizes.
constexpr int kMaxDirectMembers = 16;
constexpr int64_t kMaxDirectShareBytes = 4096;

bool DirectAllGather(int size, const std::vector<int64_t>& counts) {
  if (size > kMaxDirectMembers) return false;
  for (int64_t n : counts) {
    if (n > kMaxDirectShareBytes) return false;
  }
  return true;
}

// Sends this member's share (at(me), bytes(me) long) to every other
// member and receives each one's share into at(peer).
void ExchangeShares(const GlooBackend::Call& call, uint8_t slot_prefix,
                    absl::FunctionRef<uint8_t*(int)> at,
                    absl::FunctionRef<size_t(int)> bytes) {
  const int me = call.context->rank;
  std::vector<Transfer> sends, recvs;
  for (int peer = 0; peer < call.context->size; ++peer) {
    if (peer == me) continue;
    sends.push_back(Transfer{peer, at(me), bytes(me)});
    recvs.push_back(Transfer{peer, at(peer), bytes(peer)});
  }
  PointToPoint(call, slot_prefix, sends, recvs);
}

// A barrier of one byte to and from every other member: a member leaves
// once every other has arrived.
void BarrierDirect(const GlooBackend::Call& call) {
  std::vector<uint8_t> flags(static_cast<size_t>(call.context->size));
  ExchangeShares(
      call, gloo::kBarrierSlotPrefix,
      [&](int r) { return &flags[static_cast<size_t>(r)]; },
      [](int) { return size_t{1}; });
}

// All-gathers `plan` and checks that the members agree; the total bytes
// the collective moves, or INVALID_ARGUMENT.
absl::StatusOr<int64_t> AgreeOn(const GlooBackend::Call& call,
                                const TransferPlan& plan) {
  std::vector<int64_t> mine = plan.Encode();
  const int size = call.context->size;
  std::vector<int64_t> all(mine.size() * size);
  const size_t share = mine.size() * sizeof(int64_t);
  if (DirectAllGather(
          size, std::vector<int64_t>(size, static_cast<int64_t>(share)))) {
    std::memcpy(all.data() + call.context->rank * mine.size(), mine.data(),
                share);
    ExchangeShares(
        call, gloo::kAllgatherSlotPrefix,
        [&](int r) {
          return reinterpret_cast<uint8_t*>(all.data() + r * mine.size());
        },
        [&](int) { return share; });
  } else {
    gloo::AllgathervOptions opts(call.context);
    opts.setInput<int64_t>(mine.data(), mine.size());
    opts.setOutput<int64_t>(all.data(), std::vector<size_t>(size, mine.size()));
    opts.setTag(call.tag);
    opts.setTimeout(Remaining(call.deadline));
    gloo::allgatherv(opts);
  }
  return collective::CheckPlansAgree(plan.op, size, all);
}

}  // namespace

GlooBackend::GlooBackend(const ProcessGroupOptions& options,
                         std::shared_ptr<gloo::Context> context)
    : ProcessGroup(options.rank, options.global_ranks, options.name),
      timeout_(options.timeout),
      context_(std::move(context)) {}

GlooBackend::~GlooBackend() { Shutdown(); }

absl::StatusOr<std::shared_ptr<GlooBackend>> GlooBackend::Create(
    const ProcessGroupOptions& options) {
  const int size = static_cast<int>(options.global_ranks.size());
  const absl::Time deadline = absl::Now() + options.timeout;
  GlooStoreAdapter store(options.store,
                         absl::StrCat("gloo/", options.name, "/"), deadline);
  auto context =
      std::make_shared<gloo::rendezvous::Context>(options.rank, size);
  context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status status = CatchGloo([&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo cannot listen on hostname '", options.hostname,
                     "': ", status.message()));
  }
  status = CatchGloo([&] {
    context->connectFullMesh(store, device);
    // Everyone has read everyone's addresses once all pass this barrier.
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(Remaining(deadline));
    gloo::barrier(barrier);
  });
  store.DeleteOwnKeys();
  if (!status.ok()) {
    return Annotate(
        status, absl::StrCat("joining gloo group ", options.name, " as rank ",
                             options.rank, " of ", size));
  }
  return std::shared_ptr<GlooBackend>(new GlooBackend(options, context));
}

uint32_t GlooBackend::NextTag() { return next_tag_++; }

absl::Status GlooBackend::Run(absl::string_view op, const TransferPlan* plan,
                              absl::FunctionRef<void(const Call&)> body) {
  const std::string where = absl::StrCat(op, " on gloo group ", name());
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return Annotate(broken_, where);
  const absl::Time deadline = absl::Now() + timeout_;
  absl::StatusOr<int64_t> total = int64_t{1};
  absl::Status status = CatchGloo([&] {
    if (plan != nullptr) {
      total = AgreeOn({context_, NextTag(), deadline}, *plan);
    }
    if (total.ok() && *total > 0) body({context_, NextTag(), deadline});
  });
  if (!status.ok()) {
    broken_ = absl::FailedPreconditionError(absl::StrCat(
        "the group is broken by an earlier failure (", status.message(), ")"));
    return Annotate(status, where);
  }
  return total.status();
}

absl::Status GlooBackend::Barrier() {
  return Run("Barrier", nullptr, [](const Call& call) {
    if (call.context->size <= kMaxDirectMembers) {
      BarrierDirect(call);
      return;
    }
    gloo::BarrierOptions opts(call.context);
    opts.setTag(call.tag);
    opts.setTimeout(Remaining(call.deadline));
    gloo::barrier(opts);
  });
}

absl::Status GlooBackend::Broadcast(const Tensor& tensor, int root) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanBroadcast(*this, tensor, root));
  return Run("Broadcast", &plan, [&](const Call& call) {
    gloo::BroadcastOptions opts(call.context);
    opts.setOutput<uint8_t>(BytesOf(tensor), tensor.nbytes());
    opts.setRoot(root);
    opts.setTag(call.tag);
    opts.setTimeout(Remaining(call.deadline));
    gloo::broadcast(opts);
  });
}

absl::Status GlooBackend::AllGather(const Tensor& input,
                                    absl::Span<const Tensor> outputs) {
  return AllGatherImpl(input, outputs, /*agree=*/true);
}

absl::Status GlooBackend::AllGatherAgreed(const Tensor& input,
                                          absl::Span<const Tensor> outputs) {
  return AllGatherImpl(input, outputs, /*agree=*/false);
}

absl::Status GlooBackend::AllGatherImpl(const Tensor& input,
                                        absl::Span<const Tensor> outputs,
                                        bool agree) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanAllGather(*this, input, outputs));
  return Run("AllGather", agree ? &plan : nullptr, [&](const Call& call) {
    PackedBytes out(outputs, /*copy_in=*/false);
    if (DirectAllGather(call.context->size, out.counts())) {
      CopyLocal(out.at(rank()), BytesOf(input), input.nbytes());
      ExchangeShares(
          call, gloo::kAllgatherSlotPrefix, [&](int r) { return out.at(r); },
          [&](int r) { return static_cast<size_t>(out.counts()[r]); });
      out.CopyOut();
      return;
    }
    gloo::AllgathervOptions opts(call.context);
    // Gloo copies the input into place itself, unless it already is there.
    if (out.at(rank()) != BytesOf(input)) {
      opts.setInput<uint8_t>(BytesOf(input), input.nbytes());
    }
    opts.setOutput<uint8_t>(out.data(), AsSizes(out.counts()));
    opts.setTag(call.tag);
    opts.setTimeout(Remaining(call.deadline));
    gloo::allgatherv(opts);
    out.CopyOut();
  });
}

// Gloo's gather and scatter need equal sizes, so uneven ones go point to
// point.
absl::Status GlooBackend::Gather(const Tensor& input,
                                 absl::Span<const Tensor> outputs, int root) {
  return GatherImpl(input, outputs, root, /*agree=*/true);
}

absl::Status GlooBackend::GatherAgreed(const Tensor& input,
                                       absl::Span<const Tensor> outputs,
                                       int root) {
  return GatherImpl(input, outputs, root, /*agree=*/false);
}

absl::Status GlooBackend::GatherImpl(const Tensor& input,
                                     absl::Span<const Tensor> outputs, int root,
                                     bool agree) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanGather(*this, input, outputs, root));
  return Run("Gather", agree ? &plan : nullptr, [&](const Call& call) {
    if (rank() != root) {
      const Transfer send{root, BytesOf(input), input.nbytes()};
      PointToPoint(call, gloo::kGatherSlotPrefix, {send}, {});
      return;
    }
    std::vector<Transfer> recvs;
    for (int r = 0; r < size(); ++r) {
      if (r != root)
        recvs.push_back({r, BytesOf(outputs[r]), outputs[r].nbytes()});
    }
    CopyLocal(BytesOf(outputs[root]), BytesOf(input), input.nbytes());
    PointToPoint(call, gloo::kGatherSlotPrefix, {}, recvs);
  });
}

absl::Status GlooBackend::Scatter(absl::Span<const Tensor> inputs,
                                  const Tensor& output, int root) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanScatter(*this, inputs, output, root));
  return Run("Scatter", &plan, [&](const Call& call) {
    if (rank() != root) {
      const Transfer recv{root, BytesOf(output), output.nbytes()};
      PointToPoint(call, gloo::kScatterSlotPrefix, {}, {recv});
      return;
    }
    std::vector<Transfer> sends;
    for (int r = 0; r < size(); ++r) {
      if (r != root)
        sends.push_back({r, BytesOf(inputs[r]), inputs[r].nbytes()});
    }
    CopyLocal(BytesOf(output), BytesOf(inputs[root]), output.nbytes());
    PointToPoint(call, gloo::kScatterSlotPrefix, sends, {});
  });
}

absl::Status GlooBackend::AllToAll(absl::Span<const Tensor> inputs,
                                   absl::Span<const Tensor> outputs) {
  ASSIGN_OR_RETURN(TransferPlan plan,
                   collective::PlanAllToAll(*this, inputs, outputs));
  return Run("AllToAll", &plan, [&](const Call& call) {
    PackedBytes in(inputs, /*copy_in=*/true);
    PackedBytes out(outputs, /*copy_in=*/false);
    gloo::AlltoallvOptions opts(call.context);
    opts.setInput<uint8_t>(in.data(), in.counts());
    opts.setOutput<uint8_t>(out.data(), out.counts());
    opts.setTag(call.tag);
    opts.setTimeout(Remaining(call.deadline));
    gloo::alltoallv(opts);
    out.CopyOut();
  });
}

absl::Status GlooBackend::Usable() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

void GlooBackend::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (context_ == nullptr) return;
  // Dropping the context closes the pairs' sockets, so peers blocked on
  // this member fail promptly instead of waiting out their timeout.
  context_.reset();
  broken_ = absl::FailedPreconditionError("the group is shut down");
}

namespace {

// Registered while the program starts: tessera_process_group links this
// library whole (CMake's WHOLE_ARCHIVE), so the linker keeps this
// initialiser although nothing refers to it.
[[maybe_unused]] const bool kGlooBackendRegistered =
    RegisterProcessGroupBackend(
        "gloo",
        [](const ProcessGroupOptions& options)
            -> absl::StatusOr<std::shared_ptr<ProcessGroup>> {
          ASSIGN_OR_RETURN(std::shared_ptr<GlooBackend> group,
                           GlooBackend::Create(options));
          return std::shared_ptr<ProcessGroup>(std::move(group));
        });

}  // namespace

}  // namespace tessera
