#include "server/api/responses_api.h"

#include <ctime>

#include "server/api/api_error.h"
#include "server/api/block_stream_response.h"
#include "server/api/chat_reply.h"
#include "server/api/json_fields.h"

namespace skippy::server {

using nlohmann::json;

namespace {

std::string item_text(const json& content, const std::string& where) {
    static const TextParts kText = {.types = {"input_text", "output_text", "text"},
                                    .ignored = {"annotations", "logprobs"},
                                    .expected = "an input_text or output_text part",
                                    .unsupported = "images, audio and files are not supported",
                                    .array_of = "content parts"};
    return text_of_parts(content, where, kText);
}

}  // namespace

json responses_to_chat(const json& body, RequestNotes& notes) {
    if (!body.is_object()) {
        throw invalid_request("request body must be a JSON object");
    }
    if (find_field(body, "previous_response_id") != nullptr) {
        throw invalid_request(
            "previous_response_id is not supported: responses are not stored, send the whole "
            "input (the prefix cache makes that cheap)",
            "previous_response_id");
    }
    if (bool_field(body, "background", false)) {
        throw invalid_request("background responses are not supported", "background");
    }
    reject_unknown_fields(body,
                          {{"model", FieldUse::Honored},
                           {"input", FieldUse::Honored},
                           {"instructions", FieldUse::Honored},
                           {"tools", FieldUse::Honored},
                           {"tool_choice", FieldUse::Honored},
                           {"parallel_tool_calls", FieldUse::Honored},
                           {"max_output_tokens", FieldUse::Honored},
                           {"temperature", FieldUse::Honored},
                           {"top_p", FieldUse::Honored},
                           {"stream", FieldUse::Honored},
                           {"text", FieldUse::Honored},
                           {"reasoning", FieldUse::Honored},
                           {"prompt_cache_key", FieldUse::Honored},
                           {"truncation", FieldUse::Honored},
                           {"store", FieldUse::Ignored},
                           {"include", FieldUse::Ignored},
                           {"metadata", FieldUse::Ignored},
                           {"user", FieldUse::Ignored},
                           {"service_tier", FieldUse::Ignored},
                           {"safety_identifier", FieldUse::Ignored},
                           {"prompt_cache_retention", FieldUse::Ignored},
                           {"stream_options", FieldUse::Ignored},
                           {"client_metadata", FieldUse::Ignored},
                           {"background", FieldUse::Ignored},  // false (true: above)
                           {"cache_salt", FieldUse::Honored},
                           {"conversation", FieldUse::Rejected},
                           {"prompt", FieldUse::Rejected},
                           {"max_tool_calls", FieldUse::Rejected},
                           {"top_logprobs", FieldUse::Rejected}},
                          "", &notes.ignored_fields);
    json chat = json::object();
    for (const char* key : {"model", "temperature", "top_p", "stream", "prompt_cache_key",
                            "cache_salt", "parallel_tool_calls"}) {
        if (const json* v = find_field(body, key)) {
            chat[key] = *v;
        }
    }
    if (const json* v = find_field(body, "max_output_tokens")) {
        chat["max_tokens"] = *v;
    }
    if (const json* t = find_field(body, "truncation"); t != nullptr && *t != "disabled") {
        throw invalid_request("only truncation 'disabled' is supported", "truncation");
    }
    json messages = json::array();
    if (const json* instructions = find_field(body, "instructions")) {
        messages.push_back(
            json{{"role", "system"}, {"content", checked_text(*instructions, "instructions")}});
    }
    const json* input = find_field(body, "input");
    if (input == nullptr) {
        throw invalid_request("'input' is required", "input");
    }
    if (input->is_string()) {
        messages.push_back(json{{"role", "user"}, {"content", *input}});
    } else if (input->is_array()) {
        for (size_t i = 0; i < input->size(); ++i) {
            const json& item = (*input)[i];
            const std::string w = "input[" + std::to_string(i) + "]";
            if (!item.is_object()) {
                throw invalid_request("'" + w + "' must be an object", w);
            }
            const std::string type = item.value("type", item.contains("role") ? "message" : "");
            if (type == "message") {
                reject_unknown_fields(item,
                                      {{"type", FieldUse::Honored},
                                       {"role", FieldUse::Honored},
                                       {"content", FieldUse::Honored},
                                       {"id", FieldUse::Ignored},
                                       {"status", FieldUse::Ignored},
                                       {"phase", FieldUse::Ignored}},
                                      w);
                std::string role = string_field(item, "role", "", w);
                if (role != "user" && role != "assistant" && role != "system" &&
                    role != "developer") {
                    throw invalid_request("'" + w +
                                              ".role' must be user, assistant, system or "
                                              "developer",
                                          w + ".role");
                }
                const json* content = find_field(item, "content");
                if (content == nullptr) {
                    throw invalid_request("'" + w + ".content' is required", w + ".content");
                }
                messages.push_back(
                    json{{"role", role}, {"content", item_text(*content, w + ".content")}});
            } else if (type == "function_call") {
                reject_unknown_fields(item,
                                      {{"type", FieldUse::Honored},
                                       {"call_id", FieldUse::Honored},
                                       {"name", FieldUse::Honored},
                                       {"arguments", FieldUse::Honored},
                                       {"namespace", FieldUse::Ignored},
                                       {"id", FieldUse::Ignored},
                                       {"status", FieldUse::Ignored}},
                                      w);
                json call = {{"id", string_field(item, "call_id", "", w)},
                             {"type", "function"},
                             {"function",
                              {{"name", string_field(item, "name", "", w)},
                               {"arguments", string_field(item, "arguments", "{}", w)}}}};
                // Calls right after an assistant message (or another call) belong to it.
                if (!messages.empty() && messages.back()["role"] == "assistant") {
                    auto& last = messages.back();
                    if (!last.contains("tool_calls")) {
                        last["tool_calls"] = json::array();
                    }
                    last["tool_calls"].push_back(call);
                } else {
                    messages.push_back(json{{"role", "assistant"},
                                            {"content", ""},
                                            {"tool_calls", json::array({call})}});
                }
            } else if (type == "function_call_output") {
                reject_unknown_fields(item,
                                      {{"type", FieldUse::Honored},
                                       {"call_id", FieldUse::Honored},
                                       {"output", FieldUse::Honored},
                                       {"id", FieldUse::Ignored},
                                       {"status", FieldUse::Ignored}},
                                      w);
                const json* output = find_field(item, "output");
                messages.push_back(
                    json{{"role", "tool"},
                         {"tool_call_id", string_field(item, "call_id", "", w)},
                         {"content", output != nullptr ? item_text(*output, w + ".output") : ""}});
            } else if (type == "reasoning") {
                // Earlier reasoning (summaries or encrypted content): not rendered again.
            } else {
                throw invalid_request("'" + w + "' has unsupported item type '" + type + "'",
                                      w + ".type");
            }
        }
    } else {
        throw invalid_request("'input' must be a string or an array of items", "input");
    }
    chat["messages"] = messages;
    if (const json* tools = find_field(body, "tools")) {
        if (!tools->is_array()) {
            throw invalid_request("'tools' must be an array", "tools");
        }
        json out = json::array();
        for (size_t i = 0; i < tools->size(); ++i) {
            const json& tool = (*tools)[i];
            const std::string w = "tools[" + std::to_string(i) + "]";
            if (!tool.is_object()) {
                throw invalid_request("'" + w + "' must be an object", w);
            }
            const std::string type = string_field(tool, "type", "", w);
            if (type != "function") {
                // Hosted tools (web_search, file_search, code_interpreter, mcp, ...), grouped
                // tools (namespace) and freeform custom tools: nothing here can run them, so
                // the model does not see them (listed in x-skippy-dropped-tools). A
                // tool_choice that names one is refused below.
                std::string name = type.empty() ? std::string("unknown") : type;
                if (const json* n = find_field(tool, "name"); n != nullptr && n->is_string()) {
                    name += ":" + n->get<std::string>();
                }
                notes.dropped_tools.push_back(name);
                continue;
            }
            reject_unknown_fields(tool,
                                  {{"type", FieldUse::Honored},
                                   {"name", FieldUse::Honored},
                                   {"description", FieldUse::Honored},
                                   {"parameters", FieldUse::Honored},
                                   {"strict", FieldUse::Honored},
                                   {"defer_loading", FieldUse::Ignored}},
                                  w);
            json fn = {{"name", tool.value("name", json(""))}};
            for (const char* key : {"description", "parameters", "strict"}) {
                if (const json* v = find_field(tool, key)) {
                    fn[key] = *v;
                }
            }
            out.push_back(json{{"type", "function"}, {"function", fn}});
        }
        if (!out.empty()) {
            chat["tools"] = out;
        }
    }
    if (const json* choice = find_field(body, "tool_choice")) {
        if (choice->is_object()) {
            const std::string type = string_field(*choice, "type", "", "tool_choice");
            if (type != "function") {
                throw invalid_request("tool_choice '" + type +
                                          "' names a tool this server cannot run (only "
                                          "function tools are run)",
                                      "tool_choice");
            }
            chat["tool_choice"] =
                json{{"type", "function"},
                     {"function", {{"name", string_field(*choice, "name", "", "tool_choice")}}}};
        } else if (!chat.contains("tools")) {
            // auto / none / required over tools that were all dropped: nothing to choose.
            if (*choice == "required") {
                throw invalid_request(
                    "tool_choice 'required' but none of the tools can be run here (only "
                    "function tools are run)",
                    "tool_choice");
            }
        } else {
            chat["tool_choice"] = *choice;
        }
    }
    if (const json* text = find_field(body, "text")) {
        if (!text->is_object()) {
            throw invalid_request("'text' must be an object", "text");
        }
        reject_unknown_fields(
            *text, {{"format", FieldUse::Honored}, {"verbosity", FieldUse::Honored}}, "text");
        if (const json* v = find_field(*text, "verbosity"); v != nullptr && *v != "medium") {
            throw invalid_request("only text.verbosity 'medium' is supported", "text.verbosity");
        }
        if (const json* format = find_field(*text, "format")) {
            if (!format->is_object()) {
                throw invalid_request("'text.format' must be an object", "text.format");
            }
            const std::string type = string_field(*format, "type", "", "text.format");
            if (type == "json_schema") {
                json wrapper = *format;
                wrapper.erase("type");
                chat["response_format"] = json{{"type", "json_schema"}, {"json_schema", wrapper}};
            } else {
                chat["response_format"] = json{{"type", type}};
            }
        }
    }
    if (const json* reasoning = find_field(body, "reasoning")) {
        if (!reasoning->is_object()) {
            throw invalid_request("'reasoning' must be an object", "reasoning");
        }
        reject_unknown_fields(*reasoning,
                              {{"effort", FieldUse::Honored},
                               {"summary", FieldUse::Ignored},
                               {"generate_summary", FieldUse::Ignored}},
                              "reasoning");
        if (const json* effort = find_field(*reasoning, "effort")) {
            chat["reasoning_effort"] = *effort;
        }
    }
    return chat;
}

namespace {

class ResponsesResponse final : public BlockStreamResponse {
  public:
    ResponsesResponse(std::shared_ptr<const ParsedRequest> parsed, json request)
        : BlockStreamResponse(std::move(parsed)),
          request_(std::move(request)),
          id_(random_id("resp_")),
          created_(static_cast<int64_t>(std::time(nullptr))) {}

    std::string stream_start() override {
        json response = response_object("in_progress");
        std::string out = event("response.created", json{{"response", response}});
        return out + event("response.in_progress", json{{"response", response}});
    }

    std::string finish() override {
        const bool complete = stats().finish_reason != "length";
        json response = response_object(complete ? "completed" : "incomplete");
        response["output"] = output_items();
        response["usage"] = usage();
        response["skippy"] = skippy_json(stats(), parsed_->parse_ms);
        if (!complete) {
            response["incomplete_details"] = {{"reason", "max_output_tokens"}};
        }
        if (!parsed_->stream) {
            return dump_json(response);
        }
        return event(complete ? "response.completed" : "response.incomplete",
                     json{{"response", response}});
    }

    std::string stream_error(int status, const std::string& type,
                             const std::string& message) override {
        json response = response_object("failed");
        response["error"] = {{"code", type}, {"message", message}};
        std::string out = event(
            "error",
            json{{"code", type}, {"message", message}, {"param", nullptr}, {"status", status}});
        return out + event("response.failed", json{{"response", response}});
    }

  private:
    json response_object(const char* status) const {
        json out = {{"id", id_},
                    {"object", "response"},
                    {"created_at", created_},
                    {"status", status},
                    {"error", nullptr},
                    {"incomplete_details", nullptr},
                    {"model", parsed_->model},
                    {"output", json::array()},
                    {"parallel_tool_calls", request_.value("parallel_tool_calls", true)},
                    {"tool_choice", request_.value("tool_choice", json("auto"))},
                    {"tools", request_.value("tools", json::array())},
                    {"temperature", request_.value("temperature", json(1.0))},
                    {"top_p", request_.value("top_p", json(1.0))},
                    {"instructions", request_.value("instructions", json(nullptr))},
                    {"max_output_tokens", request_.value("max_output_tokens", json(nullptr))},
                    {"previous_response_id", nullptr},
                    {"reasoning", request_.value("reasoning", json::object())},
                    {"text", request_.value("text", json{{"format", {{"type", "text"}}}})},
                    {"truncation", "disabled"},
                    {"store", false},
                    {"metadata", request_.value("metadata", json::object())},
                    {"usage", nullptr}};
        return out;
    }

    json usage() const {
        return json{{"input_tokens", stats().prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", stats().cached_tokens}}},
                    {"output_tokens", stats().completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", 0}}},
                    {"total_tokens", stats().prompt_tokens + stats().completion_tokens}};
    }

    std::string item_id(size_t block, const char* prefix) const {
        return std::string(prefix) + id_.substr(5) + "_" + std::to_string(block);
    }

    json message_item(size_t block, const std::string& text, const char* status) const {
        return json{{"type", "message"},
                    {"id", item_id(block, "msg_")},
                    {"status", status},
                    {"role", "assistant"},
                    {"content", json::array({json{{"type", "output_text"},
                                                  {"text", text},
                                                  {"annotations", json::array()},
                                                  {"logprobs", json::array()}}})}};
    }

    json reasoning_item(size_t block, const std::string& text) const {
        json out = {
            {"type", "reasoning"}, {"id", item_id(block, "rs_")}, {"summary", json::array()}};
        if (!text.empty()) {
            out["content"] = json::array({json{{"type", "reasoning_text"}, {"text", text}}});
        }
        return out;
    }

    json call_item(size_t block, const runtime::ToolCall& call, const char* status) const {
        return json{{"type", "function_call"}, {"id", item_id(block, "fc_")}, {"call_id", call.id},
                    {"name", call.name},       {"arguments", call.arguments}, {"status", status}};
    }

    json output_items() const {
        if (parsed_->stream) {
            return streamed_items_;
        }
        json items = json::array();
        size_t block = 0;
        if (!reply().reasoning_content.empty()) {
            items.push_back(reasoning_item(block++, reply().reasoning_content));
        }
        if (!reply().content.empty() || reply().tool_calls.empty()) {
            items.push_back(message_item(block++, reply().content, "completed"));
        }
        for (const auto& call : reply().tool_calls) {
            items.push_back(call_item(block++, call, "completed"));
        }
        return items;
    }

    std::string event(const std::string& type, json payload) {
        payload["type"] = type;
        payload["sequence_number"] = sequence_++;
        return sse_event(type, payload);
    }

    std::string render(const std::vector<BlockEvent>& list) override {
        std::string out;
        for (const auto& e : list) {
            const size_t index = e.block;
            switch (e.type) {
                case BlockEvent::Type::Open: {
                    open_text_.clear();
                    json item;
                    if (e.kind == BlockEvent::Kind::Text) {
                        item = message_item(index, "", "in_progress");
                        item["content"] = json::array();
                    } else if (e.kind == BlockEvent::Kind::Reasoning) {
                        item = reasoning_item(index, "");
                    } else {
                        open_call_ = runtime::ToolCall{e.id, e.name, ""};
                        item = call_item(index, open_call_, "in_progress");
                    }
                    out += event("response.output_item.added",
                                 json{{"output_index", index}, {"item", item}});
                    if (e.kind == BlockEvent::Kind::Text) {
                        out += event("response.content_part.added",
                                     json{{"item_id", item["id"]},
                                          {"output_index", index},
                                          {"content_index", 0},
                                          {"part",
                                           {{"type", "output_text"},
                                            {"text", ""},
                                            {"annotations", json::array()}}}});
                    }
                    break;
                }
                case BlockEvent::Type::Delta:
                    open_text_ += e.text;
                    if (e.kind == BlockEvent::Kind::Text) {
                        out += event("response.output_text.delta",
                                     json{{"item_id", item_id(index, "msg_")},
                                          {"output_index", index},
                                          {"content_index", 0},
                                          {"delta", e.text},
                                          {"logprobs", json::array()}});
                    } else if (e.kind == BlockEvent::Kind::Reasoning) {
                        out += event("response.reasoning_text.delta",
                                     json{{"item_id", item_id(index, "rs_")},
                                          {"output_index", index},
                                          {"content_index", 0},
                                          {"delta", e.text}});
                    } else {
                        out += event("response.function_call_arguments.delta",
                                     json{{"item_id", item_id(index, "fc_")},
                                          {"output_index", index},
                                          {"delta", e.text}});
                    }
                    break;
                case BlockEvent::Type::Close: {
                    json item;
                    if (e.kind == BlockEvent::Kind::Text) {
                        item = message_item(index, open_text_, "completed");
                        out +=
                            event("response.output_text.done", json{{"item_id", item["id"]},
                                                                    {"output_index", index},
                                                                    {"content_index", 0},
                                                                    {"text", open_text_},
                                                                    {"logprobs", json::array()}});
                        out +=
                            event("response.content_part.done", json{{"item_id", item["id"]},
                                                                     {"output_index", index},
                                                                     {"content_index", 0},
                                                                     {"part", item["content"][0]}});
                    } else if (e.kind == BlockEvent::Kind::Reasoning) {
                        item = reasoning_item(index, open_text_);
                        out += event("response.reasoning_text.done", json{{"item_id", item["id"]},
                                                                          {"output_index", index},
                                                                          {"content_index", 0},
                                                                          {"text", open_text_}});
                    } else {
                        open_call_.arguments = open_text_;
                        item = call_item(index, open_call_, "completed");
                        out += event("response.function_call_arguments.done",
                                     json{{"item_id", item["id"]},
                                          {"output_index", index},
                                          {"arguments", open_text_}});
                    }
                    streamed_items_.push_back(item);
                    out += event("response.output_item.done",
                                 json{{"output_index", index}, {"item", item}});
                    break;
                }
            }
        }
        return out;
    }

    json request_;
    std::string id_;
    int64_t created_;
    std::string open_text_;
    runtime::ToolCall open_call_;
    json streamed_items_ = json::array();
    uint64_t sequence_ = 0;
};

}  // namespace

std::unique_ptr<ApiResponse> make_responses_response(std::shared_ptr<const ParsedRequest> parsed,
                                                     json request) {
    return std::make_unique<ResponsesResponse>(std::move(parsed), std::move(request));
}

}  // namespace skippy::server
