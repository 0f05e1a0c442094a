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

namespace skippy::server {

// The reply as a sequence of typed blocks (reasoning, text, one per tool call), each opened,
// extended and closed: how Anthropic content blocks and Responses output items stream.
struct BlockEvent {
    enum class Type { Open, Delta, Close };
    enum class Kind { Reasoning, Text, ToolCall };
    Type type = Type::Open;
    Kind kind = Kind::Text;
    size_t block = 0;       // index among all blocks of the reply
    size_t tool_index = 0;  // ToolCall
    std::string text;       // Delta: new text (ToolCall: arguments)
    std::string id;         // Open ToolCall
    std::string name;       // Open ToolCall
};

class ReplyBlocks {
  public:
    std::vector<BlockEvent> add(const std::vector<ReplyDelta>& deltas);
    std::vector<BlockEvent> close();  // closes the open block (the reply is complete)
    size_t count() const { return next_block_; }

  private:
    bool open_ = false;
    BlockEvent::Kind open_kind_ = BlockEvent::Kind::Text;
    size_t open_block_ = 0;
    size_t open_tool_ = 0;
    size_t next_block_ = 0;
};

}  // namespace skippy::server
