// The daemon may include every layer below it.
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_DAEMON_DAEMON_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_DAEMON_DAEMON_H_

#include "client/client.h"
#include "server/store/store.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_DAEMON_DAEMON_H_
