// Rank is a client of its peers through client/'s peer-fetch headers only:
// remote_shard.h is one of them, npy.h is not.
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_RANK_RANK_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_RANK_RANK_H_

#include "client/npy.h"
#include "client/remote_shard.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_RANK_RANK_H_
