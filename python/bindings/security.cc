// TLS and tokens for the whole process (docs/security.md): set_tls takes
// the CLI's CA, certificate and key files (checked now, INVALID_ARGUMENT
// naming the connect() argument), set_token the bearer token every later
// call carries. Both apply to channels made afterwards.
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
}

}  // namespace tessera::python
