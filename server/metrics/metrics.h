// Process-wide Prometheus metrics of a Tessera daemon (prometheus-cpp), the
// HTTP endpoint that serves them (`tessera-server --metrics-port`), and
// their text for the Stats RPC (`tessera top`).
//
// Metrics are counted whether or not an endpoint serves them. A transfer's
// count is a few relaxed atomic additions and one histogram observation on
// series resolved once per process: no lookup. The other counts (control
// operations, collectives, store calls) resolve their series by label,
// a hash lookup under a lock, which is small beside what they count.
//
// Exposed (Prometheus conventions, base units; docs/metrics.md lists them
// with their labels and meaning):
//   tessera_transfers_total, tessera_transfer_bytes_total,
//   tessera_transfer_seconds{transport, direction}
//   tessera_checksum_failures_total{transport},
//   tessera_received_checksum_failures_total, tessera_connections{transport}
//   tessera_control_ops_total{op, code}, tessera_control_op_seconds{op},
//   tessera_control_op_wait_seconds{op}
//   tessera_collective_seconds{backend, collective},
//   tessera_collective_failures_total{backend, collective}
//   tessera_store_op_seconds{op}, tessera_store_op_failures_total{op}
//   tessera_memory_budget_refusals_total
//   tessera_rpcs_total{method, code}, tessera_rpc_seconds{method}
// and the gauges their owners register (GaugeSource): tensors, shards and
// bytes held, the memory budget, generation and peers.
//
// The metrics carry counts, times and names of transports, operations and
// codes, never tensor names or data. The endpoint listens on loopback
// unless told otherwise, like every other surface of the daemon
// (docs/security.md).
//
// Thread-safety: everything here may be called from any thread.
#ifndef TESSERA_SERVER_METRICS_METRICS_H_
#define TESSERA_SERVER_METRICS_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace tessera {

enum class MetricsTransport { kGrpc, kDataPlane, kLocalPath };
enum class MetricsDirection { kRead, kWrite };

// "grpc", "data_plane", "local_path": the transport label.
const char* TransportLabel(MetricsTransport transport);

// Counts one completed transfer of `bytes` payload bytes served by this
// process, which took `took` from its request to its last byte. A failed
// transfer counts nothing.
void CountTransfer(MetricsTransport transport, MetricsDirection direction,
                   int64_t bytes, absl::Duration took);
// Bytes written to this process over `transport` that did not match their
// checksum.
void CountChecksumFailure(MetricsTransport transport);
// Bytes this process fetched from another (as a client: gathers, refills,
// replica copies, region reads) that did not match their checksum.
void CountReceivedChecksumFailure();
// A connection of `transport` opened (delta 1) or closed (delta -1).
void CountConnection(MetricsTransport transport, int delta);
// Counts one open connection of `transport` for its lifetime.
class OpenConnection {
 public:
  explicit OpenConnection(MetricsTransport transport) : transport_(transport) {
    CountConnection(transport_, 1);
  }
  ~OpenConnection() { CountConnection(transport_, -1); }
  OpenConnection(const OpenConnection&) = delete;
  OpenConnection& operator=(const OpenConnection&) = delete;

 private:
  const MetricsTransport transport_;
};
// A control operation `op` ("CreateTensor", ...) that ran on this daemon
// for `ran` and ended with the agreed `code`.
void CountControlOp(absl::string_view op, absl::StatusCode code,
                    absl::Duration ran);
// How long `op` waited in the log before it ran (its coordinator's view:
// from the call's arrival to the start of its execution there).
void CountControlOpWait(absl::string_view op, absl::Duration waited);
// One collective `collective` ("barrier", "all_gather", ...) over a
// `backend` ("gloo", "nccl") group, which took `took`.
void CountCollective(absl::string_view backend, absl::string_view collective,
                     bool ok, absl::Duration took);
// One call `op` ("get", "set", ...) on the rendezvous store.
void CountStoreOp(absl::string_view op, bool ok, absl::Duration took);
// A request the memory budget refused.
void CountBudgetRefusal();
// One gRPC call this process served: its method (a bounded set of names,
// see wire/request_guard.h), final code and time.
void CountRpc(absl::string_view method, absl::StatusCode code,
              absl::Duration took);

// On by default. Off, every Count* above returns at once: for measuring
// what counting costs (tests/bench/metrics_bench), nothing else.
void EnableMetrics(bool on);

// One value of a gauge and its labels.
struct GaugeSample {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};

// A gauge read at each scrape: `read` gives its current values. Owners of
// state (the daemon: its table, budget, group) register one and drop it
// before that state goes.
class GaugeSource {
 public:
  using Reader = std::function<std::vector<GaugeSample>()>;
  // Serves `name` (a Prometheus metric name; unique among sources) from
  // `read` until the returned source is destroyed. `read` runs on scrape
  // threads, with the source's lock held: it must not block for long and
  // must not register or drop sources.
  static std::unique_ptr<GaugeSource> Register(std::string name,
                                               std::string help, Reader read);
  // Waits for a scrape reading it to finish; never reads again.
  ~GaugeSource();

  GaugeSource(const GaugeSource&) = delete;
  GaugeSource& operator=(const GaugeSource&) = delete;

 private:
  explicit GaugeSource(uint64_t id) : id_(id) {}
  const uint64_t id_;
};

// The registry of every counter and histogram of this process (never
// destroyed); gauges are in GaugeSources.
prometheus::Registry& MetricsRegistry();

// Every metric of this process in Prometheus' text format, as the endpoint
// serves it.
std::string MetricsText();

// Serves every metric in Prometheus' text format at
// http://<host>:<port>/metrics until destroyed.
class MetricsEndpoint {
 public:
  // Listens on host:port (port 0 picks a free one). UNAVAILABLE when the
  // address cannot be bound, naming it; INVALID_ARGUMENT for a port outside
  // [0, 65535]. Served by 4 threads; a client gets 10 s to send its
  // request, so clients that stall delay scrapes by that at most.
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
