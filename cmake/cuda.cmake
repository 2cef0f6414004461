# Resolves ACCRUE_CUDA (AUTO / ON / OFF) into ACCRUE_WITH_CUDA and, when on, enables the CUDA
# language, finds the toolkit and finds cuDNN. Architectures default to Ampere and
# Hopper (80;86;89;90); CI (CI=true) builds one architecture to keep 2-core compiles short.
# Each layer lists its own CUDA sources (CMakeLists.txt, accrue_layer).
set(ACCRUE_WITH_CUDA OFF)
if(NOT ACCRUE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(ACCRUE_WITH_CUDA ON)
  elseif(ACCRUE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ACCRUE_CUDA=ON but no CUDA compiler (nvcc) was found; install the CUDA "
                        "toolkit, set CUDACXX, or configure with -DACCRUE_CUDA=OFF")
  endif()
endif()

if(ACCRUE_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    if(DEFINED ENV{CI})
      set(CMAKE_CUDA_ARCHITECTURES 90)
    else()
      set(CMAKE_CUDA_ARCHITECTURES 80 86 89 90)
    endif()
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "accrue: CUDA backend ON (architectures: ${CMAKE_CUDA_ARCHITECTURES})")
  # cuDNN 9 (convolutions) sits beside the toolkit in NVIDIA's images and packages; without it
  # the CUDA convolution primitives throw, saying so.
  find_path(ACCRUE_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(ACCRUE_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR}
               ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  if(ACCRUE_CUDNN_INCLUDE_DIR AND ACCRUE_CUDNN_LIBRARY)
    set(ACCRUE_WITH_CUDNN ON)
    message(STATUS "accrue: cuDNN ${ACCRUE_CUDNN_LIBRARY}")
  else()
    set(ACCRUE_WITH_CUDNN OFF)
    message(STATUS "accrue: no cuDNN found: CUDA convolutions will throw")
  endif()
else()
  message(STATUS "accrue: CUDA backend OFF (ACCRUE_CUDA=${ACCRUE_CUDA})")
endif()
