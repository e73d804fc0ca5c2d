#include "io/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace tessera {
namespace {

std::vector<char*> ToArgv(std::vector<std::string>& strings) {
  std::vector<char*> argv;
  for (std::string& s : strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  return argv;
}

// The inherited environment without `unset` and the names `set` replaces,
// then `set`.
std::vector<std::string> ChildEnvironment(const SpawnOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    bool keep = true;
    for (const std::string& name : options.unset_env) {
      keep = keep && !absl::StartsWith(*e, absl::StrCat(name, "="));
    }
    for (const auto& [name, value] : options.env) {
      keep = keep && !absl::StartsWith(*e, absl::StrCat(name, "="));
    }
    if (keep) env.push_back(*e);
  }
  for (const auto& [name, value] : options.env) {
    env.push_back(absl::StrCat(name, "=", value));
  }
  return env;
}

}  // namespace

absl::StatusOr<pid_t> SpawnProcess(const SpawnOptions& options) {
  std::vector<std::string> args = {options.program};
  args.insert(args.end(), options.args.begin(), options.args.end());
  std::vector<std::string> env = ChildEnvironment(options);
  std::vector<char*> argv = ToArgv(args);
  std::vector<char*> envp = ToArgv(env);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO,
                                     options.log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  pid_t pid = -1;
  int error = posix_spawn(&pid, options.program.c_str(), &actions, nullptr,
                          argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("posix_spawn of ", options.program,
                                            ": ", strerror(error)));
  }
  return pid;
}

absl::StatusOr<Subprocess> Subprocess::Spawn(SpawnOptions options) {
  absl::StatusOr<pid_t> pid = SpawnProcess(options);
  if (!pid.ok()) return pid.status();
  return Subprocess(std::move(options), *pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : options_(std::move(other.options_)),
      pid_(other.pid_),
      status_(other.status_) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && running()) Kill();
    options_ = std::move(other.options_);
    pid_ = other.pid_;
    status_ = other.status_;
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && running()) Kill();
}

void Subprocess::Signal(int signal) const {
  if (pid_ > 0 && !status_.has_value()) kill(pid_, signal);
}

std::optional<int> Subprocess::WaitFor(absl::Duration timeout) {
  if (status_.has_value() || pid_ <= 0) return status_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) {
      status_ = status;
      return status_;
    }
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

int Subprocess::Kill() {
  if (status_.has_value() || pid_ <= 0) return status_.value_or(0);
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = status;
  return status;
}

std::string Subprocess::LogTail(size_t max_bytes) const {
  return options_.log_path.empty() ? ""
                                   : ReadTail(options_.log_path, max_bytes);
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status));
  }
  return "unknown status";
}

std::string ReadTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

}  // namespace tessera
