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
#include "server/api/anthropic_context.h"
#include "server/api/api_response.h"

namespace skippy::server {

// A Messages request as a chat completions body, and what only the Anthropic response needs.
struct AnthropicRequest {
    nlohmann::json chat;
    RequestNotes notes;          // unknown top-level fields, server tools left out
    bool omit_thinking = false;  // thinking.display "omitted": thinking blocks carry no text
    // context_management edits that changed the prompt (response: applied_edits).
    nlohmann::json applied_edits = nlohmann::json::array();
};

// Throws ApiError (400, naming the Anthropic field) for input that cannot be honoured.
// `ordered`: the same body parsed with its object keys in order (tool_use inputs keep it).
// `count_tokens` measures what context_management edits clear (and whether a clear_tool_uses
// trigger fires); without it those edits never fire.
AnthropicRequest anthropic_request(const nlohmann::json& body,
                                   const nlohmann::ordered_json& ordered,
                                   const TokenCounter& count_tokens);
nlohmann::json anthropic_to_chat(const nlohmann::json& body, const nlohmann::ordered_json& ordered);

std::string anthropic_error_type(int status);
nlohmann::json anthropic_error(int status, const std::string& message);

std::unique_ptr<ApiResponse> make_anthropic_response(std::shared_ptr<const ParsedRequest> parsed,
                                                     bool omit_thinking = false,
                                                     nlohmann::json applied_edits = nullptr);

}  // namespace skippy::server
