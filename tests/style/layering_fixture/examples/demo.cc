// An example sits on the client library; the tessera tool is another front
// end, which it may not include.
#include "client/cli/command.h"
#include "client/client.h"
