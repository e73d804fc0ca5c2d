# Script mode (cmake -P): fails when a source file includes a header from a
# layer above its own, so that docs/architecture.md's picture stays true.
#   cmake -DSOURCE_DIR=<root> -P CheckLayering.cmake
#
# The layers, lowest first. A file may include headers of its own layer and
# of the layers below; "proto" is the generated wire contract
# ("tessera/v1/...", "grpc/health/..."). io/ and common/ are siblings:
# neither includes the other. The longest matching folder names a file's
# layer (server/collective/gloo/ belongs to server/collective/).
cmake_minimum_required(VERSION 3.25)

set(layers
  "proto            0"
  "common           1"
  "io               1"
  "wire             2"
  "client           3"
  "client/cli       4"
  "server/store     5"
  "server/collective 6"
  "server/serve     7"
  "server/rank      8"
  "server/sharded   9"
  "server/checkpoint 10"
  "server/daemon    11")
# Pairs "from to" that are forbidden although the ranks would allow them:
# the shard server and everything under it only serve; acting as a client of
# peers starts with server/rank/.
set(forbidden
  "server/store client"
  "server/collective client"
  "server/serve client"
  "common io"
  "io common"
  "io wire"
  "io proto")

set(names)
foreach(entry IN LISTS layers)
  string(REGEX MATCH "^([^ ]+) +([0-9]+)$" _ "${entry}")
  list(APPEND names "${CMAKE_MATCH_1}")
  set(rank_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
endforeach()

# The layer of a project path ("server/serve/fetch.h"), or "" for a header
# of no layer (absl/, grpcpp/, tests/ ...).
function(layer_of path out)
  set(best "")
  if(path MATCHES "^(tessera/v1/|grpc/health/)")
    set(best proto)
  endif()
  foreach(name IN LISTS names)
    if(name STREQUAL "proto")
      continue()
    endif()
    string(LENGTH "${name}" length)
    string(LENGTH "${best}" best_length)
    if(path MATCHES "^${name}/" AND length GREATER best_length)
      set(best "${name}")
    endif()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

set(files)
foreach(dir common io wire client server)
  file(GLOB_RECURSE found RELATIVE "${SOURCE_DIR}"
       "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.cc"
       "${SOURCE_DIR}/${dir}/*.cu")
  list(APPEND files ${found})
endforeach()

set(violations)
set(checked 0)
foreach(file IN LISTS files)
  layer_of("${file}" from)
  file(STRINGS "${SOURCE_DIR}/${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"([^\"]+)\"" _ "${line}")
    set(included "${CMAKE_MATCH_1}")
    if(included MATCHES "^tests/")
      list(APPEND violations "${file} includes \"${included}\" (tests/ is not a layer)")
      continue()
    endif()
    layer_of("${included}" to)
    if(to STREQUAL "")
      continue()
    endif()
    math(EXPR checked "${checked} + 1")
    if(rank_${to} GREATER rank_${from})
      list(APPEND violations
           "${file} includes \"${included}\" (${from}/ may not include ${to}/, a layer above it)")
    elseif(NOT to STREQUAL from AND "${from} ${to}" IN_LIST forbidden)
      list(APPEND violations
           "${file} includes \"${included}\" (${from}/ may not include ${to}/)")
    endif()
  endforeach()
endforeach()

list(LENGTH files file_count)
list(LENGTH violations violation_count)
if(violation_count GREATER 0)
  foreach(violation IN LISTS violations)
    message("  ${violation}")
  endforeach()
  message(FATAL_ERROR "layering: ${violation_count} include(s) against "
                      "docs/architecture.md's layers")
endif()
message(STATUS "layering: ${file_count} files, ${checked} project includes, "
               "no layer includes one above it")
