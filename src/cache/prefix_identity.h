// PrefixIdentity: the cryptographic identity of `token_start` + token ids inside a
// namespace, and the one-pass computation of identities for many prefix lengths.
//
//   NamespaceId ns = NamespaceId::from_fields(fields);
//   std::vector<size_t> lens = lookup_lengths(reusable_prefix_len(prompt.size()), policy);
//   std::vector<PrefixIdentity> ids = identities_for_lengths(ns, 0, prompt, lens);
//   PageId page = ids[0].page_id();                      // ids[i] is for lens[i]
//
//   PrefixHasher h(ns, 0);                               // streaming form
//   h.append(first_part); h.append(second_part);
//   PrefixIdentity id = h.identity();                    // == prefix_identity(ns, 0, all)
//
// Construction (SHA-256 throughout, integers little-endian, token ids as int32 LE):
//   chain_0     = SHA256(labelled fields: "skippy.prefix"="v1", namespace digest,
//                        chunk_tokens, token_start)
//   chain_{i+1} = SHA256('C' | chain_i | tokens[i*C, (i+1)*C))        C = chunk_tokens
//   id(L)       = SHA256('F' | chain_{L/C} | u64 L | tokens[(L/C)*C, L))
// so every full chunk is hashed once however many lengths are requested, and each length
// costs one extra hash of fewer than C tokens. The chunk size is part of the identity:
// keep it fixed for a deployment (kDefaultChunkTokens).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cache/digest.h"
#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/sha256.h"
#include "cache/token.h"

namespace skippy::cache {

inline constexpr size_t kDefaultChunkTokens = 64;

struct PrefixIdentity {
    Digest digest{};
    uint32_t token_start = 0;
    size_t token_count = 0;

    PageId page_id() const { return PageId(digest.leading_u64()); }
    std::string hex() const { return digest.hex(); }

    bool operator==(const PrefixIdentity&) const = default;
};

// Identity of `tokens` (all of them) starting at position `token_start`.
PrefixIdentity prefix_identity(const NamespaceId& ns, uint32_t token_start,
                               std::span<const Token> tokens,
                               size_t chunk_tokens = kDefaultChunkTokens);

// Identities of tokens[0, lengths[i]) for every i, in the order of `lengths` (any order,
// duplicates allowed), in one pass over the tokens. Throws std::invalid_argument if a
// length exceeds tokens.size() or chunk_tokens is 0.
std::vector<PrefixIdentity> identities_for_lengths(const NamespaceId& ns, uint32_t token_start,
                                                   std::span<const Token> tokens,
                                                   std::span<const size_t> lengths,
                                                   size_t chunk_tokens = kDefaultChunkTokens);

// Streaming form: append tokens in any slicing, ask for the identity of what was appended.
class PrefixHasher {
  public:
    PrefixHasher(const NamespaceId& ns, uint32_t token_start,
                 size_t chunk_tokens = kDefaultChunkTokens);

    void append(std::span<const Token> tokens);
    size_t size() const { return full_chunks_ * chunk_tokens_ + tail_.size(); }
    // Identity of all tokens appended so far (does not change the state).
    PrefixIdentity identity();

  private:
    Sha256 sha_;
    size_t chunk_tokens_;
    uint32_t token_start_;
    Digest chain_{};
    size_t full_chunks_ = 0;
    std::vector<Token> tail_;  // < chunk_tokens_ tokens not yet chained
};

}  // namespace skippy::cache
