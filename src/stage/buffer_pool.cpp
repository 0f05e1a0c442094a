#include "stage/buffer_pool.h"

#include <algorithm>
#include <utility>

namespace skippy::stage {

std::vector<uint8_t> BufferPool::take_locked(size_t index) {
    std::vector<uint8_t> out = std::move(idle_[index]);
    idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(index));
    idle_bytes_.fetch_sub(out.capacity(), std::memory_order_relaxed);
    return out;
}

std::vector<uint8_t> BufferPool::take(size_t size, size_t max_new_capacity) {
    std::vector<uint8_t> out;
    {
        std::lock_guard lock(mu_);
        size_t best = idle_.size();
        for (size_t i = 0; i < idle_.size(); ++i) {
            const size_t cap = idle_[i].capacity();
            if (cap >= size && (best == idle_.size() || cap < idle_[best].capacity())) {
                best = i;
            }
        }
        if (best != idle_.size()) {
            out = take_locked(best);
        }
    }
    if (out.capacity() < size) {
        // None fits: a new one with a quarter of headroom, so that a state that grows a little
        // (the next turn of a conversation) fits it next time. (Growing an old one would copy
        // bytes that are about to be overwritten.)
        out.reserve(std::max(size, std::min(size + size / 4, max_new_capacity)));
    }
    // Within the capacity: only the part beyond the old size is written here.
    out.resize(size);
    return out;
}

std::vector<uint8_t> BufferPool::take_empty() {
    std::vector<uint8_t> out;
    {
        std::lock_guard lock(mu_);
        if (!idle_.empty()) {
            size_t largest = 0;
            for (size_t i = 1; i < idle_.size(); ++i) {
                if (idle_[i].capacity() > idle_[largest].capacity()) {
                    largest = i;
                }
            }
            out = take_locked(largest);
        }
    }
    out.clear();
    return out;
}

void BufferPool::give(std::vector<uint8_t>&& buffer) {
    if (buffer.capacity() == 0 || buffer.capacity() > max_idle_bytes_) {
        return;  // (freed by the caller's moved-from vector going out of scope)
    }
    std::lock_guard lock(mu_);
    idle_bytes_.fetch_add(buffer.capacity(), std::memory_order_relaxed);
    idle_.push_back(std::move(buffer));
    // Over a bound: drop the smallest idle buffers (the large ones are the costly ones).
    while (idle_.size() > max_buffers_) {
        drop_smallest_locked();
    }
    while (idle_bytes_.load(std::memory_order_relaxed) > max_idle_bytes_) {
        drop_smallest_locked();
    }
}

void BufferPool::trim_idle(size_t max_idle) {
    std::lock_guard lock(mu_);
    while (!idle_.empty() && idle_bytes_.load(std::memory_order_relaxed) > max_idle) {
        drop_smallest_locked();
    }
}

void BufferPool::drop_smallest_locked() {
    const auto smallest =
        std::min_element(idle_.begin(), idle_.end(),
                         [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
    idle_bytes_.fetch_sub(smallest->capacity(), std::memory_order_relaxed);
    idle_.erase(smallest);
}

std::shared_ptr<const std::vector<uint8_t>> BufferPool::share(std::vector<uint8_t>&& buffer) {
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<const std::vector<uint8_t>>(
        new std::vector<uint8_t>(std::move(buffer)), [pool](const std::vector<uint8_t>* p) {
            auto* owned = const_cast<std::vector<uint8_t>*>(p);  // (we allocated it non-const)
            if (auto alive = pool.lock()) {
                alive->give(std::move(*owned));
            }
            delete owned;
        });
}

}  // namespace skippy::stage
