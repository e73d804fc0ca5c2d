#include "client/cli/connection.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "wire/auth.h"
#include "wire/credentials.h"
#include "wire/request_id.h"

namespace tessera::cli {

void AddConnectionFlags(CLI::App& app, CLI::App* command,
                        ConnectionFlags* flags, bool transfers) {
  const CLI::Option* global = app.get_option_no_throw("--address");
  if (global == nullptr) {
    // Stored by the option itself (read back with as<>()), so it needs no
    // variable that outlives the app.
    global = app.add_option_function<std::string>(
                    "-a,--address", [](const std::string&) {},
                    "Any daemon of the cluster, HOST:PORT (default: "
                    "$TESSERA_ADDRESS, else 127.0.0.1:29600); also accepted "
                    "after the command")
                 ->type_name("HOST:PORT");
  }
  flags->global_address = global;
  command
      ->add_option("-a,--address", flags->address,
                   "Any daemon of the cluster, HOST:PORT (default: "
                   "$TESSERA_ADDRESS, else 127.0.0.1:29600)")
      ->type_name("HOST:PORT");
  command
      ->add_option("--timeout", flags->timeout_seconds,
                   absl::StrCat("Deadline of each call, in seconds (default ",
                                flags->default_timeout, ")"))
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--request-id", flags->request_id,
                   "Id the daemons log with the operations this command "
                   "starts, to find them in every daemon's log (up to 64 of "
                   "A-Z a-z 0-9 . _ : -; default: a random one per call)")
      ->type_name("ID")
      ->check(
          [](const std::string& id) -> std::string {
            if (!IsValidRequestId(id)) {
              return "a request id is 1 to 64 of A-Z a-z 0-9 . _ : -";
            }
            return "";
          },
          "ID");
  if (transfers) {
    command->add_flag("--no-progress", flags->no_progress,
                      "Never draw a progress bar (drawn on stderr for "
                      "transfers over 4 MiB when it is a terminal)");
  }
}

std::string ResolveAddress(const ConnectionFlags& flags) {
  if (!flags.address.empty()) return flags.address;
  if (flags.global_address != nullptr && flags.global_address->count() > 0) {
    return flags.global_address->as<std::string>();
  }
  const char* env = std::getenv(kAddressEnv);
  if (env != nullptr && *env != '\0') return env;
  return kDefaultAddress;
}

absl::Duration Timeout(const ConnectionFlags& flags) {
  return absl::Seconds(flags.timeout_seconds > 0 ? flags.timeout_seconds
                                                 : flags.default_timeout);
}

absl::StatusOr<std::shared_ptr<Client>> ConnectToCluster(
    const ConnectionFlags& flags) {
  const std::string address = ResolveAddress(flags);
  const TlsConfig tls = ProcessTls();
  RETURN_IF_ERROR(ValidateTlsConfig(tls, /*server=*/false, "$TESSERA_TLS_CERT",
                                    "$TESSERA_TLS_KEY", "$TESSERA_TLS_CA"));
  RETURN_IF_ERROR(ProcessToken().status());
  ClientOptions options;
  options.timeout = Timeout(flags);
  options.request_id = flags.request_id;
  absl::StatusOr<std::shared_ptr<Client>> client =
      Client::Connect(address, options);
  if (client.ok()) return client;
  std::string message = absl::StrCat("cannot connect to ", address, ": ",
                                     client.status().message());
  if (absl::IsUnavailable(client.status()) ||
      absl::IsDeadlineExceeded(client.status())) {
    absl::StrAppend(&message,
                    " (is a daemon running there? start some with 'tessera "
                    "launch', or choose one with --address or $",
                    kAddressEnv,
                    tls.enabled()
                        ? "; check that $TESSERA_TLS_CA signed the daemon's "
                          "certificate and the daemon's CA yours"
                        : "; a daemon started with --tls-cert needs "
                          "$TESSERA_TLS_CA (and $TESSERA_TLS_CERT, "
                          "$TESSERA_TLS_KEY for mutual TLS)",
                    ")");
  }
  if (absl::IsUnauthenticated(client.status()) &&
      absl::StrContains(client.status().message(), "not one this cluster") &&
      ProcessToken().ok() && ProcessToken()->empty()) {
    absl::StrAppend(&message,
                    " (with neither $TESSERA_TOKEN nor $TESSERA_TOKEN_FILE "
                    "set, the client sent this user's token from ~/.tessera/"
                    "token: set one of them to this cluster's token)");
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
