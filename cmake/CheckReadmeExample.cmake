# CheckReadmeExample.cmake - passes when the first ```c block of README equals the file EXAMPLE, so
# the code a reader copies is the code the test suite compiles and runs.
#   cmake -DREADME=README.md -DEXAMPLE=examples/hello.c -P CheckReadmeExample.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "```c\n" begin)
if(begin LESS 0)
  message(FATAL_ERROR "${README} has no ```c block")
endif()
math(EXPR begin "${begin} + 5")
string(SUBSTRING "${readme}" ${begin} -1 rest)
string(FIND "${rest}" "```" end)
if(end LESS 0)
  message(FATAL_ERROR "${README}: the ```c block is not closed")
endif()
string(SUBSTRING "${rest}" 0 ${end} block)
if(NOT block STREQUAL example)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/readme_example.c" "${block}")
  message(FATAL_ERROR "the ```c block of ${README} differs from ${EXAMPLE}; compare with\n"
                      "  diff ${CMAKE_CURRENT_BINARY_DIR}/readme_example.c ${EXAMPLE}\n"
                      "and make them equal (the example is compiled and run; the README is not)")
endif()
message("README example == ${EXAMPLE}")
