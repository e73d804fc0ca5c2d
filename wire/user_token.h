// The per-user token: what a daemon started without credentials (no
// --auth-token-file, no --tls-ca, no --insecure) checks every caller
// against, and what the clients of the same user send without being told.
//
// The file is $TESSERA_HOME/token, else ~/.tessera/token (the home is
// $HOME, else the password database's), in --auth-token-file's format
// (wire/auth.h). A daemon creates it when it is absent: the directory with
// mode 0700, the file 0600 holding one random 256-bit token of role
// cluster. Daemons of one user started at the same moment agree on one
// file (the first to publish it wins; io/owner_only.h). Clients of that
// user read its first token when the process was given none (wire/auth.h
// ProcessToken); other users cannot read it, so their calls carry no token
// and are refused with UNAUTHENTICATED, naming what to set.
//
// Failure: UserTokenPath is FAILED_PRECONDITION when no home can be found
// (set TESSERA_HOME); EnsureUserTokenFile names the directory or file
// whose owner or mode lets another user in, or what could not be written.
//
// Thread-safety: the functions keep no state and may run on any thread.
#ifndef TESSERA_WIRE_USER_TOKEN_H_
#define TESSERA_WIRE_USER_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"

namespace tessera {

// $TESSERA_HOME/token, else <home>/.tessera/token.
absl::StatusOr<std::string> UserTokenPath();

// For a daemon: the path of the user's token file, made now (with one
// fresh cluster token) when absent, after checking that only this user
// may read or replace it.
absl::StatusOr<std::string> EnsureUserTokenFile();

// For a client: the first token of the user's file; "" when this user has
// none (no file yet, or one this process may not read).
absl::StatusOr<std::string> ReadUserToken();

// The name of the user this process runs as (its uid when it has none).
std::string CurrentUserName();

}  // namespace tessera

#endif  // TESSERA_WIRE_USER_TOKEN_H_
