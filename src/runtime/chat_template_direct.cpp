#include "runtime/chat_template_direct.h"

#include <chrono>
#include <ctime>
#include <iomanip>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "chat-auto-parser.h"

namespace skippy::runtime {

namespace {

// What llama.cpp's render_message_to_json and the message workarounds of
// common_chat_templates_apply_jinja (common/chat.cpp) do to the messages, in their order.
void normalize_content(common_json& messages, const jinja::caps& caps) {
    // Our messages have string content only, which every other template takes as it is.
    const bool only_typed = !caps.supports_string_content && caps.supports_typed_content;
    if (!only_typed) {
        return;
    }
    for (auto& message : messages) {
        if (message.contains("content") && message.at("content").is_string()) {
            common_json part = common_json::object();
            part["type"] = "text";
            part["text"] = message.at("content").get<std::string>();
            common_json parts = common_json::array();
            parts.push_back(std::move(part));
            message["content"] = std::move(parts);
        }
    }
}

void map_developer_role_to_system(common_json& messages) {
    for (auto& message : messages) {
        if (message.contains("role") && message["role"] == "developer") {
            message["role"] = "system";
        }
    }
}

void merge_system_message(common_json& messages) {
    if (messages.empty() || messages.at(0).at("role") != "system") {
        return;
    }
    if (messages.size() > 1) {
        auto& second = messages[1];
        second["content"] = messages.at(0).at("content").get<std::string>() + "\n" +
                            second.at("content").get<std::string>();
    }
    messages.erase(static_cast<size_t>(0));
}

void requires_non_null_content(common_json& messages) {
    for (auto& message : messages) {
        if (message.contains("tool_calls") && !message.contains("content")) {
            message["content"] = "";
        }
    }
}

void func_args_not_string(common_json& messages) {
    for (auto& message : messages) {
        if (!message.contains("tool_calls")) {
            continue;
        }
        for (auto& call : message["tool_calls"]) {
            if (call.contains("function") && call["function"].contains("arguments")) {
                auto& args = call["function"]["arguments"];
                if (args.is_string()) {
                    try {
                        args = common_json::parse(args.get<std::string>());
                    } catch (const std::exception& e) {
                        throw std::runtime_error("Failed to parse tool call arguments as JSON: " +
                                                 std::string(e.what()));
                    }
                }
            }
        }
    }
}

std::string format_time(std::time_t time, const char* format) {
    std::tm local{};
    localtime_r(&time, &local);
    std::ostringstream ss;
    ss << std::put_time(&local, format);
    return ss.str();
}

autoparser::generation_params probe_params() {
    autoparser::generation_params params;
    common_chat_msg msg;
    msg.role = "user";
    msg.content = "test";
    common_json messages = common_json::array();
    messages.push_back(msg.to_json_oaicompat(false));
    params.messages = std::move(messages);
    params.add_generation_prompt = true;
    return params;
}

}  // namespace

DirectChatRender::DirectChatRender(const std::string& source, const std::string& bos,
                                   const std::string& eos, bool add_bos, bool add_eos)
    : tmpl_(std::make_unique<common_chat_template>(source, bos, eos)),
      add_bos_(add_bos),
      add_eos_(add_eos) {
    const std::string& src = tmpl_->source();
    // StepFun: llama.cpp trims the contents first.
    if (src.find("You have access to the following functions in JSONSchema format") !=
        std::string::npos) {
        return;
    }
    try {
        autoparser::generation_params params = probe_params();
        eligible_ = !common_chat_try_specialized_template(*tmpl_, src, params).has_value();
    } catch (const std::exception&) {
        eligible_ = false;  // a specialized handler that cannot even take the probe
    }
}

DirectChatRender::~DirectChatRender() = default;

std::string DirectChatRender::render(const common_chat_templates_inputs& inputs) const {
    const jinja::caps caps = tmpl_->original_caps();
    autoparser::generation_params params;
    params.tools = common_chat_tools_to_json_oaicompat(inputs.tools);
    common_json messages = common_json::array();
    for (const auto& message : inputs.messages) {
        messages.push_back(message.to_json_oaicompat(false));
    }
    normalize_content(messages, caps);
    if (tmpl_->source().find("<|channel|>") == std::string::npos) {
        map_developer_role_to_system(messages);
    }
    if (!caps.supports_system_role) {
        merge_system_message(messages);
    }
    if (caps.supports_tool_calls) {
        requires_non_null_content(messages);
    }
    if (caps.supports_object_arguments) {
        func_args_not_string(messages);
    }
    params.messages = std::move(messages);
    params.enable_thinking = inputs.enable_thinking;
    params.add_generation_prompt = inputs.add_generation_prompt;
    params.add_bos = add_bos_;
    params.add_eos = add_eos_;
    common_json context = common_json::object();
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    context["datetime"] = format_time(now, "%b %d %Y");
    context["date_string"] = format_time(now, "%d %b %Y");
    for (const auto& [name, value] : inputs.chat_template_kwargs) {
        context[name] = common_json::parse(value);
    }
    params.extra_context = std::move(context);
    return common_chat_template_direct_apply(*tmpl_, params);
}

}  // namespace skippy::runtime
