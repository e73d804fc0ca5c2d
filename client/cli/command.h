// What the `tessera` subcommands share: exit codes, the per-invocation
// context, and the driver that builds the CLI11 app from a list of
// registration functions, parses the command line and runs the chosen
// subcommand.
//
// Adding a subcommand: write foo_command.h/.cc exposing
//   void AddFooCommand(CLI::App& app, CommandContext& context);
// which adds the subcommand, binds its flags and, in its CLI11 callback,
// hands the work to context.SetAction(). Then list AddFooCommand in
// tessera_main.cc. Parsing and running are kept apart so that no command
// starts work (or prints) before the whole command line has been checked.
//
// Errors go to `err` as one line, "tessera <command>: error: <message>";
// results go to `out`. Not thread-safe: one context per invocation.
#ifndef TESSERA_CLIENT_CLI_COMMAND_H_
#define TESSERA_CLIENT_CLI_COMMAND_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tessera::cli {

// Exit codes of every subcommand.
inline constexpr int kExitOk = 0;
// The environment failed: an unreadable file, an unreachable server.
inline constexpr int kExitFailure = 1;
// The user's input is wrong: unknown or missing flags, a bad size, spec or
// dtype. --help is not an error (kExitOk).
inline constexpr int kExitUsage = 2;

class CommandContext {
 public:
  CommandContext(std::ostream& out, std::ostream& err) : out_(out), err_(err) {}
  CommandContext(const CommandContext&) = delete;
  CommandContext& operator=(const CommandContext&) = delete;

  std::ostream& out() const { return out_; }
  std::ostream& err() const { return err_; }

  // Called from a subcommand's CLI11 callback: `action` runs once the whole
  // command line parsed, and its result is the exit code. `command` names
  // the subcommand in error messages ("plan").
  void SetAction(std::string command, std::function<int()> action);

  // Runs the action set by the parsed subcommand; kExitUsage when none was.
  int RunAction();

  // Prints "tessera <command>: error: <message>" (or "tessera: error: ..."
  // for an empty command) on one line: newlines in `message` become spaces.
  void PrintError(absl::string_view command, absl::string_view message) const;

  // PrintError(command, status.message()), then the exit code: kExitUsage
  // when the request itself is wrong (INVALID_ARGUMENT, UNIMPLEMENTED,
  // OUT_OF_RANGE), kExitFailure for everything else, the cluster's state
  // included (FAILED_PRECONDITION: a broken group, a starting daemon).
  int ReportUserError(absl::string_view command,
                      const absl::Status& status) const;

 private:
  std::ostream& out_;
  std::ostream& err_;
  std::string command_;
  std::function<int()> action_;
};

// Sets `sub`'s CLI11 callback, the shape of every subcommand: once the
// whole command line parsed, `prepare(*options)` (flags' counts into
// options, say; may be omitted) and then `run(*options, context)` becomes
// the context's action for `command`.
template <typename T>
struct NotDeduced {
  using type = T;
};
template <typename Options, typename Run>
void RunWhenParsed(CLI::App* sub, CommandContext& context,
                   absl::string_view command, std::shared_ptr<Options> options,
                   Run run,
                   typename NotDeduced<std::function<void(Options&)>>::type
                       prepare = nullptr) {
  sub->callback([sub_command = std::string(command), options, &context, run,
                 prepare = std::move(prepare)] {
    if (prepare) prepare(*options);
    context.SetAction(sub_command, [options, &context, run] {
      return run(*options, context);
    });
  });
}

// A flag's check for a number of seconds: finite, in [min, max] and above
// 0 ("nan" and "inf" are refused with the flag's name; CLI11's ranges let
// NaN through).
CLI::Validator Seconds(double min, double max);
// A flag's check for a whole number in [min, max], checked on its text: a
// sign, a fraction or a number its type cannot hold ("99999999999999999999"
// for an int64_t, which CLI11 would take as the type's largest) is refused
// with the flag's name and the range. `max`: the option type's largest,
// at most.
CLI::Validator Whole(uint64_t min, uint64_t max);
// The longest --timeout (and --idle-timeout) taken: about 115 days. Longer
// ones would stand for no deadline at all.
inline constexpr double kMaxTimeoutSeconds = 1e7;

// Registers one subcommand on the `tessera` app.
using AddCommandFn = void (*)(CLI::App& app, CommandContext& context);

// Builds the `tessera` app with `commands`, parses argv, runs the chosen
// subcommand and returns the process exit code: the subcommand's own, 0
// after --help, kExitUsage with a one-line error for a command line CLI11
// rejects. Never throws.
int RunCommandLine(absl::Span<const AddCommandFn> commands, int argc,
                   const char* const* argv, std::ostream& out,
                   std::ostream& err);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_COMMAND_H_
