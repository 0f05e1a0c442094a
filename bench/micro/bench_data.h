// Deterministic inputs shared by the cache micro-benchmarks.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "cache/namespace_id.h"
#include "cache/token.h"

namespace skippy::cache::bench {

inline NamespaceId bench_namespace() {
    IdentityFields f;
    f.weights_digest = "sha256:bench";
    f.layer_end = 32;
    f.runtime_version = "bench";
    f.k_type = "f16";
    f.v_type = "f16";
    f.n_ctx = 32768;
    f.devices = "CPU";
    f.platform = current_platform();
    return NamespaceId::from_fields(f);
}

inline std::vector<Token> random_tokens(std::mt19937_64& rng, size_t n) {
    std::uniform_int_distribution<Token> dist(0, 151935);
    std::vector<Token> out(n);
    for (auto& t : out) {
        t = dist(rng);
    }
    return out;
}

inline std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> out(n);
    for (size_t i = 0; i + 8 <= n; i += 8) {
        const uint64_t v = rng();
        for (size_t b = 0; b < 8; ++b) {
            out[i + b] = static_cast<uint8_t>(v >> (8 * b));
        }
    }
    return out;
}

}  // namespace skippy::cache::bench
