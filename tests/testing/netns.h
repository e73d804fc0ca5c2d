// Hosts for tests on one machine: `hosts` network namespaces, each with an
// eth0 on a private test subnet (10.213.N.0/24, N from the process id),
// joined by a bridge in the test's own namespace, which also takes an
// address there (10.213.N.254) so the test itself can dial every host.
// Daemons run in a host with `ip netns exec` (DaemonClusterOptions::hosts),
// so cross-host reads, the advertised host, the local path's fallback
// between hosts and partitions (SetLink) are real. Everything is created
// by Create and removed by the destructor.
//
// Needs root (CAP_NET_ADMIN) and iproute2 (`ip` on PATH; deploy/
// install-deps.sh installs it): Create says why it cannot run
// (FAILED_PRECONDITION, naming the package to install when `ip` is
// missing), for the test to skip with that reason.
// Thread-compatible.
#ifndef TESSERA_TESTS_TESTING_NETNS_H_
#define TESSERA_TESTS_TESTING_NETNS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::testing {

class NetnsHosts {
 public:
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(int hosts);
  ~NetnsHosts();

  int size() const { return static_cast<int>(netns_.size()); }
  // The namespace's name, for `ip netns exec`.
  const std::string& netns(int host) const { return netns_[host]; }
  // Its address on the test subnet.
  const std::string& address(int host) const { return addresses_[host]; }

  // Sets the host's link down (a partition: nobody reaches it, it reaches
  // nobody) or up again.
  absl::Status SetLink(int host, bool up);

 private:
  NetnsHosts() = default;
  // Runs `ip` with `args`; INTERNAL quoting its output when it fails.
  absl::Status Ip(const std::vector<std::string>& args);
  // Whether `host` reaches the test's namespace over the bridge.
  absl::Status Probe(int host);

  std::string dir_;
  std::string bridge_;
  std::string bridge_address_;
  std::vector<std::string> netns_;
  std::vector<std::string> addresses_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_NETNS_H_
