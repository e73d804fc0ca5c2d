#include "client/cli/op_command.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "nlohmann/json.hpp"
#include "wire/request_id.h"

namespace tessera::cli {
namespace {

constexpr absl::string_view kOpCommand = "op";

// "CreateTensor 'w', log entry 17", or what of it is known.
std::string What(const v1::OperationStatus& status) {
  std::string what = status.method();
  if (!status.tensor().empty()) {
    absl::StrAppend(&what, " '", absl::CEscape(status.tensor()), "'");
  }
  if (status.log_entry() > 0) {
    absl::StrAppend(&what, what.empty() ? "" : ", ", "log entry ",
                    status.log_entry());
  }
  return what;
}

}  // namespace

std::string FormatOperation(const v1::OperationStatus& status) {
  const std::string what = What(status);
  const std::string head = absl::StrCat(
      "request ", status.request_id(), ": ", OperationStateName(status.state()),
      what.empty() ? "" : absl::StrCat(" (", what, ")"));
  switch (status.state()) {
    case v1::OperationStatus::STATE_COMMITTED:
      return absl::StrCat(head,
                          ": it ran on every daemon; a retry with this id "
                          "returns its outcome and applies nothing");
    case v1::OperationStatus::STATE_FAILED:
      return absl::StrCat(
          head, ": ",
          absl::StatusCodeToString(
              static_cast<absl::StatusCode>(status.code())),
          ": ", status.message(),
          "; it changed nothing, and a retry with this id runs it again");
    case v1::OperationStatus::STATE_PENDING:
      return absl::StrCat(head, status.log_entry() > 0
                                    ? ": logged, not finished yet"
                                    : ": waiting on a daemon before the log");
    default:
      return absl::StrCat(
          head,
          ": no daemon remembers it (it never reached the log, or ran before "
          "the daemons started, or too many commits ago to be remembered)");
  }
}

int RunOp(const OpOptions& options, const CommandContext& context) {
  if (!IsValidRequestId(options.request_id)) {
    return context.ReportUserError(
        kOpCommand,
        absl::InvalidArgumentError(absl::StrCat(
            QuotedRequestId(options.request_id), " is not a request id (1 to ",
            kMaxRequestIdBytes, " of A-Z a-z 0-9 . _ : -)")));
  }
  absl::StatusOr<std::shared_ptr<Client>> client =
      ConnectToCluster(options.connection);
  if (!client.ok()) return context.ReportUserError(kOpCommand, client.status());
  absl::StatusOr<v1::OperationStatus> status =
      (*client)->Operation(options.request_id);
  if (!status.ok()) return context.ReportUserError(kOpCommand, status.status());
  if (options.json) {
    nlohmann::ordered_json json = {
        {"request_id", status->request_id()},
        {"state", OperationStateName(status->state())},
        {"method", status->method()},
        {"tensor", status->tensor()},
        {"log_entry", status->log_entry()},
    };
    if (status->state() == v1::OperationStatus::STATE_FAILED) {
      json["code"] = absl::StatusCodeToString(
          static_cast<absl::StatusCode>(status->code()));
      json["message"] = status->message();
    }
    context.out() << json.dump() << "\n";
  } else {
    context.out() << FormatOperation(*status) << "\n";
  }
  context.out().flush();
  if (!context.out().good()) return kExitFailure;
  switch (status->state()) {
    case v1::OperationStatus::STATE_COMMITTED:
      return kExitOk;
    case v1::OperationStatus::STATE_FAILED:
      return kExitOpFailed;
    case v1::OperationStatus::STATE_PENDING:
      return kExitOpPending;
    default:
      return kExitOpUnknown;
  }
}

void AddOpCommand(CLI::App& app, CommandContext& context) {
  CLI::App* op = app.add_subcommand(
      std::string(kOpCommand),
      "What became of the operation that carried a request id: committed, "
      "failed, pending or unknown");
  auto options = std::make_shared<OpOptions>();
  op->add_option("request_id", options->request_id,
                 "The id the call carried (--request-id, or the one an error "
                 "message names)")
      ->required()
      ->type_name("REQUEST_ID");
  op->add_flag("--json", options->json, "Print one JSON object");
  AddConnectionFlags(app, op, &options->connection, /*transfers=*/false);
  op->footer(
      "Examples:\n"
      "  tessera create w 1024 1024 --request-id job7-create-w\n"
      "  tessera op job7-create-w\n\n"
      "Exit status: 0 committed, 3 failed (nothing applied), 4 pending, 5 "
      "unknown, 1 when the cluster cannot be reached, 2 for a usage error.");
  RunWhenParsed(op, context, kOpCommand, options, RunOp);
}

}  // namespace tessera::cli
