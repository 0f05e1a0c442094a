// The chat-specific parts of an OpenAI chat completions request: messages (with tool calls
// and tool results), tools, tool_choice, parallel_tool_calls, response_format and the
// reasoning fields, validated into the runtime's chat types. Every rejection is an ApiError
// (400) naming the field.
//
// Thread safety: stateless functions.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/chat_template.h"

namespace skippy::server {

struct ChatLimits {
    size_t max_messages = 4096;
    size_t max_tools = 128;
    size_t max_tool_calls = 128;          // per assistant message
    size_t max_schema_bytes = 64 * 1024;  // one tool's parameters / a response schema
};

// messages[] -> ChatMessages. Checks roles, content, assistant tool_calls (ids, names, JSON
// arguments) and that every tool message answers a call of an earlier assistant message.
std::vector<runtime::ChatMessage> parse_chat_messages(const nlohmann::json& messages,
                                                      const ChatLimits& limits);

struct ChatOptions {
    runtime::ChatContext context;
    runtime::ChatConstraints constraints;
    bool tools_active = false;  // tools given and tool_choice != none
};

// tools, tool_choice, parallel_tool_calls, response_format, chat_template_kwargs,
// reasoning_effort of a chat request body.
ChatOptions parse_chat_options(const nlohmann::json& body, const ChatLimits& limits);

// response_format -> a JSON Schema text ("" for none / "text"). `param` is its field name.
std::string parse_response_format(const nlohmann::json* format, const ChatLimits& limits,
                                  const std::string& param = "response_format");

}  // namespace skippy::server
