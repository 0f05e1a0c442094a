#include "server/prompt/prompt_token_memo.h"

#include <utility>

#include "cache/sha256.h"

namespace skippy::server {

PromptTokenMemo::PromptTokenMemo(const runtime::Model& model, size_t max_entries)
    : model_(model), max_entries_(max_entries) {}

std::shared_ptr<const PromptTokenMemo::Head> PromptTokenMemo::find(const cache::Digest& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it == index_.end()) {
        return nullptr;
    }
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
}

namespace {

// The key of the prompt head of the messages with identity `key`.
cache::Digest prompt_key(const cache::Digest& key) {
    cache::Sha256 h;
    static constexpr char kLabel[] = "skippy.prompt-head.v1";
    h.update(kLabel, sizeof kLabel - 1);
    h.update(key.bytes.data(), key.bytes.size());
    return h.finish();
}

}  // namespace

std::vector<runtime::Token> PromptTokenMemo::from_head(const std::string& prompt, const Head& head,
                                                       bool& tokenized) const {
    const std::string& text = head.text;
    if (head.tokens.empty() || model_.is_end_of_generation(head.tokens.back()) ||
        text.size() >= prompt.size() || prompt.compare(0, text.size(), text) != 0) {
        return {};
    }
    tokenized = true;
    const std::string_view rest = std::string_view(prompt).substr(text.size());
    std::vector<runtime::Token> tail = model_.tokenize(rest, false, true);
    // The rest must start with a special token (the split point of the tokenizer).
    if (tail.empty() || !model_.is_special_token(tail.front()) ||
        !rest.starts_with(model_.token_to_piece(tail.front(), true)) ||
        (!head.prompt && model_.strips_left(tail.front()))) {
        return {};
    }
    std::vector<runtime::Token> out;
    out.reserve(head.tokens.size() + tail.size());
    out.insert(out.end(), head.tokens.begin(), head.tokens.end());
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
}

std::vector<runtime::Token> PromptTokenMemo::from_key(const std::string& prompt,
                                                      const cache::Digest& key, int& tries) const {
    // The end of the turn with these messages, else the prompt that asked for it.
    for (const cache::Digest& k : {key, prompt_key(key)}) {
        const auto head = find(k);
        if (!head || tries == 0) {
            continue;
        }
        bool tokenized = false;
        std::vector<runtime::Token> out = from_head(prompt, *head, tokenized);
        tries -= tokenized ? 1 : 0;
        if (out.empty()) {
            continue;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.hits;
        stats_.reused_tokens += head->tokens.size();
        return out;
    }
    return {};
}

std::vector<runtime::Token> PromptTokenMemo::whole(const std::string& prompt) const {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.misses;
    }
    return model_.tokenize(prompt, true, true);
}

std::vector<runtime::Token> PromptTokenMemo::tokenize(const std::string& prompt,
                                                      const MessageKeys& keys) const {
    // At most two heads that the prompt starts with are tried: when neither splits at a
    // special token, a shorter one would not either, in general (and costs a longer rest).
    int tries = 2;
    for (size_t j = keys.size() < 2 ? 0 : keys.size() - 2; j >= 1 && max_entries_ > 0 && tries > 0;
         --j) {
        if (auto out = from_key(prompt, keys[j], tries); !out.empty()) {
            return out;
        }
    }
    return whole(prompt);
}

std::vector<runtime::Token> PromptTokenMemo::tokenize_after(const std::string& text,
                                                            const cache::Digest& key) const {
    int tries = 2;
    if (max_entries_ > 0) {
        if (auto out = from_key(text, key, tries); !out.empty()) {
            return out;
        }
    }
    return whole(text);
}

std::vector<runtime::Token> PromptTokenMemo::remembered(const cache::Digest& key) const {
    const auto head = find(key);
    return head && !head->prompt ? head->tokens : std::vector<runtime::Token>{};
}

void PromptTokenMemo::remember(const cache::Digest& key, std::string text,
                               std::vector<runtime::Token> tokens) const {
    if (max_entries_ == 0) {
        return;
    }
    store(key, std::make_shared<const Head>(Head{std::move(text), std::move(tokens), false}));
}

void PromptTokenMemo::remember_prompt(const cache::Digest& key, const std::string& prompt,
                                      const std::vector<runtime::Token>& tokens) const {
    if (max_entries_ == 0) {
        return;
    }
    // Cut before the last special token (not an added BOS at the front).
    for (size_t i = tokens.size(); i-- > 1;) {
        if (!model_.is_special_token(tokens[i])) {
            continue;
        }
        const std::string piece = model_.token_to_piece(tokens[i], true);
        const size_t at = prompt.rfind(piece);
        // What follows must be exactly the tokens that follow (it has no special token
        // text but this one's, which the tokenizer would have split).
        if (piece.empty() || at == std::string::npos ||
            model_.tokenize(std::string_view(prompt).substr(at), false, true) !=
                std::vector<runtime::Token>(tokens.begin() + static_cast<std::ptrdiff_t>(i),
                                            tokens.end())) {
            return;
        }
        store(prompt_key(key),
              std::make_shared<const Head>(
                  Head{prompt.substr(0, at),
                       std::vector<runtime::Token>(tokens.begin(),
                                                   tokens.begin() + static_cast<std::ptrdiff_t>(i)),
                       true}));
        return;
    }
}

void PromptTokenMemo::store(const cache::Digest& key, std::shared_ptr<const Head> head) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
        lru_.erase(it->second);
        index_.erase(it);
    }
    lru_.emplace_front(key, std::move(head));
    index_.emplace(key, lru_.begin());
    while (lru_.size() > max_entries_) {
        index_.erase(lru_.back().first);
        lru_.pop_back();
    }
}

PromptTokenMemo::Stats PromptTokenMemo::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
}

}  // namespace skippy::server
