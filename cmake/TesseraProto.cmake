# tessera_add_proto_library(NAME PROTO_ROOT <dir> PROTOS <files...> [GRPC])
#
# Generates C++ code for the given .proto files into the build tree at build
# time (generated code is never committed) and wraps it in a static library
# NAME whose include path exposes "tessera/v1/foo.pb.h". With GRPC, service
# stubs are generated too (grpc_cpp_plugin).

find_program(TESSERA_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

function(tessera_add_proto_library name)
  cmake_parse_arguments(ARG "GRPC" "PROTO_ROOT" "PROTOS" ${ARGN})
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/gen)
  file(MAKE_DIRECTORY ${out_dir})
  set(srcs)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(abs ${proto} ABSOLUTE)
    file(RELATIVE_PATH rel ${ARG_PROTO_ROOT} ${abs})
    string(REGEX REPLACE "\\.proto$" "" stem ${rel})
    set(outs ${out_dir}/${stem}.pb.cc ${out_dir}/${stem}.pb.h)
    set(plugin_args)
    if(ARG_GRPC)
      list(APPEND outs ${out_dir}/${stem}.grpc.pb.cc ${out_dir}/${stem}.grpc.pb.h)
      set(plugin_args --grpc_out=${out_dir}
                      --plugin=protoc-gen-grpc=${TESSERA_GRPC_CPP_PLUGIN})
    endif()
    add_custom_command(
      OUTPUT ${outs}
      COMMAND protobuf::protoc --proto_path=${ARG_PROTO_ROOT}
              --cpp_out=${out_dir} ${plugin_args} ${abs}
      DEPENDS ${abs} protobuf::protoc
      COMMENT "protoc ${rel}"
      VERBATIM)
    list(APPEND srcs ${outs})
  endforeach()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${out_dir})
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf)
  if(ARG_GRPC)
    target_link_libraries(${name} PUBLIC gRPC::grpc++)
  endif()
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
