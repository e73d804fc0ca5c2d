// ControlServiceImpl: the control service of a Tessera daemon
// (tessera.v1.ControlService, proto/tessera/v1/control.proto), served on
// the Rank's gRPC server next to its ShardService.
//
// Every daemon keeps a table of named sharded tensors. Calls that change
// it (CreateTensor, DeleteTensor, Reshard, Gather, SaveCheckpoint,
// LoadCheckpoint) go through the cluster's operation log, kept in the
// rendezvous store (keys "control/seq" and "control/op/<n>"):
//
//  1. The daemon called (the coordinator) serializes the request as a
//     v1::ControlOp, claims the next number with Add("control/seq", 1) and
//     writes the op with CompareSet("control/op/<n>", "", op).
//  2. Every daemon's executor thread waits for "control/op/<next>" and runs
//     the ops strictly in log order, as the same SPMD operation over the
//     default process group. If a claimed number stays empty for
//     ControlOptions::claim_timeout (its coordinator died between Add and
//     CompareSet), rank 0 fills it with a "skip" marker by CompareSet, so
//     every daemon sees the same entry: the op, or the marker (a late
//     coordinator then finds the marker and claims a new number).
//  3. Each op ends with an agreement (AllGatherStatuses) on every daemon's
//     outcome, and its effects are committed to the table only if every
//     daemon succeeded; a committed change is then confirmed by a barrier,
//     so that it is visible on every daemon before the call returns. Ops
//     with a collective inside (Reshard, Gather, SaveCheckpoint) agree
//     first on the request being valid and still within its deadline, so
//     that no daemon enters a collective the others skip. Rank 0 then
//     deletes the op's key.
//  4. The coordinator finishes the client's call with the agreed outcome.
//
// Validation is deterministic (every daemon checks the same request
// against the same table), so name errors (ALREADY_EXISTS, NOT_FOUND) and
// bad requests (INVALID_ARGUMENT) agree without messages; errors raised on
// one daemon only (allocation, I/O) come back as "on rank N: ..." with
// their own code. Tensor ids (Rank::NextTensorId) stay in step after an op
// failed on some daemons only: the daemons re-align their counters then.
//
// Ops: CreateTensor fills RAND/RANDN tensors with rank r drawing its local
// shards, in shard order, from Generator(seed + r * 0x9E3779B97F4A7C15), so
// the same seed, sizes and spec always give the same values. Shards land on
// the devices their placements name; a daemon's CPU shards (and the whole
// tensor of a Gather, on the daemon called) must fit max_host_bytes.
// Reshard keeps the name and gives the tensor a new id. SaveCheckpoint
// writes a state dict keyed by tensor name (server/checkpoint.h).
// LoadCheckpoint loads sharded entries only (a dense entry it would load is
// FAILED_PRECONDITION); it reads every entry of the checkpoint, even when
// `names` picks some.
//
// ListTensors, DescribeTensor and GetCluster are answered locally from the
// table. ReadRegion and WriteRegion move bytes through server/region_io.h
// without the log (they do not change the table); Gather streams the
// gathered tensor back from the coordinator (ShardChunk stream, like
// FetchShard).
//
// Deadlines: an op's deadline is the call's, or now + op_timeout when the
// client set none; a call whose op has not completed by then ends with
// DEADLINE_EXCEEDED (the op may still complete later). An op reaching the
// executors after its deadline fails on every daemon without running.
// Collectives are bounded by the Rank's timeout, so a dead peer makes the
// running op fail (UNAVAILABLE or DEADLINE_EXCEEDED) on the survivors;
// after a transport failure the default group stays broken (later ops fail
// FAILED_PRECONDITION) until the daemons restart.
//
// Threads: gRPC callback threads only parse, queue and answer; they never
// block on the store or a collective. One submit thread appends ops to the
// log (store round trips) and expires calls past their deadline; one
// executor thread runs the log. ReadRegion and Gather streams prepare their
// bytes on a thread of their own (NewDeferredChunkStream).
//
// Thread-safety: every method may be called from any thread. The executor
// is the only thread that changes the table or touches the ShardedTensors;
// readers copy TensorInfos under a mutex. Ownership: the service shares
// ownership of the Rank; it must outlive the grpc::Server it is registered
// with (Rank::Shutdown), and Shutdown() must run before that server shuts
// down so that no call waits on the log.
#ifndef TESSERA_SERVER_DAEMON_CONTROL_SERVICE_H_
#define TESSERA_SERVER_DAEMON_CONTROL_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/rank/rank.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tessera/v1/control.pb.h"

namespace tessera {

struct ControlOptions {
  // The deadline of an operation whose call has none.
  absl::Duration op_timeout = absl::Seconds(300);
  // This daemon's device ("cpu", "cuda:N"), reported in ClusterInfo.
  std::string device = "cpu";
  // How long a claimed log number may stay empty before rank 0 marks it
  // skipped (its coordinator died between claiming and writing it).
  absl::Duration claim_timeout = absl::Seconds(5);
  // The slice of the executor's waits on the store: how soon Shutdown()
  // is noticed while the log is idle.
  absl::Duration poll_interval = absl::Milliseconds(200);
  // The most host memory one CreateTensor (this daemon's CPU shards) or
  // Gather (the whole tensor, on the daemon called) may allocate here;
  // more is RESOURCE_EXHAUSTED before allocating, rather than an
  // allocation that succeeds lazily and gets the daemon killed once
  // touched. 0: the host's physical memory.
  int64_t max_host_bytes = 0;
  // Chunk size of ReadRegion and Gather streams that ask for 0, and the
  // largest a stream gets (as ShardServiceOptions).
  int64_t default_chunk_bytes = int64_t{512} << 10;
  int64_t max_chunk_bytes = int64_t{16} << 20;
};

namespace control_internal {
class Core;
}  // namespace control_internal

// The callback service, with ReadRegion and Gather writing raw ShardChunk
// messages (serialized by the chunk streams of shard_service.h).
using ControlServiceBase = v1::ControlService::WithCallbackMethod_GetCluster<
    v1::ControlService::WithCallbackMethod_CreateTensor<
        v1::ControlService::WithCallbackMethod_ListTensors<
            v1::ControlService::WithCallbackMethod_DescribeTensor<
                v1::ControlService::WithCallbackMethod_DeleteTensor<
                    v1::ControlService::WithCallbackMethod_WriteRegion<
                        v1::ControlService::WithRawCallbackMethod_ReadRegion<
                            v1::ControlService::WithRawCallbackMethod_Gather<
                                v1::ControlService::WithCallbackMethod_Reshard<
                                    v1::ControlService::
                                        WithCallbackMethod_SaveCheckpoint<
                                            v1::ControlService::
                                                WithCallbackMethod_LoadCheckpoint<
                                                    v1::ControlService::
                                                        Service>>>>>>>>>>>;

class ControlServiceImpl final : public ControlServiceBase {
 public:
  // Construct before Rank::InitRpc and pass the service in
  // RpcOptions::services; call Start() after InitRpc. Until Start(), calls
  // get UNAVAILABLE "daemon is starting".
  ControlServiceImpl(std::shared_ptr<Rank> rank, ControlOptions options = {});
  // Calls Shutdown().
  ~ControlServiceImpl() override;

  ControlServiceImpl(const ControlServiceImpl&) = delete;
  ControlServiceImpl& operator=(const ControlServiceImpl&) = delete;

  // Collective over the default group (every daemon calls it after
  // InitRpc): agrees on where the log starts and exchanges the daemons'
  // devices, then starts the submit and executor threads.
  // FAILED_PRECONDITION before InitRpc, after Shutdown or when already
  // started; the exchange's errors (a peer that never starts:
  // DEADLINE_EXCEEDED within the Rank's timeout).
  absl::Status Start();

  // New calls get UNAVAILABLE "daemon is shutting down"; the op running
  // finishes (bounded by the Rank's collective timeout), calls still
  // waiting get UNAVAILABLE, and the threads are joined. Idempotent; call
  // it before Rank::Shutdown. The table (and so the shards) stays until the
  // service is destroyed.
  void Shutdown();

  // How many log entries this daemon has executed or skipped (for tests
  // and monitoring).
  int64_t applied_ops() const;

  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* context,
                                       const v1::GetClusterRequest* request,
                                       v1::ClusterInfo* response) override;
  grpc::ServerUnaryReactor* CreateTensor(grpc::CallbackServerContext* context,
                                         const v1::CreateTensorRequest* request,
                                         v1::TensorInfo* response) override;
  grpc::ServerUnaryReactor* ListTensors(
      grpc::CallbackServerContext* context,
      const v1::ListTensorsRequest* request,
      v1::ListTensorsResponse* response) override;
  grpc::ServerUnaryReactor* DescribeTensor(
      grpc::CallbackServerContext* context,
      const v1::DescribeNamedTensorRequest* request,
      v1::TensorInfo* response) override;
  grpc::ServerUnaryReactor* DeleteTensor(
      grpc::CallbackServerContext* context,
      const v1::DeleteTensorRequest* request,
      v1::DeleteTensorResponse* response) override;
  grpc::ServerReadReactor<v1::WriteRegionChunk>* WriteRegion(
      grpc::CallbackServerContext* context,
      v1::WriteRegionResponse* response) override;
  // `request` is a serialized ReadRegionRequest; every message written is
  // a serialized ShardChunk.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadRegion(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  // `request` is a serialized GatherRequest; as ReadRegion.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Gather(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Reshard(grpc::CallbackServerContext* context,
                                    const v1::ReshardRequest* request,
                                    v1::TensorInfo* response) override;
  grpc::ServerUnaryReactor* SaveCheckpoint(
      grpc::CallbackServerContext* context,
      const v1::SaveCheckpointRequest* request,
      v1::SaveCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* LoadCheckpoint(
      grpc::CallbackServerContext* context,
      const v1::LoadCheckpointRequest* request,
      v1::LoadCheckpointResponse* response) override;

 private:
  // Shared with reactors and stream threads, which may outlive Shutdown()
  // by the time their callbacks take to return.
  const std::shared_ptr<control_internal::Core> core_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_CONTROL_SERVICE_H_
