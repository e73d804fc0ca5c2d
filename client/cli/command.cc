#include "client/cli/command.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "wire/grpc_status.h"

namespace tessera::cli {

void CommandContext::SetAction(std::string command,
                               std::function<int()> action) {
  command_ = std::move(command);
  action_ = std::move(action);
}

int CommandContext::RunAction() {
  if (!action_) {
    PrintError("", "no command given; run 'tessera --help' for the commands");
    return kExitUsage;
  }
  return action_();
}

void CommandContext::PrintError(absl::string_view command,
                                absl::string_view message) const {
  // At most 2 KiB, as a daemon's error reaches a client: a flag or file of
  // megabytes quoted by a parser must not print an error of megabytes.
  const std::string one_line = absl::StrReplaceAll(
      CapGrpcMessage(message), {{"\r\n", " "}, {"\n", " "}, {"\r", " "}});
  err_ << "tessera" << (command.empty() ? "" : " ") << command
       << ": error: " << one_line << std::endl;
}

int CommandContext::ReportUserError(absl::string_view command,
                                    const absl::Status& status) const {
  PrintError(command, status.message());
  // What the request asked for is wrong: a usage error. The state of the
  // cluster (FAILED_PRECONDITION: a broken group, a daemon still starting,
  // a tensor changed meanwhile) is a failed operation, like any other.
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

int RunCommandLine(absl::Span<const AddCommandFn> commands, int argc,
                   const char* const* argv, std::ostream& out,
                   std::ostream& err) {
  CommandContext context(out, err);
  try {
    CLI::App app(
        "Tessera: sharded tensors served per rank.\n"
        "Run 'tessera <command> --help' for a command's flags and examples.",
        "tessera");
    app.require_subcommand(1);
    for (AddCommandFn add_command : commands) add_command(app, context);
    try {
      app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help
      return app.exit(e, out, err) == 0 ? kExitOk : kExitUsage;
    } catch (const CLI::ParseError& e) {
      // The subcommand being parsed, if any, names the error.
      std::string command;
      std::vector<CLI::App*> parsed = app.get_subcommands();
      if (!parsed.empty()) command = parsed.front()->get_name();
      std::string message = e.what();
      // A misspelt command reaches CLI11 as a stray positional argument and
      // is reported as "A subcommand is required"; name it instead.
      const std::vector<std::string> remaining = app.remaining();
      if (parsed.empty() && !remaining.empty()) {
        const std::string& first = remaining.front();
        message =
            absl::StrCat(first.empty() || first[0] != '-' ? "unknown command '"
                                                          : "unknown option '",
                         first, "'");
      }
      context.PrintError(command, absl::StrCat(message, "; run 'tessera",
                                               command.empty() ? "" : " ",
                                               command, " --help' for usage"));
      return kExitUsage;
    }
    return context.RunAction();
  } catch (const std::exception& e) {
    // A bug (a CLI11 construction error, bad_alloc): still one line, no
    // abort.
    context.PrintError("", absl::StrCat("internal error: ", e.what()));
    return kExitFailure;
  }
}

CLI::Validator Whole(uint64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        uint64_t value = 0;
        if (absl::SimpleAtoi(text, &value) && value >= min && value <= max) {
          return std::string();
        }
        return absl::StrCat("must be a whole number from ", min, " to ", max,
                            ", not ", text);
      },
      "");
}

CLI::Validator Seconds(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double value = 0;
        if (absl::SimpleAtod(text, &value) && std::isfinite(value) &&
            value > 0 && value >= min && value <= max) {
          return std::string();
        }
        // 1e7 as 10000000, not 1e+07.
        const auto number = [](double x) {
          return x == std::floor(x) && x < 1e15
                     ? absl::StrCat(static_cast<int64_t>(x))
                     : absl::StrCat(x);
        };
        if (min > 0) {
          return absl::StrCat("must be a number of seconds from ", number(min),
                              " to ", number(max), ", not ", text);
        }
        return absl::StrCat("must be a number of seconds above 0 and at most ",
                            number(max), ", not ", text);
      },
      // No description: help shows the option's own type name alone
      // ("--timeout SECONDS", not "SECONDS:SECONDS").
      "");
}

}  // namespace tessera::cli
