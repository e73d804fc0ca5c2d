// The `tessera` command-line tool. Each subcommand registers itself through
// its Add*Command function (see client/cli/command.h); list new ones here.
#include <iostream>

#include "client/cli/command.h"
#include "client/cli/plan_command.h"

namespace {

constexpr tessera::cli::AddCommandFn kCommands[] = {
    &tessera::cli::AddPlanCommand,
};

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::RunCommandLine(kCommands, argc, argv, std::cout,
                                      std::cerr);
}
