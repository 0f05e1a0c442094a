// Lease: a movable, non-copyable RAII handle that keeps one cache entry from being
// evicted or freed while it is held.
//
//   std::optional<ExactHit> hit = exact_cache.acquire_longest(ns, tokens);
//   if (hit) {
//       use(hit->lease.entry());
//   }                           // lease released when `hit` goes out of scope
//   lease.reset();              // or release early
//
// A Lease is handed out by a LeaseOwner (RadixIndex, ExactStateCache, DiskStore) and
// must not outlive it. Releasing is noexcept and thread-safe iff the owner is.
#pragma once

#include <cstdint>
#include <utility>

namespace skippy::cache {

using EntryId = uint64_t;
inline constexpr EntryId kNoEntry = 0;

class LeaseOwner {
  public:
    virtual void release_lease(EntryId entry) noexcept = 0;

  protected:
    ~LeaseOwner() = default;
};

class Lease {
  public:
    Lease() = default;
    Lease(LeaseOwner* owner, EntryId entry) : owner_(owner), entry_(entry) {}
    ~Lease() { reset(); }

    Lease(Lease&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)),
          entry_(std::exchange(other.entry_, kNoEntry)) {}
    Lease& operator=(Lease&& other) noexcept {
        if (this != &other) {
            reset();
            owner_ = std::exchange(other.owner_, nullptr);
            entry_ = std::exchange(other.entry_, kNoEntry);
        }
        return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    // Releases the lease now (idempotent).
    void reset() noexcept {
        if (owner_ != nullptr) {
            std::exchange(owner_, nullptr)->release_lease(entry_);
            entry_ = kNoEntry;
        }
    }

    EntryId entry() const { return entry_; }
    const LeaseOwner* owner() const { return owner_; }
    bool held() const { return owner_ != nullptr; }
    explicit operator bool() const { return held(); }

  private:
    LeaseOwner* owner_ = nullptr;
    EntryId entry_ = kNoEntry;
};

}  // namespace skippy::cache
