// BlockStore: content-addressed, refcounted storage of serialized payloads.
//
//   BlockStore store;                                    // 1 MiB blocks, XXH3-128
//   InsertOutcome in = store.insert(bytes);              // or insert(bytes, cut_offsets)
//   if (!in.ok()) ...;                                   // nothing changed on failure
//   StoredPayload p = in.payload;                        // keep it: it names the blocks
//   in.report.new_blocks; in.report.reused_blocks; in.report.hash_seconds;
//
//   ReconstructResult r = store.reconstruct(p);          // verifies the checksum
//   if (r.ok()) use(r.bytes.span());                     // single block: no copy
//   store.snapshot(p)->reconstruct_into(reused_buffer);  // into a caller's buffer
//   auto snap = store.snapshot(p); snap->verify(); read(snap->parts());  // in place
//   store.release(p);                                    // validated before any change
//
// Blocks: a payload is cut at the caller's cut points (e.g. the token-chunk boundaries
// of a KV page, so a longer prefix shares the blocks of a shorter one) and every segment
// is further cut every `block_bytes`. Each block is keyed by its XXH3-128; a hash match
// is shared only after comparing the bytes, a collision with different bytes is stored as
// a separate block. Logical bytes count every reference, physical bytes every unique block.
//
// Integrity: a StoredPayload carries a checksum over its size and the hashes of its
// blocks. reconstruct(verify=true) re-hashes the bytes it returns and fails with
// ChecksumMismatch instead of returning bad data.
//
// Not thread-safe, except prepare() (reads only the immutable options) and
// PayloadSnapshot::reconstruct(): an owner holding a lock can take a snapshot under the
// lock and assemble/verify the bytes after releasing it.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace skippy::cache {

using BlockId = uint64_t;

struct Hash128 {
    uint64_t low = 0;
    uint64_t high = 0;
    auto operator<=>(const Hash128&) const = default;
};

struct Hash128Hash {
    size_t operator()(const Hash128& h) const noexcept {
        return static_cast<size_t>(h.low ^ (h.high * 0x9e3779b97f4a7c15ULL));
    }
};

using BlockHasher = Hash128 (*)(std::span<const uint8_t>);
// XXH3-128 (the default block hasher).
Hash128 xxh3_128(std::span<const uint8_t> bytes);

inline constexpr size_t kDefaultBlockBytes = size_t{1} << 20;

struct BlockStoreOptions {
    size_t block_bytes = kDefaultBlockBytes;  // > 0
    uint64_t max_physical_bytes = 0;          // hard cap; 0 = unlimited
    BlockHasher hasher = &xxh3_128;           // tests inject a colliding hasher
};

struct StoredPayload {
    std::vector<BlockId> blocks;  // in payload order; may repeat a block
    uint64_t size = 0;
    uint64_t checksum = 0;
};

struct InsertReport {
    uint64_t logical_bytes = 0;  // payload size
    uint64_t new_bytes = 0;      // physical bytes added
    size_t new_blocks = 0;
    size_t reused_blocks = 0;
    size_t hash_collisions = 0;  // hash matched but bytes differed
    double hash_seconds = 0;
};

enum class InsertError : uint8_t {
    None,
    InvalidCuts,       // cut points not strictly increasing inside (0, size)
    CapacityExceeded,  // max_physical_bytes would be exceeded
    OutOfMemory,
    InjectedFailure,  // debug_fail_next_commit_after()
};
const char* to_string(InsertError error);

struct InsertOutcome {
    InsertError error = InsertError::None;
    StoredPayload payload;
    InsertReport report;
    bool ok() const { return error == InsertError::None; }
};

enum class ReleaseError : uint8_t { None, MissingBlock, RefcountUnderflow, ByteUnderflow };
const char* to_string(ReleaseError error);

enum class ReconstructError : uint8_t { None, MissingBlock, ChecksumMismatch, SizeMismatch };
const char* to_string(ReconstructError error);

// Reconstructed payload bytes; shares ownership of the underlying buffer.
class PayloadBytes {
  public:
    PayloadBytes() = default;
    PayloadBytes(std::shared_ptr<const uint8_t[]> owner, size_t size, bool zero_copy)
        : owner_(std::move(owner)), size_(size), zero_copy_(zero_copy) {}

    const uint8_t* data() const { return owner_.get(); }
    size_t size() const { return size_; }
    std::span<const uint8_t> span() const { return {owner_.get(), size_}; }
    // True if these are the stored block's own bytes (single-block payload, no copy).
    bool zero_copy() const { return zero_copy_; }

  private:
    std::shared_ptr<const uint8_t[]> owner_;
    size_t size_ = 0;
    bool zero_copy_ = false;
};

struct ReconstructResult {
    ReconstructError error = ReconstructError::None;
    PayloadBytes bytes;
    bool ok() const { return error == ReconstructError::None; }
};

// Output of BlockStore::prepare: block boundaries and hashes. Its blocks refer to the
// caller's bytes (from PayloadSnapshot::prepare_in_place: to the snapshot's blocks), which
// must outlive it.
struct PreparedPayload {
    struct Block {
        size_t offset = 0;  // in the payload
        size_t size = 0;
        Hash128 hash;
        const uint8_t* data = nullptr;  // the block's bytes
        std::span<const uint8_t> span() const { return {data, size}; }
    };
    InsertError error = InsertError::None;
    uint64_t size = 0;  // payload bytes
    std::vector<Block> blocks;
    uint64_t checksum = 0;
    double hash_seconds = 0;
};

// The blocks of one payload, held by shared ownership (valid after the store changes).
class PayloadSnapshot {
  public:
    ReconstructResult reconstruct(bool verify = true) const;
    // Copies the payload into `out` (resized to size(); reuse it across calls to avoid
    // page-faulting a fresh buffer each time). On error `out` holds no valid payload.
    ReconstructError reconstruct_into(std::vector<uint8_t>& out, bool verify = true) const;
    // The payload's bytes in place, block by block (valid while this snapshot lives): read
    // them without a joined copy. verify() re-hashes them against the checksum as
    // reconstruct(verify=true) does.
    std::vector<std::span<const uint8_t>> parts() const;
    ReconstructError verify() const;
    // The blocks BlockStore(cutting).prepare(joined payload, cuts) would give, hashed where
    // they are (no joined copy) and verified against the checksum, when the stored blocks
    // are exactly those blocks (same cuts, block size and hasher). std::nullopt with
    // *error == None when they are not (the caller joins a copy instead); with an error
    // when the blocks are bad.
    std::optional<PreparedPayload> prepare_in_place(const BlockStoreOptions& cutting,
                                                    std::span<const size_t> cuts,
                                                    ReconstructError* error) const;
    uint64_t size() const { return size_; }

  private:
    friend class BlockStore;
    // SizeMismatch when the blocks do not add up to the payload's size.
    ReconstructError check_size() const;
    // The blocks' hashes against the checksum: of the bytes at `joined` (a copy of the
    // payload, block after block) or, when null, of the blocks in place.
    ReconstructError check_sum(const uint8_t* joined) const;
    void copy_to(uint8_t* out) const;  // the blocks, one after the other (size() bytes)

    struct Part {
        std::shared_ptr<uint8_t[]> data;
        size_t size = 0;
    };
    std::vector<Part> parts_;
    uint64_t size_ = 0;
    uint64_t checksum_ = 0;
    BlockHasher hasher_ = nullptr;
};

struct BlockStoreStats {
    uint64_t logical_bytes = 0;
    uint64_t physical_bytes = 0;
    size_t block_count = 0;
    uint64_t inserts = 0;
    uint64_t new_blocks = 0;
    uint64_t reused_blocks = 0;
    uint64_t hash_collisions = 0;
    double hash_seconds = 0;
};

class BlockStore {
  public:
    explicit BlockStore(BlockStoreOptions options = {});

    // Cuts and hashes; thread-safe. `cuts` are byte offsets where a block must end.
    PreparedPayload prepare(std::span<const uint8_t> bytes,
                            std::span<const size_t> cuts = {}) const;
    // The same blocks for a stored payload: the snapshot's own blocks where they line up
    // (PayloadSnapshot::prepare_in_place, no copy), else a copy joined into `joined` (reused
    // across calls) and cut. Either way verified against the snapshot's checksum: when that
    // fails, *error says why and nothing is prepared. Refers to the snapshot's blocks or to
    // `joined`, which must outlive it.
    PreparedPayload prepare(const PayloadSnapshot& snapshot, std::span<const size_t> cuts,
                            std::vector<uint8_t>& joined, ReconstructError* error) const;
    // Stores a prepared payload; on any failure every change is rolled back.
    InsertOutcome commit(const PreparedPayload& prepared);
    InsertOutcome insert(std::span<const uint8_t> bytes, std::span<const size_t> cuts = {}) {
        return commit(prepare(bytes, cuts));
    }

    // Bytes commit(prepared) would add: its blocks whose hash no stored block has (each
    // distinct hash once). An estimate before taking room: a hash collision adds a block.
    uint64_t unstored_bytes(const PreparedPayload& prepared) const;

    // Drops one reference per listed block (a block may be listed more than once). The
    // whole batch is validated first; on error nothing changes.
    ReleaseError release_blocks(std::span<const BlockId> blocks);
    ReleaseError release(const StoredPayload& payload) { return release_blocks(payload.blocks); }

    std::optional<PayloadSnapshot> snapshot(const StoredPayload& payload) const;
    ReconstructResult reconstruct(const StoredPayload& payload, bool verify = true) const;

    BlockStoreStats stats() const { return stats_; }
    const BlockStoreOptions& options() const { return options_; }
    std::optional<uint32_t> refcount(BlockId block) const;
    std::optional<size_t> block_size(BlockId block) const;
    std::vector<BlockId> block_ids() const;  // sorted

    // Test hooks.
    // Flips the byte at `offset` of a stored block; false if there is no such byte.
    bool debug_corrupt_block(BlockId block, size_t offset);
    // The next commit fails with InjectedFailure after storing `blocks` blocks.
    void debug_fail_next_commit_after(size_t blocks) { fail_after_ = blocks; }

  private:
    struct Block {
        std::shared_ptr<uint8_t[]> data;
        size_t size = 0;
        Hash128 hash;
        uint32_t refcount = 0;
    };

    void rollback(const std::vector<std::pair<BlockId, bool>>& applied);
    void erase_block(BlockId id);

    BlockStoreOptions options_;
    std::unordered_map<BlockId, Block> blocks_;
    std::unordered_map<Hash128, std::vector<BlockId>, Hash128Hash> by_hash_;
    BlockStoreStats stats_;
    BlockId next_block_ = 1;
    std::optional<size_t> fail_after_;
};

}  // namespace skippy::cache
