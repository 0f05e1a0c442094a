#include "runtime/chat_template.h"

#include <cstdlib>
#include <mutex>
#include <optional>
#include <regex>
#include <stdexcept>

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "llama.h"
#include "log.h"
#include "runtime/chat_template_direct.h"
#include "runtime/model.h"

namespace skippy::runtime {

namespace {

common_chat_msg to_common(const ChatMessage& message) {
    common_chat_msg msg;
    msg.role = message.role;
    msg.content = message.content;
    msg.reasoning_content = message.reasoning_content;
    msg.tool_name = message.name;
    msg.tool_call_id = message.tool_call_id;
    for (const auto& call : message.tool_calls) {
        msg.tool_calls.push_back(common_chat_tool_call{call.name, call.arguments, call.id});
    }
    return msg;
}

common_chat_templates_inputs make_inputs(const std::vector<ChatMessage>& messages,
                                         const ChatContext& context, bool add_generation_prompt) {
    common_chat_templates_inputs inputs;
    inputs.use_jinja = true;
    inputs.add_generation_prompt = add_generation_prompt;
    inputs.messages.reserve(messages.size());
    for (const auto& message : messages) {
        inputs.messages.push_back(to_common(message));
    }
    for (const auto& tool : context.tools) {
        inputs.tools.push_back(common_chat_tool{tool.name, tool.description, tool.parameters});
    }
    inputs.chat_template_kwargs = context.template_kwargs;
    inputs.enable_thinking = context.enable_thinking;
    return inputs;
}

// A tool_choice "required" grammar of the common chat layer still lets the model write
// content before the first call (the root rule has an optional `until-N` content rule in
// front of the tool calls). Dropping it from the root leaves a call as the only way out.
std::string without_leading_content(const std::string& grammar) {
    static const std::regex content_rule(R"( until-[0-9]+\?)");
    std::string out;
    size_t begin = 0;
    while (begin < grammar.size()) {
        size_t end = grammar.find('\n', begin);
        end = end == std::string::npos ? grammar.size() : end + 1;
        std::string line = grammar.substr(begin, end - begin);
        if (line.rfind("root ::=", 0) == 0) {
            line = std::regex_replace(line, content_rule, "");
        }
        out += line;
        begin = end;
    }
    return out;
}

// parallel_tool_calls = false: the common chat layer's grammars still repeat the tool-call
// section ("tool-calls ::= (tool-call space)+"); one repetition is what was asked for.
std::string single_call(const std::string& grammar) {
    static const std::regex repeated(R"(^tool-calls ::= \((.*)\)\+$)");
    std::string out;
    size_t begin = 0;
    while (begin < grammar.size()) {
        size_t end = grammar.find('\n', begin);
        const bool newline = end != std::string::npos;
        end = newline ? end : grammar.size();
        std::string line = grammar.substr(begin, end - begin);
        std::smatch m;
        if (std::regex_match(line, m, repeated)) {
            line = "tool-calls ::= " + m[1].str();
        }
        out += line;
        if (newline) {
            out += '\n';
        }
        begin = end + 1;
    }
    return out;
}

// "root ::= LITERAL rest" -> "root ::= rest".
std::string without_root_literal(const std::string& grammar, const std::string& literal) {
    const std::string head = "root ::= " + literal + " ";
    const size_t at = grammar.rfind("\nroot ::= ", grammar.size());
    const size_t begin = grammar.compare(0, head.size(), head) == 0 ? 0
                         : at == std::string::npos                  ? std::string::npos
                                                                    : at + 1;
    if (begin == std::string::npos || grammar.compare(begin, head.size(), head) != 0) {
        return grammar;
    }
    return grammar.substr(0, begin) + "root ::= " + grammar.substr(begin + head.size());
}

std::vector<Token> single_token(const llama_vocab* vocab, const std::string& text) {
    return common_tokenize(vocab, text, false, true);
}

}  // namespace

struct ChatOutputParser::Impl {
    common_chat_parser_params params;
};

ChatOutputParser::ChatOutputParser(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatOutputParser::~ChatOutputParser() = default;

bool ChatOutputParser::parses_tool_calls() const { return impl_->params.parse_tool_calls; }

ChatReply ChatOutputParser::parse(const std::string& text, bool partial) const {
    common_chat_msg msg;
    bool parsed = false;
    for (const bool as_partial : {partial, true}) {
        try {
            msg = common_chat_parse(text, as_partial, impl_->params);
            parsed = true;
            break;
        } catch (const std::exception&) {
            // A finished text that does not match (cut by max_tokens or a stop string) is
            // reported as far as it parses.
        }
    }
    ChatReply reply;
    if (!parsed) {
        reply.content = text;
        return reply;
    }
    reply.content = msg.content;
    reply.reasoning_content = msg.reasoning_content;
    for (const auto& call : msg.tool_calls) {
        reply.tool_calls.push_back(ToolCall{"", call.name, call.arguments});
    }
    return reply;
}

struct ChatTemplate::Impl {
    const Model* model = nullptr;
    common_chat_templates_ptr templates;
    // The direct renders of the default and the tool-use template (null: render in full).
    std::unique_ptr<DirectChatRender> direct_default;
    std::unique_ptr<DirectChatRender> direct_tool_use;
    bool has_tool_use = false;

    const DirectChatRender* direct_for(const common_chat_templates_inputs& inputs) const {
        return !inputs.tools.empty() && has_tool_use ? direct_tool_use.get() : direct_default.get();
    }
};

namespace {

std::string render_full(const common_chat_templates* templates,
                        const common_chat_templates_inputs& inputs) {
    return common_chat_templates_apply(templates, inputs).prompt;
}

// The prompt, or nullopt where the template throws.
template <typename Render>
std::optional<std::string> rendered(Render&& render) {
    try {
        return render();
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

// A direct render is used only where it gives the full render's prompt (or both throw) for
// a probe conversation, with and without the generation prompt, without tools and with a
// tool as `cases` says (the tool-use template renders only requests with tools).
enum class ProbeTools { Without, With, Both };

std::unique_ptr<DirectChatRender> checked_direct_render(const Model& model,
                                                        const common_chat_templates* templates,
                                                        const std::string& source,
                                                        ProbeTools cases) {
    if (source.empty()) {
        return nullptr;
    }
    const llama_vocab* vocab = model.vocab();
    const auto piece = [&](llama_token token) {
        return token == LLAMA_TOKEN_NULL ? std::string()
                                         : common_token_to_piece(vocab, token, true);
    };
    std::unique_ptr<DirectChatRender> direct;
    try {
        direct = std::make_unique<DirectChatRender>(
            source, piece(llama_vocab_bos(vocab)), piece(llama_vocab_eos(vocab)),
            llama_vocab_get_add_bos(vocab), llama_vocab_get_add_eos(vocab));
    } catch (const std::exception&) {
        return nullptr;
    }
    if (!direct->eligible()) {
        return nullptr;
    }
    const std::vector<ChatMessage> probe = {{"system", "You are brief."},
                                            {"user", "Hello"},
                                            {"assistant", "Hi there"},
                                            {"user", "Bye"}};
    ChatContext with_tool;
    with_tool.tools.push_back(ToolDefinition{
        "probe", "A probe tool",
        R"({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})"});
    for (const bool tools : {false, true}) {
        if ((tools && cases == ProbeTools::Without) || (!tools && cases == ProbeTools::With)) {
            continue;
        }
        for (const bool generation_prompt : {true, false}) {
            const auto inputs =
                make_inputs(probe, tools ? with_tool : ChatContext{}, generation_prompt);
            if (rendered([&] { return direct->render(inputs); }) !=
                rendered([&] { return render_full(templates, inputs); })) {
                return nullptr;
            }
        }
    }
    return direct;
}

}  // namespace

ChatTemplate::ChatTemplate(const Model& model, const std::string& template_override,
                           bool direct_render)
    : impl_(std::make_unique<Impl>()) {
    // llama.cpp common/ logs on its own logger (warnings about model output that does not
    // parse, ...): errors only, unless SKIPPY_LLAMA_LOG=1.
    static std::once_flag quiet;
    std::call_once(quiet, [] {
        const char* env = std::getenv("SKIPPY_LLAMA_LOG");
        if (env == nullptr || std::string(env) != "1") {
            common_log_set_verbosity_thold(LOG_LEVEL_ERROR);
        }
    });
    impl_->model = &model;
    impl_->templates = common_chat_templates_init(model.raw(), template_override);
    if (!impl_->templates) {
        throw std::runtime_error("model has no usable chat template");
    }
    source_ = common_chat_templates_source(impl_->templates.get());
    const auto caps = common_chat_templates_get_caps(impl_->templates.get());
    const auto it = caps.find("supports_tool_calls");
    supports_tool_calls_ = it != caps.end() && it->second;
    supports_thinking_ = common_chat_templates_support_enable_thinking(impl_->templates.get());
    if (direct_render) {
        const std::string tool_use =
            common_chat_templates_source(impl_->templates.get(), "tool_use");
        impl_->has_tool_use = !tool_use.empty();
        impl_->direct_default =
            checked_direct_render(model, impl_->templates.get(), source_,
                                  impl_->has_tool_use ? ProbeTools::Without : ProbeTools::Both);
        impl_->direct_tool_use =
            checked_direct_render(model, impl_->templates.get(), tool_use, ProbeTools::With);
    }
}

bool ChatTemplate::renders_directly() const { return impl_->direct_default != nullptr; }

ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const ChatContext& context) const {
    common_chat_templates_inputs inputs = make_inputs(messages, context, add_generation_prompt);
    try {
        const DirectChatRender* direct = impl_->direct_for(inputs);
        return direct != nullptr ? direct->render(inputs)
                                 : render_full(impl_->templates.get(), inputs);
    } catch (const std::exception& e) {
        throw std::invalid_argument(std::string("chat template failed: ") + e.what());
    }
}

ChatPrompt ChatTemplate::apply(const std::vector<ChatMessage>& messages, const ChatContext& context,
                               const ChatConstraints& constraints) const {
    common_chat_templates_inputs inputs = make_inputs(messages, context, true);
    const bool forced = !constraints.forced_tool.empty();
    inputs.tool_choice =
        forced || constraints.tool_choice == ToolChoice::Required ? COMMON_CHAT_TOOL_CHOICE_REQUIRED
        : constraints.tool_choice == ToolChoice::None             ? COMMON_CHAT_TOOL_CHOICE_NONE
                                                                  : COMMON_CHAT_TOOL_CHOICE_AUTO;
    inputs.parallel_tool_calls = constraints.parallel_tool_calls;
    inputs.json_schema = constraints.json_schema;
    inputs.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    if (inputs.tools.empty()) {
        inputs.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    }
    common_chat_params params;
    common_chat_params constrained;
    try {
        params = common_chat_templates_apply(impl_->templates.get(), inputs);
        constrained = params;
        if (forced) {
            // The prompt lists every tool (it must not depend on the choice, or the next
            // turn would not share its prefix); grammar and parser know only the chosen one.
            common_chat_templates_inputs only = inputs;
            only.tools.clear();
            for (const auto& tool : inputs.tools) {
                if (tool.name == constraints.forced_tool) {
                    only.tools.push_back(tool);
                }
            }
            if (only.tools.empty()) {
                throw std::invalid_argument("tool '" + constraints.forced_tool +
                                            "' is not defined");
            }
            constrained = common_chat_templates_apply(impl_->templates.get(), only);
        }
    } catch (const std::exception& e) {
        throw std::invalid_argument(std::string("chat template failed: ") + e.what());
    }

    const llama_vocab* vocab = impl_->model->vocab();
    ChatPrompt out;
    out.prompt = params.prompt;
    out.supports_thinking = params.supports_thinking;
    out.additional_stops = constrained.additional_stops;
    for (const auto& text : constrained.preserved_tokens) {
        const auto ids = single_token(vocab, text);
        if (ids.size() == 1) {
            out.preserved_tokens.push_back(ids[0]);
        }
    }
    out.grammar = constrained.grammar;
    out.grammar_lazy = constrained.grammar_lazy;
    if (!out.grammar.empty() && inputs.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED) {
        out.grammar = without_leading_content(out.grammar);
    }
    if (!out.grammar.empty() && !inputs.tools.empty() && !constraints.parallel_tool_calls) {
        out.grammar = single_call(out.grammar);
    }
    for (const auto& trigger : constrained.grammar_triggers) {
        switch (trigger.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:
                out.trigger_tokens.push_back(trigger.token);
                break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: {
                const auto ids = single_token(vocab, trigger.value);
                if (ids.size() == 1) {
                    out.trigger_tokens.push_back(ids[0]);
                } else {
                    out.trigger_patterns.push_back(regex_escape(trigger.value));
                }
                break;
            }
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
                out.trigger_patterns.push_back(trigger.value);
                break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
                const auto& p = trigger.value;
                out.trigger_patterns.push_back(p.empty() ? "^$"
                                                         : (p.front() != '^' ? "^" : "") + p +
                                                               (p.back() != '$' ? "$" : ""));
                break;
            }
        }
    }
    if (out.grammar_lazy && out.trigger_tokens.empty() && out.trigger_patterns.empty()) {
        out.grammar.clear();  // nothing would ever switch it on
        out.grammar_lazy = false;
    }
    if (!out.grammar.empty() && !out.grammar_lazy && !constrained.generation_prompt.empty()) {
        // The grammar starts with the generation prompt, which the prompt already ends with.
        // When the root opens with it as one literal, the literal goes (nothing to prefill,
        // whatever the tokenizer); otherwise its tokens are accepted first, as
        // common_sampler_init does.
        out.grammar =
            without_root_literal(out.grammar, gbnf_format_literal(constrained.generation_prompt));
    }
    if (!out.grammar.empty() && !out.grammar_lazy && !constrained.generation_prompt.empty() &&
        out.grammar.find("root ::= " + gbnf_format_literal(constrained.generation_prompt)) !=
            std::string::npos) {
        const auto tokens = common_tokenize(vocab, constrained.generation_prompt, false, true);
        for (size_t i = 0; i < tokens.size(); ++i) {
            const std::string piece = common_token_to_piece(vocab, tokens[i], true);
            if (i == 0 && !piece.empty() && std::isspace(static_cast<unsigned char>(piece[0])) &&
                !std::isspace(static_cast<unsigned char>(constrained.generation_prompt[0]))) {
                continue;
            }
            out.grammar_prefill.push_back(tokens[i]);
        }
    }

    auto impl = std::make_unique<ChatOutputParser::Impl>();
    impl->params = common_chat_parser_params(constrained);
    impl->params.reasoning_format = inputs.reasoning_format;
    impl->params.parse_tool_calls =
        !inputs.tools.empty() && inputs.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    if (!constrained.parser.empty()) {
        impl->params.parser.load(constrained.parser);
    }
    out.parser = std::make_shared<const ChatOutputParser>(std::move(impl));
    return out;
}

std::string json_schema_grammar(const std::string& schema_json) {
    try {
        return json_schema_to_grammar(common_json::parse(schema_json));
    } catch (const std::exception& e) {
        throw std::invalid_argument(e.what());
    }
}

bool json_schema_pattern_supported(const std::string& pattern) {
    try {
        common_json schema = common_json::object();
        schema["type"] = "string";
        schema["pattern"] = pattern;
        const std::string grammar = json_schema_to_grammar(schema);
        // Unsupported: the root is the generic string rule.
        return grammar.find("root ::= string") == std::string::npos &&
               grammar.find("root ::= \"\\\"\"") != std::string::npos;
    } catch (const std::exception&) {
        return false;
    }
}

}  // namespace skippy::runtime
