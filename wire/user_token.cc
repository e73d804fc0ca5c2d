#include "wire/user_token.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "io/file.h"
#include "io/owner_only.h"
#include "wire/openssl_init.h"

namespace tessera {

namespace {

// The user's entry in the password database, if any.
bool LookUpUser(std::string* name, std::string* home) {
  std::vector<char> buffer(16384);
  struct passwd entry;
  struct passwd* found = nullptr;
  if (::getpwuid_r(::geteuid(), &entry, buffer.data(), buffer.size(), &found) !=
          0 ||
      found == nullptr) {
    return false;
  }
  if (name != nullptr && found->pw_name != nullptr) *name = found->pw_name;
  if (home != nullptr && found->pw_dir != nullptr) *home = found->pw_dir;
  return true;
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".")
                                    : path.substr(0, slash == 0 ? 1 : slash);
}

absl::StatusOr<std::string> NewTokenLine() {
  unsigned char random[32];
  InitOpenssl();
  if (RAND_bytes(random, sizeof(random)) != 1) {
    return absl::InternalError("the system's random source failed");
  }
  return absl::StrCat(
      "# Tessera's per-user token: the daemons of ", CurrentUserName(),
      " started without credentials check callers against it, and\n"
      "# this user's clients send it. Keep it to this user (mode 0600).\n",
      absl::BytesToHexString(absl::string_view(
          reinterpret_cast<const char*>(random), sizeof(random))),
      " cluster ", CurrentUserName(), "\n");
}

// The first token of `text` (the file's format), "" when none.
std::string FirstToken(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    return std::string(line.substr(0, line.find_first_of(" \t")));
  }
  return "";
}

}  // namespace

std::string CurrentUserName() {
  std::string name;
  if (LookUpUser(&name, nullptr) && !name.empty()) return name;
  return absl::StrCat("uid ", ::geteuid());
}

absl::StatusOr<std::string> UserTokenPath() {
  if (const char* dir = std::getenv("TESSERA_HOME");
      dir != nullptr && *dir != '\0') {
    return absl::StrCat(absl::StripSuffix(dir, "/"), "/token");
  }
  std::string home;
  if (const char* env = std::getenv("HOME"); env != nullptr && *env != '\0') {
    home = env;
  } else if (!LookUpUser(nullptr, &home) || home.empty()) {
    return absl::FailedPreconditionError(
        "no home directory for the per-user token: set TESSERA_HOME to a "
        "directory only this user may write to");
  }
  return absl::StrCat(absl::StripSuffix(home, "/"), "/.tessera/token");
}

absl::StatusOr<std::string> EnsureUserTokenFile() {
  ASSIGN_OR_RETURN(const std::string path, UserTokenPath());
  const std::string dir = ParentOf(path);
  if (absl::Status status = EnsureOwnerOnlyDirectory(dir); !status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("the per-user token's directory: ", status.message()));
  }
  absl::StatusOr<UniqueFd> fd = OpenFile(path, O_RDONLY | O_NOFOLLOW);
  if (!fd.ok() && absl::IsNotFound(fd.status())) {
    ASSIGN_OR_RETURN(const std::string line, NewTokenLine());
    ASSIGN_OR_RETURN(const bool created, PublishFileOnce(path, line, 0600));
    (void)created;  // Another daemon of this user may have been first.
    fd = OpenFile(path, O_RDONLY | O_NOFOLLOW);
  }
  if (!fd.ok()) return fd.status();
  if (absl::Status status = CheckOwnerOnlyFile(fd->get(), path); !status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("the per-user token: ", status.message()));
  }
  return path;
}

absl::StatusOr<std::string> ReadUserToken() {
  absl::StatusOr<std::string> path = UserTokenPath();
  if (!path.ok()) return std::string();
  absl::StatusOr<UniqueFd> fd = OpenFile(*path, O_RDONLY);
  if (!fd.ok()) {
    // None of this user's (not made yet), or another user's file.
    if (absl::IsNotFound(fd.status()) ||
        absl::IsPermissionDenied(fd.status())) {
      return std::string();
    }
    return fd.status();
  }
  std::string text;
  char buffer[4096];
  while (true) {
    ASSIGN_OR_RETURN(const size_t got,
                     ReadAll(fd->get(), buffer, sizeof(buffer), *path));
    text.append(buffer, got);
    if (got < sizeof(buffer) || text.size() > (1 << 20)) break;
  }
  return FirstToken(text);
}

}  // namespace tessera
