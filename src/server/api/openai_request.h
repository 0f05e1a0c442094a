// Parsing and validation of OpenAI request bodies into GenerationRequests.
// Every rejection is an ApiError with the right status and an OpenAI error body.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/chat_template.h"
#include "runtime/model.h"
#include "server/prompt/chat_request.h"
#include "server/prompt/message_boundaries.h"
#include "server/prompt/prompt_token_memo.h"
#include "server/schedule/scheduler.h"

namespace skippy::server {

enum class Endpoint { ChatCompletions, Completions };

struct RequestLimits {
    uint32_t n_ctx = 4096;
    // Output tokens when a request names none, and the most any request gets (like
    // llama-server's -n); 0 = what the lane has room for. A request's max_tokens above what
    // fits is clamped, never refused (the reply then ends with finish_reason "length").
    int32_t max_output_tokens = 0;
    size_t max_stop_strings = 16;
    size_t max_stop_length = 256;
    size_t max_messages = 4096;
    // GBNF grammars: llama.cpp's grammar parser recurses once per nested group and once
    // per rule in a reference chain, on the scheduler thread; deeper input overflows its
    // stack and kills the process. Sampling cost grows with the grammar (it runs on the
    // scheduler thread), hence the size bound.
    size_t max_grammar_bytes = 32 * 1024;
    size_t max_grammar_depth = 128;
    size_t max_grammar_rules = 2048;
    ChatLimits chat;  // tools, tool calls, schemas
    // Structural record positions (message_boundaries, see message_boundaries.h): a
    // conversation not seen before costs one chat-template render per earlier message, each
    // over all messages before it (quadratic in the message count). They are computed in
    // message order while the running cost (messages rendered, plus 16 per render for its
    // fixed cost) stays within this budget. The rule depends only on the messages up to each
    // boundary, so a conversation's next turn computes the same boundaries for its shared
    // prefix (canonical chunking stays identical). Renders are remembered (LRU, this many
    // entries of ~100 bytes), so a next turn renders only what is new.
    size_t max_boundary_render_cost = 16384;
    size_t boundary_memo_entries = 16384;
};

// What the server did with a request that the response and the access log report: fields
// accepted without effect (unknown top-level fields; DESIGN.md, API policy) and tools it
// cannot run that were left out of what the model sees (hosted tools such as web_search).
struct RequestNotes {
    std::vector<std::string> ignored_fields;
    std::vector<std::string> dropped_tools;
};

struct ParsedRequest {
    Endpoint endpoint = Endpoint::ChatCompletions;
    std::string model;
    bool stream = false;
    bool include_usage = false;
    bool return_token_ids = false;
    int n = 1;              // choices: n generations of the same prompt
    int top_logprobs = -1;  // -1: no logprobs; else alternatives per token (0..20)
    GenerationRequest generation;
    // Chat: the output format's parser (tool calls, reasoning); null = the text is content.
    std::shared_ptr<const runtime::ChatOutputParser> chat_parser;
    bool tools_active = false;      // tools given, tool_choice != none
    std::string tool_call_id_base;  // tool call i of the reply gets id base + i
    // Chat: renders what the next turn of this conversation will look up (the messages
    // without generation prompt, and with the reply of choice 0 appended), off the critical
    // path: call it once the response is sent, with that reply's text.
    std::function<void(const std::string& reply)> prepare_next_turn;
    double parse_ms = 0;  // time spent in parse() (set by the HTTP layer)
    RequestNotes notes;
};

class OpenAiRequestParser {
  public:
    // model_ids: the names requests may use (the first is reported); "*" accepts any name.
    OpenAiRequestParser(const runtime::Model& model, const runtime::ChatTemplate& chat_template,
                        std::vector<std::string> model_ids, RequestLimits limits);

    // Throws ApiError on any invalid input.
    ParsedRequest parse(Endpoint endpoint, const std::string& body) const;
    ParsedRequest parse(Endpoint endpoint, const nlohmann::json& body) const;
    // The model id a request names (404 when it is not served); the first id when absent.
    std::string resolve_model(const nlohmann::json* model) const;
    const MessageBoundaryFinder& boundaries() const { return boundaries_; }
    const PromptTokenMemo& prompt_tokens() const { return prompt_tokens_; }
    // Prompt tokens of a chat completions body: rendered and tokenized as parse() would, but
    // without sampling setup, message boundaries or memos (Anthropic's context edits measure
    // what they clear with it). Throws ApiError like parse().
    size_t count_chat_tokens(const nlohmann::json& body) const;
    // Just the JSON-level validation + rendering (no tokenization), exposed for the fuzzer.
    std::vector<runtime::ChatMessage> parse_messages(const nlohmann::json& messages) const;
    const std::vector<std::string>& model_ids() const { return model_ids_; }
    const runtime::Model& model() const { return model_; }
    uint32_t n_ctx() const { return limits_.n_ctx; }

  private:
    // What the end of a chat turn is rendered from: the request's messages and context, the
    // output parser and tool call ids of its reply, the identity of the messages.
    struct TurnEnd {
        std::shared_ptr<const std::vector<runtime::ChatMessage>> history;
        std::shared_ptr<const runtime::ChatContext> context;
        std::shared_ptr<const runtime::ChatOutputParser> parser;
        std::string id_base;
        cache::Digest key;
    };
    // Renders the turn's messages + the reply `text` (add_generation_prompt = false),
    // remembers the text (boundaries) and its tokens (prompt token memo) and returns them.
    // always = false: nothing when the boundary memo has that render already, or when the
    // template fails (the request that needs it reports the error).
    std::vector<runtime::Token> render_turn_end(const TurnEnd& turn, const std::string& text,
                                                bool always) const;

    void parse_common(const nlohmann::json& body, ParsedRequest& out) const;
    void parse_chat(const nlohmann::json& body, ParsedRequest& out) const;
    void parse_completion(const nlohmann::json& body, ParsedRequest& out) const;

    // Rejects prompt text that cannot fit the context without tokenizing it.
    void check_text_fits(size_t text_bytes, const char* param) const;
    void check_prompt_fits(size_t n_tokens, const char* param) const;

    const runtime::Model& model_;
    const runtime::ChatTemplate& chat_template_;
    std::vector<std::string> model_ids_;
    RequestLimits limits_;
    MessageBoundaryFinder boundaries_;
    PromptTokenMemo prompt_tokens_;
    size_t max_token_bytes_ = 1;  // longest text any single token stands for
};

}  // namespace skippy::server
