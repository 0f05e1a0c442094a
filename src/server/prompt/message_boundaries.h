// Structural record positions of a chat prompt ("message boundaries"): the token position
// where each earlier message of the rendered conversation ends, and where the generation
// prompt before each earlier assistant message ends (where the earlier request of the
// conversation stopped, so the state recorded there is what this turn restores).
//
// Definition (the brute-force reference the tests compare against): for k = 1..n-1,
// in order, while the running render cost stays within the budget,
//   head_k = render(messages[0, k), add_generation_prompt = false)        one boundary
//   gen_k  = render(messages[0, k), add_generation_prompt = true)         one more, only
//                                                                          when messages[k]
//                                                                          is an assistant's
// and each rendered head maps to a token count of the prompt: when the head is a text prefix
// of the prompt, the number of prompt tokens that end at or before its end; otherwise the
// common prefix of its own tokenization and the prompt's tokens. Zero counts are dropped and
// the list is sorted and deduplicated. Each boundary depends only on the messages before it,
// so the next turn of a conversation computes the same boundaries for its shared prefix.
//
// MessageBoundaryFinder computes exactly the same list, in O(messages) work per request for
// a conversation it has seen before: every render it makes (and the ones the caller makes
// anyway: the prompt itself, the end of the turn) is remembered in a bounded LRU memo keyed
// by a SHA-256 chain over the messages before it, as (text length, keyed hash of the text).
// A remembered head counts only when the current prompt starts with exactly that text (its
// prefix hash at that length matches); anything else is rendered again, as by the reference.
// The next turn of a chat thus renders one head (the previous messages without generation
// prompt) instead of 3t-2 templates.
//
// Thread safety: all const methods are safe to call concurrently (one mutex on the memo).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/digest.h"
#include "runtime/chat_template.h"
#include "runtime/model.h"

namespace skippy::server {

// ChatTemplate::render / apply through one process-wide lock. llama.cpp's chat rendering
// calls std::localtime (one static buffer) on every render, so concurrent renders race
// (found by ThreadSanitizer): every render of the server layer goes through here.
std::string render_chat(const runtime::ChatTemplate& chat_template,
                        const std::vector<runtime::ChatMessage>& messages,
                        bool add_generation_prompt, const runtime::ChatContext& context = {});
runtime::ChatPrompt apply_chat(const runtime::ChatTemplate& chat_template,
                               const std::vector<runtime::ChatMessage>& messages,
                               const runtime::ChatContext& context,
                               const runtime::ChatConstraints& constraints);

// Identity of messages[0, k) for k = 0..n (keys[0] is the empty conversation, within the
// render context named by `context_label`, see chat_context_label()).
using MessageKeys = std::vector<cache::Digest>;
MessageKeys message_keys(const std::vector<runtime::ChatMessage>& messages,
                         const std::string& context_label = "");
// A text that identifies what besides the messages shapes a render (tools, template
// kwargs); "" for the plain context.
std::string chat_context_label(const runtime::ChatContext& context);
// Identity of messages[0, k] given the identity of messages[0, k).
cache::Digest extend_message_key(const cache::Digest& key, const runtime::ChatMessage& message);

// The render cost rule of the budget: before computing the boundaries at message k, the
// running cost grows by (k + 16) per render (two renders when messages[k] is an assistant's).
size_t boundary_render_cost(size_t k, const runtime::ChatMessage& message);

class MessageBoundaryFinder {
  public:
    struct Stats {
        uint64_t renders = 0;    // template renders made by find()
        uint64_t memo_hits = 0;  // boundaries served by the memo
    };

    MessageBoundaryFinder(const runtime::Model& model, const runtime::ChatTemplate& chat_template,
                          size_t render_budget, size_t memo_entries);

    // The boundaries of `messages` whose rendered prompt (add_generation_prompt = true) is
    // `prompt`, tokenized as `prompt_tokens`; `keys` = message_keys(messages). Throws what
    // ChatTemplate::render throws.
    // `context`: the tools and template kwargs every head is rendered with (the keys must
    // have been made with its label).
    std::vector<int32_t> find(const std::vector<runtime::ChatMessage>& messages,
                              const MessageKeys& keys, const std::string& prompt,
                              const std::vector<runtime::Token>& prompt_tokens,
                              const runtime::ChatContext& context = {}) const;

    // Remembers render(messages with identity `key`, add_generation_prompt) == text.
    void remember(const cache::Digest& key, bool add_generation_prompt,
                  const std::string& text) const;

    bool remembers(const cache::Digest& key, bool add_generation_prompt) const;

    // Renders and remembers `messages` (identity `key`) unless the memo already has them;
    // render errors are ignored (the request that needs the render will report them).
    void prepare(const cache::Digest& key, const std::vector<runtime::ChatMessage>& messages,
                 bool add_generation_prompt, const runtime::ChatContext& context = {}) const;

    // The text of token t (special tokens rendered), from a table built once.
    std::string_view piece(runtime::Token t) const;
    bool is_special(runtime::Token t) const;  // (from the same table)
    size_t max_piece_bytes() const { return max_piece_bytes_; }
    Stats stats() const;

  private:
    struct MemoKey {
        cache::Digest messages;
        bool generation_prompt = false;
        bool operator==(const MemoKey&) const = default;
    };
    struct MemoKeyHash {
        size_t operator()(const MemoKey& k) const noexcept {
            return cache::DigestHash{}(k.messages) ^ static_cast<size_t>(k.generation_prompt);
        }
    };
    struct TextId {
        uint64_t bytes = 0;
        uint64_t h1 = 0;
        uint64_t h2 = 0;
    };
    using Lru = std::list<std::pair<MemoKey, TextId>>;
    class PrefixHasher;

    TextId text_id(const std::string& text) const;
    bool lookup(const MemoKey& key, TextId& out) const;  // caller holds memo_mutex_
    // The memo has `key` and the prompt starts with its text (id: that text's).
    bool remembered_prefix(const MemoKey& key, const std::string& prompt, TextId& id) const;
    void insert(const MemoKey& key, const TextId& id) const;  // caller holds memo_mutex_

    const runtime::Model& model_;
    const runtime::ChatTemplate& chat_template_;
    size_t render_budget_;
    size_t memo_entries_;
    uint64_t base1_;
    uint64_t base2_;
    std::string pieces_;                 // all token pieces, concatenated
    std::vector<uint32_t> piece_begin_;  // n_vocab + 1 offsets into pieces_
    std::vector<bool> special_;          // per token: control / user-defined
    size_t max_piece_bytes_ = 1;

    mutable std::mutex memo_mutex_;
    mutable Lru lru_;  // most recently used first
    mutable std::unordered_map<MemoKey, Lru::iterator, MemoKeyHash> memo_;
    mutable Stats stats_;
};

}  // namespace skippy::server
