// Running the built `tessera` binary as a user would, for CLI tests: its
// exit code, stdout and stderr (each into a file, so that no pipe can fill
// up and block it), and scratch directories.
//
// Thread-compatible. The binary is TESSERA_CLI_PATH, set by CMake.
#ifndef TESSERA_TESTS_CLIENT_CLI_CLI_RUNNER_H_
#define TESSERA_TESTS_CLIENT_CLI_CLI_RUNNER_H_

#include <string>
#include <utility>
#include <vector>

namespace tessera::testing {

struct RunResult {
  int exit_code = -1;  // -1 when it did not exit normally
  std::string out;
  std::string err;
};

// A scratch directory under TEST_TMPDIR (or /tmp), removed with everything
// in it when destroyed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // A path inside the directory.
  std::string File(const std::string& name) const;
  // Writes `contents` to File(name) and returns its path.
  std::string Write(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

// The path of the `tessera` binary under test.
std::string TesseraPath();

// Runs `tessera args...` with `env` set in its environment (replacing the
// inherited value; an empty value removes the variable) and waits for it.
RunResult RunTessera(
    const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, std::string>>& env = {});

// The file's contents ("" when unreadable).
std::string ReadAll(const std::string& path);

// `text` split at '\n', without the empty piece after a final newline.
std::vector<std::string> Lines(const std::string& text);

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_CLIENT_CLI_CLI_RUNNER_H_
