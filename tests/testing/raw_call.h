// Calls of any gRPC method with raw request bytes, for tests that send
// what a generated stub cannot (malformed or mutated messages): unary,
// client-, server- or bidi-streaming alike, over the generic callback API.
#ifndef TESSERA_TESTS_TESTING_RAW_CALL_H_
#define TESSERA_TESTS_TESTING_RAW_CALL_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tessera::testing {

// One call: writes `messages`, half-closes, reads every response, and
// returns the status (the call ends by `timeout` at the latest).
class RawCall
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static grpc::Status Run(
      grpc::GenericStub& stub, const std::string& method,
      const std::vector<std::string>& messages, absl::Duration timeout,
      const std::vector<std::pair<std::string, std::string>>& metadata = {}) {
    RawCall call(messages);
    for (const auto& [key, value] : metadata) {
      call.context_.AddMetadata(key, value);
    }
    call.context_.set_deadline(std::chrono::system_clock::now() +
                               absl::ToChronoMilliseconds(timeout));
    stub.PrepareBidiStreamingCall(&call.context_, method, grpc::StubOptions(),
                                  &call);
    call.AddHold();  // Until the writes are done.
    call.StartRead(&call.read_);
    call.StartCall();
    call.WriteNext();
    call.done_.WaitForNotification();
    return call.status_;
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      RemoveHold();
      return;
    }
    WriteNext();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&read_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

 private:
  explicit RawCall(const std::vector<std::string>& messages)
      : messages_(messages) {}

  void WriteNext() {
    if (next_ == messages_.size()) {
      StartWritesDone();
      RemoveHold();
      return;
    }
    grpc::Slice slice(messages_[next_++]);
    write_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&write_);
  }

  const std::vector<std::string>& messages_;
  size_t next_ = 0;
  grpc::ClientContext context_;
  grpc::ByteBuffer write_;
  grpc::ByteBuffer read_;
  grpc::Status status_;
  absl::Notification done_;
};

// A call of `method` on `channel` with one request, `bytes`.
inline grpc::Status RawUnaryCall(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
    const std::string& bytes, absl::Duration timeout = absl::Seconds(10),
    const std::vector<std::pair<std::string, std::string>>& metadata = {}) {
  grpc::GenericStub stub(channel);
  return RawCall::Run(stub, method, {bytes}, timeout, metadata);
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_RAW_CALL_H_
