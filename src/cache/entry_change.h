// EntryChange: what an ExactStateCache observer hears when an entry becomes visible to
// lookups or stops being visible (ExactStateCacheOptions::on_change).
//
//   ExactStateCacheOptions options;
//   options.on_change = [&queue](const EntryChange& c) {   // cache mutex held: enqueue only
//       queue.push({c.kind, c.ns, {c.tokens.begin(), c.tokens.end()}, c.page});
//   };
//
// Added: an insert stored the entry (Inserted or Replaced; not AlreadyPresent, not an insert
// that was undone). Removed: the entry left the lookups: LRU eviction, replacement by another
// page at the same path, quarantine (a leased entry is reported when it is hidden, not when
// its blocks are freed at the last release), namespace removal. An insert reports its Added
// before the removals it caused, so a replaced entry's shared prefix is never withdrawn and
// advertised again. `tokens` is only valid during the call.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/token.h"

namespace skippy::cache {

struct EntryChange {
    enum class Kind : uint8_t { Added, Removed };
    enum class Cause : uint8_t { Inserted, Evicted, Replaced, Quarantined, NamespaceRemoved };
    Kind kind = Kind::Added;
    Cause cause = Cause::Inserted;
    NamespaceId ns;
    std::span<const Token> tokens;
    PageId page;
};

using EntryObserver = std::function<void(const EntryChange&)>;

}  // namespace skippy::cache
