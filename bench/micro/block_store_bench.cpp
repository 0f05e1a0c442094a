// Block store throughput: XXH3-128 hashing, insert (new and deduplicated) and reconstruct
// (zero-copy single block, assembled multi-block into a fresh or a reused buffer; with and
// without checksum verification).
#include <benchmark/benchmark.h>

#include "bench_data.h"
#include "cache/block_store.h"

namespace skippy::cache::bench {
namespace {

constexpr size_t kPayloadBytes = size_t{64} << 20;  // 64 MiB, 64 blocks of 1 MiB

const std::vector<uint8_t>& payload() {
    static const std::vector<uint8_t>* p = new std::vector<uint8_t>(random_bytes(kPayloadBytes, 1));
    return *p;
}

void set_bytes(benchmark::State& state, size_t bytes) {
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

void BM_Xxh3_128_1MiBBlocks(benchmark::State& state) {
    const auto& p = payload();
    for (auto _ : state) {
        for (size_t off = 0; off < p.size(); off += kDefaultBlockBytes) {
            benchmark::DoNotOptimize(xxh3_128({p.data() + off, kDefaultBlockBytes}));
        }
    }
    set_bytes(state, p.size());
}
BENCHMARK(BM_Xxh3_128_1MiBBlocks)->Unit(benchmark::kMillisecond);

void BM_BlockStorePrepare(benchmark::State& state) {
    BlockStore store;
    const auto& p = payload();
    for (auto _ : state) {
        benchmark::DoNotOptimize(store.prepare(p));
    }
    set_bytes(state, p.size());
}
BENCHMARK(BM_BlockStorePrepare)->Unit(benchmark::kMillisecond);

// Insert of bytes the store has not seen (hash + copy of every block), then release.
void BM_BlockStoreInsertNew(benchmark::State& state) {
    BlockStore store;
    const auto& p = payload();
    for (auto _ : state) {
        InsertOutcome in = store.insert(p);
        benchmark::DoNotOptimize(in.payload.blocks.data());
        state.PauseTiming();
        (void)store.release(in.payload);
        state.ResumeTiming();
    }
    set_bytes(state, p.size());
}
BENCHMARK(BM_BlockStoreInsertNew)->Unit(benchmark::kMillisecond);

// Insert of bytes already stored (hash + byte comparison, no copy).
void BM_BlockStoreInsertDuplicate(benchmark::State& state) {
    BlockStore store;
    const auto& p = payload();
    InsertOutcome first = store.insert(p);
    for (auto _ : state) {
        InsertOutcome in = store.insert(p);
        benchmark::DoNotOptimize(in.payload.blocks.data());
        state.PauseTiming();
        (void)store.release(in.payload);
        state.ResumeTiming();
    }
    set_bytes(state, p.size());
    (void)store.release(first.payload);
}
BENCHMARK(BM_BlockStoreInsertDuplicate)->Unit(benchmark::kMillisecond);

void BM_BlockStoreReconstructMultiBlock(benchmark::State& state) {
    BlockStore store;
    const auto& p = payload();
    InsertOutcome in = store.insert(p);
    const bool verify = state.range(0) != 0;
    for (auto _ : state) {
        ReconstructResult r = store.reconstruct(in.payload, verify);
        benchmark::DoNotOptimize(r.bytes.data());
    }
    set_bytes(state, p.size());
}
BENCHMARK(BM_BlockStoreReconstructMultiBlock)
    ->ArgName("verify")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);

// Into a caller-owned buffer reused across restores (no fresh pages to fault in).
void BM_BlockStoreReconstructIntoReusedBuffer(benchmark::State& state) {
    BlockStore store;
    const auto& p = payload();
    InsertOutcome in = store.insert(p);
    const bool verify = state.range(0) != 0;
    std::vector<uint8_t> out;
    for (auto _ : state) {
        const ReconstructError e = store.snapshot(in.payload)->reconstruct_into(out, verify);
        benchmark::DoNotOptimize(e);
        benchmark::DoNotOptimize(out.data());
    }
    set_bytes(state, p.size());
}
BENCHMARK(BM_BlockStoreReconstructIntoReusedBuffer)
    ->ArgName("verify")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);

// A 64 MiB payload stored as one block: reconstruct returns a view, no copy.
void BM_BlockStoreReconstructSingleBlock(benchmark::State& state) {
    BlockStoreOptions o;
    o.block_bytes = kPayloadBytes;
    BlockStore store(o);
    const auto& p = payload();
    InsertOutcome in = store.insert(p);
    const bool verify = state.range(0) != 0;
    for (auto _ : state) {
        ReconstructResult r = store.reconstruct(in.payload, verify);
        benchmark::DoNotOptimize(r.bytes.data());
    }
    set_bytes(state, p.size());
}
BENCHMARK(BM_BlockStoreReconstructSingleBlock)
    ->ArgName("verify")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace skippy::cache::bench
