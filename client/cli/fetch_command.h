// `tessera fetch NAME -o FILE.npy`: the whole tensor (each shard straight
// from its owner, in parallel) or one shard, into a .npy file numpy loads.
//
//   tessera fetch w -o w.npy [--shard I] [--cast DTYPE] [--no-progress]
//
// --shard I fetches shard I (the order of `tessera describe`) whole from
// its owner. --cast converts the values first (bfloat16 tensors need it:
// .npy has no bfloat16). The file is written atomically. A progress bar
// shows on stderr for transfers over 4 MiB when it is a terminal. Exit
// codes (command.h): 0 ok; 1 when the tensor does not exist, a daemon
// cannot be reached or the file cannot be written; 2 for a usage error, a
// shard index out of range or a dtype .npy cannot hold.
#ifndef TESSERA_CLIENT_CLI_FETCH_COMMAND_H_
#define TESSERA_CLIENT_CLI_FETCH_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cli/command.h"
#include "client/cli/connection.h"
#include "common/dtype.h"
#include "common/tensor/tensor.h"
#include "io/output_file.h"

namespace tessera::cli {

struct FetchCommandOptions {
  ConnectionFlags connection;
  std::string name;
  std::string output;
  int64_t shard = -1;  // -1: the whole tensor
  std::string cast;
  int64_t version = 0;  // 0: the latest published (or unversioned)    // empty:
                        // keep the tensor's dtype
};

void AddFetchCommand(CLI::App& app, CommandContext& context);

// A --cast flag's dtype is valid (or the flag is empty).
absl::Status CheckCastFlag(const std::string& cast);

int RunFetch(const FetchCommandOptions& options, const CommandContext& context);

// The dtype a fetched `dtype` tensor is saved as: `cast` when given, else
// `dtype`. INVALID_ARGUMENT for an unknown name, or when .npy cannot hold
// the result (bfloat16), suggesting --cast. Shared with `tessera read`.
absl::StatusOr<DType> NpyOutputDType(DType dtype, const std::string& cast);

// Converts `tensor` to `dtype` when it differs, and writes it into `file`
// (client/npy.h: OpenNpyOutput, opened before the transfer).
absl::Status SaveAsNpy(const Tensor& tensor, DType dtype, OutputFile& file);

// Where "wrote ..." goes: stdout after a file, stderr after a device, a
// FIFO or standard output ("-", /dev/stdout), which may be stdout itself.
std::ostream& ReportStream(const OutputFile& file,
                           const CommandContext& context);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_FETCH_COMMAND_H_
