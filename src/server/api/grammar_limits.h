// Bounds on user GBNF grammars: what llama.cpp's grammar parser (which runs on the
// scheduler thread) handles without crashing or hanging.
#pragma once

#include <cstddef>
#include <string>

namespace skippy::server {

struct GrammarLimits {
    size_t max_bytes = 32 * 1024;
    size_t max_depth = 128;
    size_t max_rules = 2048;
};

// Throws ApiError (400, param "grammar") when the grammar is over a limit.
void check_grammar(const std::string& grammar, const GrammarLimits& limits);

}  // namespace skippy::server
