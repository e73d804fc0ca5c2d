// The shard server only serves: it may not include client/ at all.
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_SERVE_SHARD_SERVER_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_SERVE_SHARD_SERVER_H_

#include "client/shard_client.h"
#include "server/metrics/metrics.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_SERVE_SHARD_SERVER_H_
