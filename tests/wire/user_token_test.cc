// The per-user token file (wire/user_token.h) and where the client sends
// it (wire/auth.h ProcessTokenFor): made private, made once by racing
// daemons, refused when others could read or replace it, read back by the
// client, and never offered beyond loopback.
#include "wire/user_token.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "wire/auth.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using ::testing::HasSubstr;

class UserTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    root_ = tmp_.path();
    home_ = root_ + "/home";
    setenv("TESSERA_HOME", home_.c_str(), 1);
    unsetenv("TESSERA_TOKEN");
    unsetenv("TESSERA_TOKEN_FILE");
    ClearProcessToken();
  }
  void TearDown() override {
    ClearProcessToken();
    unsetenv("TESSERA_HOME");
  }

  tt::ScopedTempDir tmp_{"tessera-user-token"};
  std::string root_;
  std::string home_;
};

TEST_F(UserTokenTest, MadePrivateWithOneClusterToken) {
  EXPECT_THAT(ReadUserToken(), tt::IsOkAndHolds(std::string()));
  ASSERT_OK_AND_ASSIGN(const std::string path, EnsureUserTokenFile());
  EXPECT_EQ(path, home_ + "/token");
  EXPECT_EQ(tt::FileMode(home_), "0700");
  EXPECT_EQ(tt::FileMode(path), "0600");
  ASSERT_OK_AND_ASSIGN(const std::string text, ReadFileToString(path));
  std::string cluster;
  ASSERT_OK_AND_ASSIGN(std::vector<TokenTable::Entry> entries,
                       TokenTable::Parse(text, path, &cluster));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].role, Role::kCluster);
  EXPECT_EQ(cluster.size(), 64u);
  EXPECT_THAT(ReadUserToken(), tt::IsOkAndHolds(cluster));
  // Kept: a second start reads the same token.
  ASSERT_THAT(EnsureUserTokenFile(), tt::IsOkAndHolds(path));
  EXPECT_THAT(ReadUserToken(), tt::IsOkAndHolds(cluster));
  // A TokenTable (the daemon's) accepts the file as it was made.
  EXPECT_OK(TokenTable::FromFile(path).status());
}

// Daemons of one user started at once (here 8 processes) agree on one file.
TEST_F(UserTokenTest, RacingDaemonsAgreeOnOneToken) {
  constexpr int kProcesses = 8;
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      absl::StatusOr<std::string> path = EnsureUserTokenFile();
      absl::StatusOr<std::string> token = ReadUserToken();
      if (!path.ok() || !token.ok() || token->empty()) _exit(1);
      std::ofstream(absl::StrCat(root_, "/seen.", i)) << *token;
      _exit(0);
    }
    children.push_back(child);
  }
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::set<std::string> seen;
  for (int i = 0; i < kProcesses; ++i) {
    ASSERT_OK_AND_ASSIGN(std::string token,
                         ReadFileToString(absl::StrCat(root_, "/seen.", i)));
    seen.insert(token);
  }
  EXPECT_EQ(seen.size(), 1u);
  // No temporary file is left behind.
  EXPECT_EQ(
      std::system(
          absl::StrCat("test $(ls -A '", home_, "' | wc -l) -eq 1").c_str()),
      0);
}

TEST_F(UserTokenTest, RefusedWhereOthersCouldReadOrReplaceIt) {
  ASSERT_EQ(mkdir(home_.c_str(), 0777), 0);
  ASSERT_EQ(chmod(home_.c_str(), 0777), 0);
  EXPECT_THAT(EnsureUserTokenFile(),
              tt::StatusIs(absl::StatusCode::kFailedPrecondition,
                           HasSubstr("others may write to it")));
  ASSERT_EQ(chmod(home_.c_str(), 0700), 0);
  std::ofstream(home_ + "/token") << "0123456789abcdef0123 cluster\n";
  ASSERT_EQ(chmod((home_ + "/token").c_str(), 0644), 0);
  EXPECT_THAT(EnsureUserTokenFile(),
              tt::StatusIs(absl::StatusCode::kFailedPrecondition,
                           HasSubstr("chmod 600")));
  ASSERT_EQ(chmod((home_ + "/token").c_str(), 0600), 0);
  EXPECT_OK(EnsureUserTokenFile().status());
  // A symbolic link in its place is not followed.
  ASSERT_EQ(unlink((home_ + "/token").c_str()), 0);
  ASSERT_EQ(symlink("/etc/hostname", (home_ + "/token").c_str()), 0);
  EXPECT_FALSE(EnsureUserTokenFile().ok());
}

TEST_F(UserTokenTest, TheHomeFallsBackToHome) {
  unsetenv("TESSERA_HOME");
  const char* saved = std::getenv("HOME");
  const std::string old = saved == nullptr ? "" : saved;
  setenv("HOME", root_.c_str(), 1);
  EXPECT_THAT(UserTokenPath(), tt::IsOkAndHolds(root_ + "/.tessera/token"));
  if (old.empty()) {
    unsetenv("HOME");
  } else {
    setenv("HOME", old.c_str(), 1);
  }
}

TEST_F(UserTokenTest, SentToLoopbackOnly) {
  ASSERT_OK(EnsureUserTokenFile().status());
  ASSERT_OK_AND_ASSIGN(const std::string token, ReadUserToken());
  for (const char* target : {"127.0.0.1:5", "localhost:5", "[::1]:5",
                             "dns:///localhost:5", "ipv4:127.0.0.2:5"}) {
    EXPECT_TRUE(IsLoopbackTarget(target)) << target;
    EXPECT_THAT(ProcessTokenFor(target), tt::IsOkAndHolds(token)) << target;
  }
  for (const char* target :
       {"10.0.0.1:5", "example.org:5", "[2001:db8::1]:5", "dns:///h:5"}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
    EXPECT_THAT(ProcessTokenFor(target), tt::IsOkAndHolds(std::string()))
        << target;
  }
  // An explicit token wins everywhere.
  SetProcessToken("explicit-token");
  EXPECT_THAT(ProcessTokenFor("127.0.0.1:5"),
              tt::IsOkAndHolds(std::string("explicit-token")));
  // And an explicit "" means none at all, even on loopback.
  SetProcessToken("");
  EXPECT_THAT(ProcessTokenFor("127.0.0.1:5"), tt::IsOkAndHolds(std::string()));
  // Until cleared.
  ClearProcessToken();
  EXPECT_THAT(ProcessTokenFor("127.0.0.1:5"), tt::IsOkAndHolds(token));
}

}  // namespace
}  // namespace tessera
