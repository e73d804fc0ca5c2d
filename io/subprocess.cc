#include "io/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "io/errno.h"
#include "io/unique_fd.h"

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

  UniqueFd null_fd;
  if (options.stdin_null)
    null_fd.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  UniqueFd log_fd;
  if (!options.log_path.empty()) {
    log_fd.reset(::open(options.log_path.c_str(),
                        O_WRONLY | O_CREAT | O_CLOEXEC |
                            (options.append_log ? O_APPEND : O_TRUNC),
                        0644));
    if (!log_fd.valid()) {
      return ErrnoError(
          errno, absl::StrCat("cannot write log file ", options.log_path),
          absl::StatusCode::kInternal);
    }
  }
  // exec failures come back through this pipe (closed by a successful
  // exec).
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return ErrnoError(errno, "cannot create a pipe",
                      absl::StatusCode::kInternal);
  }
  UniqueFd exec_read(pipe_fds[0]);
  UniqueFd exec_write(pipe_fds[1]);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (options.new_process_group) ::setpgid(0, 0);
    if (options.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(1);  // the parent is already gone
    }
    if (null_fd.valid()) ::dup2(null_fd.get(), STDIN_FILENO);
    if (log_fd.valid()) {
      ::dup2(log_fd.get(), STDOUT_FILENO);
      ::dup2(log_fd.get(), STDERR_FILENO);
    }
    if (options.signal_mask.has_value()) {
      ::sigprocmask(SIG_SETMASK, &*options.signal_mask, nullptr);
    }
    if (options.search_path) {
      ::execvpe(argv[0], argv.data(), envp.data());
    } else {
      ::execve(argv[0], argv.data(), envp.data());
    }
    const int error = errno;
    ssize_t ignored = ::write(exec_write.get(), &error, sizeof(error));
    (void)ignored;
    ::_exit(127);
  }
  const int fork_error = errno;
  exec_write.reset();
  if (pid < 0) {
    return ErrnoError(fork_error,
                      absl::StrCat("cannot start ", options.program),
                      absl::StatusCode::kInternal);
  }
  int exec_error = 0;
  ssize_t n = 0;
  do {
    n = ::read(exec_read.get(), &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(exec_error))) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return ErrnoError(exec_error, absl::StrCat("cannot run ", options.program),
                      absl::StatusCode::kInternal);
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
