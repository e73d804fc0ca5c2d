// The configuration of a `tessera-server` daemon: its command line, the
// environment variables torchrun and Slurm set, and how the two combine.
//
// Every setting is one row of DaemonSettings() (daemon_options.cc, built on
// common/setting_table.h): its flag, its variables, its default, its
// parsing and validation and its help. `tessera-server --help` prints the
// table. A flag wins over its variables, the first variable set (non-empty)
// over the next, and either over the default; an error names where the bad
// value came from ("--rank", or "RANK" when read from there). The rules
// below that span settings (safe defaults, the etcd store's reach, TLS,
// the advertised host) run after the table, in ResolveDaemonOptions.
//
// Safe defaults: a daemon that does not authenticate its callers (neither
// mutual TLS, --tls-ca, nor tokens, --auth-token-file) listens on
// 127.0.0.1 by default and refuses to listen anywhere else, or to join a
// cluster whose master is not loopback (a cluster beyond this host),
// unless --insecure says so (and it warns at start). An authenticating
// daemon listens on 0.0.0.0 by default.
//
// Authenticated by default: a daemon given none of --auth-token-file,
// --tls-ca and --insecure checks every call against the per-user token
// file (wire/user_token.h, made when absent), which its user's clients
// send on their own; any other local user is refused. It still counts as
// unauthenticated for the rule above (it stays on this host): the token is
// sent in the clear. --insecure is the open mode of old (and warns).
//
// --store etcd://h1:2379,h2:2379/prefix keeps the rendezvous store, the
// operation log and the generations in an etcd cluster
// (server/store/etcd_store.h) instead of in rank 0: any daemon, rank 0
// included, may then die and restart. The master address still picks the
// advertised host's route. --store-tls-ca (TESSERA_STORE_TLS_CA) verifies
// etcd's certificate, --store-tls-cert and --store-tls-key
// (TESSERA_STORE_TLS_CERT, _KEY) are presented to an etcd that requires
// client certificates. Members beyond loopback need mutual TLS (all three)
// or --insecure: otherwise whoever reaches etcd could forge the log.
//
// The host peers and clients dial (--advertise-host) defaults to
// --host when that is a specific address, else 127.0.0.1 when the master is
// loopback, else this host's address on the route to the master.
// --device auto is cuda:<local rank> when NCCL is built in and every local
// rank has a GPU of its own (the local world size, or when unknown this
// local rank, fits the visible devices), else cpu. --device cuda is
// cuda:<local rank % visible devices>. cpu ranks use Gloo; cuda ranks use
// NCCL, except when local ranks outnumber the GPUs: NCCL cannot put two
// ranks of a communicator on one GPU, so then every rank of the host uses
// Gloo with host staging (and says so in its startup line). That needs the
// local world size: a rank that finds itself sharing a GPU without knowing
// it is INVALID_ARGUMENT, since its peers with GPUs of their own would pick
// NCCL and the world could not agree on a backend.
//
// Parsing only reads the environment through DaemonEnvironment, so tests
// supply their own. Thread-compatible; nothing here opens a socket except
// ProcessEnvironment().local_address. Failures are INVALID_ARGUMENT (a bad
// setting, exit 2) or UNAVAILABLE (this host's address, exit 1); nothing
// here exits the process.
#ifndef TESSERA_SERVER_DAEMON_DAEMON_OPTIONS_H_
#define TESSERA_SERVER_DAEMON_DAEMON_OPTIONS_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/device.h"
#include "common/setting_table.h"
#include "io/socket.h"  // IsLoopbackHost
#include "wire/credentials.h"

namespace tessera::daemon {

// Exit codes of `tessera-server`.
inline constexpr int kExitOk = 0;
// Startup failed (busy port, unreachable store, rendezvous timeout...).
inline constexpr int kExitFailure = 1;
// A bad command line or configuration.
inline constexpr int kExitUsage = 2;

inline constexpr int kDefaultMasterPort = 29500;
inline constexpr int kDefaultBasePort = 29600;

// What a daemon runs with. ResolveDaemonOptions sets every field; the
// defaults are DaemonSettings()'s, and a field no setting gives keeps the
// starting value below, which says "none" or "unknown".
struct DaemonOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Daemons on this host; 0 when unknown.
  int local_world_size = 0;
  std::string master_addr;
  int master_port = 0;
  // "etcd://..." (--store): the store lives there; empty: rank 0 serves it
  // on master_addr:master_port.
  std::string store_url;
  // TLS to the etcd store (--store-tls-*); disabled: plain text.
  TlsConfig store_tls;
  // The gRPC server (and data plane) listen on host:port; port 0 picks one.
  std::string host;
  int port = 0;
  // The data plane's port on `host` (--data-port); 0 picks a free one.
  int data_port = 0;
  // The most data-plane connections one large fetch from a peer is
  // striped across (--data-lanes; client/lanes.h); 0: the default.
  int data_lanes = 0;
  // What peers and clients dial; never empty once resolved.
  std::string advertise_host;
  Device device;
  // "gloo" for a cpu device or a GPU shared by several local ranks, "nccl"
  // for a GPU of the rank's own.
  std::string backend = "gloo";
  // Rendezvous and collectives.
  absl::Duration timeout;
  // How long a rank other than 0 waits for the master's store.
  absl::Duration store_timeout;
  // How long in-flight fetches may run on after SIGTERM.
  absl::Duration shutdown_grace;
  // How long a daemon may go without renewing its liveness lease before
  // the others count it missing (ControlOptions::lease).
  absl::Duration lease;
  // Written with "host:port\n" once serving; empty: none.
  std::string address_file;
  // trace, debug, info, warn or error.
  std::string log_level;
  // "text" (one readable line each) or "json" (one object per line:
  // server/daemon/log_format.h).
  std::string log_format;
  // Directories save and load may use (server/checkpoint/checkpoint_roots.h);
  // none: checkpoints are refused.
  std::vector<std::string> checkpoint_roots;
  // Host memory this daemon may hold (server/daemon/memory_budget.h); 0:
  // the default.
  int64_t memory_limit = 0;
  // TLS of every gRPC surface, served and dialled (wire/credentials.h);
  // with TLS on, the raw data plane and the local path are not served
  // (they are not encrypted or authenticated yet), so every shard byte
  // moves over TLS.
  TlsConfig tls;
  // Tokens and roles (wire/auth.h); empty: the per-user token file
  // unless uses_user_token() says otherwise.
  std::string auth_token_file;
  // No authentication at all was asked for: no per-user token, and
  // listening beyond loopback allowed.
  bool insecure = false;
  // Serve gRPC server reflection (it shows the API, never data).
  bool reflection = false;
  // Users besides the daemon's own and root that may use the local path.
  std::vector<uid_t> local_users;
  // Prometheus metrics (server/metrics/metrics.h) on
  // http://metrics_host:metrics_port/metrics; port -1: not served, 0: a
  // free one. The endpoint authenticates nobody (it shows counts, never
  // tensor names or data), so a host beyond loopback needs a daemon that
  // authenticates its other surfaces, or --insecure.
  int metrics_port = -1;
  std::string metrics_host;
  // Written with the endpoint's "host:port\n" once serving; empty: none.
  std::string metrics_address_file;

  // Whether callers must prove who they are: mutual TLS or tokens.
  bool authenticates() const {
    return !tls.ca_file.empty() || !auth_token_file.empty();
  }
  // Whether the per-user token file guards this daemon (no credentials
  // given and no --insecure).
  bool uses_user_token() const {
    return !insecure && tls.ca_file.empty() && auth_token_file.empty();
  }
  // "host:port" of the master's store.
  std::string store_address() const;
};

// The command line as given: a field is set when its flag was (the table's
// Flags: each field is named by one row of DaemonSettings()).
struct DaemonFlags {
  std::optional<std::string> rank, world_size, local_rank, local_world_size,
      master_addr, master_port, store, store_tls_ca, store_tls_cert,
      store_tls_key, host, port, data_port, data_lanes, advertise_host, device,
      timeout, store_timeout, shutdown_grace, lease, address_file, log_level,
      log_format, memory_limit, tls_cert, tls_key, tls_ca, tls_refresh,
      auth_token_file, reflection, metrics_port, metrics_host,
      metrics_address_file;
  bool insecure = false;
  std::vector<std::string> checkpoint_roots;
  std::vector<std::string> local_users;
};

// What resolution needs from the process.
struct DaemonEnvironment {
  // The value of a variable; nullopt when unset.
  std::function<std::optional<std::string>(const std::string&)> getenv;
  // Visible CUDA devices, and whether the NCCL backend is built in.
  int cuda_devices = 0;
  bool nccl = false;
  // This host's address as seen from `master_addr` (a non-loopback master).
  std::function<absl::StatusOr<std::string>(const std::string& master_addr)>
      local_address;
};

// The real process: getenv, CudaDeviceCount(), the registered backends, and
// LocalAddressFor.
DaemonEnvironment ProcessEnvironment();

// tessera-server's settings, one row each, in the order they resolve.
// --device reads `env` (its GPUs and backends), which must outlive the
// table.
using DaemonSettingTable = SettingTable<DaemonFlags, DaemonOptions>;
DaemonSettingTable DaemonSettings(const DaemonEnvironment& env);

// Combines flags, environment and defaults, and validates the result.
// INVALID_ARGUMENT with a one-line message naming the flag or variable: a
// missing rank or world size, a rank outside [0, world size) or a local rank
// outside [0, local world size), a bad number, port, duration, device or log
// level, a shared GPU with an unknown local world size. UNAVAILABLE when the
// advertise host had to be found and could not be.
absl::StatusOr<DaemonOptions> ResolveDaemonOptions(
    const DaemonFlags& flags, const DaemonEnvironment& env);

// Parses `argv` (CLI11) and resolves it. Returns the options, or the exit
// code to leave with: kExitOk after --help (printed to `out`), kExitUsage
// after "tessera-server: error: <message>" on one line to `err`, or
// kExitFailure (also one line) when the advertise host could not be found.
struct ParsedCommandLine {
  std::optional<DaemonOptions> options;
  int exit_code = kExitOk;
};
ParsedCommandLine ParseDaemonCommandLine(int argc, const char* const* argv,
                                         const DaemonEnvironment& env,
                                         std::ostream& out, std::ostream& err);

// Prints "tessera-server: error: <message>" with newlines made spaces.
void PrintDaemonError(std::ostream& err, absl::string_view message);

// The local IPv4 address of the route to `host` (a UDP connect, which
// sends nothing), else the address this host's name resolves to.
// UNAVAILABLE when neither works.
absl::StatusOr<std::string> LocalAddressFor(const std::string& host);

// "60s", "1.5s", "1m30s", "250ms", or a plain number of seconds; must be
// positive. INVALID_ARGUMENT naming `what` otherwise.
absl::StatusOr<absl::Duration> ParsePositiveDuration(absl::string_view what,
                                                     absl::string_view text);

// A duration as people write it: whole seconds as "60s", else
// absl::FormatDuration ("1.5s", "250ms").
std::string DurationText(absl::Duration duration);

}  // namespace tessera::daemon

#endif  // TESSERA_SERVER_DAEMON_DAEMON_OPTIONS_H_
