// Client: a connection to a Tessera cluster of daemons (`tessera-server`),
// usable from any process, on any host — not a rank.
//
//   auto client = tessera::Client::Connect("10.0.0.1:29600").value();
//   auto view = client->Create("w", {10, 20}, spec).value();
//   view.metadata();                          // shards, offsets, placements
//   auto shard = view.remote_shards()[1].to_here();   // one whole shard
//   auto box = view.ReadRegion({2, 5}, {6, 10});      // any box
//   auto all = view.Read();                           // the whole tensor
//   view.Write({0, 0}, values);                       // any box
//
// Connect asks the given daemon for the cluster (ClusterInfo: every
// daemon's address) and keeps one channel per daemon. Operations that
// change tensors go through one daemon's ControlService (see
// proto/tessera/v1/control.proto: the daemons run them together);
// reads and writes go straight to the shards' owners, in parallel, and only
// the bytes of the requested box cross the network.
//
// Failure: every call has a deadline (ClientOptions::timeout, or the
// TransferOptions' for reads and writes); a dead daemon gives UNAVAILABLE
// (or DEADLINE_EXCEEDED) within it, never a hang. Errors carry the daemons'
// gRPC codes: NOT_FOUND, ALREADY_EXISTS, INVALID_ARGUMENT, OUT_OF_RANGE,
// FAILED_PRECONDITION, UNAVAILABLE, DATA_LOSS (a checksum mismatch).
//
// Thread-safety: a Client and its views are safe to use from many threads
// at once. A view is a snapshot of a tensor's metadata: after a reshard or
// a delete, its reads and writes fail (NOT_FOUND or FAILED_PRECONDITION)
// instead of touching the new layout; Client::Open gets a fresh one.
// Concurrent writes to overlapping boxes, or reads of a box being written,
// may see either bytes (no isolation, as with PyTorch's shards).
#ifndef TESSERA_CLIENT_CLIENT_H_
#define TESSERA_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/lanes.h"
#include "client/remote_shard.h"
#include "client/stall_watchdog.h"
#include "common/cancellation.h"
#include "common/dtype.h"
#include "common/sharded_tensor_metadata.h"
#include "common/sharding_spec.h"
#include "common/tensor/tensor.h"
#include "tessera/v1/control.pb.h"
#include "wire/version_id.h"

namespace tessera {

namespace internal_client {
// The connections shared by a Client and its views.
class Cluster;
}  // namespace internal_client

// The longest ClientOptions::request_id: the ".N" suffixes of later calls
// keep ids within what daemons accept (kMaxRequestIdBytes).
inline constexpr size_t kMaxClientRequestIdBytes = 64;
// Attempts of a logged call answered UNAVAILABLE (see Client::Delete).
inline constexpr int kLoggedCallAttempts = 3;
// ClientOptions::list_page_bytes by default: far below the client's
// message limit, so that a page's last tensor (which may take it past the
// size asked for) cannot reach it.
inline constexpr int64_t kDefaultListPageBytes = int64_t{16} << 20;

struct ClientOptions {
  // Deadline of each control call (create, list, describe, delete, reshard,
  // save, load) and of connecting.
  absl::Duration timeout = absl::Seconds(60);
  // Fetch shard bytes over the daemons' raw-TCP data plane when they have
  // one (docs/data_plane.md); otherwise over gRPC streams.
  bool data_plane = true;
  // Read the shards of daemons on this host through their local
  // path (docs/data_plane.md, "The local path"), falling back to the
  // streams above when it cannot be taken.
  bool use_local_path = true;
  // Reads of shards smaller than this, and writes of fewer bytes, take the
  // stream even so (see kLocalPathMinBytes, client/shard_client.h).
  int64_t local_min_bytes = kLocalPathMinBytes;
  // The most data-plane connections to one daemon a large read or write is
  // striped across (client/lanes.h; docs/data_plane.md, "Lanes"): 0 is
  // kDefaultDataLanes, 1 one connection per transfer.
  int data_lanes = 0;
  // Reads of a tensor with replicas: a holder that moves no byte of a
  // piece for this long is given up for the next holder of the shard
  // (client/stall_watchdog.h), so a stalled owner costs about this much,
  // not the transfer's deadline. The last holder asked keeps the whole
  // time left. Zero: no watch; each holder gets an even share of the time
  // left instead.
  absl::Duration holder_patience = kDefaultHolderPatience;
  // Tensors' metadata (List, OpenMany, read plans, joins) is read in
  // ListTensors replies of about this many bytes each, so that however
  // many tensors and shards there are no reply nears the client's message
  // limit (256 MiB), and a daemon builds no reply larger than about this
  // while it holds its table. At least 1 (INVALID_ARGUMENT otherwise).
  int64_t list_page_bytes = kDefaultListPageBytes;
  // The request id of this client's calls (wire/request_id.h): the daemons
  // log it with the operation a call starts, and it is the operation's
  // idempotency key. A logged call (Create, Delete, Reshard, Save, Load)
  // that committed already under its id is answered with its first
  // outcome and never applied twice. Empty: a new random id per call.
  // Set: the first logged call of this client carries it, the next ones
  // "<id>.2", "<id>.3", ... in the order they start, so that running the
  // same calls again with the same id (a script run twice) applies none of
  // them twice. 1 to kMaxClientRequestIdBytes of A-Z a-z 0-9 . _ : -
  // (Connect refuses others with INVALID_ARGUMENT).
  std::string request_id;
};

// Called as bytes arrive or leave: (bytes done, bytes in all). Calls are
// serialized (never two at once) but may come from transfer threads; done
// only grows and the last call has done == total. Keep it cheap.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct TransferOptions {
  // Deadline of the whole transfer.
  absl::Duration timeout = absl::Seconds(300);
  // Largest chunk a daemon sends or receives; 0: the daemon's default.
  int64_t chunk_bytes = 0;
  // At most this many shard transfers run at once.
  int parallelism = 16;
  ProgressFn progress;
  // When set, Cancel() ends the transfer promptly with CANCELLED, also
  // while it waits on a stalled daemon (the wait is interrupted). A
  // cancelled read leaves the destination partly written; a cancelled
  // write may have been applied by some owners, as any failed write (the
  // error names them).
  std::shared_ptr<Cancellation> cancel;
  // Reads only: when set, receives the published version read (every
  // piece of a read is of this one version; 0 for an unversioned tensor
  // or a view of an open version). See docs/versions.md.
  int64_t* version = nullptr;
};

// How Client::Create fills a new tensor.
enum class TensorInit { kEmpty, kZeros, kOnes, kFull, kRand, kRandn };

struct CreateOptions {
  DType dtype = DType::kFloat32;
  TensorInit init = TensorInit::kEmpty;
  double fill_value = 0;  // kFull
  uint64_t seed = 0;      // kRand, kRandn: same seed, same values
  // Copies of every shard, the owner's included
  // (CreateTensorRequest.copies): 1, the owner's only; C > 1, C - 1 other
  // daemons hold a replica (other hosts first). Writes go to every copy;
  // reads fall back to a replica when the owner is dead, stalled or
  // restarting. 1 to the number of daemons (INVALID_ARGUMENT otherwise).
  int copies = 1;
  // Published versions kept (docs/versions.md): 0 or 1, an unversioned
  // tensor written in place; K >= 2 (at most 64), a versioned one,
  // written only through Client::Begin and read one published version
  // at a time. Not yet with copies > 1.
  int versions = 0;
};

// One tensor of Client::CreateMany.
struct TensorToCreate {
  std::string name;
  std::vector<int64_t> sizes;
  ShardingSpec spec;
  CreateOptions options;
};

// Client::Begin's options.
struct BeginOptions {
  // Leave the new versions' bytes unset instead of copying the latest
  // version's (for writers that overwrite every element): they read as
  // zeros until written.
  bool empty = false;
  // With `empty`, for writers that write every element before publishing:
  // a version begun in a freed version's memory (docs/versions.md,
  // "Reuse") is not zeroed first, so an element they miss holds an older
  // version's value of the same tensor. Saves the daemons a pass over the
  // memory at every begin. INVALID_ARGUMENT without `empty`.
  bool skip_zeroing = false;
  // How the versions end when nobody publishes or aborts them
  // (docs/versions.md, "Leases"). Zero (the default): they live while
  // this process does: it renews their lease on every daemon, a sixth of
  // it apart, from a thread of the client, while a VersionWriter of the
  // group lives (and until it is published or aborted), and they are
  // dropped 30 s after the last renewal. A write may then take as long as
  // it needs, and a writer that dies or stops frees them within 30 s.
  // Positive: dropped unless published within `lease` of the begin, or,
  // with `renew`, within `lease` of their last renewal.
  absl::Duration lease = absl::ZeroDuration();
  bool renew = false;
};

class ProgressCounter;
class ReadPlan;
struct ReadItem;
class Snapshot;
class VersionWatcher;
class VersionWriter;

// A named sharded tensor of the cluster: its metadata and where each shard
// lives. Cheap to copy (shares the client's connections).
class ShardedTensorView {
 public:
  const std::string& name() const { return info_.name(); }
  // Changes when the tensor is resharded or re-created.
  const std::string& tensor_id() const { return info_.tensor_id(); }
  const ShardedTensorMetadata& metadata() const { return metadata_; }
  const std::vector<int64_t>& sizes() const { return metadata_.size; }
  DType dtype() const { return metadata_.tensor_properties.dtype; }
  // The rank owning shard i of metadata().shards_metadata.
  int owner_rank(size_t shard) const { return info_.shard_ranks(shard); }
  // Whether some shards were lost (their owner restarted; see
  // v1::TensorInfo.lost_shards): reads and writes touching them are
  // UNAVAILABLE.
  bool degraded() const { return info_.lost_shards_size() > 0; }
  const v1::TensorInfo& info() const { return info_; }

  // Versioned tensors (docs/versions.md): whether this one is, the latest
  // published version when this view was made (Client::Open makes a fresh
  // view; each read reports what it read in TransferOptions::version), the
  // version this view is pinned to (0: each read reads the latest), and
  // whether it is an open version (a VersionWriter's, which writes go
  // into).
  bool versioned() const { return Versioned(info_); }
  int64_t version() const { return info_.version(); }
  int64_t at_version() const { return at_version_; }
  bool open_version() const { return open_version_; }
  // This tensor at published version `number`: its reads return exactly
  // that version, NOT_FOUND once it is no longer kept (naming the kept
  // ones). FAILED_PRECONDITION for an unversioned tensor; INVALID_ARGUMENT
  // for a number below 1. A reshard after this view was made keeps the
  // latest version under the new layout (docs/versions.md, "Resharding"):
  // reads of that version then come from there.
  absl::StatusOr<ShardedTensorView> AtVersion(int64_t number) const;
  // This view at_version() as an open version (VersionWriter's views).
  ShardedTensorView AsOpenVersion() const {
    ShardedTensorView view = *this;
    view.open_version_ = true;
    return view;
  }

  // One RemoteShard per shard, in metadata order (to_here() fetches it
  // whole from its owner).
  std::vector<RemoteShard> remote_shards() const;

  // The box [offsets, offsets + sizes) of the tensor, as a new contiguous
  // CPU tensor: each shard that overlaps it sends only the overlap, all
  // owners at once. OUT_OF_RANGE for a box outside the tensor,
  // INVALID_ARGUMENT for a wrong rank (number of dims) or negative sizes.
  absl::StatusOr<Tensor> ReadRegion(absl::Span<const int64_t> offsets,
                                    absl::Span<const int64_t> sizes,
                                    const TransferOptions& options = {}) const;
  // Same, into `destination` (a CPU tensor of the box's sizes and the
  // tensor's dtype, any strides), written in place. A tensor resharded (or
  // created again with the same sizes and dtype) since this view was made
  // is read from its new layout, as a read plan does.
  absl::Status ReadRegionInto(absl::Span<const int64_t> offsets,
                              const Tensor& destination,
                              const TransferOptions& options = {}) const;
  // The whole tensor.
  absl::StatusOr<Tensor> Read(const TransferOptions& options = {}) const;

  // Writes `data` (the tensor's dtype, any strides, CPU) at `offsets`: each
  // owner receives the part its shards hold, all at once. Errors as
  // ReadRegion, plus INVALID_ARGUMENT for a dtype mismatch. A write to
  // several owners is not atomic: every owner is tried, and a failure names
  // each box written and each box not written with its owner and error
  // (WriteEveryRegionPiece, client/region_transfer.h), so the caller can retry
  // exactly those. Each piece goes over its holder's data plane, straight
  // into the shard, when the holder can take it there
  // (ShardClient::WriteRegion), else through ControlService.WriteRegion;
  // a box named not written may then hold part of the new bytes
  // (docs/data_plane.md, "Writes"). A write refused because the tensor is
  // being resharded (or was, since this view was made) is written again,
  // whole, into the tensor as it is once the reshard ends, within the
  // timeout; created again with other sizes or dtype, FAILED_PRECONDITION.
  absl::Status Write(absl::Span<const int64_t> offsets, const Tensor& data,
                     const TransferOptions& options = {}) const;

 private:
  friend class Client;
  // UNAVAILABLE naming the lost shards (info().lost_shards(): their owner
  // restarted) that the box [offsets, offsets + sizes) touches.
  absl::Status CheckNotLost(absl::Span<const int64_t> offsets,
                            absl::Span<const int64_t> sizes,
                            absl::string_view what) const;
  ShardedTensorView(std::shared_ptr<internal_client::Cluster> cluster,
                    v1::TensorInfo info, ShardedTensorMetadata metadata);

  // The id reads and writes name: the tensor's, or its version's.
  std::string DataId() const;
  // Write into this view's layout alone.
  absl::Status WriteToThisLayout(absl::Span<const int64_t> offsets,
                                 const Tensor& data,
                                 const TransferOptions& options) const;
  // The tensor named name() as it is now, when its sizes and dtype are
  // this view's (FAILED_PRECONDITION otherwise; NOT_FOUND when deleted).
  absl::StatusOr<ShardedTensorView> Reopened() const;
  // ReadRegionInto from this view's layout alone.
  absl::Status ReadFromThisLayout(absl::Span<const int64_t> offsets,
                                  const Tensor& destination,
                                  const TransferOptions& options) const;
  // After a read of this view ended NOT_FOUND (`read`): the tensor named
  // name() now, at at_version(), when it is no longer tensor_id()
  // (resharded, or created again, since this view was made) with the same
  // sizes and dtype, and keeps that version. Otherwise the error to
  // report: NOT_FOUND saying why (deleted, version not kept),
  // FAILED_PRECONDITION for other sizes or dtype.
  absl::StatusOr<ShardedTensorView> Relocated(const absl::Status& read) const;
  // Asks a holder that took a piece to mark holders[k] stale for each k in
  // `missed` (ControlService.MarkStale): they missed it.
  absl::Status MarkStale(const std::vector<int>& holders,
                         const std::vector<size_t>& missed,
                         absl::Time deadline) const;
  // One pass of ReadRegionInto over the pieces `wanted` says yes to, from
  // `id`; versions[shard] receives the version each piece was.
  absl::Status ReadPieces(absl::Span<const int64_t> offsets,
                          const Tensor& destination,
                          const TransferOptions& options, const std::string& id,
                          const std::function<bool(size_t shard)>& wanted,
                          std::vector<int64_t>* versions,
                          ProgressCounter* progress) const;

  std::shared_ptr<internal_client::Cluster> cluster_;
  v1::TensorInfo info_;
  ShardedTensorMetadata metadata_;
  int64_t at_version_ = 0;
  bool open_version_ = false;
};

// One box of WriteMany: `data` written at `offsets` of `view`.
struct BoxWrite {
  ShardedTensorView view;
  std::vector<int64_t> offsets;
  Tensor data;
};

// Writes every box as ShardedTensorView::Write does, up to
// options.parallelism at once and all within options.timeout: a state
// dict's small tensors cost one call, not a round trip each in turn. The
// boxes are written in no order, so two that share elements of one
// tensor's data are refused before anything is written (INVALID_ARGUMENT
// naming them). Returns OK, or the error of the first box (in `writes`' order)
// that failed; once one failed no other starts, and those started may
// have been written, as after any failed write. options.progress and
// options.version are not used. Thread-safe; `writes` must outlive the
// call.
absl::Status WriteMany(absl::Span<const BoxWrite> writes,
                       const TransferOptions& options = {});

// "committed", "failed", "pending" or "unknown" (also for
// STATE_UNSPECIFIED), as `tessera op` and Python's Client.operation say it.
absl::string_view OperationStateName(v1::OperationStatus::State state);

class Client {
 public:
  // Connects to the daemon at `address` and learns the cluster from it
  // (one GetCluster call). UNAVAILABLE / DEADLINE_EXCEEDED when it cannot
  // be reached within options.timeout.
  static absl::StatusOr<std::shared_ptr<Client>> Connect(
      const std::string& address, const ClientOptions& options = {});

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const v1::ClusterInfo& cluster() const;
  int world_size() const { return cluster().world_size(); }

  // Creates a named tensor laid out by `spec` (placements name the
  // cluster's ranks). ALREADY_EXISTS when the name is taken; the
  // reference's errors for a bad spec (INVALID_ARGUMENT).
  absl::StatusOr<ShardedTensorView> Create(const std::string& name,
                                           std::vector<int64_t> sizes,
                                           const ShardingSpec& spec,
                                           const CreateOptions& options = {});
  // Creates every tensor of `tensors` as one logged call (the cost of one
  // Create, whatever their number: a model's state dict): all of them, or
  // none, the error naming the first refused (Create's errors; and
  // INVALID_ARGUMENT for none, more than 4096, or a name given twice).
  // Returns their views, in order.
  absl::StatusOr<std::vector<ShardedTensorView>> CreateMany(
      const std::vector<TensorToCreate>& tensors);
  // What became of the logged call that carried `request_id` (any
  // client's): STATE_COMMITTED, STATE_FAILED (nothing applied; a retry runs
  // it again), STATE_PENDING (waiting on a daemon) or STATE_UNKNOWN (no
  // daemon remembers it: see proto/tessera/v1/control.proto). Asks the
  // connected daemon, then the others while none knows it.
  absl::StatusOr<v1::OperationStatus> Operation(
      const std::string& request_id) const;
  // Every tensor, sorted by name.
  absl::StatusOr<std::vector<ShardedTensorView>> List() const;
  // The tensor named `name`; NOT_FOUND when there is none. A tensor this
  // client opened before is checked, not fetched again: the connected
  // daemon gives the digest of its description over the data plane (one
  // small exchange, no gRPC call), and the description this client holds
  // is used again when the digests agree (any change to the tensor, its
  // id, layout, versions or holders' states changes the digest); otherwise,
  // and without a data plane, the daemon describes it through gRPC. A
  // daemon that does not answer the digest within the deadline
  // (ClientOptions::timeout) gives DEADLINE_EXCEEDED then, as the gRPC call
  // would.
  absl::StatusOr<ShardedTensorView> Open(const std::string& name) const;
  // Views of `names`, in their order, from the daemons' descriptions now:
  // one or two names each as Open opens it (its cache checked by digest),
  // more by one ListTensors of just those names (one call for a state dict
  // of any size). NOT_FOUND names the first that does not exist.
  absl::StatusOr<std::vector<ShardedTensorView>> OpenMany(
      const std::vector<std::string>& names) const;
  // Create, Delete, Reshard, Save and Load are logged calls: each carries a
  // request id (ClientOptions::request_id) and is retried with it, up to
  // kLoggedCallAttempts in all within the timeout, when a daemon answers
  // UNAVAILABLE (restarting, or the operation was not applied); the id
  // makes the retry safe. A call that ends DEADLINE_EXCEEDED names its id:
  // Operation(id) tells what became of it.
  absl::Status Delete(const std::string& name);
  // Deletes every tensor of `names` (distinct) in one logged call per
  // kMaxDeleteTensors of them: all of a call's, or none (NOT_FOUND names
  // the first that does not exist; INVALID_ARGUMENT for a name given
  // twice, before any call). Empty `names`: OK, nothing done. When a call
  // after the first fails, its error says how many names (the first ones)
  // the calls before it deleted.
  static constexpr size_t kMaxDeleteTensors = 4096;
  absl::Status DeleteMany(const std::vector<std::string>& names);
  // Lays the tensor out by `spec`; returns its new view. A versioned
  // tensor moves its latest published version, under the same number, and
  // drops the older ones (docs/versions.md, "Resharding"). While one of
  // its versions is open the daemons refuse it, applying nothing, and it is
  // asked again (a new logged call each time) until one is not or the
  // timeout comes: ABORTED then, naming the open versions.
  absl::StatusOr<ShardedTensorView> Reshard(const std::string& name,
                                            const ShardingSpec& spec);
  // The whole tensor gathered by the connected daemon (one collective) and
  // streamed back; ShardedTensorView::Read fetches the shards directly.
  absl::StatusOr<Tensor> Gather(const std::string& name,
                                const TransferOptions& options = {}) const;

  // Saves tensors (empty: all) into `path`, a directory every daemon can
  // write, relative to the daemons' checkpoint root or inside one
  // (proto/tessera/v1/control.proto). A checkpoint already there is
  // ALREADY_EXISTS unless `overwrite`. `versions` saves a kept older
  // version of versioned tensors (by name; the others save their latest):
  // NOT_FOUND for a version no longer kept. Snapshot::Save saves pinned
  // versions. Returns the names saved.
  absl::StatusOr<std::vector<std::string>> Save(
      const std::string& path, const std::vector<std::string>& names = {},
      bool overwrite = false,
      const std::map<std::string, int64_t>& versions = {});
  // Loads a checkpoint (request.path; names, as_names, replace, spec as in
  // proto/tessera/v1/control.proto).
  absl::StatusOr<std::vector<ShardedTensorView>> Load(
      const v1::LoadCheckpointRequest& request);

  // Versions (docs/versions.md). Opens one new version of each named
  // tensor (all versioned), starting from the latest version's values
  // unless options.empty; writes go through VersionWriter::view(name).
  // FAILED_PRECONDITION for an unversioned tensor, RESOURCE_EXHAUSTED when
  // a daemon's budget cannot hold the new versions (nothing allocated).
  absl::StatusOr<VersionWriter> Begin(const std::vector<std::string>& names,
                                      const BeginOptions& options = {});
  // The open versions another process began (VersionWriter::id()), to
  // write into them too. FAILED_PRECONDITION when one is no longer open.
  // While the VersionWriter lives, this process renews their lease too
  // (every 2 s; a renewed lease only: one begun with a deadline keeps it).
  absl::StatusOr<VersionWriter> Join(const std::string& id);
  // Pins one version of each named tensor (`numbers`, parallel to `names`;
  // empty or 0: the latest, all read at one point of the log: one
  // snapshot) until Snapshot::Release or the lease ends. A zero `lease`
  // (the default): renewed by this process while a copy of the Snapshot
  // lives, and ended 30 s after the last renewal (a dead reader's pin
  // ends within 30 s, a live one's never). Positive: ended `lease` after
  // the pin, or, with `renew`, after its last renewal.
  absl::StatusOr<Snapshot> Pin(const std::vector<std::string>& names,
                               absl::Duration lease = absl::ZeroDuration(),
                               const std::vector<int64_t>& numbers = {},
                               bool renew = false);

  // Plans reads of boxes of named tensors into destinations
  // (client/read_plan.h): opens the tensors (one control call for any
  // number of them) and cuts every box into the pieces their shards hold;
  // ReadPlan::Run then reads them every step with no control call.
  // NOT_FOUND for an unknown tensor; INVALID_ARGUMENT / OUT_OF_RANGE for
  // boxes that leave their tensor or out, overlapping sources, or dtypes
  // that do not convert.
  absl::StatusOr<std::shared_ptr<ReadPlan>> PlanReads(
      std::vector<ReadItem> items) const;

  // The versions of `name` published from now on (after `after`, when
  // given: those still kept come first), over a server stream of the
  // connected daemon (client/version_watcher.h). NOT_FOUND for an unknown
  // tensor, FAILED_PRECONDITION for an unversioned one.
  absl::StatusOr<std::unique_ptr<VersionWatcher>> Watch(
      const std::string& name, int64_t after = 0) const;

  // The health (grpc.health.v1) of every daemon: OK when SERVING,
  // UNAVAILABLE otherwise, with the daemon's address in the message.
  std::vector<absl::Status> Health() const;
  // Every daemon's own description of the cluster (GetCluster on each, at
  // once), in rank order: where its control plane stands (generation,
  // state). An unreachable daemon's entry is the error, naming it.
  std::vector<absl::StatusOr<v1::ClusterInfo>> Clusters() const;
  // Every daemon's metrics (GetStats on each, at once), in rank order; an
  // unreachable daemon's entry is the error, naming it.
  std::vector<absl::StatusOr<v1::DaemonStats>> Stats() const;

 private:
  explicit Client(std::shared_ptr<internal_client::Cluster> cluster);

  // Views of `names` from one ListTensors of just those names on
  // `cluster`, without the open cache (what OpenMany does for more than
  // two names, and what a read plan opens its tensors with).
  static absl::StatusOr<std::vector<ShardedTensorView>> OpenNamed(
      const std::shared_ptr<internal_client::Cluster>& cluster,
      const std::vector<std::string>& names);

  // A description Open received, with its digest (wire/message_digest.h).
  struct Opened {
    uint64_t digest = 0;
    v1::TensorInfo info;
    ShardedTensorMetadata metadata;
  };
  // Open's cache holds at most this many (then it starts over).
  static constexpr size_t kMaxOpenedCache = 4096;

  std::shared_ptr<internal_client::Cluster> cluster_;
  mutable absl::Mutex opened_mu_;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const Opened>>
      opened_ ABSL_GUARDED_BY(opened_mu_);
};

}  // namespace tessera

#endif  // TESSERA_CLIENT_CLIENT_H_
