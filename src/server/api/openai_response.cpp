#include <atomic>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

#include "server/api/api_error.h"
#include "server/api/api_response.h"
#include "server/api/chat_reply.h"
#include "server/api/logprobs.h"

namespace skippy::server {

using nlohmann::json;

std::string sse_data(const json& payload) { return "data: " + dump_json(payload) + "\n\n"; }

std::string sse_event(const std::string& event, const json& payload) {
    return "event: " + event + "\ndata: " + dump_json(payload) + "\n\n";
}

std::string random_id(const char* prefix) {
    static std::atomic<uint64_t> counter{0};
    static const uint64_t salt = std::random_device{}();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%012llx%04llx", prefix,
                  static_cast<unsigned long long>(salt & 0xFFFFFFFFFFFFull),
                  static_cast<unsigned long long>(counter.fetch_add(1) & 0xFFFF));
    return buf;
}

json usage_json(const GenerationStats& stats) {
    return json{{"prompt_tokens", stats.prompt_tokens},
                {"completion_tokens", stats.completion_tokens},
                {"total_tokens", stats.prompt_tokens + stats.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", stats.cached_tokens}}}};
}

std::string client_miss_reason(const std::string& reason) {
    // Another tenant's prefix is never revealed to a client, not even that it exists (a
    // membership probe); the operator sees "namespace" in the logs and metrics.
    return reason == "namespace" ? "never_seen" : reason;
}

json skippy_json(const GenerationStats& stats, double parse_ms) {
    const std::string reason = client_miss_reason(stats.miss_reason);
    json out = {{"cache", stats.cache_decision},
                {"cache_tier", stats.cache_tier},
                {"miss_reason", reason.empty() ? json(nullptr) : json(reason)},
                {"diverged_at", stats.diverged_at >= 0 ? json(stats.diverged_at) : json(nullptr)},
                {"parse_ms", parse_ms},
                {"queue_ms", stats.queue_ms},
                {"restore_ms", stats.restore_ms},
                {"ttft_ms", stats.time_to_first_token_ms},
                {"total_ms", stats.total_ms}};
    if (!stats.miss_tier.empty() && stats.miss_tier != "none") {
        out["miss_tier"] = stats.miss_tier;
    }
    return out;
}

namespace {

json tool_calls_json(const std::vector<runtime::ToolCall>& calls) {
    json out = json::array();
    for (const auto& call : calls) {
        out.push_back(json{{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    return out;
}

class OpenAiResponse final : public ApiResponse {
  public:
    OpenAiResponse(std::shared_ptr<const ParsedRequest> parsed, const runtime::Model& model)
        : owned_(std::move(parsed)),
          parsed_(*owned_),
          model_(model),
          chat_(parsed_.endpoint == Endpoint::ChatCompletions),
          id_(random_id(chat_ ? "chatcmpl-" : "cmpl-")),
          created_(static_cast<int64_t>(std::time(nullptr))) {
        choices_.resize(static_cast<size_t>(std::max(parsed_.n, 1)));
        for (size_t i = 0; i < choices_.size(); ++i) {
            // Choice 0 has the ids the end of the turn renders (base + call index).
            choices_[i].id_base = i == 0
                                      ? parsed_.tool_call_id_base
                                      : parsed_.tool_call_id_base + "c" + std::to_string(i) + "_";
            choices_[i].reply =
                std::make_unique<ReplyAccumulator>(parsed_.chat_parser, choices_[i].id_base);
        }
    }

    void prepare_choice(size_t choice, GenerationRequest& gen) override {
        if (parsed_.top_logprobs < 0) {
            return;
        }
        auto collector = std::make_shared<LogprobCollector>(parsed_.top_logprobs);
        choices_[choice].logprobs = collector;
        gen.on_logits = [collector](std::span<const float> logits) {
            collector->on_logits(logits);
        };
        gen.on_sampled = [collector](runtime::Token token) { collector->on_sampled(token); };
    }

    std::string on_delta(size_t choice, const StreamEvent& delta) override {
        Choice& c = choices_[choice];
        c.tokens.insert(c.tokens.end(), delta.tokens.begin(), delta.tokens.end());
        if (c.logprobs) {
            auto entries = c.logprobs->take(delta.tokens.size());
            c.pending_logprobs.insert(c.pending_logprobs.end(), entries.begin(), entries.end());
        }
        c.pending_token_ids.insert(c.pending_token_ids.end(), delta.tokens.begin(),
                                   delta.tokens.end());
        if (!parsed_.stream) {
            c.text += delta.text;
            return "";
        }
        std::string out = role_chunk(choice);
        if (!chat_) {
            if (!delta.text.empty()) {
                out += chunk(choice, json{{"content", delta.text}}, nullptr);
            }
            return out;
        }
        for (const auto& d : c.reply->append(delta.text)) {
            out += chunk(choice, delta_json(d), nullptr);
        }
        return out;
    }

    std::string on_progress(size_t choice, const StreamEvent& event) override {
        if (!parsed_.stream) {
            return "";
        }
        // As llama-server sends it: a chunk with an empty delta and `prompt_progress`.
        json out = chunk_object(choice, json::object(), nullptr);
        out["prompt_progress"] = {{"total", event.progress.total},
                                  {"cache", event.progress.cache},
                                  {"processed", event.progress.processed},
                                  {"time_ms", event.progress.time_ms}};
        return sse_data(out);
    }

    std::string on_done(size_t choice, const GenerationStats& stats) override {
        Choice& c = choices_[choice];
        c.stats = stats;
        c.done = true;
        if (!parsed_.stream) {
            if (chat_) {
                c.final_reply = parse_reply(parsed_.chat_parser.get(), c.text, c.id_base);
            }
            return "";
        }
        std::string out = role_chunk(choice);
        if (chat_) {
            for (const auto& d : c.reply->finish()) {
                out += chunk(choice, delta_json(d), nullptr);
            }
            c.final_reply = c.reply->reply();
        }
        json last = chunk_object(choice, json::object(), finish_reason(c));
        attach_pending(c, last);
        last["skippy"] = skippy_json(stats, parsed_.parse_ms);
        out += sse_data(last);
        return out;
    }

    std::string finish() override {
        if (parsed_.stream) {
            std::string out;
            if (parsed_.include_usage) {
                json usage_chunk = base_object("chunk");
                usage_chunk["choices"] = json::array();
                usage_chunk["usage"] = usage_json(total_stats());
                out += sse_data(usage_chunk);
            }
            return out + "data: [DONE]\n\n";
        }
        json out = base_object("");
        out["usage"] = usage_json(total_stats());
        out["skippy"] = skippy_json(choices_[0].stats, parsed_.parse_ms);
        if (parsed_.return_token_ids) {
            out["skippy"]["completion_token_ids"] = choices_[0].tokens;
            out["skippy"]["prompt_token_count"] = parsed_.generation.prompt.size();
        }
        json list = json::array();
        for (size_t i = 0; i < choices_.size(); ++i) {
            list.push_back(final_choice(i));
        }
        out["choices"] = list;
        return dump_json(out);
    }

    std::string stream_error(int status, const std::string& type,
                             const std::string& message) override {
        return sse_data(error_body(status, type, message));
    }

  private:
    struct Choice {
        std::unique_ptr<ReplyAccumulator> reply;
        std::shared_ptr<LogprobCollector> logprobs;
        std::vector<TokenLogprob> pending_logprobs;  // streaming: not sent yet
        std::vector<TokenLogprob> all_logprobs;      // non-streaming: everything
        std::vector<runtime::Token> pending_token_ids;
        std::vector<runtime::Token> tokens;
        std::string text;
        runtime::ChatReply final_reply;
        GenerationStats stats;
        bool role_sent = false;
        bool done = false;
        size_t text_offset = 0;  // completions logprobs
        std::string id_base;     // tool call ids
    };

    json base_object(const char* kind) const {
        std::string object = chat_ ? "chat.completion" : "text_completion";
        if (chat_ && std::string(kind) == "chunk") {
            object = "chat.completion.chunk";
        }
        return json{{"id", id_},
                    {"object", object},
                    {"created", created_},
                    {"model", parsed_.model},
                    {"system_fingerprint", "skippy"}};
    }

    json chunk_object(size_t choice, const json& delta, const json& finish) const {
        json out = base_object("chunk");
        json c = {{"index", choice}, {"finish_reason", finish}};
        if (chat_) {
            c["delta"] = delta;
            c["logprobs"] = nullptr;
        } else {
            c["text"] = delta.value("content", "");
            c["logprobs"] = nullptr;
        }
        out["choices"] = json::array({c});
        return out;
    }

    // Attaches the logprobs and token ids not sent yet to a chunk's choice.
    void attach_pending(Choice& c, json& chunk) {
        json& choice = chunk["choices"][0];
        if (c.logprobs && !c.pending_logprobs.empty()) {
            if (chat_) {
                choice["logprobs"] = {
                    {"content", chat_logprobs_content(model_, c.pending_logprobs)}};
            } else {
                choice["logprobs"] = completion_logprobs(model_, c.pending_logprobs, c.text_offset);
                for (const auto& e : c.pending_logprobs) {
                    c.text_offset += model_.token_to_piece(e.token, true).size();
                }
            }
            c.pending_logprobs.clear();
        }
        if (parsed_.return_token_ids && !c.pending_token_ids.empty()) {
            if (chat_) {
                choice["delta"]["skippy_token_ids"] = c.pending_token_ids;
            } else {
                choice["skippy_token_ids"] = c.pending_token_ids;
            }
            c.pending_token_ids.clear();
        }
        if (!parsed_.return_token_ids) {
            c.pending_token_ids.clear();
        }
    }

    std::string chunk(size_t choice, const json& delta, const json& finish) {
        json out = chunk_object(choice, delta, finish);
        attach_pending(choices_[choice], out);
        return sse_data(out);
    }

    std::string role_chunk(size_t choice) {
        Choice& c = choices_[choice];
        if (!chat_ || c.role_sent) {
            return "";
        }
        c.role_sent = true;
        return sse_data(
            chunk_object(choice, json{{"role", "assistant"}, {"content", ""}}, nullptr));
    }

    static json delta_json(const ReplyDelta& d) {
        switch (d.kind) {
            case ReplyDelta::Kind::Content:
                return json{{"content", d.text}};
            case ReplyDelta::Kind::Reasoning:
                return json{{"reasoning_content", d.text}};
            case ReplyDelta::Kind::ToolCallStart:
                return json{
                    {"tool_calls",
                     json::array({json{{"index", d.index},
                                       {"id", d.id},
                                       {"type", "function"},
                                       {"function", {{"name", d.name}, {"arguments", ""}}}}})}};
            case ReplyDelta::Kind::ToolCallArguments:
                return json{
                    {"tool_calls", json::array({json{{"index", d.index},
                                                     {"function", {{"arguments", d.text}}}}})}};
        }
        return json::object();
    }

    std::string finish_reason(const Choice& c) const {
        if (chat_ && !c.final_reply.tool_calls.empty() && c.stats.finish_reason == "stop") {
            return "tool_calls";
        }
        return c.stats.finish_reason;
    }

    json final_choice(size_t i) {
        Choice& c = choices_[i];
        json choice = {{"index", i}, {"finish_reason", finish_reason(c)}, {"logprobs", nullptr}};
        if (c.logprobs) {
            auto rest = c.logprobs->take(c.tokens.size());
            c.pending_logprobs.insert(c.pending_logprobs.end(), rest.begin(), rest.end());
            c.pending_logprobs.resize(std::min(c.pending_logprobs.size(), c.tokens.size()));
            if (chat_) {
                choice["logprobs"] = {
                    {"content", chat_logprobs_content(model_, c.pending_logprobs)}};
            } else {
                choice["logprobs"] = completion_logprobs(model_, c.pending_logprobs, 0);
            }
        }
        if (chat_) {
            const auto& r = c.final_reply;
            json message = {{"role", "assistant"}};
            message["content"] =
                r.content.empty() && !r.tool_calls.empty() ? json(nullptr) : json(r.content);
            if (!r.reasoning_content.empty()) {
                message["reasoning_content"] = r.reasoning_content;
            }
            if (!r.tool_calls.empty()) {
                message["tool_calls"] = tool_calls_json(r.tool_calls);
            }
            choice["message"] = message;
        } else {
            choice["text"] = c.text;
        }
        return choice;
    }

    GenerationStats total_stats() const {
        GenerationStats total = choices_[0].stats;
        total.completion_tokens = 0;
        for (const auto& c : choices_) {
            total.completion_tokens += c.stats.completion_tokens;
        }
        return total;
    }

    std::shared_ptr<const ParsedRequest> owned_;
    const ParsedRequest& parsed_;
    const runtime::Model& model_;
    bool chat_;
    std::string id_;
    int64_t created_;
    std::vector<Choice> choices_;
};

}  // namespace

std::unique_ptr<ApiResponse> make_openai_response(std::shared_ptr<const ParsedRequest> parsed,
                                                  const runtime::Model& model) {
    return std::make_unique<OpenAiResponse>(std::move(parsed), model);
}

}  // namespace skippy::server
