#include "client/cli/connection.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/command.h"
#include "common/status_macros.h"
#include "wire/auth.h"
#include "wire/credentials.h"
#include "wire/request_id.h"

namespace tessera::cli {
namespace {

constexpr char kAddressHelp[] =
    "Any daemon of the cluster, HOST:PORT (default: $TESSERA_ADDRESS, else "
    "127.0.0.1:29600)";
constexpr char kTlsCaHelp[] =
    "PEM root certificates that verify the daemons, which then speak TLS "
    "(default: $TESSERA_TLS_CA; none: plaintext)";
constexpr char kTlsCertHelp[] =
    "PEM certificate this client presents to daemons that require mutual "
    "TLS, with --tls-key (default: $TESSERA_TLS_CERT)";
constexpr char kTlsKeyHelp[] =
    "PEM private key of --tls-cert (default: $TESSERA_TLS_KEY)";
constexpr char kTokenFileHelp[] =
    "File whose token (the first word of its first line that is not a "
    "comment) every call presents (default: $TESSERA_TOKEN, else "
    "$TESSERA_TOKEN_FILE, else the user's ~/.tessera/token to daemons on "
    "this host)";

// The root app's copy of a flag that is also accepted before the command,
// added by the first command that asks. Stored by the option itself (read
// back with as<>()), so it needs no variable that outlives the app.
const CLI::Option* GlobalOption(CLI::App& app, const std::string& names,
                                absl::string_view help,
                                const std::string& type) {
  const std::string name = names.substr(names.rfind(',') + 1);
  if (const CLI::Option* found = app.get_option_no_throw(name)) return found;
  return app
      .add_option_function<std::string>(
          names, [](const std::string&) {},
          absl::StrCat(help, "; also accepted after the command"))
      ->type_name(type);
}

// A flag's value: the command's own, else the one given before the
// command, else "".
std::string FlagValue(const std::string& own, const CLI::Option* global) {
  if (!own.empty()) return own;
  if (global != nullptr && global->count() > 0) {
    return global->as<std::string>();
  }
  return "";
}

}  // namespace

void AddConnectionFlags(CLI::App& app, CLI::App* command,
                        ConnectionFlags* flags, bool transfers) {
  flags->global_address =
      GlobalOption(app, "-a,--address", kAddressHelp, "HOST:PORT");
  flags->global_tls_ca = GlobalOption(app, "--tls-ca", kTlsCaHelp, "FILE");
  flags->global_tls_cert =
      GlobalOption(app, "--tls-cert", kTlsCertHelp, "FILE");
  flags->global_tls_key = GlobalOption(app, "--tls-key", kTlsKeyHelp, "FILE");
  flags->global_token_file =
      GlobalOption(app, "--token-file", kTokenFileHelp, "FILE");
  command->add_option("-a,--address", flags->address, kAddressHelp)
      ->type_name("HOST:PORT");
  command
      ->add_option("--timeout", flags->timeout_seconds,
                   absl::StrCat("Deadline of each call, in seconds (default ",
                                flags->default_timeout, ")"))
      ->type_name("SECONDS")
      ->check(Seconds(0, kMaxTimeoutSeconds));
  command
      ->add_option("--request-id", flags->request_id,
                   "Id of the operations this command starts: the daemons "
                   "log it, and running the command again with the same id "
                   "applies none of them twice (later operations of one "
                   "command get ID.2, ID.3, ...; `tessera op ID` tells what "
                   "became of one; up to 64 of A-Z a-z 0-9 . _ : -; default: "
                   "a random one per call)")
      ->type_name("ID")
      ->check(
          [](const std::string& id) -> std::string {
            if (!IsValidRequestId(id) || id.size() > kMaxClientRequestIdBytes) {
              return "a request id is 1 to 64 of A-Z a-z 0-9 . _ : -";
            }
            return "";
          },
          "");
  command->add_option("--tls-ca", flags->tls_ca, kTlsCaHelp)->type_name("FILE");
  command->add_option("--tls-cert", flags->tls_cert, kTlsCertHelp)
      ->type_name("FILE");
  command->add_option("--tls-key", flags->tls_key, kTlsKeyHelp)
      ->type_name("FILE");
  command->add_option("--token-file", flags->token_file, kTokenFileHelp)
      ->type_name("FILE");
  if (transfers) {
    command->add_flag("--no-progress", flags->no_progress,
                      "Never draw a progress bar (drawn on stderr for "
                      "transfers over 4 MiB when it is a terminal)");
  }
}

std::string ResolveAddress(const ConnectionFlags& flags) {
  std::string given = FlagValue(flags.address, flags.global_address);
  if (!given.empty()) return given;
  const char* env = std::getenv(kAddressEnv);
  if (env != nullptr && *env != '\0') return env;
  return kDefaultAddress;
}

absl::Duration Timeout(const ConnectionFlags& flags) {
  return absl::Seconds(flags.timeout_seconds > 0 ? flags.timeout_seconds
                                                 : flags.default_timeout);
}

namespace {

// One TLS file: its flag's value, else its variable's, and the name that
// messages give it.
struct TlsSource {
  std::string file;
  std::string name;
};

TlsSource ResolveTlsFile(const std::string& flag_value, absl::string_view flag,
                         const char* variable) {
  if (!flag_value.empty()) return {flag_value, std::string(flag)};
  const char* env = std::getenv(variable);
  if (env != nullptr && *env != '\0') return {env, absl::StrCat("$", variable)};
  // Neither: a message about it names both ways to give it.
  return {"", absl::StrCat(flag, " or $", variable)};
}

}  // namespace

absl::StatusOr<ClientCredentials> ResolveCredentials(
    const ConnectionFlags& flags) {
  const TlsSource ca = ResolveTlsFile(
      FlagValue(flags.tls_ca, flags.global_tls_ca), "--tls-ca", kTlsCaEnv);
  const TlsSource cert =
      ResolveTlsFile(FlagValue(flags.tls_cert, flags.global_tls_cert),
                     "--tls-cert", kTlsCertEnv);
  const TlsSource key = ResolveTlsFile(
      FlagValue(flags.tls_key, flags.global_tls_key), "--tls-key", kTlsKeyEnv);
  ClientCredentials credentials;
  credentials.tls.ca_file = ca.file;
  credentials.tls.cert_file = cert.file;
  credentials.tls.key_file = key.file;
  RETURN_IF_ERROR(ValidateTlsConfig(credentials.tls, /*server=*/false,
                                    cert.name, key.name, ca.name));
  const std::string token_file =
      FlagValue(flags.token_file, flags.global_token_file);
  if (!token_file.empty()) {
    ASSIGN_OR_RETURN(credentials.token,
                     ReadClientTokenFile(token_file, "--token-file"));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<Client>> ConnectToCluster(
    const ConnectionFlags& flags, ClientOptions options) {
  const std::string address = ResolveAddress(flags);
  ASSIGN_OR_RETURN(ClientCredentials credentials, ResolveCredentials(flags));
  const bool tls = credentials.tls.enabled();
  SetProcessTls(std::move(credentials.tls));
  if (credentials.token.has_value()) {
    SetProcessToken(*std::move(credentials.token));
  }
  RETURN_IF_ERROR(ProcessToken().status());
  options.timeout = Timeout(flags);
  options.request_id = flags.request_id;
  absl::StatusOr<std::shared_ptr<Client>> client =
      Client::Connect(address, options);
  if (client.ok()) return client;
  std::string message = absl::StrCat("cannot connect to ", address, ": ",
                                     client.status().message());
  if (absl::IsUnavailable(client.status()) ||
      absl::IsDeadlineExceeded(client.status())) {
    absl::StrAppend(
        &message,
        " (is a daemon running there? start some with 'tessera "
        "launch', or choose one with --address or $",
        kAddressEnv,
        tls ? "; check that the CA given by --tls-ca or $TESSERA_TLS_CA "
              "signed the daemon's certificate and the daemon's CA yours"
            : "; a daemon serving TLS needs --tls-ca or $TESSERA_TLS_CA "
              "here (and --tls-cert and --tls-key, or $TESSERA_TLS_CERT and "
              "$TESSERA_TLS_KEY, for mutual TLS)",
        ")");
  }
  if (absl::IsUnauthenticated(client.status()) &&
      FlagValue(flags.token_file, flags.global_token_file).empty()) {
    if (absl::StrContains(client.status().message(), "not one this cluster") &&
        ProcessToken().ok() && ProcessToken()->empty()) {
      absl::StrAppend(&message,
                      " (with neither --token-file, $TESSERA_TOKEN nor "
                      "$TESSERA_TOKEN_FILE given, the client sent this user's "
                      "token from ~/.tessera/token: give this cluster's token "
                      "with --token-file or one of them)");
    } else if (absl::StrContains(client.status().message(),
                                 "requires a token")) {
      absl::StrAppend(&message, " (or give one with --token-file)");
    }
  }
  return absl::Status(client.status().code(), message);
}

bool ProgressWanted(const ConnectionFlags& flags, const std::ostream& err) {
  return !flags.no_progress && &err == &std::cerr && ::isatty(STDERR_FILENO);
}

TransferOptions MakeTransferOptions(const ConnectionFlags& flags,
                                    ProgressBar* bar) {
  TransferOptions options;
  // Transfers of big tensors take longer than control calls: 300 s unless
  // --timeout says otherwise.
  options.timeout = flags.timeout_seconds > 0
                        ? absl::Seconds(flags.timeout_seconds)
                        : std::max(absl::Seconds(300), Timeout(flags));
  if (bar != nullptr && bar->enabled()) options.progress = bar->Callback();
  return options;
}

absl::StatusOr<std::vector<std::string>> ParseNameList(absl::string_view text,
                                                       absl::string_view flag) {
  std::vector<std::string> names = absl::StrSplit(text, ',');
  for (const std::string& name : names) {
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid ", flag, " '", text,
                       "': expected names separated by commas (e.g. a,b)"));
    }
  }
  return names;
}

absl::StatusOr<ShardedTensorView> OpenTensor(const ConnectionFlags& flags,
                                             const std::string& name) {
  absl::StatusOr<std::shared_ptr<Client>> client = ConnectToCluster(flags);
  if (!client.ok()) return client.status();
  return (*client)->Open(name);
}

}  // namespace tessera::cli
