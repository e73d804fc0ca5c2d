#include "server/daemon/daemon_options.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

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
#include "common/status_macros.h"
#include "common/tensor/tensor.h"
#include "io/socket.h"
#include "server/collective/process_group.h"
#include "server/store/etcd_store.h"
#include "wire/auth.h"

namespace tessera::daemon {
namespace {

constexpr absl::string_view kLogLevels[] = {"trace", "debug", "info", "warn",
                                            "error"};

// A setting's value and where it came from ("--rank", "RANK"), for errors.
struct Setting {
  std::string source;
  std::string value;
};

// The flag when given, else the first of `variables` set to a non-empty
// value, else nullopt.
std::optional<Setting> Lookup(const std::optional<std::string>& flag,
                              absl::string_view flag_name,
                              std::initializer_list<const char*> variables,
                              const DaemonEnvironment& env) {
  if (flag.has_value()) return Setting{std::string(flag_name), *flag};
  for (const char* name : variables) {
    std::optional<std::string> value =
        env.getenv ? env.getenv(name) : std::nullopt;
    if (value.has_value() && !value->empty()) return Setting{name, *value};
  }
  return std::nullopt;
}

absl::StatusOr<int> ParseInt(const Setting& setting, int min, int max) {
  int value = 0;
  if (!absl::SimpleAtoi(setting.value, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        setting.source, " must be an integer, got '", setting.value, "'"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        setting.source, " must be in [", min, ", ", max, "], got ", value));
  }
  return value;
}

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

absl::StatusOr<int64_t> ParseByteSize(absl::string_view flag,
                                      absl::string_view text) {
  struct Unit {
    absl::string_view suffix;
    double factor;
  };
  static constexpr Unit kUnits[] = {{"KiB", 1024.0},
                                    {"MiB", 1048576.0},
                                    {"GiB", 1073741824.0},
                                    {"TiB", 1099511627776.0},
                                    {"Ki", 1024.0},
                                    {"Mi", 1048576.0},
                                    {"Gi", 1073741824.0},
                                    {"Ti", 1099511627776.0},
                                    {"KB", 1e3},
                                    {"MB", 1e6},
                                    {"GB", 1e9},
                                    {"TB", 1e12},
                                    {"K", 1e3},
                                    {"M", 1e6},
                                    {"G", 1e9},
                                    {"T", 1e12},
                                    {"B", 1.0}};
  absl::string_view number = absl::StripAsciiWhitespace(text);
  double factor = 1;
  for (const Unit& unit : kUnits) {
    if (absl::ConsumeSuffix(&number, unit.suffix)) {
      factor = unit.factor;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !(value >= 0) ||
      value * factor > 9.0e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " must be a size such as 512MiB or 8GiB; got '", text, "'"));
  }
  return static_cast<int64_t>(value * factor);
}

absl::StatusOr<DaemonOptions> ResolveDaemonOptions(
    const DaemonFlags& flags, const DaemonEnvironment& env) {
  constexpr int kMaxPort = 65535;
  DaemonOptions options;
  // Of the etcd store, when --store names one.
  std::vector<std::string> store_endpoints;

  std::optional<Setting> world_size = Lookup(
      flags.world_size, "--world-size", {"WORLD_SIZE", "SLURM_NTASKS"}, env);
  if (!world_size.has_value()) {
    return absl::InvalidArgumentError(
        "no world size: pass --world-size or set WORLD_SIZE (or "
        "SLURM_NTASKS)");
  }
  ASSIGN_OR_RETURN(options.world_size, ParseInt(*world_size, 1, 1 << 20));
  std::optional<Setting> rank =
      Lookup(flags.rank, "--rank", {"RANK", "SLURM_PROCID"}, env);
  if (!rank.has_value()) {
    return absl::InvalidArgumentError(
        "no rank: pass --rank or set RANK (or SLURM_PROCID)");
  }
  ASSIGN_OR_RETURN(options.rank, ParseInt(*rank, 0, 1 << 20));
  if (options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " (", rank->source,
                     ") is outside [0, ", options.world_size, ")"));
  }
  if (std::optional<Setting> local =
          Lookup(flags.local_rank, "--local-rank",
                 {"LOCAL_RANK", "SLURM_LOCALID"}, env)) {
    ASSIGN_OR_RETURN(options.local_rank,
                     ParseInt(*local, 0, kMaxPort - kDefaultBasePort));
  }
  if (std::optional<Setting> local_world =
          Lookup(flags.local_world_size, "--local-world-size",
                 {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}, env)) {
    ASSIGN_OR_RETURN(
        options.local_world_size,
        ParseInt(*local_world, 1, kMaxPort - kDefaultBasePort + 1));
    if (options.local_rank >= options.local_world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local rank ", options.local_rank, " is outside [0, ",
          options.local_world_size, ") (", local_world->source, ")"));
    }
  }

  if (std::optional<Setting> master =
          Lookup(flags.master_addr, "--master-addr", {"MASTER_ADDR"}, env)) {
    options.master_addr = master->value;
  }
  if (options.master_addr.empty()) {
    return absl::InvalidArgumentError("--master-addr must not be empty");
  }
  if (std::optional<Setting> port =
          Lookup(flags.master_port, "--master-port", {"MASTER_PORT"}, env)) {
    ASSIGN_OR_RETURN(options.master_port, ParseInt(*port, 1, kMaxPort));
  }

  if (std::optional<Setting> store =
          Lookup(flags.store, "--store", {"TESSERA_STORE"}, env)) {
    absl::StatusOr<EtcdStoreOptions> etcd = ParseEtcdUrl(store->value);
    if (!etcd.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(store->source, ": ", etcd.status().message()));
    }
    options.store_url = store->value;
    store_endpoints = etcd->endpoints;
  }
  if (auto ca = Lookup(flags.store_tls_ca, "--store-tls-ca",
                       {"TESSERA_STORE_TLS_CA"}, env)) {
    options.store_tls.ca_file = ca->value;
  }
  if (auto cert = Lookup(flags.store_tls_cert, "--store-tls-cert",
                         {"TESSERA_STORE_TLS_CERT"}, env)) {
    options.store_tls.cert_file = cert->value;
  }
  if (auto key = Lookup(flags.store_tls_key, "--store-tls-key",
                        {"TESSERA_STORE_TLS_KEY"}, env)) {
    options.store_tls.key_file = key->value;
  }
  if (options.store_tls.enabled()) {
    if (options.store_url.empty()) {
      return absl::InvalidArgumentError(
          "--store-tls-ca, --store-tls-cert and --store-tls-key are for an "
          "etcd store: pass --store etcd://...");
    }
    RETURN_IF_ERROR(ValidateTlsConfig(options.store_tls, /*server=*/false,
                                      "--store-tls-cert", "--store-tls-key",
                                      "--store-tls-ca"));
  }

  options.insecure = flags.insecure;
  options.auth_token_file = flags.auth_token_file.value_or("");
  if (flags.auth_token_file.has_value()) {
    if (options.auth_token_file.empty()) {
      return absl::InvalidArgumentError("--auth-token-file must not be empty");
    }
    absl::StatusOr<std::shared_ptr<TokenTable>> tokens =
        TokenTable::FromFile(options.auth_token_file);
    if (!tokens.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth-token-file: ", tokens.status().message()));
    }
    if ((*tokens)->cluster_token().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth-token-file: ", options.auth_token_file,
          " has no token with the cluster role: the daemons present it to "
          "each other and to the store"));
    }
  }
  if (flags.reflection.has_value()) {
    const std::string value = absl::AsciiStrToLower(*flags.reflection);
    if (value != "true" && value != "false") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--reflection must be true or false; got '", *flags.reflection, "'"));
    }
    options.reflection = value == "true";
  }
  for (const std::string& user : flags.local_users) {
    ASSIGN_OR_RETURN(uid_t uid, ResolveUser(user));
    options.local_users.push_back(uid);
  }
  options.tls.cert_file = flags.tls_cert.value_or("");
  options.tls.key_file = flags.tls_key.value_or("");
  options.tls.ca_file = flags.tls_ca.value_or("");

  options.host = flags.host.value_or(
      options.authenticates() || options.insecure ? "0.0.0.0" : "127.0.0.1");
  if (options.host.empty()) {
    return absl::InvalidArgumentError("--host must not be empty");
  }
  options.port = kDefaultBasePort + options.local_rank;
  if (flags.port.has_value()) {
    ASSIGN_OR_RETURN(options.port,
                     ParseInt(Setting{"--port", *flags.port}, 0, kMaxPort));
  }

  if (flags.metrics_port.has_value()) {
    ASSIGN_OR_RETURN(
        options.metrics_port,
        ParseInt(Setting{"--metrics-port", *flags.metrics_port}, 0, kMaxPort));
  }
  options.metrics_host = flags.metrics_host.value_or("127.0.0.1");
  options.metrics_address_file = flags.metrics_address_file.value_or("");
  if (!options.metrics_address_file.empty() && options.metrics_port < 0) {
    return absl::InvalidArgumentError(
        "--metrics-address-file needs --metrics-port");
  }
  if (options.metrics_host.empty()) {
    return absl::InvalidArgumentError("--metrics-host must not be empty");
  }
  // The endpoint authenticates nobody, but shows no tensor names or data:
  // beyond this host it is allowed to a daemon whose data surfaces are
  // authenticated (where --insecure would relax those too), or with
  // --insecure.
  if (!IsLoopbackHost(options.metrics_host) && !options.authenticates() &&
      !options.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-host ", options.metrics_host,
        " listens beyond this host, and this daemon authenticates nobody: "
        "authenticate it (--tls-ca, --auth-token-file), or pass --insecure "
        "on a network only trusted users reach"));
  }

  ASSIGN_OR_RETURN(
      options.timeout,
      ParsePositiveDuration("--timeout", flags.timeout.value_or("60s")));
  ASSIGN_OR_RETURN(options.store_timeout,
                   ParsePositiveDuration("--store-timeout",
                                         flags.store_timeout.value_or("60s")));
  ASSIGN_OR_RETURN(options.shutdown_grace,
                   ParsePositiveDuration("--shutdown-grace",
                                         flags.shutdown_grace.value_or("10s")));
  ASSIGN_OR_RETURN(options.lease, ParsePositiveDuration(
                                      "--lease", flags.lease.value_or("5s")));

  options.log_level = flags.log_level.value_or("info");
  bool known_level = false;
  for (absl::string_view level : kLogLevels) {
    known_level = known_level || options.log_level == level;
  }
  if (!known_level) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-level must be one of ", absl::StrJoin(kLogLevels, ", "),
        "; got '", options.log_level, "'"));
  }
  options.log_format = flags.log_format.value_or("text");
  if (options.log_format != "text" && options.log_format != "json") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-format must be text or json; got '", options.log_format, "'"));
  }
  options.address_file = flags.address_file.value_or("");
  for (const std::string& root : flags.checkpoint_roots) {
    if (root.empty()) {
      return absl::InvalidArgumentError("--checkpoint-root must not be empty");
    }
  }
  options.checkpoint_roots = flags.checkpoint_roots;
  if (flags.tls_refresh.has_value()) {
    ASSIGN_OR_RETURN(
        options.tls.refresh_seconds,
        ParseInt(Setting{"--tls-refresh", *flags.tls_refresh}, 1, 86400));
  }
  RETURN_IF_ERROR(ValidateTlsConfig(options.tls, /*server=*/true));
  if (flags.memory_limit.has_value()) {
    ASSIGN_OR_RETURN(options.memory_limit,
                     ParseByteSize("--memory-limit", *flags.memory_limit));
    if (options.memory_limit <= 0) {
      return absl::InvalidArgumentError("--memory-limit must be positive");
    }
  }

  RETURN_IF_ERROR(ResolveDevice(flags.device.value_or("auto"), env, options));

  if (!options.authenticates() && !options.insecure) {
    std::string beyond;
    if (!IsLoopbackHost(options.host)) {
      beyond =
          absl::StrCat("--host ", options.host, " listens beyond this host");
    } else if (!IsLoopbackHost(options.master_addr)) {
      beyond = absl::StrCat("the master ", options.master_addr,
                            " is not on loopback: a cluster beyond this host");
    }

    if (!beyond.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          beyond,
          " without authentication: anyone who reaches it could read, "
          "change and delete every tensor. Authenticate callers (--tls-ca "
          "for mutual TLS, or --auth-token-file), or pass --insecure on a "
          "network only trusted users reach"));
    }
  }

  // An etcd beyond this host reached without mutual TLS lets whoever
  // reaches it forge the operation log, whatever the daemons ask of their
  // own callers.
  const bool store_mutual_tls = !options.store_tls.ca_file.empty() &&
                                !options.store_tls.cert_file.empty();
  for (const std::string& endpoint : store_endpoints) {
    const std::string host = endpoint.substr(0, endpoint.rfind(':'));
    if (!options.insecure && !store_mutual_tls && !IsLoopbackHost(host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--store: the etcd member ", endpoint,
          " is not on loopback and is reached without mutual TLS: anyone "
          "who reaches it could forge the operation log. Pass "
          "--store-tls-ca, --store-tls-cert and --store-tls-key (etcd with "
          "--client-cert-auth), or --insecure on a network only trusted "
          "users reach"));
    }
  }

  // Last: the only step that may look at the network.
  if (flags.advertise_host.has_value() && !flags.advertise_host->empty()) {
    options.advertise_host = *flags.advertise_host;
  } else if (!IsWildcardHost(options.host)) {
    options.advertise_host = options.host;
  } else if (IsLoopbackHost(options.master_addr)) {
    options.advertise_host = "127.0.0.1";
  } else {
    if (!env.local_address) {
      return absl::UnavailableError(
          "cannot find this host's address; pass --advertise-host");
    }
    ASSIGN_OR_RETURN(options.advertise_host,
                     env.local_address(options.master_addr));
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
  CLI::App app(
      "tessera-server: one Tessera shard-server daemon (one per GPU or CPU "
      "rank).\nServes ShardService, ControlService, grpc.health.v1 and "
      "reflection on --port;\nrank 0 also serves the rendezvous store on "
      "--master-port. SIGTERM/SIGINT drain\nand stop it (a second signal "
      "exits at once). Flags override the environment.",
      "tessera-server");
  app.get_formatter()->column_width(34);
  auto add = [&app](const char* name, std::optional<std::string>& field,
                    const std::string& help) {
    return app.add_option_function<std::string>(
        name, [&field](const std::string& value) { field = value; }, help);
  };
  add("--rank", flags.rank, "global rank [env RANK, SLURM_PROCID]")
      ->type_name("N");
  add("--world-size", flags.world_size,
      "number of daemons [env WORLD_SIZE, SLURM_NTASKS]")
      ->type_name("N");
  add("--local-rank", flags.local_rank,
      "rank on this host [env LOCAL_RANK, SLURM_LOCALID; default 0]")
      ->type_name("N");
  add("--local-world-size", flags.local_world_size,
      "daemons on this host [env LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE; "
      "default unknown]")
      ->type_name("N");
  add("--master-addr", flags.master_addr,
      "host of rank 0's store [env MASTER_ADDR; default 127.0.0.1]")
      ->type_name("HOST");
  add("--master-port", flags.master_port,
      "port of rank 0's store [env MASTER_PORT; default 29500]")
      ->type_name("PORT");
  add("--store", flags.store,
      "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]: keep the store in etcd, so "
      "that any daemon, rank 0 included, may restart [env TESSERA_STORE; "
      "default: rank 0 serves it on --master-addr:--master-port]")
      ->type_name("URL");
  add("--store-tls-ca", flags.store_tls_ca,
      "CA to verify the etcd store's certificate with (TLS to etcd) "
      "[env TESSERA_STORE_TLS_CA]")
      ->type_name("PEM");
  add("--store-tls-cert", flags.store_tls_cert,
      "client certificate presented to etcd [env TESSERA_STORE_TLS_CERT]")
      ->type_name("PEM");
  add("--store-tls-key", flags.store_tls_key,
      "its private key [env TESSERA_STORE_TLS_KEY]")
      ->type_name("PEM");
  add("--host", flags.host,
      "listen host [default 0.0.0.0 with --tls-ca, --auth-token-file or "
      "--insecure, else 127.0.0.1]")
      ->type_name("HOST");
  add("--port", flags.port,
      "gRPC port; 0 picks a free one [default 29600 + local rank]")
      ->type_name("PORT");
  add("--advertise-host", flags.advertise_host,
      "host peers and clients dial [default: --host if specific, 127.0.0.1 "
      "for a loopback master, else this host's address]")
      ->type_name("HOST");
  add("--device", flags.device,
      "auto, cpu, cuda or cuda:N [default auto: cuda:<local rank> when "
      "every local rank has a GPU, else cpu]; ranks sharing a GPU use gloo")
      ->type_name("DEVICE");
  add("--timeout", flags.timeout,
      "rendezvous and collective timeout [default 60s]")
      ->type_name("DURATION");
  add("--store-timeout", flags.store_timeout,
      "how long to wait for the master's store [default 60s]")
      ->type_name("DURATION");
  add("--shutdown-grace", flags.shutdown_grace,
      "how long in-flight fetches may finish after SIGTERM [default 10s]")
      ->type_name("DURATION");
  add("--lease", flags.lease,
      "liveness lease: a daemon silent this long is waited for, and "
      "operations are refused naming it, until it is back [default 5s]")
      ->type_name("DURATION");
  add("--address-file", flags.address_file,
      "write \"host:port\" here once serving")
      ->type_name("FILE");
  add("--log-level", flags.log_level,
      "trace, debug, info, warn or error [default info]")
      ->type_name("LEVEL");
  add("--log-format", flags.log_format,
      "text, or json: one object per line with time, level, rank, "
      "generation, op, tensor, request, peer and message [default text]")
      ->type_name("FORMAT");
  add("--memory-limit", flags.memory_limit,
      "host memory this daemon may hold: shards, staging, gathers (e.g. "
      "8GiB) [default: the cgroup limit, else RAM / local daemons, less a "
      "reserve]")
      ->type_name("SIZE");
  // TLS (wire/credentials.h) and metrics (server/metrics/metrics.h).
  const struct {
    const char* name;
    std::optional<std::string>* field;
    const char* help;
    const char* type;
  } described_flags[] = {
      {"--tls-cert", &flags.tls_cert,
       "PEM certificate chain: serve (and dial peers) over TLS; reloaded "
       "when the file changes",
       "FILE"},
      {"--tls-key", &flags.tls_key, "PEM private key of --tls-cert", "FILE"},
      {"--tls-ca", &flags.tls_ca,
       "PEM CA certificates: require and verify client certificates (mutual "
       "TLS) and verify peers",
       "FILE"},
      {"--tls-refresh", &flags.tls_refresh,
       "seconds between checks of the TLS files for rotated certificates "
       "[default 60]",
       "SECONDS"},
      {"--metrics-port", &flags.metrics_port,
       "serve Prometheus metrics on http://--metrics-host:PORT/metrics; 0 "
       "picks a free one [default: not served]",
       "PORT"},
      {"--metrics-host", &flags.metrics_host,
       "where --metrics-port listens; beyond loopback only for a daemon that "
       "authenticates (--tls-ca, --auth-token-file) or with --insecure: the "
       "endpoint itself authenticates nobody [default 127.0.0.1]",
       "HOST"},
      {"--metrics-address-file", &flags.metrics_address_file,
       "write the metrics endpoint's \"host:port\" here once serving", "FILE"},
  };
  for (const auto& flag : described_flags) {
    add(flag.name, *flag.field, flag.help)->type_name(flag.type);
  }
  add("--auth-token-file", flags.auth_token_file,
      "tokens and roles, '<token> <read|write|admin|cluster> [name]' per "
      "line: every call needs a token of a role that may make it; reloaded "
      "when the file changes")
      ->type_name("FILE");
  app.add_flag("--insecure", flags.insecure,
               "listen beyond loopback (or join a cluster beyond this host) "
               "without authenticating callers");
  add("--reflection", flags.reflection,
      "serve gRPC server reflection [default true]")
      ->type_name("BOOL");
  app.add_option("--local-users", flags.local_users,
                 "a user (name or uid) whose processes may map shards "
                 "through the local path, besides this daemon's user and "
                 "root (repeatable)")
      ->type_name("USER");
  app.add_option("--checkpoint-root", flags.checkpoint_roots,
                 "a directory save and load may use (created if missing; "
                 "repeatable); a checkpoint path is relative to the first or "
                 "an absolute path inside one [default none: save and load "
                 "are refused]")
      ->type_name("DIR");

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
