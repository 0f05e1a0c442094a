#include "server/prompt/message_boundaries.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "cache/sha256.h"

namespace skippy::server {

namespace {

// Keyed polynomial hashing of byte strings modulo the Mersenne prime 2^61 - 1, with two
// random bases drawn at start-up: two different texts of up to n bytes collide with
// probability below (n / 2^61)^2, whatever their content (the bases are secret).
constexpr uint64_t kMod = (uint64_t{1} << 61) - 1;

__extension__ typedef unsigned __int128 u128;

uint64_t mul_mod(uint64_t a, uint64_t b) {
    const u128 m = static_cast<u128>(a) * b;
    uint64_t r = (static_cast<uint64_t>(m) & kMod) + static_cast<uint64_t>(m >> 61);
    r = (r & kMod) + (r >> 61);
    return r >= kMod ? r - kMod : r;
}

uint64_t hash_step(uint64_t h, uint64_t base, uint64_t value) {
    const uint64_t r = mul_mod(h, base) + value;
    return r >= kMod ? r - kMod : r;
}

// Texts are hashed 7 bytes at a time (a value below 2^56 < 2^61 - 1, plus one), then byte by
// byte (value + 1) for the last text.size() % 7: the polynomial of a text is fixed by its
// bytes and its length, and texts are compared only at equal lengths.
constexpr size_t kWordBytes = 7;

uint64_t word_at(const char* p) {
    uint64_t w = 0;
    std::memcpy(&w, p, kWordBytes);  // little-endian hosts; any fixed byte order works
    return w + 1;
}

uint64_t random_base(std::mt19937_64& rng) {
    std::uniform_int_distribution<uint64_t> dist(uint64_t{1} << 32, kMod - 1);
    return dist(rng);
}

void hash_length(cache::Sha256& h, size_t n) {
    const auto v = static_cast<uint64_t>(n);
    uint8_t bytes[8];
    for (int i = 0; i < 8; ++i) {
        bytes[i] = static_cast<uint8_t>(v >> (8 * i));
    }
    h.update(bytes, sizeof bytes);
}

// Token counts of a prompt's text offsets, from the token piece table. The tokens' pieces,
// concatenated, are the text, except for what the tokenizer adds: a special token at the
// front that the text does not render (an added BOS), and a space before a text fragment
// that follows a special token or starts the prompt (SentencePiece's space prefix).
class TokenTextMap {
  public:
    TokenTextMap(const MessageBoundaryFinder& finder, const std::vector<runtime::Token>& tokens,
                 const std::string& text) {
        // Twice each token's end offset, plus one for an added space that covers no text
        // (it belongs to the text after it).
        ends2_.reserve(tokens.size() + 1);
        ends2_.push_back(0);
        size_t at = 0;
        bool after_special = true;
        for (size_t i = 0; i < tokens.size(); ++i) {
            const std::string_view piece = finder.piece(tokens[i]);
            const bool special = finder.is_special(tokens[i]);
            size_t width = 0;
            bool added = false;
            if (text.compare(at, piece.size(), piece) == 0) {
                width = piece.size();
            } else if (i == 0 && special) {
                width = 0;
            } else if (after_special && piece.starts_with(' ') &&
                       text.compare(at, piece.size() - 1, piece.substr(1)) == 0) {
                width = piece.size() - 1;
                added = true;
            } else {
                return;
            }
            at += width;
            ends2_.push_back(2 * at + (added && width == 0 ? 1 : 0));
            after_special = special;
        }
        valid_ = at == text.size();
    }
    bool valid() const { return valid_; }
    // Number of tokens that end at or before byte `offset` of the text.
    size_t tokens_before(size_t offset) const {
        const auto it = std::upper_bound(ends2_.begin(), ends2_.end(), 2 * offset);
        return static_cast<size_t>(it - ends2_.begin()) - 1;
    }

  private:
    std::vector<size_t> ends2_;
    bool valid_ = false;
};

size_t common_prefix(const std::vector<runtime::Token>& a, const std::vector<runtime::Token>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) {
        ++i;
    }
    return i;
}

}  // namespace

namespace {
std::mutex& render_mutex() {
    static std::mutex mutex;
    return mutex;
}
}  // namespace

std::string render_chat(const runtime::ChatTemplate& chat_template,
                        const std::vector<runtime::ChatMessage>& messages,
                        bool add_generation_prompt, const runtime::ChatContext& context) {
    std::lock_guard<std::mutex> lock(render_mutex());
    return chat_template.render(messages, add_generation_prompt, context);
}

runtime::ChatPrompt apply_chat(const runtime::ChatTemplate& chat_template,
                               const std::vector<runtime::ChatMessage>& messages,
                               const runtime::ChatContext& context,
                               const runtime::ChatConstraints& constraints) {
    std::lock_guard<std::mutex> lock(render_mutex());
    return chat_template.apply(messages, context, constraints);
}

static void hash_text(cache::Sha256& h, const std::string& text) {
    hash_length(h, text.size());
    h.update(text.data(), text.size());
}

cache::Digest extend_message_key(const cache::Digest& key, const runtime::ChatMessage& message) {
    cache::Sha256 h;
    h.update(key.bytes.data(), key.bytes.size());
    hash_text(h, message.role);
    hash_text(h, message.content);
    // Tool calls, tool results and reasoning render too.
    hash_length(h, message.tool_calls.size());
    for (const auto& call : message.tool_calls) {
        hash_text(h, call.id);
        hash_text(h, call.name);
        hash_text(h, call.arguments);
    }
    hash_text(h, message.tool_call_id);
    hash_text(h, message.name);
    hash_text(h, message.reasoning_content);
    return h.finish();
}

std::string chat_context_label(const runtime::ChatContext& context) {
    if (context.empty()) {
        return "";
    }
    std::string label = "tools:" + std::to_string(context.tools.size()) + ";";
    for (const auto& tool : context.tools) {
        for (const std::string* field : {&tool.name, &tool.description, &tool.parameters}) {
            label += std::to_string(field->size()) + ":" + *field;
        }
    }
    label += "kwargs:" + std::to_string(context.template_kwargs.size()) + ";";
    for (const auto& [name, value] : context.template_kwargs) {
        label +=
            std::to_string(name.size()) + ":" + name + std::to_string(value.size()) + ":" + value;
    }
    label += context.enable_thinking ? "think:1" : "think:0";
    return label;
}

MessageKeys message_keys(const std::vector<runtime::ChatMessage>& messages,
                         const std::string& context_label) {
    MessageKeys keys;
    keys.reserve(messages.size() + 1);
    cache::Sha256 h;
    static constexpr char kLabel[] = "skippy.chat-messages.v1";
    h.update(kLabel, sizeof kLabel - 1);
    if (!context_label.empty()) {
        hash_text(h, context_label);
    }
    keys.push_back(h.finish());
    for (const auto& message : messages) {
        keys.push_back(extend_message_key(keys.back(), message));
    }
    return keys;
}

size_t boundary_render_cost(size_t k, const runtime::ChatMessage& message) {
    constexpr size_t kRenderFixedCost = 16;
    return (k + kRenderFixedCost) * (message.role == "assistant" ? 2 : 1);
}

MessageBoundaryFinder::MessageBoundaryFinder(const runtime::Model& model,
                                             const runtime::ChatTemplate& chat_template,
                                             size_t render_budget, size_t memo_entries)
    : model_(model),
      chat_template_(chat_template),
      render_budget_(render_budget),
      memo_entries_(memo_entries) {
    std::random_device seed;
    std::mt19937_64 rng((static_cast<uint64_t>(seed()) << 32) ^ seed());
    base1_ = random_base(rng);
    base2_ = random_base(rng);
    const runtime::Token n_vocab = model_.n_vocab();
    piece_begin_.reserve(static_cast<size_t>(n_vocab) + 1);
    for (runtime::Token t = 0; t < n_vocab; ++t) {
        piece_begin_.push_back(static_cast<uint32_t>(pieces_.size()));
        const std::string piece = model_.token_to_piece(t, true);
        max_piece_bytes_ = std::max(max_piece_bytes_, piece.size());
        pieces_ += piece;
        special_.push_back(model_.is_special_token(t));
    }
    piece_begin_.push_back(static_cast<uint32_t>(pieces_.size()));
}

bool MessageBoundaryFinder::is_special(runtime::Token t) const {
    return t >= 0 && static_cast<size_t>(t) < special_.size() && special_[static_cast<size_t>(t)];
}

std::string_view MessageBoundaryFinder::piece(runtime::Token t) const {
    if (t < 0 || static_cast<size_t>(t) + 1 >= piece_begin_.size()) {
        return {};
    }
    const auto i = static_cast<size_t>(t);
    return std::string_view(pieces_).substr(piece_begin_[i], piece_begin_[i + 1] - piece_begin_[i]);
}

// Prefix hashes of one text at increasing lengths (one pass over the text in all).
class MessageBoundaryFinder::PrefixHasher {
  public:
    PrefixHasher(const MessageBoundaryFinder& finder, std::string_view text)
        : b1_(finder.base1_), b2_(finder.base2_), text_(text) {}
    // The id of text[0, n); n must not decrease from one call to the next.
    TextId at(size_t n) {
        for (; words_ + 1 <= n / kWordBytes; ++words_) {
            const uint64_t w = word_at(text_.data() + words_ * kWordBytes);
            h1_ = hash_step(h1_, b1_, w);
            h2_ = hash_step(h2_, b2_, w);
        }
        TextId id{n, h1_, h2_};
        for (size_t i = words_ * kWordBytes; i < n; ++i) {
            const uint64_t c = static_cast<unsigned char>(text_[i]) + uint64_t{1};
            id.h1 = hash_step(id.h1, b1_, c);
            id.h2 = hash_step(id.h2, b2_, c);
        }
        return id;
    }

  private:
    uint64_t b1_, b2_;
    std::string_view text_;
    size_t words_ = 0;  // whole words hashed into h1_, h2_
    uint64_t h1_ = 0, h2_ = 0;
};

MessageBoundaryFinder::TextId MessageBoundaryFinder::text_id(const std::string& text) const {
    return PrefixHasher(*this, text).at(text.size());
}

bool MessageBoundaryFinder::lookup(const MemoKey& key, TextId& out) const {
    const auto it = memo_.find(key);
    if (it == memo_.end()) {
        return false;
    }
    lru_.splice(lru_.begin(), lru_, it->second);
    out = it->second->second;
    return true;
}

void MessageBoundaryFinder::insert(const MemoKey& key, const TextId& id) const {
    if (memo_entries_ == 0) {
        return;
    }
    if (const auto it = memo_.find(key); it != memo_.end()) {
        it->second->second = id;
        lru_.splice(lru_.begin(), lru_, it->second);
        return;
    }
    lru_.emplace_front(key, id);
    memo_.emplace(key, lru_.begin());
    while (memo_.size() > memo_entries_) {
        memo_.erase(lru_.back().first);
        lru_.pop_back();
    }
}

void MessageBoundaryFinder::remember(const cache::Digest& key, bool add_generation_prompt,
                                     const std::string& text) const {
    const TextId id = text_id(text);
    std::lock_guard<std::mutex> lock(memo_mutex_);
    insert(MemoKey{key, add_generation_prompt}, id);
}

bool MessageBoundaryFinder::remembered_prefix(const MemoKey& key, const std::string& prompt,
                                              TextId& id) const {
    {
        std::lock_guard<std::mutex> lock(memo_mutex_);
        if (!lookup(key, id)) {
            return false;
        }
    }
    if (id.bytes > prompt.size()) {
        return false;
    }
    const TextId have = PrefixHasher(*this, prompt).at(id.bytes);
    return have.h1 == id.h1 && have.h2 == id.h2;
}

bool MessageBoundaryFinder::remembers(const cache::Digest& key, bool add_generation_prompt) const {
    std::lock_guard<std::mutex> lock(memo_mutex_);
    return memo_.contains(MemoKey{key, add_generation_prompt});
}

void MessageBoundaryFinder::prepare(const cache::Digest& key,
                                    const std::vector<runtime::ChatMessage>& messages,
                                    bool add_generation_prompt,
                                    const runtime::ChatContext& context) const {
    const MemoKey memo_key{key, add_generation_prompt};
    {
        std::lock_guard<std::mutex> lock(memo_mutex_);
        if (memo_.contains(memo_key)) {
            return;
        }
    }
    std::string text;
    try {
        text = render_chat(chat_template_, messages, add_generation_prompt, context);
    } catch (const std::exception&) {
        return;
    }
    const TextId id = text_id(text);
    std::lock_guard<std::mutex> lock(memo_mutex_);
    insert(memo_key, id);
}

MessageBoundaryFinder::Stats MessageBoundaryFinder::stats() const {
    std::lock_guard<std::mutex> lock(memo_mutex_);
    return stats_;
}

std::vector<int32_t> MessageBoundaryFinder::find(const std::vector<runtime::ChatMessage>& messages,
                                                 const MessageKeys& keys, const std::string& prompt,
                                                 const std::vector<runtime::Token>& tokens,
                                                 const runtime::ChatContext& context) const {
    // The heads the definition renders, in its order, within the render budget.
    struct Head {
        size_t k = 0;
        bool generation_prompt = false;
        bool in_memo = false;  // the memo has a text for it
        bool known = false;    // ... and the prompt starts with that text
        TextId id;
    };
    std::vector<Head> heads;
    size_t cost = 0;
    for (size_t k = 1; k < messages.size(); ++k) {
        cost += boundary_render_cost(k, messages[k]);
        if (cost > render_budget_) {
            break;  // depends only on messages[0..k]: the same cut-off in the next turn
        }
        Head head;
        head.k = k;
        heads.push_back(head);
        if (messages[k].role == "assistant") {
            head.generation_prompt = true;
            heads.push_back(head);
        }
    }
    const TokenTextMap text_map(*this, tokens, prompt);
    if (text_map.valid()) {
        std::lock_guard<std::mutex> lock(memo_mutex_);
        for (auto& head : heads) {
            head.in_memo = lookup(MemoKey{keys[head.k], head.generation_prompt}, head.id);
            head.known = head.in_memo && head.id.bytes <= prompt.size();
        }
    }
    // A remembered text counts only if the prompt starts with it: one pass of the prompt's
    // prefix hashes, checked at each remembered length, then the whole prompt's.
    std::vector<Head*> by_length;
    for (auto& head : heads) {
        if (head.known) {
            by_length.push_back(&head);
        }
    }
    std::sort(by_length.begin(), by_length.end(),
              [](const Head* a, const Head* b) { return a->id.bytes < b->id.bytes; });
    PrefixHasher hasher(*this, prompt);
    for (Head* head : by_length) {
        const TextId id = hasher.at(head->id.bytes);
        head->known = id.h1 == head->id.h1 && id.h2 == head->id.h2;
    }

    std::vector<int32_t> boundaries;
    std::vector<std::pair<MemoKey, TextId>> rendered;
    uint64_t hits = 0;
    for (const auto& head : heads) {
        size_t boundary = 0;
        if (head.known) {
            boundary = text_map.tokens_before(head.id.bytes);
            ++hits;
        } else {
            const MemoKey key{keys[head.k], head.generation_prompt};
            const std::vector<runtime::ChatMessage> part(
                messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(head.k));
            std::string text;
            {
                // The render another thread was making (the previous turn's next-turn work)
                // is taken once it is done, not made again.
                std::lock_guard<std::mutex> render_lock(render_mutex());
                TextId id;
                if (!head.in_memo && text_map.valid() && remembered_prefix(key, prompt, id)) {
                    if (const size_t b = text_map.tokens_before(id.bytes); b > 0) {
                        boundaries.push_back(static_cast<int32_t>(b));
                    }
                    ++hits;
                    continue;
                }
                text = chat_template_.render(part, head.generation_prompt, context);
            }
            if (text_map.valid() && prompt.compare(0, text.size(), text) == 0) {
                boundary = text_map.tokens_before(text.size());
            } else {
                boundary = common_prefix(model_.tokenize(text, true, true), tokens);
            }
            rendered.emplace_back(key, text_id(text));
        }
        if (boundary > 0) {
            boundaries.push_back(static_cast<int32_t>(boundary));
        }
    }
    // The next turn renders this prompt as the head before the reply.
    rendered.emplace_back(MemoKey{keys.back(), true}, hasher.at(prompt.size()));
    {
        std::lock_guard<std::mutex> lock(memo_mutex_);
        for (const auto& [key, id] : rendered) {
            insert(key, id);
        }
        stats_.renders += rendered.size() - 1;
        stats_.memo_hits += hits;
    }
    std::sort(boundaries.begin(), boundaries.end());
    boundaries.erase(std::unique(boundaries.begin(), boundaries.end()), boundaries.end());
    return boundaries;
}

}  // namespace skippy::server
