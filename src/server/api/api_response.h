// ApiResponse: one request's response in the format of the API it came in on (OpenAI chat
// completions / completions, Anthropic messages, OpenAI Responses). The HTTP layer runs the
// generations (n choices, one after the other: the prefix cache serves the later ones) and
// feeds their events here; the writer turns them into SSE events (streaming) or one JSON
// body.
//
// Thread safety: not thread-safe; one per request, used by the thread serving it (the
// handler thread, then the streaming content provider).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "server/api/api_error.h"
#include "server/schedule/generation_stream.h"
#include "server/api/openai_request.h"
#include "server/schedule/scheduler.h"

namespace skippy::server {

class ApiResponse {
  public:
    virtual ~ApiResponse() = default;

    // Before choice `choice` is submitted: attach hooks (logprobs) to its generation.
    virtual void prepare_choice(size_t choice, GenerationRequest& generation) {
        (void)choice;
        (void)generation;
    }
    // Streaming: events that go out before any output ("" if none).
    virtual std::string stream_start() { return ""; }
    // Output of choice `choice`. Streaming: SSE text to send now (may be ""); otherwise the
    // output is kept and "" is returned.
    virtual std::string on_delta(size_t choice, const StreamEvent& delta) = 0;
    // Prompt processing progress of choice `choice` (streamed requests that asked for it):
    // SSE text to send now ("" if the format has no such event).
    virtual std::string on_progress(size_t choice, const StreamEvent& progress) {
        (void)choice;
        (void)progress;
        return "";
    }
    // Choice `choice` finished. Streaming: SSE text to send now.
    virtual std::string on_done(size_t choice, const GenerationStats& stats) = 0;
    // Every choice finished. Streaming: the closing events; otherwise the JSON body.
    virtual std::string finish() = 0;
    // An error after streaming began (SSE text that ends the stream).
    virtual std::string stream_error(int status, const std::string& type,
                                     const std::string& message) = 0;
    // An error before anything was sent: the body in this API's format.
    virtual nlohmann::json error_json(int status, const std::string& type,
                                      const std::string& message, const std::string& param,
                                      const std::string& code) const {
        return error_body(status, type, message, param, code);
    }
};

std::string sse_data(const nlohmann::json& payload);  // "data: {...}\n\n"
std::string sse_event(const std::string& event, const nlohmann::json& payload);

nlohmann::json usage_json(const GenerationStats& stats);
// skippy's extension object next to `usage` (every API): the cache decision, tier, miss
// reason (client_miss_reason), diverged_at and timings.
nlohmann::json skippy_json(const GenerationStats& stats, double parse_ms);
std::string client_miss_reason(const std::string& reason);
std::string random_id(const char* prefix);

// OpenAI chat completions / completions in their formats (tool calls, logprobs, n choices).
std::unique_ptr<ApiResponse> make_openai_response(std::shared_ptr<const ParsedRequest> parsed,
                                                  const runtime::Model& model);

}  // namespace skippy::server
