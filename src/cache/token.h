// Token ids as the cache sees them.
//
//   #include "cache/token.h"
//   std::vector<skippy::cache::Token> prompt = tokenize(...);
//
// The cache never interprets a token id; it hashes and compares them. The type
// matches llama.cpp's llama_token (int32_t) so spans of tokens pass through unchanged.
#pragma once

#include <cstdint>

namespace skippy::cache {

using Token = int32_t;

}  // namespace skippy::cache
