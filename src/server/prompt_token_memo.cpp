#include "server/prompt_token_memo.h"

#include <utility>

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

std::vector<runtime::Token> PromptTokenMemo::tokenize(const std::string& prompt,
                                                      const MessageKeys& keys) const {
    for (size_t j = keys.size() < 2 ? 0 : keys.size() - 2; j >= 1 && max_entries_ > 0; --j) {
        const auto head = find(keys[j]);
        if (!head) {
            continue;
        }
        const std::string& text = head->text;
        if (head->tokens.empty() || model_.is_end_of_generation(head->tokens.back()) ||
            text.size() >= prompt.size() || prompt.compare(0, text.size(), text) != 0) {
            continue;
        }
        const std::string_view rest = std::string_view(prompt).substr(text.size());
        std::vector<runtime::Token> tail = model_.tokenize(rest, false, true);
        // The rest must start with a special token (the split point of the tokenizer).
        if (tail.empty() || !model_.is_special_token(tail.front()) ||
            !rest.starts_with(model_.token_to_piece(tail.front(), true))) {
            break;  // a shorter head would not end at a special token either, in general
        }
        std::vector<runtime::Token> out;
        out.reserve(head->tokens.size() + tail.size());
        out.insert(out.end(), head->tokens.begin(), head->tokens.end());
        out.insert(out.end(), tail.begin(), tail.end());
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.hits;
        stats_.reused_tokens += head->tokens.size();
        return out;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.misses;
    }
    return model_.tokenize(prompt, true, true);
}

void PromptTokenMemo::remember(const cache::Digest& key, std::string text,
                               std::vector<runtime::Token> tokens) const {
    if (max_entries_ == 0) {
        return;
    }
    auto head = std::make_shared<const Head>(Head{std::move(text), std::move(tokens)});
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
