#include "client/cli/launch/local_etcd.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/launch/secure_setup.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "io/errno.h"
#include "io/file.h"
#include "io/socket.h"
#include "wire/credentials.h"

namespace tessera::cli {
namespace {

constexpr char kMemberName[] = "tessera-launch";
// Tries of Spawn when a picked port was taken before etcd bound it.
constexpr int kPortTries = 3;

}  // namespace

absl::StatusOr<std::string> FindEtcdBinary(
    const std::string& path_env, const std::vector<std::string>& fallbacks) {
  for (absl::string_view dir :
       absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/etcd");
    if (IsExecutableFile(candidate)) return candidate;
  }
  for (const std::string& candidate : fallbacks) {
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(
      "no etcd on PATH (install Debian's etcd-server: apt-get install "
      "etcd-server)");
}

absl::StatusOr<std::unique_ptr<LocalEtcd>> LocalEtcd::Start(
    LocalEtcdOptions options) {
  if (::mkdir(options.dir.c_str(), 0700) != 0) {
    return ErrnoError(errno, absl::StrCat("cannot create ", options.dir),
                      absl::StatusCode::kInternal);
  }
  const bool log_kept = !options.log_path.empty();
  if (!log_kept) options.log_path = absl::StrCat(options.dir, "/etcd.log");
  std::unique_ptr<LocalEtcd> etcd(new LocalEtcd(std::move(options)));
  etcd->log_kept_ = log_kept;
  const std::string& dir = etcd->options_.dir;
  absl::Status made = MakeCertificates(
      dir, "tessera launch etcd CA",
      {{"server", "serverAuth,clientAuth", {"IP:127.0.0.1", "DNS:localhost"}},
       {"client", "clientAuth", {}}},
      /*valid_days=*/7);
  if (!made.ok()) {
    return absl::Status(made.code(), absl::StrCat("the certificates of the "
                                                  "local etcd: ",
                                                  made.message()));
  }
  etcd->ca_ = absl::StrCat(dir, "/ca.pem");
  etcd->server_cert_ = absl::StrCat(dir, "/server.pem");
  etcd->server_key_ = absl::StrCat(dir, "/server.key");
  etcd->client_cert_ = absl::StrCat(dir, "/client.pem");
  etcd->client_key_ = absl::StrCat(dir, "/client.key");

  const absl::Time deadline = absl::Now() + etcd->options_.start_timeout;
  for (int attempt = 1;; ++attempt) {
    RETURN_IF_ERROR(etcd->Spawn());
    absl::Status serving = etcd->WaitServing(deadline);
    if (serving.ok()) return etcd;
    etcd->Stop(absl::Seconds(1));
    const bool port_taken =
        absl::StrContains(etcd->LogTail(), "address already in use");
    if (!port_taken || attempt == kPortTries || absl::Now() >= deadline) {
      return serving;
    }
    etcd->process_.reset();
  }
}

LocalEtcd::~LocalEtcd() { Stop(absl::Seconds(5)); }

absl::Status LocalEtcd::Spawn() {
  // Held until etcd is about to start, so the two picks differ.
  ASSIGN_OR_RETURN(auto client, ListenTcp("127.0.0.1"));
  ASSIGN_OR_RETURN(auto peer, ListenTcp("127.0.0.1"));
  endpoint_ = absl::StrCat("127.0.0.1:", client.second);
  const std::string client_url = absl::StrCat("https://", endpoint_);
  const std::string peer_url = absl::StrCat("https://127.0.0.1:", peer.second);
  const std::string data = absl::StrCat(options_.dir, "/data");
  // A failed try may have left a member bootstrapped on other ports.
  std::error_code ignored;
  std::filesystem::remove_all(data, ignored);

  SpawnOptions spawn;
  spawn.program = options_.etcd;
  spawn.args = {
      "--name", kMemberName, "--data-dir", data, "--listen-client-urls",
      client_url, "--advertise-client-urls", client_url, "--listen-peer-urls",
      peer_url, "--initial-advertise-peer-urls", peer_url, "--initial-cluster",
      absl::StrCat(kMemberName, "=", peer_url), "--initial-cluster-state",
      "new", "--initial-cluster-token", options_.dir,
      // Mutual TLS for clients and peers, against our own CA.
      "--cert-file", server_cert_, "--key-file", server_key_,
      "--trusted-ca-file", ca_, "--client-cert-auth", "--peer-cert-file",
      server_cert_, "--peer-key-file", server_key_, "--peer-trusted-ca-file",
      ca_, "--peer-client-cert-auth",
      // A long launch must not grow etcd's history without end.
      "--auto-compaction-mode", "revision", "--auto-compaction-retention",
      "10000", "--logger", "zap", "--log-level", "warn"};
  spawn.log_path = options_.log_path;
  spawn.append_log = true;  // a retry, or an earlier launch's --log-dir
  spawn.stdin_null = true;
  spawn.new_process_group = true;
  spawn.die_with_parent = true;
  spawn.signal_mask = options_.signal_mask;
  client.first.reset();
  peer.first.reset();
  ASSIGN_OR_RETURN(Subprocess process, Subprocess::Spawn(std::move(spawn)));
  process_.emplace(std::move(process));
  return absl::OkStatus();
}

absl::Status LocalEtcd::WaitServing(absl::Time deadline) {
  TlsConfig tls;
  tls.ca_file = ca_;
  tls.cert_file = client_cert_;
  tls.key_file = client_key_;
  // First until the port accepts, so that gRPC's first connection
  // succeeds (a refused one would back off for a second or more); etcd
  // then holds the TLS handshake until it serves.
  while (true) {
    if (ConnectTcp(endpoint_, absl::Now() + absl::Milliseconds(200)).ok()) {
      break;
    }
    if (Exited().has_value() || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(endpoint_, ChannelCredentialsFor(tls));
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(channel);
  grpc::Status last;
  while (true) {
    if (std::optional<int> status = Exited()) {
      return absl::UnavailableError(
          absl::StrCat("the local etcd (", options_.etcd, ", pid ", pid(),
                       ") stopped before serving (",
                       DescribeWaitStatus(*status), "); ", LogNote()));
    }
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(1))));
    grpc::health::v1::HealthCheckResponse response;
    last = health->Check(&context, grpc::health::v1::HealthCheckRequest(),
                         &response);
    if (last.ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the local etcd (pid ", pid(), ") did not serve ", endpoint_,
          " in time (", last.ok() ? "not serving yet" : last.error_message(),
          "); ", LogNote()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::string LocalEtcd::StoreUrl() const {
  return absl::StrCat("etcd://", endpoint_, "/tessera/");
}

std::vector<std::string> LocalEtcd::DaemonFlags() const {
  return {"--store",          StoreUrl(),   "--store-tls-ca",  ca_,
          "--store-tls-cert", client_cert_, "--store-tls-key", client_key_};
}

std::optional<int> LocalEtcd::Exited() {
  if (!process_.has_value()) return std::nullopt;
  return process_->WaitFor(absl::ZeroDuration());
}

std::string LocalEtcd::LogNote() const {
  return absl::StrCat("its log", log_kept_ ? " " : "",
                      log_kept_ ? options_.log_path : "", " ends:\n",
                      LogTail());
}

std::string LocalEtcd::LogTail(size_t max_bytes) const {
  return ReadTail(options_.log_path, max_bytes);
}

bool LocalEtcd::Stop(absl::Duration timeout) {
  if (!process_.has_value() || !process_->running()) return true;
  process_->Signal(SIGTERM);
  if (process_->WaitFor(timeout).has_value()) return true;
  process_->Kill();
  return false;
}

}  // namespace tessera::cli
