// Tokens and roles: who may call which method of a Tessera gRPC server.
//
// A daemon started with --auth-token-file reads one token per line with
// its role (and an optional name for logs):
//
//   # token                             role     name
//   3f0c...e1 (16 to 512 printable)      read     dashboards
//   9a41...77                            write    trainer
//   c2d8...0b                            admin    ops
//   5be1...9f                            cluster  daemons
//
// Roles are ordered, each holding the rights of those before it:
//   read     GetCluster, GetStats, GetOperation, ListTensors,
//            DescribeTensor, ReadRegion, Gather, PinVersions,
//            UnpinVersions, WatchVersions, RenewLeases of pins,
//            ShardService (FetchShard, DescribeTensor)
//   write    + CreateTensor, WriteRegion, Reshard, DeleteTensor,
//            BeginVersion, PublishVersion, AbortVersion, MarkStale,
//            RenewLeases of open versions
//   admin    + SaveCheckpoint, LoadCheckpoint, reading the store (Get,
//            Wait, Check)
//   cluster  + writing the store (Set, Add, CompareSet, Delete): the
//            operation log. Only daemons hold it: they present the file's
//            first cluster token on every call they make, so no client
//            holding less can forge the log.
// Health and reflection are not covered (they carry no tensor data; the
// daemon's --reflection=false turns reflection off).
//
// A daemon given neither this file, --tls-ca nor --insecure uses the
// per-user token file (wire/user_token.h) the same way.
//
// Clients send `authorization: Bearer <token>` in each call's metadata
// (every channel made by CreateTesseraChannel does so with the process
// token: SetProcessToken (the CLI's --token-file), else TESSERA_TOKEN, else
// the first word of the first line of the file TESSERA_TOKEN_FILE names
// (ReadClientTokenFile); else, to daemons on
// loopback only, the user's token file's first token). A call without a
// token, or with one the daemon does not know, fails UNAUTHENTICATED; one
// whose role is below the method's fails PERMISSION_DENIED. Both messages
// read "<Service>/<Method>: unauthenticated: ..." or "...: permission
// denied: ...", naming the token's name and role, never the token.
//
// Tokens are compared as SHA-256 digests in constant time. The file is
// re-read when it changes (checked at most every `refresh` on a call), so
// tokens are added and revoked without a restart; a file that no longer
// parses keeps the last good table (and logs why). A token file readable
// by every user is refused. Tokens travel in the clear unless TLS is on:
// docs/security.md says when that is acceptable.
//
// Thread-safety: TokenTable and the process-wide settings may be used from
// any thread.
#ifndef TESSERA_WIRE_AUTH_H_
#define TESSERA_WIRE_AUTH_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

enum class Role { kRead = 1, kWrite = 2, kAdmin = 3, kCluster = 4 };

absl::string_view RoleName(Role role);
// INVALID_ARGUMENT for anything but read, write, admin, cluster.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// The role a method needs, by its full name ("tessera.v1.ControlService/
// CreateTensor"); nullopt for methods the table does not know (which are
// refused: fail closed).
std::optional<Role> RequiredRole(absl::string_view method);
// Every method the table knows, for tests and docs.
std::vector<std::pair<std::string, Role>> MethodRoles();

class TokenTable {
 public:
  struct Entry {
    std::array<unsigned char, 32> digest;  // SHA-256 of the token
    Role role;
    std::string name;  // for messages; "line N" when the file gives none
  };

  // Reads `path`: INVALID_ARGUMENT naming the file and line for a
  // malformed line, a short or duplicated token, an unknown role, or a
  // file every user may read; NOT_FOUND etc. when it cannot be read.
  static absl::StatusOr<std::shared_ptr<TokenTable>> FromFile(
      const std::string& path, absl::Duration refresh = absl::Seconds(2));
  // Parses `text` (the file's format); `origin` names it in errors. The
  // first cluster token goes to `cluster_token` when given ("" if none).
  static absl::StatusOr<std::vector<Entry>> Parse(
      absl::string_view text, absl::string_view origin,
      std::string* cluster_token = nullptr);

  // The entry of `token`, if any (constant time in the token).
  std::optional<Entry> Find(absl::string_view token);
  // The first cluster token of the file (what this daemon presents).
  std::string cluster_token();
  const std::string& path() const { return path_; }

 private:
  TokenTable(std::string path, absl::Duration refresh);
  // Re-reads the file when it changed and `refresh` has passed.
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const absl::Duration refresh_;
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::string cluster_token_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
  std::string version_ ABSL_GUARDED_BY(mu_);  // io/file.h FileVersion
};

// The table every Tessera server of this process checks calls against;
// null (the default): no tokens, every call is allowed.
// `missing_token_hint` is added to the refusal of a call with no token
// (how a client of this cluster gets one).
void SetProcessTokenTable(std::shared_ptr<TokenTable> table,
                          std::string missing_token_hint = "");
std::shared_ptr<TokenTable> ProcessTokenTable();

// OK, or the UNAUTHENTICATED / PERMISSION_DENIED status refusing `method`
// (a full name, as RequiredRole) to the call behind `context`.
absl::Status AuthorizeCall(const grpc::ServerContextBase& context,
                           absl::string_view method);
// The same for a caller that presented `token` (nullopt: none) outside
// gRPC (the data plane).
absl::Status AuthorizeToken(std::optional<absl::string_view> token,
                            absl::string_view method);

// The token this process presents: the one set by SetProcessToken, else
// TESSERA_TOKEN, else TESSERA_TOKEN_FILE's (read once). Empty: none.
// INVALID_ARGUMENT when TESSERA_TOKEN_FILE cannot be read or is empty.
void SetProcessToken(std::string token);
// Forgets what SetProcessToken chose (and the environment read so far):
// the environment and the user's token file apply again.
void ClearProcessToken();
absl::StatusOr<std::string> ProcessToken();
// What this process presents to the server at `target` (a gRPC target or
// "host:port"): ProcessToken() when SetProcessToken chose it (even "":
// then none at all) or the environment gave one, else, when the target is
// on loopback, the
// user's token file's (wire/user_token.h; looked for again on each call
// while there is none, since a daemon may make it later). The per-user
// token is never sent beyond this host: daemons that use it stay on
// loopback.
absl::StatusOr<std::string> ProcessTokenFor(absl::string_view target);
// Whether `target` names a loopback host ("127.0.0.1:5", "[::1]:5",
// "dns:///localhost:5").
bool IsLoopbackTarget(absl::string_view target);
// What ProcessToken falls back to, read now.
absl::StatusOr<std::string> TokenFromEnvironment();
// The token a client's token file gives (TESSERA_TOKEN_FILE, the CLI's
// --token-file): the first word of its first line that is neither blank
// nor a comment. INVALID_ARGUMENT starting with `name` (what named the
// file) when it cannot be read or holds no token.
absl::StatusOr<std::string> ReadClientTokenFile(const std::string& path,
                                                absl::string_view name);

// A channel to `target` with the process's TLS credentials
// (wire/credentials.h) that presents the process token on every call. It
// dials a lost peer again after 100 ms, backing off to at most 1 s (gRPC's
// default grows to 120 s, failing calls at once meanwhile); `args` may set
// anything else. In a process forked after this one made a channel, every
// call on any such channel fails FAILED_PRECONDITION at once
// (wire/fork_guard.h).
std::shared_ptr<grpc::Channel> CreateTesseraChannel(
    const std::string& target,
    const grpc::ChannelArguments& args = grpc::ChannelArguments());

}  // namespace tessera

#endif  // TESSERA_WIRE_AUTH_H_
