// Shared helpers for the cache tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cache/namespace_id.h"
#include "cache/token.h"

namespace skippy::cache::test {

inline IdentityFields base_fields() {
    IdentityFields f;
    f.weights_digest = "sha256:5f1c0c2b9a8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a392817061234";
    f.layer_begin = 0;
    f.layer_end = 32;
    f.runtime_version = "llama.cpp-80fb11ac/state-v1";
    f.k_type = "f16";
    f.v_type = "f16";
    f.flash_attn = true;
    f.unified_kv = true;
    f.n_ctx = 32768;
    f.devices = "CPU";
    f.platform = "x86_64-le";
    f.namespace_key = std::nullopt;
    return f;
}

inline NamespaceId test_namespace(const std::string& key = "") {
    IdentityFields f = base_fields();
    if (!key.empty()) {
        f.namespace_key = key;
    }
    return NamespaceId::from_fields(f);
}

inline std::vector<Token> iota_tokens(size_t n, Token first = 0) {
    std::vector<Token> out(n);
    for (size_t i = 0; i < n; ++i) {
        out[i] = first + static_cast<Token>(i);
    }
    return out;
}

inline std::vector<Token> random_tokens(std::mt19937_64& rng, size_t n, Token max_token) {
    std::uniform_int_distribution<Token> dist(0, max_token);
    std::vector<Token> out(n);
    for (auto& t : out) {
        t = dist(rng);
    }
    return out;
}

inline std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
    std::vector<uint8_t> out(n);
    for (auto& b : out) {
        b = static_cast<uint8_t>(rng());
    }
    return out;
}

// Integer from the environment (nightly runs raise fuzz depth), or `fallback`.
inline uint64_t env_u64(const char* name, uint64_t fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') {
        return fallback;
    }
    return std::strtoull(v, nullptr, 10);
}

inline uint64_t fuzz_seeds() { return env_u64("SKIPPY_FUZZ_SEEDS", 4); }
inline uint64_t fuzz_steps() { return env_u64("SKIPPY_FUZZ_STEPS", 10000); }

}  // namespace skippy::cache::test
