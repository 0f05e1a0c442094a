#include "cache/block_store.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <stdexcept>
#include <unordered_set>
#include <utility>

#include "cache/block_memory.h"

namespace skippy::cache {
namespace {

// Checksum of a payload: XXH3-64 over its size and the (hash, size) of every block.
uint64_t payload_checksum(uint64_t size, std::span<const Hash128> hashes,
                          std::span<const size_t> sizes) {
    XXH3_state_t* state = XXH3_createState();
    if (state == nullptr) {
        throw std::bad_alloc();
    }
    XXH3_64bits_reset(state);
    XXH3_64bits_update(state, &size, sizeof(size));
    for (size_t i = 0; i < hashes.size(); ++i) {
        const uint64_t words[3] = {hashes[i].low, hashes[i].high, static_cast<uint64_t>(sizes[i])};
        XXH3_64bits_update(state, words, sizeof(words));
    }
    const uint64_t sum = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return sum;
}

uint64_t payload_checksum(uint64_t size, std::span<const PreparedPayload::Block> blocks) {
    std::vector<Hash128> hashes;
    std::vector<size_t> sizes;
    hashes.reserve(blocks.size());
    sizes.reserve(blocks.size());
    for (const PreparedPayload::Block& b : blocks) {
        hashes.push_back(b.hash);
        sizes.push_back(b.size);
    }
    return payload_checksum(size, hashes, sizes);
}

// Calls block(offset, size) for every block of a `size`-byte payload cut at `cuts` (valid:
// strictly increasing inside (0, size)) and every `block_bytes` after a cut, in order, while
// it returns true. False if one returned false.
template <typename F>
bool for_each_block(size_t size, std::span<const size_t> cuts, size_t block_bytes, F&& block) {
    size_t segment_begin = 0;
    for (size_t i = 0; i <= cuts.size(); ++i) {
        const size_t segment_end = i < cuts.size() ? cuts[i] : size;
        for (size_t off = segment_begin; off < segment_end; off += block_bytes) {
            if (!block(off, std::min(block_bytes, segment_end - off))) {
                return false;
            }
        }
        segment_begin = segment_end;
    }
    return true;
}

bool valid_cuts(size_t size, std::span<const size_t> cuts) {
    size_t prev = 0;
    for (size_t cut : cuts) {
        if (cut <= prev || cut >= size) {
            return false;
        }
        prev = cut;
    }
    return true;
}

}  // namespace

Hash128 xxh3_128(std::span<const uint8_t> bytes) {
    const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
    return Hash128{h.low64, h.high64};
}

const char* to_string(InsertError error) {
    switch (error) {
        case InsertError::None:
            return "none";
        case InsertError::InvalidCuts:
            return "invalid_cuts";
        case InsertError::CapacityExceeded:
            return "capacity_exceeded";
        case InsertError::OutOfMemory:
            return "out_of_memory";
        case InsertError::InjectedFailure:
            return "injected_failure";
    }
    return "?";
}

const char* to_string(ReleaseError error) {
    switch (error) {
        case ReleaseError::None:
            return "none";
        case ReleaseError::MissingBlock:
            return "missing_block";
        case ReleaseError::RefcountUnderflow:
            return "refcount_underflow";
        case ReleaseError::ByteUnderflow:
            return "byte_underflow";
    }
    return "?";
}

const char* to_string(ReconstructError error) {
    switch (error) {
        case ReconstructError::None:
            return "none";
        case ReconstructError::MissingBlock:
            return "missing_block";
        case ReconstructError::ChecksumMismatch:
            return "checksum_mismatch";
        case ReconstructError::SizeMismatch:
            return "size_mismatch";
    }
    return "?";
}

BlockStore::BlockStore(BlockStoreOptions options) : options_(options) {
    if (options_.block_bytes == 0) {
        throw std::invalid_argument("BlockStore: block_bytes must be > 0");
    }
    if (options_.hasher == nullptr) {
        throw std::invalid_argument("BlockStore: hasher must be set");
    }
}

PreparedPayload BlockStore::prepare(std::span<const uint8_t> bytes,
                                    std::span<const size_t> cuts) const {
    PreparedPayload out;
    out.size = bytes.size();
    if (!valid_cuts(bytes.size(), cuts)) {
        out.error = InsertError::InvalidCuts;
        return out;
    }
    const auto start = std::chrono::steady_clock::now();
    for_each_block(bytes.size(), cuts, options_.block_bytes, [&](size_t off, size_t len) {
        out.blocks.push_back(
            {off, len, options_.hasher(bytes.subspan(off, len)), bytes.data() + off});
        return true;
    });
    out.checksum = payload_checksum(bytes.size(), out.blocks);
    out.hash_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
}

PreparedPayload BlockStore::prepare(const PayloadSnapshot& snapshot, std::span<const size_t> cuts,
                                    std::vector<uint8_t>& joined, ReconstructError* error) const {
    if (std::optional<PreparedPayload> in_place =
            snapshot.prepare_in_place(options_, cuts, error)) {
        return std::move(*in_place);
    }
    if (*error == ReconstructError::None &&
        (*error = snapshot.reconstruct_into(joined)) == ReconstructError::None) {
        return prepare(joined, cuts);
    }
    return {};
}

void BlockStore::erase_block(BlockId id) {
    auto it = blocks_.find(id);
    auto bucket = by_hash_.find(it->second.hash);
    std::erase(bucket->second, id);
    if (bucket->second.empty()) {
        by_hash_.erase(bucket);
    }
    stats_.physical_bytes -= it->second.size;
    blocks_.erase(it);
    stats_.block_count = blocks_.size();
}

void BlockStore::rollback(const std::vector<std::pair<BlockId, bool>>& applied) {
    for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
        auto& block = blocks_.at(it->first);
        stats_.logical_bytes -= block.size;
        --block.refcount;
        if (it->second) {
            erase_block(it->first);  // created by this commit (refcount is 0 now)
        }
    }
}

uint64_t BlockStore::unstored_bytes(const PreparedPayload& prepared) const {
    uint64_t bytes = 0;
    std::unordered_set<Hash128, Hash128Hash> seen;
    for (const auto& pb : prepared.blocks) {
        if (!by_hash_.contains(pb.hash) && seen.insert(pb.hash).second) {
            bytes += pb.size;
        }
    }
    return bytes;
}

InsertOutcome BlockStore::commit(const PreparedPayload& prepared) {
    InsertOutcome out;
    if (prepared.error != InsertError::None) {
        out.error = prepared.error;
        return out;
    }
    const std::optional<size_t> fail_after = std::exchange(fail_after_, std::nullopt);
    std::vector<std::pair<BlockId, bool>> applied;  // (block, created here)
    InsertReport report;
    report.logical_bytes = prepared.size;
    report.hash_seconds = prepared.hash_seconds;
    InsertError error = InsertError::None;
    try {
        applied.reserve(prepared.blocks.size());
        out.payload.blocks.reserve(prepared.blocks.size());
        for (const auto& pb : prepared.blocks) {
            if (fail_after && applied.size() >= *fail_after) {
                error = InsertError::InjectedFailure;
                break;
            }
            const std::span<const uint8_t> seg = pb.span();
            BlockId found = 0;
            if (auto bucket = by_hash_.find(pb.hash); bucket != by_hash_.end()) {
                for (BlockId candidate : bucket->second) {
                    const Block& b = blocks_.at(candidate);
                    if (b.size == seg.size() &&
                        std::memcmp(b.data.get(), seg.data(), b.size) == 0) {
                        found = candidate;
                        break;
                    }
                }
                if (found == 0) {
                    ++report.hash_collisions;
                }
            }
            if (found != 0) {
                ++blocks_.at(found).refcount;
                applied.emplace_back(found, false);
                ++report.reused_blocks;
            } else {
                if (options_.max_physical_bytes != 0 &&
                    stats_.physical_bytes + seg.size() > options_.max_physical_bytes) {
                    error = InsertError::CapacityExceeded;
                    break;
                }
                Block block;
                block.data = BlockMemory::process().allocate(seg.size());
                if (!seg.empty()) {
                    std::memcpy(block.data.get(), seg.data(), seg.size());
                }
                block.size = seg.size();
                block.hash = pb.hash;
                block.refcount = 1;
                const BlockId id = next_block_;
                auto& bucket = by_hash_[pb.hash];
                bucket.push_back(id);
                try {
                    blocks_.emplace(id, std::move(block));
                } catch (...) {
                    bucket.pop_back();
                    if (bucket.empty()) {
                        by_hash_.erase(pb.hash);
                    }
                    throw;
                }
                ++next_block_;
                stats_.physical_bytes += seg.size();
                stats_.block_count = blocks_.size();
                applied.emplace_back(id, true);
                ++report.new_blocks;
                report.new_bytes += seg.size();
            }
            stats_.logical_bytes += seg.size();
            out.payload.blocks.push_back(applied.back().first);
        }
    } catch (const std::bad_alloc&) {
        error = InsertError::OutOfMemory;
    }
    if (error != InsertError::None) {
        rollback(applied);
        out.error = error;
        out.payload = StoredPayload{};
        return out;
    }
    out.payload.size = prepared.size;
    out.payload.checksum = prepared.checksum;
    out.report = report;
    ++stats_.inserts;
    stats_.new_blocks += report.new_blocks;
    stats_.reused_blocks += report.reused_blocks;
    stats_.hash_collisions += report.hash_collisions;
    stats_.hash_seconds += report.hash_seconds;
    return out;
}

ReleaseError BlockStore::release_blocks(std::span<const BlockId> blocks) {
    // Validate the whole batch before changing anything.
    std::unordered_map<BlockId, uint32_t> drops;
    uint64_t bytes = 0;
    for (BlockId id : blocks) {
        auto it = blocks_.find(id);
        if (it == blocks_.end()) {
            return ReleaseError::MissingBlock;
        }
        uint32_t& n = drops[id];
        ++n;
        if (n > it->second.refcount) {
            return ReleaseError::RefcountUnderflow;
        }
        bytes += it->second.size;
    }
    if (bytes > stats_.logical_bytes) {
        return ReleaseError::ByteUnderflow;
    }
    for (const auto& [id, n] : drops) {
        Block& block = blocks_.at(id);
        block.refcount -= n;
        if (block.refcount == 0) {
            erase_block(id);
        }
    }
    stats_.logical_bytes -= bytes;
    return ReleaseError::None;
}

std::optional<PayloadSnapshot> BlockStore::snapshot(const StoredPayload& payload) const {
    PayloadSnapshot snap;
    snap.size_ = payload.size;
    snap.checksum_ = payload.checksum;
    snap.hasher_ = options_.hasher;
    snap.parts_.reserve(payload.blocks.size());
    for (BlockId id : payload.blocks) {
        auto it = blocks_.find(id);
        if (it == blocks_.end()) {
            return std::nullopt;
        }
        snap.parts_.push_back({it->second.data, it->second.size});
    }
    return snap;
}

ReconstructResult BlockStore::reconstruct(const StoredPayload& payload, bool verify) const {
    auto snap = snapshot(payload);
    if (!snap) {
        ReconstructResult r;
        r.error = ReconstructError::MissingBlock;
        return r;
    }
    return snap->reconstruct(verify);
}

ReconstructResult PayloadSnapshot::reconstruct(bool verify) const {
    ReconstructResult result;
    if ((result.error = check_size()) != ReconstructError::None) {
        return result;
    }
    PayloadBytes bytes;
    const uint8_t* joined = nullptr;  // the copy, when there is one
    if (parts_.size() == 1) {
        const Part& p = parts_.front();
        bytes = PayloadBytes(std::shared_ptr<const uint8_t[]>(p.data), p.size, true);
    } else {
        std::shared_ptr<uint8_t[]> buffer =
            std::make_shared_for_overwrite<uint8_t[]>(static_cast<size_t>(size_));
        copy_to(buffer.get());
        joined = buffer.get();
        bytes = PayloadBytes(std::move(buffer), static_cast<size_t>(size_), false);
    }
    // The copy is what gets hashed, so what is returned is exactly what was verified.
    if (verify && (result.error = check_sum(joined)) != ReconstructError::None) {
        return result;
    }
    result.bytes = std::move(bytes);
    return result;
}

ReconstructError PayloadSnapshot::check_size() const {
    uint64_t total = 0;
    for (const Part& p : parts_) {
        total += p.size;
    }
    return total == size_ ? ReconstructError::None : ReconstructError::SizeMismatch;
}

ReconstructError PayloadSnapshot::check_sum(const uint8_t* joined) const {
    std::vector<Hash128> hashes;
    std::vector<size_t> sizes;
    hashes.reserve(parts_.size());
    sizes.reserve(parts_.size());
    size_t off = 0;
    for (const Part& p : parts_) {
        hashes.push_back(hasher_({joined != nullptr ? joined + off : p.data.get(), p.size}));
        sizes.push_back(p.size);
        off += p.size;
    }
    return payload_checksum(size_, hashes, sizes) == checksum_ ? ReconstructError::None
                                                               : ReconstructError::ChecksumMismatch;
}

void PayloadSnapshot::copy_to(uint8_t* out) const {
    size_t off = 0;
    for (const Part& p : parts_) {
        if (p.size != 0) {
            std::memcpy(out + off, p.data.get(), p.size);
        }
        off += p.size;
    }
}

std::vector<std::span<const uint8_t>> PayloadSnapshot::parts() const {
    std::vector<std::span<const uint8_t>> out;
    out.reserve(parts_.size());
    for (const Part& p : parts_) {
        out.emplace_back(p.data.get(), p.size);
    }
    return out;
}

ReconstructError PayloadSnapshot::verify() const {
    const ReconstructError size = check_size();
    return size != ReconstructError::None ? size : check_sum(nullptr);
}

std::optional<PreparedPayload> PayloadSnapshot::prepare_in_place(const BlockStoreOptions& cutting,
                                                                 std::span<const size_t> cuts,
                                                                 ReconstructError* error) const {
    *error = check_size();
    if (*error != ReconstructError::None || cutting.hasher != hasher_ || cutting.block_bytes == 0) {
        return std::nullopt;
    }
    // The blocks prepare() cuts must each be one stored part. (Invalid cuts: not lined up,
    // the joined path's prepare() reports them.)
    size_t part = 0;
    const bool lined_up = valid_cuts(size_, cuts) &&
                          for_each_block(size_, cuts, cutting.block_bytes, [&](size_t, size_t len) {
                              return part < parts_.size() && parts_[part++].size == len;
                          });
    if (!lined_up || part != parts_.size()) {
        return std::nullopt;
    }
    const auto start = std::chrono::steady_clock::now();
    PreparedPayload out;
    out.size = size_;
    out.blocks.reserve(parts_.size());
    size_t off = 0;
    for (const Part& p : parts_) {
        out.blocks.push_back({off, p.size, hasher_({p.data.get(), p.size}), p.data.get()});
        off += p.size;
    }
    out.checksum = payload_checksum(size_, out.blocks);
    if (out.checksum != checksum_) {
        *error = ReconstructError::ChecksumMismatch;
        return std::nullopt;
    }
    out.hash_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
}

ReconstructError PayloadSnapshot::reconstruct_into(std::vector<uint8_t>& out, bool verify) const {
    if (const ReconstructError size = check_size(); size != ReconstructError::None) {
        return size;
    }
    const auto size = static_cast<size_t>(size_);
    if (out.capacity() < size) {
        // Not resize()'s doubling: a buffer kept across calls would hold up to twice the
        // largest payload. The old one goes first, so that its space can be reused.
        std::vector<uint8_t>().swap(out);
        out.reserve(size + size / 8);  // (an eighth of headroom for a conversation's next turn)
    }
    out.resize(size);
    copy_to(out.data());
    return verify ? check_sum(out.data()) : ReconstructError::None;  // (the copy, hashed)
}

std::optional<uint32_t> BlockStore::refcount(BlockId block) const {
    auto it = blocks_.find(block);
    if (it == blocks_.end()) {
        return std::nullopt;
    }
    return it->second.refcount;
}

std::optional<size_t> BlockStore::block_size(BlockId block) const {
    auto it = blocks_.find(block);
    if (it == blocks_.end()) {
        return std::nullopt;
    }
    return it->second.size;
}

std::vector<BlockId> BlockStore::block_ids() const {
    std::vector<BlockId> ids;
    ids.reserve(blocks_.size());
    for (const auto& [id, b] : blocks_) {
        ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
}

bool BlockStore::debug_corrupt_block(BlockId block, size_t offset) {
    auto it = blocks_.find(block);
    if (it == blocks_.end() || offset >= it->second.size) {
        return false;
    }
    it->second.data[offset] ^= 0xff;
    return true;
}

}  // namespace skippy::cache
