// `tessera write NAME -i FILE.npy`: writes a .npy array into a tensor at
// the given offsets; each owner receives only the part its shards hold.
//
//   tessera write w --offsets 0,0 -i patch.npy [--cast] [--no-progress]
//
// The array must have the tensor's number of dimensions and fit inside it
// from --offsets (default: all zeros). Its dtype must be the tensor's,
// unless --cast converts it. Exit codes (command.h): 0 ok; 1 when the file
// cannot be read, the tensor does not exist or a daemon cannot be reached;
// 2 for a usage error, a malformed .npy file, a dtype or rank mismatch or a
// box outside the tensor. A failed write may have written some shards.
#ifndef TESSERA_CLIENT_CLI_WRITE_COMMAND_H_
#define TESSERA_CLIENT_CLI_WRITE_COMMAND_H_

#include <string>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "client/cli/connection.h"

namespace tessera::cli {

struct WriteCommandOptions {
  ConnectionFlags connection;
  std::string name;
  std::string input;
  std::string offsets;  // empty: zeros
  bool offsets_given = false;
  bool cast = false;
};

void AddWriteCommand(CLI::App& app, CommandContext& context);

int RunWrite(const WriteCommandOptions& options, const CommandContext& context);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_WRITE_COMMAND_H_
