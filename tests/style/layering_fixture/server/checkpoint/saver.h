// server/ never includes the tessera tool.
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_CHECKPOINT_SAVER_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_CHECKPOINT_SAVER_H_

#include "client/cli/launch/launcher.h"
#include "server/rank/rank.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_SERVER_CHECKPOINT_SAVER_H_
