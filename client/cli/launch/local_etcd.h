// The store of `tessera launch` by default: one etcd member (Debian's
// etcd-server) that the launcher runs beside its daemons and passes to each
// as --store, so that the operation log, the generations and the workers'
// addresses outlive every daemon, rank 0 included (docs/control_log.md).
//
// Files, in a directory it makes (mode 0700) inside the launch's private
// one, removed with it:
//
//   ca.pem (ca.key)          a throwaway CA of its own (secure_setup.h's
//                            MakeCertificates), never the --secure one
//   server.pem, server.key   etcd's certificate: IP:127.0.0.1, localhost
//   client.pem, client.key   what the daemons present (--store-tls-*)
//   data/                    etcd's data directory
//   etcd.log                 its output, unless options.log_path says where
//
// Security: etcd listens on 127.0.0.1 only, clients and peers over TLS with
// --client-cert-auth and --peer-client-cert-auth against that CA, whose
// key never leaves the private directory. Another user of the host reaches
// the ports but cannot complete a handshake, so cannot read or forge the
// log; etcd's own user authentication stays off (docs/security.md).
//
// Ports: two free loopback ports (client, peer) picked at Start, so that
// launches side by side never collide; when another process takes one
// between the pick and etcd's bind, Start tries again with new ones.
//
// Failures: Start fails with FAILED_PRECONDITION when the certificates
// cannot be made (no openssl), UNAVAILABLE when etcd exits before it
// serves, DEADLINE_EXCEEDED when it does not serve within
// options.start_timeout; both quote the end of its log (and name the file
// when it outlives the launch).
// A member that exits later is seen by Exited(); nothing restarts it.
//
// Lifetime: Stop() (the destructor too) sends SIGTERM, waits a bounded
// time, then SIGKILLs and reaps. The member runs in its own process group
// (a terminal's Ctrl-C reaches only the launcher, which stops it after the
// daemons) and gets SIGTERM if the launcher dies. It waits on its own pid
// only, so it lives beside the launcher's reaping of its daemons.
//
// Thread-compatible. Start makes a gRPC channel (the health check), whose
// threads inherit the caller's signal mask: block the launcher's signals
// first.
#ifndef TESSERA_CLIENT_CLI_LAUNCH_LOCAL_ETCD_H_
#define TESSERA_CLIENT_CLI_LAUNCH_LOCAL_ETCD_H_

#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "io/subprocess.h"

namespace tessera::cli {

struct LocalEtcdOptions {
  std::string etcd;      // the executable (FindEtcdBinary)
  std::string dir;       // made by Start; its parent must exist
  std::string log_path;  // empty: dir/etcd.log
  absl::Duration start_timeout = absl::Seconds(60);
  // The member's signal mask (the launcher's before it blocked its own).
  std::optional<sigset_t> signal_mask;
};

class LocalEtcd {
 public:
  static absl::StatusOr<std::unique_ptr<LocalEtcd>> Start(
      LocalEtcdOptions options);
  ~LocalEtcd();
  LocalEtcd(const LocalEtcd&) = delete;
  LocalEtcd& operator=(const LocalEtcd&) = delete;

  pid_t pid() const { return process_->pid(); }
  // "127.0.0.1:PORT" of its client URL (https).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& log_path() const { return options_.log_path; }
  // "etcd://127.0.0.1:PORT/tessera/".
  std::string StoreUrl() const;
  // What each daemon gets: --store StoreUrl() and --store-tls-ca,
  // --store-tls-cert, --store-tls-key.
  std::vector<std::string> DaemonFlags() const;
  // Its wait status once it exited (reaped here); nullopt while it runs.
  std::optional<int> Exited();
  // The last `max_bytes` of its log.
  std::string LogTail(size_t max_bytes = 2000) const;
  // "its log [PATH] ends:\n<tail>", the path only when it outlives the
  // launch (options.log_path given).
  std::string LogNote() const;
  // SIGTERM, up to `timeout` for it to exit, then SIGKILL; reaps it. True
  // when it exited on SIGTERM (or had already). A no-op after the first.
  bool Stop(absl::Duration timeout);

 private:
  explicit LocalEtcd(LocalEtcdOptions options) : options_(std::move(options)) {}
  // Picks the ports and spawns etcd into process_.
  absl::Status Spawn();
  // Until etcd answers gRPC's health check over mutual TLS.
  absl::Status WaitServing(absl::Time deadline);

  LocalEtcdOptions options_;
  bool log_kept_ = false;
  std::string ca_, server_cert_, server_key_, client_cert_, client_key_;
  std::string endpoint_;
  std::optional<Subprocess> process_;
};

// The etcd executable: the first `etcd` in a directory of `path_env`
// ($PATH), else the first executable of `fallbacks`. NOT_FOUND naming the
// package (etcd-server) otherwise.
absl::StatusOr<std::string> FindEtcdBinary(
    const std::string& path_env,
    const std::vector<std::string>& fallbacks = {"/usr/bin/etcd"});

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_LAUNCH_LOCAL_ETCD_H_
