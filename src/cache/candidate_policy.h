// Which prefix lengths to look up and which to record (DESIGN.md "Candidate policy").
//
//   CandidatePolicy policy;                               // stride 128, min 64, limit 4
//   // Lookup: pass the reusable length, i.e. prompt_len - 1 (the last prompt token must
//   // be decoded to produce logits), not the prompt length.
//   std::vector<size_t> look = lookup_candidates(reusable_prefix_len(prompt.size()), policy);
//   // look = {full, grid..., } longest first, e.g. 1000 -> {1000, 896, 768, ..., 128}
//
//   // Record: the exact length plus a small ladder, ascending (prefill chunk boundaries).
//   std::vector<size_t> rec = record_ladder(1000, /*structural=*/{}, policy);
//   // rec = {256, 512, 896, 1000}
//
// Record ladder rules, in priority order while at most `record_limit` rungs are taken and
// the sum of rung lengths stays within `record_token_budget` (0 = unbounded; a rung that
// does not fit is skipped and shorter ones are still tried):
//   1. the exact length;
//   2. the longest grid length strictly below it (continuing the same conversation);
//   3. caller-supplied structural positions (chat-template message boundaries): the
//      shortest one first (end of the system prompt, shared by new conversations), then
//      the others longest first;
//   4. up to record_limit - 2 geometric rungs at stride * 2^k below rung 2, longest first.
//      They sit at absolute grid positions, so conversations of different lengths record
//      (and can share) the same rungs.
// Every rung is in [max(min_tokens, 1), exact]; the result is sorted and deduplicated.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace skippy::cache {

struct CandidatePolicy {
    size_t stride = 128;             // grid step, > 0
    size_t min_tokens = 64;          // shorter prefixes are not worth caching
    size_t record_limit = 4;         // max rungs in one record ladder
    size_t record_token_budget = 0;  // max sum of rung lengths; 0 = unbounded
};

// The longest prefix of a prompt that can be restored: prompt_len - 1 (0 for empty).
constexpr size_t reusable_prefix_len(size_t prompt_len) {
    return prompt_len == 0 ? 0 : prompt_len - 1;
}

// Lookup lengths, longest first, deduplicated: `reusable_len` itself (if >= min_tokens),
// then every multiple of stride below it down to min_tokens.
// `reusable_len` is prompt_len - 1, see reusable_prefix_len().
std::vector<size_t> lookup_candidates(size_t reusable_len, const CandidatePolicy& policy = {});

// Record lengths for a state of `exact_len` tokens, ascending. `structural_positions` may
// be unsorted, contain duplicates or out-of-range values (those are ignored).
std::vector<size_t> record_ladder(size_t exact_len,
                                  std::span<const size_t> structural_positions = {},
                                  const CandidatePolicy& policy = {});

}  // namespace skippy::cache
