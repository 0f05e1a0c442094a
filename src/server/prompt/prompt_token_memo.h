// Incremental tokenization of chat prompts. The next turn of a conversation renders the
// previous turn's end (its messages, add_generation_prompt = false) followed by new
// messages; those earlier tokens were already computed when the previous turn ended. The
// memo keeps (text, tokens) per conversation head, keyed by the identity of the messages
// (message_keys), and tokenizes only what follows the longest remembered head:
//
//   PromptTokenMemo memo(model, 32);
//   memo.remember(keys[k], head_text, head_tokens);           // at the end of a turn
//   std::vector<Token> t = memo.tokenize(prompt, keys);       // == model.tokenize(prompt,
//                                                             //    true, true), faster
//
// A follow-up can arrive before the previous turn's end was rendered (an agent's tool
// result): the previous request's prompt is remembered too (remember_prompt), cut before its
// last special token (where the generation prompt starts), and the follow-up, which starts
// with that prompt's text, is tokenized from there.
//
// Exactness: llama.cpp's tokenizer first splits the text at special tokens and tokenizes
// the text between them independently. A head is used only when the prompt starts with
// exactly its text and the rest starts with a special token (checked on the tokens of the
// rest), so tokenize(head) + tokenize(rest) is the tokenization of the whole prompt. Heads
// whose tokens end with an added EOS are never used, nor a turn's end before a special token
// that strips the whitespace on its left (the whole tokenization would drop what the head
// kept). A prompt head is the first tokens of a whole tokenization, which the rest, starting
// with the same special token, continues the same way.
//
// Thread safety: const methods are safe to call concurrently (one mutex on the memo).
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/digest.h"
#include "runtime/model.h"
#include "server/prompt/message_boundaries.h"

namespace skippy::server {

class PromptTokenMemo {
  public:
    struct Stats {
        uint64_t hits = 0;    // prompts tokenized from a remembered head
        uint64_t misses = 0;  // tokenized whole
        uint64_t reused_tokens = 0;
    };

    PromptTokenMemo(const runtime::Model& model, size_t max_entries);

    // model.tokenize(prompt, /*add_special=*/true, /*parse_special=*/true), reusing the
    // tokens of the longest remembered head keys[j] (j < keys.size() - 1) the prompt
    // starts with.
    std::vector<runtime::Token> tokenize(const std::string& prompt, const MessageKeys& keys) const;
    // The same for a text that continues the messages with identity `key` (the end of their
    // turn): reuses their remembered turn end or prompt head.
    std::vector<runtime::Token> tokenize_after(const std::string& text,
                                               const cache::Digest& key) const;

    // `tokens` = model.tokenize(text, true, true), text = the render of the messages with
    // identity `key` (add_generation_prompt = false).
    void remember(const cache::Digest& key, std::string text,
                  std::vector<runtime::Token> tokens) const;
    // `tokens` = model.tokenize(prompt, true, true), prompt = the render of the messages with
    // identity `key` with the generation prompt.
    void remember_prompt(const cache::Digest& key, const std::string& prompt,
                         const std::vector<runtime::Token>& tokens) const;

    // The tokens remembered for the messages with identity `key` (remember()), or none.
    std::vector<runtime::Token> remembered(const cache::Digest& key) const;

    Stats stats() const;

  private:
    struct Head {
        std::string text;
        std::vector<runtime::Token> tokens;
        bool prompt = false;  // cut from a prompt (remember_prompt)
    };
    using Lru = std::list<std::pair<cache::Digest, std::shared_ptr<const Head>>>;

    std::shared_ptr<const Head> find(const cache::Digest& key) const;
    void store(const cache::Digest& key, std::shared_ptr<const Head> head) const;
    // The tokens of the prompt from `head`, or empty when the head cannot be used;
    // `tokenized`: the rest was tokenized (the prompt starts with the head's text).
    std::vector<runtime::Token> from_head(const std::string& prompt, const Head& head,
                                          bool& tokenized) const;
    // from_head() with the turn end of the messages with identity `key`, else their prompt
    // head; each head whose rest was tokenized uses one of `tries`.
    std::vector<runtime::Token> from_key(const std::string& prompt, const cache::Digest& key,
                                         int& tries) const;
    std::vector<runtime::Token> whole(const std::string& prompt) const;  // a miss

    const runtime::Model& model_;
    size_t max_entries_;
    mutable std::mutex mutex_;
    mutable Lru lru_;  // most recently used first
    mutable std::unordered_map<cache::Digest, Lru::iterator, cache::DigestHash> index_;
    mutable Stats stats_;
};

}  // namespace skippy::server
