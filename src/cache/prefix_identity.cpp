#include "cache/prefix_identity.h"

#include <algorithm>
#include <array>
#include <bit>
#include <numeric>
#include <stdexcept>

#include "cache/labelled_field_hasher.h"

namespace skippy::cache {
namespace {

constexpr uint8_t kChainTag = 'C';
constexpr uint8_t kFinishTag = 'F';

void update_tokens(Sha256& sha, std::span<const Token> tokens) {
    if constexpr (std::endian::native == std::endian::little) {
        sha.update(tokens.data(), tokens.size_bytes());
    } else {
        std::array<uint8_t, 4 * 256> buf{};
        size_t n = 0;
        for (Token t : tokens) {
            const auto u = static_cast<uint32_t>(t);
            for (size_t b = 0; b < 4; ++b) {
                buf[n++] = static_cast<uint8_t>(u >> (8 * b));
            }
            if (n == buf.size()) {
                sha.update(buf.data(), n);
                n = 0;
            }
        }
        sha.update(buf.data(), n);
    }
}

void update_u64(Sha256& sha, uint64_t v) {
    std::array<uint8_t, 8> le{};
    for (size_t i = 0; i < le.size(); ++i) {
        le[i] = static_cast<uint8_t>(v >> (8 * i));
    }
    sha.update(le);
}

Digest chain_seed(Sha256& sha, const NamespaceId& ns, uint32_t token_start, size_t chunk_tokens) {
    if (chunk_tokens == 0) {
        throw std::invalid_argument("prefix identity: chunk_tokens must be > 0");
    }
    LabelledFieldHasher h(sha);
    h.string("skippy.prefix", "v1");
    h.bytes("namespace", ns.digest().bytes);
    h.u64("chunk_tokens", chunk_tokens);
    h.u64("token_start", token_start);
    return sha.finish();
}

Digest chain_step(Sha256& sha, const Digest& chain, std::span<const Token> chunk) {
    sha.update(&kChainTag, 1);
    sha.update(chain.bytes);
    update_tokens(sha, chunk);
    return sha.finish();
}

Digest finish_identity(Sha256& sha, const Digest& chain, size_t length,
                       std::span<const Token> tail) {
    sha.update(&kFinishTag, 1);
    sha.update(chain.bytes);
    update_u64(sha, length);
    update_tokens(sha, tail);
    return sha.finish();
}

}  // namespace

std::vector<PrefixIdentity> identities_for_lengths(const NamespaceId& ns, uint32_t token_start,
                                                   std::span<const Token> tokens,
                                                   std::span<const size_t> lengths,
                                                   size_t chunk_tokens) {
    for (size_t len : lengths) {
        if (len > tokens.size()) {
            throw std::invalid_argument("identities_for_lengths: length exceeds token count");
        }
    }
    Sha256 sha;
    Digest chain = chain_seed(sha, ns, token_start, chunk_tokens);
    size_t chained = 0;  // full chunks folded into `chain`

    std::vector<size_t> order(lengths.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });

    std::vector<PrefixIdentity> out(lengths.size());
    for (size_t idx : order) {
        const size_t len = lengths[idx];
        const size_t chunks = len / chunk_tokens;
        while (chained < chunks) {
            chain = chain_step(sha, chain, tokens.subspan(chained * chunk_tokens, chunk_tokens));
            ++chained;
        }
        const size_t tail_begin = chunks * chunk_tokens;
        PrefixIdentity& id = out[idx];
        id.digest = finish_identity(sha, chain, len, tokens.subspan(tail_begin, len - tail_begin));
        id.token_start = token_start;
        id.token_count = len;
    }
    return out;
}

PrefixIdentity prefix_identity(const NamespaceId& ns, uint32_t token_start,
                               std::span<const Token> tokens, size_t chunk_tokens) {
    const size_t len = tokens.size();
    return identities_for_lengths(ns, token_start, tokens, std::span<const size_t>(&len, 1),
                                  chunk_tokens)
        .front();
}

PrefixHasher::PrefixHasher(const NamespaceId& ns, uint32_t token_start, size_t chunk_tokens)
    : chunk_tokens_(chunk_tokens), token_start_(token_start) {
    chain_ = chain_seed(sha_, ns, token_start, chunk_tokens);
    tail_.reserve(chunk_tokens_);
}

void PrefixHasher::append(std::span<const Token> tokens) {
    while (!tokens.empty()) {
        if (tail_.empty() && tokens.size() >= chunk_tokens_) {
            chain_ = chain_step(sha_, chain_, tokens.first(chunk_tokens_));
            ++full_chunks_;
            tokens = tokens.subspan(chunk_tokens_);
            continue;
        }
        const size_t take = std::min(chunk_tokens_ - tail_.size(), tokens.size());
        tail_.insert(tail_.end(), tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(take));
        tokens = tokens.subspan(take);
        if (tail_.size() == chunk_tokens_) {
            chain_ = chain_step(sha_, chain_, tail_);
            ++full_chunks_;
            tail_.clear();
        }
    }
}

PrefixIdentity PrefixHasher::identity() {
    PrefixIdentity id;
    id.token_start = token_start_;
    id.token_count = size();
    id.digest = finish_identity(sha_, chain_, id.token_count, tail_);
    return id;
}

}  // namespace skippy::cache
