// Plan: what the scheduler executes for one request on its lane, as decided by the stage.
//
// Exactness rule (measured by tests/runtime/chunking_test.cpp on this llama.cpp build, CPU
// backend, one KV stream per lane): the logits and state after a prefill are bit-identical
// for every split of it into llama_decode chunks of at least `m` tokens each, where m = 2
// with flash attention off and m = 64 with it on (ggml-cpu's flash attention computes a
// batch of >= 64 query rows in 64-row tiles whose rows do not depend on each other, and
// smaller batches with another kernel); a shorter chunk (or a decode step) rounds
// differently. So:
//   - a prefill never contains a chunk shorter than m unless the whole prefill is;
//   - a restored prefix leaves at least m prompt tokens to prefill;
//   - state is cached only for tokens that were prefilled in chunks of >= m (generated
//     tokens are prefilled again at the end of the turn before their state is cached;
//     a short cold prompt is not cached at all).
#pragma once

#include <cstdint>
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
enum class CacheTier : uint8_t { None, Lane, Ram, Disk };
std::string_view to_string(CacheTier tier);

struct Plan {
    int32_t n_restored = 0;  // prompt tokens in the lane now
    CacheDecision decision = CacheDecision::Miss;
    CacheTier tier = CacheTier::None;
    // Ascending ends of the prefill chunks, the last one = the prompt size. Every chunk
    // (from n_restored) has at least 2 tokens, or is the whole 1-token prompt.
    std::vector<int32_t> chunk_ends;
    // Chunk ends where the stage takes a checkpoint (StageBackend::checkpoint).
    std::vector<int32_t> checkpoints;
};

// The shortest exact prefill chunk (m above).
constexpr int32_t min_chunk_tokens(bool flash_attn) { return flash_attn ? 64 : 2; }

// Chunk ends for prefilling [begin, end): at most `max_chunk` tokens each, at least
// `min_chunk` (unless [begin, end) is shorter), ending at every pause in (begin, end) that
// keeps both neighbours at >= min_chunk tokens (others are dropped).
std::vector<int32_t> plan_chunks(int32_t begin, int32_t end, std::vector<int32_t> pauses,
                                 int32_t max_chunk, int32_t min_chunk = 2);

// The longest prefix of a `prompt_len`-token prompt a restore may cover.
constexpr int32_t max_restorable(int32_t prompt_len, int32_t min_chunk = 2) {
    return prompt_len > min_chunk ? prompt_len - min_chunk : 0;
}

}  // namespace skippy::stage
