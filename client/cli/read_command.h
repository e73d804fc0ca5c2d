// `tessera read NAME --offsets O --sizes S`: a box of a tensor, assembled
// from the shards that overlap it (each owner sends only its part), printed
// as nested rows or written to a .npy file.
//
//   tessera read w --offsets 2,5 --sizes 6,10             # prints values
//   tessera read w --offsets 0,0 --sizes 1000,4096 -o box.npy
//
// Printing is for small boxes (at most kMaxPrintedElements elements); use
// -o for more. --cast converts the values first. Exit codes (command.h): 0
// ok; 1 when the tensor does not exist, a daemon cannot be reached or the
// file cannot be written; 2 for a usage error or a box outside the tensor.
#ifndef TESSERA_CLIENT_CLI_READ_COMMAND_H_
#define TESSERA_CLIENT_CLI_READ_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "common/tensor/tensor.h"

namespace tessera::cli {

inline constexpr int64_t kMaxPrintedElements = 10000;

struct ReadCommandOptions {
  ConnectionFlags connection;
  std::string name;
  std::string offsets;
  std::string sizes;
  std::string output;  // empty: print
  std::string cast;
  int64_t version = 0;  // 0: the latest published (or unversioned)
};

void AddReadCommand(CLI::App& app, CommandContext& context);

int RunRead(const ReadCommandOptions& options, const CommandContext& context);

// Parses a comma-separated list of non-negative integers given to `flag`
// ("--offsets"), or "" (no dimensions: a 0-d tensor); INVALID_ARGUMENT
// naming the flag otherwise. Shared with `tessera write`.
absl::StatusOr<std::vector<int64_t>> ParseIndexList(absl::string_view text,
                                                    absl::string_view flag);

// The values of a CPU tensor as numpy prints them: nested brackets, one
// row per line, columns right-aligned; "True"/"False" for bools and
// "1+2j" for complex numbers. Ends in '\n'.
std::string FormatTensorValues(const Tensor& tensor);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_READ_COMMAND_H_
