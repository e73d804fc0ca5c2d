#include "wire/auth.h"

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "io/file.h"
#include "io/socket.h"
#include "wire/credentials.h"
#include "wire/fork_guard.h"
#include "wire/openssl_init.h"
#include "wire/user_token.h"

namespace tessera {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 512;

struct MethodRole {
  const char* method;
  Role role;
};

// Every method of every Tessera service. A method missing here is refused
// (RequiredRole returns nullopt); auth_test checks that the table covers
// each service's descriptor.
constexpr MethodRole kMethodRoles[] = {
    {"tessera.v1.ControlService/GetCluster", Role::kRead},
    {"tessera.v1.ControlService/GetStats", Role::kRead},
    {"tessera.v1.ControlService/GetOperation", Role::kRead},
    {"tessera.v1.ControlService/ListTensors", Role::kRead},
    {"tessera.v1.ControlService/DescribeTensor", Role::kRead},
    {"tessera.v1.ControlService/ReadRegion", Role::kRead},
    {"tessera.v1.ControlService/Gather", Role::kRead},
    {"tessera.v1.ControlService/PinVersions", Role::kRead},
    {"tessera.v1.ControlService/UnpinVersions", Role::kRead},
    // Renewing versions also takes BeginVersion's role (the service
    // checks).
    {"tessera.v1.ControlService/RenewLeases", Role::kRead},
    {"tessera.v1.ControlService/WatchVersions", Role::kRead},
    {"tessera.v1.ControlService/CreateTensor", Role::kWrite},
    {"tessera.v1.ControlService/CreateTensors", Role::kWrite},
    {"tessera.v1.ControlService/WriteRegion", Role::kWrite},
    {"tessera.v1.ControlService/Reshard", Role::kWrite},
    {"tessera.v1.ControlService/DeleteTensor", Role::kWrite},
    {"tessera.v1.ControlService/BeginVersion", Role::kWrite},
    {"tessera.v1.ControlService/PublishVersion", Role::kWrite},
    {"tessera.v1.ControlService/AbortVersion", Role::kWrite},
    {"tessera.v1.ControlService/MarkStale", Role::kWrite},
    {"tessera.v1.ControlService/SaveCheckpoint", Role::kAdmin},
    {"tessera.v1.ControlService/LoadCheckpoint", Role::kAdmin},
    {"tessera.v1.ShardService/FetchShard", Role::kRead},
    {"tessera.v1.ShardService/DescribeTensor", Role::kRead},
    {"tessera.v1.StoreService/Get", Role::kAdmin},
    {"tessera.v1.StoreService/Wait", Role::kAdmin},
    {"tessera.v1.StoreService/Check", Role::kAdmin},
    {"tessera.v1.StoreService/Set", Role::kCluster},
    {"tessera.v1.StoreService/Add", Role::kCluster},
    {"tessera.v1.StoreService/CompareSet", Role::kCluster},
    {"tessera.v1.StoreService/Delete", Role::kCluster},
};

std::array<unsigned char, 32> Digest(absl::string_view token) {
  InitOpenssl();
  std::array<unsigned char, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         digest.data());
  return digest;
}

bool ValidTokenCharacters(absl::string_view token) {
  for (char c : token) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// "ControlService/CreateTensor" for "tessera.v1.ControlService/CreateTensor".
absl::string_view ShortName(absl::string_view method) {
  const size_t slash = method.find('/');
  const size_t dot = method.rfind('.', slash);
  return dot == absl::string_view::npos ? method : method.substr(dot + 1);
}

absl::Mutex token_process_mu(absl::kConstInit);
// Never destroyed: calls may arrive during static destruction.
std::shared_ptr<TokenTable>& ProcessTable() {
  static auto* table = new std::shared_ptr<TokenTable>();
  return *table;
}
// What a refusal for want of a token adds (SetProcessTokenTable).
std::string& MissingTokenHint() {
  static auto* hint = new std::string();
  return *hint;
}
// Whether SetProcessToken chose the token (an empty one included).
bool& ProcessTokenChosen() {
  static bool chosen = false;
  return chosen;
}
std::optional<absl::StatusOr<std::string>>& ProcessTokenSlot() {
  static auto* token = new std::optional<absl::StatusOr<std::string>>();
  return *token;
}

}  // namespace

absl::StatusOr<std::string> ReadClientTokenFile(const std::string& path,
                                                absl::string_view name) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", text.status().message()));
  }
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    return std::string(line.substr(0, line.find_first_of(" \t")));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": ", path, " holds no token"));
}

absl::StatusOr<std::string> TokenFromEnvironment() {
  if (const char* token = std::getenv("TESSERA_TOKEN");
      token != nullptr && *token != '\0') {
    return std::string(absl::StripAsciiWhitespace(token));
  }
  const char* file = std::getenv("TESSERA_TOKEN_FILE");
  if (file == nullptr || *file == '\0') return std::string();
  return ReadClientTokenFile(file, "TESSERA_TOKEN_FILE");
}

namespace {

// Adds the bearer token to every call of a channel.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  explicit TokenInterceptor(std::string header)
      : own_(std::move(header)), header_(&own_) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string own_;
  const std::string* header_;
};

// For a channel made while the process had no token: looks again at each
// call, so that the user's token file made by a daemon after the channel
// is still sent (and nothing is added while there is none).
class LateTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit LateTokenInterceptorFactory(std::string target)
      : target_(std::move(target)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    absl::StatusOr<std::string> token = ProcessTokenFor(target_);
    if (!token.ok() || token->empty()) return nullptr;
    return new TokenInterceptor(absl::StrCat("Bearer ", *token));
  }

 private:
  const std::string target_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // outlives the channel's calls
};

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kRead:
      return "read";
    case Role::kWrite:
      return "write";
    case Role::kAdmin:
      return "admin";
    case Role::kCluster:
      return "cluster";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kRead, Role::kWrite, Role::kAdmin, Role::kCluster}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role '", name, "' (read, write, admin or cluster)"));
}

std::optional<Role> RequiredRole(absl::string_view method) {
  for (const MethodRole& entry : kMethodRoles) {
    if (method == entry.method) return entry.role;
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, Role>> MethodRoles() {
  std::vector<std::pair<std::string, Role>> roles;
  for (const MethodRole& entry : kMethodRoles) {
    roles.emplace_back(entry.method, entry.role);
  }
  return roles;
}

TokenTable::TokenTable(std::string path, absl::Duration refresh)
    : path_(std::move(path)), refresh_(refresh) {}

absl::StatusOr<std::vector<TokenTable::Entry>> TokenTable::Parse(
    absl::string_view text, absl::string_view origin,
    std::string* cluster_token) {
  std::vector<Entry> entries;
  std::string cluster;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto error = [&](absl::string_view why) {
      // Never the token itself: the message may reach a log.
      return absl::InvalidArgumentError(
          absl::StrCat(origin, " line ", number, ": ", why));
    };
    if (fields.size() < 2 || fields.size() > 3) {
      return error("expected '<token> <role> [name]'");
    }
    const absl::string_view token = fields[0];
    if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes ||
        !ValidTokenCharacters(token)) {
      return error(absl::StrCat("a token has ", kMinTokenBytes, " to ",
                                kMaxTokenBytes, " printable characters"));
    }
    absl::StatusOr<Role> role = ParseRole(fields[1]);
    if (!role.ok()) return error(role.status().message());
    Entry entry{Digest(token), *role,
                fields.size() == 3 ? std::string(fields[2])
                                   : absl::StrCat("line ", number)};
    for (const Entry& other : entries) {
      if (other.digest == entry.digest) {
        return error(absl::StrCat("the token of ", other.name, " again"));
      }
    }
    if (*role == Role::kCluster && cluster.empty())
      cluster = std::string(token);
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": no tokens"));
  }
  if (cluster_token != nullptr) *cluster_token = std::move(cluster);
  return entries;
}

absl::Status TokenTable::Load() {
  // Taken first: a change while reading is noticed at the next check.
  const std::string version = FileVersion(path_);
  struct stat info;
  if (stat(path_.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat(path_, ": ", std::strerror(errno)));
  }
  if ((info.st_mode & S_IROTH) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": every user may read it (chmod o-r)"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path_));
  std::string cluster;
  ASSIGN_OR_RETURN(std::vector<Entry> entries, Parse(text, path_, &cluster));
  entries_ = std::move(entries);
  cluster_token_ = std::move(cluster);
  version_ = version;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<TokenTable>> TokenTable::FromFile(
    const std::string& path, absl::Duration refresh) {
  std::shared_ptr<TokenTable> table(new TokenTable(path, refresh));
  absl::MutexLock lock(&table->mu_);
  RETURN_IF_ERROR(table->Load());
  table->checked_ = absl::Now();
  return table;
}

void TokenTable::MaybeReload() {
  const absl::Time now = absl::Now();
  if (now - checked_ < refresh_) return;
  checked_ = now;
  if (FileVersion(path_) == version_) return;
  if (absl::Status loaded = Load(); !loaded.ok()) {
    spdlog::error("auth: keeping the previous tokens: {}",
                  std::string(loaded.message()));
    return;
  }
  spdlog::info("auth: reloaded {} tokens from {}", entries_.size(), path_);
}

std::optional<TokenTable::Entry> TokenTable::Find(absl::string_view token) {
  const std::array<unsigned char, 32> digest = Digest(token);
  absl::MutexLock lock(&mu_);
  MaybeReload();
  std::optional<Entry> found;
  // Every entry is compared, each in constant time.
  for (const Entry& entry : entries_) {
    if (CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0 &&
        !found.has_value()) {
      found = entry;
    }
  }
  return found;
}

std::string TokenTable::cluster_token() {
  absl::MutexLock lock(&mu_);
  return cluster_token_;
}

void SetProcessTokenTable(std::shared_ptr<TokenTable> table,
                          std::string missing_token_hint) {
  absl::MutexLock lock(&token_process_mu);
  ProcessTable() = std::move(table);
  MissingTokenHint() = std::move(missing_token_hint);
}

std::shared_ptr<TokenTable> ProcessTokenTable() {
  absl::MutexLock lock(&token_process_mu);
  return ProcessTable();
}

namespace {

// OK when `token` (nullopt: none) has a role `table` lets call `method`.
absl::Status Authorize(TokenTable& table,
                       std::optional<absl::string_view> token,
                       absl::string_view method) {
  const absl::string_view name = ShortName(method);
  const std::optional<Role> needed = RequiredRole(method);
  if (!needed.has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat(name, ": permission denied: no role may call it"));
  }
  if (!token.has_value()) {
    std::string hint;
    {
      absl::MutexLock lock(&token_process_mu);
      hint = MissingTokenHint();
    }
    return absl::UnauthenticatedError(
        absl::StrCat(name,
                     ": unauthenticated: this cluster requires a token (set "
                     "TESSERA_TOKEN or TESSERA_TOKEN_FILE",
                     hint.empty() ? "" : "; ", hint, ")"));
  }
  const std::optional<TokenTable::Entry> entry = table.Find(*token);
  if (!entry.has_value()) {
    return absl::UnauthenticatedError(
        absl::StrCat(name,
                     ": unauthenticated: the token is not one this "
                     "cluster knows (revoked, or from another cluster)"));
  }
  if (entry->role < *needed) {
    return absl::PermissionDeniedError(absl::StrCat(
        name, ": permission denied: it needs the ", RoleName(*needed),
        " role; the token of ", entry->name, " has ", RoleName(entry->role)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AuthorizeCall(const grpc::ServerContextBase& context,
                           absl::string_view method) {
  const std::shared_ptr<TokenTable> table = ProcessTokenTable();
  if (table == nullptr) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find("authorization");
  if (header == metadata.end()) return Authorize(*table, std::nullopt, method);
  const absl::string_view value(header->second.data(), header->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(value, kBearer)) {
    return absl::UnauthenticatedError(
        absl::StrCat(ShortName(method),
                     ": unauthenticated: the authorization metadata is not "
                     "'Bearer <token>'"));
  }
  return Authorize(*table, value.substr(kBearer.size()), method);
}

absl::Status AuthorizeToken(std::optional<absl::string_view> token,
                            absl::string_view method) {
  const std::shared_ptr<TokenTable> table = ProcessTokenTable();
  if (table == nullptr) return absl::OkStatus();
  return Authorize(*table, token, method);
}

void SetProcessToken(std::string token) {
  absl::MutexLock lock(&token_process_mu);
  ProcessTokenSlot() = std::move(token);
  ProcessTokenChosen() = true;
}

void ClearProcessToken() {
  absl::MutexLock lock(&token_process_mu);
  ProcessTokenSlot().reset();
  ProcessTokenChosen() = false;
}

absl::StatusOr<std::string> ProcessToken() {
  absl::MutexLock lock(&token_process_mu);
  auto& slot = ProcessTokenSlot();
  if (slot.has_value()) return *slot;
  slot = TokenFromEnvironment();
  return *slot;
}

bool IsLoopbackTarget(absl::string_view target) {
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, scheme)) break;
  }
  absl::string_view host = target;
  if (absl::StartsWith(target, "[")) {
    host = target.substr(0, target.find(']') + 1);
  } else if (const size_t colon = target.rfind(':');
             colon != absl::string_view::npos) {
    host = target.substr(0, colon);
  }
  return IsLoopbackHost(host);
}

absl::StatusOr<std::string> ProcessTokenFor(absl::string_view target) {
  ASSIGN_OR_RETURN(std::string token, ProcessToken());
  bool chosen;
  {
    absl::MutexLock lock(&token_process_mu);
    chosen = ProcessTokenChosen();
  }
  if (chosen || !token.empty() || !IsLoopbackTarget(target)) return token;
  return ReadUserToken();
}

std::shared_ptr<grpc::Channel> CreateTesseraChannel(
    const std::string& target, const grpc::ChannelArguments& given) {
  // A daemon that restarts is dialled again within a second, not after
  // gRPC's default backoff (growing to 120 s), during which calls that do
  // not wait for the channel fail at once. The time one attempt may take
  // stays gRPC's (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20 s): a stalled peer
  // costs a call its deadline, not a quick UNAVAILABLE.
  NoteGrpcInUse();
  grpc::ChannelArguments args = given;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Found now (chosen, from the environment, or the user's file): one
  // header for every call, read once.
  absl::StatusOr<std::string> token = ProcessTokenFor(target);
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  // First: in a child forked after this process started gRPC, every call
  // ends there (wire/fork_guard.h).
  interceptors.push_back(ForkGuardInterceptorFactory());
  if (token.ok() && !token->empty()) {
    interceptors.push_back(std::make_unique<TokenInterceptorFactory>(*token));
  } else {
    bool chosen;
    {
      absl::MutexLock lock(&token_process_mu);
      chosen = ProcessTokenChosen();
    }
    // Only the user's file, on loopback, may still appear (a daemon makes
    // it after this channel): looked for at each call until then.
    if (token.ok() && !chosen && IsLoopbackTarget(target)) {
      interceptors.push_back(
          std::make_unique<LateTokenInterceptorFactory>(target));
    }
  }
  return KeptInForkedChildren(
      grpc::experimental::CreateCustomChannelWithInterceptors(
          target, ProcessChannelCredentials(), args, std::move(interceptors)));
}

}  // namespace tessera
