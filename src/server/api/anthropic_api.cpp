#include "server/api/anthropic_api.h"

#include "server/api/api_error.h"
#include "server/api/block_stream_response.h"
#include "server/api/chat_reply.h"
#include "server/api/json_fields.h"

namespace skippy::server {

using nlohmann::json;

namespace {

// Text of a string or an array of text blocks (cache_control and citations are ignored: the
// prefix cache is automatic and citations do not change the output).
std::string block_text(const json& content, const std::string& where,
                       bool allow_references = false) {
    static const TextParts kText = {.types = {"text"},
                                    .ignored = {"cache_control", "citations"},
                                    .expected = "a text block",
                                    .unsupported = "images and documents are not supported",
                                    .array_of = "blocks"};
    if (!allow_references) {
        return text_of_parts(content, where, kText);
    }
    return text_of_parts(
        content, where, kText, [](const json& block, const std::string& w, std::string& out) {
            if (!block.is_object() || block.value("type", "") != "tool_reference") {
                return false;
            }
            // Tool search: the tool it names is now in the model's tool list.
            reject_unknown_fields(
                block, {{"type", FieldUse::Honored}, {"tool_name", FieldUse::Honored}}, w);
            out += "Tool loaded: " + string_field(block, "tool_name", "", w) + "\n";
            return true;
        });
}

// `ordered`: the same message with its object keys in the client's order (a tool_use input
// goes back to the template in that order: the order the reply generated them in).
void convert_message(const json& message, const nlohmann::ordered_json& ordered,
                     const std::string& where, json& out_messages) {
    if (!message.is_object()) {
        throw invalid_request("'" + where + "' must be an object", where);
    }
    reject_unknown_fields(message,
                          {{"role", FieldUse::Honored},
                           {"content", FieldUse::Honored},
                           {"output_config", FieldUse::Honored}},
                          where);
    const std::string role = string_field(message, "role", "", where);
    if (role == "system") {
        // A system message between turns (what Claude Code sends after the user's first
        // message): rendered where it stands, as a system message of the chat template.
        const json* content = find_field(message, "content");
        if (content == nullptr) {
            throw invalid_request("'" + where + ".content' is required", where + ".content");
        }
        out_messages.push_back(
            json{{"role", "system"}, {"content", block_text(*content, where + ".content")}});
        return;
    }
    if (role != "user" && role != "assistant") {
        throw invalid_request("'" + where + ".role' must be 'user', 'assistant' or 'system'",
                              where + ".role");
    }
    const json* content = find_field(message, "content");
    if (content == nullptr) {
        throw invalid_request("'" + where + ".content' is required", where + ".content");
    }
    if (content->is_string()) {
        out_messages.push_back(json{{"role", role}, {"content", *content}});
        return;
    }
    if (!content->is_array()) {
        throw invalid_request("'" + where + ".content' must be a string or an array of blocks",
                              where + ".content");
    }
    std::string text;
    std::string thinking;
    json tool_calls = json::array();
    json tool_results = json::array();
    for (size_t i = 0; i < content->size(); ++i) {
        const json& block = (*content)[i];
        const std::string w = where + ".content[" + std::to_string(i) + "]";
        if (!block.is_object()) {
            throw invalid_request("'" + w + "' must be an object", w);
        }
        const std::string type = string_field(block, "type", "", w);
        if (type == "text") {
            reject_unknown_fields(block,
                                  {{"type", FieldUse::Honored},
                                   {"text", FieldUse::Honored},
                                   {"cache_control", FieldUse::Ignored},
                                   {"citations", FieldUse::Ignored}},
                                  w);
            text += checked_text(block.value("text", json("")), w + ".text");
        } else if (type == "thinking" && role == "assistant") {
            thinking += string_field(block, "thinking", "", w);
        } else if (type == "redacted_thinking" && role == "assistant") {
            // Opaque; nothing to render.
        } else if (type == "tool_use" && role == "assistant") {
            reject_unknown_fields(block,
                                  {{"type", FieldUse::Honored},
                                   {"id", FieldUse::Honored},
                                   {"name", FieldUse::Honored},
                                   {"input", FieldUse::Honored},
                                   {"cache_control", FieldUse::Ignored}},
                                  w);
            const json* input = find_field(block, "input");
            if (input != nullptr && !input->is_object()) {
                throw invalid_request("'" + w + ".input' must be an object", w + ".input");
            }
            std::string arguments = "{}";
            if (input != nullptr) {
                try {
                    arguments = ordered.at("content").at(i).at("input").dump(
                        -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
                } catch (const nlohmann::ordered_json::exception&) {
                    arguments = input->dump();  // duplicate keys made the two parses differ
                }
            }
            tool_calls.push_back(
                json{{"id", string_field(block, "id", "", w)},
                     {"type", "function"},
                     {"function",
                      {{"name", string_field(block, "name", "", w)}, {"arguments", arguments}}}});
        } else if (type == "tool_result" && role == "user") {
            reject_unknown_fields(block,
                                  {{"type", FieldUse::Honored},
                                   {"tool_use_id", FieldUse::Honored},
                                   {"content", FieldUse::Honored},
                                   {"is_error", FieldUse::Honored},
                                   {"cache_control", FieldUse::Ignored}},
                                  w);
            std::string result;
            if (const json* c = find_field(block, "content")) {
                result = block_text(*c, w + ".content", true);
            }
            if (bool_field(block, "is_error", false)) {
                result = "Error: " + result;
            }
            tool_results.push_back(json{{"role", "tool"},
                                        {"tool_call_id", string_field(block, "tool_use_id", "", w)},
                                        {"content", result}});
        } else {
            throw invalid_request(
                "'" + w + "' has unsupported block type '" + type + "' for a " + role + " message",
                w + ".type");
        }
    }
    // Tool results answer the previous assistant turn: they come first, then any text.
    for (auto& r : tool_results) {
        out_messages.push_back(std::move(r));
    }
    if (!text.empty() || !tool_calls.empty() || !thinking.empty() || tool_results.empty()) {
        json m = {{"role", role}, {"content", text}};
        if (!tool_calls.empty()) {
            m["tool_calls"] = tool_calls;
        }
        if (!thinking.empty()) {
            m["reasoning_content"] = thinking;
        }
        out_messages.push_back(std::move(m));
    }
}

}  // namespace

std::string anthropic_error_type(int status) {
    switch (status) {
        case 400:
        case 413:
        case 415:
            return status == 413 ? "request_too_large" : "invalid_request_error";
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 429:
            return "rate_limit_error";
        case 503:
            return "overloaded_error";
        default:
            return "api_error";
    }
}

json anthropic_error(int status, const std::string& message) {
    return json{{"type", "error"},
                {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

namespace {

// Tool types of Anthropic's API that run on Anthropic's side or need a built-in schema
// (web search and fetch, code execution, bash, text editor, computer use, memory, tool
// search, MCP toolsets): nothing here runs them, so the model does not see them.
bool is_server_tool(const std::string& type) { return !type.empty() && type != "custom"; }

// Tool names that a tool_result's tool_reference blocks load (tool search): a deferred tool
// (defer_loading) is shown to the model once one of them names it.
std::vector<std::string> referenced_tools(const json& messages) {
    std::vector<std::string> names;
    if (!messages.is_array()) {
        return names;
    }
    for (const auto& message : messages) {
        const json* content = message.is_object() ? find_field(message, "content") : nullptr;
        if (content == nullptr || !content->is_array()) {
            continue;
        }
        for (const auto& block : *content) {
            if (!block.is_object() || block.value("type", "") != "tool_result") {
                continue;
            }
            const json* inner = find_field(block, "content");
            if (inner == nullptr || !inner->is_array()) {
                continue;
            }
            for (const auto& ref : *inner) {
                if (ref.is_object() && ref.value("type", "") == "tool_reference" &&
                    ref.contains("tool_name") && ref["tool_name"].is_string()) {
                    names.push_back(ref["tool_name"].get<std::string>());
                }
            }
        }
    }
    return names;
}

// A system message inside `messages` goes where Anthropic's API accepts it: right after a
// user message, and last or before an assistant message (never first, never two in a row).
void check_system_placement(const json& messages) {
    for (size_t i = 0; i < messages.size(); ++i) {
        if (!messages[i].is_object() || messages[i].value("role", "") != "system") {
            continue;
        }
        const bool after_user =
            i > 0 && messages[i - 1].is_object() && messages[i - 1].value("role", "") == "user";
        const bool before_assistant =
            i + 1 == messages.size() ||
            (messages[i + 1].is_object() && messages[i + 1].value("role", "") == "assistant");
        if (!after_user || !before_assistant) {
            const std::string w = "messages[" + std::to_string(i) + "]";
            throw invalid_request("'" + w +
                                      "': a system message must follow a user message and be "
                                      "the last message or be followed by an assistant message",
                                  w + ".role");
        }
    }
}

json convert_tools(const json& tools, const json* messages, RequestNotes& notes) {
    if (!tools.is_array()) {
        throw invalid_request("'tools' must be an array", "tools");
    }
    const std::vector<std::string> loaded =
        messages != nullptr ? referenced_tools(*messages) : std::vector<std::string>{};
    json out = json::array();
    json loaded_tools = json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const json& tool = tools[i];
        const std::string w = "tools[" + std::to_string(i) + "]";
        if (!tool.is_object()) {
            throw invalid_request("'" + w + "' must be an object", w);
        }
        const std::string type = string_field(tool, "type", "", w);
        if (is_server_tool(type)) {
            notes.dropped_tools.push_back(type + ":" + tool.value("name", std::string()));
            continue;
        }
        reject_unknown_fields(tool,
                              {{"type", FieldUse::Honored},
                               {"name", FieldUse::Honored},
                               {"description", FieldUse::Honored},
                               {"input_schema", FieldUse::Honored},
                               {"defer_loading", FieldUse::Honored},
                               {"cache_control", FieldUse::Ignored},
                               {"strict", FieldUse::Ignored},
                               {"eager_input_streaming", FieldUse::Ignored},
                               {"allowed_callers", FieldUse::Ignored},
                               {"input_examples", FieldUse::Rejected}},
                              w);
        const std::string name = string_field(tool, "name", "", w);
        // Deferred tools (tool search): the model sees them once a tool_reference in the
        // conversation loaded them, after the others (the rendered tool list then changes
        // only past its old end).
        const bool deferred = bool_field(tool, "defer_loading", false);
        if (deferred && std::find(loaded.begin(), loaded.end(), name) == loaded.end()) {
            continue;
        }
        json fn = {{"name", name}};
        if (const json* d = find_field(tool, "description")) {
            fn["description"] = *d;
        }
        const json* schema = find_field(tool, "input_schema");
        if (schema == nullptr) {
            throw invalid_request("'" + w + ".input_schema' is required", w + ".input_schema");
        }
        fn["parameters"] = *schema;
        (deferred ? loaded_tools : out).push_back(json{{"type", "function"}, {"function", fn}});
    }
    for (auto& tool : loaded_tools) {
        out.push_back(std::move(tool));
    }
    return out;
}

void convert_tool_choice(const json& choice, json& chat) {
    if (!choice.is_object()) {
        throw invalid_request("'tool_choice' must be an object", "tool_choice");
    }
    reject_unknown_fields(choice,
                          {{"type", FieldUse::Honored},
                           {"name", FieldUse::Honored},
                           {"disable_parallel_tool_use", FieldUse::Honored}},
                          "tool_choice");
    const std::string type = string_field(choice, "type", "", "tool_choice");
    const bool has_tools = chat.contains("tools") && !chat["tools"].empty();
    if (type == "auto" || type == "none") {
        if (has_tools) {
            chat["tool_choice"] = type;
        }
    } else if (type == "any") {
        if (!has_tools) {
            throw invalid_request(
                "tool_choice 'any' but none of the tools can be run here (server tools are "
                "not run)",
                "tool_choice");
        }
        chat["tool_choice"] = "required";
    } else if (type == "tool") {
        const std::string name = string_field(choice, "name", "", "tool_choice");
        bool found = false;
        for (const auto& t : has_tools ? chat["tools"] : json::array()) {
            found = found || t["function"]["name"] == name;
        }
        if (!found) {
            throw invalid_request(
                "tool_choice names '" + name + "', which is not a tool the model can call here",
                "tool_choice.name");
        }
        chat["tool_choice"] = json{{"type", "function"}, {"function", {{"name", name}}}};
    } else {
        throw invalid_request("'tool_choice.type' must be auto, any, tool or none",
                              "tool_choice.type");
    }
    if (has_tools) {
        chat["parallel_tool_calls"] = !bool_field(choice, "disable_parallel_tool_use", false);
    }
}

// thinking: enabled / disabled switch the template's reasoning; adaptive leaves the
// choice to the model (the template's default). display "omitted": thinking blocks carry
// no text.
void convert_thinking(const json& thinking, json& chat, AnthropicRequest& out) {
    if (!thinking.is_object()) {
        throw invalid_request("'thinking' must be an object", "thinking");
    }
    reject_unknown_fields(thinking,
                          {{"type", FieldUse::Honored},
                           {"budget_tokens", FieldUse::Ignored},
                           {"display", FieldUse::Honored}},
                          "thinking");
    const std::string type = string_field(thinking, "type", "", "thinking");
    if (type == "enabled" || type == "disabled") {
        chat["chat_template_kwargs"] = json{{"enable_thinking", type == "enabled"}};
    } else if (type != "adaptive") {
        throw invalid_request("'thinking.type' must be 'enabled', 'disabled' or 'adaptive'",
                              "thinking.type");
    }
    const std::string display = string_field(thinking, "display", "summarized", "thinking");
    if (display != "summarized" && display != "omitted") {
        throw invalid_request("'thinking.display' must be 'summarized' or 'omitted'",
                              "thinking.display");
    }
    out.omit_thinking = display == "omitted" && type != "disabled";
}

// output_config: effort is the template's reasoning switch (reasoning_effort); format is a
// structured output (a JSON schema the reply must match).
void convert_output_config(const json& config, json& chat, const std::string& where) {
    if (!config.is_object()) {
        throw invalid_request("'" + where + "' must be an object", where);
    }
    reject_unknown_fields(config, {{"effort", FieldUse::Honored}, {"format", FieldUse::Honored}},
                          where);
    if (const json* effort = find_field(config, "effort")) {
        const std::string v = checked_text(*effort, where + ".effort");
        if (v != "low" && v != "medium" && v != "high" && v != "xhigh" && v != "max") {
            throw invalid_request("'" + where + ".effort' must be low, medium, high, xhigh or max",
                                  where + ".effort");
        }
        chat["reasoning_effort"] = v == "max" ? "xhigh" : v;
    }
    if (const json* format = find_field(config, "format")) {
        if (!format->is_object() || format->value("type", "") != "json_schema" ||
            !format->contains("schema")) {
            throw invalid_request(
                "'" + where + ".format' must be {\"type\": \"json_schema\", \"schema\": ...}",
                where + ".format");
        }
        chat["response_format"] =
            json{{"type", "json_schema"},
                 {"json_schema", {{"name", "output"}, {"schema", (*format)["schema"]}}}};
    }
}

}  // namespace

AnthropicRequest anthropic_request(const json& body, const nlohmann::ordered_json& ordered,
                                   const TokenCounter& count_tokens) {
    if (!body.is_object()) {
        throw invalid_request("request body must be a JSON object");
    }
    AnthropicRequest out;
    reject_unknown_fields(body,
                          {{"model", FieldUse::Honored},
                           {"messages", FieldUse::Honored},
                           {"system", FieldUse::Honored},
                           {"max_tokens", FieldUse::Honored},
                           {"stop_sequences", FieldUse::Honored},
                           {"stream", FieldUse::Honored},
                           {"temperature", FieldUse::Honored},
                           {"top_p", FieldUse::Honored},
                           {"top_k", FieldUse::Honored},
                           {"tools", FieldUse::Honored},
                           {"tool_choice", FieldUse::Honored},
                           {"thinking", FieldUse::Honored},
                           {"context_management", FieldUse::Honored},
                           {"output_config", FieldUse::Honored},
                           {"cache_salt", FieldUse::Honored},
                           {"metadata", FieldUse::Ignored},
                           {"service_tier", FieldUse::Ignored},
                           {"cache_control", FieldUse::Ignored},
                           {"inference_geo", FieldUse::Ignored},
                           {"container", FieldUse::Rejected},
                           {"mcp_servers", FieldUse::Rejected}},
                          "", &out.notes.ignored_fields);
    json& chat = out.chat;
    chat = json::object();
    if (const json* model = find_field(body, "model")) {
        chat["model"] = *model;
    }
    json messages = json::array();
    if (const json* system = find_field(body, "system")) {
        messages.push_back(json{{"role", "system"}, {"content", block_text(*system, "system")}});
    }
    const json* input = find_field(body, "messages");
    if (input == nullptr || !input->is_array() || input->empty()) {
        throw invalid_request("'messages' is required and must be a non-empty array", "messages");
    }
    const ContextEdits edits = parse_context_management(find_field(body, "context_management"));
    if (find_field(body, "context_management") == nullptr) {
        out.applied_edits = nullptr;  // the response has no context_management then
    }
    check_system_placement(*input);
    for (size_t i = 0; i < input->size(); ++i) {
        static const nlohmann::ordered_json none = nlohmann::ordered_json::object();
        const nlohmann::ordered_json* ordered_message = &none;
        try {
            ordered_message = &ordered.at("messages").at(i);
        } catch (const nlohmann::ordered_json::exception&) {
        }
        convert_message((*input)[i], *ordered_message, "messages[" + std::to_string(i) + "]",
                        messages);
    }
    chat["messages"] = messages;
    if (find_field(body, "max_tokens") == nullptr) {
        throw invalid_request("'max_tokens' is required", "max_tokens");
    }
    chat["max_tokens"] = body["max_tokens"];
    for (const char* key : {"stream", "temperature", "top_p", "top_k", "cache_salt"}) {
        if (const json* v = find_field(body, key)) {
            chat[key] = *v;
        }
    }
    if (const json* stop = find_field(body, "stop_sequences")) {
        chat["stop"] = *stop;
    }
    if (const json* tools = find_field(body, "tools")) {
        json converted = convert_tools(*tools, input, out.notes);
        if (!converted.empty()) {
            chat["tools"] = std::move(converted);
        }
    }
    if (const json* choice = find_field(body, "tool_choice")) {
        convert_tool_choice(*choice, chat);
    }
    if (const json* thinking = find_field(body, "thinking")) {
        convert_thinking(*thinking, chat, out);
    }
    if (const json* config = find_field(body, "output_config")) {
        convert_output_config(*config, chat, "output_config");
    }
    // Per-turn control (beta per-turn-control-2026-07-01): a message's output_config governs
    // the reply that follows it, so the last message's applies to this one (over the
    // request's); earlier ones governed earlier replies and change nothing now.
    for (size_t i = 0; i < input->size(); ++i) {
        if (const json* config = find_field((*input)[i], "output_config")) {
            json turn = json::object();
            convert_output_config(*config, turn,
                                  "messages[" + std::to_string(i) + "].output_config");
            if (i + 1 == input->size()) {
                chat.update(turn);
            }
        }
    }
    apply_context_edits(edits, chat, count_tokens, out.applied_edits);
    return out;
}

json anthropic_to_chat(const json& body, const nlohmann::ordered_json& ordered) {
    return anthropic_request(body, ordered, {}).chat;
}

namespace {

std::string stop_reason(const GenerationStats& stats, const runtime::ChatReply& reply) {
    if (stats.finish_reason == "length") {
        return "max_tokens";
    }
    if (!stats.stop_sequence.empty()) {
        return "stop_sequence";
    }
    return reply.tool_calls.empty() ? "end_turn" : "tool_use";
}

json stop_sequence(const GenerationStats& stats) {
    return stats.stop_sequence.empty() ? json(nullptr) : json(stats.stop_sequence);
}

// Key order kept: the client sends the input back as it got it, and the prompt renders it.
nlohmann::ordered_json tool_input(const std::string& arguments) {
    auto input = nlohmann::ordered_json::parse(arguments, nullptr, false);
    return input.is_object() ? input : nlohmann::ordered_json::object();
}

json usage(const GenerationStats& stats) {
    return json{{"input_tokens", stats.prompt_tokens - stats.cached_tokens},
                {"cache_creation_input_tokens", 0},
                {"cache_read_input_tokens", stats.cached_tokens},
                {"output_tokens", stats.completion_tokens}};
}

class AnthropicResponse final : public BlockStreamResponse {
  public:
    AnthropicResponse(std::shared_ptr<const ParsedRequest> parsed, bool omit_thinking,
                      json applied_edits)
        : BlockStreamResponse(std::move(parsed)),
          omit_thinking_(omit_thinking),
          applied_edits_(std::move(applied_edits)),
          id_(random_id("msg_")) {}

    std::string stream_start() override {
        json message = {{"id", id_},
                        {"type", "message"},
                        {"role", "assistant"},
                        {"model", parsed_->model},
                        {"content", json::array()},
                        {"stop_reason", nullptr},
                        {"stop_sequence", nullptr},
                        {"usage",
                         {{"input_tokens", parsed_->generation.prompt.size()},
                          {"cache_creation_input_tokens", 0},
                          {"cache_read_input_tokens", 0},
                          {"output_tokens", 0}}}};
        return sse_event("message_start", json{{"type", "message_start"}, {"message", message}});
    }

    std::string finish() override {
        if (!parsed_->stream) {
            using ojson = nlohmann::ordered_json;
            ojson content = ojson::array();
            if (!reply().reasoning_content.empty()) {
                content.push_back(
                    ojson{{"type", "thinking"},
                          {"thinking", omit_thinking_ ? std::string() : reply().reasoning_content},
                          {"signature", ""}});
            }
            if (!reply().content.empty()) {
                content.push_back(ojson{{"type", "text"}, {"text", reply().content}});
            }
            for (const auto& call : reply().tool_calls) {
                content.push_back(ojson{{"type", "tool_use"},
                                        {"id", call.id},
                                        {"name", call.name},
                                        {"input", tool_input(call.arguments)}});
            }
            ojson out = {{"id", id_},
                         {"type", "message"},
                         {"role", "assistant"},
                         {"model", parsed_->model},
                         {"content", content},
                         {"stop_reason", stop_reason(stats(), reply())},
                         {"stop_sequence", ojson::parse(stop_sequence(stats()).dump())},
                         {"usage", ojson::parse(usage(stats()).dump())},
                         {"skippy", ojson::parse(skippy_json(stats(), parsed_->parse_ms).dump())}};
            if (!applied_edits_.is_null()) {
                out["context_management"] =
                    ojson{{"applied_edits", ojson::parse(applied_edits_.dump())}};
            }
            return out.dump(-1, ' ', false, ojson::error_handler_t::replace);
        }
        json delta = {{"type", "message_delta"},
                      {"delta",
                       {{"stop_reason", stop_reason(stats(), reply())},
                        {"stop_sequence", stop_sequence(stats())}}},
                      {"usage", usage(stats())},
                      {"skippy", skippy_json(stats(), parsed_->parse_ms)}};
        if (!applied_edits_.is_null()) {
            delta["context_management"] = json{{"applied_edits", applied_edits_}};
        }
        std::string out = sse_event("message_delta", delta);
        return out + sse_event("message_stop", json{{"type", "message_stop"}});
    }

    std::string stream_error(int status, const std::string&, const std::string& message) override {
        return sse_event("error", anthropic_error(status, message));
    }

    json error_json(int status, const std::string&, const std::string& message, const std::string&,
                    const std::string&) const override {
        return anthropic_error(status, message);
    }

  private:
    std::string render(const std::vector<BlockEvent>& list) override {
        std::string out;
        for (const auto& e : list) {
            switch (e.type) {
                case BlockEvent::Type::Open: {
                    json block;
                    if (e.kind == BlockEvent::Kind::Text) {
                        block = {{"type", "text"}, {"text", ""}};
                    } else if (e.kind == BlockEvent::Kind::Reasoning) {
                        block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
                    } else {
                        block = {{"type", "tool_use"},
                                 {"id", e.id},
                                 {"name", e.name},
                                 {"input", json::object()}};
                    }
                    out += sse_event("content_block_start", json{{"type", "content_block_start"},
                                                                 {"index", e.block},
                                                                 {"content_block", block}});
                    break;
                }
                case BlockEvent::Type::Delta: {
                    if (omit_thinking_ && e.kind == BlockEvent::Kind::Reasoning) {
                        break;  // display "omitted": the block carries no text
                    }
                    json delta;
                    if (e.kind == BlockEvent::Kind::Text) {
                        delta = {{"type", "text_delta"}, {"text", e.text}};
                    } else if (e.kind == BlockEvent::Kind::Reasoning) {
                        delta = {{"type", "thinking_delta"}, {"thinking", e.text}};
                    } else {
                        delta = {{"type", "input_json_delta"}, {"partial_json", e.text}};
                    }
                    out += sse_event("content_block_delta", json{{"type", "content_block_delta"},
                                                                 {"index", e.block},
                                                                 {"delta", delta}});
                    break;
                }
                case BlockEvent::Type::Close:
                    out += sse_event("content_block_stop",
                                     json{{"type", "content_block_stop"}, {"index", e.block}});
                    break;
            }
        }
        return out;
    }

    bool omit_thinking_ = false;
    json applied_edits_;  // null: the request had no context_management
    std::string id_;
};

}  // namespace

std::unique_ptr<ApiResponse> make_anthropic_response(std::shared_ptr<const ParsedRequest> parsed,
                                                     bool omit_thinking, json applied_edits) {
    return std::make_unique<AnthropicResponse>(std::move(parsed), omit_thinking,
                                               std::move(applied_edits));
}

}  // namespace skippy::server
