# The include-direction check must fail on a violation: builds a tiny tree in which a base file
# includes a kernels header, runs tests/layers.cmake on it and expects it to name that include.
# Run as a test: cmake -DCHECK=<tests/layers.cmake> -DWORK_DIR=<scratch> -P layers_selftest.cmake
file(REMOVE_RECURSE "${WORK_DIR}")
file(WRITE "${WORK_DIR}/core/tensor.h" "#pragma once\n#include \"core/dtype.h\"\n")
file(WRITE "${WORK_DIR}/kernels/backend.h" "#pragma once\n#include \"core/tensor.h\"\n")
file(WRITE "${WORK_DIR}/core/bad.cpp" "#include \"core/tensor.h\"\n#include \"kernels/backend.h\"\n")
execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${WORK_DIR} -P ${CHECK}
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(status EQUAL 0)
  message(FATAL_ERROR "layers.cmake accepted core/bad.cpp including kernels/backend.h")
endif()
if(NOT err MATCHES "core/bad.cpp includes kernels/backend.h: core may include core and nothing")
  message(FATAL_ERROR "layers.cmake failed without naming the include:\n${err}")
endif()
file(REMOVE "${WORK_DIR}/core/bad.cpp")
execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${WORK_DIR} -P ${CHECK}
                RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "layers.cmake rejected a tree that keeps the order:\n${err}")
endif()
message(STATUS "layers self-test: the violation was named and the clean tree passed")
