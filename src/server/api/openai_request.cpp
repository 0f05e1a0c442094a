#include "server/api/openai_request.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>

#include "server/api/api_error.h"
#include "server/api/chat_reply.h"
#include "server/api/grammar_limits.h"
#include "server/api/json_fields.h"
#include "server/api/text_output.h"

namespace skippy::server {

using nlohmann::json;

namespace {

ApiError context_length_exceeded(const std::string& message, const char* param) {
    return ApiError(400, "invalid_request_error", message, param, "context_length_exceeded");
}

}  // namespace

OpenAiRequestParser::OpenAiRequestParser(const runtime::Model& model,
                                         const runtime::ChatTemplate& chat_template,
                                         std::vector<std::string> model_ids, RequestLimits limits)
    : model_(model),
      chat_template_(chat_template),
      model_ids_(std::move(model_ids)),
      limits_(limits),
      boundaries_(model, chat_template, limits.max_boundary_render_cost,
                  limits.boundary_memo_entries),
      prompt_tokens_(model, limits.boundary_memo_entries == 0 ? 0 : 64),
      max_token_bytes_(boundaries_.max_piece_bytes()) {}

void OpenAiRequestParser::check_text_fits(size_t text_bytes, const char* param) const {
    // No token stands for more than max_token_bytes_ bytes of text, so longer text has more
    // tokens than the context holds (the factor 2 leaves room for normalizing tokenizers).
    if (text_bytes / 2 / max_token_bytes_ > limits_.n_ctx) {
        throw context_length_exceeded("prompt is " + std::to_string(text_bytes) +
                                          " bytes, far more than the context holds (" +
                                          std::to_string(limits_.n_ctx) + " tokens)",
                                      param);
    }
}

void OpenAiRequestParser::check_prompt_fits(size_t n_tokens, const char* param) const {
    if (n_tokens >= limits_.n_ctx) {
        throw context_length_exceeded(
            "prompt has " + std::to_string(n_tokens) + " tokens, the context holds " +
                std::to_string(limits_.n_ctx) + " (prompt + completion must fit)",
            param);
    }
}

ParsedRequest OpenAiRequestParser::parse(Endpoint endpoint, const std::string& body_text) const {
    if (!is_valid_utf8(body_text)) {
        throw invalid_request("request body is not valid UTF-8");
    }
    json body;
    try {
        body = json::parse(body_text);
    } catch (const json::exception& e) {
        // parse_error, and out_of_range for numbers that overflow a double (1e999).
        throw invalid_request(std::string("request body is not valid JSON: ") + e.what());
    }
    return parse(endpoint, body);
}

ParsedRequest OpenAiRequestParser::parse(Endpoint endpoint, const json& body) const {
    if (!body.is_object()) {
        throw invalid_request("request body must be a JSON object");
    }
    ParsedRequest out;
    out.endpoint = endpoint;
    parse_common(body, out);
    if (endpoint == Endpoint::ChatCompletions) {
        parse_chat(body, out);
    } else {
        parse_completion(body, out);
    }
    auto& gen = out.generation;
    if (gen.prompt.empty()) {
        throw invalid_request("prompt is empty after tokenization", "prompt");
    }
    check_prompt_fits(gen.prompt.size(),
                      endpoint == Endpoint::ChatCompletions ? "messages" : "prompt");
    const auto room = static_cast<int64_t>(limits_.n_ctx - gen.prompt.size());
    gen.max_tokens = static_cast<int32_t>(std::min<int64_t>(gen.max_tokens, room));
    return out;
}

std::string OpenAiRequestParser::resolve_model(const json* model) const {
    if (model == nullptr) {
        return model_ids_.front();
    }
    const std::string name = checked_text(*model, "model");
    const bool known = std::find(model_ids_.begin(), model_ids_.end(), name) != model_ids_.end();
    const bool any = std::find(model_ids_.begin(), model_ids_.end(), "*") != model_ids_.end();
    if (!known && !any) {
        throw ApiError(404, "invalid_request_error", "The model '" + name + "' does not exist",
                       "model", "model_not_found");
    }
    return name;
}

namespace {

// Fields every generation request may carry (both endpoints).
#define SKIPPY_COMMON_FIELDS                                                                      \
    {"model", FieldUse::Honored}, {"stream", FieldUse::Honored},                                  \
        {"stream_options", FieldUse::Honored}, {"n", FieldUse::Honored},                          \
        {"max_tokens", FieldUse::Honored}, {"temperature", FieldUse::Honored},                    \
        {"top_p", FieldUse::Honored}, {"top_k", FieldUse::Honored}, {"min_p", FieldUse::Honored}, \
        {"presence_penalty", FieldUse::Honored}, {"frequency_penalty", FieldUse::Honored},        \
        {"repeat_penalty", FieldUse::Honored}, {"seed", FieldUse::Honored},                       \
        {"grammar", FieldUse::Honored}, {"stop", FieldUse::Honored},                              \
        {"ignore_eos", FieldUse::Honored}, {"cache_prompt", FieldUse::Honored},                   \
        {"prompt_cache_key", FieldUse::Honored}, {"return_token_ids", FieldUse::Honored},         \
        {"logprobs", FieldUse::Honored}, {"logit_bias", FieldUse::Honored},                       \
        {"response_format", FieldUse::Honored}, {"user", FieldUse::Ignored},                      \
        {"metadata", FieldUse::Ignored}, {"store", FieldUse::Ignored},                            \
        {"service_tier", FieldUse::Ignored}, {"safety_identifier", FieldUse::Ignored},            \
        {"prompt_cache_retention", FieldUse::Ignored}, {"cache_salt", FieldUse::Honored},         \
        {"return_progress", FieldUse::Honored}, {                                                 \
        "n_probs", FieldUse::Rejected                                                             \
    }

}  // namespace

void OpenAiRequestParser::parse_common(const json& body, ParsedRequest& out) const {
    if (out.endpoint == Endpoint::ChatCompletions) {
        reject_unknown_fields(body,
                              {SKIPPY_COMMON_FIELDS,
                               {"messages", FieldUse::Honored},
                               {"max_completion_tokens", FieldUse::Honored},
                               {"tools", FieldUse::Honored},
                               {"tool_choice", FieldUse::Honored},
                               {"parallel_tool_calls", FieldUse::Honored},
                               {"top_logprobs", FieldUse::Honored},
                               {"chat_template_kwargs", FieldUse::Honored},
                               {"reasoning_effort", FieldUse::Honored},
                               {"modalities", FieldUse::Honored},
                               {"prediction", FieldUse::Ignored},
                               {"audio", FieldUse::Rejected},
                               {"web_search_options", FieldUse::Rejected},
                               {"functions", FieldUse::Rejected},
                               {"function_call", FieldUse::Rejected},
                               {"verbosity", FieldUse::Rejected}},
                              "", &out.notes.ignored_fields);
    } else {
        reject_unknown_fields(body,
                              {SKIPPY_COMMON_FIELDS,
                               {"prompt", FieldUse::Honored},
                               {"echo", FieldUse::Honored},
                               {"best_of", FieldUse::Honored},
                               {"suffix", FieldUse::Honored}},
                              "", &out.notes.ignored_fields);
    }
    out.model = resolve_model(find_field(body, "model"));
    auto& gen = out.generation;
    auto& s = gen.sampling;
    out.stream = bool_field(body, "stream", false);
    if (const json* options = find_field(body, "stream_options")) {
        if (!options->is_object()) {
            throw invalid_request("'stream_options' must be an object", "stream_options");
        }
        reject_unknown_fields(
            *options,
            {{"include_usage", FieldUse::Honored}, {"include_obfuscation", FieldUse::Ignored}},
            "stream_options");
        out.include_usage = bool_field(*options, "include_usage", false);
    }
    out.n = static_cast<int>(integer_field(body, "n", 1, 1, 16));
    // llama-server's prompt processing progress events (streamed responses only).
    out.generation.return_progress = out.stream && bool_field(body, "return_progress", false);
    // Like llama-server: what the request asks for, else the server's default; never more
    // than the server's cap or the lane's room (parse() clamps to the room once the prompt
    // is known). Asking for more than fits is not an error: the reply ends at the limit.
    const int64_t max_ctx = static_cast<int64_t>(limits_.n_ctx);
    int64_t max_tokens = integer_field(body, "max_tokens", -1, 1, INT64_MAX);
    max_tokens = integer_field(body, "max_completion_tokens", max_tokens, 1, INT64_MAX);
    if (max_tokens < 0) {
        max_tokens = limits_.max_output_tokens > 0 ? limits_.max_output_tokens : max_ctx;
    }
    if (limits_.max_output_tokens > 0) {
        max_tokens = std::min<int64_t>(max_tokens, limits_.max_output_tokens);
    }
    gen.max_tokens = static_cast<int32_t>(std::min(max_tokens, max_ctx));
    s.temperature = static_cast<float>(number_field(body, "temperature", 1.0, 0.0, 2.0));
    s.top_p = static_cast<float>(number_field(body, "top_p", 1.0, 0.0, 1.0));
    s.top_k = static_cast<int32_t>(integer_field(body, "top_k", 0, 0, 1 << 20));
    s.min_p = static_cast<float>(number_field(body, "min_p", 0.0, 0.0, 1.0));
    s.presence_penalty = static_cast<float>(number_field(body, "presence_penalty", 0.0, -2.0, 2.0));
    s.frequency_penalty =
        static_cast<float>(number_field(body, "frequency_penalty", 0.0, -2.0, 2.0));
    s.repeat_penalty = static_cast<float>(number_field(body, "repeat_penalty", 1.0, 0.0, 10.0));
    if (const json* seed = find_field(body, "seed")) {
        if (!seed->is_number_integer() && !seed->is_number_unsigned()) {
            throw invalid_request("'seed' must be an integer", "seed");
        }
        s.seed = static_cast<uint32_t>(seed->get<int64_t>() & 0xFFFFFFFF);
    }
    if (const json* grammar = find_field(body, "grammar")) {
        s.grammar = checked_text(*grammar, "grammar");
        check_grammar(s.grammar, GrammarLimits{limits_.max_grammar_bytes, limits_.max_grammar_depth,
                                               limits_.max_grammar_rules});
    }
    if (const json* bias = find_field(body, "logit_bias")) {
        if (!bias->is_object()) {
            throw invalid_request("'logit_bias' must be an object of token id -> bias",
                                  "logit_bias");
        }
        if (bias->size() > 1024) {
            throw invalid_request("'logit_bias' has more than 1024 entries", "logit_bias");
        }
        for (const auto& [key, value] : bias->items()) {
            int64_t token = -1;
            try {
                size_t used = 0;
                token = std::stoll(key, &used);
                if (used != key.size()) {
                    token = -1;
                }
            } catch (const std::exception&) {
                token = -1;
            }
            if (token < 0 || token >= model_.n_vocab()) {
                throw invalid_request("'logit_bias' key '" + key + "' is not a token id (0.." +
                                          std::to_string(model_.n_vocab() - 1) + ")",
                                      "logit_bias");
            }
            if (!value.is_number() || !std::isfinite(value.get<double>()) ||
                value.get<double>() < -100 || value.get<double>() > 100) {
                throw invalid_request("'logit_bias' values must be numbers in [-100, 100]",
                                      "logit_bias");
            }
            s.logit_bias.emplace_back(static_cast<int32_t>(token), value.get<float>());
        }
    }
    if (const json* stop = find_field(body, "stop")) {
        if (stop->is_string()) {
            gen.stop.push_back(checked_text(*stop, "stop"));
        } else if (stop->is_array()) {
            if (stop->size() > limits_.max_stop_strings) {
                throw invalid_request("at most " + std::to_string(limits_.max_stop_strings) +
                                          " stop sequences are allowed",
                                      "stop");
            }
            for (const auto& item : *stop) {
                gen.stop.push_back(checked_text(item, "stop"));
            }
        } else {
            throw invalid_request("'stop' must be a string or an array of strings", "stop");
        }
        for (const auto& stop_string : gen.stop) {
            if (stop_string.size() > limits_.max_stop_length) {
                throw invalid_request("a stop sequence is longer than " +
                                          std::to_string(limits_.max_stop_length) + " bytes",
                                      "stop");
            }
        }
    }
    gen.ignore_eos = bool_field(body, "ignore_eos", false);
    gen.cache_enabled = bool_field(body, "cache_prompt", true);
    // prompt_cache_key is OpenAI's routing hint (it should raise hit rates: lane affinity
    // here); tenants are separated by the API key and cache_salt (vLLM's field), which the
    // HTTP layer combines into the cache namespace.
    if (const json* key = find_field(body, "prompt_cache_key")) {
        gen.routing_key = checked_text(*key, "prompt_cache_key");
    }
    if (const json* salt = find_field(body, "cache_salt")) {
        gen.cache_namespace = checked_text(*salt, "cache_salt");
        if (gen.cache_namespace.empty()) {
            throw invalid_request("'cache_salt' must not be empty", "cache_salt");
        }
    }
    out.return_token_ids = bool_field(body, "return_token_ids", false);
    if (out.endpoint == Endpoint::ChatCompletions) {
        const bool logprobs = bool_field(body, "logprobs", false);
        const auto top = integer_field(body, "top_logprobs", -1, 0, 20);
        if (top >= 0 && !logprobs) {
            throw invalid_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
        }
        out.top_logprobs = logprobs ? static_cast<int>(std::max<int64_t>(top, 0)) : -1;
        if (const json* modalities = find_field(body, "modalities");
            modalities != nullptr && *modalities != json::array({"text"})) {
            throw invalid_request("only the 'text' modality is supported", "modalities");
        }
    } else {
        // Completions: logprobs is the number of alternatives per token.
        out.top_logprobs = static_cast<int>(integer_field(body, "logprobs", -1, 0, 20));
        if (bool_field(body, "echo", false)) {
            throw invalid_request("echo is not supported", "echo");
        }
        if (integer_field(body, "best_of", 1, 1, 1) != 1) {
            throw invalid_request("only best_of=1 is supported", "best_of");
        }
        if (!string_field(body, "suffix", "").empty()) {
            throw invalid_request("suffix (insertion) is not supported", "suffix");
        }
    }
}

std::vector<runtime::ChatMessage> OpenAiRequestParser::parse_messages(const json& messages) const {
    return parse_chat_messages(messages, limits_.chat);
}

namespace {

std::string random_call_id_base() {
    static std::atomic<uint64_t> counter{0};
    static const uint64_t salt = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
    char buf[48];
    std::snprintf(buf, sizeof buf, "call_%016llx%04llx_", static_cast<unsigned long long>(salt),
                  static_cast<unsigned long long>(counter.fetch_add(1) & 0xFFFF));
    return buf;
}

}  // namespace

size_t OpenAiRequestParser::count_chat_tokens(const json& body) const {
    const json* messages_json = find_field(body, "messages");
    if (messages_json == nullptr) {
        throw invalid_request("'messages' is required", "messages");
    }
    const auto messages = parse_messages(*messages_json);
    ChatOptions options = parse_chat_options(body, limits_.chat);
    const bool structured = options.tools_active || !options.constraints.json_schema.empty() ||
                            !options.context.empty() || chat_template_.supports_thinking();
    const std::string prompt =
        structured
            ? apply_chat(chat_template_, messages, options.context, options.constraints).prompt
            : render_chat(chat_template_, messages, true);
    return model_.tokenize(prompt, true, true).size();
}

void OpenAiRequestParser::parse_chat(const json& body, ParsedRequest& out) const {
    const json* messages_json = find_field(body, "messages");
    if (messages_json == nullptr) {
        throw invalid_request("'messages' is required", "messages");
    }
    const auto messages = parse_messages(*messages_json);
    ChatOptions options = parse_chat_options(body, limits_.chat);
    auto& gen = out.generation;
    if (!options.context.tools.empty() && !chat_template_.supports_tool_calls()) {
        throw invalid_request("the model's chat template does not support tools", "tools");
    }
    if (!gen.sampling.grammar.empty() &&
        (options.tools_active || !options.constraints.json_schema.empty())) {
        throw invalid_request("'grammar' cannot be combined with 'tools' or 'response_format'",
                              "grammar");
    }
    const bool structured = options.tools_active || !options.constraints.json_schema.empty() ||
                            !options.context.empty() || chat_template_.supports_thinking();
    std::string prompt;
    if (structured) {
        runtime::ChatPrompt p =
            apply_chat(chat_template_, messages, options.context, options.constraints);
        prompt = std::move(p.prompt);
        // A promise the format cannot keep is refused, not dropped.
        if (p.grammar.empty() && options.tools_active &&
            options.constraints.tool_choice == runtime::ToolChoice::Required) {
            throw invalid_request(
                "the model's chat template cannot constrain tool calls: "
                "tool_choice 'required' or a named function is not available",
                "tool_choice");
        }
        if (p.grammar.empty() && !options.constraints.json_schema.empty()) {
            throw invalid_request(
                "the model's chat template cannot constrain the output to "
                "'response_format'",
                "response_format");
        }
        if (!p.grammar.empty()) {
            auto& s = gen.sampling;
            s.grammar = std::move(p.grammar);
            s.grammar_lazy = p.grammar_lazy;
            s.grammar_trigger_patterns = std::move(p.trigger_patterns);
            s.grammar_trigger_tokens = std::move(p.trigger_tokens);
            s.grammar_prefill = std::move(p.grammar_prefill);
        }
        gen.preserved_tokens = std::move(p.preserved_tokens);
        std::sort(gen.preserved_tokens.begin(), gen.preserved_tokens.end());
        for (auto& stop : p.additional_stops) {
            if (std::find(gen.stop.begin(), gen.stop.end(), stop) == gen.stop.end()) {
                gen.stop.push_back(std::move(stop));
            }
        }
        // Output that needs parsing: tool calls, a response format (a fenced JSON block
        // is unwrapped), reasoning. Otherwise the text is the content as generated.
        if (options.tools_active || !options.constraints.json_schema.empty() ||
            chat_template_.supports_thinking()) {
            out.chat_parser = std::move(p.parser);
        }
        out.tools_active = options.tools_active;
        out.tool_call_id_base = random_call_id_base();
    } else {
        prompt = render_chat(chat_template_, messages, true);
    }
    check_text_fits(prompt.size(), "messages");
    auto context = std::make_shared<const runtime::ChatContext>(std::move(options.context));
    const MessageKeys keys = message_keys(messages, chat_context_label(*context));
    // The head this conversation's last turn ended with is tokenized already.
    gen.prompt = prompt_tokens_.tokenize(prompt, keys);
    // Before the boundary search: a prompt that cannot fit is rejected cheaply.
    check_prompt_fits(gen.prompt.size(), "messages");
    // Structural record positions: where each earlier message ends in the prompt's tokens.
    // (find() also remembers the prompt: the next turn renders it as the head before the
    // reply.)
    gen.message_boundaries = boundaries_.find(messages, keys, prompt, gen.prompt, *context);
    prompt_tokens_.remember_prompt(keys.back(), prompt, gen.prompt);
    auto turn = std::make_shared<TurnEnd>(
        TurnEnd{std::make_shared<const std::vector<runtime::ChatMessage>>(messages), context,
                out.chat_parser, out.tool_call_id_base, keys.back()});
    gen.render_turn_end = [this, turn](const std::string& text) {
        return render_turn_end(*turn, text, true);
    };
    out.prepare_next_turn = [this, turn](const std::string& reply) {
        // The head before the next message when the client sends the reply back as it was:
        // the end of this turn (already remembered when the scheduler ran it). First: a chat
        // client can send its next turn right away.
        render_turn_end(*turn, reply, false);
        // ... and when it rewrites the reply (an agent's own tool-call message).
        boundaries_.prepare(turn->key, *turn->history, false, *turn->context);
    };
}

std::vector<runtime::Token> OpenAiRequestParser::render_turn_end(const TurnEnd& turn,
                                                                 const std::string& text,
                                                                 bool always) const {
    // The assistant message as the client sends it back: content (without reasoning) and
    // the tool calls with the ids and arguments this response gives them.
    const runtime::ChatReply reply = parse_reply(turn.parser.get(), text, turn.id_base);
    runtime::ChatMessage message("assistant", reply.content);
    message.tool_calls = reply.tool_calls;
    const cache::Digest turn_key = extend_message_key(turn.key, message);
    if (!always && boundaries_.remembers(turn_key, false)) {
        return {};
    }
    if (always) {
        // The HTTP handler's background work rendered it after the response (the scheduler
        // runs the end of a turn only once the server has been idle for a while).
        if (auto tokens = prompt_tokens_.remembered(turn_key); !tokens.empty()) {
            return tokens;
        }
    }
    std::vector<runtime::ChatMessage> with_reply = *turn.history;
    with_reply.push_back(std::move(message));
    std::string rendered;
    try {
        rendered = render_chat(chat_template_, with_reply, false, *turn.context);
    } catch (const std::exception&) {
        if (always) {
            throw;
        }
        return {};  // the request that needs it will report the error
    }
    boundaries_.remember(turn_key, false, rendered);
    // Tokenized from the prompt's head (remember_prompt): only the reply and what follows.
    auto tokens = prompt_tokens_.tokenize_after(rendered, turn.key);
    prompt_tokens_.remember(turn_key, std::move(rendered), tokens);
    return tokens;
}

void OpenAiRequestParser::parse_completion(const json& body, ParsedRequest& out) const {
    const json* prompt = find_field(body, "prompt");
    if (prompt == nullptr) {
        throw invalid_request("'prompt' is required", "prompt");
    }
    auto& gen = out.generation;
    const json* single = prompt;
    if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
        if (prompt->size() != 1) {
            throw invalid_request("only one prompt per request is supported", "prompt");
        }
        single = &(*prompt)[0];
    }
    if (single->is_string()) {
        const std::string text = checked_text(*single, "prompt");
        check_text_fits(text.size(), "prompt");
        gen.prompt = model_.tokenize(text, true, true);
    } else if (single->is_array()) {
        check_prompt_fits(single->size(), "prompt");
        for (const auto& item : *single) {
            if (!item.is_number_integer() && !item.is_number_unsigned()) {
                throw invalid_request("token prompts must be arrays of integers", "prompt");
            }
            const bool out_of_range =
                item.is_number_unsigned()
                    ? item.get<uint64_t>() >= static_cast<uint64_t>(model_.n_vocab())
                    : (item.get<int64_t>() < 0 || item.get<int64_t>() >= model_.n_vocab());
            if (out_of_range) {
                throw invalid_request("token id " + item.dump() +
                                          " is outside the vocabulary (0.." +
                                          std::to_string(model_.n_vocab() - 1) + ")",
                                      "prompt");
            }
            gen.prompt.push_back(static_cast<runtime::Token>(item.get<int64_t>()));
        }
    } else {
        throw invalid_request("'prompt' must be a string, an array of token ids or strings",
                              "prompt");
    }
    if (gen.prompt.empty()) {
        throw invalid_request("'prompt' must not be empty", "prompt");
    }
    const std::string schema =
        parse_response_format(find_field(body, "response_format"), limits_.chat);
    if (!schema.empty()) {
        if (!gen.sampling.grammar.empty()) {
            throw invalid_request("'grammar' cannot be combined with 'response_format'", "grammar");
        }
        try {
            gen.sampling.grammar = runtime::json_schema_grammar(schema);
        } catch (const std::invalid_argument& e) {
            throw invalid_request(std::string("'response_format': ") + e.what(), "response_format",
                                  "unsupported_schema");
        }
    }
}

}  // namespace skippy::server
