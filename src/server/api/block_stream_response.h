// BlockStreamResponse: the streaming translator the block-structured dialects share
// (Anthropic Messages' content blocks, OpenAI Responses' output items). It owns the reply as
// it grows: generated text -> ReplyAccumulator (content, reasoning and tool-call pieces) ->
// ReplyBlocks (open / delta / close events of numbered blocks), and the final message and
// stats; a dialect only renders those block events in its own wire format (render()) and
// writes its opening and closing events and its non-streamed body from reply() and stats().
// OpenAI chat completions stream the same ReplyAccumulator pieces as deltas, per choice
// (openai_response.cpp), with no blocks.
//
//   class MyDialect final : public BlockStreamResponse {
//       std::string render(const std::vector<BlockEvent>& events) override;  // SSE text
//       std::string finish() override;  // uses reply(), stats()
//   };
//
// Thread safety: as ApiResponse (one per request, on the thread serving it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/chat_template.h"
#include "server/api/api_response.h"
#include "server/api/chat_reply.h"

namespace skippy::server {

class BlockStreamResponse : public ApiResponse {
  public:
    // Streaming: the block events the new text completes, rendered; otherwise kept.
    std::string on_delta(size_t choice, const StreamEvent& delta) final;
    // Streaming: the last blocks rendered and closed. The final reply is ready after this.
    std::string on_done(size_t choice, const GenerationStats& stats) final;

  protected:
    explicit BlockStreamResponse(std::shared_ptr<const ParsedRequest> parsed);

    // The dialect's SSE text for block events, in order (streaming only).
    virtual std::string render(const std::vector<BlockEvent>& events) = 0;

    const ParsedRequest& request() const { return *parsed_; }
    // After on_done: the whole assistant message and the generation's stats.
    const runtime::ChatReply& reply() const { return final_; }
    const GenerationStats& stats() const { return stats_; }

    std::shared_ptr<const ParsedRequest> parsed_;

  private:
    ReplyAccumulator accumulator_;
    ReplyBlocks blocks_;
    std::string text_;  // not streamed: the whole output, parsed once at the end
    runtime::ChatReply final_;
    GenerationStats stats_;
};

}  // namespace skippy::server
