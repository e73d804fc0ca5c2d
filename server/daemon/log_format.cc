#include "server/daemon/log_format.h"

#include <chrono>
#include <string>

#include "absl/time/time.h"
#include "common/log_context.h"
#include "nlohmann/json.hpp"
#include "spdlog/details/log_msg.h"

namespace tessera {
namespace {

class JsonLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override {
    const absl::Time time = absl::FromChrono(msg.time);
    // In this order: time, level, rank, generation, op, tensor, request,
    // peer, message.
    nlohmann::ordered_json line = {
        {"time",
         absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone())},
        {"level", std::string(spdlog::level::to_string_view(msg.level).data(),
                              spdlog::level::to_string_view(msg.level).size())},
        {"rank", LogRank()},
        {"generation", LogGeneration()},
    };
    const LogContext& context = CurrentLogContext();
    if (context.op != 0) line["op"] = context.op;
    if (!context.tensor.empty()) line["tensor"] = context.tensor;
    if (!context.request.empty()) line["request"] = context.request;
    if (context.peer >= 0) line["peer"] = context.peer;
    line["message"] = std::string(msg.payload.data(), msg.payload.size());
    const std::string text = line.dump(
        -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonLogFormatter>();
  }
};

}  // namespace

std::unique_ptr<spdlog::formatter> NewJsonLogFormatter() {
  return std::make_unique<JsonLogFormatter>();
}

}  // namespace tessera
