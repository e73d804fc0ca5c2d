// ControlServiceImpl: the control service of a Tessera daemon
// (tessera.v1.ControlService, proto/tessera/v1/control.proto), served on
// the Rank's gRPC server next to its ShardService.
//
// Every daemon keeps a table of named sharded tensors. CreateTensor,
// DeleteTensor, Reshard, Gather, SaveCheckpoint and LoadCheckpoint go
// through the cluster's operation log in the rendezvous store and run on
// every daemon in log order, as one SPMD operation ending in an agreement
// on every daemon's outcome: docs/control_log.md is the protocol.
// ListTensors, DescribeTensor and GetCluster are answered from the local
// table, GetStats from the process's metrics, GetOperation from what the
// daemon knows of a request id (op_outcomes.h, op_log.h), RenewLeases by
// this daemon alone (its own lease clock); ReadRegion and
// WriteRegion move bytes without the log (server/daemon/region_io.h).
// A logged call whose request id committed already is answered with its
// first outcome and not applied again.
//
// Failure: every call has a deadline (the client's, capped at
// ControlOptions::op_timeout, control_options.h); a call whose op has not
// completed by then ends with DEADLINE_EXCEEDED saying whether it was
// logged, and GetOperation tells its outcome later.
// Errors agreed by every daemon keep their code; one daemon's own error comes
// back as "on rank N: ...". A dead peer fails the running op (UNAVAILABLE or
// DEADLINE_EXCEEDED) on the survivors, which keep answering reads.
//
// Thread-safety: every method may be called from any thread; gRPC callback
// threads never block on the store or a collective. Ownership: the service
// shares ownership of the Rank; it must outlive the grpc::Server it is
// registered with (Rank::Shutdown), and Shutdown() must run before that
// server shuts down so that no call waits on the log.
#ifndef TESSERA_SERVER_DAEMON_CONTROL_SERVICE_H_
#define TESSERA_SERVER_DAEMON_CONTROL_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/daemon/control_options.h"
#include "server/rank/rank.h"
#include "tessera/v1/control.grpc.pb.h"
#include "tessera/v1/control.pb.h"

namespace tessera {

namespace control_internal {
class Core;
}  // namespace control_internal

// The callback service, with ReadRegion and Gather writing raw ShardChunk
// messages (serialized by the chunk streams of server/serve/shard_service.h).
using ControlServiceBase = v1::ControlService::WithCallbackMethod_RenewLeases<
    v1::ControlService::WithCallbackMethod_MarkStale<v1::ControlService::WithCallbackMethod_WatchVersions<
        v1::ControlService::
            WithCallbackMethod_BeginVersion<v1::ControlService::WithCallbackMethod_PublishVersion<v1::ControlService::WithCallbackMethod_AbortVersion<
                v1::ControlService::
                    WithCallbackMethod_PinVersions<v1::ControlService::WithCallbackMethod_UnpinVersions<v1::ControlService::WithCallbackMethod_GetOperation<
                        v1::ControlService::
                            WithCallbackMethod_GetStats<v1::ControlService::WithCallbackMethod_GetCluster<
                                v1::ControlService::
                                    WithCallbackMethod_CreateTensor<v1::ControlService::WithCallbackMethod_CreateTensors<
                                        v1::ControlService::
                                            WithCallbackMethod_ListTensors<v1::ControlService::WithCallbackMethod_DescribeTensor<
                                                v1::ControlService::
                                                    WithCallbackMethod_DeleteTensor<v1::ControlService::WithCallbackMethod_WriteRegion<
                                                        v1::ControlService::
                                                            WithRawCallbackMethod_ReadRegion<v1::ControlService::WithRawCallbackMethod_Gather<
                                                                v1::ControlService::
                                                                    WithCallbackMethod_Reshard<v1::ControlService::WithCallbackMethod_SaveCheckpoint<
                                                                        v1::ControlService::
                                                                            WithCallbackMethod_LoadCheckpoint<
                                                                                v1::ControlService::
                                                                                    Service>>>>>>>>>>>>>>>>>>>>>>;

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
  // What DescribeTensor answers for `name` now (UNAVAILABLE while not
  // serving, NOT_FOUND for an unknown name); the data plane's
  // DescribeDigestRequests ask it (RpcOptions::describe).
  absl::StatusOr<v1::TensorInfo> Describe(const std::string& name) const;

  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* context,
                                       const v1::GetClusterRequest* request,
                                       v1::ClusterInfo* response) override;
  // Answered whatever the daemon's state (also while starting or shutting
  // down): the metrics of server/metrics/metrics.h.
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::DaemonStats* response) override;
  // Renews this daemon's leases of a holder's versions and pins
  // (Core::RenewLeases); answered on the calling thread (no store, no
  // log).
  grpc::ServerUnaryReactor* RenewLeases(
      grpc::CallbackServerContext* context,
      const v1::RenewLeasesRequest* request,
      v1::RenewLeasesResponse* response) override;
  // What became of a logged call by its request id (Core::Operation).
  grpc::ServerUnaryReactor* GetOperation(
      grpc::CallbackServerContext* context,
      const v1::GetOperationRequest* request,
      v1::OperationStatus* response) override;
  grpc::ServerUnaryReactor* CreateTensors(
      grpc::CallbackServerContext* context,
      const v1::CreateTensorsRequest* request,
      v1::ListTensorsResponse* response) override;
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
  // Versions (docs/versions.md): logged like DeleteTensor.
  grpc::ServerUnaryReactor* BeginVersion(grpc::CallbackServerContext* context,
                                         const v1::BeginVersionRequest* request,
                                         v1::VersionGroup* response) override;
  grpc::ServerUnaryReactor* PublishVersion(
      grpc::CallbackServerContext* context,
      const v1::PublishVersionRequest* request,
      v1::VersionGroup* response) override;
  grpc::ServerUnaryReactor* AbortVersion(
      grpc::CallbackServerContext* context,
      const v1::AbortVersionRequest* request,
      v1::AbortVersionResponse* response) override;
  grpc::ServerUnaryReactor* PinVersions(grpc::CallbackServerContext* context,
                                        const v1::PinVersionsRequest* request,
                                        v1::VersionGroup* response) override;
  // Streams the versions `request` names as this daemon publishes them.
  grpc::ServerWriteReactor<v1::VersionEvent>* WatchVersions(
      grpc::CallbackServerContext* context,
      const v1::WatchVersionsRequest* request) override;
  grpc::ServerUnaryReactor* UnpinVersions(
      grpc::CallbackServerContext* context,
      const v1::UnpinVersionsRequest* request,
      v1::UnpinVersionsResponse* response) override;
  // Marks copies stale for a writer (Core::MarkStale); answered after the
  // fence, on the calling thread.
  grpc::ServerUnaryReactor* MarkStale(grpc::CallbackServerContext* context,
                                      const v1::MarkStaleRequest* request,
                                      v1::MarkStaleResponse* response) override;
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
