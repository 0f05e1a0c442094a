// BufferPool: recycled byte buffers for state copies (lane exports, recurrent checkpoints,
// encoded payloads). A buffer the process allocates afresh costs a page fault per 4 KiB page
// on first touch (measured on this 2-core VM: ~2.5 ms per MiB, 16 ms for one 1k-token dense
// export, 130 ms for an 8k one), and a freed one of more than 32 MiB goes back to the kernel
// at once (glibc), so the next copy of the same size pays again. Copies into a buffer that
// was used before cost a memcpy (~0.1 ms per MiB).
//
//   auto pool = std::make_shared<BufferPool>(64 << 20, 8);
//   std::vector<uint8_t> buf = pool->take(n);    // size n, from an idle buffer if one fits
//   ... fill buf ...
//   pool->give(std::move(buf));                  // kept for the next take (bounded)
//   auto shared = pool->share(std::move(buf));   // shared_ptr that gives it back when freed
//
// Bounds: at most `max_buffers` idle buffers of `max_idle_bytes` capacity in all; beyond,
// given buffers are freed (the largest idle ones are kept). idle_bytes() is what the pool
// holds that no payload uses; the stage counts it against the cache's byte budget.
//
// Thread safety: every method may be called from any thread (one mutex, held for a few
// vector moves). Buffers given back after the pool's last owner is gone are freed.
#pragma once

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace skippy::stage {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
  public:
    BufferPool(size_t max_idle_bytes, size_t max_buffers)
        : max_idle_bytes_(max_idle_bytes), max_buffers_(max_buffers) {}

    // A buffer of exactly `size` bytes (contents unspecified): the smallest idle one whose
    // capacity fits, else a new one with a quarter of headroom (at most `max_new_capacity`).
    std::vector<uint8_t> take(size_t size, size_t max_new_capacity = SIZE_MAX);
    // An empty buffer (size 0) with the largest idle capacity, for appending.
    std::vector<uint8_t> take_empty();
    void give(std::vector<uint8_t>&& buffer);
    // Frees idle buffers, the smallest first, until at most `max_idle` bytes are idle.
    void trim_idle(size_t max_idle);
    // The buffer behind a shared_ptr that gives it back to this pool when the last owner
    // drops it.
    std::shared_ptr<const std::vector<uint8_t>> share(std::vector<uint8_t>&& buffer);

    size_t idle_bytes() const { return idle_bytes_.load(std::memory_order_relaxed); }

  private:
    std::vector<uint8_t> take_locked(size_t index);
    void drop_smallest_locked();

    const size_t max_idle_bytes_;
    const size_t max_buffers_;
    mutable std::mutex mu_;
    std::vector<std::vector<uint8_t>> idle_;  // (guarded by mu_)
    std::atomic<size_t> idle_bytes_{0};
};

}  // namespace skippy::stage
