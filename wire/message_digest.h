// MessageDigest: a 64-bit digest of a protobuf message, the same wherever
// the message is made or parsed, so that two processes can tell whether
// they hold the same message without sending it: a client's cached
// description of a tensor against what the daemon would answer now
// (DescribeDigestRequest, Client::Open), a retried operation against the
// one committed under its request id (OpOutcomes).
//
// Thread-safety: a pure function.
#ifndef TESSERA_WIRE_MESSAGE_DIGEST_H_
#define TESSERA_WIRE_MESSAGE_DIGEST_H_

#include <cstdint>

#include "google/protobuf/message_lite.h"

namespace tessera {

// XXH3-64 of `message`'s deterministic serialization. Equal messages (field
// by field, unknown fields included) have equal digests; a digest that
// differs means the message differs.
uint64_t MessageDigest(const google::protobuf::MessageLite& message);

}  // namespace tessera

#endif  // TESSERA_WIRE_MESSAGE_DIGEST_H_
