#include "tests/client/cli/cli_runner.h"

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

#ifndef TESSERA_CLI_PATH
#error "TESSERA_CLI_PATH must name the tessera binary"
#endif

extern char** environ;

namespace tessera::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern =
      absl::StrCat(base != nullptr ? base : "/tmp", "/tessera_cli_XXXXXX");
  if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::File(const std::string& name) const {
  return absl::StrCat(path_, "/", name);
}

std::string TempDir::Write(const std::string& name,
                           const std::string& contents) const {
  const std::string file = File(name);
  std::ofstream(file, std::ios::binary) << contents;
  return file;
}

std::string TesseraPath() { return TESSERA_CLI_PATH; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

RunResult RunTessera(
    const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, std::string>>& env) {
  TempDir dir;
  const std::string out_path = dir.File("stdout");
  const std::string err_path = dir.File("stderr");
  std::vector<std::string> strings = {TesseraPath()};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // The child's environment is built here: after fork() it only calls
  // async-signal-safe functions.
  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    bool replaced = false;
    for (const auto& [name, value] : env) {
      replaced = replaced || variable.rfind(name + "=", 0) == 0;
    }
    if (!replaced) env_strings.push_back(variable);
  }
  for (const auto& [name, value] : env) {
    if (!value.empty()) env_strings.push_back(absl::StrCat(name, "=", value));
  }
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  RunResult result;
  const pid_t pid = fork();
  if (pid == 0) {
    const int out_fd =
        open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err_fd =
        open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out_fd < 0 || err_fd < 0) _exit(126);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (pid < 0) {
    ADD_FAILURE() << "fork failed: " << errno;
    return result;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = ReadAll(out_path);
  result.err = ReadAll(err_path);
  return result;
}

}  // namespace tessera::testing
