// Fuzz target: server::OpenAiRequestParser::parse on arbitrary request bodies.
//
// Input: byte 0 selects the endpoint (even: /v1/chat/completions, odd: /v1/completions),
// the rest is the HTTP body. Every input must either parse into a request the scheduler
// can run, or be rejected with an ApiError (a 4xx with an OpenAI error body) or with
// std::invalid_argument (the chat template refused the messages; the server answers 400).
// Any other exception would reach the client as a 500, and is reported as a crash.
// Parsed grammars are also built into a real llama.cpp sampler (what the scheduler does
// next), so grammars the parser lets through must not crash llama.cpp's grammar parser.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "fuzz_models.h"
#include "runtime/chat_template.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "server/api/api_error.h"
#include "server/api/openai_request.h"
#include "server/api/text_output.h"

namespace {

using skippy::fuzz::fail;
using namespace skippy;

constexpr uint32_t kCtx = 512;

std::unique_ptr<runtime::Model> g_model;
std::unique_ptr<runtime::ChatTemplate> g_template;
std::unique_ptr<server::OpenAiRequestParser> g_parser;
server::RequestLimits g_limits;

void check_error(const server::ApiError& e) {
    if (e.status != 400 && e.status != 404 && e.status != 413 && e.status != 415) {
        fail("parser rejected with HTTP " + std::to_string(e.status) + ": " + e.what());
    }
    if (std::string(e.what()).empty() || e.type.empty()) {
        fail("ApiError without message or type");
    }
    const std::string text = server::dump_json(server::error_body(e));
    const auto body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || !body.contains("error")) {
        fail("error body is not JSON: " + text);
    }
    for (const char* key : {"message", "type", "param", "code"}) {
        if (!body["error"].contains(key)) {
            fail(std::string("error body without '") + key + "': " + text);
        }
    }
}

void check_parsed(const server::ParsedRequest& parsed) {
    const auto& gen = parsed.generation;
    if (gen.prompt.empty() || gen.prompt.size() >= kCtx) {
        fail("accepted a prompt of " + std::to_string(gen.prompt.size()) + " tokens");
    }
    for (const auto token : gen.prompt) {
        if (!g_model->is_valid_token(token)) {
            fail("accepted token id " + std::to_string(token) + " outside the vocabulary");
        }
    }
    if (gen.max_tokens < 1 || gen.prompt.size() + static_cast<size_t>(gen.max_tokens) > kCtx) {
        fail("max_tokens " + std::to_string(gen.max_tokens) + " does not fit the context");
    }
    int32_t previous = 0;
    for (const auto boundary : gen.message_boundaries) {
        if (boundary <= previous || boundary > static_cast<int32_t>(gen.prompt.size())) {
            fail("message boundaries not increasing inside the prompt");
        }
        previous = boundary;
    }
    if (gen.stop.size() > g_limits.max_stop_strings) {
        fail("accepted " + std::to_string(gen.stop.size()) + " stop strings");
    }
    for (const auto& stop : gen.stop) {
        if (stop.size() > g_limits.max_stop_length || !server::is_valid_utf8(stop)) {
            fail("accepted an over-long or invalid stop string");
        }
    }
    if (!server::is_valid_utf8(gen.cache_namespace) || !server::is_valid_utf8(parsed.model)) {
        fail("accepted invalid UTF-8");
    }
    const auto& s = gen.sampling;
    const bool finite = std::isfinite(s.temperature) && std::isfinite(s.top_p) &&
                        std::isfinite(s.min_p) && std::isfinite(s.presence_penalty) &&
                        std::isfinite(s.frequency_penalty) && std::isfinite(s.repeat_penalty);
    if (!finite || s.temperature < 0 || s.temperature > 2 || s.top_p < 0 || s.top_p > 1 ||
        s.top_k < 0) {
        fail("accepted out-of-range sampling parameters");
    }
    if (s.grammar.size() > g_limits.max_grammar_bytes) {
        fail("accepted an over-long grammar");
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    const std::string path = fuzz::tiny_model("llama", *argc > 0 ? (*argv)[0] : nullptr);
    g_model = runtime::Model::load(path);
    g_template = std::make_unique<runtime::ChatTemplate>(*g_model);
    g_limits.n_ctx = kCtx;
    g_parser = std::make_unique<server::OpenAiRequestParser>(
        *g_model, *g_template, std::vector<std::string>{"fuzz-model", "other"}, g_limits);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) {
        return 0;
    }
    const auto endpoint =
        (data[0] & 1) == 0 ? server::Endpoint::ChatCompletions : server::Endpoint::Completions;
    const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
    server::ParsedRequest parsed;
    try {
        parsed = g_parser->parse(endpoint, body);
    } catch (const server::ApiError& e) {
        check_error(e);
        return 0;
    } catch (const std::invalid_argument&) {
        return 0;  // the chat template refused the messages: 400 (http_server.cpp)
    } catch (const std::exception& e) {
        fail(std::string("parser threw a non-API exception (HTTP 500): ") + e.what());
    }
    check_parsed(parsed);
    if (!parsed.generation.sampling.grammar.empty()) {
        try {
            runtime::Sampler sampler(*g_model, parsed.generation.sampling);
        } catch (const std::invalid_argument&) {
            // the grammar does not parse: the scheduler answers 400
        }
    }
    return 0;
}
