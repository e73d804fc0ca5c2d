// The daemon may include every layer below it, and client/'s peer-fetch
// headers.
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_DAEMON_DAEMON_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_DAEMON_DAEMON_H_

#include "client/shard_client.h"
#include "server/store/store.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_DAEMON_DAEMON_H_
