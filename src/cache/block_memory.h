// BlockMemory: the bytes of the RAM tier's blocks, each large block in an anonymous mapping
// of its own, outside malloc's heap; a freed block's mapping is kept for the next block of
// the same page count.
//
//   std::shared_ptr<uint8_t[]> bytes = BlockMemory::process().allocate(size);  // or bad_alloc
//   ... the last owner drops it: its mapping goes to the idle list (bounded) or is unmapped.
//   BlockMemory::process().trim_idle(4 << 20);  // after a change: unmap what was not reused
//
// Why not malloc: the RAM tier's blocks live long (until evicted) and are freed in LRU
// order, while the buffers around them (state exports, disk reads, request bodies) come and
// go. Interleaved in one heap, the freed blocks leave holes that glibc keeps and cannot give
// back: measured at equal cache budgets (issue 31), skippy's heap held 66 MiB of free memory
// beside a 70 MiB RAM tier. Blocks in their own mappings leave no holes: an evicted block's
// pages are either reused as they are by the next block (no page fault, no syscall) or
// unmapped.
//
// Blocks below `min_mapped_bytes` (headers, small tails) still come from malloc: a mapping
// per few KiB would waste pages and syscalls.
//
// Thread safety: allocate() and the deleters may run on any thread (one mutex around the
// idle list, held for a few pointer moves; mmap/munmap run outside it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace skippy::cache {

struct BlockMemoryOptions {
    size_t min_mapped_bytes = size_t{64} << 10;  // smaller blocks: malloc
    // Freed mappings kept for reuse, in all, between trim_idle() calls. The owner of the
    // blocks frees a whole entry's blocks (an eviction) right before storing the next
    // entry's, which take their mappings; then it calls trim_idle().
    size_t max_idle_bytes = size_t{64} << 20;
};

struct BlockMemoryStats {
    uint64_t mapped_bytes = 0;  // live and idle mappings
    uint64_t idle_bytes = 0;    // mappings no block uses
    uint64_t maps = 0;          // mmap calls
    uint64_t reuses = 0;        // blocks placed in an idle mapping
};

class BlockMemory {
  public:
    explicit BlockMemory(BlockMemoryOptions options = {});
    ~BlockMemory();
    BlockMemory(const BlockMemory&) = delete;
    BlockMemory& operator=(const BlockMemory&) = delete;

    // An instance must outlive the blocks it hands out (their deleters call it back).
    // The process-wide instance (never destroyed: blocks may outlive static destructors).
    static BlockMemory& process();

    // `size` bytes, contents unspecified; throws std::bad_alloc.
    std::shared_ptr<uint8_t[]> allocate(size_t size);

    // Unmaps idle mappings, the oldest first, until at most `keep_bytes` are idle.
    void trim_idle(size_t keep_bytes);

    BlockMemoryStats stats() const;

  private:
    struct Idle {
        size_t mapped = 0;
        uint8_t* data = nullptr;
    };
    // The idle list's capacity, reserved up front so that a deleter never allocates.
    static constexpr size_t kMaxIdleMappings = 256;
    // A release unmaps at most this many idle mappings (the next releases go on).
    static constexpr size_t kMaxUnmapPerRelease = 32;

    void release(uint8_t* data, size_t mapped) noexcept;

    const BlockMemoryOptions options_;
    mutable std::mutex mu_;
    std::vector<Idle> idle_;  // oldest first (guarded by mu_)
    BlockMemoryStats stats_;  // (guarded by mu_)
};

}  // namespace skippy::cache
