// Daemon: one running `tessera-server` — a Rank whose program is the
// ControlService.
//
// Start() brings it up in this order, each step bounded:
//   1. rank 0 of a world of 2+ serves the rendezvous store (StoreServer) on
//      --master-port, on the master address when that is loopback, else on
//      every interface; it keeps it for its whole life;
//   2. the store: rank 0 uses the served keys directly, the others connect
//      a GrpcStore to master:port within --store-timeout;
//   3. Rank::Init (the default group: Gloo for cpu, NCCL for cuda; bounded
//      by --timeout);
//   4. the ControlService, then InitRpc: ShardService + ControlService +
//      grpc.health.v1 + reflection on --host:--port, the data plane on
//      --host, addresses published as --advertise-host;
//   5. ControlServiceImpl::Start, health SERVING.
// Every failure is a Status with a one-line message; what was started is
// stopped again.
//
// Shutdown(grace): health NOT_SERVING, ControlServiceImpl::Shutdown, then
// the shard server stops without a barrier (a daemon stopping alone must
// not wait for its peers): new gRPC calls and data-plane requests are
// refused with UNAVAILABLE, running fetches get `grace` to finish; then the
// process groups, and last the store server.
//
// Thread-safety: Start once; Shutdown and the accessors from any thread
// (Shutdown is idempotent and also run by the destructor, with no grace).
#ifndef TESSERA_SERVER_DAEMON_DAEMON_H_
#define TESSERA_SERVER_DAEMON_DAEMON_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/daemon/control_service.h"
#include "server/daemon/daemon_options.h"
#include "server/metrics/metrics.h"
#include "server/rank/rank.h"
#include "server/store/grpc_store.h"

namespace tessera::daemon {

class Daemon {
 public:
  // UNAVAILABLE for a busy port or an unreachable store ("store at H:P
  // unreachable after 60s"), DEADLINE_EXCEEDED when peers do not join in
  // time, others as Rank::Init and InitRpc report them.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(
      const DaemonOptions& options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  const DaemonOptions& options() const { return options_; }
  // "advertise-host:port" of the gRPC server, and of the data plane ("" when
  // disabled).
  const std::string& address() const { return address_; }
  const std::string& data_address() const { return data_address_; }
  const std::shared_ptr<Rank>& rank() const { return rank_; }
  // "host:port" of the metrics endpoint; "" when not served.
  std::string metrics_address() const {
    return metrics_ != nullptr ? metrics_->address() : std::string();
  }

  // See the file comment. Idempotent; returns once everything stopped
  // (within about `grace` plus the store server's own grace on rank 0).
  void Shutdown(absl::Duration grace);

 private:
  explicit Daemon(DaemonOptions options) : options_(std::move(options)) {}
  absl::Status Init();

  const DaemonOptions options_;
  // Destroyed in reverse order: the rank (and its gRPC server) before the
  // control service it serves, the store server last.
  std::unique_ptr<StoreServer> store_server_;
  // Rank 0: the store's share of the memory budget.
  MemoryBudget::Reservation store_reservation_;
  std::unique_ptr<ControlServiceImpl> control_;
  std::shared_ptr<Rank> rank_;
  std::string address_;
  std::string data_address_;
  // Serves the process's metrics (--metrics-port); null when not asked for.
  std::unique_ptr<MetricsEndpoint> metrics_;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// Writes "address\n" to `path` (io/output_file.h): a file atomically (a
// temporary file renamed over it), so that a reader never sees a partial
// line; a device or FIFO (/dev/stdout) in place, never replaced.
absl::Status WriteAddressFile(const std::string& path,
                              const std::string& address);

}  // namespace tessera::daemon

#endif  // TESSERA_SERVER_DAEMON_DAEMON_H_
