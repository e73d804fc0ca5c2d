// Child processes: spawn a program with arguments, environment overrides
// and a log file (SpawnProcess: the launcher of `tessera launch` and the
// test harnesses), and, for tests, a Subprocess that signals it, waits for
// it with a bound and never leaves it running (the destructor kills and
// reaps it).
//
// Thread-compatible: one Subprocess is used by one thread at a time.
#ifndef TESSERA_IO_SUBPROCESS_H_
#define TESSERA_IO_SUBPROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

struct SpawnOptions {
  // Path of the executable.
  std::string program;
  // Look a `program` without a slash up in PATH (as a shell would).
  bool search_path = false;
  // argv[1..].
  std::vector<std::string> args;
  // Variables set (or replaced) in the child; the rest is inherited.
  std::vector<std::pair<std::string, std::string>> env;
  // Inherited variables removed from the child's environment.
  std::vector<std::string> unset_env;
  // stdout and stderr go here (truncated, or appended to with
  // append_log); empty: inherited.
  std::string log_path;
  bool append_log = false;
  // stdin reads /dev/null instead of the parent's.
  bool stdin_null = false;
  // The child leads a process group of its own (setpgid), so that a
  // terminal's Ctrl-C reaches only the parent.
  bool new_process_group = false;
  // The child gets SIGTERM when the parent thread that spawned it dies
  // (PR_SET_PDEATHSIG), and exits at once if the parent is already gone.
  bool die_with_parent = false;
  // The child's signal mask; unset: the parent's (the spawning thread's).
  std::optional<sigset_t> signal_mask;
};

// fork and exec of `options`: the child's pid. Everything the child needs
// is made before fork(); between fork and exec the child calls only
// async-signal-safe functions. INTERNAL "cannot write log file <path>: ..."
// when the log cannot be opened, "cannot run <program>: ..." when exec
// fails (the child is reaped then), "cannot start <program>: ..." when
// fork does.
absl::StatusOr<pid_t> SpawnProcess(const SpawnOptions& options);

class Subprocess {
 public:
  static absl::StatusOr<Subprocess> Spawn(SpawnOptions options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running() const { return !status_.has_value(); }
  const std::string& log_path() const { return options_.log_path; }

  // Sends `signal` (no-op once it exited).
  void Signal(int signal) const;
  // Its waitpid status once it exited within `timeout`; nullopt while it
  // still runs.
  std::optional<int> WaitFor(absl::Duration timeout);
  // SIGKILL and reap; returns the wait status.
  int Kill();
  // The last `max_bytes` of its log ("" without one).
  std::string LogTail(size_t max_bytes = 4096) const;

 private:
  Subprocess(SpawnOptions options, pid_t pid)
      : options_(std::move(options)), pid_(pid) {}

  SpawnOptions options_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// "exit code 1", "killed by signal 9".
std::string DescribeWaitStatus(int status);

// The last `max_bytes` of the file at `path` ("" when unreadable).
std::string ReadTail(const std::string& path, size_t max_bytes);

}  // namespace tessera

#endif  // TESSERA_IO_SUBPROCESS_H_
