// Metrics that reach up into the shard server: the check must refuse it
// (server/metrics/ was once never checked).
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_METRICS_METRICS_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_METRICS_METRICS_H_

#include "io/socket.h"
#include "server/serve/shard_server.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_METRICS_METRICS_H_
