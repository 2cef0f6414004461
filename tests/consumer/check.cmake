# CTest script: installs the built accrue into a scratch prefix, then configures, builds and runs
# tests/consumer against it with find_package(accrue). Run with -DBUILD_DIR=... -DSOURCE_DIR=...
set(prefix ${BUILD_DIR}/consumer-check/prefix)
set(work ${BUILD_DIR}/consumer-check/build)
file(REMOVE_RECURSE ${BUILD_DIR}/consumer-check)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
# The install holds the public headers (cmake/public-headers.cmake) and nothing else.
include(${SOURCE_DIR}/cmake/public-headers.cmake)
set(header_dir ${prefix}/include/accrue)
file(GLOB_RECURSE installed RELATIVE ${header_dir} ${header_dir}/*.h)
list(SORT installed)
list(SORT ACCRUE_PUBLIC_HEADERS)
if(NOT installed STREQUAL ACCRUE_PUBLIC_HEADERS)
  set(extra ${installed})
  list(REMOVE_ITEM extra ${ACCRUE_PUBLIC_HEADERS})
  set(missing ${ACCRUE_PUBLIC_HEADERS})
  list(REMOVE_ITEM missing ${installed})
  message(FATAL_ERROR "installed headers differ from the public list: extra [${extra}], "
                      "missing [${missing}]")
endif()
# accrue.h, "the whole public API", includes every other public header.
file(READ ${SOURCE_DIR}/accrue.h umbrella)
foreach(header ${ACCRUE_PUBLIC_HEADERS})
  string(FIND "${umbrella}" "#include \"${header}\"" at)
  if(at EQUAL -1 AND NOT header STREQUAL "accrue.h")
    message(FATAL_ERROR "accrue.h does not include the public header ${header}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${work}
                -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
                -DACCRUE_HEADER_DIR=${header_dir} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
# CTest runs this test alone (RUN_SERIAL), so the build takes every core.
cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
execute_process(COMMAND ${CMAKE_COMMAND} --build ${work} --parallel ${cores} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${work}/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
