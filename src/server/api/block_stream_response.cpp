#include "server/api/block_stream_response.h"

namespace skippy::server {

BlockStreamResponse::BlockStreamResponse(std::shared_ptr<const ParsedRequest> parsed)
    : parsed_(std::move(parsed)), accumulator_(parsed_->chat_parser, parsed_->tool_call_id_base) {}

std::string BlockStreamResponse::on_delta(size_t, const StreamEvent& delta) {
    if (!parsed_->stream) {
        text_ += delta.text;
        return "";
    }
    return render(blocks_.add(accumulator_.append(delta.text)));
}

std::string BlockStreamResponse::on_done(size_t, const GenerationStats& stats) {
    stats_ = stats;
    if (!parsed_->stream) {
        final_ = parse_reply(parsed_->chat_parser.get(), text_, parsed_->tool_call_id_base);
        return "";
    }
    std::string out = render(blocks_.add(accumulator_.finish()));
    out += render(blocks_.close());
    final_ = accumulator_.reply();
    return out;
}

}  // namespace skippy::server
