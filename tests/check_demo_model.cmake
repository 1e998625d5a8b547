# The shipped demo model scores the held-out text on the CPU backend at the perplexity docs/quality.md documents.
# The documented figure is read from the line "CPU perplexity of the shipped model on `data/eval.txt`: **X**".
# Tolerance: relative 1e-4. The CPU reference is bitwise reproducible for any thread count on one build; builds
# that fuse multiply-adds (AArch64) or run the portable kernel round differently, by ~1e-7 relative per operation,
# far inside 1e-4 (docs/architecture.md).
execute_process(COMMAND ${TOOL} score ${MODEL} --text ${TEXT} --backend cpu
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tinyloop score failed (${rc}): ${err}")
endif()
if(NOT out MATCHES "perplexity +([0-9.]+)")
  message(FATAL_ERROR "no perplexity in the output:\n${out}")
endif()
set(measured ${CMAKE_MATCH_1})
file(READ ${DOC} doc)
if(NOT doc MATCHES "CPU perplexity of the shipped model on `data/eval.txt`: \\*\\*([0-9.]+)\\*\\*")
  message(FATAL_ERROR "${DOC} has no line 'CPU perplexity of the shipped model on `data/eval.txt`: **X**'")
endif()
set(documented ${CMAKE_MATCH_1})
# CMake has no floating point arithmetic; python3 (a test dependency already) compares.
message(STATUS "measured ${measured}, documented ${documented}")
execute_process(COMMAND python3 -c
  "import sys; m, d = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(m - d) <= 1e-4 * d else 1)"
  ${measured} ${documented} RESULT_VARIABLE close)
if(NOT close EQUAL 0)
  message(FATAL_ERROR "perplexity ${measured} differs from the documented ${documented} by more than 1e-4 relative")
endif()
