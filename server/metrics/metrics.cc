#include "server/metrics/metrics.h"

#include <array>
#include <atomic>
#include <exception>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/socket.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace tessera {
namespace {

constexpr std::array<const char*, 3> kTransports = {"grpc", "data_plane",
                                                    "local_path"};
constexpr std::array<const char*, 2> kDirections = {"read", "write"};

std::atomic<bool> enabled{true};

// Seconds, from 50 µs (a small local fetch) to 30 s.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const buckets =
      new prometheus::Histogram::BucketBoundaries{
          50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 100e-3, 250e-3, 500e-3, 1,    2.5,    5,    10,    30};
  return *buckets;
}

template <typename Builder>
auto& Build(Builder builder, const char* name, const char* help,
            prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

// Every series, resolved once where its labels are fixed.
struct Series {
  using PerTransfer = std::array<std::array<prometheus::Counter*, 2>, 3>;
  PerTransfer transfers;
  PerTransfer bytes;
  std::array<std::array<prometheus::Histogram*, 2>, 3> seconds;
  std::array<prometheus::Counter*, 3> checksum_failures;
  std::array<prometheus::Gauge*, 3> connections;
  prometheus::Counter* budget_refusals;
  prometheus::Counter* received_checksum_failures;
  prometheus::Family<prometheus::Counter>& control_ops;
  prometheus::Family<prometheus::Histogram>& control_seconds;
  prometheus::Family<prometheus::Histogram>& control_wait;
  prometheus::Family<prometheus::Histogram>& collective_seconds;
  prometheus::Family<prometheus::Counter>& collective_failures;
  prometheus::Family<prometheus::Histogram>& store_seconds;
  prometheus::Family<prometheus::Counter>& store_failures;
  prometheus::Family<prometheus::Counter>& rpcs;
  prometheus::Family<prometheus::Histogram>& rpc_seconds;

  explicit Series(prometheus::Registry& r)
      : control_ops(Build(prometheus::BuildCounter(),
                          "tessera_control_ops_total",
                          "Control operations run on this daemon, by "
                          "operation and agreed result code",
                          r)),
        control_seconds(Build(prometheus::BuildHistogram(),
                              "tessera_control_op_seconds",
                              "Time running each control operation on this "
                              "daemon",
                              r)),
        control_wait(Build(prometheus::BuildHistogram(),
                           "tessera_control_op_wait_seconds",
                           "Time control operations this daemon coordinated "
                           "waited in the log before they ran",
                           r)),
        collective_seconds(
            Build(prometheus::BuildHistogram(), "tessera_collective_seconds",
                  "Time of each collective call, by backend", r)),
        collective_failures(Build(
            prometheus::BuildCounter(), "tessera_collective_failures_total",
            "Collective calls that failed, by backend", r)),
        store_seconds(Build(prometheus::BuildHistogram(),
                            "tessera_store_op_seconds",
                            "Time of each call on the rendezvous store", r)),
        store_failures(Build(prometheus::BuildCounter(),
                             "tessera_store_op_failures_total",
                             "Calls on the rendezvous store that failed", r)),
        rpcs(Build(prometheus::BuildCounter(), "tessera_rpcs_total",
                   "gRPC calls this process served, by method and code", r)),
        rpc_seconds(Build(prometheus::BuildHistogram(), "tessera_rpc_seconds",
                          "Time of each gRPC call this process served, from "
                          "its arrival to its status",
                          r)) {
    // Each (transport, direction) of a family into `series`; `buckets...`
    // for a histogram.
    const auto per_transfer = [](auto& family, auto& series,
                                 const auto&... buckets) {
      for (size_t t = 0; t < kTransports.size(); ++t) {
        for (size_t d = 0; d < kDirections.size(); ++d) {
          series[t][d] = &family.Add(
              {{"transport", kTransports[t]}, {"direction", kDirections[d]}},
              buckets...);
        }
      }
    };
    per_transfer(Build(prometheus::BuildCounter(), "tessera_transfers_total",
                       "Transfers of shard bytes this process served, by "
                       "transport and direction",
                       r),
                 transfers);
    per_transfer(
        Build(prometheus::BuildCounter(), "tessera_transfer_bytes_total",
              "Payload bytes of the transfers this process served", r),
        bytes);
    per_transfer(Build(prometheus::BuildHistogram(), "tessera_transfer_seconds",
                       "Time of each transfer this process served, from its "
                       "request to its last byte",
                       r),
                 seconds, LatencyBuckets());
    auto& checksum_family =
        Build(prometheus::BuildCounter(), "tessera_checksum_failures_total",
              "Chunks that arrived with bytes not matching their checksum", r);
    auto& connection_family =
        Build(prometheus::BuildGauge(), "tessera_connections",
              "Open connections of the data plane and the local path", r);
    for (size_t t = 0; t < kTransports.size(); ++t) {
      const prometheus::Labels labels = {{"transport", kTransports[t]}};
      checksum_failures[t] = &checksum_family.Add(labels);
      connections[t] = &connection_family.Add(labels);
    }
    received_checksum_failures =
        &Build(prometheus::BuildCounter(),
               "tessera_received_checksum_failures_total",
               "Chunks this process fetched from another whose bytes did not "
               "match their checksum",
               r)
             .Add({});
    budget_refusals = &Build(prometheus::BuildCounter(),
                             "tessera_memory_budget_refusals_total",
                             "Requests the memory budget refused", r)
                           .Add({});
  }
};

// Shared, since an exposer holds what it serves by weak_ptr; never
// destroyed.
const std::shared_ptr<prometheus::Registry>& SharedRegistry() {
  static const auto* const registry = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>());
  return *registry;
}

Series& Counters() {
  static Series* const series = new Series(*SharedRegistry());
  return *series;
}

double Seconds(absl::Duration d) {
  return absl::ToDoubleSeconds(std::max(d, absl::ZeroDuration()));
}

// The registered GaugeSources, read at each collection.
class Gauges final : public prometheus::Collectable {
 public:
  struct Source {
    std::string name;
    std::string help;
    GaugeSource::Reader read;
  };

  uint64_t Add(Source source) {
    absl::MutexLock lock(&mu_);
    sources_.emplace(next_id_, std::move(source));
    return next_id_++;
  }
  void Remove(uint64_t id) {
    absl::MutexLock lock(&mu_);
    sources_.erase(id);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    std::vector<prometheus::MetricFamily> families;
    for (const auto& [id, source] : sources_) {
      prometheus::MetricFamily family;
      family.name = source.name;
      family.help = source.help;
      family.type = prometheus::MetricType::Gauge;
      for (GaugeSample& sample : source.read()) {
        prometheus::ClientMetric metric;
        for (auto& [name, value] : sample.labels) {
          metric.label.push_back({std::move(name), std::move(value)});
        }
        metric.gauge.value = sample.value;
        family.metric.push_back(std::move(metric));
      }
      families.push_back(std::move(family));
    }
    return families;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<uint64_t, Source> sources_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

const std::shared_ptr<Gauges>& SharedGauges() {
  static const auto* const gauges =
      new std::shared_ptr<Gauges>(std::make_shared<Gauges>());
  return *gauges;
}

}  // namespace

const char* TransportLabel(MetricsTransport transport) {
  return kTransports[static_cast<size_t>(transport)];
}

prometheus::Registry& MetricsRegistry() { return *SharedRegistry(); }

void EnableMetrics(bool on) { enabled.store(on, std::memory_order_relaxed); }

void CountTransfer(MetricsTransport transport, MetricsDirection direction,
                   int64_t bytes, absl::Duration took) {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Series& series = Counters();
  const auto t = static_cast<size_t>(transport);
  const auto d = static_cast<size_t>(direction);
  series.transfers[t][d]->Increment();
  series.bytes[t][d]->Increment(static_cast<double>(bytes));
  series.seconds[t][d]->Observe(Seconds(took));
}

void CountChecksumFailure(MetricsTransport transport) {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Counters().checksum_failures[static_cast<size_t>(transport)]->Increment();
}

void CountReceivedChecksumFailure() {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Counters().received_checksum_failures->Increment();
}

void CountConnection(MetricsTransport transport, int delta) {
  // Counted even while disabled: a gauge must come back to zero.
  prometheus::Gauge& open =
      *Counters().connections[static_cast<size_t>(transport)];
  delta > 0 ? open.Increment(delta) : open.Decrement(-delta);
}

void CountControlOp(absl::string_view op, absl::StatusCode code,
                    absl::Duration ran) {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Series& series = Counters();
  series.control_ops
      .Add({{"op", std::string(op)}, {"code", absl::StatusCodeToString(code)}})
      .Increment();
  series.control_seconds.Add({{"op", std::string(op)}}, LatencyBuckets())
      .Observe(Seconds(ran));
}

void CountControlOpWait(absl::string_view op, absl::Duration waited) {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Counters()
      .control_wait.Add({{"op", std::string(op)}}, LatencyBuckets())
      .Observe(Seconds(waited));
}

void CountCollective(absl::string_view backend, absl::string_view collective,
                     bool ok, absl::Duration took) {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Series& series = Counters();
  const prometheus::Labels labels = {{"backend", std::string(backend)},
                                     {"collective", std::string(collective)}};
  series.collective_seconds.Add(labels, LatencyBuckets())
      .Observe(Seconds(took));
  if (!ok) series.collective_failures.Add(labels).Increment();
}

void CountStoreOp(absl::string_view op, bool ok, absl::Duration took) {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Series& series = Counters();
  const prometheus::Labels labels = {{"op", std::string(op)}};
  series.store_seconds.Add(labels, LatencyBuckets()).Observe(Seconds(took));
  if (!ok) series.store_failures.Add(labels).Increment();
}

void CountRpc(absl::string_view method, absl::StatusCode code,
              absl::Duration took) {
  if (!enabled.load(std::memory_order_relaxed)) return;
  // Every gRPC call pays this: the series of each (method, code) are found
  // once, then read under a shared lock (the set is bounded: see
  // wire/request_guard.h).
  struct RpcSeries {
    prometheus::Histogram* seconds = nullptr;
    std::array<prometheus::Counter*, 17> calls{};  // By code.
  };
  static absl::Mutex mu(absl::kConstInit);
  static auto* const known = new absl::flat_hash_map<std::string, RpcSeries>();
  const size_t c = static_cast<size_t>(code);
  if (c >= RpcSeries().calls.size()) return;
  prometheus::Histogram* seconds = nullptr;
  prometheus::Counter* calls = nullptr;
  {
    absl::ReaderMutexLock lock(&mu);
    auto found = known->find(method);
    if (found != known->end()) {
      seconds = found->second.seconds;
      calls = found->second.calls[c];
    }
  }
  if (calls == nullptr) {
    Series& all = Counters();
    const std::string name(method);
    absl::MutexLock lock(&mu);
    RpcSeries& series = (*known)[name];
    if (series.seconds == nullptr) {
      series.seconds =
          &all.rpc_seconds.Add({{"method", name}}, LatencyBuckets());
    }
    if (series.calls[c] == nullptr) {
      series.calls[c] = &all.rpcs.Add(
          {{"method", name}, {"code", absl::StatusCodeToString(code)}});
    }
    seconds = series.seconds;
    calls = series.calls[c];
  }
  calls->Increment();
  seconds->Observe(Seconds(took));
}

void CountBudgetRefusal() {
  if (!enabled.load(std::memory_order_relaxed)) return;
  Counters().budget_refusals->Increment();
}

std::unique_ptr<GaugeSource> GaugeSource::Register(std::string name,
                                                   std::string help,
                                                   Reader read) {
  const uint64_t id = SharedGauges()->Add(
      Gauges::Source{std::move(name), std::move(help), std::move(read)});
  return std::unique_ptr<GaugeSource>(new GaugeSource(id));
}

GaugeSource::~GaugeSource() { SharedGauges()->Remove(id_); }

std::string MetricsText() {
  Counters();  // Every fixed series exists from the start, at zero.
  std::vector<prometheus::MetricFamily> families = SharedRegistry()->Collect();
  std::vector<prometheus::MetricFamily> gauges = SharedGauges()->Collect();
  families.insert(families.end(), std::make_move_iterator(gauges.begin()),
                  std::make_move_iterator(gauges.end()));
  return prometheus::TextSerializer().Serialize(families);
}

struct MetricsEndpoint::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    absl::string_view host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", port, " is not in [0, 65535]"));
  }
  // civetweb's listening syntax: an IPv6 host goes in brackets.
  const std::string bind = JoinHostPort(host, port);
  auto impl = std::make_unique<Impl>();
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", bind, "num_threads", "4",
                                 "request_timeout_ms", "10000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", bind, ": ", e.what()));
  }
  Counters();
  impl->exposer->RegisterCollectable(SharedRegistry());
  impl->exposer->RegisterCollectable(SharedGauges());
  const std::vector<int> ports = impl->exposer->GetListeningPorts();
  const int bound = ports.empty() ? port : ports.front();
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(impl), JoinHostPort(host, bound)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl,
                                 std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace tessera
