// POST /tokenize and POST /detokenize (llama-server's formats):
//   {"content": "text", "add_special": false, "parse_special": true, "with_pieces": false}
//     -> {"tokens": [ids]} or {"tokens": [{"id", "piece"}]}
//   {"tokens": [ids]} -> {"content": "text"}
//
// Thread safety: stateless functions (the Model is immutable).
#pragma once

#include <cstddef>

#include "nlohmann/json.hpp"
#include "runtime/model.h"

namespace skippy::server {

// Both throw ApiError (400) on invalid input.
nlohmann::json tokenize_response(const runtime::Model& model, const nlohmann::json& body,
                                 size_t max_content_bytes);
nlohmann::json detokenize_response(const runtime::Model& model, const nlohmann::json& body);

}  // namespace skippy::server
