# Runs a program of the CUDA-enabled build with the CUDA libraries out of the loader's reach: its dynamic loader
# is started with --inhibit-cache (no ld.so.cache, so /usr/local/cuda and other configured folders are not searched)
# and only the library's own folder added. Checks that cuBLAS really is unreachable there (a dlopen of it fails) and
# that the program still loads libtinyloop and scores on the CPU.
#   cmake -DREADELF=... -DLIBDIR=... -DPROGRAM=<score_text_c> -DPROBE=<score_dlopen> -DMODEL=... -DTEXT=...
#         -DCUBLAS=<libcublas soname> -P run_without_cuda.cmake
execute_process(COMMAND ${READELF} -l ${PROGRAM} OUTPUT_VARIABLE headers)
string(REGEX MATCH "interpreter: ([^]\n]+)\\]" interp "${headers}")
set(loader ${CMAKE_MATCH_1})
if(NOT loader)
  message(FATAL_ERROR "no program interpreter in ${PROGRAM}")
endif()
set(hidden ${loader} --inhibit-cache --library-path ${LIBDIR})

execute_process(COMMAND ${hidden} ${PROBE} ${CUBLAS} ${MODEL} ${TEXT} RESULT_VARIABLE probe_rc
  OUTPUT_VARIABLE probe_out ERROR_VARIABLE probe_err)
if(probe_rc EQUAL 0 OR NOT "${probe_out}${probe_err}" MATCHES "dlopen: ${CUBLAS}: cannot open")
  message(FATAL_ERROR "${CUBLAS} is still reachable with the cache inhibited: ${probe_out}${probe_err}")
endif()

execute_process(COMMAND ${hidden} ${PROGRAM} ${MODEL} ${TEXT} RESULT_VARIABLE rc OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "perplexity [0-9]")
  message(FATAL_ERROR "without the CUDA libraries ${PROGRAM} failed (${rc}): ${out}${err}")
endif()
message(STATUS "${CUBLAS} unreachable; ${out}")
