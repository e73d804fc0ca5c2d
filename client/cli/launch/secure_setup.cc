#include "client/cli/launch/secure_setup.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "io/errno.h"
#include "io/socket.h"
#include "io/subprocess.h"

namespace tessera::cli {
namespace {

// Writes `text` to a new file `path` of mode 0600.
absl::Status WritePrivateFile(const std::string& path, std::string_view text) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return ErrnoError(errno, absl::StrCat("cannot create ", path),
                      absl::StatusCode::kInternal);
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      return ErrnoError(error, absl::StrCat("cannot write ", path),
                        absl::StatusCode::kInternal);
    }
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

// 32 random bytes from the kernel, as 64 hex digits.
absl::StatusOr<std::string> RandomToken() {
  char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return ErrnoError(errno, "cannot read random bytes for a token",
                        absl::StatusCode::kInternal);
    }
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

// Runs `openssl args...` with its output in `log`, within a minute.
absl::Status Openssl(const std::string& step, std::vector<std::string> args,
                     const std::string& log) {
  SpawnOptions spawn;
  spawn.program = "openssl";
  spawn.search_path = true;
  spawn.args = std::move(args);
  spawn.log_path = log;
  spawn.stdin_null = true;
  absl::StatusOr<Subprocess> child = Subprocess::Spawn(std::move(spawn));
  if (!child.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run openssl (install it: apt-get install "
                     "openssl): ",
                     child.status().message()));
  }
  const std::optional<int> status = child->WaitFor(absl::Seconds(60));
  if (!status.has_value()) {
    child->Kill();
    return absl::InternalError(
        absl::StrCat("openssl did not finish ", step, " within 60s"));
  }
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return absl::OkStatus();
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 127) {
    return absl::FailedPreconditionError(
        "cannot run openssl (install it: apt-get install openssl)");
  }
  return absl::InternalError(absl::StrCat("openssl failed ", step, " (",
                                          DescribeWaitStatus(*status),
                                          "): ", child->LogTail(600)));
}

}  // namespace

std::vector<std::string> SecureSetup::DaemonFlags() const {
  return {"--tls-cert", daemon_cert, "--tls-key",         daemon_key,
          "--tls-ca",   ca,          "--auth-token-file", token_file};
}

std::vector<std::pair<std::string, std::string>>
SecureSetup::ClientEnvironment() const {
  return {{"TESSERA_TLS_CA", ca},
          {"TESSERA_TLS_CERT", client_cert},
          {"TESSERA_TLS_KEY", client_key},
          {"TESSERA_TOKEN_FILE", client_token_file}};
}

absl::Status MakeCertificates(const std::string& dir,
                              const std::string& ca_name,
                              const std::vector<CertificateRequest>& leaves,
                              int valid_days) {
  auto path = [&dir](absl::string_view name) {
    return absl::StrCat(dir, "/", name);
  };
  const std::string ca = path("ca.pem");
  const std::string ca_key = path("ca.key");
  const std::string log = path("openssl.log");
  const std::string days = absl::StrCat(valid_days);
  const std::vector<std::string> new_key = {
      "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};

  std::vector<std::string> ca_args = {"req", "-x509"};
  ca_args.insert(ca_args.end(), new_key.begin(), new_key.end());
  ca_args.insert(
      ca_args.end(),
      {"-days", days, "-subj", absl::StrCat("/CN=", ca_name), "-addext",
       "basicConstraints=critical,CA:TRUE", "-addext",
       "keyUsage=critical,keyCertSign,cRLSign", "-keyout", ca_key, "-out", ca});
  RETURN_IF_ERROR(Openssl("making the CA", ca_args, log));
  std::vector<std::string> keys = {ca_key};
  for (const CertificateRequest& leaf : leaves) {
    const std::string cert = path(absl::StrCat(leaf.name, ".pem"));
    const std::string key = path(absl::StrCat(leaf.name, ".key"));
    const std::string csr = path(absl::StrCat(leaf.name, ".csr"));
    const std::string ext = path(absl::StrCat(leaf.name, ".ext"));
    std::string extensions = absl::StrCat(
        "basicConstraints=CA:FALSE\nextendedKeyUsage=", leaf.usage, "\n");
    if (!leaf.alt_names.empty()) {
      absl::StrAppend(&extensions,
                      "subjectAltName=", absl::StrJoin(leaf.alt_names, ","),
                      "\n");
    }
    RETURN_IF_ERROR(WritePrivateFile(ext, extensions));
    std::vector<std::string> request = {"req"};
    request.insert(request.end(), new_key.begin(), new_key.end());
    request.insert(request.end(),
                   {"-subj", absl::StrCat("/CN=tessera ", leaf.name), "-keyout",
                    key, "-out", csr});
    RETURN_IF_ERROR(
        Openssl(absl::StrCat("making the ", leaf.name, " key"), request, log));
    RETURN_IF_ERROR(
        Openssl(absl::StrCat("signing the ", leaf.name, " certificate"),
                {"x509", "-req", "-days", days, "-in", csr, "-CA", ca, "-CAkey",
                 ca_key, "-CAcreateserial", "-extfile", ext, "-out", cert},
                log));
    keys.push_back(key);
  }
  for (const std::string& key : keys) {
    if (::chmod(key.c_str(), 0600) != 0) {
      return ErrnoError(errno, absl::StrCat("cannot chmod ", key),
                        absl::StatusCode::kInternal);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SecureSetup> MakeSecureSetup(const std::string& dir,
                                            const std::string& host,
                                            int valid_days) {
  SecureSetup setup;
  setup.dir = dir;
  auto path = [&dir](absl::string_view name) {
    return absl::StrCat(dir, "/", name);
  };
  setup.ca = path("ca.pem");
  setup.daemon_cert = path("daemon.pem");
  setup.daemon_key = path("daemon.key");
  setup.client_cert = path("client.pem");
  setup.client_key = path("client.key");
  setup.token_file = path("tokens");
  setup.client_token_file = path("client.token");
  setup.env_file = path("env");

  std::vector<std::string> names = {"IP:127.0.0.1", "DNS:localhost"};
  if (!host.empty() && host != "0.0.0.0" && host != "::" &&
      host != "127.0.0.1" && host != "localhost") {
    names.push_back(absl::StrCat(IsIpAddress(host) ? "IP:" : "DNS:", host));
  }
  RETURN_IF_ERROR(MakeCertificates(dir, "tessera launch CA",
                                   {{"daemon", "serverAuth,clientAuth", names},
                                    {"client", "clientAuth", {}}},
                                   valid_days));

  ASSIGN_OR_RETURN(const std::string admin, RandomToken());
  ASSIGN_OR_RETURN(const std::string cluster, RandomToken());
  RETURN_IF_ERROR(WritePrivateFile(
      setup.token_file,
      absl::StrCat("# tessera launch --secure: made for this launch only\n",
                   admin, " admin client\n", cluster, " cluster daemons\n")));
  RETURN_IF_ERROR(
      WritePrivateFile(setup.client_token_file, absl::StrCat(admin, "\n")));
  std::string env;
  for (const auto& [name, value] : setup.ClientEnvironment()) {
    absl::StrAppend(&env, "export ", name, "='", value, "'\n");
  }
  RETURN_IF_ERROR(WritePrivateFile(setup.env_file, env));
  return setup;
}

}  // namespace tessera::cli
