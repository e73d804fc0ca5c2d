// wire/auth.h without a server: the token file's format and its errors,
// reloads, the process token from the environment, and a method table
// that covers every method of every Tessera service.
#include "wire/auth.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "tessera/v1/control.pb.h"
#include "tessera/v1/shard.pb.h"
#include "tessera/v1/store.pb.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace tessera {
namespace {

namespace tt = ::tessera::testing;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "0123456789abcdef0123";

TEST(TokenTableTest, ParsesRolesNamesAndComments) {
  ASSERT_OK_AND_ASSIGN(
      auto entries,
      TokenTable::Parse(
          absl::StrCat("# comment\n\n  ", kToken,
                       " read dash\nfedcba9876543210fedc\twrite\n"),
          "tokens"));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].role, Role::kRead);
  EXPECT_EQ(entries[0].name, "dash");
  EXPECT_EQ(entries[1].role, Role::kWrite);
  EXPECT_EQ(entries[1].name, "line 4");
}

TEST(TokenTableTest, BadLinesNameTheLineNeverTheToken) {
  const struct {
    std::string text;
    std::string why;
  } cases[] = {
      {absl::StrCat(kToken, "\n"), "line 1: expected '<token> <role> [name]'"},
      {absl::StrCat(kToken, " read a b\n"), "expected"},
      {"short read\n", "16 to 512 printable"},
      {absl::StrCat(std::string(513, 'x'), " read\n"), "16 to 512"},
      {absl::StrCat("\n", kToken, " root\n"), "line 2: unknown role 'root'"},
      {absl::StrCat(kToken, " read a\n", kToken, " admin b\n"),
       "line 2: the token of a again"},
      {"# only comments\n", "no tokens"},
      {"", "no tokens"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text.substr(0, 60));
    const absl::Status status = TokenTable::Parse(c.text, "f").status();
    EXPECT_THAT(status, tt::StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr(c.why)));
    EXPECT_THAT(std::string(status.message()), Not(HasSubstr(kToken)));
  }
}

TEST(TokenTableTest, MethodTableCoversEveryServiceMethod) {
  // Link the descriptors in.
  v1::CreateTensorRequest control;
  v1::FetchShardRequest shard;
  v1::StoreSetRequest store;
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  int methods = 0;
  for (const char* service :
       {"tessera.v1.ControlService", "tessera.v1.ShardService",
        "tessera.v1.StoreService"}) {
    const google::protobuf::ServiceDescriptor* descriptor =
        pool->FindServiceByName(service);
    ASSERT_NE(descriptor, nullptr) << service;
    for (int i = 0; i < descriptor->method_count(); ++i) {
      const std::string name =
          absl::StrCat(service, "/", descriptor->method(i)->name());
      EXPECT_TRUE(RequiredRole(name).has_value()) << name;
      ++methods;
    }
  }
  EXPECT_EQ(methods, static_cast<int>(MethodRoles().size()));
  EXPECT_FALSE(RequiredRole("tessera.v1.ControlService/Nope").has_value());
  EXPECT_EQ(*RequiredRole("tessera.v1.StoreService/Set"), Role::kCluster);
  EXPECT_EQ(*RequiredRole("tessera.v1.ControlService/SaveCheckpoint"),
            Role::kAdmin);
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    path_ = dir_ + "/tokens";
  }
  void Write(const std::string& text, mode_t mode = 0600) {
    const std::string next = path_ + ".next";
    std::ofstream(next) << text;
    ASSERT_EQ(chmod(next.c_str(), mode), 0);
    ASSERT_EQ(rename(next.c_str(), path_.c_str()), 0);
  }
  tt::ScopedTempDir tmp_{"tessera-auth-unit"};
  std::string dir_, path_;
};

TEST_F(TokenFileTest, FindsTokensAndTheClusterToken) {
  Write(absl::StrCat(kToken,
                     " admin ops\nclusterclustercluster1 cluster\n"
                     "clusterclustercluster2 cluster\n"));
  ASSERT_OK_AND_ASSIGN(auto table, TokenTable::FromFile(path_));
  ASSERT_TRUE(table->Find(kToken).has_value());
  EXPECT_EQ(table->Find(kToken)->role, Role::kAdmin);
  EXPECT_FALSE(table->Find("0123456789abcdef012").has_value());
  EXPECT_FALSE(table->Find("").has_value());
  EXPECT_EQ(table->cluster_token(), "clusterclustercluster1");
}

TEST_F(TokenFileTest, AFileEveryUserMayReadIsRefused) {
  Write(absl::StrCat(kToken, " read\n"), 0644);
  EXPECT_THAT(TokenTable::FromFile(path_).status(),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("every user may read it")));
  EXPECT_THAT(TokenTable::FromFile(dir_ + "/missing").status(),
              tt::StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST_F(TokenFileTest, ReloadsChangesAndKeepsTheLastGoodTable) {
  Write(absl::StrCat(kToken, " read\n"));
  ASSERT_OK_AND_ASSIGN(auto table,
                       TokenTable::FromFile(path_, absl::Milliseconds(1)));
  const std::string fresh = "freshfreshfreshfresh";
  Write(absl::StrCat(fresh, " write\n"));
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(table->Find(fresh).has_value());
  EXPECT_FALSE(table->Find(kToken).has_value());  // revoked
  Write("not a token file at all\n");
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(table->Find(fresh).has_value());
}

TEST(ProcessTokenTest, FromTheEnvironment) {
  char file[] = "/tmp/tessera-token-XXXXXX";
  const int fd = mkstemp(file);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(file) << "# mine\n  " << kToken << " read\n";
  setenv("TESSERA_TOKEN_FILE", file, 1);
  unsetenv("TESSERA_TOKEN");
  EXPECT_THAT(TokenFromEnvironment(), tt::IsOkAndHolds(std::string(kToken)));
  setenv("TESSERA_TOKEN", " direct-token ", 1);
  EXPECT_THAT(TokenFromEnvironment(),
              tt::IsOkAndHolds(std::string("direct-token")));
  unsetenv("TESSERA_TOKEN");
  std::ofstream(file) << "# nothing\n";
  EXPECT_THAT(TokenFromEnvironment(),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("holds no token")));
  std::remove(file);
  EXPECT_THAT(TokenFromEnvironment(),
              tt::StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("TESSERA_TOKEN_FILE")));
  unsetenv("TESSERA_TOKEN_FILE");
  EXPECT_THAT(TokenFromEnvironment(), tt::IsOkAndHolds(std::string()));
  SetProcessToken("explicit");
  EXPECT_THAT(ProcessToken(), tt::IsOkAndHolds(std::string("explicit")));
}

}  // namespace
}  // namespace tessera
