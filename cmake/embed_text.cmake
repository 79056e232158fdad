# Writes OUTPUT: a C++ header defining `inline constexpr char NAME[]` in
# namespace kiln::codegen with the bytes of INPUT, as a raw string literal.
#   cmake -DINPUT=... -DOUTPUT=... -DNAME=... -P cmake/embed_text.cmake
file(READ "${INPUT}" text)
string(FIND "${text}" ")kiln_text\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string's delimiter")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_text.cmake; do not edit.\n"
  "#pragma once\nnamespace kiln::codegen {\n"
  "inline constexpr char ${NAME}[] = R\"kiln_text(${text})kiln_text\";\n}\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
