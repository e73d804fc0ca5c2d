#include "tests/testing/etcd_cluster.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/store/etcd_store.h"
#include "tests/testing/daemon_cluster.h"

namespace tessera::testing {
namespace {

// The `etcd` executable on PATH, or "".
std::string FindEtcd() {
  const char* path = getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/etcd");
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(
    int members, absl::Duration timeout) {
  EtcdClusterOptions options;
  options.members = members;
  options.timeout = timeout;
  return Start(std::move(options));
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(
    EtcdClusterOptions options) {
  const int members = options.members;
  const absl::Duration timeout = options.timeout;
  std::unique_ptr<EtcdCluster> cluster(new EtcdCluster());
  cluster->options_ = std::move(options);
  cluster->etcd_ = FindEtcd();
  if (cluster->etcd_.empty()) {
    return absl::NotFoundError(
        "no etcd on PATH: deploy/install-deps.sh installs etcd-server");
  }
  char dir_template[] = "/tmp/tessera-etcd-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", strerror(errno)));
  }
  cluster->dir_ = dir_template;
  std::vector<std::string> peers;
  for (int m = 0; m < members; ++m) {
    absl::StatusOr<int> client = PickFreePort();
    absl::StatusOr<int> peer = PickFreePort();
    if (!client.ok()) return client.status();
    if (!peer.ok()) return peer.status();
    cluster->endpoints_.push_back(absl::StrCat("127.0.0.1:", *client));
    cluster->peer_ports_.push_back(*peer);
    peers.push_back(absl::StrCat("m", m, "=http://127.0.0.1:", *peer));
  }
  cluster->initial_cluster_ = absl::StrJoin(peers, ",");
  cluster->members_.resize(members);
  for (int m = 0; m < members; ++m) {
    if (absl::Status spawned = cluster->Spawn(m); !spawned.ok()) {
      return spawned;
    }
  }
  if (absl::Status up = cluster->WaitAnswering(cluster->endpoints_, timeout, 0);
      !up.ok()) {
    return up;
  }
  return cluster;
}

EtcdCluster::~EtcdCluster() {
  for (std::optional<Subprocess>& member : members_) {
    if (member.has_value() && member->running()) member->Kill();
  }
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

absl::Status EtcdCluster::Spawn(int member) {
  const std::string name = absl::StrCat("m", member);
  const std::string client = absl::StrCat(
      options_.cert_file.empty() ? "http://" : "https://", endpoints_[member]);
  const std::string peer =
      absl::StrCat("http://127.0.0.1:", peer_ports_[member]);
  SpawnOptions spawn;
  spawn.program = etcd_;
  spawn.args = {"--name", name, "--data-dir", absl::StrCat(dir_, "/", name),
                "--listen-client-urls", client, "--advertise-client-urls",
                client, "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer, "--initial-cluster",
                initial_cluster_, "--initial-cluster-state", "new",
                "--initial-cluster-token", dir_,
                // Elections in a tenth of the default: a killed leader is
                // replaced within about a second.
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--log-level", "warn", "--logger", "zap"};
  if (!options_.cert_file.empty()) {
    spawn.args.insert(spawn.args.end(), {"--cert-file", options_.cert_file,
                                         "--key-file", options_.key_file});
  }
  if (!options_.ca_file.empty()) {
    spawn.args.insert(spawn.args.end(), {"--trusted-ca-file", options_.ca_file,
                                         "--client-cert-auth"});
  }
  spawn.log_path = absl::StrCat(dir_, "/", name, ".log");
  spawn.append_log = true;
  spawn.stdin_null = true;
  spawn.die_with_parent = true;
  absl::StatusOr<Subprocess> process = Subprocess::Spawn(std::move(spawn));
  if (!process.ok()) return process.status();
  members_[member].emplace(*std::move(process));
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitAnswering(std::vector<std::string> endpoints,
                                        absl::Duration timeout,
                                        int member_for_log) {
  EtcdStoreOptions options;
  options.endpoints = std::move(endpoints);
  options.prefix = "/tessera-test-health/";
  options.connect_timeout = timeout;
  options.tls = options_.client_tls;
  absl::StatusOr<std::shared_ptr<EtcdStore>> store =
      EtcdStore::Connect(options);
  if (!store.ok()) {
    return absl::UnavailableError(
        absl::StrCat(store.status().message(), "\nlog of member ",
                     member_for_log, ":\n", Log(member_for_log)));
  }
  return absl::OkStatus();
}

std::string EtcdCluster::Url(absl::string_view prefix) const {
  return absl::StrCat("etcd://", absl::StrJoin(endpoints_, ","), "/", prefix);
}

std::string EtcdCluster::Log(int member, size_t max_bytes) const {
  return members_[member].has_value() ? members_[member]->LogTail(max_bytes)
                                      : std::string();
}

void EtcdCluster::Kill(int member) {
  if (members_[member].has_value() && members_[member]->running()) {
    members_[member]->Kill();
  }
}

absl::Status EtcdCluster::Restart(int member, absl::Duration timeout) {
  Kill(member);
  if (absl::Status spawned = Spawn(member); !spawned.ok()) return spawned;
  return WaitAnswering({endpoints_[member]}, timeout, member);
}

}  // namespace tessera::testing
