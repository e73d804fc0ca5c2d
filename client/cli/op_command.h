// `tessera op REQUEST_ID`: what became of the logged call (create, rm,
// reshard, save, load) that carried a request id, so that a caller whose
// call ended without an answer (a deadline, a lost connection) learns
// whether it ran.
//
//   tessera op r-1f2e3d4c5b6a7980 [--json]
//
// Prints one line: committed (it ran on every daemon; a retry with the id
// returns its outcome and applies nothing), failed (it changed nothing; a
// retry with the id runs it again), pending (a daemon still holds or runs
// it) or unknown (no daemon remembers it: not logged, or older than the
// last kRememberedOps commits, server/daemon/op_outcomes.h). Exit codes
// (command.h): 0 committed; 1 when the cluster cannot be reached; 2 for a
// usage error; kExitOpFailed, kExitOpPending and kExitOpUnknown for the
// other answers, so that scripts can wait on a pending one.
#ifndef TESSERA_CLIENT_CLI_OP_COMMAND_H_
#define TESSERA_CLIENT_CLI_OP_COMMAND_H_

#include <string>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "tessera/v1/control.pb.h"

namespace tessera::cli {

inline constexpr int kExitOpFailed = 3;
inline constexpr int kExitOpPending = 4;
inline constexpr int kExitOpUnknown = 5;

struct OpOptions {
  ConnectionFlags connection;
  std::string request_id;
  bool json = false;
};

void AddOpCommand(CLI::App& app, CommandContext& context);

int RunOp(const OpOptions& options, const CommandContext& context);

// The line `tessera op` prints for `status` (no newline).
std::string FormatOperation(const v1::OperationStatus& status);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_OP_COMMAND_H_
