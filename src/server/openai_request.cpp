#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "server/api_error.h"
#include "server/text_output.h"

namespace skippy::server {

using nlohmann::json;

namespace {

const json* find_field(const json& body, const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) {
        return nullptr;
    }
    return &*it;
}

double number_field(const json& body, const char* name, double fallback, double min, double max) {
    const json* value = find_field(body, name);
    if (value == nullptr) {
        return fallback;
    }
    if (!value->is_number()) {
        throw invalid_request(std::string("'") + name + "' must be a number", name);
    }
    const double v = value->get<double>();
    if (!std::isfinite(v) || v < min || v > max) {
        throw invalid_request(std::string("'") + name + "' must be between " + std::to_string(min) +
                                  " and " + std::to_string(max),
                              name);
    }
    return v;
}

int64_t integer_field(const json& body, const char* name, int64_t fallback, int64_t min,
                      int64_t max) {
    const json* value = find_field(body, name);
    if (value == nullptr) {
        return fallback;
    }
    if (!value->is_number_integer() && !value->is_number_unsigned()) {
        throw invalid_request(std::string("'") + name + "' must be an integer", name);
    }
    if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(max)) {
        throw invalid_request(std::string("'") + name + "' is too large", name);
    }
    const int64_t v = value->get<int64_t>();
    if (v < min || v > max) {
        throw invalid_request(std::string("'") + name + "' must be between " + std::to_string(min) +
                                  " and " + std::to_string(max),
                              name);
    }
    return v;
}

bool bool_field(const json& body, const char* name, bool fallback) {
    const json* value = find_field(body, name);
    if (value == nullptr) {
        return fallback;
    }
    if (!value->is_boolean()) {
        throw invalid_request(std::string("'") + name + "' must be a boolean", name);
    }
    return value->get<bool>();
}

std::string checked_text(const json& value, const std::string& param) {
    if (!value.is_string()) {
        throw invalid_request("'" + param + "' must be a string", param);
    }
    const auto& text = value.get_ref<const std::string&>();
    if (!is_valid_utf8(text)) {
        throw invalid_request("'" + param + "' is not valid UTF-8", param);
    }
    return text;
}

// Skips what llama.cpp's grammar parser treats as space: blanks, newlines, # comments.
size_t skip_grammar_space(const std::string& g, size_t i) {
    while (i < g.size()) {
        if (g[i] == ' ' || g[i] == '\t' || g[i] == '\n' || g[i] == '\r') {
            ++i;
        } else if (g[i] == '#') {
            while (i < g.size() && g[i] != '\n' && g[i] != '\r') {
                ++i;
            }
        } else {
            break;
        }
    }
    return i;
}

// Reads the decimal number at `i` (nullopt when there is none or it has over 9 digits).
std::optional<uint64_t> grammar_number(const std::string& g, size_t& i) {
    const size_t begin = i;
    while (i < g.size() && g[i] >= '0' && g[i] <= '9') {
        ++i;
    }
    if (i == begin || i - begin > 9) {
        return std::nullopt;
    }
    return std::stoull(g.substr(begin, i - begin));
}

// A repetition "{m,n}" starting at `open`: llama.cpp loops (practically) forever on m > n
// (it counts n - m optional copies in unsigned arithmetic).
void check_grammar_repetition(const std::string& g, size_t open) {
    size_t i = skip_grammar_space(g, open + 1);
    const size_t min_digits = i;
    const auto min_times = grammar_number(g, i);
    if (!min_times) {
        if (i > min_digits) {
            throw invalid_request("'grammar' has a repetition count that is too large", "grammar");
        }
        return;  // not a repetition: llama.cpp reports the syntax error
    }
    i = skip_grammar_space(g, i);
    if (i >= g.size() || g[i] != ',') {
        return;
    }
    i = skip_grammar_space(g, i + 1);
    const size_t digits = i;
    const auto max_times = grammar_number(g, i);
    if (!max_times && i > digits) {
        throw invalid_request("'grammar' has a repetition count that is too large", "grammar");
    }
    if (max_times && *max_times < *min_times) {
        throw invalid_request("'grammar' has a repetition {m,n} with m > n", "grammar");
    }
}

// Checks a GBNF grammar against what llama.cpp's grammar parser (which runs on the
// scheduler thread) handles without crashing or hanging: nesting of parenthesized groups
// (it recurses per group), number of rules, size, and repetition bounds. Quoted literals,
// character classes and comments are skipped, so parentheses inside them do not count.
void check_grammar(const std::string& grammar, const RequestLimits& limits) {
    if (grammar.size() > limits.max_grammar_bytes) {
        throw invalid_request(
            "'grammar' is longer than " + std::to_string(limits.max_grammar_bytes) + " bytes",
            "grammar");
    }
    enum class State { Normal, Literal, CharClass, Comment };
    State state = State::Normal;
    size_t depth = 0;
    size_t rules = 0;
    for (size_t i = 0; i < grammar.size(); ++i) {
        const char c = grammar[i];
        switch (state) {
            case State::Normal:
                if (c == '"') {
                    state = State::Literal;
                } else if (c == '[') {
                    state = State::CharClass;
                } else if (c == '#') {
                    state = State::Comment;
                } else if (c == '(') {
                    if (++depth > limits.max_grammar_depth) {
                        throw invalid_request("'grammar' nests groups deeper than " +
                                                  std::to_string(limits.max_grammar_depth),
                                              "grammar");
                    }
                } else if (c == ')') {
                    depth = depth > 0 ? depth - 1 : 0;
                } else if (c == '{') {
                    check_grammar_repetition(grammar, i);
                } else if (c == ':' && grammar.compare(i, 3, "::=") == 0) {
                    if (++rules > limits.max_grammar_rules) {
                        throw invalid_request("'grammar' has more than " +
                                                  std::to_string(limits.max_grammar_rules) +
                                                  " rules",
                                              "grammar");
                    }
                    i += 2;
                }
                break;
            case State::Literal:
                if (c == '\\') {
                    ++i;
                } else if (c == '"') {
                    state = State::Normal;
                }
                break;
            case State::CharClass:
                if (c == '\\') {
                    ++i;
                } else if (c == ']') {
                    state = State::Normal;
                }
                break;
            case State::Comment:
                if (c == '\n' || c == '\r') {
                    state = State::Normal;
                }
                break;
        }
    }
}

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

void OpenAiRequestParser::parse_common(const json& body, ParsedRequest& out) const {
    if (const json* model = find_field(body, "model")) {
        out.model = checked_text(*model, "model");
        if (std::find(model_ids_.begin(), model_ids_.end(), out.model) == model_ids_.end()) {
            throw ApiError(404, "invalid_request_error",
                           "The model '" + out.model + "' does not exist", "model",
                           "model_not_found");
        }
    } else {
        out.model = model_ids_.front();
    }
    auto& gen = out.generation;
    auto& s = gen.sampling;
    out.stream = bool_field(body, "stream", false);
    if (const json* options = find_field(body, "stream_options")) {
        if (!options->is_object()) {
            throw invalid_request("'stream_options' must be an object", "stream_options");
        }
        out.include_usage = bool_field(*options, "include_usage", false);
    }
    const int64_t n = integer_field(body, "n", 1, 1, 128);
    if (n != 1) {
        throw invalid_request("only n=1 is supported", "n");
    }
    const int64_t max_ctx = static_cast<int64_t>(limits_.n_ctx);
    int64_t max_tokens = integer_field(body, "max_tokens", -1, 1, 1 << 30);
    max_tokens = integer_field(body, "max_completion_tokens", max_tokens, 1, 1 << 30);
    if (max_tokens > max_ctx) {
        throw invalid_request(
            "'max_tokens' is larger than the context (" + std::to_string(max_ctx) + ")",
            "max_tokens");
    }
    gen.max_tokens = static_cast<int32_t>(max_tokens < 0 ? max_ctx : max_tokens);
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
        check_grammar(s.grammar, limits_);
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
    if (const json* key = find_field(body, "prompt_cache_key")) {
        gen.cache_namespace = checked_text(*key, "prompt_cache_key");
    }
    out.return_token_ids = bool_field(body, "return_token_ids", false);
    if (bool_field(body, "logprobs", false)) {
        throw invalid_request("logprobs are not supported", "logprobs");
    }
    if (const json* echo = find_field(body, "echo");
        echo != nullptr && echo->is_boolean() && echo->get<bool>()) {
        throw invalid_request("echo is not supported", "echo");
    }
}

std::vector<runtime::ChatMessage> OpenAiRequestParser::parse_messages(const json& messages) const {
    if (!messages.is_array()) {
        throw invalid_request("'messages' must be an array", "messages");
    }
    if (messages.empty()) {
        throw invalid_request("'messages' must not be empty", "messages");
    }
    if (messages.size() > limits_.max_messages) {
        throw invalid_request("too many messages", "messages");
    }
    static const std::vector<std::string> roles = {"system", "developer", "user", "assistant",
                                                   "tool"};
    std::vector<runtime::ChatMessage> out;
    for (size_t i = 0; i < messages.size(); ++i) {
        const auto& message = messages[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!message.is_object()) {
            throw invalid_request(where + " must be an object", where);
        }
        const json* role = find_field(message, "role");
        if (role == nullptr || !role->is_string()) {
            throw invalid_request(where + ".role is required and must be a string",
                                  where + ".role");
        }
        runtime::ChatMessage parsed;
        parsed.role = role->get<std::string>();
        if (std::find(roles.begin(), roles.end(), parsed.role) == roles.end()) {
            throw invalid_request(where + ".role '" + parsed.role +
                                      "' is not one of system, developer, user, assistant, tool",
                                  where + ".role");
        }
        if (parsed.role == "developer") {
            parsed.role = "system";
        }
        const json* content = find_field(message, "content");
        if (content == nullptr) {
            if (parsed.role != "assistant") {
                throw invalid_request(where + ".content is required", where + ".content");
            }
        } else if (content->is_string()) {
            parsed.content = checked_text(*content, where + ".content");
        } else if (content->is_array()) {
            for (const auto& part : *content) {
                const json* type = part.is_object() ? find_field(part, "type") : nullptr;
                if (type == nullptr || !type->is_string() || *type != "text" ||
                    !part.contains("text")) {
                    throw invalid_request(where + ".content parts must be {type: 'text', text}",
                                          where + ".content");
                }
                if (!parsed.content.empty()) {
                    parsed.content += "\n";
                }
                parsed.content += checked_text(part["text"], where + ".content");
            }
        } else {
            throw invalid_request(where + ".content must be a string or an array of parts",
                                  where + ".content");
        }
        out.push_back(std::move(parsed));
    }
    return out;
}

void OpenAiRequestParser::parse_chat(const json& body, ParsedRequest& out) const {
    const json* messages_json = find_field(body, "messages");
    if (messages_json == nullptr) {
        throw invalid_request("'messages' is required", "messages");
    }
    const auto messages = parse_messages(*messages_json);
    const std::string prompt = render_chat(chat_template_, messages, true);
    check_text_fits(prompt.size(), "messages");
    auto& gen = out.generation;
    gen.prompt = model_.tokenize(prompt, true, true);
    // Before the boundary search: a prompt that cannot fit is rejected cheaply.
    check_prompt_fits(gen.prompt.size(), "messages");
    // Structural record positions: where each earlier message ends in the prompt's tokens.
    const MessageKeys keys = message_keys(messages);
    gen.message_boundaries = boundaries_.find(messages, keys, prompt, gen.prompt);
    // The next turn of this conversation renders this prompt as the head before the reply,
    // and the end of this turn (rendered below) as the head before its new message.
    boundaries_.remember(keys.back(), true, prompt);
    auto history = std::make_shared<const std::vector<runtime::ChatMessage>>(messages);
    gen.render_turn_end = [this, history, key = keys.back()](const std::string& reply) {
        std::vector<runtime::ChatMessage> with_reply = *history;
        with_reply.push_back(runtime::ChatMessage{"assistant", reply});
        const std::string text = render_chat(chat_template_, with_reply, false);
        boundaries_.remember(extend_message_key(key, with_reply.back()), false, text);
        return model_.tokenize(text, true, true);
    };
    out.prepare_next_turn = [this, history, key = keys.back()] {
        boundaries_.prepare(key, *history, false);
    };
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
}

}  // namespace skippy::server
