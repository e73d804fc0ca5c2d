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
// Thread-safety: as spdlog's formatters (one per sink, used under the
// sink's lock).
#ifndef TESSERA_SERVER_DAEMON_LOG_FORMAT_H_
#define TESSERA_SERVER_DAEMON_LOG_FORMAT_H_

#include <memory>

#include "spdlog/formatter.h"

namespace tessera {

std::unique_ptr<spdlog::formatter> NewJsonLogFormatter();

}  // namespace tessera

#endif  // TESSERA_SERVER_DAEMON_LOG_FORMAT_H_
