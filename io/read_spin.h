// ReadSpin: how a socket read waits for bytes that have not come yet:
// polling the socket in a loop for a moment first, while the process's
// recent waits were short, and blocking (poll(2)) otherwise.
//
// Why: a sleeping (virtual) CPU takes tens of microseconds to wake, more
// than a small request's whole round trip between two processes of one
// host. On a 2-vCPU VM a 4 KiB read over the local path (a Unix socket
// message each way, client and daemon on different CPUs) took 110-122 us
// when both ends blocked, 25-35 us with both on one CPU (no wake-up across
// CPUs); the data plane's reads, which polled first, took 28-35 us.
//
// Adaptive: polling pays when the bytes come within kReadSpin, which is
// what a quiet machine does; on a busy one (more runnable threads than
// cores) the peer that would send them may be waiting for the very core
// the poller holds, and polling makes every wait longer. So the process
// keeps a score of its recent waits: one that ended within kReadSpin
// (polled or blocked) raises it, a longer one lowers it twice as fast, and
// reads poll only while it is at least kSpinAbove. Blocked waits keep
// being timed, so polling resumes once waits are short again.
//
// Use: one ReadSpin per read:
//
//   ReadSpin wait;
//   while (true) {
//     n = recv(..., MSG_DONTWAIT);
//     if (n > 0) { wait.Got(); ...; continue or return; }
//     if (EAGAIN && !wait.Poll(/*small=*/true)) AwaitReady(fd, POLLIN, ...);
//   }
//
// Thread-safety: a ReadSpin belongs to one thread; the score it reads and
// updates is the process's, shared by every thread (lock-free). Never
// fails.
#ifndef TESSERA_IO_READ_SPIN_H_
#define TESSERA_IO_READ_SPIN_H_

#include <chrono>

namespace tessera {

class ReadSpin {
 public:
  // How long a read polls before it blocks.
  static constexpr std::chrono::microseconds kReadSpin{100};

  // A read found no bytes: true to try again at once (polling), false to
  // block until the socket is readable. `small`, looked at when a wait
  // begins: whether the bytes still awaited are few (a reply, a message);
  // a wait for many (the next segment of a transfer already streaming)
  // never polls: polling for it takes a core from the sender (on a host
  // the two ends share).
  bool Poll(bool small);
  // A read got bytes: the wait (if any) ends and is recorded.
  void Got();

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point waiting_since_{};  // The current wait's start.
  bool spin_ = false;
};

}  // namespace tessera

#endif  // TESSERA_IO_READ_SPIN_H_
