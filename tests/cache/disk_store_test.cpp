// DiskStore: round trip, prefix lookup, dedupe, restart, replacement, removal, torn
// writes, lock file, bounds and the write queue.
#include "cache/disk_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "cache/disk_format.h"
#include "disk_test_util.h"

namespace skippy::cache {
namespace {

using namespace test;

TEST(DiskStore, RoundTripAndFileModes) {
    TempDir tmp;
    const std::string dir = tmp.sub("cache/disk");  // parents are created
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(dir));
    ASSERT_TRUE(store);
    EXPECT_EQ(store->mode(), DiskMode::ReadWrite);
    const PrefixPayload p = prefix_payload(ns, 1, 200);
    ASSERT_EQ(submit(*store, ns, p), DiskSubmit::Queued);
    store->flush();
    EXPECT_TRUE(store->contains(ns, p.tokens, p.page));
    EXPECT_EQ(submit(*store, ns, p), DiskSubmit::AlreadyPresent);

    std::vector<Token> query = p.tokens;
    query.push_back(7);
    std::optional<DiskHit> hit = store->acquire_longest(ns, query);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->len, 200u);
    EXPECT_EQ(hit->page, p.page);
    EXPECT_EQ(hit->descriptor, p.descriptor);
    DiskReadResult r = store->read(hit->lease);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(std::vector<uint8_t>(r.bytes.span().begin(), r.bytes.span().end()), p.bytes);

    const DiskStoreStats s = store->stats();
    EXPECT_EQ(s.entries, 1u);
    EXPECT_EQ(s.writes, 1u);
    EXPECT_EQ(s.hits, 1u);
    EXPECT_EQ(s.reads, 1u);
    EXPECT_EQ(s.blocks, 4u);  // 200 tokens: pages of 64, 64, 64, 8
    EXPECT_EQ(s.block_bytes, p.bytes.size());
    EXPECT_GT(s.manifest_bytes, 0u);
    EXPECT_TRUE(s.sweep_done);
    EXPECT_EQ(store->debug_check(), std::nullopt);

    struct stat st {};
    ASSERT_EQ(::stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    auto files = store->debug_files(ns, p.tokens);
    ASSERT_TRUE(files);
    ASSERT_EQ(::stat(files->manifest.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(::stat(files->blocks[0].c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(DiskStore, LongestPrefixAndNamespaces) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    const NamespaceId tenant = test_namespace("tenant-a");
    auto store = open_ok(quiet_options(tmp.path()));
    const PrefixPayload short_p = prefix_payload(ns, 2, 64);
    const PrefixPayload long_p = prefix_payload(ns, 2, 192);
    ASSERT_EQ(submit(*store, ns, short_p), DiskSubmit::Queued);
    ASSERT_EQ(submit(*store, ns, long_p), DiskSubmit::Queued);
    store->flush();

    std::vector<Token> q(long_p.tokens.begin(), long_p.tokens.begin() + 150);
    auto peek = store->peek_longest(ns, q);
    ASSERT_TRUE(peek);
    EXPECT_EQ(peek->len, 64u);
    EXPECT_EQ(peek->page, short_p.page);
    q = long_p.tokens;
    q.push_back(1);
    EXPECT_EQ(store->peek_longest(ns, q)->len, 192u);
    EXPECT_FALSE(store->peek_longest(tenant, q));  // tenants stay isolated
    EXPECT_FALSE(store->acquire_longest(ns, std::vector<Token>{99999, 1, 2}));
    EXPECT_EQ(store->stats().misses, 1u);
}

TEST(DiskStore, CommonPrefixLookupAndTheEntrysTokens) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(tmp.path()));
    const PrefixPayload p = prefix_payload(ns, 4, 192);
    ASSERT_EQ(submit(*store, ns, p), DiskSubmit::Queued);
    store->flush();
    std::vector<Token> q(p.tokens.begin(), p.tokens.begin() + 100);
    q.push_back(99999);  // diverges inside the stored path
    EXPECT_FALSE(store->peek_longest(ns, q));
    auto peek = store->peek_longest(ns, q, PrefixMatch::Common);
    ASSERT_TRUE(peek);
    EXPECT_EQ(peek->len, 100u);
    auto hit = store->acquire_longest(ns, q, PrefixMatch::Common);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->len, 100u);
    EXPECT_EQ(hit->tokens, p.tokens);  // the key to promote it under
    EXPECT_TRUE(store->read(hit->lease).ok());
}

TEST(DiskStore, SnapshotWriteLandsEvenAfterTheRamTierDropsItsBlocks) {
    // The record path queues the RAM tier's blocks (shared, not copied): the write still
    // lands, byte for byte, when the RAM entry is released before the writer runs. Blocks
    // cut as the disk tier cuts them are written where they are; others (a RAM tier with
    // smaller blocks) are joined first. Bad blocks are refused either way.
    for (const size_t ram_block_bytes : {kDefaultBlockBytes, size_t{1000}}) {
        SCOPED_TRACE(ram_block_bytes);
        TempDir tmp;
        const NamespaceId ns = test_namespace();
        auto store = open_ok(quiet_options(tmp.path()));
        store->set_foreground_busy(true);  // held back until flush()
        const PrefixPayload p = prefix_payload(ns, 11, 200);
        BlockStore ram(BlockStoreOptions{.block_bytes = ram_block_bytes});
        InsertOutcome stored = ram.insert(p.bytes, p.cuts);
        ASSERT_TRUE(stored.ok());
        std::optional<PayloadSnapshot> snap = ram.snapshot(stored.payload);
        ASSERT_TRUE(snap);
        ASSERT_EQ(store->submit_write(ns, p.tokens, p.page, p.descriptor, std::move(*snap), p.cuts),
                  DiskSubmit::Queued);
        ASSERT_EQ(ram.release(stored.payload), ReleaseError::None);
        EXPECT_EQ(ram.stats().physical_bytes, 0u);  // the RAM tier holds nothing now
        store->flush();
        std::vector<uint8_t> bytes;
        ASSERT_EQ(read_exact(*store, ns, p, &bytes), DiskReadError::None);
        EXPECT_EQ(bytes, p.bytes);
        EXPECT_EQ(store->stats().queued_bytes, 0u);
        // A snapshot of the wrong size for its descriptor is refused at submit.
        const PrefixPayload q = prefix_payload(ns, 12, 100);
        InsertOutcome other = ram.insert(p.bytes, p.cuts);
        ASSERT_TRUE(other.ok());
        EXPECT_EQ(store->submit_write(ns, q.tokens, q.page, q.descriptor,
                                      *ram.snapshot(other.payload), q.cuts),
                  DiskSubmit::Invalid);
        // A corrupt block is a failed write, not a stored entry.
        InsertOutcome bad = ram.insert(q.bytes, q.cuts);
        ASSERT_TRUE(bad.ok());
        ASSERT_TRUE(ram.debug_corrupt_block(bad.payload.blocks.back(), 0));
        ASSERT_EQ(store->submit_write(ns, q.tokens, q.page, q.descriptor,
                                      *ram.snapshot(bad.payload), q.cuts),
                  DiskSubmit::Queued);
        store->flush();
        EXPECT_EQ(store->stats().write_failures, 1u);
        EXPECT_FALSE(store->contains(ns, q.tokens, q.page));
    }
}

TEST(DiskStore, WritesWaitWhileTheForegroundComputesWithinBounds) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(tmp.path()));
    store->set_foreground_busy(true);
    const PrefixPayload a = prefix_payload(ns, 5, 64);
    ASSERT_EQ(submit(*store, ns, a), DiskSubmit::Queued);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(store->contains(ns, a.tokens, a.page)) << "written while busy";
    store->set_foreground_busy(false);  // idle: written at once
    for (int i = 0; i < 200 && !store->contains(ns, a.tokens, a.page); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(store->contains(ns, a.tokens, a.page));
    // Busy for good: the write still lands after the bounded deferral; flush never waits.
    store->set_foreground_busy(true);
    const PrefixPayload b = prefix_payload(ns, 6, 64);
    ASSERT_EQ(submit(*store, ns, b), DiskSubmit::Queued);
    store->flush();
    EXPECT_TRUE(store->contains(ns, b.tokens, b.page));
    const PrefixPayload c = prefix_payload(ns, 7, 64);
    ASSERT_EQ(submit(*store, ns, c), DiskSubmit::Queued);
    for (int i = 0; i < 400 && !store->contains(ns, c.tokens, c.page); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(store->contains(ns, c.tokens, c.page)) << "deferred past the bound";
    // Idle again: a queued write waits until the foreground has been idle for the grace
    // period (back-to-back requests leave gaps of milliseconds), then lands.
    const PrefixPayload d = prefix_payload(ns, 8, 64);
    ASSERT_EQ(submit(*store, ns, d), DiskSubmit::Queued);
    const auto idle_from = std::chrono::steady_clock::now();
    store->set_foreground_busy(false);
    for (int i = 0; i < 400 && !store->contains(ns, d.tokens, d.page); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_TRUE(store->contains(ns, d.tokens, d.page));
    EXPECT_GE(std::chrono::steady_clock::now() - idle_from, DiskStore::kIdleGrace);
}

TEST(DiskStore, LongerPrefixSharesBlocks) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    std::vector<DiskCommit> commits;
    DiskStoreOptions o = quiet_options(tmp.path());
    o.on_commit = [&](const DiskCommit& c) { commits.push_back(c); };
    auto store = open_ok(o);
    const PrefixPayload a = prefix_payload(ns, 3, 128);  // 2 pages
    const PrefixPayload b = prefix_payload(ns, 3, 256);  // the same 2 pages + 2 more
    ASSERT_EQ(submit(*store, ns, a), DiskSubmit::Queued);
    store->flush();
    ASSERT_EQ(submit(*store, ns, b), DiskSubmit::Queued);
    store->flush();
    ASSERT_EQ(commits.size(), 2u);
    EXPECT_EQ(commits[1].new_blocks, 2u);
    EXPECT_EQ(commits[1].reused_blocks, 2u);
    EXPECT_EQ(commits[1].new_bytes, b.bytes.size() - a.bytes.size());
    const DiskStoreStats s = store->stats();
    EXPECT_EQ(s.blocks, 4u);
    EXPECT_EQ(s.block_bytes, b.bytes.size());
    EXPECT_EQ(s.logical_bytes, a.bytes.size() + b.bytes.size());
    EXPECT_EQ(count_files(tmp.sub("blocks")), 4u);

    // Removing the longer entry keeps the shared blocks; removing both deletes all.
    EXPECT_TRUE(store->remove(ns, b.tokens));
    store->flush();
    EXPECT_EQ(count_files(tmp.sub("blocks")), 2u);
    std::vector<uint8_t> bytes;
    EXPECT_EQ(read_exact(*store, ns, a, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, a.bytes);
    EXPECT_TRUE(store->remove(ns, a.tokens));
    store->flush();
    EXPECT_EQ(count_files(tmp.path()), 0u);
    EXPECT_EQ(store->stats().disk_bytes, 0u);
    EXPECT_EQ(store->debug_check(), std::nullopt);
}

TEST(DiskStore, RepeatedBlockInOnePayload) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(tmp.path()));
    PrefixPayload p = prefix_payload(ns, 4, 256);
    std::fill(p.bytes.begin(), p.bytes.end(), 0);  // four identical pages
    ASSERT_EQ(submit(*store, ns, p), DiskSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().blocks, 1u);
    std::vector<uint8_t> bytes;
    EXPECT_EQ(read_exact(*store, ns, p, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, p.bytes);
    EXPECT_EQ(store->debug_check(), std::nullopt);
}

TEST(DiskStore, RestartServesCommittedEntries) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    std::vector<PrefixPayload> ps;
    for (uint64_t i = 0; i < 20; ++i) {
        ps.push_back(prefix_payload(ns, 10 + i % 4, 64 * (1 + i / 4)));
    }
    {
        auto store = open_ok(quiet_options(tmp.path()));
        for (const auto& p : ps) {
            ASSERT_EQ(submit(*store, ns, p), DiskSubmit::Queued);
            store->flush();
        }
    }
    auto store = open_ok(quiet_options(tmp.path()));
    const DiskStoreStats s = store->stats();
    EXPECT_EQ(s.entries, ps.size());
    EXPECT_GT(s.reconcile_ms, 0.0);
    EXPECT_EQ(s.rejected_manifests, 0u);
    EXPECT_EQ(s.orphan_blocks_removed, 0u);
    for (const auto& p : ps) {
        std::vector<uint8_t> bytes;
        ASSERT_EQ(read_exact(*store, ns, p, &bytes), DiskReadError::None);
        EXPECT_EQ(bytes, p.bytes);
    }
    EXPECT_EQ(store->debug_check(), std::nullopt);
    // New writes after a restart get fresh sequence numbers.
    const PrefixPayload extra = prefix_payload(ns, 99, 64);
    ASSERT_EQ(submit(*store, ns, extra), DiskSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().entries, ps.size() + 1);
}

TEST(DiskStore, ReplacementKeepsOnlyTheNewPage) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    PrefixPayload p1 = prefix_payload(ns, 5, 128);
    PrefixPayload p2 = prefix_payload(ns, 6, 128);
    p2.tokens = p1.tokens;
    p2.page = PageId(p1.page.value() ^ 1);  // another state at the same path
    {
        auto store = open_ok(quiet_options(tmp.path()));
        ASSERT_EQ(submit(*store, ns, p1), DiskSubmit::Queued);
        store->flush();
        ASSERT_EQ(submit(*store, ns, p2), DiskSubmit::Queued);
        store->flush();
        EXPECT_TRUE(store->contains(ns, p2.tokens, p2.page));
        EXPECT_EQ(count_files(tmp.sub("manifests")), 1u);
        EXPECT_EQ(count_files(tmp.sub("blocks")), 2u);
    }
    auto store = open_ok(quiet_options(tmp.path()));
    std::vector<uint8_t> bytes;
    ASSERT_EQ(read_exact(*store, ns, p2, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, p2.bytes);
}

TEST(DiskStore, HighestSequenceWinsAtStartup) {
    // A crash between a replacement's commit and the old manifest's deletion.
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    PrefixPayload p1 = prefix_payload(ns, 5, 64);
    PrefixPayload p2 = prefix_payload(ns, 6, 64);
    p2.tokens = p1.tokens;
    p2.page = PageId(p1.page.value() ^ 1);
    std::vector<uint8_t> old_manifest;
    std::string old_path;
    {
        auto store = open_ok(quiet_options(tmp.path()));
        ASSERT_EQ(submit(*store, ns, p1), DiskSubmit::Queued);
        store->flush();
        old_path = store->debug_files(ns, p1.tokens)->manifest;
        old_manifest = read_file(old_path);
        ASSERT_EQ(submit(*store, ns, p2), DiskSubmit::Queued);
        store->flush();
    }
    write_file(old_path, old_manifest);  // the old manifest is back; its block is not
    auto store = open_ok(quiet_options(tmp.path()));
    EXPECT_EQ(store->stats().superseded_manifests, 1u);
    EXPECT_EQ(count_files(tmp.sub("manifests")), 1u);
    std::vector<uint8_t> bytes;
    ASSERT_EQ(read_exact(*store, ns, p2, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, p2.bytes);
}

TEST(DiskStore, RemovalWhileLeasedIsDeferred) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(tmp.path()));
    const PrefixPayload p = prefix_payload(ns, 7, 64);
    ASSERT_EQ(submit(*store, ns, p), DiskSubmit::Queued);
    store->flush();
    std::optional<DiskHit> hit = store->acquire_longest(ns, p.tokens);
    ASSERT_TRUE(hit);
    EXPECT_EQ(store->quarantine(ns, p.tokens, PageId(p.page.value() + 1)),
              QuarantineStatus::PageMismatch);
    EXPECT_EQ(store->quarantine(ns, p.tokens, p.page), QuarantineStatus::Deferred);
    EXPECT_FALSE(store->peek_longest(ns, p.tokens));  // hidden at once
    EXPECT_EQ(store->stats().hidden_entries, 1u);
    EXPECT_EQ(store->stats().leased_entries, 1u);
    std::vector<uint8_t> bytes;
    EXPECT_EQ(store->read_into(hit->lease, bytes), DiskReadError::NotFound);  // never served
    store->flush();
    EXPECT_EQ(count_files(tmp.sub("manifests")), 1u);  // files stay while leased
    hit.reset();
    store->flush();
    EXPECT_EQ(count_files(tmp.path()), 0u);
    EXPECT_EQ(store->stats().hidden_entries, 0u);
    EXPECT_EQ(store->stats().leased_entries, 0u);
    EXPECT_EQ(store->debug_check(), std::nullopt);
}

TEST(DiskStore, TornFilesAreNeverServedAndAreCleanedUp) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    const PrefixPayload good = prefix_payload(ns, 20, 128);
    const PrefixPayload torn = prefix_payload(ns, 21, 128);
    std::vector<uint8_t> torn_manifest;
    std::vector<std::string> torn_blocks;
    {
        auto store = open_ok(quiet_options(tmp.path()));
        ASSERT_EQ(submit(*store, ns, good), DiskSubmit::Queued);
        ASSERT_EQ(submit(*store, ns, torn), DiskSubmit::Queued);
        store->flush();
        auto files = store->debug_files(ns, torn.tokens);
        torn_manifest = read_file(files->manifest);
        torn_blocks = files->blocks;
        fs::remove(files->manifest);  // blocks written, manifest never committed
    }
    // Leftovers of interrupted writes: a half-written manifest (committed under a name
    // it would never have had, but as if its rename raced a crash), tmp files.
    std::vector<uint8_t> half(torn_manifest.begin(),
                              torn_manifest.begin() + static_cast<long>(torn_manifest.size() / 2));
    write_file(tmp.sub("manifests/00000000000000ff.m"), half);
    write_file(tmp.sub("manifests/0000000000000100.tmp"), torn_manifest);
    write_file(torn_blocks[0] + ".tmp", {1, 2, 3});
    std::vector<std::string> log;
    auto store = open_ok(quiet_options(tmp.path(), &log));
    const DiskStoreStats s = store->stats();
    EXPECT_EQ(s.entries, 1u);
    EXPECT_EQ(s.rejected_manifests, 1u);
    EXPECT_EQ(s.orphan_blocks_removed, 2u);
    EXPECT_EQ(s.tmp_files_removed, 2u);
    EXPECT_EQ(log.size(), 1u);  // "1 manifest(s) rejected ..."
    EXPECT_EQ(read_exact(*store, ns, torn), DiskReadError::NotFound);
    std::vector<uint8_t> bytes;
    EXPECT_EQ(read_exact(*store, ns, good, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, good.bytes);
    EXPECT_EQ(count_files(tmp.sub("manifests")), 1u);
    EXPECT_EQ(count_files(tmp.sub("blocks")), 2u);
    EXPECT_EQ(count_files(tmp.path(), ".tmp"), 0u);
}

TEST(DiskStore, SecondStoreOnTheSameFolderFails) {
    TempDir tmp;
    auto first = open_ok(quiet_options(tmp.path()));
    DiskOpenResult second = DiskStore::open(quiet_options(tmp.path()));
    EXPECT_EQ(second.error, DiskOpenError::Locked);
    EXPECT_FALSE(second.store);
    EXPECT_NE(second.message.find("pid " + std::to_string(::getpid())), std::string::npos)
        << second.message;
    first.reset();
    EXPECT_TRUE(open_ok(quiet_options(tmp.path())));
}

TEST(DiskStore, LockHeldByAnotherProcess) {
    TempDir tmp;
    int ready[2];
    int release[2];
    ASSERT_EQ(::pipe(ready), 0);
    ASSERT_EQ(::pipe(release), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        DiskOpenResult r = DiskStore::open(quiet_options(tmp.path()));
        const char ok = r.store ? 'y' : 'n';
        [[maybe_unused]] ssize_t n = ::write(ready[1], &ok, 1);
        char c;
        n = ::read(release[0], &c, 1);
        ::_exit(0);
    }
    char ok = 0;
    ASSERT_EQ(::read(ready[0], &ok, 1), 1);
    ASSERT_EQ(ok, 'y');
    DiskOpenResult second = DiskStore::open(quiet_options(tmp.path()));
    EXPECT_EQ(second.error, DiskOpenError::Locked);
    EXPECT_NE(second.message.find("pid " + std::to_string(child)), std::string::npos)
        << second.message;
    ASSERT_EQ(::write(release[1], "x", 1), 1);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(open_ok(quiet_options(tmp.path())));
    for (int fd : {ready[0], ready[1], release[0], release[1]}) {
        ::close(fd);
    }
}

TEST(DiskStore, MaxBytesEvictsLeastRecentlyUsed) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    std::vector<PrefixPayload> ps;
    for (uint64_t i = 0; i < 6; ++i) {
        ps.push_back(prefix_payload(ns, 100 + i, 64));  // 4 KiB each, nothing shared
    }
    DiskStoreOptions o = quiet_options(tmp.path());
    o.max_bytes = 4 * 4096 + 4 * 1024;  // room for 4 entries and their manifests
    {
        auto store = open_ok(o);
        for (size_t i = 0; i < 4; ++i) {
            ASSERT_EQ(submit(*store, ns, ps[i]), DiskSubmit::Queued);
            store->flush();
        }
        EXPECT_EQ(read_exact(*store, ns, ps[0]), DiskReadError::None);  // 0 is now recent
        ASSERT_EQ(submit(*store, ns, ps[4]), DiskSubmit::Queued);
        store->flush();
        EXPECT_EQ(store->stats().evictions, 1u);
        EXPECT_FALSE(store->contains(ns, ps[1].tokens, ps[1].page));  // LRU went
        EXPECT_TRUE(store->contains(ns, ps[0].tokens, ps[0].page));
        EXPECT_LE(store->stats().disk_bytes, o.max_bytes);
        EXPECT_EQ(count_files(tmp.sub("manifests")), 4u);
    }
    // Recency survives a restart (manifest mtimes): 2 is now the oldest.
    auto store = open_ok(o);
    ASSERT_EQ(submit(*store, ns, ps[5]), DiskSubmit::Queued);
    store->flush();
    EXPECT_FALSE(store->contains(ns, ps[2].tokens, ps[2].page));
    EXPECT_TRUE(store->contains(ns, ps[0].tokens, ps[0].page));
    // Too large for the bound: rejected without evicting anything.
    const PrefixPayload big = prefix_payload(ns, 200, 64 * 8);
    ASSERT_EQ(submit(*store, ns, big), DiskSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().write_no_room, 1u);
    EXPECT_EQ(store->stats().entries, 4u);
    // A lowered bound applies at the next start.
    store.reset();
    o.max_bytes = 2 * 4096 + 2 * 1024;
    store = open_ok(o);
    EXPECT_EQ(store->stats().entries, 2u);
    EXPECT_EQ(store->debug_check(), std::nullopt);
}

TEST(DiskStore, MaxEntries) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    DiskStoreOptions o = quiet_options(tmp.path());
    o.max_entries = 3;
    auto store = open_ok(o);
    for (uint64_t i = 0; i < 5; ++i) {
        ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 300 + i, 64)), DiskSubmit::Queued);
        store->flush();
    }
    EXPECT_EQ(store->stats().entries, 3u);
    EXPECT_EQ(store->stats().evictions, 2u);
    EXPECT_EQ(count_files(tmp.sub("manifests")), 3u);
}

TEST(DiskStore, FullQueueDropsAndCounts) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    std::mutex mu;
    std::condition_variable cv;
    bool open_gate = false;
    bool writer_waiting = false;
    DiskStoreOptions o = quiet_options(tmp.path());
    o.queue_capacity = 2;
    o.debug_io_hook = [&](DiskIoStep s) {
        if (s == DiskIoStep::BlockWrite) {
            std::unique_lock lock(mu);
            writer_waiting = true;
            cv.notify_all();
            cv.wait(lock, [&] { return open_gate; });
        }
        return 0;
    };
    auto store = open_ok(o);
    const PrefixPayload p0 = prefix_payload(ns, 400, 64);
    ASSERT_EQ(submit(*store, ns, p0), DiskSubmit::Queued);
    {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return writer_waiting; });  // p0 is running
    }
    EXPECT_EQ(submit(*store, ns, p0), DiskSubmit::AlreadyQueued);
    EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 401, 64)), DiskSubmit::Queued);
    EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 402, 64)), DiskSubmit::Queued);
    EXPECT_EQ(store->probe_write(ns, prefix_payload(ns, 403, 64).tokens, PageId(1), 4096),
              DiskSubmit::DroppedFull);
    EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 403, 64)), DiskSubmit::DroppedFull);
    DiskStoreStats s = store->stats();
    EXPECT_EQ(s.queue_depth, 3u);
    EXPECT_EQ(s.queued_bytes, 2u * 4096);
    EXPECT_EQ(s.dropped_full, 1u);
    {
        std::lock_guard lock(mu);
        open_gate = true;
    }
    cv.notify_all();
    store->flush();
    s = store->stats();
    EXPECT_EQ(s.writes, 3u);
    EXPECT_EQ(s.queue_depth, 0u);
    EXPECT_EQ(s.queued_bytes, 0u);
}

TEST(DiskStore, InvalidSubmissions) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(tmp.path()));
    PrefixPayload p = prefix_payload(ns, 500, 64);
    PayloadDescriptor d = p.descriptor;
    d.payload_bytes += 1;
    EXPECT_EQ(store->submit_write(ns, p.tokens, p.page, d, p.bytes), DiskSubmit::Invalid);
    d = p.descriptor;
    d.token_end = 10;
    EXPECT_EQ(store->submit_write(ns, p.tokens, p.page, d, p.bytes), DiskSubmit::Invalid);
    EXPECT_EQ(store->submit_write(ns, {}, p.page, p.descriptor, p.bytes), DiskSubmit::Invalid);
    store->close();
    EXPECT_EQ(submit(*store, ns, p), DiskSubmit::Stopped);
}

TEST(DiskStore, ConcurrentReadersWritesEvictionsAndRemovals) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    std::vector<PrefixPayload> ps;
    std::map<uint64_t, size_t> index_of_page;
    for (uint64_t i = 0; i < 32; ++i) {
        ps.push_back(prefix_payload(ns, 700 + i / 4, 64 * (1 + i % 4), 2048));
        index_of_page[ps.back().page.value()] = ps.size() - 1;
    }
    DiskStoreOptions o = quiet_options(tmp.path());
    o.sync = false;
    o.max_bytes = 48 * 1024;  // about half of it: evictions all the time
    auto store = open_ok(o);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> good_reads{0};
    std::atomic<uint64_t> bad_reads{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 3; ++t) {
        readers.emplace_back([&, t] {
            std::mt19937_64 rng(static_cast<uint64_t>(t));
            std::vector<uint8_t> buf;
            while (!stop.load()) {
                const PrefixPayload& want = ps[rng() % ps.size()];
                std::optional<DiskHit> hit = store->acquire_longest(ns, want.tokens);
                if (!hit) {
                    continue;
                }
                const DiskReadError e = store->read_into(hit->lease, buf);
                if (e == DiskReadError::NotFound) {
                    continue;  // removed while leased: hidden, never served
                }
                const PrefixPayload& got = ps[index_of_page.at(hit->page.value())];
                if (e == DiskReadError::None && buf == got.bytes && hit->len == got.tokens.size()) {
                    ++good_reads;
                } else {
                    ++bad_reads;
                }
            }
        });
    }
    std::mt19937_64 rng(99);
    for (int round = 0; round < 300; ++round) {
        const PrefixPayload& p = ps[rng() % ps.size()];
        if (rng() % 4 == 0) {
            store->remove(ns, p.tokens);
        } else {
            submit(*store, ns, p);
        }
        if (round % 50 == 0) {
            store->flush();
        }
    }
    store->flush();
    stop = true;
    for (auto& t : readers) {
        t.join();
    }
    const DiskStoreStats s = store->stats();
    EXPECT_EQ(bad_reads.load(), 0u);
    EXPECT_GT(good_reads.load(), 0u);
    EXPECT_EQ(s.read_failures, 0u);
    EXPECT_EQ(s.quarantines, 0u);
    EXPECT_GT(s.evictions, 0u);
    EXPECT_LE(s.disk_bytes, o.max_bytes);
    EXPECT_EQ(store->debug_check(), std::nullopt);
    EXPECT_EQ(count_files(tmp.sub("manifests")), s.entries);
    EXPECT_EQ(count_files(tmp.sub("blocks")), s.blocks);
}

TEST(DiskStore, UnusableFolder) {
    TempDir tmp;
    write_file(tmp.sub("file"), {1});
    DiskOpenResult r = DiskStore::open(quiet_options(tmp.sub("file")));
    EXPECT_EQ(r.error, DiskOpenError::Unusable);
    EXPECT_FALSE(r.store);
    EXPECT_FALSE(r.message.empty());
    r = DiskStore::open(quiet_options(""));
    EXPECT_EQ(r.error, DiskOpenError::Unusable);
}

TEST(DiskFormat, ManifestRoundTripAndRejection) {
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 600, 100);
    disk::Manifest m;
    m.seq = 42;
    m.ns = ns;
    m.page = p.page;
    m.descriptor = p.descriptor;
    m.tokens = p.tokens;
    m.blocks = {{{Hash128{1, 2}, 0}, 4096}, {{Hash128{3, 4}, 5}, p.bytes.size() - 4096}};
    m.payload_checksum = disk::payload_checksum(p.bytes.size(), m.blocks);
    const std::vector<uint8_t> enc = disk::encode_manifest(m);
    std::string why;
    auto back = disk::decode_manifest(enc, &why);
    ASSERT_TRUE(back) << why;
    EXPECT_EQ(back->seq, 42u);
    EXPECT_EQ(back->ns, ns);
    EXPECT_EQ(back->tokens, p.tokens);
    EXPECT_EQ(back->descriptor, p.descriptor);
    EXPECT_EQ(back->blocks.size(), 2u);
    EXPECT_EQ(back->blocks[1].key.variant, 5u);
    for (size_t cut = 0; cut < enc.size(); cut += 7) {
        EXPECT_FALSE(disk::decode_manifest(std::span(enc).first(cut), &why)) << cut;
    }
    for (size_t at = 0; at < enc.size(); at += 5) {
        std::vector<uint8_t> bad = enc;
        bad[at] ^= 0x10;
        EXPECT_FALSE(disk::decode_manifest(bad, &why)) << at;
    }
    // The payload checksum formula is the block store's.
    BlockStore bs(BlockStoreOptions{.block_bytes = 4096});
    PreparedPayload prep = bs.prepare(p.bytes);
    std::vector<disk::BlockRef> refs;
    for (const auto& b : prep.blocks) {
        refs.push_back({{b.hash, 0}, b.size});
    }
    EXPECT_EQ(disk::payload_checksum(p.bytes.size(), refs), prep.checksum);
}

TEST(DiskFormat, FileNames) {
    const disk::BlockKey k{Hash128{0x1122334455667788ULL, 0xabcdef0011223344ULL}, 0};
    EXPECT_EQ(disk::block_file_name(k), "abcdef00112233441122334455667788");
    EXPECT_EQ(disk::block_dir_name(k.hash), "ab");
    EXPECT_EQ(disk::parse_block_file_name(disk::block_file_name(k)), k);
    const disk::BlockKey v{k.hash, 3};
    EXPECT_EQ(disk::parse_block_file_name(disk::block_file_name(v)), v);
    EXPECT_FALSE(disk::parse_block_file_name(disk::block_file_name(k) + ".tmp"));
    EXPECT_FALSE(disk::parse_block_file_name(disk::block_file_name(k) + "-0"));
    EXPECT_FALSE(disk::parse_block_file_name("xyz"));
    EXPECT_EQ(disk::parse_manifest_file_name(disk::manifest_file_name(77)), 77u);
    EXPECT_FALSE(disk::parse_manifest_file_name("0000000000000001.tmp"));
}

}  // namespace
}  // namespace skippy::cache
