// Abseil's mutex deadlock detector, off in shipped binaries.
//
// Debian builds Abseil without NDEBUG, so by default every absl::Mutex
// acquisition also runs Abseil's deadlock detector: a per-thread list of
// held locks and a process-wide lock-order graph behind one global lock,
// on every Lock and Unlock of every thread. The daemon, the tessera tool
// and the Python module turn it off when they start (a profile of a busy
// daemon shows the detector's graph among its hottest functions); the
// tests keep it on, so a lock-order inversion still fails them.
//
// Thread-safety: call before the process starts its threads.
#ifndef TESSERA_COMMON_MUTEX_CHECKS_H_
#define TESSERA_COMMON_MUTEX_CHECKS_H_

namespace tessera {

// Turns Abseil's mutex deadlock detection off for this process.
void SkipMutexDeadlockChecks();

}  // namespace tessera

#endif  // TESSERA_COMMON_MUTEX_CHECKS_H_
