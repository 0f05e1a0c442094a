# Imported targets for the pinned llama.cpp build made by scripts/setup
# (source and build live outside the repo, under ~/.cache/skippy).
set(SKIPPY_LLAMA_SRC "" CACHE PATH "llama.cpp source tree (from scripts/setup)")
set(SKIPPY_LLAMA_BUILD "" CACHE PATH "llama.cpp build tree (from scripts/setup)")
# Without -D values: the file scripts/setup writes into the repo's build/ folder (found
# relative to this file, so fuzz/'s standalone project reads it too).
set(_llama_paths_file "${CMAKE_CURRENT_LIST_DIR}/../build/llama-paths.env")
if(NOT SKIPPY_LLAMA_SRC OR NOT SKIPPY_LLAMA_BUILD)
  if(EXISTS "${_llama_paths_file}")
    file(STRINGS "${_llama_paths_file}" _llama_paths)
    foreach(_line IN LISTS _llama_paths)
      if(_line MATCHES "^LLAMA_SRC=(.*)$")
        set(SKIPPY_LLAMA_SRC "${CMAKE_MATCH_1}" CACHE PATH "" FORCE)
      elseif(_line MATCHES "^LLAMA_BUILD=(.*)$")
        set(SKIPPY_LLAMA_BUILD "${CMAKE_MATCH_1}" CACHE PATH "" FORCE)
      endif()
    endforeach()
  endif()
endif()
if(NOT EXISTS "${SKIPPY_LLAMA_SRC}/include/llama.h")
  message(FATAL_ERROR "llama.cpp not found: run scripts/setup (SKIPPY_LLAMA_SRC=${SKIPPY_LLAMA_SRC})")
endif()

function(skippy_import_static name path)
  if(NOT EXISTS "${path}")
    message(FATAL_ERROR "missing ${path}: run scripts/setup")
  endif()
  add_library(${name} STATIC IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES IMPORTED_LOCATION "${path}")
endfunction()

set(_lb "${SKIPPY_LLAMA_BUILD}")
set(_ls "${SKIPPY_LLAMA_SRC}")
skippy_import_static(llama_ggml_base "${_lb}/ggml/src/libggml-base.a")
skippy_import_static(llama_ggml_cpu "${_lb}/ggml/src/libggml-cpu.a")
skippy_import_static(llama_ggml "${_lb}/ggml/src/libggml.a")
# llama.cpp's RPC client backend (layers on other hosts' rpc-server; scripts/setup builds it).
skippy_import_static(llama_ggml_rpc "${_lb}/ggml/src/ggml-rpc/libggml-rpc.a")
# A CUDA build (SKIPPY_LLAMA_BUILD pointing at scripts/setup's build-cuda) adds its backend.
set(_llama_cuda_libs "")
if(EXISTS "${_lb}/ggml/src/ggml-cuda/libggml-cuda.a")
  find_package(CUDAToolkit REQUIRED)
  skippy_import_static(llama_ggml_cuda "${_lb}/ggml/src/ggml-cuda/libggml-cuda.a")
  set(_llama_cuda_libs llama_ggml_cuda CUDA::cudart_static CUDA::cublas_static CUDA::cublasLt_static CUDA::culibos)
endif()
skippy_import_static(llama_lib "${_lb}/src/libllama.a")
skippy_import_static(llama_common_lib "${_lb}/common/libllama-common.a")
skippy_import_static(llama_common_base "${_lb}/common/libllama-common-base.a")
skippy_import_static(llama_httplib "${_lb}/vendor/cpp-httplib/libcpp-httplib.a")

# llama.h / gguf.h / ggml.h: only src/runtime may use this target.
add_library(skippy_llama INTERFACE)
target_include_directories(skippy_llama SYSTEM INTERFACE "${_ls}/include" "${_ls}/ggml/include")
target_link_libraries(skippy_llama INTERFACE llama_lib llama_ggml llama_ggml_cpu llama_ggml_rpc
                      ${_llama_cuda_libs} llama_ggml_base Threads::Threads ${CMAKE_DL_LIBS} m)

# llama.cpp common/ (chat templates, sampling helpers); runtime-only as well.
add_library(skippy_llama_common INTERFACE)
target_include_directories(skippy_llama_common SYSTEM INTERFACE "${_ls}/common" "${_ls}/vendor")
target_link_libraries(skippy_llama_common INTERFACE llama_common_lib llama_common_base skippy_llama)

# Vendored nlohmann/json and cpp-httplib (one copy each, the ones llama.cpp ships).
add_library(skippy_json INTERFACE)
target_include_directories(skippy_json SYSTEM INTERFACE "${_ls}/vendor")
add_library(skippy_httplib INTERFACE)
target_include_directories(skippy_httplib SYSTEM INTERFACE "${_ls}/vendor")
target_link_libraries(skippy_httplib INTERFACE llama_httplib Threads::Threads)

set(SKIPPY_LLAMA_SERVER_BIN "${_lb}/bin/llama-server" CACHE FILEPATH "llama-server built from the same pin")
set(SKIPPY_RPC_SERVER_BIN "${_lb}/bin/rpc-server" CACHE FILEPATH "rpc-server built from the same pin")
set(SKIPPY_LLAMA_VOCAB_DIR "${_ls}/models" CACHE PATH "vocab GGUFs shipped with llama.cpp")
