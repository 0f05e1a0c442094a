// Parsing and validation of OpenAI request bodies into GenerationRequests.
// Every rejection is an ApiError with the right status and an OpenAI error body.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/chat_template.h"
#include "runtime/model.h"
#include "server/scheduler.h"

namespace skippy::server {

enum class Endpoint { ChatCompletions, Completions };

struct RequestLimits {
    uint32_t n_ctx = 4096;
    size_t max_stop_strings = 16;
    size_t max_stop_length = 256;
    size_t max_messages = 4096;
};

struct ParsedRequest {
    Endpoint endpoint = Endpoint::ChatCompletions;
    std::string model;
    bool stream = false;
    bool include_usage = false;
    bool return_token_ids = false;
    GenerationRequest generation;
};

class OpenAiRequestParser {
public:
    OpenAiRequestParser(const runtime::Model& model, const runtime::ChatTemplate& chat_template,
                        std::vector<std::string> model_ids, RequestLimits limits);

    // Throws ApiError on any invalid input.
    ParsedRequest parse(Endpoint endpoint, const std::string& body) const;
    // Just the JSON-level validation + rendering (no tokenization), exposed for the fuzzer.
    std::vector<runtime::ChatMessage> parse_messages(const nlohmann::json& messages) const;

private:
    void parse_common(const nlohmann::json& body, ParsedRequest& out) const;
    void parse_chat(const nlohmann::json& body, ParsedRequest& out) const;
    void parse_completion(const nlohmann::json& body, ParsedRequest& out) const;

    const runtime::Model& model_;
    const runtime::ChatTemplate& chat_template_;
    std::vector<std::string> model_ids_;
    RequestLimits limits_;
};

}  // namespace skippy::server
