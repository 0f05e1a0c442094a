// Radix index lookups with 100k entries: 100 shared 512-token system prompts, each with
// 1000 conversations of 32..287 further tokens (exact entries), plus 100k resident entries.
#include <benchmark/benchmark.h>

#include <memory>

#include "bench_data.h"
#include "cache/radix_index.h"

namespace skippy::cache::bench {
namespace {

constexpr size_t kSystemPrompts = 100;
constexpr size_t kPerPrompt = 1000;  // 100 x 1000 = 100k entries per kind

struct Corpus {
    NamespaceId ns = bench_namespace();
    RadixIndex index;
    std::vector<std::vector<Token>> paths;
    std::vector<std::vector<Token>> queries;  // stored path + 64 new tokens

    Corpus() {
        std::mt19937_64 rng(42);
        for (size_t s = 0; s < kSystemPrompts; ++s) {
            const std::vector<Token> system = random_tokens(rng, 512);
            for (size_t c = 0; c < kPerPrompt; ++c) {
                std::vector<Token> path = system;
                const std::vector<Token> tail = random_tokens(rng, 32 + rng() % 256);
                path.insert(path.end(), tail.begin(), tail.end());
                index.insert(ComponentKind::Exact, ns, path, paths.size());
                index.insert(ComponentKind::Resident, ns, path, paths.size());
                std::vector<Token> q = path;
                const std::vector<Token> next = random_tokens(rng, 64);
                q.insert(q.end(), next.begin(), next.end());
                queries.push_back(std::move(q));
                paths.push_back(std::move(path));
            }
        }
    }
};

Corpus& corpus() {
    static Corpus* c = new Corpus();  // built once, shared by all radix benchmarks
    return *c;
}

void BM_RadixLookupExact100k(benchmark::State& state) {
    Corpus& c = corpus();
    size_t i = 0;
    for (auto _ : state) {
        auto m = c.index.lookup_exact(c.ns, c.queries[i]);
        benchmark::DoNotOptimize(m);
        i = (i + 7919) % c.queries.size();
    }
    state.counters["entries"] = static_cast<double>(c.index.size(ComponentKind::Exact));
    state.counters["nodes"] = static_cast<double>(c.index.node_count());
}
BENCHMARK(BM_RadixLookupExact100k)->Unit(benchmark::kMicrosecond);

void BM_RadixPeekExact100k(benchmark::State& state) {
    Corpus& c = corpus();
    size_t i = 0;
    for (auto _ : state) {
        auto m = c.index.peek_exact(c.ns, c.queries[i]);
        benchmark::DoNotOptimize(m);
        i = (i + 7919) % c.queries.size();
    }
}
BENCHMARK(BM_RadixPeekExact100k)->Unit(benchmark::kMicrosecond);

void BM_RadixLookupResident100k(benchmark::State& state) {
    Corpus& c = corpus();
    size_t i = 0;
    for (auto _ : state) {
        auto m = c.index.lookup_resident(c.ns, c.queries[i]);
        benchmark::DoNotOptimize(m);
        i = (i + 7919) % c.queries.size();
    }
}
BENCHMARK(BM_RadixLookupResident100k)->Unit(benchmark::kMicrosecond);

void BM_RadixLookupMiss100k(benchmark::State& state) {
    Corpus& c = corpus();
    std::mt19937_64 rng(7);
    const std::vector<Token> miss = random_tokens(rng, 1024);
    for (auto _ : state) {
        auto m = c.index.lookup_exact(c.ns, miss);
        benchmark::DoNotOptimize(m);
    }
}
BENCHMARK(BM_RadixLookupMiss100k)->Unit(benchmark::kMicrosecond);

// Insert one new conversation and evict the LRU entry (steady state at 100k entries).
// Registered last: it changes the corpus.
void BM_RadixInsertEvict100k(benchmark::State& state) {
    Corpus& c = corpus();
    size_t i = 0;
    for (auto _ : state) {
        std::vector<Token> path = c.paths[i];
        path.back() ^= 0x40000000;  // a sibling of a stored path
        c.index.insert(ComponentKind::Exact, c.ns, path, i);
        auto victim = c.index.evict_lru(ComponentKind::Exact);
        benchmark::DoNotOptimize(victim);
        i = (i + 7919) % c.paths.size();
    }
}
BENCHMARK(BM_RadixInsertEvict100k)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace skippy::cache::bench
