# The CPU backend's BLAS as one imported target, accrue::cblas: OpenBLAS's library (FindBLAS's
# BLAS::BLAS) with the cblas.h that belongs to it. Debian installs several OpenBLAS variants
# side by side (openmp, pthread, serial), each with its own cblas.h under
# include/<multiarch>/<variant>; the variant is read off the real path of the library that was
# found, so header and library always match.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
list(GET BLAS_LIBRARIES 0 accrue_blas_library)
file(REAL_PATH "${accrue_blas_library}" accrue_blas_real)
get_filename_component(accrue_blas_dir "${accrue_blas_real}" DIRECTORY)
get_filename_component(accrue_blas_variant "${accrue_blas_dir}" NAME)  # e.g. openblas-openmp
# <prefix>/lib/<multiarch>/<variant>/libopenblas.so -> <prefix>/include/<multiarch>/<variant>
get_filename_component(accrue_blas_prefix "${accrue_blas_dir}/../../.." ABSOLUTE)
# The variant's own folder first and alone: the generic include/<multiarch>/cblas.h is a Debian
# alternative that may belong to another BLAS (BLIS installs one too).
find_path(ACCRUE_CBLAS_INCLUDE_DIR cblas.h
  PATHS ${accrue_blas_prefix}/include/${CMAKE_LIBRARY_ARCHITECTURE}/${accrue_blas_variant}
  NO_DEFAULT_PATH)
find_path(ACCRUE_CBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE}/${accrue_blas_variant} ${CMAKE_LIBRARY_ARCHITECTURE}
                openblas REQUIRED)
add_library(accrue_cblas INTERFACE IMPORTED)
target_include_directories(accrue_cblas INTERFACE ${ACCRUE_CBLAS_INCLUDE_DIR})
target_link_libraries(accrue_cblas INTERFACE BLAS::BLAS)
add_library(accrue::cblas ALIAS accrue_cblas)
message(STATUS "accrue: BLAS ${accrue_blas_real}, cblas.h in ${ACCRUE_CBLAS_INCLUDE_DIR}")

# cblas_sbgemm (bfloat16 operands, float32 C) exists only in an OpenBLAS built with
# BUILD_BFLOAT16; Debian's 0.3.21 declares it in cblas.h but does not export it, so the check
# links. Without it the CPU backend converts bfloat16 panels to float32 (kernels/cpu/gemm.cpp).
include(CheckSymbolExists)
set(CMAKE_REQUIRED_INCLUDES ${ACCRUE_CBLAS_INCLUDE_DIR})
set(CMAKE_REQUIRED_LIBRARIES ${BLAS_LIBRARIES})
set(CMAKE_REQUIRED_QUIET ON)
check_symbol_exists(cblas_sbgemm "cblas.h" ACCRUE_HAVE_SBGEMM)
unset(CMAKE_REQUIRED_INCLUDES)
unset(CMAKE_REQUIRED_LIBRARIES)
unset(CMAKE_REQUIRED_QUIET)
if(ACCRUE_HAVE_SBGEMM)
  target_compile_definitions(accrue_cblas INTERFACE ACCRUE_HAVE_SBGEMM=1)
endif()
message(STATUS "accrue: cblas_sbgemm ${ACCRUE_HAVE_SBGEMM}")
