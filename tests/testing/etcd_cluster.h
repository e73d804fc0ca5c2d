// A real etcd cluster on loopback for tests: `members` etcd processes
// (Debian's etcd-server) with fresh client and peer ports and data
// directories in a temporary directory, fast elections, logs kept for
// failure messages. The destructor kills every member and removes the
// directory.
//
// Thread-compatible.
#ifndef TESSERA_TESTS_TESTING_ETCD_CLUSTER_H_
#define TESSERA_TESTS_TESTING_ETCD_CLUSTER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "io/subprocess.h"
#include "wire/credentials.h"

namespace tessera::testing {

struct EtcdClusterOptions {
  int members = 1;
  absl::Duration timeout = absl::Seconds(30);
  // With a certificate, clients are served over TLS (https client URLs);
  // with a CA too, only clients presenting a certificate it signed
  // (--client-cert-auth).
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  // What the helper presents when it checks that the cluster answers.
  TlsConfig client_tls;
};

class EtcdCluster {
 public:
  // Starts the members and waits until the cluster answers a read (it has
  // a leader). NOT_FOUND when no `etcd` is on PATH (deploy/install-deps.sh
  // installs etcd-server); on other failures the error quotes a log.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(
      int members = 1, absl::Duration timeout = absl::Seconds(30));
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(
      EtcdClusterOptions options);
  ~EtcdCluster();

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:port" of each member's client URL.
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // "etcd://127.0.0.1:p0,127.0.0.1:p1,.../<prefix>".
  std::string Url(absl::string_view prefix) const;
  std::string Log(int member, size_t max_bytes = 4096) const;

  // SIGKILL.
  void Kill(int member);
  // Starts a killed member again on its data directory and ports, and
  // waits until it answers on its own.
  absl::Status Restart(int member, absl::Duration timeout = absl::Seconds(30));

 private:
  EtcdCluster() = default;
  absl::Status Spawn(int member);
  // Waits until `endpoints` (one member, or all) answer a read.
  absl::Status WaitAnswering(std::vector<std::string> endpoints,
                             absl::Duration timeout, int member_for_log);

  EtcdClusterOptions options_;
  std::string dir_;
  std::string etcd_;
  std::string initial_cluster_;
  std::vector<std::string> endpoints_;
  std::vector<int> peer_ports_;
  std::vector<std::optional<Subprocess>> members_;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_ETCD_CLUSTER_H_
