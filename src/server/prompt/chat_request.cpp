#include "server/prompt/chat_request.h"

#include <algorithm>
#include <set>

#include "server/api/api_error.h"
#include "server/api/json_fields.h"
#include "server/api/schema_support.h"

namespace skippy::server {

using nlohmann::json;

namespace {

bool valid_function_name(const std::string& name) {
    if (name.empty() || name.size() > 64) {
        return false;
    }
    return std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '_' || c == '-';
    });
}

// Text content: a string, or an array of {type: "text", text} parts (joined by newlines).
std::string text_content(const json& content, const std::string& where) {
    if (content.is_string()) {
        return checked_text(content, where);
    }
    if (!content.is_array()) {
        throw invalid_request(where + " must be a string or an array of parts", where);
    }
    std::string out;
    for (size_t i = 0; i < content.size(); ++i) {
        const json& part = content[i];
        const json* type = part.is_object() ? find_field(part, "type") : nullptr;
        if (type == nullptr || !type->is_string() ||
            (*type != "text" && *type != "input_text" && *type != "output_text") ||
            !part.contains("text")) {
            throw invalid_request(where +
                                      " parts must be {type: 'text', text} (images, audio "
                                      "and files are not supported)",
                                  where);
        }
        if (!out.empty()) {
            out += "\n";
        }
        out += checked_text(part["text"], where);
    }
    return out;
}

runtime::ToolCall parse_tool_call(const json& call, const std::string& where) {
    if (!call.is_object()) {
        throw invalid_request(where + " must be an object", where);
    }
    reject_unknown_fields(call,
                          {{"id", FieldUse::Honored},
                           {"type", FieldUse::Honored},
                           {"function", FieldUse::Honored},
                           {"index", FieldUse::Ignored}},
                          where);
    runtime::ToolCall out;
    out.id = string_field(call, "id", "", where);
    if (out.id.empty()) {
        throw invalid_request(where + ".id is required", where + ".id");
    }
    if (string_field(call, "type", "function", where) != "function") {
        throw invalid_request(where + ".type must be 'function'", where + ".type");
    }
    const json* function = find_field(call, "function");
    if (function == nullptr || !function->is_object()) {
        throw invalid_request(where + ".function is required", where + ".function");
    }
    out.name = string_field(*function, "name", "", where + ".function");
    if (out.name.empty()) {
        throw invalid_request(where + ".function.name is required", where + ".function.name");
    }
    const json* args = find_field(*function, "arguments");
    if (args == nullptr) {
        out.arguments = "{}";
    } else if (args->is_object()) {
        out.arguments = args->dump();
    } else {
        out.arguments = checked_text(*args, where + ".function.arguments");
        const json parsed = json::parse(out.arguments, nullptr, false);
        if (parsed.is_discarded() || !parsed.is_object()) {
            throw invalid_request(where + ".function.arguments must be a JSON object (as text)",
                                  where + ".function.arguments");
        }
    }
    return out;
}

runtime::ToolDefinition parse_tool(const json& tool, const std::string& where,
                                   const ChatLimits& limits) {
    if (!tool.is_object()) {
        throw invalid_request(where + " must be an object", where);
    }
    reject_unknown_fields(tool, {{"type", FieldUse::Honored}, {"function", FieldUse::Honored}},
                          where);
    const json* type = find_field(tool, "type");
    if (type == nullptr || *type != "function") {
        throw invalid_request(where +
                                  ".type must be 'function' (other tool types are not "
                                  "supported)",
                              where + ".type");
    }
    const json* function = find_field(tool, "function");
    if (function == nullptr || !function->is_object()) {
        throw invalid_request(where + ".function is required and must be an object",
                              where + ".function");
    }
    const std::string fwhere = where + ".function";
    reject_unknown_fields(*function,
                          {{"name", FieldUse::Honored},
                           {"description", FieldUse::Honored},
                           {"parameters", FieldUse::Honored},
                           {"strict", FieldUse::Honored}},
                          fwhere);
    runtime::ToolDefinition out;
    out.name = string_field(*function, "name", "", fwhere);
    if (!valid_function_name(out.name)) {
        throw invalid_request(fwhere + ".name must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                              fwhere + ".name");
    }
    out.description = string_field(*function, "description", "", fwhere);
    bool_field(*function, "strict", false);
    const json* params = find_field(*function, "parameters");
    if (params == nullptr) {
        out.parameters = R"({"type":"object","properties":{}})";
    } else {
        check_schema_wellformed(*params, fwhere + ".parameters");
        out.parameters = params->dump();
        if (out.parameters.size() > limits.max_schema_bytes) {
            throw invalid_request(fwhere + ".parameters is larger than " +
                                      std::to_string(limits.max_schema_bytes) + " bytes",
                                  fwhere + ".parameters");
        }
    }
    return out;
}

}  // namespace

std::vector<runtime::ChatMessage> parse_chat_messages(const json& messages,
                                                      const ChatLimits& limits) {
    if (!messages.is_array()) {
        throw invalid_request("'messages' must be an array", "messages");
    }
    if (messages.empty()) {
        throw invalid_request("'messages' must not be empty", "messages");
    }
    if (messages.size() > limits.max_messages) {
        throw invalid_request("too many messages", "messages");
    }
    static const std::vector<std::string> roles = {"system", "developer", "user", "assistant",
                                                   "tool"};
    std::vector<runtime::ChatMessage> out;
    std::vector<std::pair<std::string, std::string>> calls;  // (id, name) of earlier calls
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
        reject_unknown_fields(message,
                              {{"role", FieldUse::Honored},
                               {"content", FieldUse::Honored},
                               {"name", FieldUse::Ignored},
                               {"tool_calls", FieldUse::Honored},
                               {"tool_call_id", FieldUse::Honored},
                               {"reasoning_content", FieldUse::Honored},
                               {"refusal", FieldUse::Ignored}},
                              where);
        if (parsed.role == "developer") {
            parsed.role = "system";
        }
        const json* content = find_field(message, "content");
        const json* tool_calls = find_field(message, "tool_calls");
        if (tool_calls != nullptr && parsed.role != "assistant") {
            throw invalid_request(where + ".tool_calls is only allowed on assistant messages",
                                  where + ".tool_calls");
        }
        if (content == nullptr) {
            if (parsed.role != "assistant") {
                throw invalid_request(where + ".content is required", where + ".content");
            }
        } else {
            parsed.content = text_content(*content, where + ".content");
        }
        if (tool_calls != nullptr) {
            if (!tool_calls->is_array() || tool_calls->size() > limits.max_tool_calls) {
                throw invalid_request(where + ".tool_calls must be an array of at most " +
                                          std::to_string(limits.max_tool_calls) + " calls",
                                      where + ".tool_calls");
            }
            for (size_t j = 0; j < tool_calls->size(); ++j) {
                parsed.tool_calls.push_back(parse_tool_call(
                    (*tool_calls)[j], where + ".tool_calls[" + std::to_string(j) + "]"));
                calls.emplace_back(parsed.tool_calls.back().id, parsed.tool_calls.back().name);
            }
        }
        if (parsed.role == "assistant") {
            parsed.reasoning_content = string_field(message, "reasoning_content", "", where);
        } else if (find_field(message, "reasoning_content") != nullptr) {
            throw invalid_request(where +
                                      ".reasoning_content is only allowed on assistant "
                                      "messages",
                                  where + ".reasoning_content");
        }
        if (parsed.role == "tool") {
            parsed.tool_call_id = string_field(message, "tool_call_id", "", where);
            if (parsed.tool_call_id.empty()) {
                throw invalid_request(where + ".tool_call_id is required for tool messages",
                                      where + ".tool_call_id");
            }
            const auto call = std::find_if(calls.begin(), calls.end(), [&](const auto& c) {
                return c.first == parsed.tool_call_id;
            });
            if (call == calls.end()) {
                throw invalid_request(where + ".tool_call_id '" + parsed.tool_call_id +
                                          "' does not match a tool call of an earlier assistant "
                                          "message",
                                      where + ".tool_call_id");
            }
            parsed.name = call->second;
        } else if (find_field(message, "tool_call_id") != nullptr) {
            throw invalid_request(where + ".tool_call_id is only allowed on tool messages",
                                  where + ".tool_call_id");
        }
        out.push_back(std::move(parsed));
    }
    return out;
}

std::string parse_response_format(const json* format, const ChatLimits& limits,
                                  const std::string& param) {
    if (format == nullptr) {
        return "";
    }
    if (!format->is_object()) {
        throw invalid_request("'" + param + "' must be an object", param);
    }
    const std::string type = string_field(*format, "type", "", param);
    if (type == "text") {
        reject_unknown_fields(*format, {{"type", FieldUse::Honored}}, param);
        return "";
    }
    if (type == "json_object") {
        reject_unknown_fields(*format, {{"type", FieldUse::Honored}}, param);
        return R"({"type":"object"})";
    }
    if (type != "json_schema") {
        throw invalid_request(
            "'" + param + ".type' must be one of 'text', 'json_object', 'json_schema'",
            param + ".type");
    }
    reject_unknown_fields(*format,
                          {{"type", FieldUse::Honored}, {"json_schema", FieldUse::Honored}}, param);
    const json* wrapper = find_field(*format, "json_schema");
    if (wrapper == nullptr || !wrapper->is_object()) {
        throw invalid_request("'" + param + ".json_schema' is required", param + ".json_schema");
    }
    const std::string where = param + ".json_schema";
    reject_unknown_fields(*wrapper,
                          {{"name", FieldUse::Ignored},
                           {"description", FieldUse::Ignored},
                           {"schema", FieldUse::Honored},
                           {"strict", FieldUse::Honored}},
                          where);
    string_field(*wrapper, "name", "", where);
    bool_field(*wrapper, "strict", false);
    const json* schema = find_field(*wrapper, "schema");
    if (schema == nullptr) {
        return R"({"type":"object"})";
    }
    check_schema_wellformed(*schema, where + ".schema");
    const std::string text = schema->dump();
    if (text.size() > limits.max_schema_bytes) {
        throw invalid_request(
            where + ".schema is larger than " + std::to_string(limits.max_schema_bytes) + " bytes",
            where + ".schema");
    }
    check_schema_enforceable(*schema, where + ".schema");
    return text;
}

ChatOptions parse_chat_options(const json& body, const ChatLimits& limits) {
    ChatOptions out;
    auto& c = out.constraints;
    if (const json* tools = find_field(body, "tools")) {
        if (!tools->is_array()) {
            throw invalid_request("'tools' must be an array", "tools");
        }
        if (tools->size() > limits.max_tools) {
            throw invalid_request(
                "at most " + std::to_string(limits.max_tools) + " tools are allowed", "tools");
        }
        std::set<std::string> names;
        for (size_t i = 0; i < tools->size(); ++i) {
            auto tool = parse_tool((*tools)[i], "tools[" + std::to_string(i) + "]", limits);
            if (!names.insert(tool.name).second) {
                throw invalid_request("tools[" + std::to_string(i) + "]: the function name '" +
                                          tool.name + "' is defined twice",
                                      "tools[" + std::to_string(i) + "].function.name");
            }
            out.context.tools.push_back(std::move(tool));
        }
    }
    c.parallel_tool_calls = bool_field(body, "parallel_tool_calls", true);
    if (const json* choice = find_field(body, "tool_choice")) {
        if (choice->is_string()) {
            const std::string v = choice->get<std::string>();
            if (v == "auto") {
                c.tool_choice = runtime::ToolChoice::Auto;
            } else if (v == "none") {
                c.tool_choice = runtime::ToolChoice::None;
            } else if (v == "required") {
                c.tool_choice = runtime::ToolChoice::Required;
            } else {
                throw invalid_request(
                    "'tool_choice' must be 'auto', 'none', 'required' or "
                    "{type: 'function', function: {name}}",
                    "tool_choice");
            }
        } else if (choice->is_object()) {
            const json* type = find_field(*choice, "type");
            const json* function = find_field(*choice, "function");
            if (type == nullptr || *type != "function" || function == nullptr ||
                !function->is_object()) {
                throw invalid_request("'tool_choice' must be {type: 'function', function: {name}}",
                                      "tool_choice");
            }
            c.forced_tool = string_field(*function, "name", "", "tool_choice.function");
            c.tool_choice = runtime::ToolChoice::Required;
            const auto& tools = out.context.tools;
            if (std::none_of(tools.begin(), tools.end(),
                             [&](const auto& t) { return t.name == c.forced_tool; })) {
                throw invalid_request("'tool_choice' names the function '" + c.forced_tool +
                                          "', which is not in 'tools'",
                                      "tool_choice");
            }
        } else {
            throw invalid_request("'tool_choice' must be a string or an object", "tool_choice");
        }
        if (out.context.tools.empty() && c.tool_choice == runtime::ToolChoice::Required) {
            throw invalid_request("'tool_choice' requires 'tools'", "tool_choice");
        }
    }
    out.tools_active = !out.context.tools.empty() && c.tool_choice != runtime::ToolChoice::None;
    if (out.tools_active && c.tool_choice == runtime::ToolChoice::Required) {
        // A call is guaranteed valid against its schema: every schema the grammar can
        // choose from must be enforceable.
        for (size_t i = 0; i < out.context.tools.size(); ++i) {
            const auto& tool = out.context.tools[i];
            if (!c.forced_tool.empty() && tool.name != c.forced_tool) {
                continue;
            }
            check_schema_enforceable(json::parse(tool.parameters),
                                     "tools[" + std::to_string(i) + "].function.parameters");
        }
    }
    c.json_schema = parse_response_format(find_field(body, "response_format"), limits);
    if (!c.json_schema.empty() && out.tools_active) {
        throw invalid_request(
            "'response_format' together with 'tools' is not supported (set "
            "tool_choice to 'none' or drop one of them)",
            "response_format");
    }
    if (const json* kwargs = find_field(body, "chat_template_kwargs")) {
        if (!kwargs->is_object()) {
            throw invalid_request("'chat_template_kwargs' must be an object",
                                  "chat_template_kwargs");
        }
        for (const auto& [key, value] : kwargs->items()) {
            out.context.template_kwargs[key] = value.dump();
        }
        if (const auto it = kwargs->find("enable_thinking"); it != kwargs->end()) {
            if (!it->is_boolean()) {
                throw invalid_request("'chat_template_kwargs.enable_thinking' must be a boolean",
                                      "chat_template_kwargs");
            }
            out.context.enable_thinking = it->get<bool>();
        }
    }
    if (const json* effort = find_field(body, "reasoning_effort")) {
        const std::string v = checked_text(*effort, "reasoning_effort");
        static const std::set<std::string> efforts = {"none",   "minimal", "low",
                                                      "medium", "high",    "xhigh"};
        if (!efforts.contains(v)) {
            throw invalid_request(
                "'reasoning_effort' must be one of none, minimal, low, medium, "
                "high, xhigh",
                "reasoning_effort");
        }
        if (v == "none") {
            out.context.enable_thinking = false;
            out.context.template_kwargs.erase("reasoning_effort");
        } else {
            out.context.template_kwargs["reasoning_effort"] = json(v).dump();
        }
    }
    return out;
}

}  // namespace skippy::server
