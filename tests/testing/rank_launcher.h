// Launches W copies of the current executable as rank processes and waits
// for them: the process side of the multi-process tests and benchmarks.
//
// Each child gets TESSERA_RANK, TESSERA_WORLD_SIZE and TESSERA_STORE (the
// address of a store every rank can reach) in its environment, its stdout
// and stderr in a log file, and the given arguments. The launcher never
// hangs: once one rank fails, the others get a grace period (they may be
// blocked in a collective with it); at the deadline every rank left is
// killed.
//
// Thread-compatible: one launch per call.
#ifndef TESSERA_TESTS_TESTING_RANK_LAUNCHER_H_
#define TESSERA_TESTS_TESTING_RANK_LAUNCHER_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "io/subprocess.h"

namespace tessera::testing {

inline constexpr char kRankEnv[] = "TESSERA_RANK";
inline constexpr char kWorldSizeEnv[] = "TESSERA_WORLD_SIZE";
inline constexpr char kStoreEnv[] = "TESSERA_STORE";

struct LaunchOptions {
  int world_size = 4;
  // argv[1..] of every child.
  std::vector<std::string> args;
  std::string store_address;
  // Log files are <log_prefix>rank<r>.log.
  std::string log_prefix;
  absl::Duration deadline = absl::Seconds(120);
  absl::Duration grace_after_failure = absl::Seconds(10);
};

struct RankResult {
  int rank = 0;
  // waitpid status.
  int status = 0;
  std::string log_path;

  bool ok() const;
  // "exit code 1", "killed by signal 9 (timeout)".
  std::string Describe() const;
};

// Starts the ranks and waits for all of them. An error means some rank
// could not be started (those started are killed and reaped).
absl::StatusOr<std::vector<RankResult>> LaunchRanks(
    const LaunchOptions& options);

// In a child: its rank, world size and store address from the environment.
std::optional<int> RankFromEnv();
int WorldSizeFromEnv();
std::string StoreFromEnv();

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_RANK_LAUNCHER_H_
