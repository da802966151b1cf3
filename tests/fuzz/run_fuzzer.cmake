# tests/fuzz/run_fuzzer.cmake - runs one bounded libFuzzer test for CTest (tests/fuzz/CMakeLists.txt):
#   cmake -DFUZZER=<binary> -DLOG=<file> [-DLAUNCH=setarch|x86_64|-R] -DARGS=<arg>|<arg>... -P
# (lists joined by |: a ; would split the -D argument in CTest's command line)
# The fuzzer's output (hundreds of coverage lines) goes to LOG, not to CTest: on a failure what is
# printed is what explains it - the exit status, the harness's finding, libFuzzer's and the
# sanitizers' reports, the saved input - so that it is what a CI log's excerpt shows.
# LAUNCH turns address-space randomization off (a reproducible walk); where the container forbids
# that (personality(2) refused), the run goes on without it and says so.
cmake_minimum_required(VERSION 3.16)
string(REPLACE "|" ";" LAUNCH "${LAUNCH}")
string(REPLACE "|" ";" ARGS "${ARGS}")

function(run_once launch result)
  execute_process(COMMAND ${launch} ${FUZZER} ${ARGS} RESULT_VARIABLE rc OUTPUT_FILE ${LOG}
                  ERROR_FILE ${LOG})
  set(${result} "${rc}" PARENT_SCOPE)
endfunction()

run_once("${LAUNCH}" rc)
if(NOT rc EQUAL 0 AND LAUNCH)
  file(READ ${LOG} text)
  if(text MATCHES "failed to set personality")
    message(STATUS "address-space randomization cannot be turned off here: the walk may differ "
                   "from run to run")
    run_once("" rc)
  endif()
endif()

file(STRINGS ${LOG} lines)
if(rc EQUAL 0)
  list(FILTER lines INCLUDE REGEX "^Done [0-9]+ runs")
  message(STATUS "${lines} (output: ${LOG})")
  return()
endif()

# What explains a failure: the harness's own messages (they quote the input), libFuzzer's and the
# sanitizers' reports with their first frames, the saved input, and the last lines before the end.
set(keep "")
set(frames 0)
foreach(line IN LISTS lines)
  if(line MATCHES "past the tolerance rule|parses, but|written \"|ERROR|SUMMARY|ALARM|deadly signal|out-of-memory|runtime error|Test unit written|Base64|^0x|base unit")
    list(APPEND keep "${line}")
    set(frames 0)
  elseif(line MATCHES "^ +#[0-9]+ " AND frames LESS 8)
    list(APPEND keep "${line}")
    math(EXPR frames "${frames} + 1")
  endif()
endforeach()
list(LENGTH lines count)
math(EXPR from "${count} - 5")
if(from LESS 0)
  set(from 0)
endif()
list(SUBLIST lines ${from} 5 tail)
string(REPLACE ";" "\n  " keep "${keep}")
string(REPLACE ";" "\n  " tail "${tail}")
message(FATAL_ERROR "${FUZZER} exited with ${rc}.\nWhat its output says of it:\n  ${keep}\n"
                    "Its last lines:\n  ${tail}\nThe whole output: ${LOG}")
