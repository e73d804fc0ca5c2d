# Script mode (cmake -P): fails when a folder of the source tree is missing
# from the architecture document, so that a reader finds every folder there.
#   cmake -DSOURCE_DIR=<root> -P CheckArchitectureDoc.cmake
#
# Every folder under common/ io/ wire/ client/ server/ python/ (the roots
# included) that holds a file must appear in docs/architecture.md as its
# path from the root with a trailing slash ("server/metrics/"), not as the
# tail of a longer path ("tests/server/metrics/" does not name it). Caches
# and build leftovers (__pycache__/, *.egg-info/, hidden folders) are not
# folders of the tree.
cmake_minimum_required(VERSION 3.25)

set(roots common io wire client server python)
set(doc docs/architecture.md)

if(NOT EXISTS "${SOURCE_DIR}/${doc}")
  message(FATAL_ERROR "architecture doc: ${doc} does not exist")
endif()
file(READ "${SOURCE_DIR}/${doc}" text)

set(folders)
foreach(root IN LISTS roots)
  file(GLOB_RECURSE found RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/${root}/*")
  foreach(file IN LISTS found)
    if(file MATCHES "(^|/)(__pycache__|[^/]*\\.egg-info|\\.[^/]*)/")
      continue()
    endif()
    get_filename_component(folder "${file}" DIRECTORY)
    list(APPEND folders "${folder}")
  endforeach()
endforeach()
list(REMOVE_DUPLICATES folders)
list(SORT folders)

set(missing)
foreach(folder IN LISTS folders)
  string(REGEX REPLACE "([][+.*?()^$|\\\\])" "\\\\\\1" pattern "${folder}/")
  if(NOT text MATCHES "(^|[^A-Za-z0-9_./-])${pattern}")
    list(APPEND missing "${folder}")
  endif()
endforeach()

list(LENGTH folders folder_count)
list(LENGTH missing missing_count)
if(missing_count GREATER 0)
  foreach(folder IN LISTS missing)
    message("  architecture doc: folder ${folder}/ is not named in ${doc}")
  endforeach()
  message("architecture doc: ${missing_count} of ${folder_count} folder(s) "
          "missing from ${doc}")
  message(FATAL_ERROR "architecture doc: failed, see the lines above")
endif()
list(JOIN roots "/ " scanned)
message(STATUS "architecture doc: all ${folder_count} folders of ${scanned}/ "
               "are named in ${doc}")
