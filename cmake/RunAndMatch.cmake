# RunAndMatch.cmake - runs PROGRAM and passes when it exits 0 and its output matches EXPECT.
# CTest's PASS_REGULAR_EXPRESSION would ignore the exit status; this checks both.
#   cmake -DPROGRAM=path -DEXPECT=regex -P RunAndMatch.cmake
execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${rc}")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "output of ${PROGRAM} does not match ${EXPECT}")
endif()
