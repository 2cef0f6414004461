# The include-direction check: every source file of a layer includes headers of its own layer
# and the layers below it only. Run as a test: cmake -DSOURCE_DIR=<repo> -P tests/layers.cmake.
# The table, bottom to top (each layer is also its own CMake library linking only downward):
#   core -> kernels -> ops -> nn -> optim -> distributed -> train -> examples
# tests/ and bench/ sit above everything and may include any layer.
set(layers core kernels ops nn optim distributed train examples)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "layers.cmake: pass -DSOURCE_DIR=<the repository>")
endif()

set(violations "")
set(checked 0)
list(LENGTH layers layer_count)
math(EXPR last "${layer_count} - 1")
foreach(level RANGE ${last})
  list(GET layers ${level} layer)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${layer}/*.h" "${SOURCE_DIR}/${layer}/*.cpp"
       "${SOURCE_DIR}/${layer}/*.cu" "${SOURCE_DIR}/${layer}/*.cuh")
  foreach(file ${files})
    math(EXPR checked "${checked} + 1")
    file(STRINGS "${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
    foreach(line ${includes})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" header "${line}")
      string(REGEX MATCH "^[^/]+" top "${header}")
      list(FIND layers "${top}" target)
      if(target GREATER level)
        file(RELATIVE_PATH rel "${SOURCE_DIR}" "${file}")
        list(SUBLIST layers 0 ${level} below)
        list(JOIN below ", " below_text)
        if(below_text STREQUAL "")
          set(below_text "nothing")
        endif()
        string(APPEND violations
               "  ${rel} includes ${header}: ${layer} may include ${layer} and ${below_text} only\n")
      endif()
    endforeach()
  endforeach()
endforeach()

if(checked EQUAL 0)
  message(FATAL_ERROR "layers.cmake: no source files under ${SOURCE_DIR}")
endif()
if(violations)
  message(FATAL_ERROR "includes against the layer order (${layers}):\n${violations}")
endif()
message(STATUS "layers: ${checked} files include only their own layer and the layers below")
