// Process-wide Prometheus metrics of a Tessera daemon (prometheus-cpp), and
// the HTTP endpoint that serves them (`tessera-server --metrics-port`).
//
// Metrics are counted whether or not an endpoint serves them: a count is
// two relaxed atomic additions on counters resolved once per process, so
// the transports count every transfer without a lookup or a lock.
//
// Exposed (Prometheus conventions, base units):
//   tessera_transfers_total{transport, direction}       transfers served
//   tessera_transfer_bytes_total{transport, direction}  their payload bytes
// transport: "grpc", "data_plane" or "local_path"; direction: "read" (a
// fetch this process served) or "write" (a write into its shards). Only
// transfers that completed are counted; a failed one counts nothing.
//
// The endpoint carries counts and names of transports, never tensor names
// or data. It listens on loopback unless told otherwise, like every other
// surface of the daemon (docs/security.md).
//
// Thread-safety: everything here may be called from any thread.
#ifndef TESSERA_SERVER_METRICS_METRICS_H_
#define TESSERA_SERVER_METRICS_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace tessera {

enum class MetricsTransport { kGrpc, kDataPlane, kLocalPath };
enum class MetricsDirection { kRead, kWrite };

// Counts one completed transfer of `bytes` payload bytes served by this
// process.
void CountTransfer(MetricsTransport transport, MetricsDirection direction,
                   int64_t bytes);

// The registry every metric of this process is in (never destroyed).
prometheus::Registry& MetricsRegistry();

// Serves MetricsRegistry() in Prometheus' text format at
// http://<host>:<port>/metrics until destroyed.
class MetricsEndpoint {
 public:
  // Listens on host:port (port 0 picks a free one). UNAVAILABLE when the
  // address cannot be bound, naming it; INVALID_ARGUMENT for a port outside
  // [0, 65535].
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      absl::string_view host, int port);
  ~MetricsEndpoint();

  // "host:port", with the port actually bound.
  const std::string& address() const { return address_; }

 private:
  struct Impl;
  MetricsEndpoint(std::unique_ptr<Impl> impl, std::string address);

  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_METRICS_METRICS_H_
