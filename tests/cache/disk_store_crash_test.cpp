// DiskStore crash safety: a child process writes entries and is killed with SIGKILL at
// random moments (a timer in the parent) or at a random write step (the child kills
// itself from the I/O hook, so that every step between "blocks written" and "manifest
// durable" is hit). After each kill the parent reopens the folder and checks that
//   - every entry whose commit the child reported (through a pipe) is served, with
//     identical bytes, and stays so in every later round;
//   - every entry that is served has exactly the bytes that were written for it (no torn
//     or mixed entry is ever served);
//   - after the start-up sweep, no *.tmp file and no orphan block is left.
// Rounds: SKIPPY_DISK_CRASH_ROUNDS (default 60; each round is one kill point).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

#include "cache/disk_store.h"
#include "disk_test_util.h"

namespace skippy::cache {
namespace {

using namespace test;

constexpr size_t kEntriesPerRound = 16;

// Entry `id`: family id / 4 (families share their pages), length 64..256 tokens.
PrefixPayload crash_payload(const NamespaceId& ns, uint64_t id) {
    return prefix_payload(ns, 5000 + id / 4, kPageTokens * (1 + id % 4), 2048);
}

[[noreturn]] void child_main(const std::string& dir, uint64_t first_id, bool sync,
                             uint64_t kill_at_step, uint64_t seed, int commit_fd) {
    const NamespaceId ns = test_namespace();
    std::map<uint64_t, uint64_t> id_of_page;
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < kEntriesPerRound; ++i) {
        ids.push_back(first_id + i);
        id_of_page[crash_payload(ns, first_id + i).page.value()] = first_id + i;
    }
    std::mt19937_64 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);  // longer prefixes before shorter, too
    uint64_t steps = 0;
    DiskStoreOptions o = quiet_options(dir);
    o.sync = sync;
    o.queue_capacity = kEntriesPerRound;
    o.on_commit = [&](const DiskCommit& c) {
        const uint64_t id = id_of_page.at(c.page.value());
        if (::write(commit_fd, &id, sizeof(id)) != sizeof(id)) {
            ::_exit(3);
        }
    };
    o.debug_io_hook = [&](DiskIoStep) {
        if (kill_at_step != 0 && ++steps == kill_at_step) {
            ::raise(SIGKILL);
        }
        return 0;
    };
    DiskOpenResult r = DiskStore::open(o);
    if (!r.store) {
        ::_exit(2);
    }
    for (uint64_t id : ids) {
        const PrefixPayload p = crash_payload(ns, id);
        r.store->submit_write(ns, p.tokens, p.page, p.descriptor, p.bytes, p.cuts);
        if (rng() % 3 == 0) {
            r.store->flush();  // sometimes one at a time, sometimes a queue of them
        }
    }
    r.store->flush();
    ::pause();  // wait for the parent's SIGKILL
    ::_exit(0);
}

TEST(DiskStoreCrash, KilledWriterNeverLeavesATornEntry) {
    TempDir tmp;
    const std::string dir = tmp.sub("cache");
    const NamespaceId ns = test_namespace();
    const uint64_t rounds = env_u64("SKIPPY_DISK_CRASH_ROUNDS", 60);
    std::mt19937_64 rng(env_u64("SKIPPY_DISK_CRASH_SEED", 12345));
    std::map<uint64_t, bool> durable;         // ids that must be served from now on
    std::map<uint64_t, uint64_t> id_of_page;  // every id written so far
    uint64_t kills = 0;
    uint64_t committed_reported = 0;
    uint64_t served_unreported = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t round = 0; round < rounds; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        const bool step_kill = round % 2 == 1;
        const bool sync = step_kill || round % 4 == 0;
        // Hooks run at >= 4 steps per write (8 with sync), so this step is always reached.
        const uint64_t kill_at_step = step_kill ? 1 + rng() % (kEntriesPerRound * 4) : 0;
        int fds[2];
        ASSERT_EQ(::pipe(fds), 0);
        const uint64_t first_id = round * kEntriesPerRound;
        for (uint64_t i = first_id; i < first_id + kEntriesPerRound; ++i) {
            id_of_page[crash_payload(ns, i).page.value()] = i;
        }
        const uint64_t child_seed = rng();
        const pid_t child = ::fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            ::close(fds[0]);
            child_main(dir, first_id, sync, kill_at_step, child_seed, fds[1]);
        }
        ::close(fds[1]);
        int status = 0;
        if (!step_kill) {
            std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
            ::kill(child, SIGKILL);
            ::waitpid(child, &status, 0);
        } else {
            // The child kills itself; a safety net in case it does not.
            pid_t done = 0;
            for (int i = 0; i < 500 && done == 0; ++i) {
                done = ::waitpid(child, &status, WNOHANG);
                if (done == 0) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(2));
                }
            }
            if (done == 0) {
                ::kill(child, SIGKILL);
                ::waitpid(child, &status, 0);
                ADD_FAILURE() << "the child did not reach step " << kill_at_step;
            }
        }
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
            ++kills;
        } else {
            ADD_FAILURE() << "child exited with status " << status;
        }
        uint64_t id = 0;
        while (::read(fds[0], &id, sizeof(id)) == sizeof(id)) {
            durable[id] = true;
            ++committed_reported;
        }
        ::close(fds[0]);

        auto store = open_ok(quiet_options(dir));
        ASSERT_TRUE(store);
        for (const auto& [done_id, unused] : durable) {
            const PrefixPayload p = crash_payload(ns, done_id);
            std::vector<uint8_t> bytes;
            ASSERT_EQ(read_exact(*store, ns, p, &bytes), DiskReadError::None)
                << "committed entry " << done_id << " is not served";
            ASSERT_EQ(bytes, p.bytes) << "entry " << done_id;
        }
        // Everything served is exactly what was written for it.
        for (const DiskStore::DebugEntry& e : store->debug_entries()) {
            auto known = id_of_page.find(e.page.value());
            ASSERT_NE(known, id_of_page.end()) << "an entry that was never written is served";
            const uint64_t cand = known->second;
            {
                const PrefixPayload p = crash_payload(ns, cand);
                ASSERT_EQ(p.tokens, e.tokens);
                std::vector<uint8_t> bytes;
                ASSERT_EQ(read_exact(*store, ns, p, &bytes), DiskReadError::None) << cand;
                ASSERT_EQ(bytes, p.bytes) << cand;
                if (!durable.contains(cand)) {
                    ++served_unreported;  // killed between the rename and the pipe write
                    durable[cand] = true;
                }
            }
        }
        const DiskStoreStats s = store->stats();
        EXPECT_EQ(s.entries, durable.size());
        EXPECT_EQ(s.read_failures, 0u);
        EXPECT_EQ(s.quarantines, 0u);         // blocks are durable before their manifest names them
        EXPECT_EQ(s.rejected_manifests, 0u);  // a torn manifest is never under its name
        EXPECT_EQ(count_files(dir, ".tmp"), 0u);
        EXPECT_EQ(count_files(dir + "/blocks"), s.blocks) << "orphans survived the sweep";
        EXPECT_EQ(count_files(dir + "/manifests"), s.entries);
        EXPECT_EQ(store->debug_check(), std::nullopt);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(kills, std::min<uint64_t>(rounds, 50));
    RecordProperty("kills", static_cast<int>(kills));
    std::printf(
        "[ crash    ] %llu kill points, %llu commits reported, %llu served before "
        "their report, %zu entries durable, %.1f s\n",
        static_cast<unsigned long long>(kills), static_cast<unsigned long long>(committed_reported),
        static_cast<unsigned long long>(served_unreported), durable.size(), seconds);
}

}  // namespace
}  // namespace skippy::cache
