# Compiles one source file against the header as it is now on disk, links it and runs it (cmake -P).
# Inputs: -DCOMPILER=... -DFLAGS=<;-list> -DINCLUDE_DIR=... -DSOURCE=... -DOUTPUT=<executable to write>
execute_process(COMMAND ${COMPILER} ${FLAGS} -I${INCLUDE_DIR} ${SOURCE} -o ${OUTPUT}
  RESULT_VARIABLE compile_result OUTPUT_VARIABLE compile_output ERROR_VARIABLE compile_output)
if(NOT compile_result EQUAL 0)
  list(JOIN FLAGS " " flags_text)
  message(FATAL_ERROR "${SOURCE} does not compile with ${flags_text}:\n${compile_output}")
endif()
execute_process(COMMAND ${OUTPUT} RESULT_VARIABLE run_result)
if(NOT run_result EQUAL 0)
  message(FATAL_ERROR "${OUTPUT} failed (${run_result})")
endif()
