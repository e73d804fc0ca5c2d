// A model header that reaches into io/: the layering check must refuse it.
#ifndef TESSERA_TESTS_STYLE_LAYERING_FIXTURE_COMMON_MODEL_H_
#define TESSERA_TESTS_STYLE_LAYERING_FIXTURE_COMMON_MODEL_H_

#include "io/file.h"

#endif  // TESSERA_TESTS_STYLE_LAYERING_FIXTURE_COMMON_MODEL_H_
