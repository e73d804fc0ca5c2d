// The `tessera` command-line tool. Each subcommand registers itself through
// its Add*Command function (see client/cli/command.h); list new ones here.
#include <iostream>

#include "client/cli/bench_command.h"
#include "client/cli/command.h"
#include "client/cli/create_command.h"
#include "client/cli/describe_command.h"
#include "client/cli/fetch_command.h"
#include "client/cli/health_command.h"
#include "client/cli/launch/launch_command.h"
#include "client/cli/load_command.h"
#include "client/cli/ls_command.h"
#include "client/cli/op_command.h"
#include "client/cli/plan_command.h"
#include "client/cli/read_command.h"
#include "client/cli/rm_command.h"
#include "client/cli/save_command.h"
#include "client/cli/top_command.h"
#include "client/cli/versions_command.h"
#include "client/cli/write_command.h"
#include "common/mutex_checks.h"
#include "io/heap.h"

namespace {

// In the order `tessera --help` lists them.
constexpr tessera::cli::AddCommandFn kCommands[] = {
    &tessera::cli::AddLaunchCommand,   &tessera::cli::AddHealthCommand,
    &tessera::cli::AddLsCommand,       &tessera::cli::AddDescribeCommand,
    &tessera::cli::AddCreateCommand,   &tessera::cli::AddFetchCommand,
    &tessera::cli::AddReadCommand,     &tessera::cli::AddWriteCommand,
    &tessera::cli::AddRmCommand,       &tessera::cli::AddSaveCommand,
    &tessera::cli::AddLoadCommand,     &tessera::cli::AddPlanCommand,
    &tessera::cli::AddTopCommand,      &tessera::cli::AddOpCommand,
    &tessera::cli::AddVersionsCommand, &tessera::cli::AddWatchCommand,
    &tessera::cli::AddBenchCommand,
};

}  // namespace

int main(int argc, char** argv) {
  tessera::SkipMutexDeadlockChecks();
  // gRPC's receive buffers reused, not faulted in again per message.
  tessera::KeepFreedHeapForReuse();
  return tessera::cli::RunCommandLine(kCommands, argc, argv, std::cout,
                                      std::cerr);
}
