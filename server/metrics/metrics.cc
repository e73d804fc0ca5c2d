#include "server/metrics/metrics.h"

#include <array>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/socket.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace tessera {
namespace {

constexpr std::array<const char*, 3> kTransports = {"grpc", "data_plane",
                                                    "local_path"};
constexpr std::array<const char*, 2> kDirections = {"read", "write"};

// The counters of every (transport, direction), resolved once.
struct TransferCounters {
  std::array<std::array<prometheus::Counter*, 2>, 3> transfers;
  std::array<std::array<prometheus::Counter*, 2>, 3> bytes;

  explicit TransferCounters(prometheus::Registry& registry) {
    auto& transfer_family = prometheus::BuildCounter()
                                .Name("tessera_transfers_total")
                                .Help(
                                    "Transfers of shard bytes this process "
                                    "served, by transport and direction")
                                .Register(registry);
    auto& byte_family = prometheus::BuildCounter()
                            .Name("tessera_transfer_bytes_total")
                            .Help(
                                "Payload bytes of the transfers this "
                                "process served, by transport and direction")
                            .Register(registry);
    for (size_t t = 0; t < kTransports.size(); ++t) {
      for (size_t d = 0; d < kDirections.size(); ++d) {
        const prometheus::Labels labels = {{"transport", kTransports[t]},
                                           {"direction", kDirections[d]}};
        transfers[t][d] = &transfer_family.Add(labels);
        bytes[t][d] = &byte_family.Add(labels);
      }
    }
  }
};

// Shared, since an exposer holds what it serves by weak_ptr; never
// destroyed.
const std::shared_ptr<prometheus::Registry>& SharedRegistry() {
  static const auto* const registry = new std::shared_ptr<prometheus::Registry>(
      std::make_shared<prometheus::Registry>());
  return *registry;
}

TransferCounters& Counters() {
  static TransferCounters* const counters =
      new TransferCounters(*SharedRegistry());
  return *counters;
}

}  // namespace

prometheus::Registry& MetricsRegistry() { return *SharedRegistry(); }

void CountTransfer(MetricsTransport transport, MetricsDirection direction,
                   int64_t bytes) {
  TransferCounters& counters = Counters();
  const auto t = static_cast<size_t>(transport);
  const auto d = static_cast<size_t>(direction);
  counters.transfers[t][d]->Increment();
  counters.bytes[t][d]->Increment(static_cast<double>(bytes));
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
    impl->exposer = std::make_unique<prometheus::Exposer>(bind, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", bind, ": ", e.what()));
  }
  Counters();  // Every series exists from the start, at zero.
  impl->exposer->RegisterCollectable(SharedRegistry());
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
