#include "server/daemon/log_format.h"

#include <chrono>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/log_context.h"
#include "common/tensor_name.h"
#include "nlohmann/json.hpp"
#include "spdlog/details/log_msg.h"
#include "spdlog/pattern_formatter.h"

namespace tessera {
namespace {

// The message of `msg`, cut to kMaxLogMessageBytes and saying so.
std::string Message(const spdlog::details::log_msg& msg) {
  return ShownText(absl::string_view(msg.payload.data(), msg.payload.size()),
                   kMaxLogMessageBytes, kMaxLogMessageBytes);
}

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
    line["message"] = Message(msg);
    const std::string text = line.dump(
        -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonLogFormatter>();
  }
};

// spdlog's own pattern formatter, given the message cut short.
class TextLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override {
    if (msg.payload.size() <= kMaxLogMessageBytes) {
      pattern_.format(msg, dest);
      return;
    }
    const std::string cut = Message(msg);
    spdlog::details::log_msg shorter = msg;
    shorter.payload = spdlog::string_view_t(cut.data(), cut.size());
    pattern_.format(shorter, dest);
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<TextLogFormatter>();
  }

 private:
  spdlog::pattern_formatter pattern_{"[%Y-%m-%d %H:%M:%S.%e] [%l] %v"};
};

}  // namespace

std::unique_ptr<spdlog::formatter> NewJsonLogFormatter() {
  return std::make_unique<JsonLogFormatter>();
}

std::unique_ptr<spdlog::formatter> NewTextLogFormatter() {
  return std::make_unique<TextLogFormatter>();
}

}  // namespace tessera
