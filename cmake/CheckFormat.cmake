# Script mode (cmake -P): fails when any C++ source under the project's
# layers is not formatted as .clang-format says.
#   cmake -DCLANG_FORMAT=<exe> -DSOURCE_DIR=<root> -P CheckFormat.cmake
set(files)
foreach(dir common io wire client server tests examples)
  file(GLOB_RECURSE found ${SOURCE_DIR}/${dir}/*.h ${SOURCE_DIR}/${dir}/*.cc
       ${SOURCE_DIR}/${dir}/*.cu)
  list(APPEND files ${found})
endforeach()
list(LENGTH files count)
execute_process(
  COMMAND ${CLANG_FORMAT} --dry-run -Werror --style=file ${files}
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "clang-format: files above are not formatted; run "
                      "clang-format -i on them")
endif()
message(STATUS "clang-format: ${count} files formatted")
