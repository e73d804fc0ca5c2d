# Finds what the Python package (python/) needs according to
# TESSERA_WITH_PYTHON: Debian's interpreter /usr/bin/python3 (a python3
# earlier on PATH may lack the Debian packages), its headers and pybind11.
#
# Sets TESSERA_PYTHON_FOUND and, when found, Python3_EXECUTABLE and
# TESSERA_PYTHON_SITE (the interpreter's site-packages, where cmake
# --install puts the package). Sanitizer builds leave Python out: an
# instrumented extension cannot load into an uninstrumented interpreter.
# The module links the static libraries, so they are compiled as
# position-independent code.

set(TESSERA_WITH_PYTHON AUTO CACHE STRING
    "Build the Python package: AUTO (when found), ON (required) or OFF")
set_property(CACHE TESSERA_WITH_PYTHON PROPERTY STRINGS AUTO ON OFF)

set(TESSERA_PYTHON_FOUND OFF)
if(TESSERA_WITH_PYTHON STREQUAL "OFF")
  return()
endif()
if(TESSERA_SANITIZE)
  if(TESSERA_WITH_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_WITH_PYTHON=ON cannot go with "
                        "TESSERA_SANITIZE (the interpreter is not instrumented)")
  endif()
  return()
endif()

if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3)
endif()
if(TESSERA_WITH_PYTHON STREQUAL "ON")
  find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG REQUIRED)
else()
  find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG QUIET)
endif()
if(Python3_FOUND AND pybind11_FOUND)
  set(TESSERA_PYTHON_FOUND ON)
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
            "import sysconfig; print(sysconfig.get_path('platlib'))"
    OUTPUT_VARIABLE TESSERA_PYTHON_SITE
    OUTPUT_STRIP_TRAILING_WHITESPACE)
elseif(TESSERA_WITH_PYTHON STREQUAL "ON")
  message(FATAL_ERROR "TESSERA_WITH_PYTHON=ON but python3-dev or "
                      "pybind11-dev is missing")
endif()
