// A store that includes the daemon above it, and a header of its own layer
// and one below (both allowed).
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_STORE_STORE_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_STORE_STORE_H_

#include "common/model.h"
#include "server/daemon/daemon.h"
#include "server/store/other.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_STORE_STORE_H_
