// ChatTemplate: renders OpenAI-style messages into the model's prompt text with the
// chat template stored in the GGUF (llama.cpp common/ chat code, Jinja), and, for a request
// with tools or a response format, everything generation needs besides the prompt: the
// grammar that constrains decoding (lazy, with its triggers, for tool_choice auto), the
// tokens the output format relies on, extra stop strings and the parser of the output
// (tool calls, reasoning), all from llama.cpp's common chat layer (common/chat.h).
//
//   ChatTemplate tmpl(model);
//   std::string prompt = tmpl.render(messages, /*add_generation_prompt=*/true);
//   ChatPrompt p = tmpl.apply(messages, context, constraints);   // tools, response format
//   ChatReply reply = p.parser->parse(generated_text, /*partial=*/false);
//
// Thread safety: every method is const and safe from any thread; a ChatOutputParser is
// immutable and may be shared between threads.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/model.h"

namespace skippy::runtime {

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // JSON text of the arguments object
    bool operator==(const ToolCall&) const = default;
};

struct ChatMessage {
    ChatMessage() = default;
    ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}
    std::string role;
    std::string content;
    std::vector<ToolCall> tool_calls;  // assistant
    std::string tool_call_id;          // tool: the call this message answers
    std::string name;                  // tool: the function's name (optional)
    std::string reasoning_content;     // assistant: earlier reasoning (reasoning templates)
    bool operator==(const ChatMessage&) const = default;
};

struct ToolDefinition {
    std::string name;
    std::string description;
    std::string parameters;  // JSON Schema text of the arguments object
};

// What, besides the messages, changes the rendered prompt. Part of the identity of every
// rendered head (see server/prompt/message_boundaries.h).
struct ChatContext {
    std::vector<ToolDefinition> tools;
    std::map<std::string, std::string> template_kwargs;  // name -> JSON text
    bool enable_thinking = true;
    bool empty() const { return tools.empty() && template_kwargs.empty() && enable_thinking; }
};

enum class ToolChoice { Auto, None, Required };

// What constrains the output (not the prompt).
struct ChatConstraints {
    ToolChoice tool_choice = ToolChoice::Auto;
    std::string forced_tool;  // a named tool_choice: exactly this function (implies Required)
    bool parallel_tool_calls = false;
    std::string json_schema;  // response_format schema (JSON text); empty = none
};

// The assistant message parsed from generated text.
struct ChatReply {
    std::string content;
    std::string reasoning_content;
    std::vector<ToolCall> tool_calls;  // ids empty: the caller assigns them
};

class ChatOutputParser {
  public:
    struct Impl;
    explicit ChatOutputParser(std::unique_ptr<Impl> impl);
    ~ChatOutputParser();
    // `partial`: the text is still growing (an unfinished tool call is reported as far as it
    // goes). Never throws: text the format cannot parse is returned as content.
    ChatReply parse(const std::string& text, bool partial) const;
    bool parses_tool_calls() const;

  private:
    std::unique_ptr<Impl> impl_;
};

struct ChatPrompt {
    std::string prompt;
    // GBNF that constrains decoding (empty = none). Lazy: applied from the first trigger on.
    std::string grammar;
    bool grammar_lazy = false;
    std::vector<std::string> trigger_patterns;  // regexes over the generated text
    std::vector<Token> trigger_tokens;
    // Tokens the grammar expects before the generated ones (the generation prompt, which
    // the prompt already ends with): accepted into the grammar before sampling.
    std::vector<Token> grammar_prefill;
    // Tokens of the output format, rendered as text even when they are special.
    std::vector<Token> preserved_tokens;
    std::vector<std::string> additional_stops;
    std::shared_ptr<const ChatOutputParser> parser;
    bool supports_thinking = false;
};

class ChatTemplate {
  public:
    // template_override: a Jinja template to use instead of the GGUF's (empty = from model).
    // direct_render: render prompts without llama.cpp's per-call template analysis where
    // that gives the same text (runtime/chat_template_direct.h); false: always in full.
    explicit ChatTemplate(const Model& model, const std::string& template_override = "",
                          bool direct_render = true);
    ~ChatTemplate();
    ChatTemplate(const ChatTemplate&) = delete;
    ChatTemplate& operator=(const ChatTemplate&) = delete;

    // Throws std::invalid_argument when the template cannot render the messages.
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                       const ChatContext& context = {}) const;
    // The prompt (with generation prompt) and what generation needs for it. Throws
    // std::invalid_argument when the template cannot render the messages or a schema
    // cannot be turned into a grammar.
    ChatPrompt apply(const std::vector<ChatMessage>& messages, const ChatContext& context,
                     const ChatConstraints& constraints) const;
    // Stop strings the template asks for besides end-of-generation tokens.
    const std::vector<std::string>& additional_stops() const { return additional_stops_; }
    const std::string& source() const { return source_; }
    bool supports_tool_calls() const { return supports_tool_calls_; }
    bool supports_thinking() const { return supports_thinking_; }
    // Whether render() skips llama.cpp's template analysis (for requests without tools).
    bool renders_directly() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::vector<std::string> additional_stops_;
    std::string source_;
    bool supports_tool_calls_ = false;
    bool supports_thinking_ = false;
};

// GBNF for a JSON schema (json-schema-to-grammar). Throws std::invalid_argument when the
// schema cannot be converted.
std::string json_schema_grammar(const std::string& schema_json);

// True when json-schema-to-grammar enforces the regular expression `pattern` of a string
// schema (for features it does not support it accepts any string instead); false also for
// invalid patterns.
bool json_schema_pattern_supported(const std::string& pattern);

}  // namespace skippy::runtime
