# cmake -DIN=file -DOUT=file.cpp -DNAME=kSymbol -P embed_text.cmake: writes a C++ source that
# defines `const char NAME[]` (the file's bytes as a raw string literal) and
# `const unsigned long NAME##Size`, in namespace skippy::server.
file(READ "${IN}" content)
string(FIND "${content}" ")skippy_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw string delimiter )skippy_embed\"")
endif()
file(WRITE "${OUT}"
  "// Generated from ${IN} by embed_text.cmake; do not edit.\n"
  "namespace skippy::server {\n"
  "extern const char ${NAME}[];\n"
  "extern const unsigned long ${NAME}Size;\n"
  "const char ${NAME}[] = R\"skippy_embed(${content})skippy_embed\";\n"
  "const unsigned long ${NAME}Size = sizeof(${NAME}) - 1;\n"
  "}  // namespace skippy::server\n")
