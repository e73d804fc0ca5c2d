// Blocking TCP I/O with deadlines, for the raw data plane (bulk_server.h,
// ShardClient). Every call is bounded by an absolute deadline and returns
// DEADLINE_EXCEEDED when it passes, UNAVAILABLE when the peer is gone or
// the connection fails; nothing blocks forever and SIGPIPE is never
// raised (MSG_NOSIGNAL).
//
// Thread-compatible: one thread per file descriptor at a time.
#ifndef TESSERA_CLIENT_SOCKET_IO_H_
#define TESSERA_CLIENT_SOCKET_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tessera {

// The magic that opens every data-plane connection.
inline constexpr absl::string_view kBulkMagic = "TSRBULK1";
// Largest control frame (request or reply) either side accepts.
inline constexpr uint32_t kMaxBulkFrameBytes = 1 << 20;
// Size of the binary prefix of each chunk: offset, length, checksum.
inline constexpr size_t kBulkChunkPrefixBytes = 24;

// An owned file descriptor, closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  ~Socket();
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  // Wakes any thread blocked on the socket (shutdown(2)); does not close.
  void Interrupt() const;

 private:
  int fd_ = -1;
};

// Connects to "host:port" (IPv4 or a resolvable name).
absl::StatusOr<Socket> ConnectTcp(const std::string& address,
                                  absl::Time deadline);
// Listens on `host`:0 (an ephemeral port); returns the socket and port.
absl::StatusOr<std::pair<Socket, int>> ListenTcp(const std::string& host);

absl::Status ReadFull(int fd, void* data, size_t size, absl::Time deadline);
// `more` says more data follows at once (MSG_MORE), so small pieces of one
// reply leave in one segment despite TCP_NODELAY.
absl::Status WriteFull(int fd, const void* data, size_t size,
                       absl::Time deadline, bool more = false);
// A length-prefixed frame; INVALID_ARGUMENT / DATA_LOSS for one larger than
// kMaxBulkFrameBytes.
absl::Status WriteFrame(int fd, absl::string_view payload, absl::Time deadline,
                        bool more = false);
absl::StatusOr<std::string> ReadFrame(int fd, absl::Time deadline);

// Little-endian fixed-width integers (the chunk prefix).
void StoreLe64(uint64_t value, char* out);
uint64_t LoadLe64(const char* in);

}  // namespace tessera

#endif  // TESSERA_CLIENT_SOCKET_IO_H_
