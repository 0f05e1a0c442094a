// DiskStore: the persistent disk tier of the exact-state cache. Entries (namespace + token
// path -> page id, descriptor, payload bytes) survive restarts; payloads are cut into
// content-addressed blocks shared between entries (a longer prefix shares the blocks of a
// shorter one), and one manifest per entry is the commit point. See disk_format.h for the
// folder layout and the manifest format.
//
//   DiskOpenResult opened = DiskStore::open({.dir = "/home/u/.cache/skippy/disk",
//                                            .max_bytes = 64ull << 30,
//                                            .min_free_bytes = 4ull << 30});
//   if (!opened.store) log(opened.message);                // Locked / Unusable: no disk tier
//   DiskStore& disk = *opened.store;
//
//   // RAM eviction -> disk (any thread; never waits for disk I/O)
//   DiskSubmit s = disk.submit_write(ns, tokens, page, descriptor, payload_bytes, cuts);
//
//   // RAM miss -> disk (lookup is in memory; read does the I/O on the calling thread)
//   if (std::optional<DiskHit> hit = disk.acquire_longest(ns, prompt_prefix)) {
//       DiskReadResult r = disk.read(hit->lease);          // verified, or quarantined
//       if (r.ok()) promote(hit->page, hit->descriptor, r.bytes.span());
//   }                                                      // lease released here
//   disk.stats();                                          // counters for /metrics
//
// Durability. A write is: every new block to "<name>.tmp", fsync, rename, fsync of its
// folder; then the manifest to "<seq>.tmp", fsync, rename to "<seq>.m", fsync of the
// manifests folder. An entry exists (is served now or after a restart) iff its manifest
// was renamed into place; nothing else is ever served. A crash at any point leaves at
// worst orphan blocks and *.tmp files, deleted by the next start-up. Replacing an entry
// writes a new manifest (higher seq) before deleting the old one; the highest seq wins at
// start-up. Removal deletes the manifest (and fsyncs its folder) before the blocks.
//
// Start-up (open): takes the lock, reads and verifies every manifest (size, checksum,
// self-consistency), rebuilds the index and block refcounts, and returns: that is the
// reconciliation time (stats().reconcile_ms). The writer thread then runs the sweep
// before any write (stats().sweep_ms): it deletes *.tmp, rejected and superseded
// manifests and orphan blocks, and stats every referenced block (missing or wrong size:
// the entries using it are quarantined). Block contents are verified at every read.
//
// Lock. <dir>/LOCK is flock'ed exclusively; a second DiskStore on the same folder (in
// this or another process) fails with DiskOpenError::Locked and a message naming the
// owner's pid. A folder that cannot be written (read-only filesystem, no permission)
// opens in DiskMode::ReadOnly: entries are served, nothing is written or deleted.
//
// Bounds. max_bytes applies to block files + manifests (file sizes); min_free_bytes is
// kept free on the filesystem (statvfs before each write). To make room the writer evicts
// whole unleased entries in LRU order; blocks are deleted when no entry references them.
// Recency survives restarts: a read touches the manifest's mtime and start-up orders
// entries by it.
//
// Faults. ENOSPC/EDQUOT: the write is dropped and counted, writing continues. EROFS,
// EACCES, EPERM on a write, or 8 failed writes in a row: the store degrades to ReadOnly.
// A read that finds a missing, truncated or wrong-sized block, a checksum mismatch or an
// I/O error returns the error and quarantines the entry (and every entry sharing the bad
// block): hidden from lookups at once, its files deleted by the writer. (EMFILE, ENFILE,
// ENOMEM and EAGAIN only fail that read.) A block whose file does not compare equal (or
// has another size) is never reused by a write: the new bytes get another variant name. Each fault
// kind is logged once through options.log; all are counted in stats().
//
// Thread safety. Every public member may be called from any thread. One internal mutex
// guards the index, the entry and block tables, the queue and the counters; it is never
// held during disk I/O or while calling options' callbacks. open() and read()/read_into()
// do disk I/O on the calling thread; every other member only takes that mutex for
// in-memory work. All writes, deletions and the sweep run on the store's own writer
// thread, which is the only one that creates or deletes files after open(). Leases must
// not outlive the store.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/block_store.h"
#include "cache/disk_format.h"
#include "cache/disk_io.h"
#include "cache/exact_state_cache.h"  // QuarantineStatus
#include "cache/lease.h"
#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/payload_descriptor.h"
#include "cache/prefix_ghosts.h"
#include "cache/radix_index.h"
#include "cache/token.h"

namespace skippy::cache {

enum class DiskMode : uint8_t { ReadWrite, ReadOnly };
const char* to_string(DiskMode mode);

// Steps of the writer, for fault injection and crash tests (DiskStoreOptions::debug_io_hook).
enum class DiskIoStep : uint8_t {
    BlockWrite,
    BlockSync,
    BlockRename,
    BlockDirSync,
    ManifestWrite,
    ManifestSync,
    ManifestRename,
    ManifestDirSync,
    Unlink,
    Read,  // on the reading thread, before each block is read
};
const char* to_string(DiskIoStep step);

// Reported on the writer thread once an entry's manifest is durable.
struct DiskCommit {
    NamespaceId ns;
    PageId page;
    size_t tokens = 0;
    uint64_t payload_bytes = 0;
    uint64_t new_bytes = 0;  // block bytes written (the rest was already on disk)
    size_t new_blocks = 0;
    size_t reused_blocks = 0;
    double seconds = 0;  // from dequeue to commit
};

struct DiskStoreOptions {
    std::string dir;                         // created 0700 (parents too) if missing
    uint64_t max_bytes = 0;                  // block files + manifests; 0 = unlimited
    uint64_t min_free_bytes = 0;             // left free on the filesystem
    size_t max_entries = 0;                  // 0 = unlimited
    size_t queue_capacity = 16;              // queued writes, not counting the one running
    uint64_t max_queued_bytes = 1ull << 30;  // payload bytes held by the queue; 0 = unlimited
    size_t block_bytes = kDefaultBlockBytes;
    bool sync = true;  // fsync files and folders; false only for benchmarks (not crash-safe)
    // Each fault kind once; default: one line on stderr. Never called with the lock held.
    std::function<void(std::string_view)> log;
    // Writer thread, after a commit. Must not call back into the store's writes.
    std::function<void(const DiskCommit&)> on_commit;
    // Tests: called before each step; a nonzero errno makes that step fail with it.
    std::function<int(DiskIoStep)> debug_io_hook;
};

enum class DiskOpenError : uint8_t {
    None,
    Locked,    // another DiskStore (this or another process) holds the folder
    Unusable,  // the folder cannot be created or opened
};

struct DiskOpenResult {
    std::unique_ptr<class DiskStore> store;  // null iff error != None
    DiskOpenError error = DiskOpenError::None;
    std::string message;  // why it failed, or a note (e.g. opened read-only)
};

enum class DiskSubmit : uint8_t {
    Queued,
    AlreadyPresent,  // this page is already on disk at this path
    AlreadyQueued,   // a write of this path is queued or running
    DroppedFull,     // queue full (entries or bytes): dropped and counted
    ReadOnly,        // the store does not write (see DiskMode)
    Invalid,         // empty tokens, descriptor inconsistent with bytes or token count
    Stopped,         // close() was called
};
const char* to_string(DiskSubmit s);

enum class DiskReadError : uint8_t {
    None,
    NotFound,  // the lease is not a live entry of this store
    MissingBlock,
    Truncated,
    SizeMismatch,
    ChecksumMismatch,
    Io,  // open/read failed (EACCES, EIO, ...), see detail
};
const char* to_string(DiskReadError e);

struct DiskReadResult {
    DiskReadError error = DiskReadError::None;
    std::string detail;  // for errors: which file and why
    PayloadBytes bytes;  // the verified payload
    double seconds = 0;
    bool ok() const { return error == DiskReadError::None; }
};

struct DiskPeek {
    PageId page;
    size_t len = 0;  // tokens covered; the hit is query[0, len)
    PayloadDescriptor descriptor;
    uint64_t payload_bytes = 0;
};

struct DiskHit {
    Lease lease;  // keeps the entry (and its files) from eviction or deletion
    PageId page;
    size_t len = 0;             // tokens of the query served: query[0, len)
    std::vector<Token> tokens;  // the entry's path (longer than len for a common-prefix hit)
    PayloadDescriptor descriptor;
    uint64_t payload_bytes = 0;
};

struct DiskStoreStats {
    DiskMode mode = DiskMode::ReadWrite;
    size_t entries = 0;         // visible entries
    size_t hidden_entries = 0;  // quarantined/removed while leased
    size_t leased_entries = 0;  // entries (hidden ones included) with a lease held
    size_t blocks = 0;
    uint64_t disk_bytes = 0;      // block_bytes + manifest_bytes
    uint64_t block_bytes = 0;     // unique block files (physical)
    uint64_t manifest_bytes = 0;  // manifest files
    uint64_t logical_bytes = 0;   // payload bytes of all entries
    uint64_t hits = 0;            // acquire_longest found an entry
    uint64_t misses = 0;
    uint64_t reads = 0;  // successful reads
    uint64_t read_bytes = 0;
    uint64_t read_failures = 0;
    uint64_t submitted = 0;  // queued writes
    uint64_t dropped_full = 0;
    uint64_t writes = 0;         // committed entries
    uint64_t written_bytes = 0;  // new block bytes written
    uint64_t new_blocks = 0;
    uint64_t reused_blocks = 0;
    uint64_t write_failures = 0;  // I/O failure of a write (rolled back)
    uint64_t write_skipped = 0;   // already on disk, or path leased, at write time
    uint64_t write_no_room = 0;   // could not make room (bounds, free space)
    size_t queue_depth = 0;       // queued + running
    uint64_t queued_bytes = 0;
    uint64_t evictions = 0;
    uint64_t removals = 0;
    uint64_t quarantines = 0;
    uint64_t rejected_manifests = 0;  // at start-up: unreadable, corrupt, inconsistent
    uint64_t superseded_manifests = 0;
    uint64_t orphan_blocks_removed = 0;
    uint64_t tmp_files_removed = 0;
    uint64_t no_space_errors = 0;  // ENOSPC, EDQUOT
    uint64_t permission_errors = 0;
    uint64_t read_only_errors = 0;  // EROFS
    uint64_t io_errors = 0;         // anything else
    double reconcile_ms = 0;        // open(): until lookups are served
    double sweep_ms = 0;            // background sweep, once done
    bool sweep_done = false;
    std::string last_error;
};

// One entry as inspection shows it (GET /v1/cache): no token ids.
struct DiskEntrySummary {
    NamespaceId ns;
    PageId page;
    size_t tokens = 0;
    uint64_t payload_bytes = 0;
    uint64_t hits = 0;             // reads since start-up
    int64_t last_hit_unix_ms = 0;  // 0: not read since start-up
};

class DiskStore final : public LeaseOwner {
  public:
    // Never throws for I/O problems (see DiskOpenResult).
    static DiskOpenResult open(DiskStoreOptions options);
    ~DiskStore();  // close(true)
    DiskStore(const DiskStore&) = delete;
    DiskStore& operator=(const DiskStore&) = delete;

    // Queues a durable write. `bytes` is shared, not copied (a PayloadBytes from the RAM
    // tier can be passed as is). `cuts`: block boundaries as in BlockStore::prepare.
    DiskSubmit submit_write(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                            const PayloadDescriptor& descriptor, PayloadBytes bytes,
                            std::vector<size_t> cuts = {});
    DiskSubmit submit_write(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                            const PayloadDescriptor& descriptor, std::vector<uint8_t> bytes,
                            std::vector<size_t> cuts = {});
    // The RAM tier's blocks of the payload, shared: the writer copies them into its own
    // reused buffer when it writes, so a queued write holds no second copy of the payload
    // (a fresh buffer per record costs page faults on the record worker's side).
    DiskSubmit submit_write(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                            const PayloadDescriptor& descriptor, PayloadSnapshot snapshot,
                            std::vector<size_t> cuts = {});
    // What submit_write would answer now for a payload of `payload_bytes` (no side effect).
    DiskSubmit probe_write(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                           uint64_t payload_bytes) const;

    // Longest entry whose path is a prefix of `query`, leased and moved to the LRU front.
    // Longest entry that is a prefix of `query` (Stored), or that shares the longest
    // common prefix with it (Common: its path may go on past it; len is the common part;
    // for payloads whose every prefix is valid).
    std::optional<DiskHit> acquire_longest(const NamespaceId& ns, std::span<const Token> query,
                                           PrefixMatch match = PrefixMatch::Stored);
    std::optional<DiskPeek> peek_longest(const NamespaceId& ns, std::span<const Token> query,
                                         PrefixMatch match = PrefixMatch::Stored) const;
    bool contains(const NamespaceId& ns, std::span<const Token> tokens, PageId page) const;

    // Reads and verifies the leased entry's payload (disk I/O on the calling thread).
    // Any failure except NotFound quarantines the entry.
    DiskReadResult read(const Lease& lease);
    // Same into a caller buffer (reused across reads); on error `out` is not a payload.
    DiskReadError read_into(const Lease& lease, std::vector<uint8_t>& out,
                            std::string* detail = nullptr);

    // Removes the entry stored exactly at `tokens` (deferred while leased). False if none.
    bool remove(const NamespaceId& ns, std::span<const Token> tokens);
    // Removes it if it is `page` (a restore of its bytes failed elsewhere).
    QuarantineStatus quarantine(const NamespaceId& ns, std::span<const Token> tokens, PageId page);

    // Waits until the sweep, every queued write and every pending deletion are done.
    void flush();
    // The request path is computing (true) or idle (false). While it computes, and until
    // it has been idle for kIdleGrace (requests sent back to back leave gaps of a few
    // milliseconds, and a write started there runs on into the next prefill), queued
    // writes wait (their file I/O and the kernel's writeback take CPU time from the
    // compute threads) unless they have waited kMaxWriteDeferral or the queue holds
    // kMaxDeferredWrites; flush() and close() never wait for this.
    void set_foreground_busy(bool busy);
    static constexpr auto kIdleGrace = std::chrono::milliseconds(50);
    static constexpr auto kMaxWriteDeferral = std::chrono::seconds(2);
    static constexpr size_t kMaxDeferredWrites = 32;
    // The writer's reused payload buffer is kept up to this size.
    static constexpr size_t kMaxKeptWriteBuffer = size_t{64} << 20;
    // Stops the writer (drain: finish queued writes first; else drop them) and unlocks
    // the folder. Reads and lookups keep answering from memory; submits answer Stopped.
    void close(bool drain = true);

    DiskStoreStats stats() const;
    DiskMode mode() const;

    // Inspection (in memory, no I/O). Entries (of `only` when given), longest first.
    std::vector<DiskEntrySummary> list_entries(const NamespaceId* only = nullptr) const;
    // Removes every entry of the namespace (files deleted by the writer); how many.
    size_t remove_namespace(const NamespaceId& ns);
    // As ExactStateCache's: paths this tier evicted or quarantined, and other namespaces.
    std::optional<GhostMatch> forgotten_longest(const NamespaceId& ns, std::span<const Token> query,
                                                size_t min_len) const;
    size_t longest_elsewhere(const NamespaceId& ns, std::span<const Token> query,
                             size_t max_namespaces = 64) const;
    const std::string& dir() const { return options_.dir; }

    // Test hooks.
    struct DebugFiles {
        std::string manifest;             // path of the manifest
        std::vector<std::string> blocks;  // paths of its blocks, in payload order
    };
    std::optional<DebugFiles> debug_files(const NamespaceId& ns,
                                          std::span<const Token> tokens) const;
    struct DebugEntry {
        NamespaceId ns;
        std::vector<Token> tokens;
        PageId page;
    };
    std::vector<DebugEntry> debug_entries() const;  // visible entries
    // Refcounts and byte counters against the entries; nullopt if consistent.
    std::optional<std::string> debug_check() const;

    void release_lease(EntryId entry) noexcept override;

  private:
    struct WriteJob {
        NamespaceId ns;
        std::vector<Token> tokens;
        PageId page;
        PayloadDescriptor descriptor;
        PayloadBytes bytes;  // (empty while `snapshot` holds the payload)
        std::vector<size_t> cuts;
        Hash128 key;
        std::chrono::steady_clock::time_point queued_at;
        std::optional<PayloadSnapshot> snapshot;
        uint64_t size() const { return snapshot ? snapshot->size() : bytes.size(); }
    };
    struct Record {
        uint64_t seq = 0;
        PageId page;
        PayloadDescriptor descriptor;
        std::vector<disk::BlockRef> blocks;
        uint64_t manifest_bytes = 0;
        uint64_t hits = 0;
        int64_t last_hit_unix_ms = 0;
    };
    struct BlockInfo {
        uint64_t size = 0;
        uint32_t refs = 0;  // entries (with multiplicity) and in-progress writes
    };
    struct Planned;
    enum class Fault : uint8_t { NoSpace, Permission, ReadOnlyFs, Io, Corrupt, Count };

    explicit DiskStore(DiskStoreOptions options);
    // open() helpers (disk_store_open.cpp).
    DiskOpenResult open_folder();
    void load_manifests();
    // Writer thread (disk_store_writer.cpp).
    void writer_loop();
    std::optional<DiskHit> acquire_locked(EntryId entry, size_t len);  // caller holds mu_
    void sweep();
    // Writes the job's payload: `prep` names its blocks (in job.bytes, job.snapshot or
    // write_buffer_).
    void run_write(WriteJob& job, const PreparedPayload& prep);
    bool write_files(std::vector<Planned>& plan, uint64_t seq, const std::vector<uint8_t>& manifest,
                     int* err, const char** what);
    DiskSubmit submit_job(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                          const PayloadDescriptor& descriptor, PayloadBytes bytes,
                          std::optional<PayloadSnapshot> snapshot, std::vector<size_t> cuts);
    bool make_room(uint64_t needed);
    void delete_dead();
    int step(DiskIoStep s) const;
    int block_dir(unsigned index, int* err);
    // Under mu_.
    bool make_room_locked(uint64_t needed);
    void free_record_locked(EntryId entry);
    void ref_block_locked(const disk::BlockKey& key, uint64_t size, uint32_t n);
    void unref_block_locked(const disk::BlockKey& key, uint32_t n);
    size_t quarantine_block_locked(const disk::BlockKey& key);
    bool hide_entry_locked(EntryId entry);  // true if freed now
    DiskSubmit admission_locked(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                                uint64_t bytes, const Hash128* key) const;
    void note_fault_locked(int err, bool writing, const std::string& what,
                           std::vector<std::string>& logs);
    void emit(std::vector<std::string>& logs) const;
    // Reads the leased entry into the buffer `alloc(size)` returns; quarantines on error.
    DiskReadError read_entry(const Lease& lease,
                             const std::function<std::span<uint8_t>(size_t)>& alloc,
                             std::string* detail);

    const DiskStoreOptions options_;
    BlockStore cutter_;  // only prepare(): cuts and hashes (thread-safe)

    // Set in open(), then read-only.
    disk::Fd root_;
    disk::Fd blocks_dir_;
    disk::Fd manifests_dir_;
    disk::Fd lock_;
    std::vector<std::string> startup_junk_;  // manifest folder names to delete (sweep)
    // Writer thread only: open block sub-folders ("00".."ff").
    std::array<disk::Fd, 256> sub_dirs_;

    mutable std::mutex mu_;
    // The writer thread's: a queued snapshot whose blocks are not this store's is joined here.
    std::vector<uint8_t> write_buffer_;
    std::condition_variable work_cv_;
    mutable std::condition_variable idle_cv_;
    RadixIndex index_;
    std::unordered_map<EntryId, Record> records_;
    std::unordered_map<disk::BlockKey, BlockInfo, disk::BlockKeyHash> blocks_;
    std::deque<WriteJob> queue_;
    std::unordered_set<Hash128, Hash128Hash> queued_keys_;  // queued or running
    std::vector<uint64_t> dead_manifests_;                  // seqs to delete
    std::vector<disk::BlockKey> dead_blocks_;               // refs reached 0
    DiskMode mode_ = DiskMode::ReadWrite;
    bool sweep_pending_ = true;
    bool busy_ = false;             // the writer is running a job, a sweep or deletions
    bool foreground_busy_ = false;  // see set_foreground_busy()
    std::chrono::steady_clock::time_point foreground_idle_since_{};
    int flushers_ = 0;  // flush() calls waiting: no deferral
    bool stopping_ = false;
    bool drain_ = true;
    bool writer_done_ = false;  // writer_loop returned (or never started)
    uint64_t next_seq_ = 1;
    uint64_t live_block_bytes_ = 0;  // blocks with refs > 0
    uint64_t all_block_bytes_ = 0;   // every block in blocks_
    uint64_t manifest_bytes_ = 0;
    uint64_t logical_bytes_ = 0;
    size_t hidden_entries_ = 0;
    uint32_t failed_writes_in_a_row_ = 0;
    uint32_t reported_ = 0;  // Fault bits already logged
    DiskStoreStats counters_;
    PrefixGhosts ghosts_;  // evicted / quarantined paths (fingerprints only)
    std::mutex close_mu_;
    std::thread writer_;
};

}  // namespace skippy::cache
