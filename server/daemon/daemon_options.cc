#include "server/daemon/daemon_options.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "client/lanes.h"
#include "common/byte_size.h"
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "io/socket.h"
#include "server/collective/process_group.h"
#include "server/store/etcd_store.h"
#include "wire/auth.h"

namespace tessera::daemon {
namespace {

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

// The device and backend for `text` (auto, cpu, cuda, cuda:N).
absl::Status ResolveDevice(const std::string& text,
                           const DaemonEnvironment& env,
                           DaemonOptions& options) {
  const bool cuda_usable = env.cuda_devices > 0 && env.nccl;
  // Whether this host has more daemons than GPUs, as far as it can tell:
  // local ranks are dense, so local rank N means N + 1 of them.
  const bool outnumbered = options.local_rank >= env.cuda_devices ||
                           options.local_world_size > env.cuda_devices;
  if (text == "auto") {
    options.device = cuda_usable && !outnumbered
                         ? Device::Cuda(options.local_rank)
                         : Device::Cpu();
  } else {
    absl::StatusOr<Device> device = Device::Parse(text);
    if (!device.ok() || device->is_meta()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--device must be auto, cpu, cuda or cuda:N, got '", text, "'"));
    }
    // "cuda" spreads local ranks over the GPUs as Rank::Init does.
    const int spread = env.cuda_devices > 0
                           ? options.local_rank % env.cuda_devices
                           : options.local_rank;
    options.device = device->is_cpu()
                         ? Device::Cpu()
                         : Device::Cuda(device->index().value_or(spread));
  }
  if (options.device.is_cpu()) {
    options.backend = "gloo";
    return absl::OkStatus();
  }
  if (!env.nccl) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", text,
                     ": this build has no NCCL backend; use --device cpu"));
  }
  if (*options.device.index() >= env.cuda_devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", text, ": no CUDA device ", *options.device.index(), " (",
        env.cuda_devices, " visible)"));
  }
  if (!outnumbered) {
    options.backend = "nccl";
    return absl::OkStatus();
  }
  if (options.local_world_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", text, ": local rank ", options.local_rank,
        " shares a GPU (", env.cuda_devices,
        " visible) and NCCL needs one per rank; pass --local-world-size (or "
        "set LOCAL_WORLD_SIZE) so that every rank on this host uses gloo"));
  }
  options.backend = "gloo";
  return absl::OkStatus();
}

// A user name or a numeric uid (--local-users).
absl::StatusOr<uid_t> ResolveUser(const std::string& user) {
  uint32_t uid = 0;
  if (absl::SimpleAtoi(user, &uid)) return static_cast<uid_t>(uid);
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (getpwnam_r(user.c_str(), &entry, buffer.data(), buffer.size(), &found) !=
          0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--local-users: no user '", user, "' on this host"));
  }
  return found->pw_uid;
}

}  // namespace

std::string DaemonOptions::store_address() const {
  return absl::StrCat(master_addr, ":", master_port);
}

absl::StatusOr<std::string> LocalAddressFor(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) == 0) {
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(found, freeaddrinfo);
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      sockaddr_in local{};
      socklen_t length = sizeof(local);
      const bool routed =
          connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
          getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
      close(fd);
      char text[INET_ADDRSTRLEN];
      if (routed && local.sin_addr.s_addr != htonl(INADDR_ANY) &&
          inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
        return std::string(text);
      }
    }
  }
  // No route (or an unresolvable master): this host's name, preferring a
  // non-loopback address.
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) {
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(name, nullptr, &hints, &found) == 0) {
      std::unique_ptr<addrinfo, void (*)(addrinfo*)> owner(found, freeaddrinfo);
      std::string best;
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        char text[INET_ADDRSTRLEN];
        const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
        if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) {
          continue;
        }
        if (!IsLoopbackHost(text)) return std::string(text);
        if (best.empty()) best = text;
      }
      if (!best.empty()) return best;
    }
  }
  return absl::UnavailableError(
      absl::StrCat("cannot find this host's address towards ", host,
                   "; pass --advertise-host"));
}

absl::StatusOr<absl::Duration> ParsePositiveDuration(absl::string_view what,
                                                     absl::string_view text) {
  absl::Duration duration;
  double seconds = 0;
  bool parsed = absl::ParseDuration(text, &duration);
  if (!parsed && absl::SimpleAtod(text, &seconds)) {
    parsed = true;
    duration = absl::Seconds(seconds);
  }
  if (!parsed || duration <= absl::ZeroDuration() ||
      duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " must be a positive duration (e.g. 60s, 500ms), "
                     "got '",
                     text, "'"));
  }
  return duration;
}

std::string DurationText(absl::Duration duration) {
  if (duration == absl::Seconds(absl::ToInt64Seconds(duration))) {
    return absl::StrCat(absl::ToInt64Seconds(duration), "s");
  }
  return absl::FormatDuration(duration);
}

DaemonEnvironment ProcessEnvironment() {
  DaemonEnvironment env;
  env.getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
  env.cuda_devices = CudaDeviceCount();
  for (const std::string& backend : ProcessGroupBackends()) {
    if (backend == "nccl") env.nccl = true;
  }
  env.local_address = LocalAddressFor;
  return env;
}

namespace {

constexpr int kMaxPort = 65535;

constexpr char kDescription[] =
    "tessera-server: one Tessera shard-server daemon (one per GPU or CPU "
    "rank).\nServes ShardService, ControlService, grpc.health.v1 and "
    "reflection on --port;\nrank 0 also serves the rendezvous store on "
    "--master-port. SIGTERM/SIGINT drain\nand stop it (a second signal "
    "exits at once). Flags override the environment.";

using ApplyFn = DaemonSettingTable::ApplyFn;
using CheckFn = DaemonSettingTable::CheckFn;

// A positive duration ("60s", "1m30s", "250ms", "2") into `field`.
ApplyFn DurationInto(absl::Duration DaemonOptions::*field) {
  return [field](const SettingValue& value,
                 DaemonOptions& options) -> absl::Status {
    ASSIGN_OR_RETURN(options.*field,
                     ParsePositiveDuration(value.source, value.text));
    return absl::OkStatus();
  };
}

// A file of a TLS configuration (the daemon's own, or the etcd store's).
ApplyFn TlsFileInto(TlsConfig DaemonOptions::*config,
                    std::string TlsConfig::*file) {
  return [config, file](const SettingValue& value, DaemonOptions& options) {
    (options.*config).*file = value.text;
    return absl::OkStatus();
  };
}

CheckFn NotEmpty(std::string DaemonOptions::*field) {
  return [field](absl::string_view source, const DaemonOptions& options) {
    if (!(options.*field).empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(source, " must not be empty"));
  };
}

// One of `allowed`, else "<source> must be <what>; got '<value>'".
CheckFn OneOf(std::string DaemonOptions::*field,
              std::vector<std::string> allowed, std::string what) {
  return [field, allowed, what](absl::string_view source,
                                const DaemonOptions& options) {
    const std::string& value = options.*field;
    if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source, " must be ", what, "; got '", value, "'"));
  };
}

absl::Status CheckTokenFile(const SettingValue& value, DaemonOptions& options) {
  if (value.text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(value.source, " must not be empty"));
  }
  absl::StatusOr<std::shared_ptr<TokenTable>> tokens =
      TokenTable::FromFile(value.text);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(value.source, ": ", tokens.status().message()));
  }
  if ((*tokens)->cluster_token().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        value.source, ": ", value.text,
        " has no token with the cluster role: the daemons present it to "
        "each other and to the store"));
  }
  options.auth_token_file = value.text;
  return absl::OkStatus();
}

// The checks that span settings, once every setting is resolved.

// TLS to etcd is for an etcd store, and whole.
absl::Status CheckStoreTls(const DaemonOptions& options) {
  if (!options.store_tls.enabled()) return absl::OkStatus();
  if (options.store_url.empty()) {
    return absl::InvalidArgumentError(
        "--store-tls-ca, --store-tls-cert and --store-tls-key are for an "
        "etcd store: pass --store etcd://...");
  }
  return ValidateTlsConfig(options.store_tls, /*server=*/false,
                           "--store-tls-cert", "--store-tls-key",
                           "--store-tls-ca");
}

// A daemon that authenticates nobody stays on this host unless --insecure.
absl::Status CheckReach(const DaemonOptions& options) {
  if (options.authenticates() || options.insecure) return absl::OkStatus();
  std::string beyond;
  if (!IsLoopbackHost(options.host)) {
    beyond = absl::StrCat("--host ", options.host, " listens beyond this host");
  } else if (!IsLoopbackHost(options.master_addr)) {
    beyond = absl::StrCat("the master ", options.master_addr,
                          " is not on loopback: a cluster beyond this host");
  }
  if (beyond.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      beyond,
      " without authentication: anyone who reaches it could read, change "
      "and delete every tensor. Authenticate callers (--tls-ca for mutual "
      "TLS, or --auth-token-file), or pass --insecure on a network only "
      "trusted users reach"));
}

// An etcd beyond this host reached without mutual TLS lets whoever reaches
// it forge the operation log, whatever the daemons ask of their own
// callers.
absl::Status CheckStoreReach(const DaemonOptions& options) {
  if (options.store_url.empty() || options.insecure) return absl::OkStatus();
  const bool mutual_tls = !options.store_tls.ca_file.empty() &&
                          !options.store_tls.cert_file.empty();
  ASSIGN_OR_RETURN(EtcdStoreOptions etcd, ParseEtcdUrl(options.store_url));
  for (const std::string& endpoint : etcd.endpoints) {
    const std::string host = endpoint.substr(0, endpoint.rfind(':'));
    if (!mutual_tls && !IsLoopbackHost(host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--store: the etcd member ", endpoint,
          " is not on loopback and is reached without mutual TLS: anyone "
          "who reaches it could forge the operation log. Pass "
          "--store-tls-ca, --store-tls-cert and --store-tls-key (etcd with "
          "--client-cert-auth), or --insecure on a network only trusted "
          "users reach"));
    }
  }
  return absl::OkStatus();
}

// --advertise-host's default; the only step that may look at the network.
absl::StatusOr<std::string> DefaultAdvertiseHost(const DaemonOptions& options,
                                                 const DaemonEnvironment& env) {
  if (!IsWildcardHost(options.host)) return options.host;
  if (IsLoopbackHost(options.master_addr)) return std::string("127.0.0.1");
  if (!env.local_address) {
    return absl::UnavailableError(
        "cannot find this host's address; pass --advertise-host");
  }
  return env.local_address(options.master_addr);
}

}  // namespace

DaemonSettingTable DaemonSettings(const DaemonEnvironment& env) {
  DaemonSettingTable table;
  // Who this daemon is, as torchrun and Slurm say it.
  table.Add("--world-size", &DaemonFlags::world_size)
      .Env({"WORLD_SIZE", "SLURM_NTASKS"})
      .Required("world size")
      .Help("N", "number of daemons")
      .Int(&DaemonOptions::world_size, 1, 1 << 20);
  table.Add("--rank", &DaemonFlags::rank)
      .Env({"RANK", "SLURM_PROCID"})
      .Required("rank")
      .Help("N", "global rank")
      .Int(&DaemonOptions::rank, 0, 1 << 20)
      .Check([](absl::string_view source, const DaemonOptions& options) {
        if (options.rank < options.world_size) return absl::OkStatus();
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", options.rank, " (", source,
                         ") is outside [0, ", options.world_size, ")"));
      });
  table.Add("--local-rank", &DaemonFlags::local_rank)
      .Env({"LOCAL_RANK", "SLURM_LOCALID"})
      .Default("0")
      .Help("N", "rank on this host")
      .Int(&DaemonOptions::local_rank, 0, kMaxPort - kDefaultBasePort);
  table.Add("--local-world-size", &DaemonFlags::local_world_size)
      .Env({"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"})
      .DefaultNote("unknown")
      .Help("N", "daemons on this host")
      .Int(&DaemonOptions::local_world_size, 1, kMaxPort - kDefaultBasePort + 1)
      .Check([](absl::string_view source, const DaemonOptions& options) {
        if (options.local_rank < options.local_world_size) {
          return absl::OkStatus();
        }
        return absl::InvalidArgumentError(
            absl::StrCat("local rank ", options.local_rank, " is outside [0, ",
                         options.local_world_size, ") (", source, ")"));
      });

  // The store: rank 0's, or etcd.
  table.Add("--master-addr", &DaemonFlags::master_addr)
      .Env({"MASTER_ADDR"})
      .Default("127.0.0.1")
      .Help("HOST", "host of rank 0's store")
      .Text(&DaemonOptions::master_addr)
      .Check(NotEmpty(&DaemonOptions::master_addr));
  table.Add("--master-port", &DaemonFlags::master_port)
      .Env({"MASTER_PORT"})
      .Default(absl::StrCat(kDefaultMasterPort))
      .Help("PORT", "port of rank 0's store")
      .Int(&DaemonOptions::master_port, 1, kMaxPort);
  table.Add("--store", &DaemonFlags::store)
      .Env({"TESSERA_STORE"})
      .DefaultNote("rank 0 serves it on --master-addr:--master-port")
      .Help("URL",
            "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]: keep the store in etcd, "
            "so that any daemon, rank 0 included, may restart")
      .Apply([](const SettingValue& value, DaemonOptions& options) {
        absl::StatusOr<EtcdStoreOptions> etcd = ParseEtcdUrl(value.text);
        if (!etcd.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(value.source, ": ", etcd.status().message()));
        }
        options.store_url = value.text;
        return absl::OkStatus();
      });
  table.Add("--store-tls-ca", &DaemonFlags::store_tls_ca)
      .Env({"TESSERA_STORE_TLS_CA"})
      .Help("PEM",
            "CA to verify the etcd store's certificate with (TLS to etcd)")
      .Apply(TlsFileInto(&DaemonOptions::store_tls, &TlsConfig::ca_file));
  table.Add("--store-tls-cert", &DaemonFlags::store_tls_cert)
      .Env({"TESSERA_STORE_TLS_CERT"})
      .Help("PEM", "client certificate presented to etcd")
      .Apply(TlsFileInto(&DaemonOptions::store_tls, &TlsConfig::cert_file));
  table.Add("--store-tls-key", &DaemonFlags::store_tls_key)
      .Env({"TESSERA_STORE_TLS_KEY"})
      .Help("PEM", "its private key")
      .Apply(TlsFileInto(&DaemonOptions::store_tls, &TlsConfig::key_file));

  // Who may call it (wire/credentials.h, wire/auth.h).
  table.Add("--insecure", &DaemonFlags::insecure)
      .Help("",
            "listen beyond loopback (or join a cluster beyond this host) "
            "without authenticating callers")
      .Bool(&DaemonOptions::insecure);
  table.Add("--auth-token-file", &DaemonFlags::auth_token_file)
      .DefaultNote("none: no tokens")
      .Help("FILE",
            "tokens and roles, '<token> <read|write|admin|cluster> [name]' "
            "per line: every call needs a token of a role that may make it; "
            "reloaded when the file changes")
      .Apply(CheckTokenFile);
  table.Add("--reflection", &DaemonFlags::reflection)
      .Default("true")
      .Help("BOOL", "serve gRPC server reflection")
      .Bool(&DaemonOptions::reflection);
  table.Add("--local-users", &DaemonFlags::local_users)
      .Help("USER",
            "a user (name or uid) whose processes may map shards through the "
            "local path, besides this daemon's user and root (repeatable)")
      .Apply([](const SettingValue& value,
                DaemonOptions& options) -> absl::Status {
        ASSIGN_OR_RETURN(uid_t uid, ResolveUser(value.text));
        options.local_users.push_back(uid);
        return absl::OkStatus();
      });
  table.Add("--tls-cert", &DaemonFlags::tls_cert)
      .DefaultNote("none: plaintext")
      .Help("FILE",
            "PEM certificate chain: serve (and dial peers) over TLS; reloaded "
            "when the file changes")
      .Apply(TlsFileInto(&DaemonOptions::tls, &TlsConfig::cert_file));
  table.Add("--tls-key", &DaemonFlags::tls_key)
      .Help("FILE", "PEM private key of --tls-cert")
      .Apply(TlsFileInto(&DaemonOptions::tls, &TlsConfig::key_file));
  table.Add("--tls-ca", &DaemonFlags::tls_ca)
      .Help("FILE",
            "PEM CA certificates: require and verify client certificates "
            "(mutual TLS) and verify peers")
      .Apply(TlsFileInto(&DaemonOptions::tls, &TlsConfig::ca_file));
  table.Add("--tls-refresh", &DaemonFlags::tls_refresh)
      .Default("60")
      .Help("SECONDS",
            "seconds between checks of the TLS files for rotated "
            "certificates")
      .Apply([](const SettingValue& value,
                DaemonOptions& options) -> absl::Status {
        ASSIGN_OR_RETURN(options.tls.refresh_seconds, value.ToIntIn(1, 86400));
        return absl::OkStatus();
      });

  // Where it listens (after who may call: the host's default depends on it).
  table.Add("--host", &DaemonFlags::host)
      .Default(
          [](const DaemonOptions& options) {
            return std::string(options.authenticates() || options.insecure
                                   ? "0.0.0.0"
                                   : "127.0.0.1");
          },
          "0.0.0.0 with --tls-ca, --auth-token-file or --insecure, else "
          "127.0.0.1")
      .Help("HOST", "listen host")
      .Text(&DaemonOptions::host)
      .Check(NotEmpty(&DaemonOptions::host));
  table.Add("--port", &DaemonFlags::port)
      .Default(
          [](const DaemonOptions& options) {
            return absl::StrCat(kDefaultBasePort + options.local_rank);
          },
          absl::StrCat(kDefaultBasePort, " + local rank"))
      .Help("PORT", "gRPC port; 0 picks a free one")
      .Int(&DaemonOptions::port, 0, kMaxPort);
  table.Add("--data-port", &DaemonFlags::data_port)
      .Default("0")
      .Help("PORT",
            "the data plane's TCP port, on --host: name it where a firewall "
            "or a job's port range must let clients in; 0 picks a free one "
            "(every client learns it from the daemon)")
      .Int(&DaemonOptions::data_port, 0, kMaxPort)
      .Check([](absl::string_view source, const DaemonOptions& options) {
        if (options.data_port == 0 || options.data_port != options.port) {
          return absl::OkStatus();
        }
        return absl::InvalidArgumentError(absl::StrCat(
            source,
            " is --port's too: the data plane needs a port of its own"));
      });
  table.Add("--data-lanes", &DaemonFlags::data_lanes)
      .Default("0")
      .Help("N",
            absl::StrCat("the most data-plane connections one large fetch "
                         "from a peer is striped across (each carries 8 MiB "
                         "or more); 0 is the default, ",
                         kDefaultDataLanes, "; 1 uses one connection"))
      .Int(&DaemonOptions::data_lanes, 0, kMaxDataLanes);
  table.Add("--advertise-host", &DaemonFlags::advertise_host)
      .DefaultNote(
          "--host if specific, 127.0.0.1 for a loopback master, else this "
          "host's address")
      .Help("HOST", "host peers and clients dial")
      .Text(&DaemonOptions::advertise_host);
  table.Add("--metrics-port", &DaemonFlags::metrics_port)
      .DefaultNote("not served")
      .Help("PORT",
            "serve Prometheus metrics on http://--metrics-host:PORT/metrics; "
            "0 picks a free one")
      .Int(&DaemonOptions::metrics_port, 0, kMaxPort);
  table.Add("--metrics-address-file", &DaemonFlags::metrics_address_file)
      .Help("FILE",
            "write the metrics endpoint's \"host:port\" here once serving")
      .Text(&DaemonOptions::metrics_address_file)
      .Check([](absl::string_view source, const DaemonOptions& options) {
        if (options.metrics_address_file.empty() || options.metrics_port >= 0) {
          return absl::OkStatus();
        }
        return absl::InvalidArgumentError(
            absl::StrCat(source, " needs --metrics-port"));
      });
  // The endpoint authenticates nobody, but shows no tensor names or data:
  // beyond this host it is allowed to a daemon whose data surfaces are
  // authenticated (where --insecure would relax those too), or with
  // --insecure.
  table.Add("--metrics-host", &DaemonFlags::metrics_host)
      .Default("127.0.0.1")
      .Help("HOST",
            "where --metrics-port listens; beyond loopback only for a daemon "
            "that authenticates (--tls-ca, --auth-token-file) or with "
            "--insecure: the endpoint itself authenticates nobody")
      .Text(&DaemonOptions::metrics_host)
      .Check(NotEmpty(&DaemonOptions::metrics_host))
      .Check([](absl::string_view source, const DaemonOptions& options) {
        if (IsLoopbackHost(options.metrics_host) || options.authenticates() ||
            options.insecure) {
          return absl::OkStatus();
        }
        return absl::InvalidArgumentError(absl::StrCat(
            source, " ", options.metrics_host,
            " listens beyond this host, and this daemon authenticates "
            "nobody: authenticate it (--tls-ca, --auth-token-file), or pass "
            "--insecure on a network only trusted users reach"));
      });

  // How long things may take.
  table.Add("--timeout", &DaemonFlags::timeout)
      .Default("60s")
      .Help("DURATION", "rendezvous and collective timeout")
      .Apply(DurationInto(&DaemonOptions::timeout));
  table.Add("--store-timeout", &DaemonFlags::store_timeout)
      .Default("60s")
      .Help("DURATION", "how long to wait for the master's store")
      .Apply(DurationInto(&DaemonOptions::store_timeout));
  table.Add("--shutdown-grace", &DaemonFlags::shutdown_grace)
      .Default("10s")
      .Help("DURATION", "how long in-flight fetches may finish after SIGTERM")
      .Apply(DurationInto(&DaemonOptions::shutdown_grace));
  table.Add("--lease", &DaemonFlags::lease)
      .Default("5s")
      .Help("DURATION",
            "liveness lease: a daemon silent this long is waited for, and "
            "operations are refused naming it, until it is back")
      .Apply(DurationInto(&DaemonOptions::lease));

  // What it writes.
  table.Add("--log-level", &DaemonFlags::log_level)
      .Default("info")
      .Help("LEVEL", "trace, debug, info, warn or error")
      .Text(&DaemonOptions::log_level)
      .Check(OneOf(&DaemonOptions::log_level,
                   {"trace", "debug", "info", "warn", "error"},
                   "one of trace, debug, info, warn, error"));
  table.Add("--log-format", &DaemonFlags::log_format)
      .Default("text")
      .Help("FORMAT",
            "text, or json: one object per line with time, level, rank, "
            "generation, op, tensor, request, peer and message")
      .Text(&DaemonOptions::log_format)
      .Check(
          OneOf(&DaemonOptions::log_format, {"text", "json"}, "text or json"));
  table.Add("--address-file", &DaemonFlags::address_file)
      .Help("FILE", "write \"host:port\" here once serving")
      .Text(&DaemonOptions::address_file);

  // What it holds.
  table.Add("--checkpoint-root", &DaemonFlags::checkpoint_roots)
      .DefaultNote("none: save and load are refused")
      .Help("DIR",
            "a directory save and load may use (created if missing; "
            "repeatable); a checkpoint path is relative to the first or an "
            "absolute path inside one")
      .Apply([](const SettingValue& value, DaemonOptions& options) {
        if (value.text.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(value.source, " must not be empty"));
        }
        options.checkpoint_roots.push_back(value.text);
        return absl::OkStatus();
      });
  table.Add("--memory-limit", &DaemonFlags::memory_limit)
      .DefaultNote("the cgroup limit, else RAM / local daemons, less a reserve")
      .Help("SIZE",
            "host memory this daemon may hold: shards, staging, gathers (e.g. "
            "8GiB)")
      .Apply([](const SettingValue& value,
                DaemonOptions& options) -> absl::Status {
        ASSIGN_OR_RETURN(options.memory_limit,
                         ParseByteSize(value.source, value.text));
        if (options.memory_limit > 0) return absl::OkStatus();
        return absl::InvalidArgumentError(
            absl::StrCat(value.source, " must be positive"));
      });
  // Last of the table: it reads the local rank and world size.
  table.Add("--device", &DaemonFlags::device)
      .Default("auto")
      .Help("DEVICE",
            "auto, cpu, cuda or cuda:N (auto: cuda:<local rank> when every "
            "local rank has a GPU, else cpu); ranks sharing a GPU use gloo")
      .Apply([&env](const SettingValue& value, DaemonOptions& options) {
        return ResolveDevice(value.text, env, options);
      });
  return table;
}

absl::StatusOr<DaemonOptions> ResolveDaemonOptions(
    const DaemonFlags& flags, const DaemonEnvironment& env) {
  DaemonOptions options;
  RETURN_IF_ERROR(DaemonSettings(env).Resolve(flags, env.getenv, options));
  RETURN_IF_ERROR(CheckStoreTls(options));
  RETURN_IF_ERROR(ValidateTlsConfig(options.tls, /*server=*/true));
  RETURN_IF_ERROR(CheckReach(options));
  RETURN_IF_ERROR(CheckStoreReach(options));
  if (options.advertise_host.empty()) {
    ASSIGN_OR_RETURN(options.advertise_host,
                     DefaultAdvertiseHost(options, env));
  }
  return options;
}

void PrintDaemonError(std::ostream& err, absl::string_view message) {
  err << "tessera-server: error: "
      << absl::StrReplaceAll(message, {{"\r\n", " "}, {"\n", " "}, {"\r", " "}})
      << std::endl;
}

ParsedCommandLine ParseDaemonCommandLine(int argc, const char* const* argv,
                                         const DaemonEnvironment& env,
                                         std::ostream& out, std::ostream& err) {
  DaemonFlags flags;
  CLI::App app(kDescription, "tessera-server");
  app.get_formatter()->column_width(34);
  DaemonSettings(env).AddTo(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    app.exit(e, out, err);
    return ParsedCommandLine{std::nullopt, kExitOk};
  } catch (const CLI::ParseError& e) {
    PrintDaemonError(err,
                     absl::StrCat(e.what(), "; run 'tessera-server --help'"));
    return ParsedCommandLine{std::nullopt, kExitUsage};
  }
  absl::StatusOr<DaemonOptions> options = ResolveDaemonOptions(flags, env);
  if (!options.ok()) {
    PrintDaemonError(err, options.status().message());
    return ParsedCommandLine{
        std::nullopt,
        options.status().code() == absl::StatusCode::kInvalidArgument
            ? kExitUsage
            : kExitFailure};
  }
  return ParsedCommandLine{*std::move(options), kExitOk};
}

}  // namespace tessera::daemon
