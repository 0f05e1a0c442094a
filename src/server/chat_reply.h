// ReplyAccumulator: turns the generated text of a chat request into the assistant message
// (content, reasoning, tool calls with ids) as it grows, and reports what is new since the
// last call, for streamed deltas in any API's format (OpenAI chat chunks, Anthropic content
// blocks, Responses events).
//
// Thread safety: not thread-safe; one per request, used by its HTTP handler thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/chat_template.h"

namespace skippy::server {

struct ReplyDelta {
    enum class Kind { Content, Reasoning, ToolCallStart, ToolCallArguments };
    Kind kind = Kind::Content;
    size_t index = 0;  // tool call index
    std::string text;  // Content / Reasoning / ToolCallArguments
    std::string id;    // ToolCallStart
    std::string name;  // ToolCallStart
};

// The id of tool call `index` of a reply whose ids start with `base`.
std::string tool_call_id(const std::string& base, size_t index);

class ReplyAccumulator {
  public:
    // parser: the chat format's output parser; null = the text is all content.
    ReplyAccumulator(std::shared_ptr<const runtime::ChatOutputParser> parser,
                     std::string tool_call_id_base);

    // Adds generated text (partial parse) and returns what became known.
    std::vector<ReplyDelta> append(const std::string& text);
    // The text is complete (final parse); returns what is left to report.
    std::vector<ReplyDelta> finish();

    // The message as parsed so far (final after finish()), tool call ids assigned.
    const runtime::ChatReply& reply() const { return reply_; }
    const std::string& text() const { return text_; }

  private:
    std::vector<ReplyDelta> update(bool partial);

    std::shared_ptr<const runtime::ChatOutputParser> parser_;
    std::string id_base_;
    std::string text_;
    runtime::ChatReply reply_;
    // What was reported.
    std::string sent_content_;
    std::string sent_reasoning_;
    std::vector<std::string> sent_arguments_;  // one per started tool call
};

// The reply parsed from finished text in one go (non-streamed responses, the end of turn).
runtime::ChatReply parse_reply(const runtime::ChatOutputParser* parser, const std::string& text,
                               const std::string& tool_call_id_base);

}  // namespace skippy::server
