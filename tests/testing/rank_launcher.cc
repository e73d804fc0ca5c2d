#include "tests/testing/rank_launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tessera::testing {
namespace {

absl::StatusOr<pid_t> Spawn(int rank, const LaunchOptions& options,
                            const std::string& log_path) {
  SpawnOptions spawn;
  spawn.program = "/proc/self/exe";
  spawn.args = options.args;
  spawn.env = {{kRankEnv, absl::StrCat(rank)},
               {kWorldSizeEnv, absl::StrCat(options.world_size)},
               {kStoreEnv, options.store_address}};
  spawn.log_path = log_path;
  absl::StatusOr<pid_t> pid = SpawnProcess(spawn);
  if (!pid.ok()) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, ": ", pid.status().message()));
  }
  return pid;
}

void KillAndReap(const std::vector<pid_t>& pids, std::vector<bool>& done,
                 std::vector<RankResult>& results) {
  for (size_t i = 0; i < pids.size(); ++i) {
    if (!done[i]) kill(pids[i], SIGKILL);
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    waitpid(pids[i], &results[i].status, 0);
    done[i] = true;
  }
}

}  // namespace

bool RankResult::ok() const {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string RankResult::Describe() const {
  return absl::StrCat(
      DescribeWaitStatus(status),
      WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? " (timeout)" : "");
}

absl::StatusOr<std::vector<RankResult>> LaunchRanks(
    const LaunchOptions& options) {
  std::vector<RankResult> results(options.world_size);
  std::vector<pid_t> pids;
  std::vector<bool> done;
  for (int r = 0; r < options.world_size; ++r) {
    results[r].rank = r;
    results[r].log_path = absl::StrCat(options.log_prefix, "rank", r, ".log");
    absl::StatusOr<pid_t> pid = Spawn(r, options, results[r].log_path);
    if (!pid.ok()) {
      KillAndReap(pids, done, results);
      return pid.status();
    }
    pids.push_back(*pid);
    done.push_back(false);
  }

  absl::Time kill_at = absl::Now() + options.deadline;
  size_t remaining = pids.size();
  while (remaining > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i] || waitpid(pids[i], &results[i].status, WNOHANG) != pids[i]) {
        continue;
      }
      done[i] = true;
      --remaining;
      if (!results[i].ok()) {
        kill_at = std::min(kill_at, absl::Now() + options.grace_after_failure);
      }
    }
    if (remaining == 0) break;
    if (absl::Now() >= kill_at) {
      KillAndReap(pids, done, results);
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return results;
}

std::optional<int> RankFromEnv() {
  const char* value = std::getenv(kRankEnv);
  int rank = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &rank)) return std::nullopt;
  return rank;
}

int WorldSizeFromEnv() {
  const char* value = std::getenv(kWorldSizeEnv);
  int size = 0;
  return value != nullptr && absl::SimpleAtoi(value, &size) ? size : 0;
}

std::string StoreFromEnv() {
  const char* value = std::getenv(kStoreEnv);
  return value == nullptr ? "" : value;
}

}  // namespace tessera::testing
