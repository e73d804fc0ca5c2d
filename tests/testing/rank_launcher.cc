#include "tests/testing/rank_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace tessera::testing {
namespace {

std::vector<char*> ToArgv(std::vector<std::string>& strings) {
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  return argv;
}

absl::StatusOr<pid_t> Spawn(int rank, const LaunchOptions& options,
                            const std::string& log_path) {
  std::vector<std::string> args = {"/proc/self/exe"};
  args.insert(args.end(), options.args.begin(), options.args.end());
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "TESSERA_RANK=") &&
        !absl::StartsWith(*e, "TESSERA_WORLD_SIZE=") &&
        !absl::StartsWith(*e, "TESSERA_STORE=")) {
      env.push_back(*e);
    }
  }
  env.push_back(absl::StrCat(kRankEnv, "=", rank));
  env.push_back(absl::StrCat(kWorldSizeEnv, "=", options.world_size));
  env.push_back(absl::StrCat(kStoreEnv, "=", options.store_address));
  std::vector<char*> argv = ToArgv(args);
  std::vector<char*> envp = ToArgv(env);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  int error = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr,
                          argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawn of rank ", rank, ": ", strerror(error)));
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
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status),
                        WTERMSIG(status) == SIGKILL ? " (timeout)" : "");
  }
  return "unknown status";
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

std::string ReadTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

}  // namespace tessera::testing
