// POST /v1/messages in Anthropic's Messages format: the request is converted to an OpenAI
// chat completions body (then parsed and validated like one), the response is written as an
// Anthropic message (content blocks: thinking, text, tool_use) or, streamed, as its events
// (message_start, content_block_start/delta/stop, message_delta, message_stop). Errors use
// Anthropic's body {"type": "error", "error": {"type", "message"}}.
//
// Thread safety: stateless functions; a response writer belongs to one request.
#pragma once

#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "server/api_response.h"

namespace skippy::server {

// Throws ApiError (400, naming the Anthropic field) for input that cannot be honoured.
// `ordered`: the same body parsed with its object keys in order (tool_use inputs keep it).
nlohmann::json anthropic_to_chat(const nlohmann::json& body, const nlohmann::ordered_json& ordered);

std::string anthropic_error_type(int status);
nlohmann::json anthropic_error(int status, const std::string& message);

std::unique_ptr<ApiResponse> make_anthropic_response(std::shared_ptr<const ParsedRequest> parsed);

}  // namespace skippy::server
