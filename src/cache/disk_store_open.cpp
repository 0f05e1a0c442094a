// DiskStore::open: folder, lock, mode, and the synchronous part of start-up
// reconciliation (manifests -> index and block refcounts). See disk_store.h.
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <system_error>
#include <thread>
#include <tuple>

#include "cache/disk_store.h"

namespace skippy::cache {
namespace {

constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
// Extra threads reading manifests at start-up (cold reads are latency-bound).
constexpr size_t kLoadThreads = 7;

bool ends_with(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

// True if a file can be created in the folder (false with the errno for EROFS/EACCES...).
bool can_create_in(int dirfd, int* err) {
    const char* probe = ".probe.tmp";
    const int fd = ::openat(dirfd, probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        *err = errno;
        return false;
    }
    ::close(fd);
    ::unlinkat(dirfd, probe, 0);
    return true;
}

std::string read_lock_owner(int fd) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) {
        pid.pop_back();
    }
    return pid.empty() ? std::string("unknown") : pid;
}

}  // namespace

DiskOpenResult DiskStore::open(DiskStoreOptions options) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<DiskStore> store(new DiskStore(std::move(options)));
    DiskOpenResult r = store->open_folder();
    if (r.error != DiskOpenError::None) {
        return r;
    }
    store->load_manifests();
    store->counters_.reconcile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    DiskStore* s = store.get();
    store->writer_ = std::thread([s] { s->writer_loop(); });
    r.store = std::move(store);
    return r;
}

DiskOpenResult DiskStore::open_folder() {
    DiskOpenResult r;
    const std::string& dir = options_.dir;
    auto unusable = [&](const std::string& what, int err) {
        r.error = DiskOpenError::Unusable;
        r.message = "disk cache disabled: " + what + " " + dir + ": " + disk::errno_text(err);
        return std::move(r);
    };
    if (dir.empty()) {
        r.error = DiskOpenError::Unusable;
        r.message = "disk cache disabled: no folder given";
        return r;
    }
    std::error_code ec;
    const std::filesystem::path path(dir);
    if (path.has_parent_path()) {
        std::filesystem::create_directories(path.parent_path(), ec);  // mkdir reports errors
    }
    bool created = false;
    int err = 0;
    root_ = disk::make_dir(AT_FDCWD, dir, 0700, &created, &err);
    if (!root_.valid()) {
        return unusable("cannot create or open", err);
    }
    struct stat st {};
    if (::fstat(root_.get(), &st) == 0 && (st.st_mode & 077) != 0 && st.st_uid == ::geteuid()) {
        ::fchmod(root_.get(), 0700);  // tenants' state: owner only (best effort)
    }

    // Lock first: nothing below may run while another store owns the folder. The lock is
    // held through a read-only descriptor (flock does not need write access), so that no
    // file stays open for writing between writes (a filesystem can then be remounted
    // read-only under a live store, which degrades to ReadOnly at its next write).
    bool writable = true;
    std::string read_only_why;
    {
        const int create = ::openat(root_.get(), "LOCK", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (create >= 0) {
            ::close(create);
        } else if (errno == EROFS || errno == EACCES || errno == EPERM) {
            writable = false;
            read_only_why = "LOCK: " + disk::errno_text(errno);
        } else {
            return unusable("cannot create the lock file in", errno);
        }
    }
    lock_.reset(::openat(root_.get(), "LOCK", O_RDONLY | O_CLOEXEC));  // absent: no lock
    if (lock_.valid()) {
        if (::flock(lock_.get(), (writable ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
            err = errno;
            if (err == EWOULDBLOCK) {
                r.error = DiskOpenError::Locked;
                r.message = "disk cache folder " + dir +
                            " is in use by another skippy process (pid " +
                            read_lock_owner(lock_.get()) +
                            "); give each server its own --cache-dir or use --cache-disk off";
                lock_.reset();
                return r;
            }
            return unusable("cannot lock", err);
        }
        if (writable) {  // the owner's pid, for the message above (best effort)
            disk::Fd pid_fd(::openat(root_.get(), "LOCK", O_WRONLY | O_TRUNC | O_CLOEXEC));
            const std::string pid = std::to_string(::getpid()) + "\n";
            if (pid_fd.valid()) {
                [[maybe_unused]] ssize_t n = ::write(pid_fd.get(), pid.data(), pid.size());
            }
        }
    } else if (writable) {
        return unusable("cannot open the lock file in", errno);
    }

    blocks_dir_ = disk::make_dir(root_.get(), "blocks", 0700, &created, &err);
    if (!blocks_dir_.valid()) {
        return unusable("cannot open blocks/ in", err);
    }
    manifests_dir_ = disk::make_dir(root_.get(), "manifests", 0700, &created, &err);
    if (!manifests_dir_.valid()) {
        return unusable("cannot open manifests/ in", err);
    }
    if (writable && !can_create_in(manifests_dir_.get(), &err)) {
        writable = false;
        read_only_why = "manifests/: " + disk::errno_text(err);
    }
    if (writable && !can_create_in(blocks_dir_.get(), &err)) {
        writable = false;
        read_only_why = "blocks/: " + disk::errno_text(err);
    }
    if (writable && options_.sync) {
        disk::fsync_fd(root_.get());
    }
    mode_ = writable ? DiskMode::ReadWrite : DiskMode::ReadOnly;
    if (!writable) {
        r.message = "disk cache " + dir + " opened read-only (" + read_only_why +
                    "): entries are served, nothing is written";
        counters_.last_error = read_only_why;
    }
    return r;
}

void DiskStore::load_manifests() {
    struct Loaded {
        disk::Manifest m;
        std::string name;
        int64_t mtime_ns = 0;
        uint64_t file_bytes = 0;
        Hash128 key;
    };
    std::vector<std::string> names;
    std::vector<std::string> logs;
    if (int err = disk::list_dir(manifests_dir_.get(), names); err != 0) {
        std::lock_guard lock(mu_);
        note_fault_locked(err, false, "listing " + options_.dir + "/manifests", logs);
    }
    // Read and decode in parallel: on a cold disk each manifest costs a seek, and the
    // reads, not the decoding, are what keeps the first request waiting.
    struct Slot {
        std::optional<Loaded> loaded;
        std::string why;  // rejected if set
    };
    std::vector<std::string> candidates;
    uint64_t max_seq = 0;
    for (std::string& name : names) {
        if (ends_with(name, ".tmp")) {
            startup_junk_.push_back(std::move(name));
        } else if (auto seq = disk::parse_manifest_file_name(name)) {  // else: not ours
            max_seq = std::max(max_seq, *seq);
            candidates.push_back(std::move(name));
        }
    }
    std::vector<Slot> slots(candidates.size());
    std::atomic<size_t> next{0};
    auto load_some = [&] {
        std::vector<uint8_t> buf;
        for (size_t i; (i = next.fetch_add(1)) < candidates.size();) {
            const std::string& name = candidates[i];
            const uint64_t seq = *disk::parse_manifest_file_name(name);
            Slot& slot = slots[i];
            std::optional<disk::Manifest> m;
            struct stat st {};
            disk::Fd fd(::openat(manifests_dir_.get(), name.c_str(), O_RDONLY | O_CLOEXEC));
            if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
                slot.why = disk::errno_text(errno);
            } else if (static_cast<uint64_t>(st.st_size) > kMaxManifestBytes) {
                slot.why = "manifest too large";
            } else {
                buf.resize(static_cast<size_t>(st.st_size));
                bool short_read = false;
                if (int err = disk::pread_exact(fd.get(), buf, 0, &short_read); err != 0) {
                    slot.why = disk::errno_text(err);
                } else if (short_read) {
                    slot.why = "short read";
                } else {
                    m = disk::decode_manifest(buf, &slot.why);
                    if (m && m->seq != seq) {
                        m.reset();
                        slot.why = "sequence number differs from the file name";
                    }
                }
            }
            if (!m) {
                if (slot.why.empty()) {
                    slot.why = "unreadable";
                }
                continue;
            }
            Loaded l;
            l.key = disk::entry_key(m->ns, m->tokens);
            l.m = std::move(*m);
            l.name = name;
            l.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
            l.file_bytes = static_cast<uint64_t>(st.st_size);
            slot.loaded = std::move(l);
        }
    };
    const size_t n_threads = std::min<size_t>(kLoadThreads, candidates.size() / 64);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < n_threads; ++t) {
        try {
            threads.emplace_back(load_some);
        } catch (const std::system_error&) {
            break;  // fewer threads, same result
        }
    }
    load_some();
    for (std::thread& t : threads) {
        t.join();
    }
    std::vector<Loaded> loaded;
    loaded.reserve(slots.size());
    std::string first_rejection;
    uint64_t rejected = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
        if (slots[i].loaded) {
            loaded.push_back(std::move(*slots[i].loaded));
        } else {
            ++rejected;
            if (first_rejection.empty()) {
                first_rejection = candidates[i] + ": " + slots[i].why;
            }
            startup_junk_.push_back(std::move(candidates[i]));
        }
    }

    // The highest seq of a path wins (a replacement commits before the old one is deleted).
    std::unordered_map<Hash128, size_t, Hash128Hash> best;
    for (size_t i = 0; i < loaded.size(); ++i) {
        auto [it, inserted] = best.try_emplace(loaded[i].key, i);
        if (!inserted && loaded[it->second].m.seq < loaded[i].m.seq) {
            it->second = i;
        }
    }
    std::vector<size_t> keep;
    keep.reserve(best.size());
    uint64_t superseded = 0;
    for (size_t i = 0; i < loaded.size(); ++i) {
        if (best.at(loaded[i].key) == i) {
            keep.push_back(i);
        } else {
            ++superseded;
            startup_junk_.push_back(loaded[i].name);
        }
    }
    // Oldest first, so that the index's LRU order is the recency of the last run.
    std::sort(keep.begin(), keep.end(), [&](size_t a, size_t b) {
        return std::pair(loaded[a].mtime_ns, loaded[a].m.seq) <
               std::pair(loaded[b].mtime_ns, loaded[b].m.seq);
    });

    {
        std::lock_guard lock(mu_);
        next_seq_ = max_seq + 1;
        // Pass 1, oldest first: every manifest naming a block must agree on its size.
        std::vector<size_t> accepted;
        accepted.reserve(keep.size());
        for (size_t i : keep) {
            const Loaded& l = loaded[i];
            bool consistent = true;
            for (const disk::BlockRef& b : l.m.blocks) {
                auto it = blocks_.find(b.key);
                if (it != blocks_.end() && it->second.size != b.size) {
                    consistent = false;
                    break;
                }
            }
            if (!consistent) {
                ++rejected;
                if (first_rejection.empty()) {
                    first_rejection = l.name + ": block size disagrees with another manifest";
                }
                startup_junk_.push_back(l.name);
                continue;
            }
            for (const disk::BlockRef& b : l.m.blocks) {
                ref_block_locked(b.key, b.size, 1);
            }
            accepted.push_back(i);
        }
        // Pass 2, in token order: each path is then appended after its siblings in the
        // radix tree instead of shifting them (10k entries: ~3x faster).
        std::vector<size_t> by_path = accepted;
        std::sort(by_path.begin(), by_path.end(), [&](size_t a, size_t b) {
            return std::tie(loaded[a].m.ns, loaded[a].m.tokens) <
                   std::tie(loaded[b].m.ns, loaded[b].m.tokens);
        });
        std::vector<EntryId> entry_of(loaded.size(), kNoEntry);
        for (size_t i : by_path) {
            Loaded& l = loaded[i];
            InsertResult ins = index_.insert(ComponentKind::Exact, l.m.ns, l.m.tokens, l.m.seq);
            entry_of[i] = ins.entry;  // always Inserted: paths are unique here
            Record rec;
            rec.seq = l.m.seq;
            rec.page = l.m.page;
            rec.descriptor = std::move(l.m.descriptor);
            rec.blocks = std::move(l.m.blocks);
            rec.manifest_bytes = l.file_bytes;
            manifest_bytes_ += rec.manifest_bytes;
            logical_bytes_ += rec.descriptor.payload_bytes;
            records_.emplace(ins.entry, std::move(rec));
        }
        // Pass 3, oldest first: the LRU order of the last run.
        for (size_t i : accepted) {
            index_.touch(entry_of[i]);
        }
        counters_.rejected_manifests += rejected;
        counters_.superseded_manifests += superseded;
        if (rejected != 0) {
            counters_.last_error = first_rejection;
            reported_ |= 1u << static_cast<unsigned>(Fault::Corrupt);
            logs.push_back(std::to_string(rejected) + " manifest(s) rejected at start-up (first: " +
                           first_rejection + "); they are deleted");
        }
        if (mode_ != DiskMode::ReadWrite) {
            startup_junk_.clear();  // nothing is deleted from a read-only folder
        }
    }
    emit(logs);
}

}  // namespace skippy::cache
