#include "server/api/chat_reply.h"

#include "server/api/text_output.h"

namespace skippy::server {

namespace {

// The part of `now` after `sent` when `now` extends it; "" otherwise (a partial parse that
// changed its mind cannot be taken back: nothing is reported until it extends again).
std::string extension(const std::string& now, const std::string& sent) {
    if (now.size() <= sent.size() || now.compare(0, sent.size(), sent) != 0) {
        return "";
    }
    return now.substr(sent.size());
}

}  // namespace

std::string tool_call_id(const std::string& base, size_t index) {
    return base + std::to_string(index);
}

runtime::ChatReply parse_reply(const runtime::ChatOutputParser* parser, const std::string& text,
                               const std::string& tool_call_id_base) {
    runtime::ChatReply reply;
    if (parser == nullptr) {
        reply.content = as_sent_utf8(text);
        return reply;
    }
    reply = parser->parse(as_sent_utf8(text), false);
    for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
        reply.tool_calls[i].id = tool_call_id(tool_call_id_base, i);
    }
    return reply;
}

ReplyAccumulator::ReplyAccumulator(std::shared_ptr<const runtime::ChatOutputParser> parser,
                                   std::string tool_call_id_base)
    : parser_(std::move(parser)), id_base_(std::move(tool_call_id_base)) {}

std::vector<ReplyDelta> ReplyAccumulator::append(const std::string& text) {
    if (text.empty()) {
        return {};
    }
    text_ += text;
    return update(true);
}

std::vector<ReplyDelta> ReplyAccumulator::finish() { return update(false); }

std::vector<ReplyDelta> ReplyAccumulator::update(bool partial) {
    if (parser_ == nullptr) {
        reply_.content = text_;
    } else {
        reply_ = parser_->parse(as_sent_utf8(text_), partial);
        for (size_t i = 0; i < reply_.tool_calls.size(); ++i) {
            reply_.tool_calls[i].id = tool_call_id(id_base_, i);
        }
    }
    std::vector<ReplyDelta> out;
    if (std::string d = extension(reply_.reasoning_content, sent_reasoning_); !d.empty()) {
        sent_reasoning_ += d;
        out.push_back(ReplyDelta{ReplyDelta::Kind::Reasoning, 0, std::move(d), "", ""});
    }
    if (std::string d = extension(reply_.content, sent_content_); !d.empty()) {
        sent_content_ += d;
        out.push_back(ReplyDelta{ReplyDelta::Kind::Content, 0, std::move(d), "", ""});
    }
    const auto& calls = reply_.tool_calls;
    for (size_t i = 0; i < calls.size(); ++i) {
        if (i >= sent_arguments_.size()) {
            // A call is announced once its name is complete: when its arguments began, a
            // later call exists, or the text is finished.
            const bool name_complete =
                !partial || !calls[i].arguments.empty() || i + 1 < calls.size();
            if (calls[i].name.empty() || !name_complete || i != sent_arguments_.size()) {
                break;
            }
            sent_arguments_.emplace_back();
            out.push_back(
                ReplyDelta{ReplyDelta::Kind::ToolCallStart, i, "", calls[i].id, calls[i].name});
        }
        if (std::string d = extension(calls[i].arguments, sent_arguments_[i]); !d.empty()) {
            sent_arguments_[i] += d;
            out.push_back(ReplyDelta{ReplyDelta::Kind::ToolCallArguments, i, std::move(d), "", ""});
        }
    }
    return out;
}

}  // namespace skippy::server

namespace skippy::server {

std::vector<BlockEvent> ReplyBlocks::add(const std::vector<ReplyDelta>& deltas) {
    std::vector<BlockEvent> out;
    const auto open = [&](BlockEvent::Kind kind, const ReplyDelta& d) {
        auto closed = close();
        out.insert(out.end(), closed.begin(), closed.end());
        BlockEvent e;
        e.type = BlockEvent::Type::Open;
        e.kind = kind;
        e.block = next_block_++;
        e.tool_index = d.index;
        e.id = d.id;
        e.name = d.name;
        out.push_back(e);
        open_ = true;
        open_kind_ = kind;
        open_block_ = e.block;
        open_tool_ = d.index;
    };
    for (const auto& d : deltas) {
        BlockEvent::Kind kind = BlockEvent::Kind::Text;
        switch (d.kind) {
            case ReplyDelta::Kind::Content:
                kind = BlockEvent::Kind::Text;
                break;
            case ReplyDelta::Kind::Reasoning:
                kind = BlockEvent::Kind::Reasoning;
                break;
            case ReplyDelta::Kind::ToolCallStart:
                open(BlockEvent::Kind::ToolCall, d);
                continue;
            case ReplyDelta::Kind::ToolCallArguments:
                kind = BlockEvent::Kind::ToolCall;
                break;
        }
        const bool same = open_ && open_kind_ == kind &&
                          (kind != BlockEvent::Kind::ToolCall || open_tool_ == d.index);
        if (!same) {
            if (kind == BlockEvent::Kind::ToolCall) {
                continue;  // arguments of a call whose block is closed: cannot happen
            }
            open(kind, d);
        }
        BlockEvent e;
        e.type = BlockEvent::Type::Delta;
        e.kind = kind;
        e.block = open_block_;
        e.tool_index = open_tool_;
        e.text = d.text;
        out.push_back(std::move(e));
    }
    return out;
}

std::vector<BlockEvent> ReplyBlocks::close() {
    if (!open_) {
        return {};
    }
    open_ = false;
    BlockEvent e;
    e.type = BlockEvent::Type::Close;
    e.kind = open_kind_;
    e.block = open_block_;
    e.tool_index = open_tool_;
    return {e};
}

}  // namespace skippy::server
