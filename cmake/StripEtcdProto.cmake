# cmake -DIN=<etcd .proto> -DOUT=<stripped copy> -P StripEtcdProto.cmake
#
# etcd's .proto files (Debian's golang-etcd-server-dev) carry annotations
# for Go code generators and the HTTP gateway: gogoproto options and
# google.api.http routes, whose own .proto files Debian does not ship for
# C++. They change nothing on the wire; this drops them so that protoc can
# compile the messages and services as they are.
file(READ "${IN}" text)
# import "gogoproto/gogo.proto"; import "google/api/annotations.proto";
string(REGEX REPLACE "import \"(gogoproto|google/api)/[^\"]*\";" "" text "${text}")
# option (gogoproto.marshaler_all) = true;
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
# option (google.api.http) = { post: "/v3/kv/range" body: "*" }; with at
# most one level of nested braces (additional_bindings { ... }).
string(REGEX REPLACE
       "option \\(google\\.api\\.http\\) = {([^{}]*{[^{}]*})*[^{}]*};" ""
       text "${text}")
# Field options: [(gogoproto.nullable) = false]
string(REGEX REPLACE "\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api")
  message(FATAL_ERROR "${IN}: annotations left after stripping; "
                      "this etcd version needs StripEtcdProto.cmake updated")
endif()
file(WRITE "${OUT}" "${text}")
