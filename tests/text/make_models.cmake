# Imports make_tokenizer_cases.py's checkpoints with `tinyloop import`: CASES/models/NAME.tinyloop for each.
#   cmake -DTOOL=<tinyloop> -DCASES=<the script's folder> -P make_models.cmake
file(MAKE_DIRECTORY ${CASES}/models)
foreach(name gpt2 gpt2_prefix llama3 qwen2 sentencepiece none)
  execute_process(COMMAND ${TOOL} import ${CASES}/ckpt_${name} --out ${CASES}/models/${name}.tinyloop
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tinyloop import ${CASES}/ckpt_${name} failed (${rc}): ${out}${err}")
  endif()
endforeach()
