# Finds the CUDA runtime and NCCL according to TESSERA_WITH_CUDA.
#
# Sets TESSERA_CUDA_FOUND / TESSERA_NCCL_FOUND and, when found, the imported
# targets CUDA::cudart and tessera::nccl. Nothing here needs a GPU: the toolkit
# is enough to compile; tests decide at run time whether a device is visible.

set(TESSERA_CUDA_FOUND OFF)
set(TESSERA_NCCL_FOUND OFF)

if(NOT TESSERA_WITH_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  if(TESSERA_WITH_CUDA STREQUAL "ON")
    find_package(CUDAToolkit REQUIRED)
  else()
    find_package(CUDAToolkit QUIET)
  endif()

  if(CUDAToolkit_FOUND)
    set(TESSERA_CUDA_FOUND ON)
    find_path(TESSERA_NCCL_INCLUDE_DIR nccl.h
              HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
              PATH_SUFFIXES include)
    find_library(TESSERA_NCCL_LIBRARY nccl
                 HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
                 PATH_SUFFIXES lib lib64)
    if(TESSERA_NCCL_INCLUDE_DIR AND TESSERA_NCCL_LIBRARY)
      set(TESSERA_NCCL_FOUND ON)
      add_library(tessera::nccl UNKNOWN IMPORTED)
      set_target_properties(tessera::nccl PROPERTIES
        IMPORTED_LOCATION ${TESSERA_NCCL_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${TESSERA_NCCL_INCLUDE_DIR})
    elseif(TESSERA_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "TESSERA_WITH_CUDA=ON but NCCL (nccl.h, libnccl) "
                          "was not found; set NCCL_HOME")
    endif()
  elseif(TESSERA_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_WITH_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
