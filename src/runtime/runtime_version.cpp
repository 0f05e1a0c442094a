#include "runtime/runtime_version.h"

#include "llama.h"

namespace skippy::runtime {

std::string runtime_version() {
    // The pinned llama.cpp commit (scripts/setup checks it) and its state-file version.
    return std::string("llama.cpp-80fb11ac73e6;session-v") + std::to_string(LLAMA_SESSION_VERSION) +
           ";state-seq-v" + std::to_string(LLAMA_STATE_SEQ_VERSION);
}

}  // namespace skippy::runtime
