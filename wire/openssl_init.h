// OpenSSL's initialisation, once per process, without its exit-time
// cleanup (OPENSSL_INIT_NO_ATEXIT).
//
// Why: OpenSSL's default atexit handler frees its global state and deletes
// the thread-local keys whose destructors free each thread's state (its
// random generators, its error queue). gRPC's threads and the data plane's
// may still run, use OpenSSL and exit after exit() has started: with that
// cleanup they touch freed state, or exit without their destructors and
// leak what they held (LeakSanitizer saw a thread's random generator). The
// operating system reclaims the process's memory at exit anyway.
//
// Every function of wire/ that uses OpenSSL, or hands TLS to gRPC, calls
// InitOpenssl first, so the first initialisation in a process is this one
// (a process that had OpenSSL initialised before, e.g. Python's ssl
// module, keeps its own choice; that is harmless).
//
// Thread-safety: may be called from any thread, any number of times; the
// calls after the first cost one load.
// Failure: none reported; OpenSSL initialises itself lazily if this
// failed, and its callers report their own errors.
#ifndef TESSERA_WIRE_OPENSSL_INIT_H_
#define TESSERA_WIRE_OPENSSL_INIT_H_

namespace tessera {

void InitOpenssl();

}  // namespace tessera

#endif  // TESSERA_WIRE_OPENSSL_INIT_H_
