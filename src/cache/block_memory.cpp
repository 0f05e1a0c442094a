#include "cache/block_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <new>
#include <utility>
#include <vector>

namespace skippy::cache {
namespace {

size_t page_bytes() {
    static const size_t page = [] {
        const long p = sysconf(_SC_PAGESIZE);
        return p > 0 ? static_cast<size_t>(p) : size_t{4096};
    }();
    return page;
}

}  // namespace

BlockMemory::BlockMemory(BlockMemoryOptions options) : options_(options) {
    idle_.reserve(kMaxIdleMappings);
}

BlockMemory::~BlockMemory() {
    for (const Idle& m : idle_) {
        munmap(m.data, m.mapped);
    }
}

BlockMemory& BlockMemory::process() {
    static BlockMemory* const instance = new BlockMemory();
    return *instance;
}

std::shared_ptr<uint8_t[]> BlockMemory::allocate(size_t size) {
    if (size < options_.min_mapped_bytes) {
        return std::make_shared_for_overwrite<uint8_t[]>(size);
    }
    const size_t page = page_bytes();
    const size_t mapped = (size + page - 1) / page * page;
    uint8_t* data = nullptr;
    {
        std::lock_guard lock(mu_);
        // Only a mapping of the same page count: a larger one keeps its extra pages resident.
        const auto it = std::find_if(idle_.rbegin(), idle_.rend(),
                                     [&](const Idle& m) { return m.mapped == mapped; });
        if (it != idle_.rend()) {
            data = it->data;
            idle_.erase(std::next(it).base());
            stats_.idle_bytes -= mapped;
            ++stats_.reuses;
        }
    }
    if (data == nullptr) {
        void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            throw std::bad_alloc();
        }
        data = static_cast<uint8_t*>(p);
        std::lock_guard lock(mu_);
        stats_.mapped_bytes += mapped;
        ++stats_.maps;
    }
    // (Should the control block's allocation throw, shared_ptr calls the deleter first.)
    return std::shared_ptr<uint8_t[]>(data, [this, mapped](uint8_t* p) { release(p, mapped); });
}

void BlockMemory::release(uint8_t* data, size_t mapped) noexcept {
    // At most the bound's worth of mappings leave the list here; a fixed array keeps the
    // deleter free of allocations.
    Idle unmap[kMaxUnmapPerRelease];
    size_t n_unmap = 0;
    {
        std::lock_guard lock(mu_);
        if (mapped > options_.max_idle_bytes || idle_.size() >= kMaxIdleMappings) {
            unmap[n_unmap++] = Idle{mapped, data};
            stats_.mapped_bytes -= mapped;
        } else {
            idle_.push_back(Idle{mapped, data});  // (capacity reserved: does not allocate)
            stats_.idle_bytes += mapped;
            // Over the bound: unmap the oldest idle mappings first.
            while (stats_.idle_bytes > options_.max_idle_bytes && n_unmap < kMaxUnmapPerRelease) {
                unmap[n_unmap++] = idle_.front();
                stats_.idle_bytes -= idle_.front().mapped;
                stats_.mapped_bytes -= idle_.front().mapped;
                idle_.erase(idle_.begin());
            }
        }
    }
    for (size_t i = 0; i < n_unmap; ++i) {
        munmap(unmap[i].data, unmap[i].mapped);
    }
}

void BlockMemory::trim_idle(size_t keep_bytes) {
    std::vector<Idle> unmap;
    {
        std::lock_guard lock(mu_);
        size_t n = 0;
        while (n < idle_.size() && stats_.idle_bytes > keep_bytes) {
            stats_.idle_bytes -= idle_[n].mapped;
            stats_.mapped_bytes -= idle_[n].mapped;
            ++n;
        }
        unmap.assign(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(n));
        idle_.erase(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    for (const Idle& m : unmap) {
        munmap(m.data, m.mapped);
    }
}

BlockMemoryStats BlockMemory::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

}  // namespace skippy::cache
