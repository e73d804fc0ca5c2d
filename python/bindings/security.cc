// TLS and tokens for the whole process (docs/security.md): set_tls takes
// the CLI's CA, certificate and key files (checked now, INVALID_ARGUMENT
// naming the connect() argument), set_token the bearer token every later
// call carries. Both apply to channels made afterwards. read_token_file
// reads connect(token_file=) as the CLI reads --token-file.
#include <string>
#include <utility>

#include "python/bindings/module.h"
#include "python/bindings/support.h"
#include "wire/auth.h"
#include "wire/credentials.h"

namespace tessera::python {

void BindSecurity(py::module_& m) {
  m.def("set_tls", [](const std::string& ca, const std::string& cert,
                      const std::string& key) {
    TlsConfig config;
    config.ca_file = ca;
    config.cert_file = cert;
    config.key_file = key;
    Check(ValidateTlsConfig(config, /*server=*/false, "tls_cert", "tls_key",
                            "tls_ca"));
    SetProcessTls(std::move(config));
  });
  m.def("set_token", [](const std::string& token) { SetProcessToken(token); });
  // connect(token_file=): the token as the CLI's --token-file reads it
  // (ReadClientTokenFile: the first word of the first line neither blank
  // nor a comment; a device such as /dev/zero or a file beyond 16 MiB is
  // refused before it is read whole).
  m.def("read_token_file", [](const std::string& path) {
    return Check(ReadClientTokenFile(path, "token_file"));
  });
}

}  // namespace tessera::python
