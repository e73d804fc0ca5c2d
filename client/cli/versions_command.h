// `tessera versions NAME` and `tessera watch NAME`: a versioned tensor's
// versions (docs/versions.md).
//
//   tessera versions w           # latest, kept, pinned and open versions
//   tessera versions w --json
//   tessera watch w              # one line per version as it is published
//   tessera watch w --count 3 --idle-timeout 60
//
// `watch` follows a server stream of the connected daemon (reconnected by
// itself); it prints each number on its own line, flushed, and ends after
// --count versions, after --idle-timeout seconds without one, or at Ctrl-C.
// Exit codes (command.h): 0 ok (also when --idle-timeout ends a watch); 1 when
// the tensor does not exist, is deleted while watched, or a daemon cannot
// be reached; 2 for a usage error or an unversioned tensor.
#ifndef TESSERA_CLIENT_CLI_VERSIONS_COMMAND_H_
#define TESSERA_CLIENT_CLI_VERSIONS_COMMAND_H_

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"
#include "client/cli/command.h"
#include "client/cli/connection.h"

namespace tessera::cli {

struct VersionsOptions {
  ConnectionFlags connection;
  std::string name;
  bool json = false;
};

struct WatchOptions {
  ConnectionFlags connection;
  std::string name;
  int64_t count = 0;   // 0: no limit
  int64_t after = 0;   // report versions after this one; 0: from now on
  double timeout = 0;  // seconds without a version; 0: none
};

void AddVersionsCommand(CLI::App& app, CommandContext& context);
void AddWatchCommand(CLI::App& app, CommandContext& context);

int RunVersions(const VersionsOptions& options, const CommandContext& context);
int RunWatch(const WatchOptions& options, const CommandContext& context);

}  // namespace tessera::cli

#endif  // TESSERA_CLIENT_CLI_VERSIONS_COMMAND_H_
