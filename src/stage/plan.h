// Plan: what the scheduler executes for one request on its lane, as decided by the stage.
//
// Exactness rule (measured by tests/runtime/chunking_test.cpp on this llama.cpp build, CPU
// backend, one KV stream per lane): a prefill's logits and state are bit-identical for
// every split of it into llama_decode chunks of at least 2 tokens with flash attention off.
// With it on, ggml-cpu computes a batch of >= 64 query rows in 64-row tiles whose rows do
// not depend on each other, and a smaller batch with a per-row kernel that rounds
// differently, so a prompt has two regimes: its *body* [0, B), prefilled in chunks of
// >= 64 tokens (any split), and its *tail* [B, n) of < 64 tokens, prefilled in chunks of
// >= 2 (any split) or as one chunk. B (body_end below) depends only on the prompt: the
// last message boundary A when the last message is short (n - A <= 16, or < 64 for models
// with recurrent state: a warm request restores A and prefills the message row by row); else, for a
// prompt with message boundaries (chat), n (all body: the next turn restores at or after n, and a
// single-token chunk would cost a whole decode step per request); else (a completion) n - 1 (the
// last token alone, like a decode step, so the same prompt again prefills one token). Prompts under
// 64 tokens (65 for a completion) are all tail. The row-by-row kernel costs ~3x the tiled one per
// row (bench model, 2 cores: 16 rows 15.6 ms vs 64 tiled rows 26 ms at 1.5k cells, 29 vs 39 ms at
// 3k), so the tail is kept short. With flash attention off B = n and there is no tail. So:
//   - a restore of r tokens computed in the body regime is exact for a prompt with body
//     end B when r == B < n, or B - r >= the body minimum (2, or 64 with flash attention);
//     a lane whose tail was computed for the same B also serves its tail (up to n - 2);
//   - state is recorded only in the body (generated tokens are prefilled again at the end
//     of the turn, in body chunks, before their state is cached); a model with recurrent
//     state also keeps one at least a body chunk before B, for a continuation that adds
//     less than a body chunk (and to restart a turn end from);
//   - a single-token chunk (a decode step) rounds differently from all of these.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace skippy::stage {

// One decision vocabulary for responses, logs and metrics.
enum class CacheDecision : uint8_t {
    Off,       // cache disabled, or the request opted out
    Miss,      // nothing usable was cached
    ExactHit,  // a cached prefix was restored (in the lane already, or imported)
    Error,     // a restore failed: the lane was cleared and the prompt prefilled in full
};
std::string_view to_string(CacheDecision decision);

// Where a hit came from.
enum class CacheTier : uint8_t { None, Lane, Ram, Disk, Redis };
std::string_view to_string(CacheTier tier);

struct Plan {
    int32_t n_restored = 0;  // prompt tokens in the lane now
    CacheDecision decision = CacheDecision::Miss;
    CacheTier tier = CacheTier::None;
    // Why nothing was restored (the lookup event's reason: never_seen, evicted, quarantined,
    // below_min_tokens, diverged, namespace, cache_off, restore_failed); empty for a hit.
    std::string miss_reason;
    // evicted / quarantined: the tier that lost the prefix (None otherwise).
    CacheTier miss_tier = CacheTier::None;
    // Tokens of the prompt before its first difference with the nearest prefix the tenant
    // has cached (-1: no lookup).
    int32_t diverged_at = -1;
    // Ascending ends of the prefill chunks (from n_restored), the last one = the prompt
    // size, following the exactness rule above.
    std::vector<int32_t> chunk_ends;
    // Chunk ends where the stage takes a checkpoint (reported as LaneReport::checkpoint).
    std::vector<int32_t> checkpoints;
    // The stage wants the end of this turn prefilled after the reply (chat requests only;
    // StageBackend::plan_turn_end).
    bool turn_end = false;
};

// The exactness rule of one context (see the top of this file): the one place that derives
// chunk sizes from the attention kernel and the model family.
struct ExactRule {
    // The shortest exact prefill chunk of the body (2, or 64 with flash attention).
    int32_t body_min = 2;
    // The longest last message prefilled as the tail (restored at its start).
    int32_t max_tail = 16;

    // A model with recurrent state restores only where a checkpoint is: every last message
    // under 64 tokens is the tail (its attention layers are few, so rows are cheap), so a
    // shared system prompt followed by a short question restores at the system prompt end.
    static constexpr ExactRule for_model(bool flash_attn, bool recurrent_state) {
        ExactRule rule;
        rule.body_min = flash_attn ? 64 : 2;
        if (recurrent_state && rule.has_tail()) {
            rule.max_tail = rule.body_min - 1;
        }
        return rule;
    }
    constexpr bool has_tail() const { return body_min > 2; }
    // B for a prompt of n tokens with these message boundaries (any order).
    int32_t body_end(int32_t n, std::span<const int32_t> boundaries) const;
    // Whether state of the first r tokens, computed in the body regime, may be restored for
    // a prompt of n tokens with body end b.
    bool can_restore(int32_t r, int32_t b, int32_t n) const {
        return r >= 0 && r <= b && (r == b ? b < n : b - r >= body_min);
    }
    // The longest such r <= available (0 if none).
    int32_t best_restore(int32_t available, int32_t b, int32_t n) const {
        if (available >= b && b < n) {
            return b;
        }
        return std::max(0, std::min(available, b - body_min));
    }
    // The longest restore a prompt of n tokens with body end b can take from the body.
    int32_t restore_limit(int32_t b, int32_t n) const { return best_restore(n, b, n); }
    // Chunk ends for prefilling [begin, n) of a prompt of n tokens with these message
    // boundaries, at most `max_chunk` tokens each (plan_chunks with this rule's minimum and
    // body end, no pauses).
    std::vector<int32_t> chunks(int32_t begin, int32_t n, std::span<const int32_t> boundaries,
                                int32_t max_chunk) const;
};

// How many leading tokens a and b share, at most `limit`.
inline int32_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b,
                             int32_t limit) {
    const auto n = static_cast<int32_t>(std::min({a.size(), b.size(), static_cast<size_t>(limit)}));
    int32_t i = 0;
    while (i < n && a[static_cast<size_t>(i)] == b[static_cast<size_t>(i)]) {
        ++i;
    }
    return i;
}

// Chunk ends for prefilling [begin, end): at most `max_chunk` tokens each; in the body
// [begin, body_end) at least `min_chunk` (unless that part is shorter), in the tail
// [body_end, end) at least 2 (unless it is one token; one chunk when it is min_chunk
// tokens or more); ending at body_end and at every
// pause that keeps both neighbours at their minimum (others are dropped).
std::vector<int32_t> plan_chunks(int32_t begin, int32_t end, std::vector<int32_t> pauses,
                                 int32_t max_chunk, int32_t min_chunk = 2,
                                 int32_t body_end = INT32_MAX);

}  // namespace skippy::stage
