// DiskStore: public members, lookups, reads and the bookkeeping under mu_. Opening and
// reconciliation are in disk_store_open.cpp, the writer thread in disk_store_writer.cpp.
#include "cache/disk_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace skippy::cache {

using disk::BlockKey;
using disk::BlockRef;

const char* to_string(DiskMode mode) {
    switch (mode) {
        case DiskMode::ReadWrite:
            return "read_write";
        case DiskMode::ReadOnly:
            return "read_only";
    }
    return "?";
}

const char* to_string(DiskIoStep step) {
    switch (step) {
        case DiskIoStep::BlockWrite:
            return "block_write";
        case DiskIoStep::BlockSync:
            return "block_sync";
        case DiskIoStep::BlockRename:
            return "block_rename";
        case DiskIoStep::BlockDirSync:
            return "block_dir_sync";
        case DiskIoStep::ManifestWrite:
            return "manifest_write";
        case DiskIoStep::ManifestSync:
            return "manifest_sync";
        case DiskIoStep::ManifestRename:
            return "manifest_rename";
        case DiskIoStep::ManifestDirSync:
            return "manifest_dir_sync";
        case DiskIoStep::Unlink:
            return "unlink";
        case DiskIoStep::Read:
            return "read";
    }
    return "?";
}

const char* to_string(DiskSubmit s) {
    switch (s) {
        case DiskSubmit::Queued:
            return "queued";
        case DiskSubmit::AlreadyPresent:
            return "already_present";
        case DiskSubmit::AlreadyQueued:
            return "already_queued";
        case DiskSubmit::DroppedFull:
            return "dropped_full";
        case DiskSubmit::ReadOnly:
            return "read_only";
        case DiskSubmit::Invalid:
            return "invalid";
        case DiskSubmit::Stopped:
            return "stopped";
    }
    return "?";
}

const char* to_string(DiskReadError e) {
    switch (e) {
        case DiskReadError::None:
            return "none";
        case DiskReadError::NotFound:
            return "not_found";
        case DiskReadError::MissingBlock:
            return "missing_block";
        case DiskReadError::Truncated:
            return "truncated";
        case DiskReadError::SizeMismatch:
            return "size_mismatch";
        case DiskReadError::ChecksumMismatch:
            return "checksum_mismatch";
        case DiskReadError::Io:
            return "io_error";
    }
    return "?";
}

DiskStore::DiskStore(DiskStoreOptions options)
    : options_(std::move(options)),
      cutter_(BlockStoreOptions{.block_bytes = options_.block_bytes}) {}

DiskStore::~DiskStore() { close(true); }

void DiskStore::close(bool drain) {
    std::lock_guard close_lock(close_mu_);
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
        drain_ = drain;
    }
    work_cv_.notify_all();
    if (writer_.joinable()) {
        writer_.join();
    }
    lock_.reset();  // releases the flock
}

// ---- submit ------------------------------------------------------------------------------

DiskSubmit DiskStore::admission_locked(const NamespaceId& ns, std::span<const Token> tokens,
                                       PageId page, uint64_t bytes, const Hash128* key) const {
    if (stopping_) {
        return DiskSubmit::Stopped;
    }
    if (mode_ != DiskMode::ReadWrite) {
        return DiskSubmit::ReadOnly;
    }
    if (tokens.empty() || bytes == 0) {
        return DiskSubmit::Invalid;
    }
    if (auto id = index_.find(ComponentKind::Exact, ns, tokens)) {
        if (records_.at(*id).page == page) {
            return DiskSubmit::AlreadyPresent;
        }
    }
    const Hash128 k = key != nullptr ? *key : disk::entry_key(ns, tokens);
    if (queued_keys_.contains(k)) {
        return DiskSubmit::AlreadyQueued;
    }
    if (queue_.size() >= options_.queue_capacity ||
        (options_.max_queued_bytes != 0 &&
         counters_.queued_bytes + bytes > options_.max_queued_bytes)) {
        return DiskSubmit::DroppedFull;
    }
    return DiskSubmit::Queued;
}

DiskSubmit DiskStore::probe_write(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                                  uint64_t payload_bytes) const {
    std::lock_guard lock(mu_);
    return admission_locked(ns, tokens, page, payload_bytes, nullptr);
}

DiskSubmit DiskStore::submit_write(const NamespaceId& ns, std::span<const Token> tokens,
                                   PageId page, const PayloadDescriptor& descriptor,
                                   PayloadBytes bytes, std::vector<size_t> cuts) {
    return submit_job(ns, tokens, page, descriptor, std::move(bytes), std::nullopt,
                      std::move(cuts));
}

DiskSubmit DiskStore::submit_write(const NamespaceId& ns, std::span<const Token> tokens,
                                   PageId page, const PayloadDescriptor& descriptor,
                                   PayloadSnapshot snapshot, std::vector<size_t> cuts) {
    return submit_job(ns, tokens, page, descriptor, PayloadBytes(), std::move(snapshot),
                      std::move(cuts));
}

DiskSubmit DiskStore::submit_job(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                                 const PayloadDescriptor& descriptor, PayloadBytes bytes,
                                 std::optional<PayloadSnapshot> snapshot,
                                 std::vector<size_t> cuts) {
    const uint64_t size = snapshot ? snapshot->size() : bytes.size();
    const bool valid = !tokens.empty() && descriptor.token_end == tokens.size() &&
                       !descriptor.validate_against(size).has_value();
    const Hash128 key = disk::entry_key(ns, tokens);
    std::lock_guard lock(mu_);
    DiskSubmit s = admission_locked(ns, tokens, page, size, &key);
    if (s == DiskSubmit::Queued && !valid) {
        s = DiskSubmit::Invalid;
    }
    if (s == DiskSubmit::DroppedFull) {
        ++counters_.dropped_full;
    }
    if (s != DiskSubmit::Queued) {
        return s;
    }
    WriteJob job{ns,
                 std::vector<Token>(tokens.begin(), tokens.end()),
                 page,
                 descriptor,
                 std::move(bytes),
                 std::move(cuts),
                 key,
                 std::chrono::steady_clock::now(),
                 std::move(snapshot)};
    counters_.queued_bytes += job.size();
    queue_.push_back(std::move(job));
    queued_keys_.insert(key);
    ++counters_.submitted;
    work_cv_.notify_one();
    return s;
}

DiskSubmit DiskStore::submit_write(const NamespaceId& ns, std::span<const Token> tokens,
                                   PageId page, const PayloadDescriptor& descriptor,
                                   std::vector<uint8_t> bytes, std::vector<size_t> cuts) {
    auto holder = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    const size_t size = holder->size();
    std::shared_ptr<const uint8_t[]> owner(holder, holder->data());
    return submit_write(ns, tokens, page, descriptor, PayloadBytes(std::move(owner), size, false),
                        std::move(cuts));
}

// ---- lookups ------------------------------------------------------------------------------

std::optional<DiskHit> DiskStore::acquire_locked(EntryId entry, size_t len) {
    if (!index_.acquire_raw(entry)) {
        ++counters_.misses;
        return std::nullopt;
    }
    ++counters_.hits;
    Record& rec = records_.at(entry);
    ++rec.hits;
    rec.last_hit_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    DiskHit hit;
    hit.lease = Lease(this, entry);
    hit.page = rec.page;
    hit.len = len;
    hit.tokens = index_.tokens_of(entry);
    hit.descriptor = rec.descriptor;
    hit.payload_bytes = rec.descriptor.payload_bytes;
    return hit;
}

std::optional<DiskHit> DiskStore::acquire_longest(const NamespaceId& ns,
                                                  std::span<const Token> query, PrefixMatch match) {
    std::lock_guard lock(mu_);
    auto m = index_.lookup_exact(ns, query, match);
    if (!m) {
        ++counters_.misses;
        return std::nullopt;
    }
    return acquire_locked(m->entry, m->matched_len);
}

std::optional<DiskPeek> DiskStore::peek_longest(const NamespaceId& ns, std::span<const Token> query,
                                                PrefixMatch match) const {
    std::lock_guard lock(mu_);
    auto m = index_.peek_exact(ns, query, match);
    if (!m) {
        return std::nullopt;
    }
    const Record& rec = records_.at(m->entry);
    return DiskPeek{rec.page, m->matched_len, rec.descriptor, rec.descriptor.payload_bytes};
}

bool DiskStore::contains(const NamespaceId& ns, std::span<const Token> tokens, PageId page) const {
    std::lock_guard lock(mu_);
    auto id = index_.find(ComponentKind::Exact, ns, tokens);
    return id && records_.at(*id).page == page;
}

// ---- reads --------------------------------------------------------------------------------

DiskReadError DiskStore::read_entry(const Lease& lease,
                                    const std::function<std::span<uint8_t>(size_t)>& alloc,
                                    std::string* detail) {
    std::vector<BlockRef> blocks;
    uint64_t size = 0;
    uint64_t seq = 0;
    {
        std::lock_guard lock(mu_);
        auto info = lease.owner() == this ? index_.info(lease.entry()) : std::nullopt;
        if (!info || info->doomed || info->leases == 0) {
            return DiskReadError::NotFound;
        }
        const Record& rec = records_.at(lease.entry());
        blocks = rec.blocks;
        size = rec.descriptor.payload_bytes;
        seq = rec.seq;
    }
    std::span<uint8_t> out = alloc(static_cast<size_t>(size));
    DiskReadError error = DiskReadError::None;
    std::string why;
    int io_err = 0;
    const BlockRef* bad = nullptr;
    uint64_t off = 0;
    for (const BlockRef& b : blocks) {
        const std::string path =
            disk::block_dir_name(b.key.hash) + "/" + disk::block_file_name(b.key);
        bad = &b;
        if ((io_err = step(DiskIoStep::Read)) != 0) {
            error = DiskReadError::Io;
            why = path + ": " + disk::errno_text(io_err);
            break;
        }
        disk::Fd fd(::openat(blocks_dir_.get(), path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd.valid()) {
            io_err = errno;
            error = io_err == ENOENT ? DiskReadError::MissingBlock : DiskReadError::Io;
            why = path + ": " + disk::errno_text(io_err);
            break;
        }
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0) {
            io_err = errno;
            error = DiskReadError::Io;
            why = path + ": " + disk::errno_text(io_err);
            break;
        }
        if (static_cast<uint64_t>(st.st_size) != b.size) {
            error = static_cast<uint64_t>(st.st_size) < b.size ? DiskReadError::Truncated
                                                               : DiskReadError::SizeMismatch;
            why = path + ": " + std::to_string(st.st_size) + " bytes, expected " +
                  std::to_string(b.size);
            io_err = 0;
            break;
        }
        const std::span<uint8_t> dst = out.subspan(off, b.size);
        bool short_read = false;
        if ((io_err = disk::pread_exact(fd.get(), dst, 0, &short_read)) != 0 || short_read) {
            error = short_read ? DiskReadError::Truncated : DiskReadError::Io;
            why = path + ": " + (short_read ? std::string("short read") : disk::errno_text(io_err));
            break;
        }
        if (xxh3_128(dst) != b.key.hash) {
            error = DiskReadError::ChecksumMismatch;
            why = path + ": checksum mismatch";
            break;
        }
        off += b.size;
    }
    std::vector<std::string> logs;
    {
        std::lock_guard lock(mu_);
        if (error == DiskReadError::None) {
            ++counters_.reads;
            counters_.read_bytes += size;
        } else {
            ++counters_.read_failures;
            if (io_err != 0) {
                note_fault_locked(io_err, false, "read " + why, logs);
            } else if ((reported_ & (1u << static_cast<unsigned>(Fault::Corrupt))) == 0) {
                reported_ |= 1u << static_cast<unsigned>(Fault::Corrupt);
                logs.push_back("corrupt entry quarantined (" + why + ")");
            }
            counters_.last_error = why;
            // Out of descriptors or memory says nothing about the stored bytes: the entry
            // stays (the caller falls back to prefill this time).
            const bool transient =
                io_err == EMFILE || io_err == ENFILE || io_err == ENOMEM || io_err == EAGAIN;
            if (!transient) {
                if (auto info = index_.info(lease.entry()); info && !info->doomed) {
                    ghosts_.add(info->ns, index_.tokens_of(lease.entry()), GhostCause::Quarantined);
                }
                hide_entry_locked(lease.entry());
                ++counters_.quarantines;
                counters_.quarantines += quarantine_block_locked(bad->key);
            }
        }
    }
    emit(logs);
    if (error == DiskReadError::None && mode() == DiskMode::ReadWrite) {
        // Recency for the next start-up; best effort (mtime of the manifest).
        // The current real time, not the filesystem's coarser clock: a read is then newer
        // than every write before it.
        const std::string name = disk::manifest_file_name(seq);
        struct timespec now[2];
        ::clock_gettime(CLOCK_REALTIME, &now[0]);
        now[1] = now[0];
        ::utimensat(manifests_dir_.get(), name.c_str(), now, 0);
    }
    if (detail != nullptr) {
        *detail = why;
    }
    return error;
}

DiskReadResult DiskStore::read(const Lease& lease) {
    const auto t0 = std::chrono::steady_clock::now();
    DiskReadResult r;
    std::shared_ptr<uint8_t[]> buffer;
    size_t size = 0;
    r.error = read_entry(
        lease,
        [&](size_t n) {
            buffer = std::make_shared_for_overwrite<uint8_t[]>(n);
            size = n;
            return std::span<uint8_t>(buffer.get(), n);
        },
        &r.detail);
    if (r.ok()) {
        r.bytes = PayloadBytes(std::move(buffer), size, false);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

DiskReadError DiskStore::read_into(const Lease& lease, std::vector<uint8_t>& out,
                                   std::string* detail) {
    return read_entry(
        lease,
        [&](size_t n) {
            out.resize(n);
            return std::span<uint8_t>(out);
        },
        detail);
}

// ---- removal ------------------------------------------------------------------------------

bool DiskStore::remove(const NamespaceId& ns, std::span<const Token> tokens) {
    std::lock_guard lock(mu_);
    auto id = index_.find(ComponentKind::Exact, ns, tokens);
    if (!id) {
        return false;
    }
    hide_entry_locked(*id);
    ++counters_.removals;
    return true;
}

QuarantineStatus DiskStore::quarantine(const NamespaceId& ns, std::span<const Token> tokens,
                                       PageId page) {
    std::lock_guard lock(mu_);
    auto id = index_.find(ComponentKind::Exact, ns, tokens);
    if (!id) {
        return QuarantineStatus::NotFound;
    }
    if (records_.at(*id).page != page) {
        return QuarantineStatus::PageMismatch;
    }
    ghosts_.add(ns, tokens, GhostCause::Quarantined);
    ++counters_.quarantines;
    return hide_entry_locked(*id) ? QuarantineStatus::Removed : QuarantineStatus::Deferred;
}

void DiskStore::release_lease(EntryId entry) noexcept {
    std::lock_guard lock(mu_);
    if (auto removed = index_.release_raw(entry)) {
        free_record_locked(removed->entry);
        --hidden_entries_;
    }
}

bool DiskStore::hide_entry_locked(EntryId entry) {
    RemoveResult r = index_.remove(entry, LeasedRemoval::Defer);
    if (r.status == RemoveStatus::Removed) {
        free_record_locked(entry);
        return true;
    }
    if (r.status == RemoveStatus::Deferred) {
        ++hidden_entries_;
    }
    return false;
}

size_t DiskStore::quarantine_block_locked(const BlockKey& key) {
    std::vector<EntryId> users;
    for (const auto& [id, rec] : records_) {
        for (const BlockRef& b : rec.blocks) {
            if (b.key == key) {
                auto info = index_.info(id);
                if (info && !info->doomed) {
                    users.push_back(id);
                }
                break;
            }
        }
    }
    for (EntryId id : users) {
        hide_entry_locked(id);
    }
    return users.size();
}

void DiskStore::ref_block_locked(const BlockKey& key, uint64_t size, uint32_t n) {
    auto [it, inserted] = blocks_.try_emplace(key, BlockInfo{size, 0});
    if (inserted) {
        all_block_bytes_ += size;
    }
    if (it->second.refs == 0) {
        live_block_bytes_ += it->second.size;
    }
    it->second.refs += n;
}

void DiskStore::unref_block_locked(const BlockKey& key, uint32_t n) {
    BlockInfo& b = blocks_.at(key);
    b.refs -= n;
    if (b.refs == 0) {
        live_block_bytes_ -= b.size;
        dead_blocks_.push_back(key);
    }
}

void DiskStore::free_record_locked(EntryId entry) {
    auto it = records_.find(entry);
    if (it == records_.end()) {
        return;
    }
    for (const BlockRef& b : it->second.blocks) {
        unref_block_locked(b.key, 1);
    }
    dead_manifests_.push_back(it->second.seq);
    manifest_bytes_ -= it->second.manifest_bytes;
    logical_bytes_ -= it->second.descriptor.payload_bytes;
    records_.erase(it);
    work_cv_.notify_one();
}

bool DiskStore::make_room_locked(uint64_t needed) {
    if (options_.max_bytes != 0 && needed > options_.max_bytes) {
        return false;
    }
    for (;;) {
        const bool over_bytes = options_.max_bytes != 0 &&
                                live_block_bytes_ + manifest_bytes_ + needed > options_.max_bytes;
        const bool over_entries =
            options_.max_entries != 0 && needed != 0 && records_.size() >= options_.max_entries;
        const bool over_entries_now =
            options_.max_entries != 0 && records_.size() > options_.max_entries;
        if (!over_bytes && !over_entries && !over_entries_now) {
            return true;
        }
        if (auto next = index_.lru_victim(ComponentKind::Exact)) {
            ghosts_.add(next->ns, index_.tokens_of(next->entry), GhostCause::Evicted);
        }
        auto victim = index_.evict_lru(ComponentKind::Exact);
        if (!victim) {
            return false;
        }
        free_record_locked(victim->entry);
        ++counters_.evictions;
    }
}

// ---- faults -------------------------------------------------------------------------------

void DiskStore::note_fault_locked(int err, bool writing, const std::string& what,
                                  std::vector<std::string>& logs) {
    Fault fault = Fault::Io;
    if (err == ENOSPC || err == EDQUOT) {
        fault = Fault::NoSpace;
        ++counters_.no_space_errors;
    } else if (err == EROFS) {
        fault = Fault::ReadOnlyFs;
        ++counters_.read_only_errors;
    } else if (err == EACCES || err == EPERM) {
        fault = Fault::Permission;
        ++counters_.permission_errors;
    } else {
        ++counters_.io_errors;
    }
    counters_.last_error = what + ": " + disk::errno_text(err);
    const uint32_t bit = 1u << static_cast<unsigned>(fault);
    if ((reported_ & bit) == 0) {
        reported_ |= bit;
        logs.push_back(counters_.last_error + (fault == Fault::NoSpace
                                                   ? " (writes are skipped until space frees up)"
                                                   : ""));
    }
    if (!writing) {
        return;
    }
    ++failed_writes_in_a_row_;
    const bool fatal = fault == Fault::ReadOnlyFs || fault == Fault::Permission ||
                       (fault == Fault::Io && failed_writes_in_a_row_ >= 8);
    if (fatal && mode_ == DiskMode::ReadWrite) {
        mode_ = DiskMode::ReadOnly;
        logs.push_back("switching " + options_.dir +
                       " to read-only: entries on disk are still served, nothing is written");
    }
}

void DiskStore::emit(std::vector<std::string>& logs) const {
    for (const std::string& line : logs) {
        if (options_.log) {
            options_.log(line);
        } else {
            std::fprintf(stderr, "skippy: disk cache: %s\n", line.c_str());
        }
    }
    logs.clear();
}

// ---- introspection ------------------------------------------------------------------------

DiskMode DiskStore::mode() const {
    std::lock_guard lock(mu_);
    return mode_;
}

DiskStoreStats DiskStore::stats() const {
    std::lock_guard lock(mu_);
    DiskStoreStats s = counters_;
    s.mode = mode_;
    s.entries = records_.size() - hidden_entries_;
    s.hidden_entries = hidden_entries_;
    s.leased_entries = index_.leased_count(ComponentKind::Exact);
    s.blocks = blocks_.size();
    s.block_bytes = all_block_bytes_;
    s.manifest_bytes = manifest_bytes_;
    s.disk_bytes = all_block_bytes_ + manifest_bytes_;
    s.logical_bytes = logical_bytes_;
    s.queue_depth = queued_keys_.size();  // queued + running
    return s;
}

void DiskStore::flush() {
    std::unique_lock lock(mu_);
    ++flushers_;
    work_cv_.notify_all();
    idle_cv_.wait(lock, [&] {
        return (!busy_ && queue_.empty() && dead_manifests_.empty() && dead_blocks_.empty() &&
                !sweep_pending_) ||
               writer_done_;
    });
    --flushers_;
}

void DiskStore::set_foreground_busy(bool busy) {
    std::lock_guard lock(mu_);
    if (foreground_busy_ != busy) {
        foreground_busy_ = busy;
        if (!busy) {
            foreground_idle_since_ = std::chrono::steady_clock::now();
        }
        work_cv_.notify_all();
    }
}

std::optional<DiskStore::DebugFiles> DiskStore::debug_files(const NamespaceId& ns,
                                                            std::span<const Token> tokens) const {
    std::lock_guard lock(mu_);
    auto id = index_.find(ComponentKind::Exact, ns, tokens);
    if (!id) {
        return std::nullopt;
    }
    const Record& rec = records_.at(*id);
    DebugFiles f;
    f.manifest = options_.dir + "/manifests/" + disk::manifest_file_name(rec.seq);
    for (const BlockRef& b : rec.blocks) {
        f.blocks.push_back(options_.dir + "/blocks/" + disk::block_dir_name(b.key.hash) + "/" +
                           disk::block_file_name(b.key));
    }
    return f;
}

std::vector<DiskEntrySummary> DiskStore::list_entries(const NamespaceId* only) const {
    std::lock_guard lock(mu_);
    std::vector<DiskEntrySummary> out;
    for (const EntryInfo& info : index_.entries(ComponentKind::Exact)) {
        if (info.doomed || (only != nullptr && !(info.ns == *only))) {
            continue;
        }
        auto it = records_.find(info.entry);
        if (it == records_.end()) {
            continue;
        }
        out.push_back(DiskEntrySummary{info.ns, it->second.page, info.token_count,
                                       it->second.descriptor.payload_bytes, it->second.hits,
                                       it->second.last_hit_unix_ms});
    }
    std::sort(out.begin(), out.end(), [](const DiskEntrySummary& a, const DiskEntrySummary& b) {
        return a.tokens > b.tokens;
    });
    return out;
}

size_t DiskStore::remove_namespace(const NamespaceId& ns) {
    std::lock_guard lock(mu_);
    if (mode_ == DiskMode::ReadOnly) {
        return 0;
    }
    std::vector<EntryId> ids;
    for (const EntryInfo& info : index_.entries(ComponentKind::Exact)) {
        if (!info.doomed && info.ns == ns) {
            ids.push_back(info.entry);
        }
    }
    for (EntryId id : ids) {
        hide_entry_locked(id);
        ++counters_.removals;
    }
    return ids.size();
}

std::optional<GhostMatch> DiskStore::forgotten_longest(const NamespaceId& ns,
                                                       std::span<const Token> query,
                                                       size_t min_len) const {
    std::lock_guard lock(mu_);
    return ghosts_.longest(ns, query, min_len);
}

size_t DiskStore::longest_elsewhere(const NamespaceId& ns, std::span<const Token> query,
                                    size_t max_namespaces) const {
    std::lock_guard lock(mu_);
    return index_.longest_elsewhere(ns, query, max_namespaces);
}

std::vector<DiskStore::DebugEntry> DiskStore::debug_entries() const {
    std::lock_guard lock(mu_);
    std::vector<DebugEntry> out;
    for (const EntryInfo& e : index_.entries(ComponentKind::Exact)) {
        if (!e.doomed) {
            out.push_back({e.ns, index_.tokens_of(e.entry), records_.at(e.entry).page});
        }
    }
    return out;
}

std::optional<std::string> DiskStore::debug_check() const {
    std::lock_guard lock(mu_);
    if (auto bad = index_.check_invariants()) {
        return "index: " + *bad;
    }
    std::unordered_map<BlockKey, uint32_t, disk::BlockKeyHash> refs;
    uint64_t manifests = 0;
    uint64_t logical = 0;
    for (const auto& [id, rec] : records_) {
        if (!index_.info(id)) {
            return "record without index entry";
        }
        for (const BlockRef& b : rec.blocks) {
            ++refs[b.key];
        }
        manifests += rec.manifest_bytes;
        logical += rec.descriptor.payload_bytes;
    }
    if (records_.size() != index_.size(ComponentKind::Exact)) {
        return "index and records differ in size";
    }
    uint64_t live = 0;
    uint64_t all = 0;
    for (const auto& [key, b] : blocks_) {
        const uint32_t expect = refs.contains(key) ? refs.at(key) : 0;
        if (b.refs != expect) {
            return "refcount of " + disk::block_file_name(key) + " is " + std::to_string(b.refs) +
                   ", entries hold " + std::to_string(expect);
        }
        all += b.size;
        live += b.refs > 0 ? b.size : 0;
    }
    for (const auto& [key, n] : refs) {
        if (!blocks_.contains(key)) {
            return "entry references unknown block";
        }
    }
    if (live != live_block_bytes_ || all != all_block_bytes_ || manifests != manifest_bytes_ ||
        logical != logical_bytes_) {
        return "byte counters differ from the tables";
    }
    return std::nullopt;
}

}  // namespace skippy::cache
