// DiskStore faults: corrupted, truncated and missing files, injected I/O errors at every
// write step, a real full filesystem and a real read-only one (tmpfs mounts, skipped
// without the privilege), permission denied (as an unprivileged user).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

#include "cache/disk_store.h"
#include "disk_test_util.h"

namespace skippy::cache {
namespace {

using namespace test;

// Writes `ps` and waits until they are on disk.
void write_all(DiskStore& store, const NamespaceId& ns, const std::vector<PrefixPayload>& ps) {
    for (const auto& p : ps) {
        ASSERT_EQ(submit(store, ns, p), DiskSubmit::Queued);
        store.flush();
    }
}

TEST(DiskStoreFaults, BitFlipQuarantinesEveryEntrySharingTheBlock) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    std::vector<std::string> log;
    auto store = open_ok(quiet_options(tmp.path(), &log));
    const PrefixPayload a = prefix_payload(ns, 1, 128);
    const PrefixPayload b = prefix_payload(ns, 1, 256);  // shares a's two blocks
    const PrefixPayload c = prefix_payload(ns, 2, 64);
    const PrefixPayload d = prefix_payload(ns, 3, 64);
    write_all(*store, ns, {a, b, c, d});
    flip_byte(store->debug_files(ns, a.tokens)->blocks[0], 100);
    std::vector<uint8_t> bytes;
    EXPECT_EQ(read_exact(*store, ns, b, &bytes), DiskReadError::ChecksumMismatch);
    EXPECT_FALSE(store->peek_longest(ns, b.tokens));
    EXPECT_FALSE(store->peek_longest(ns, a.tokens));  // shared the bad block
    DiskStoreStats s = store->stats();
    EXPECT_EQ(s.quarantines, 2u);
    EXPECT_EQ(s.read_failures, 1u);
    EXPECT_EQ(s.entries, 2u);
    store->flush();
    EXPECT_EQ(count_files(tmp.sub("manifests")), 2u);
    EXPECT_EQ(count_files(tmp.sub("blocks")), 2u);  // only c's and d's
    // A second corrupt entry is counted but not logged again.
    flip_byte(store->debug_files(ns, c.tokens)->blocks[0], 0);
    EXPECT_EQ(read_exact(*store, ns, c), DiskReadError::ChecksumMismatch);
    EXPECT_EQ(log.size(), 1u);
    EXPECT_EQ(read_exact(*store, ns, d, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, d.bytes);
    store.reset();
    store = open_ok(quiet_options(tmp.path()));
    EXPECT_EQ(store->stats().entries, 1u);
}

TEST(DiskStoreFaults, CorruptBlockIsNotReusedByANewWrite) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(tmp.path()));
    const PrefixPayload a = prefix_payload(ns, 5, 64);
    PrefixPayload b = a;  // the same bytes at another path
    b.tokens[0] += 1;
    b.page = prefix_identity(ns, 0, b.tokens).page_id();
    write_all(*store, ns, {a});
    const std::string a_block = store->debug_files(ns, a.tokens)->blocks[0];
    flip_byte(a_block, 10);
    write_all(*store, ns, {b});
    const std::string b_block = store->debug_files(ns, b.tokens)->blocks[0];
    EXPECT_EQ(b_block, a_block + "-1");  // same hash, other bytes: a new variant
    EXPECT_EQ(store->stats().reused_blocks, 0u);
    std::vector<uint8_t> bytes;
    EXPECT_EQ(read_exact(*store, ns, b, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, b.bytes);
    EXPECT_EQ(read_exact(*store, ns, a), DiskReadError::ChecksumMismatch);
    EXPECT_EQ(store->stats().quarantines, 1u);  // b does not use the bad file
    store.reset();
    store = open_ok(quiet_options(tmp.path()));
    EXPECT_EQ(read_exact(*store, ns, b, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, b.bytes);
    EXPECT_EQ(count_files(tmp.sub("blocks")), 1u);
}

TEST(DiskStoreFaults, TruncatedOversizedAndMissingBlocksAtRead) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    auto store = open_ok(quiet_options(tmp.path()));
    const PrefixPayload t = prefix_payload(ns, 10, 64);
    const PrefixPayload o = prefix_payload(ns, 11, 64);
    const PrefixPayload m = prefix_payload(ns, 12, 64);
    write_all(*store, ns, {t, o, m});
    truncate_to(store->debug_files(ns, t.tokens)->blocks[0], 100);
    truncate_to(store->debug_files(ns, o.tokens)->blocks[0], 5000);
    fs::remove(store->debug_files(ns, m.tokens)->blocks[0]);
    EXPECT_EQ(read_exact(*store, ns, t), DiskReadError::Truncated);
    EXPECT_EQ(read_exact(*store, ns, o), DiskReadError::SizeMismatch);
    EXPECT_EQ(read_exact(*store, ns, m), DiskReadError::MissingBlock);
    EXPECT_EQ(store->stats().quarantines, 3u);
    EXPECT_EQ(store->stats().entries, 0u);
    store->flush();
    EXPECT_EQ(count_files(tmp.path()), 0u);
    EXPECT_EQ(store->debug_check(), std::nullopt);
}

TEST(DiskStoreFaults, BadBlocksFoundByTheStartupSweep) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    const PrefixPayload t = prefix_payload(ns, 20, 64);
    const PrefixPayload m = prefix_payload(ns, 21, 128);
    const PrefixPayload ok = prefix_payload(ns, 22, 64);
    {
        auto store = open_ok(quiet_options(tmp.path()));
        write_all(*store, ns, {t, m, ok});
        truncate_to(store->debug_files(ns, t.tokens)->blocks[0], 0);
        fs::remove(store->debug_files(ns, m.tokens)->blocks[1]);
    }
    std::vector<std::string> log;
    auto store = open_ok(quiet_options(tmp.path(), &log));  // flushes the sweep
    const DiskStoreStats s = store->stats();
    EXPECT_EQ(s.entries, 1u);
    EXPECT_EQ(s.quarantines, 2u);
    EXPECT_EQ(log.size(), 1u);
    EXPECT_EQ(read_exact(*store, ns, t), DiskReadError::NotFound);
    EXPECT_EQ(read_exact(*store, ns, m), DiskReadError::NotFound);
    EXPECT_EQ(read_exact(*store, ns, ok), DiskReadError::None);
    EXPECT_EQ(count_files(tmp.sub("manifests")), 1u);
    EXPECT_EQ(count_files(tmp.sub("blocks")), 1u);
}

TEST(DiskStoreFaults, CorruptAndTruncatedManifestsAreRejectedAtStartup) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    const PrefixPayload flipped = prefix_payload(ns, 30, 64);
    const PrefixPayload cut = prefix_payload(ns, 31, 64);
    const PrefixPayload ok = prefix_payload(ns, 32, 64);
    {
        auto store = open_ok(quiet_options(tmp.path()));
        write_all(*store, ns, {flipped, cut, ok});
        flip_byte(store->debug_files(ns, flipped.tokens)->manifest, 60);
        const std::string path = store->debug_files(ns, cut.tokens)->manifest;
        truncate_to(path, fs::file_size(path) - 1);
        write_file(tmp.sub("manifests/00000000000000aa.m"), {});  // empty
    }
    auto store = open_ok(quiet_options(tmp.path()));
    const DiskStoreStats s = store->stats();
    EXPECT_EQ(s.rejected_manifests, 3u);
    EXPECT_EQ(s.entries, 1u);
    EXPECT_EQ(s.orphan_blocks_removed, 2u);
    EXPECT_EQ(count_files(tmp.sub("manifests")), 1u);
    EXPECT_EQ(read_exact(*store, ns, ok), DiskReadError::None);
}

// Every write step failing once with EIO: the write is rolled back completely and the
// entries already there (sharing blocks with it) are untouched.
TEST(DiskStoreFaults, InjectedErrorAtEveryWriteStepRollsBack) {
    const NamespaceId ns = test_namespace();
    const PrefixPayload base = prefix_payload(ns, 40, 128);
    const PrefixPayload longer = prefix_payload(ns, 40, 256);
    for (DiskIoStep fail_at :
         {DiskIoStep::BlockWrite, DiskIoStep::BlockSync, DiskIoStep::BlockRename,
          DiskIoStep::BlockDirSync, DiskIoStep::ManifestWrite, DiskIoStep::ManifestSync,
          DiskIoStep::ManifestRename, DiskIoStep::ManifestDirSync}) {
        SCOPED_TRACE(to_string(fail_at));
        TempDir tmp;
        bool armed = false;
        DiskStoreOptions o = quiet_options(tmp.path());
        o.debug_io_hook = [&](DiskIoStep s) {
            if (armed && s == fail_at) {
                armed = false;
                return EIO;
            }
            return 0;
        };
        auto store = open_ok(o);
        write_all(*store, ns, {base});
        armed = true;
        ASSERT_EQ(submit(*store, ns, longer), DiskSubmit::Queued);
        store->flush();
        DiskStoreStats s = store->stats();
        EXPECT_EQ(s.write_failures, 1u);
        EXPECT_EQ(s.io_errors, 1u);
        EXPECT_EQ(s.mode, DiskMode::ReadWrite);
        EXPECT_EQ(s.entries, 1u);
        EXPECT_EQ(count_files(tmp.sub("blocks")), 2u);
        EXPECT_EQ(count_files(tmp.sub("manifests")), 1u);
        EXPECT_EQ(store->debug_check(), std::nullopt);
        EXPECT_EQ(read_exact(*store, ns, base), DiskReadError::None);
        // And the next attempt succeeds.
        ASSERT_EQ(submit(*store, ns, longer), DiskSubmit::Queued);
        store->flush();
        EXPECT_EQ(read_exact(*store, ns, longer), DiskReadError::None);
    }
}

TEST(DiskStoreFaults, NoSpaceSkipsWritesAndKeepsWriting) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    std::vector<std::string> log;
    int fail_next = 0;
    DiskStoreOptions o = quiet_options(tmp.path(), &log);
    o.debug_io_hook = [&](DiskIoStep s) {
        if (fail_next > 0 && s == DiskIoStep::BlockWrite) {
            --fail_next;
            return ENOSPC;
        }
        return 0;
    };
    auto store = open_ok(o);
    fail_next = 20;
    for (uint64_t i = 0; i < 10; ++i) {  // more than 8 in a row: still not read-only
        ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 50 + i, 64)), DiskSubmit::Queued);
        store->flush();
    }
    DiskStoreStats s = store->stats();
    EXPECT_EQ(s.no_space_errors, 10u);
    EXPECT_EQ(s.write_failures, 10u);
    EXPECT_EQ(s.mode, DiskMode::ReadWrite);
    EXPECT_EQ(log.size(), 1u) << "logged once";
    fail_next = 0;
    ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 60, 64)), DiskSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().writes, 1u);
    EXPECT_EQ(count_files(tmp.path()), 2u);
}

TEST(DiskStoreFaults, RepeatedIoErrorsOrReadOnlyErrorDegradeToReadOnly) {
    const NamespaceId ns = test_namespace();
    const PrefixPayload kept = prefix_payload(ns, 70, 64);
    for (int err : {EIO, EROFS, EACCES}) {
        SCOPED_TRACE(err);
        TempDir tmp;
        bool fail = false;
        std::vector<std::string> log;
        DiskStoreOptions o = quiet_options(tmp.path(), &log);
        o.debug_io_hook = [&](DiskIoStep s) {
            return fail && s == DiskIoStep::ManifestWrite ? err : 0;
        };
        auto store = open_ok(o);
        write_all(*store, ns, {kept});
        fail = true;
        const int attempts = err == EIO ? 8 : 1;
        for (int i = 0; i < attempts; ++i) {
            EXPECT_EQ(store->mode(), DiskMode::ReadWrite);
            ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 71 + static_cast<uint64_t>(i), 64)),
                      DiskSubmit::Queued);
            store->flush();
        }
        EXPECT_EQ(store->mode(), DiskMode::ReadOnly);
        EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 90, 64)), DiskSubmit::ReadOnly);
        EXPECT_EQ(read_exact(*store, ns, kept), DiskReadError::None);  // still served
        EXPECT_EQ(log.size(), 2u);  // the error, then "switching ... to read-only"
        EXPECT_EQ(count_files(tmp.path()), 2u);
    }
}

TEST(DiskStoreFaults, ReadErrorQuarantines) {
    TempDir tmp;
    const NamespaceId ns = test_namespace();
    bool fail = false;
    DiskStoreOptions o = quiet_options(tmp.path());
    o.debug_io_hook = [&](DiskIoStep s) { return fail && s == DiskIoStep::Read ? EIO : 0; };
    auto store = open_ok(o);
    const PrefixPayload p = prefix_payload(ns, 80, 64);
    write_all(*store, ns, {p});
    fail = true;
    EXPECT_EQ(read_exact(*store, ns, p), DiskReadError::Io);
    EXPECT_EQ(store->stats().io_errors, 1u);
    EXPECT_EQ(store->stats().quarantines, 1u);
    EXPECT_FALSE(store->peek_longest(ns, p.tokens));
}

// A small tmpfs mounted over a folder; ok() is false without the privilege to mount.
class TmpfsMount {
  public:
    TmpfsMount(const std::string& path, const std::string& size) : path_(path) {
        fs::create_directories(path);
        ok_ = ::mount("tmpfs", path.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    }
    ~TmpfsMount() {
        if (ok_) {
            ::umount2(path_.c_str(), MNT_DETACH);
        }
    }
    bool ok() const { return ok_; }
    bool remount(bool read_only) const {
        const unsigned long flags = MS_REMOUNT | (read_only ? MS_RDONLY : 0);
        return ::mount(nullptr, path_.c_str(), nullptr, flags, nullptr) == 0;
    }

  private:
    std::string path_;
    bool ok_ = false;
};

TEST(DiskStoreFaults, RealFullFilesystem) {
    TempDir tmp;
    TmpfsMount mnt(tmp.sub("mnt"), "256k");
    if (!mnt.ok()) {
        GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
    }
    const NamespaceId ns = test_namespace();
    const std::string dir = tmp.sub("mnt/cache");
    std::vector<PrefixPayload> written;
    {
        std::vector<std::string> log;
        auto store = open_ok(quiet_options(dir, &log));
        for (uint64_t i = 0; i < 24; ++i) {  // 24 x 16 KiB > 256 KiB
            const PrefixPayload p = prefix_payload(ns, 100 + i, 64, 16384);
            ASSERT_EQ(submit(*store, ns, p), DiskSubmit::Queued);
            store->flush();
            if (store->contains(ns, p.tokens, p.page)) {
                written.push_back(p);
            }
        }
        const DiskStoreStats s = store->stats();
        EXPECT_GT(s.no_space_errors, 0u);
        EXPECT_EQ(s.mode, DiskMode::ReadWrite);
        EXPECT_EQ(log.size(), 1u);
        EXPECT_EQ(count_files(dir, ".tmp"), 0u);
        for (const auto& p : written) {
            std::vector<uint8_t> bytes;
            EXPECT_EQ(read_exact(*store, ns, p, &bytes), DiskReadError::None);
            EXPECT_EQ(bytes, p.bytes);
        }
    }
    // With min_free_bytes, old entries are evicted to keep space free: every write lands.
    DiskStoreOptions o = quiet_options(dir);
    o.min_free_bytes = 64 * 1024;
    auto store = open_ok(o);
    for (uint64_t i = 0; i < 24; ++i) {
        ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 200 + i, 64, 16384)), DiskSubmit::Queued);
        store->flush();
    }
    const DiskStoreStats s = store->stats();
    EXPECT_EQ(s.writes, 24u);
    EXPECT_EQ(s.no_space_errors, 0u);
    EXPECT_GT(s.evictions, 0u);
    struct statvfs v {};
    ASSERT_EQ(::statvfs(dir.c_str(), &v), 0);
    EXPECT_GE(uint64_t{v.f_bavail} * v.f_frsize, 64u * 1024 - 16384);
}

TEST(DiskStoreFaults, RealReadOnlyFilesystem) {
    TempDir tmp;
    TmpfsMount mnt(tmp.sub("mnt"), "1m");
    if (!mnt.ok()) {
        GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
    }
    const NamespaceId ns = test_namespace();
    const std::string dir = tmp.sub("mnt/cache");
    const PrefixPayload a = prefix_payload(ns, 300, 128);
    const PrefixPayload b = prefix_payload(ns, 301, 64);
    {
        auto store = open_ok(quiet_options(dir));
        write_all(*store, ns, {a});
        ASSERT_TRUE(mnt.remount(true)) << std::strerror(errno);  // under a live store
        ASSERT_EQ(submit(*store, ns, b), DiskSubmit::Queued);
        store->flush();
        const DiskStoreStats s = store->stats();
        EXPECT_EQ(s.read_only_errors, 1u);
        EXPECT_EQ(s.mode, DiskMode::ReadOnly);
        EXPECT_EQ(read_exact(*store, ns, a), DiskReadError::None);
    }
    // Opening a folder on a read-only filesystem: read-only mode, entries served.
    DiskOpenResult r = DiskStore::open(quiet_options(dir));
    ASSERT_TRUE(r.store) << r.message;
    r.store->flush();
    EXPECT_EQ(r.store->mode(), DiskMode::ReadOnly);
    EXPECT_NE(r.message.find("read-only"), std::string::npos);
    std::vector<uint8_t> bytes;
    EXPECT_EQ(read_exact(*r.store, ns, a, &bytes), DiskReadError::None);
    EXPECT_EQ(bytes, a.bytes);
    EXPECT_EQ(submit(*r.store, ns, b), DiskSubmit::ReadOnly);
    r.store.reset();
    EXPECT_TRUE(mnt.remount(false));
}

// Runs `body` as an unprivileged user (root bypasses permission checks) in a child
// process; `body` returns "" or a description of what failed.
void run_unprivileged(const std::string& dir, const std::function<std::string()>& body) {
    if (::geteuid() != 0) {
        const std::string failure = body();
        EXPECT_EQ(failure, "");
        return;
    }
    constexpr uid_t kNobody = 65534;
    ASSERT_EQ(::chown(dir.c_str(), kNobody, kNobody), 0);
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(out[0]);
        std::string failure;
        if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
            failure = "cannot drop privileges";
        } else {
            failure = body();
        }
        [[maybe_unused]] ssize_t n = ::write(out[1], failure.data(), failure.size());
        ::_exit(0);
    }
    ::close(out[1]);
    std::string failure;
    char buf[256];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;) {
        failure.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(failure, "");
}

TEST(DiskStoreFaults, PermissionDenied) {
    TempDir tmp;
    const std::string dir = tmp.sub("cache");
    run_unprivileged(tmp.path(), [&]() -> std::string {
        const NamespaceId ns = test_namespace();
        const PrefixPayload a = prefix_payload(ns, 400, 64);
        const PrefixPayload b = prefix_payload(ns, 401, 64);
        const PrefixPayload c = prefix_payload(ns, 402, 64);
        DiskOpenResult r = DiskStore::open(quiet_options(dir));
        if (!r.store) {
            return "open: " + r.message;
        }
        DiskStore& store = *r.store;
        store.flush();
        for (const auto* p : {&a, &c}) {
            submit(store, ns, *p);
            store.flush();
        }
        ::chmod(store.debug_files(ns, c.tokens)->blocks[0].c_str(), 0);
        if (read_exact(store, ns, c) != DiskReadError::Io) {
            return "reading an unreadable block is not an I/O error";
        }
        if (store.peek_longest(ns, c.tokens)) {
            return "the unreadable entry is still served";
        }
        store.flush();  // its manifest is deleted before the folder becomes read-only
        ::chmod((dir + "/manifests").c_str(), 0500);
        submit(store, ns, b);
        store.flush();
        DiskStoreStats s = store.stats();
        if (s.permission_errors != 2 || s.mode != DiskMode::ReadOnly) {
            return "a write without permission did not degrade to read-only: " + s.last_error +
                   " permission_errors=" + std::to_string(s.permission_errors) +
                   " mode=" + to_string(s.mode);
        }
        std::vector<uint8_t> bytes;
        if (read_exact(store, ns, a, &bytes) != DiskReadError::None || bytes != a.bytes) {
            return "entries are not served after the store went read-only";
        }
        r.store.reset();
        // A folder that cannot be written at all opens read-only; one that cannot be
        // entered is unusable.
        r = DiskStore::open(quiet_options(dir));
        if (!r.store || r.store->mode() != DiskMode::ReadOnly) {
            return "a read-only folder did not open read-only: " + r.message;
        }
        r.store.reset();
        ::chmod(dir.c_str(), 0);
        r = DiskStore::open(quiet_options(dir));
        if (r.store || r.error != DiskOpenError::Unusable) {
            return "an inaccessible folder did not fail as unusable";
        }
        ::chmod(dir.c_str(), 0700);
        return "";
    });
}

}  // namespace
}  // namespace skippy::cache
