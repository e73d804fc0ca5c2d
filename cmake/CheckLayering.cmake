# Script mode (cmake -P): fails when a source file includes a header from a
# layer it may not include, so that docs/architecture.md's picture stays true.
#   cmake -DSOURCE_DIR=<root> -P CheckLayering.cmake
#
# Every folder under common/ io/ wire/ client/ server/ python/ examples/ that
# holds a .h, .cc or .cu file belongs to exactly one layer of the table below;
# a folder the table does not name is itself a failure (a new folder is placed
# on purpose, never skipped).
cmake_minimum_required(VERSION 3.25)

# The layers, lowest first: "<layer> <rank> [<folder that belongs to it>...]".
# A file may include headers of its own layer and of the layers of a smaller
# rank, except as the rules below say. "proto" is the generated wire contract
# ("tessera/v1/...", "grpc/health/...").
set(layers
  "proto              0"
  "common             1  common/tensor"
  "io                 1"
  "wire               2"
  "client             3"
  "client/cli         4  client/cli/launch"
  "python             4  python/bindings"
  "examples           4"
  "server/metrics     5"
  "server/store       6"
  "server/collective  7  server/collective/gloo server/collective/nccl"
  "server/serve       8"
  "server/rank        9"
  "server/sharded    10"
  "server/checkpoint 11"
  "server/daemon     12")
set(roots common io wire client server python examples)

# Layers of one rank are siblings: neither includes the other (common/ and
# io/; the three front ends of the client library: client/cli/, python/ and
# examples/). The front ends sit on the client library and nothing else
# includes them. Besides: io/ includes nothing of Tessera at all.
set(front_ends client/cli python examples)
set(forbidden
  "io wire"
  "io proto")

# server/ and client/. The shard server and everything under it only serve;
# server/rank/ and the layers above it act as clients of their peers, through
# the peer-fetch headers of client/ and no other. server/ never includes the
# user-facing Client (client/client.h) nor the tessera tool (client/cli/).
set(peer_client_layers
  server/rank
  server/sharded
  server/checkpoint
  server/daemon)
set(peer_fetch_headers
  client/shard_client.h
  client/region_transfer.h
  client/local_path.h
  client/lanes.h
  client/stall_watchdog.h
  client/remote_shard.h)

set(names)
set(folders)
foreach(entry IN LISTS layers)
  string(REGEX REPLACE " +" ";" fields "${entry}")
  list(POP_FRONT fields name rank)
  list(APPEND names "${name}")
  set(rank_${name} "${rank}")
  foreach(folder IN ITEMS ${name} ${fields})
    list(APPEND folders "${folder}")
    set(layer_${folder} "${name}")
  endforeach()
endforeach()

# The layer of an included project path ("server/serve/fetch.h"): that of the
# longest table folder it lies in, or "" for a header of no layer (absl/,
# grpcpp/ ...).
function(layer_of_include path out)
  set(best "")
  set(best_length 0)
  if(path MATCHES "^(tessera/v1/|grpc/health/)")
    set(best proto)
  endif()
  foreach(folder IN LISTS folders)
    string(LENGTH "${folder}" length)
    if(path MATCHES "^${folder}/" AND length GREATER best_length)
      set(best "${layer_${folder}}")
      set(best_length ${length})
    endif()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

set(files)
foreach(dir IN LISTS roots)
  file(GLOB_RECURSE found RELATIVE "${SOURCE_DIR}"
       "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.cc"
       "${SOURCE_DIR}/${dir}/*.cu")
  list(APPEND files ${found})
endforeach()
list(SORT files)

set(violations)
set(unlisted)
set(checked 0)
foreach(file IN LISTS files)
  get_filename_component(folder "${file}" DIRECTORY)
  if(NOT DEFINED layer_${folder})
    if(NOT folder IN_LIST unlisted)
      list(APPEND unlisted "${folder}")
      list(APPEND violations "layering: folder ${folder}/ is not in the layer table")
    endif()
    continue()
  endif()
  set(from "${layer_${folder}}")
  file(STRINGS "${SOURCE_DIR}/${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"([^\"]+)\"" _ "${line}")
    set(included "${CMAKE_MATCH_1}")
    if(included MATCHES "^tests/")
      list(APPEND violations "${file} includes \"${included}\" (tests/ is not a layer)")
      continue()
    endif()
    layer_of_include("${included}" to)
    if(to STREQUAL "" OR to STREQUAL from)
      continue()
    endif()
    math(EXPR checked "${checked} + 1")
    set(reason "")
    if(from MATCHES "^server/" AND to MATCHES "^client")
      if(to STREQUAL "client/cli")
        set(reason "server/ never includes client/cli/, the tessera tool")
      elseif(included STREQUAL "client/client.h")
        set(reason "server/ never includes client/client.h, the user-facing Client")
      elseif(NOT from IN_LIST peer_client_layers)
        set(reason "${from}/ only serves: it may not include client/")
      elseif(NOT included IN_LIST peer_fetch_headers)
        string(REPLACE ";" ", " allowed "${peer_fetch_headers}")
        set(reason "server/ may include only client/'s peer-fetch headers: ${allowed}")
      endif()
    elseif(to IN_LIST front_ends)
      set(reason "${to}/ is a front end: nothing outside it includes it")
    elseif(rank_${to} GREATER rank_${from})
      set(reason "${from}/ may not include ${to}/, a layer above it")
    elseif(rank_${to} EQUAL rank_${from})
      set(reason "${from}/ and ${to}/ are siblings: neither includes the other")
    elseif("${from} ${to}" IN_LIST forbidden)
      set(reason "${from}/ may not include ${to}/")
    endif()
    if(NOT reason STREQUAL "")
      list(APPEND violations "${file} includes \"${included}\" (${reason})")
    endif()
  endforeach()
endforeach()

list(LENGTH files file_count)
list(LENGTH unlisted unlisted_count)
list(LENGTH violations violation_count)
if(violation_count GREATER 0)
  foreach(violation IN LISTS violations)
    message("  ${violation}")
  endforeach()
  math(EXPR include_count "${violation_count} - ${unlisted_count}")
  message("layering: ${include_count} include(s) against docs/architecture.md's "
          "layers, ${unlisted_count} folder(s) not in the layer table")
  message(FATAL_ERROR "layering: failed, see the lines above")
endif()
list(JOIN roots "/ " scanned)
message(STATUS "layering: ${file_count} files in ${scanned}/, ${checked} project "
               "includes across layers, every include allowed")
