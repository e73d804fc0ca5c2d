// tessera-server: one Tessera daemon per GPU (or CPU rank). See
// daemon_options.h for its settings (one table; `tessera-server --help`
// prints it) and daemon.h for what it runs.
//
// Threads: SIGINT and SIGTERM are blocked in every thread (the mask is set
// before any thread starts) and taken by one signal thread with sigwait(),
// so no work ever runs in a signal handler. The first signal after startup
// asks the main thread to drain and stop; a second one, or any during
// startup (nothing serves yet), exits at once with 128 + the signal.
//
// Exit codes: 0 after a graceful stop, 1 when startup fails (busy port,
// unreachable store, peers missing), 2 for a bad command line.
#include <grpc/support/log.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log_context.h"
#include "common/mutex_checks.h"
#include "io/heap.h"
#include "io/output_file.h"
#include "server/daemon/daemon.h"
#include "server/daemon/daemon_options.h"
#include "server/daemon/log_format.h"

namespace tessera::daemon {
namespace {

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// Set once the daemon serves. Leaked: the detached signal thread and gRPC's
// threads may use it after Run() returns.
std::atomic<bool>* const started = new std::atomic<bool>(false);

// gRPC's own messages, in the daemon's log. Its errors while starting (a
// busy port, a store not up yet) are what the daemon's own one-line error
// reports, so they only show at --log-level debug; once serving they are
// warnings.
void GrpcLog(gpr_log_func_args* args) {
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      spdlog::trace("grpc: {}", args->message);
      break;
    case GPR_LOG_SEVERITY_INFO:
      spdlog::debug("grpc: {}", args->message);
      break;
    case GPR_LOG_SEVERITY_ERROR:
      spdlog::log(started->load() ? spdlog::level::warn : spdlog::level::debug,
                  "grpc: {}", args->message);
      break;
  }
}

void SetUpLogging(const DaemonOptions& options) {
  const std::string& level = options.log_level;
  auto logger = spdlog::stderr_color_mt("tessera-server");
  if (options.log_format == "json") {
    logger->set_formatter(NewJsonLogFormatter());
  } else {
    logger->set_formatter(NewTextLogFormatter());
  }
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
  gpr_set_log_function(GrpcLog);
  gpr_set_log_verbosity(level == "trace" ? GPR_LOG_SEVERITY_INFO
                                         : GPR_LOG_SEVERITY_ERROR);
}

[[noreturn]] void ExitNow(int signal) {
  spdlog::warn("{} received: exiting now", strsignal(signal));
  spdlog::default_logger()->flush();
  _exit(128 + signal);
}

int Run(int argc, char** argv) {
  SkipMutexDeadlockChecks();
  // gRPC's receive buffers reused, not faulted in again per message.
  KeepFreedHeapForReuse();
  // Before any thread exists, so that every thread inherits the mask.
  const sigset_t stop_signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ParsedCommandLine parsed = ParseDaemonCommandLine(
      argc, argv, ProcessEnvironment(), std::cout, std::cerr);
  if (!parsed.options.has_value()) return parsed.exit_code;
  const DaemonOptions& options = *parsed.options;
  SetLogRank(options.rank);
  SetUpLogging(options);

  // Leaked: the detached signal thread may outlive Run().
  static auto* stop = new absl::Notification();
  std::thread([stop_signals] {
    for (int received = 0;;) {
      int signal = 0;
      if (sigwait(&stop_signals, &signal) != 0) continue;
      if (received++ > 0 || !started->load()) ExitNow(signal);
      spdlog::info("{} received: draining (again to exit at once)",
                   strsignal(signal));
      stop->Notify();
    }
  }).detach();

  // The files exist only while this daemon serves.
  const auto remove_files = [&options] {
    for (const std::string* file :
         {&options.metrics_address_file, &options.address_file}) {
      // Not a device: --address-file /dev/stdout is written in place.
      if (!file->empty()) RemoveOutputFile(*file).IgnoreError();
    }
  };
  remove_files();
  spdlog::info("rank {}/{} starting: device {}, backend {}{}", options.rank,
               options.world_size, options.device.ToString(), options.backend,
               options.world_size > 1
                   ? absl::StrCat(", store ", options.store_address())
                   : std::string());
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
  if (!daemon.ok()) {
    PrintDaemonError(std::cerr, daemon.status().message());
    return kExitFailure;
  }
  // From here a stop signal drains: the address file tells launchers (and
  // tests) that the daemon serves, and a SIGTERM sent the moment it appears
  // must stop it cleanly, not as a daemon that never started.
  started->store(true);
  // The metrics file first: once the address file is there, both are.
  for (const auto& [file, address] :
       {std::pair(options.metrics_address_file, (*daemon)->metrics_address()),
        std::pair(options.address_file, (*daemon)->address())}) {
    if (file.empty()) continue;
    if (absl::Status written = WriteAddressFile(file, address); !written.ok()) {
      PrintDaemonError(std::cerr, written.message());
      (*daemon)->Shutdown(absl::ZeroDuration());
      remove_files();
      return kExitFailure;
    }
  }
  spdlog::info(
      "rank {}/{} serving on {} (data {}, device {})", options.rank,
      options.world_size, (*daemon)->address(),
      (*daemon)->data_address().empty() ? "off" : (*daemon)->data_address(),
      options.device.ToString());

  stop->WaitForNotification();
  remove_files();
  (*daemon)->Shutdown(options.shutdown_grace);
  daemon->reset();
  spdlog::info("rank {}/{} stopped", options.rank, options.world_size);
  spdlog::default_logger()->flush();
  return kExitOk;
}

}  // namespace
}  // namespace tessera::daemon

int main(int argc, char** argv) { return tessera::daemon::Run(argc, argv); }
