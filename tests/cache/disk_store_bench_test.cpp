// DiskStore measurements, skipped unless SKIPPY_DISK_BENCH=1 (they write hundreds of MB):
//   SKIPPY_DISK_BENCH=1 ./build-cache/tests/cache/skippy_cache_tests
//   --gtest_filter='DiskStoreBench*'
// SKIPPY_DISK_BENCH_DIR picks the filesystem (default $TMPDIR or /tmp). As root, cold
// numbers drop the page cache first (/proc/sys/vm/drop_caches).
//
// Throughput: 32 entries of 8 MiB (cut at 256 KiB pages: 32 block files each), written
// with and without fsync, then read back; the writer's time per I/O step (from the
// debug_io_hook: the time from one step's hook to the next is charged to that step).
// Reconciliation: a synthetic 10 GiB cache (manifests plus sparse block files
// of the real sizes, so the sweep stats real files) opened warm and cold.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>

#include "cache/disk_format.h"
#include "cache/disk_store.h"
#include "disk_test_util.h"

namespace skippy::cache {
namespace {

using namespace test;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Time between consecutive debug_io_hook calls, charged to the step whose hook came first
// (writer thread only; read after flush()).
struct StepTimes {
    std::array<double, 10> seconds{};
    std::array<uint64_t, 10> count{};
    std::optional<DiskIoStep> last;
    Clock::time_point at;

    int operator()(DiskIoStep s) {
        const auto now = Clock::now();
        if (last) {
            seconds[static_cast<size_t>(*last)] += std::chrono::duration<double>(now - at).count();
        }
        ++count[static_cast<size_t>(s)];
        last = s;
        at = now;
        return 0;
    }
    void print(const char* label) const {
        std::printf("[ bench    ] %s, writer time per step (count, ms in all):", label);
        for (size_t i = 0; i < seconds.size(); ++i) {
            if (count[i] > 0) {
                std::printf(" %s %llu/%.0f", to_string(static_cast<DiskIoStep>(i)),
                            static_cast<unsigned long long>(count[i]), seconds[i] * 1e3);
            }
        }
        std::printf("\n");
    }
};

bool drop_caches() {
    ::sync();
    const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    const bool ok = ::write(fd, "3\n", 2) == 2;
    ::close(fd);
    return ok;
}

class DiskStoreBench : public ::testing::Test {
  protected:
    void SetUp() override {
        if (env_u64("SKIPPY_DISK_BENCH", 0) == 0) {
            GTEST_SKIP() << "set SKIPPY_DISK_BENCH=1 to run";
        }
        if (const char* d = std::getenv("SKIPPY_DISK_BENCH_DIR"); d != nullptr && *d != '\0') {
            ::setenv("TMPDIR", d, 1);
        }
    }
};

TEST_F(DiskStoreBench, WriteAndReadThroughput) {
    const NamespaceId ns = test_namespace();
    constexpr size_t kEntries = 32;
    constexpr size_t kTokens = 2048;       // 32 pages of 64 tokens
    constexpr size_t kPageBytes = 262144;  // 8 MiB per entry
    std::vector<PrefixPayload> ps;
    std::vector<PrefixPayload> longer;  // share all but their last 4 pages with ps[i]
    std::vector<PayloadBytes> shared;   // what the RAM tier would hand over: no copy
    for (size_t i = 0; i < kEntries; ++i) {
        ps.push_back(prefix_payload(ns, 9000 + i, kTokens, kPageBytes));
        if (i < 8) {
            longer.push_back(prefix_payload(ns, 9000 + i, kTokens + 256, kPageBytes));
        }
    }
    auto share = [](const PrefixPayload& p) {
        auto owner = std::make_shared_for_overwrite<uint8_t[]>(p.bytes.size());
        std::memcpy(owner.get(), p.bytes.data(), p.bytes.size());
        return PayloadBytes(std::move(owner), p.bytes.size(), false);
    };
    const double mib = static_cast<double>(kEntries * ps[0].bytes.size()) / (1 << 20);
    for (bool sync : {true, false}) {
        TempDir tmp;
        DiskStoreOptions o = quiet_options(tmp.path());
        o.sync = sync;
        o.queue_capacity = kEntries;
        o.max_queued_bytes = 0;
        auto steps = std::make_shared<StepTimes>();
        o.debug_io_hook = [steps](DiskIoStep st) { return (*steps)(st); };
        auto store = open_ok(o);
        store->flush();  // the start-up sweep is not part of the write
        *steps = StepTimes{};
        shared.clear();
        for (const auto& p : ps) {
            shared.push_back(share(p));
        }
        auto t0 = Clock::now();
        for (size_t i = 0; i < kEntries; ++i) {
            const PrefixPayload& p = ps[i];
            ASSERT_EQ(store->submit_write(ns, p.tokens, p.page, p.descriptor, shared[i], p.cuts),
                      DiskSubmit::Queued);
        }
        const double submit_s = seconds_since(t0);
        store->flush();
        const double write_s = seconds_since(t0);
        ASSERT_EQ(store->stats().writes, kEntries);
        // Dedupe: a longer prefix of each writes only its new pages.
        t0 = Clock::now();
        for (const auto& p : longer) {
            ASSERT_EQ(submit(*store, ns, p), DiskSubmit::Queued);
        }
        store->flush();
        const double dedupe_s = seconds_since(t0);
        std::printf(
            "[ bench    ] write sync=%d: %.0f MiB in %.3f s = %.0f MiB/s "
            "(its 32 submits: %.2f ms); 8 longer prefixes reusing 8 MiB each and "
            "writing 1 MiB each: %.3f s\n",
            sync, mib, write_s, mib / write_s, submit_s * 1e3, dedupe_s);
        steps->print(sync ? "sync=1" : "sync=0");
        for (bool cold : {false, true}) {
            if (cold && !drop_caches()) {
                std::printf("[ bench    ] read cold: skipped (cannot drop the page cache)\n");
                continue;
            }
            t0 = Clock::now();
            std::vector<uint8_t> buf;
            for (const auto& p : ps) {
                auto hit = store->acquire_longest(ns, p.tokens);
                ASSERT_TRUE(hit);
                ASSERT_EQ(store->read_into(hit->lease, buf), DiskReadError::None);
            }
            const double read_s = seconds_since(t0);
            std::printf("[ bench    ] read %s (verified): %.0f MiB in %.3f s = %.0f MiB/s\n",
                        cold ? "cold" : "warm", mib, read_s, mib / read_s);
        }
    }
}

// A synthetic cache of `entries` entries of `blocks_per_entry` blocks of `block_bytes`.
void make_synthetic_cache(const std::string& dir, size_t entries, size_t blocks_per_entry,
                          uint64_t block_bytes, size_t tokens) {
    const NamespaceId ns = test_namespace();
    fs::create_directories(dir + "/manifests");
    fs::create_directories(dir + "/blocks");
    std::mt19937_64 rng(7);
    for (size_t e = 0; e < entries; ++e) {
        disk::Manifest m;
        m.seq = e + 1;
        m.ns = ns;
        m.tokens = random_tokens(rng, tokens, 50000);
        m.page = prefix_identity(ns, 0, m.tokens).page_id();
        for (size_t b = 0; b < blocks_per_entry; ++b) {
            disk::BlockRef ref{{Hash128{rng(), rng()}, 0}, block_bytes};
            const std::string sub = dir + "/blocks/" + disk::block_dir_name(ref.key.hash);
            fs::create_directories(sub);
            const std::string path = sub + "/" + disk::block_file_name(ref.key);
            const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
            ASSERT_GE(fd, 0);
            ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(block_bytes)), 0);  // sparse
            ::close(fd);
            m.blocks.push_back(ref);
        }
        m.descriptor.kind = PayloadKind::FullState;
        m.descriptor.token_end = static_cast<uint32_t>(tokens);
        m.descriptor.layer_end = 32;
        m.descriptor.k_type = m.descriptor.v_type = "f16";
        m.descriptor.payload_bytes = block_bytes * blocks_per_entry;
        m.payload_checksum = disk::payload_checksum(m.descriptor.payload_bytes, m.blocks);
        write_file(dir + "/manifests/" + disk::manifest_file_name(m.seq), disk::encode_manifest(m));
    }
}

TEST_F(DiskStoreBench, ReconcileTenGiB) {
    struct Shape {
        size_t entries;
        size_t blocks;
        uint64_t block_bytes;
        size_t tokens;
    };
    for (const Shape& shape : {Shape{10240, 1, 1 << 20, 1024}, Shape{160, 64, 1 << 20, 4096},
                               Shape{2560, 16, 256 << 10, 2048}}) {
        TempDir tmp;
        const std::string dir = tmp.sub("cache");
        make_synthetic_cache(dir, shape.entries, shape.blocks, shape.block_bytes, shape.tokens);
        for (bool cold : {false, true}) {
            if (cold && !drop_caches()) {
                continue;
            }
            DiskOpenResult r = DiskStore::open(quiet_options(dir));
            ASSERT_TRUE(r.store) << r.message;
            r.store->flush();
            const DiskStoreStats s = r.store->stats();
            ASSERT_EQ(s.entries, shape.entries);
            ASSERT_EQ(s.quarantines, 0u);
            std::printf(
                "[ bench    ] reconcile %s: %zu entries x %zu blocks of %llu KiB "
                "(%.1f GiB, %zu tokens each): ready in %.1f ms, sweep %.1f ms\n",
                cold ? "cold" : "warm", shape.entries, shape.blocks,
                static_cast<unsigned long long>(shape.block_bytes >> 10),
                static_cast<double>(s.block_bytes) / (1ull << 30), shape.tokens, s.reconcile_ms,
                s.sweep_ms);
        }
    }
}

}  // namespace
}  // namespace skippy::cache
