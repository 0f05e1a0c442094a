// Prefix identity hashing: all lookup candidate lengths of a 32k-token prompt in one pass.
#include <benchmark/benchmark.h>

#include "bench_data.h"
#include "cache/candidate_policy.h"
#include "cache/prefix_identity.h"
#include "cache/sha256.h"

namespace skippy::cache::bench {
namespace {

constexpr size_t kPromptTokens = 32768;

void BM_IdentitiesForLookupCandidates32k(benchmark::State& state) {
    std::mt19937_64 rng(1);
    const NamespaceId ns = bench_namespace();
    const std::vector<Token> prompt = random_tokens(rng, kPromptTokens);
    const std::vector<size_t> lengths = lookup_candidates(reusable_prefix_len(prompt.size()));
    for (auto _ : state) {
        auto ids = identities_for_lengths(ns, 0, prompt, lengths);
        benchmark::DoNotOptimize(ids.data());
    }
    state.counters["lengths"] = static_cast<double>(lengths.size());
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                            static_cast<int64_t>(kPromptTokens * sizeof(Token)));
}
BENCHMARK(BM_IdentitiesForLookupCandidates32k)->Unit(benchmark::kMicrosecond);

void BM_IdentityFullLength32k(benchmark::State& state) {
    std::mt19937_64 rng(2);
    const NamespaceId ns = bench_namespace();
    const std::vector<Token> prompt = random_tokens(rng, kPromptTokens);
    for (auto _ : state) {
        benchmark::DoNotOptimize(prefix_identity(ns, 0, prompt));
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                            static_cast<int64_t>(kPromptTokens * sizeof(Token)));
}
BENCHMARK(BM_IdentityFullLength32k)->Unit(benchmark::kMicrosecond);

// Chunk size trade-off: smaller chunks cost more SHA-256 calls per token.
void BM_IdentitiesChunkSize32k(benchmark::State& state) {
    std::mt19937_64 rng(3);
    const NamespaceId ns = bench_namespace();
    const std::vector<Token> prompt = random_tokens(rng, kPromptTokens);
    const std::vector<size_t> lengths = lookup_candidates(reusable_prefix_len(prompt.size()));
    const auto chunk = static_cast<size_t>(state.range(0));
    for (auto _ : state) {
        auto ids = identities_for_lengths(ns, 0, prompt, lengths, chunk);
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                            static_cast<int64_t>(kPromptTokens * sizeof(Token)));
}
BENCHMARK(BM_IdentitiesChunkSize32k)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_Sha256Raw(benchmark::State& state) {
    const std::vector<uint8_t> bytes = random_bytes(kPromptTokens * sizeof(Token), 4);
    Sha256 sha;
    for (auto _ : state) {
        sha.update(bytes);
        benchmark::DoNotOptimize(sha.finish());
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                            static_cast<int64_t>(bytes.size()));
}
BENCHMARK(BM_Sha256Raw)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace skippy::cache::bench
