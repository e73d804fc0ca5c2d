// The native module sits on the client library; it may not include server/.
#include "client/client.h"
#include "common/model.h"
#include "server/rank/rank.h"
