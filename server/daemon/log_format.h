// The daemon's log formats: "text" ("[2026-11-26 18:20:01.123] [info]
// message") and "json", one object per line for log shippers:
//
//   {"time":"2026-11-26T18:20:01.123Z","level":"info","rank":1,
//    "generation":1,"op":17,"tensor":"w","request":"r-5f0c...",
//    "message":"op 17 CreateTensor ..."}
//
// time is UTC with milliseconds; rank and generation are the process's
// (common/log_context.h, -1 and 0 until known); op, tensor, request and
// peer come from the logging thread's LogContext and are left out when
// unset. Messages are escaped as JSON strings (bytes that are not UTF-8
// are replaced), so every line parses.
//
// In both formats a message longer than kMaxLogMessageBytes is cut there
// and ends "...(N bytes)": an error that quotes what a caller sent (a path
// or a name of megabytes) must not grow the log by megabytes a request.
//
// Thread-safety: as spdlog's formatters (one per sink, used under the
// sink's lock).
#ifndef TESSERA_SERVER_DAEMON_LOG_FORMAT_H_
#define TESSERA_SERVER_DAEMON_LOG_FORMAT_H_

#include <cstddef>
#include <memory>

#include "spdlog/formatter.h"

namespace tessera {

inline constexpr size_t kMaxLogMessageBytes = size_t{8} << 10;

std::unique_ptr<spdlog::formatter> NewJsonLogFormatter();
// "[2026-11-26 18:20:01.123] [info] message".
std::unique_ptr<spdlog::formatter> NewTextLogFormatter();

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_LOG_FORMAT_H_
