// What a daemon's log line is about, beyond its message: the structured
// fields of `tessera-server --log-format json` (server/daemon/log_format.h).
//
// The process-wide fields (rank, generation) are set by the daemon as they
// become known; the per-thread ones (the control operation, its tensor,
// the client's request id, a peer) by the code running an operation, for
// its extent, with ScopedLogContext.
//
// Thread-safety: the process-wide fields are atomics; the per-thread
// context belongs to its thread.
#ifndef TESSERA_COMMON_LOG_CONTEXT_H_
#define TESSERA_COMMON_LOG_CONTEXT_H_

#include <cstdint>
#include <string>

namespace tessera {

struct LogContext {
  int64_t op = 0;       // The control log's number of the op; 0: none.
  std::string tensor;   // The tensor it is about; "" when none.
  std::string request;  // The client's request id; "" when none.
  int peer = -1;        // The rank being talked to; -1 when none.
};

// The calling thread's context (empty outside any ScopedLogContext).
const LogContext& CurrentLogContext();

// Sets the calling thread's context until destroyed, then restores the
// one before.
class ScopedLogContext {
 public:
  explicit ScopedLogContext(LogContext context);
  ~ScopedLogContext();
  ScopedLogContext(const ScopedLogContext&) = delete;
  ScopedLogContext& operator=(const ScopedLogContext&) = delete;

 private:
  LogContext previous_;
};

// -1 until set.
void SetLogRank(int rank);
int LogRank();
// The generation of the daemon's default process group; 0 until set.
void SetLogGeneration(int64_t generation);
int64_t LogGeneration();

}  // namespace tessera

#endif  // TESSERA_COMMON_LOG_CONTEXT_H_
