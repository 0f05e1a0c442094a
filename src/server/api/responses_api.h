// POST /v1/responses in OpenAI's Responses format: `input` items (messages, function_call,
// function_call_output) and `instructions` are converted to a chat completions body (parsed
// and validated like one); the response is a `response` object with output items
// (reasoning, message, function_call), or, streamed, the event sequence Codex-style clients
// consume (response.created, response.output_item.added, response.output_text.delta,
// response.function_call_arguments.delta, ..., response.completed). Stateless: no
// previous_response_id, nothing is stored.
//
// Thread safety: stateless functions; a response writer belongs to one request.
#pragma once

#include <memory>

#include "nlohmann/json.hpp"
#include "server/api/api_response.h"

namespace skippy::server {

// Throws ApiError (400, naming the Responses field) for input that cannot be honoured.
// `notes` gets the unknown top-level fields (accepted) and the tools left out (hosted,
// grouped and custom tools: only function tools run here).
nlohmann::json responses_to_chat(const nlohmann::json& body, RequestNotes& notes);
inline nlohmann::json responses_to_chat(const nlohmann::json& body) {
    RequestNotes notes;
    return responses_to_chat(body, notes);
}

// `request`: the original body (echoed in the response object: tools, instructions, ...).
std::unique_ptr<ApiResponse> make_responses_response(std::shared_ptr<const ParsedRequest> parsed,
                                                     nlohmann::json request);

}  // namespace skippy::server
