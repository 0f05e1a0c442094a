// DiskStore's writer thread: the start-up sweep, durable writes, eviction to make room and
// file deletion. It is the only thread that creates or deletes files after open(), so
// block files cannot change under a write's plan; mu_ is taken for table updates only.
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "cache/disk_store.h"

namespace skippy::cache {

using disk::BlockKey;
using disk::BlockRef;

struct DiskStore::Planned {
    BlockKey key;
    const uint8_t* data = nullptr;  // first occurrence in the payload
    size_t size = 0;
    uint32_t uses = 0;  // occurrences in the payload
    bool is_new = true;
    bool written = false;              // renamed into place by this write
    std::vector<BlockKey> candidates;  // same hash and size already on disk
};

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
}

int hex_nibble(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    return -1;
}

}  // namespace

int DiskStore::step(DiskIoStep s) const {
    return options_.debug_io_hook ? options_.debug_io_hook(s) : 0;
}

int DiskStore::block_dir(unsigned index, int* err) {
    disk::Fd& fd = sub_dirs_[index];
    if (!fd.valid()) {
        char name[3];
        std::snprintf(name, sizeof(name), "%02x", index);
        bool created = false;
        fd = disk::make_dir(blocks_dir_.get(), name, 0700, &created, err);
        if (fd.valid() && created && options_.sync) {
            if ((*err = disk::fsync_fd(blocks_dir_.get())) != 0) {
                fd.reset();
            }
        }
    }
    return fd.get();
}

void DiskStore::writer_loop() {
    // Like the record worker: background work runs below the request path's priority.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
    pthread_setname_np(pthread_self(), "skippy-disk");  // (top -H, perf)
    std::unique_lock lock(mu_);
    for (;;) {
        work_cv_.wait(lock, [&] {
            return stopping_ || sweep_pending_ || !queue_.empty() || !dead_manifests_.empty() ||
                   !dead_blocks_.empty();
        });
        if (stopping_ && !drain_) {
            counters_.dropped_full += queue_.size();
            for (const WriteJob& j : queue_) {
                queued_keys_.erase(j.key);
            }
            queue_.clear();
            counters_.queued_bytes = 0;
            sweep_pending_ = false;
        }
        // Writes wait while requests compute, within bounds (see set_foreground_busy).
        const auto now = std::chrono::steady_clock::now();
        const bool settling = !foreground_busy_ && now - foreground_idle_since_ < kIdleGrace;
        if (!sweep_pending_ && dead_manifests_.empty() && dead_blocks_.empty() && !queue_.empty() &&
            (foreground_busy_ || settling) && flushers_ == 0 && !stopping_ &&
            queue_.size() < kMaxDeferredWrites) {
            auto deadline = queue_.front().queued_at + kMaxWriteDeferral;
            if (settling) {
                deadline = std::min(deadline, foreground_idle_since_ + kIdleGrace);
            }
            if (now < deadline) {
                work_cv_.wait_until(lock, deadline);
                continue;
            }
        }
        busy_ = true;
        if (sweep_pending_) {
            lock.unlock();
            sweep();
            lock.lock();
            sweep_pending_ = false;
        } else if (!dead_manifests_.empty() || !dead_blocks_.empty()) {
            lock.unlock();
            delete_dead();
            lock.lock();
        } else if (!queue_.empty()) {
            WriteJob job = std::move(queue_.front());
            queue_.pop_front();
            counters_.queued_bytes -= job.size();
            lock.unlock();
            // A RAM entry's blocks are written where they are when they are the blocks this
            // store cuts (the usual case), else joined into the writer's reused buffer (warm
            // pages); verified against the entry's checksum first.
            ReconstructError error = ReconstructError::None;
            const PreparedPayload prep =
                job.snapshot ? cutter_.prepare(*job.snapshot, job.cuts, write_buffer_, &error)
                             : cutter_.prepare(job.bytes.span(), job.cuts);
            if (error != ReconstructError::None) {
                std::lock_guard failed(mu_);
                ++counters_.write_failures;
                counters_.last_error = "write rejected: the queued payload did not reconstruct";
            } else {
                run_write(job, prep);
            }
            job.snapshot.reset();
            job.bytes = PayloadBytes();  // drop the payload before reporting idle
            if (write_buffer_.capacity() > kMaxKeptWriteBuffer) {
                std::vector<uint8_t>().swap(write_buffer_);  // an outsized one is not kept
            }
            lock.lock();
            queued_keys_.erase(job.key);
        } else if (stopping_) {
            break;
        }
        busy_ = false;
        idle_cv_.notify_all();
    }
    busy_ = false;
    writer_done_ = true;
    idle_cv_.notify_all();
}

void DiskStore::sweep() {
    const auto t0 = std::chrono::steady_clock::now();
    const bool rw = mode() == DiskMode::ReadWrite;
    std::vector<std::string> logs;
    uint64_t tmp_removed = 0;
    uint64_t orphans = 0;
    if (rw && !startup_junk_.empty()) {
        for (const std::string& name : startup_junk_) {
            if (step(DiskIoStep::Unlink) == 0 &&
                ::unlinkat(manifests_dir_.get(), name.c_str(), 0) == 0) {
                tmp_removed += ends_with(name, ".tmp") ? 1 : 0;
            }
        }
        if (options_.sync) {
            disk::fsync_fd(manifests_dir_.get());
        }
    }
    startup_junk_.clear();

    std::vector<std::string> subs;
    std::vector<std::string> files;
    std::unordered_set<BlockKey, disk::BlockKeyHash> seen;
    std::vector<BlockKey> bad;
    if (int err = disk::list_dir(blocks_dir_.get(), subs); err != 0) {
        std::lock_guard lock(mu_);
        note_fault_locked(err, false, "listing " + options_.dir + "/blocks", logs);
    }
    for (const std::string& sub : subs) {
        if (sub.size() != 2 || hex_nibble(sub[0]) < 0 || hex_nibble(sub[1]) < 0) {
            continue;
        }
        const unsigned index = static_cast<unsigned>(hex_nibble(sub[0]) * 16 + hex_nibble(sub[1]));
        int err = 0;
        disk::Fd& dir = sub_dirs_[index];
        if (!dir.valid()) {
            dir = disk::open_dir(blocks_dir_.get(), sub, &err);
        }
        if (!dir.valid() || disk::list_dir(dir.get(), files) != 0) {
            continue;  // unreadable: its blocks count as missing below
        }
        for (const std::string& f : files) {
            if (ends_with(f, ".tmp")) {
                if (rw && ::unlinkat(dir.get(), f.c_str(), 0) == 0) {
                    ++tmp_removed;
                }
                continue;
            }
            const std::optional<BlockKey> key = disk::parse_block_file_name(f);
            if (!key || disk::block_dir_index(key->hash) != index) {
                continue;  // not ours: left alone
            }
            uint64_t size = 0;
            bool known = false;
            {
                std::lock_guard lock(mu_);
                if (auto it = blocks_.find(*key); it != blocks_.end()) {
                    known = true;
                    size = it->second.size;
                }
            }
            if (!known) {
                if (rw && ::unlinkat(dir.get(), f.c_str(), 0) == 0) {
                    ++orphans;
                }
                continue;
            }
            struct stat st {};
            if (::fstatat(dir.get(), f.c_str(), &st, 0) != 0 ||
                static_cast<uint64_t>(st.st_size) != size) {
                bad.push_back(*key);
            }
            seen.insert(*key);
        }
    }
    {
        std::lock_guard lock(mu_);
        for (const auto& [key, info] : blocks_) {
            if (info.refs > 0 && !seen.contains(key)) {
                bad.push_back(key);  // missing
            }
        }
        size_t quarantined = 0;
        for (const BlockKey& key : bad) {
            quarantined += quarantine_block_locked(key);
        }
        counters_.quarantines += quarantined;
        if (!bad.empty()) {
            if ((reported_ & (1u << static_cast<unsigned>(Fault::Corrupt))) == 0) {
                reported_ |= 1u << static_cast<unsigned>(Fault::Corrupt);
                logs.push_back(std::to_string(bad.size()) +
                               " block(s) missing or of the wrong size at start-up; " +
                               std::to_string(quarantined) + " entries quarantined");
            }
            counters_.last_error = "blocks missing or of the wrong size at start-up";
        }
        if (rw) {
            make_room_locked(0);  // the bounds may have been lowered since the last run
        }
        counters_.tmp_files_removed += tmp_removed;
        counters_.orphan_blocks_removed += orphans;
    }
    delete_dead();
    {
        std::lock_guard lock(mu_);
        counters_.sweep_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        counters_.sweep_done = true;
    }
    emit(logs);
}

void DiskStore::delete_dead() {
    std::vector<uint64_t> manifests;
    std::vector<BlockKey> blocks;
    bool rw = false;
    {
        std::lock_guard lock(mu_);
        manifests.swap(dead_manifests_);
        blocks.swap(dead_blocks_);
        rw = mode_ == DiskMode::ReadWrite;
    }
    std::vector<std::string> logs;
    int err = 0;
    std::string what;
    if (rw) {
        for (uint64_t seq : manifests) {
            const std::string name = disk::manifest_file_name(seq);
            int e = step(DiskIoStep::Unlink);
            if (e == 0 && ::unlinkat(manifests_dir_.get(), name.c_str(), 0) != 0) {
                e = errno == ENOENT ? 0 : errno;
            }
            if (e != 0 && err == 0) {
                err = e;
                what = "deleting manifests/" + name;
            }
        }
        // The entry is gone for good before its blocks are (else a crash could bring back a
        // manifest naming deleted blocks; that would be caught, but is avoidable).
        if (!manifests.empty() && options_.sync) {
            disk::fsync_fd(manifests_dir_.get());
        }
    }
    for (const BlockKey& key : blocks) {
        {
            std::lock_guard lock(mu_);
            auto it = blocks_.find(key);
            if (it == blocks_.end() || it->second.refs != 0) {
                continue;  // re-referenced by a write since, or already deleted
            }
            all_block_bytes_ -= it->second.size;
            blocks_.erase(it);
        }
        if (!rw) {
            continue;
        }
        const std::string path = disk::block_dir_name(key.hash) + "/" + disk::block_file_name(key);
        int e = step(DiskIoStep::Unlink);
        if (e == 0 && ::unlinkat(blocks_dir_.get(), path.c_str(), 0) != 0) {
            e = errno == ENOENT ? 0 : errno;
        }
        if (e != 0 && err == 0) {
            err = e;
            what = "deleting blocks/" + path;
        }
    }
    if (err != 0) {
        std::lock_guard lock(mu_);
        note_fault_locked(err, false, what, logs);
    }
    emit(logs);
}

bool DiskStore::make_room(uint64_t needed) {
    delete_dead();
    if (options_.min_free_bytes == 0) {
        return true;  // a full disk shows up as ENOSPC on the write itself
    }
    for (;;) {
        uint64_t free_now = 0;
        if (disk::free_bytes(root_.get(), &free_now) != 0 ||
            free_now >= needed + options_.min_free_bytes) {
            return true;  // (statvfs failing is no reason to stop writing)
        }
        {
            std::lock_guard lock(mu_);
            auto victim = index_.evict_lru(ComponentKind::Exact);
            if (!victim) {
                return false;
            }
            free_record_locked(victim->entry);
            ++counters_.evictions;
        }
        delete_dead();
    }
}

bool DiskStore::write_files(std::vector<Planned>& plan, uint64_t seq,
                            const std::vector<uint8_t>& manifest, int* err, const char** what) {
    std::vector<unsigned> touched;
    int dirfd = -1;
    std::string tmp;
    auto fail = [&](int e, const char* w) {
        *err = e;
        *what = w;
        if (dirfd >= 0 && !tmp.empty()) {
            ::unlinkat(dirfd, tmp.c_str(), 0);
        }
        return false;
    };
    for (Planned& p : plan) {
        if (!p.is_new) {
            continue;
        }
        const unsigned index = disk::block_dir_index(p.key.hash);
        int e = 0;
        dirfd = block_dir(index, &e);
        tmp.clear();
        if (dirfd < 0) {
            return fail(e, "creating a block folder");
        }
        const std::string name = disk::block_file_name(p.key);
        tmp = name + ".tmp";
        if ((e = step(DiskIoStep::BlockWrite)) != 0) {
            return fail(e, "writing a block");
        }
        disk::Fd fd(::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
        if (!fd.valid()) {
            return fail(errno, "creating a block");
        }
        if ((e = disk::write_all(fd.get(), std::span(p.data, p.size))) != 0) {
            return fail(e, "writing a block");
        }
        if (options_.sync &&
            ((e = step(DiskIoStep::BlockSync)) != 0 || (e = disk::fsync_fd(fd.get())) != 0)) {
            return fail(e, "syncing a block");
        }
        fd.reset();
        if ((e = step(DiskIoStep::BlockRename)) != 0 ||
            (::renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0 && (e = errno) != 0)) {
            return fail(e, "renaming a block");
        }
        tmp.clear();
        p.written = true;
        if (std::find(touched.begin(), touched.end(), index) == touched.end()) {
            touched.push_back(index);
        }
    }
    if (options_.sync) {
        for (unsigned index : touched) {
            int e = step(DiskIoStep::BlockDirSync);
            if (e != 0 || (e = disk::fsync_fd(sub_dirs_[index].get())) != 0) {
                return fail(e, "syncing a block folder");
            }
        }
    }
    dirfd = manifests_dir_.get();
    const std::string name = disk::manifest_file_name(seq);
    tmp = name.substr(0, 16) + ".tmp";
    int e = step(DiskIoStep::ManifestWrite);
    if (e != 0) {
        return fail(e, "writing a manifest");
    }
    disk::Fd fd(::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) {
        return fail(errno, "creating a manifest");
    }
    if ((e = disk::write_all(fd.get(), manifest)) != 0) {
        return fail(e, "writing a manifest");
    }
    if (options_.sync &&
        ((e = step(DiskIoStep::ManifestSync)) != 0 || (e = disk::fsync_fd(fd.get())) != 0)) {
        return fail(e, "syncing a manifest");
    }
    fd.reset();
    if ((e = step(DiskIoStep::ManifestRename)) != 0 ||
        (::renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0 && (e = errno) != 0)) {
        return fail(e, "renaming a manifest");
    }
    tmp.clear();
    if (options_.sync &&
        ((e = step(DiskIoStep::ManifestDirSync)) != 0 || (e = disk::fsync_fd(dirfd)) != 0)) {
        // Visible but maybe not durable: undo, so that what is served is what was synced.
        ::unlinkat(dirfd, name.c_str(), 0);
        return fail(e, "syncing the manifests folder");
    }
    return true;
}

void DiskStore::run_write(WriteJob& job, const PreparedPayload& prep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> logs;
    if (prep.error != InsertError::None) {
        std::lock_guard lock(mu_);
        ++counters_.write_failures;
        counters_.last_error = std::string("write rejected: ") + to_string(prep.error);
        return;
    }
    // Unique blocks of this payload (bytes compared), and each block's place in the plan.
    std::vector<Planned> plan;
    std::vector<size_t> order;
    order.reserve(prep.blocks.size());
    std::unordered_map<Hash128, std::vector<size_t>, Hash128Hash> in_job;
    for (const PreparedPayload::Block& pb : prep.blocks) {
        size_t found = plan.size();
        for (size_t i : in_job[pb.hash]) {
            if (plan[i].size == pb.size && std::memcmp(plan[i].data, pb.data, pb.size) == 0) {
                found = i;
                break;
            }
        }
        if (found == plan.size()) {
            Planned p;
            p.key.hash = pb.hash;
            p.data = pb.data;
            p.size = pb.size;
            plan.push_back(std::move(p));
            in_job[pb.hash].push_back(found);
        }
        ++plan[found].uses;
        order.push_back(found);
    }
    {
        std::lock_guard lock(mu_);
        if (mode_ != DiskMode::ReadWrite) {
            ++counters_.write_skipped;
            return;
        }
        if (auto id = index_.find(ComponentKind::Exact, job.ns, job.tokens)) {
            auto info = index_.info(*id);
            if (records_.at(*id).page == job.page || (info && info->leases > 0)) {
                ++counters_.write_skipped;
                return;
            }
        }
        for (Planned& p : plan) {
            for (uint32_t v = 0; v < disk::kMaxVariants; ++v) {
                auto it = blocks_.find(BlockKey{p.key.hash, v});
                if (it != blocks_.end() && it->second.size == p.size) {
                    p.candidates.push_back(it->first);
                }
            }
        }
    }
    // Confirm hash matches by comparing bytes (only this thread deletes block files).
    std::vector<uint8_t> existing;
    for (Planned& p : plan) {
        for (const BlockKey& cand : p.candidates) {
            const std::string path =
                disk::block_dir_name(cand.hash) + "/" + disk::block_file_name(cand);
            disk::Fd fd(::openat(blocks_dir_.get(), path.c_str(), O_RDONLY | O_CLOEXEC));
            existing.resize(p.size);
            bool short_read = false;
            struct stat st {};
            if (fd.valid() && ::fstat(fd.get(), &st) == 0 &&
                static_cast<uint64_t>(st.st_size) == p.size &&
                disk::pread_exact(fd.get(), existing, 0, &short_read) == 0 && !short_read &&
                std::memcmp(existing.data(), p.data, p.size) == 0) {
                p.key = cand;
                p.is_new = false;
                break;
            }
        }
    }
    uint64_t seq = 0;
    uint64_t new_bytes = 0;
    std::vector<uint8_t> manifest;
    disk::Manifest m;
    {
        std::lock_guard lock(mu_);
        bool variants_ok = true;
        for (size_t i = 0; i < plan.size(); ++i) {
            Planned& p = plan[i];
            if (!p.is_new) {
                ref_block_locked(p.key, p.size, p.uses);  // pinned: eviction cannot delete it
                continue;
            }
            new_bytes += p.size;
            uint32_t v = 0;
            for (; v < disk::kMaxVariants; ++v) {
                const BlockKey k{p.key.hash, v};
                bool taken = blocks_.contains(k);
                for (size_t j = 0; j < i && !taken; ++j) {
                    taken = plan[j].key == k;
                }
                if (!taken) {
                    break;
                }
            }
            variants_ok = variants_ok && v < disk::kMaxVariants;
            p.key.variant = v;
        }
        seq = next_seq_++;
        m.seq = seq;
        m.ns = job.ns;
        m.page = job.page;
        m.descriptor = job.descriptor;
        m.tokens = job.tokens;
        for (size_t i : order) {
            m.blocks.push_back(BlockRef{plan[i].key, plan[i].size});
        }
        m.payload_checksum = disk::payload_checksum(prep.size, m.blocks);
        manifest = disk::encode_manifest(m);
        if (!variants_ok || !make_room_locked(new_bytes + manifest.size())) {
            for (const Planned& p : plan) {
                if (!p.is_new) {
                    unref_block_locked(p.key, p.uses);
                }
            }
            if (variants_ok) {
                ++counters_.write_no_room;
            } else {
                ++counters_.write_failures;
                counters_.last_error = "too many blocks with the same hash";
            }
            return;
        }
    }
    int err = 0;
    const char* what = "";
    const bool room = make_room(new_bytes + manifest.size());
    const bool ok = room && write_files(plan, seq, manifest, &err, &what);
    if (!ok) {
        for (const Planned& p : plan) {
            if (p.written) {
                const std::string path =
                    disk::block_dir_name(p.key.hash) + "/" + disk::block_file_name(p.key);
                ::unlinkat(blocks_dir_.get(), path.c_str(), 0);
            }
        }
        {
            std::lock_guard lock(mu_);
            for (const Planned& p : plan) {
                if (!p.is_new) {
                    unref_block_locked(p.key, p.uses);
                }
            }
            if (!room) {
                ++counters_.write_no_room;
                counters_.last_error = "not enough free space on the filesystem";
            } else {
                ++counters_.write_failures;
                note_fault_locked(err, true, std::string(what) + " in " + options_.dir, logs);
            }
        }
        emit(logs);
        return;
    }
    DiskCommit commit;
    {
        std::lock_guard lock(mu_);
        for (const Planned& p : plan) {
            if (p.is_new) {
                ref_block_locked(p.key, p.size, p.uses);
            }
        }
        failed_writes_in_a_row_ = 0;
        Record rec;
        rec.seq = seq;
        rec.page = job.page;
        rec.descriptor = job.descriptor;
        rec.blocks = std::move(m.blocks);
        rec.manifest_bytes = manifest.size();
        manifest_bytes_ += rec.manifest_bytes;
        logical_bytes_ += rec.descriptor.payload_bytes;
        InsertResult ins = index_.insert(ComponentKind::Exact, job.ns, job.tokens, seq);
        // The index needs a record for every entry; park it under a placeholder if the
        // insert did not take it (a reader leased the old entry meanwhile).
        const bool placed =
            ins.status == InsertStatus::Inserted || ins.status == InsertStatus::Replaced;
        const EntryId id = placed ? ins.entry : ~EntryId{0};
        records_.emplace(id, std::move(rec));
        if (!placed) {
            free_record_locked(id);  // deletes the manifest just written, drops the refs
            ++counters_.write_skipped;
            return;
        }
        if (ins.replaced) {
            free_record_locked(ins.replaced->entry);
        }
        ++counters_.writes;
        counters_.written_bytes += new_bytes;
        for (const Planned& p : plan) {
            (p.is_new ? counters_.new_blocks : counters_.reused_blocks) += 1;
        }
        commit.ns = job.ns;
        commit.page = job.page;
        commit.tokens = job.tokens.size();
        commit.payload_bytes = prep.size;
        commit.new_bytes = new_bytes;
        for (const Planned& p : plan) {
            (p.is_new ? commit.new_blocks : commit.reused_blocks) += 1;
        }
    }
    commit.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (options_.on_commit) {
        options_.on_commit(commit);
    }
}

}  // namespace skippy::cache
