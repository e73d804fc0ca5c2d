// Runs a test's check in a forked child: RunInChild(body, patience) forks,
// the child exits with body()'s return value (0: passed) and the parent
// waits up to `patience` for it. A child still running then is killed and
// reaped, and the result says it hung.
//
// Under AddressSanitizer a child that hung or failed is forked again, up
// to three times in all: clang 14's ASan takes none of its allocator locks
// around fork() (LLVM added them in release 18), so a child forked while
// another thread of the parent held one (a gRPC poller, a cached thread
// exiting) waits on it for ever. Anywhere else the first child's result
// stands, so a real hang or failure fails the test at once.
//
// Call from the test's main thread; body runs only in the child, which
// never returns into the test (it ends with _exit). Header-only.
#ifndef TESSERA_TESTS_TESTING_FORKED_CHILD_H_
#define TESSERA_TESTS_TESTING_FORKED_CHILD_H_

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/sanitizers.h"

namespace tessera::testing {

struct ChildResult {
  static constexpr int kWaitFailed = -1;  // wait_status when waitpid failed

  bool forked = false;  // false: fork() itself failed
  bool hung = false;    // killed after `patience`
  int wait_status = 0;  // waitpid's status when it ended, or kWaitFailed
  int forks = 0;        // children forked, retries included

  // Exited with 0.
  bool passed() const {
    return forked && !hung && wait_status != kWaitFailed &&
           WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
  }
  // How the last child ended, for a failure message.
  std::string Describe() const {
    if (!forked) return "fork() failed";
    const std::string tries = absl::StrCat(" (", forks, " fork(s))");
    if (hung) return "the child hung" + tries;
    if (wait_status == kWaitFailed) return "waitpid() failed" + tries;
    if (WIFSIGNALED(wait_status)) {
      return absl::StrCat("the child ended by signal ", WTERMSIG(wait_status),
                          tries);
    }
    return absl::StrCat("the child exited with ", WEXITSTATUS(wait_status),
                        tries);
  }
};

#ifdef TESSERA_TEST_UNDER_ASAN
inline constexpr int kChildForks = 3;
#else
inline constexpr int kChildForks = 1;
#endif

inline ChildResult RunInChild(absl::FunctionRef<int()> body,
                              absl::Duration patience) {
  ChildResult result;
  for (int i = 0; i < kChildForks; ++i) {
    const pid_t child = fork();
    if (child < 0) return result;
    if (child == 0) _exit(body());
    result.forked = true;
    ++result.forks;
    result.hung = false;
    const absl::Time deadline = absl::Now() + patience;
    while (true) {
      const pid_t waited = waitpid(child, &result.wait_status, WNOHANG);
      if (waited == child) break;
      if (waited < 0 && errno != EINTR) {
        result.wait_status = ChildResult::kWaitFailed;
        break;
      }
      if (absl::Now() > deadline) {
        kill(child, SIGKILL);
        waitpid(child, &result.wait_status, 0);
        result.hung = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (result.passed()) break;
  }
  return result;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_FORKED_CHILD_H_
