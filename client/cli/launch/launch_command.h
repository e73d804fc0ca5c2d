// `tessera launch --nproc N`: starts N tessera-server daemons on this host,
// as torchrun starts ranks, and stays in the foreground supervising them.
//
//   tessera launch --nproc 4 --cpu [flags] [-- extra tessera-server flags]
//
// Every flag is one row of LaunchSettings() (launch_command.cc, built on
// common/setting_table.h) with its default, validation and help;
// `tessera launch --help` prints the table.
//
// Rank i gets RANK=i, WORLD_SIZE=N, LOCAL_RANK=i, MASTER_ADDR, MASTER_PORT
// in its environment and the same as flags, listens on --host at base port
// + i (--base-port 0: any free port), and uses --device cpu with --cpu,
// else --device auto (cuda:i when that GPU exists). tessera-server is
// looked for next to this executable, then in the build tree, then on PATH
// (--server overrides).
//
// The store (--store), so that rank 0 is not special by default:
//   (none)          the launch runs one etcd member of its own
//                   (local_etcd.h: the `etcd` of Debian's etcd-server, on
//                   PATH or /usr/bin; free loopback ports; mutual TLS from
//                   a throwaway CA; data in the launch's private directory)
//                   and gives every daemon --store etcd://127.0.0.1:PORT/
//                   tessera/ with --store-tls-*. Started before the daemons
//                   (30 s to serve, else exit 1 quoting its log), stopped
//                   after them (SIGTERM, --stop-timeout, SIGKILL). When
//                   etcd is not installed: one warning line naming the
//                   package, and the embedded store below.
//   embedded        rank 0 serves the store on the master port; rank 0
//                   then cannot restart.
//   etcd://...      an etcd of yours, passed to every daemon (as is
//                   `-- --store ...`).
//
// Every daemon serves Prometheus metrics on loopback (--metrics-base-port:
// base + i, 0 a free port, -1 none; docs/metrics.md); --metrics-port after
// "--" is refused, as launch gives it. Once every daemon
// serves (its --address-file holds "host:port"), prints
//
//   store: etcd (local member, pid 4240, https://127.0.0.1:40123, mutual TLS)
//   rank 0: 127.0.0.1:29600 (pid 4242, metrics http://127.0.0.1:41807/metrics)
//   ...
//   ready: export TESSERA_ADDRESS=127.0.0.1:29600
//
// and waits. With --secure, the daemons get mutual TLS and tokens from a
// throwaway CA made for this launch (secure_setup.h, in the launch's
// private directory, removed when it stops), and the ready line also
// exports TESSERA_TLS_CA, TESSERA_TLS_CERT, TESSERA_TLS_KEY and
// TESSERA_TOKEN_FILE (an admin token): `eval` it to be a client. Without
// --secure and with a --host beyond loopback, the daemons need --insecure
// after "--" (they refuse to listen unauthenticated otherwise).
//
// SIGINT, SIGTERM or SIGHUP: SIGTERM to every daemon, a bounded
// wait (--stop-timeout), SIGKILL for the rest, then the same for the local
// etcd, exit 0. A daemon that exits on its own after serving is started
// again, up to --max-restarts times per daemon (default 3; "rank 1:
// HOST:PORT (pid P, restarted)" once it serves again; it rejoins the
// running cluster, docs/control_log.md), rank 0 like any other unless it
// serves the store (--store embedded). Otherwise the others are stopped
// the same way and the launcher exits 1 naming the rank and its exit
// status; so it does when the local etcd exits (nothing restarts it). The
// daemons and etcd run in their own process groups (a terminal's Ctrl-C
// reaches only the launcher, which stops them in order) and get SIGTERM if
// the launcher itself dies.
//
// Exit codes (client/cli/command.h): 0 after a requested stop; 1 when
// tessera-server cannot be found or started, the local etcd cannot be
// started or exits, a daemon does not serve within --start-timeout, or one
// exits past --max-restarts; 2 for a usage error.
//
// Not thread-safe: it owns the process's signal mask while it runs.
#ifndef TESSERA_CLIENT_CLI_LAUNCH_LAUNCH_COMMAND_H_
#define TESSERA_CLIENT_CLI_LAUNCH_LAUNCH_COMMAND_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/command.h"
#include "common/setting_table.h"

namespace tessera::cli {

// What a launch runs with. The defaults are LaunchSettings()'s.
struct LaunchOptions {
  // Every setting at its default.
  LaunchOptions();

  int nproc = 0;
  bool cpu = false;
  int master_port = 0;
  int base_port = 0;  // 0: every daemon picks a free port
  // Rank i serves its metrics on this port + i (0: a free port each, -1:
  // none), on loopback.
  int metrics_base_port = 0;
  std::string host;
  std::string log_level;  // empty: the daemons' default
  std::string log_dir;    // empty: daemons share the launcher's stdout/stderr
  std::string server;     // empty: FindServerBinary
  // The daemons' --checkpoint-root; empty: the launcher's working directory
  // (RunLaunch), so `tessera save ckpt` run here saves to ./ckpt.
  std::string checkpoint_root;
  // Make a throwaway CA, certificates and tokens (secure_setup.h) and
  // start the daemons with mutual TLS and tokens.
  bool secure = false;
  double start_timeout_seconds = 0;
  double stop_timeout_seconds = 0;
  // How often each daemon is started again after it exits (rank 0 too,
  // unless it serves the store).
  int max_restarts = 0;
  // Empty: a local etcd member (embedded when etcd is not installed);
  // "embedded": rank 0 serves the store; etcd://...: the daemons' --store.
  std::string store;
  std::vector<std::string> server_flags;  // after "--"
};

// The command line as given: a field is set when its flag was (the table's
// Flags: each field is named by one row of LaunchSettings()).
struct LaunchFlags {
  std::optional<std::string> nproc, master_port, store, base_port,
      metrics_base_port, host, log_level, log_dir, checkpoint_root, server,
      start_timeout, max_restarts, stop_timeout;
  bool cpu = false, secure = false;
  std::vector<std::string> server_flags;
};

// `tessera launch`'s settings, one row each, in the order they resolve and
// show in --help. Built once; thread-safe to read.
using LaunchSettingTable = SettingTable<LaunchFlags, LaunchOptions>;
const LaunchSettingTable& LaunchSettings();

void AddLaunchCommand(CLI::App& app, CommandContext& context);

int RunLaunch(const LaunchOptions& options, const CommandContext& context);

// The flags resolved through LaunchSettings() (from the environment `getenv`
// reads, for a setting with variables) and validated.
absl::StatusOr<LaunchOptions> ResolveLaunchOptions(const LaunchFlags& flags,
                                                   const SettingGetenv& getenv);

// INVALID_ARGUMENT naming the flag for options that cannot work: each
// setting's own check (LaunchSettings(): nproc outside [1, 4096], ports
// outside [1, 65535] (base port 0 is allowed), an empty host, an unknown
// log level...), then those across settings: daemons' ports past 65535 or
// on the master port, metrics ports overlapping them, a --host beyond
// loopback without --secure or "-- --insecure".
absl::Status ValidateLaunchOptions(const LaunchOptions& options);

// tessera-server's path: `server` when given (it must be executable), else
// the first executable of: the directory of `self` (this program), its
// build-tree neighbours (../bin, ../../server/daemon, ../../server), then
// each directory of `path_env` ($PATH). NOT_FOUND saying where it looked.
absl::StatusOr<std::string> FindServerBinary(const std::string& server,
                                             const std::string& self,
                                             const std::string& path_env);

// What rank `rank`'s daemon is started with: its arguments (argv[1..]) and
// the environment variables set for it.
struct DaemonCommand {
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  std::string address_file;
  // Where the daemon writes its metrics endpoint; empty: none.
  std::string metrics_address_file;
};
// `launch_flags` (SecureSetup::DaemonFlags, LocalEtcd::DaemonFlags) come
// before the extra flags.
DaemonCommand BuildDaemonCommand(
    const LaunchOptions& options, int rank, const std::string& address_dir,
    const std::vector<std::string>& launch_flags = {});

// The address rank 0 serves its store on and that peers dial: --host, or
// 127.0.0.1 when --host is a wildcard (0.0.0.0, ::).
std::string MasterAddress(const std::string& host);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_LAUNCH_LAUNCH_COMMAND_H_
