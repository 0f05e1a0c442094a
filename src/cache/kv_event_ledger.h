// KvEventLedger: turns exact-cache entry changes (entry_change.h) into the block events a
// KV-aware router consumes (vLLM's BlockStored / BlockRemoved / AllBlocksCleared), for one
// medium (one ledger per tier).
//
//   KvEventLedger ledger({.block_size = 16});
//   std::vector<KvEvent> out;
//   ledger.add(ns, tokens, page, out);      // BlockStored for the blocks new to routers
//   ledger.remove(ns, tokens, page, out);   // BlockRemoved for blocks no entry covers now
//   ledger.clear(out);                      // BlockRemoved for all, then AllBlocksCleared
//
// Blocks: an entry of L tokens covers the full blocks [0,bs), [bs,2bs), ... (the partial
// tail is never advertised, as in vLLM). Block i's hash is chain(hash of block i-1, its bs
// token ids), block 0 chained from root_seed(namespace): the same namespace and token prefix
// always give the same hash, across restarts and replicas; never 0 (llm-d reads a 0 parent as
// "none"). Each block is refcounted by the entries whose advertised chain contains it: add()
// emits one BlockStored with the entry's blocks that were not advertised yet (a suffix of its
// chain, in order, with their token ids and parent_block_hash = the block before the first
// new one, none at the root); remove() emits one BlockRemoved with the blocks whose count
// dropped to zero (deepest first). An entry is known by (namespace, page, length): adding a
// known entry again and removing an unknown one change nothing, so a lost change never
// corrupts the counts.
//
// Restorable prefixes (options.checkpoint_only, hybrid and recurrent models): such an entry
// restores only at exactly its length L (the recurrent state is a checkpoint there), not at
// every block boundary below it. Its chain is advertised only when L is a multiple of the
// block size, so that the deepest advertised block of the chain ends exactly at a restorable
// state; otherwise nothing is advertised for it (rounding down would advertise a prefix that
// no stored state can serve). The shallower blocks of that chain are advertised only because
// a router needs the unbroken parent chain: with checkpoint_only, a match is worth a hit only
// when it ends at the last block of some BlockStored chain. Dense models: every full block
// of a stored entry is a restorable prefix (KV pages are trimmed to any common prefix).
//
// Thread safety: none; one owner thread (the KV event publisher's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/token.h"

namespace skippy::cache {

struct KvEventLedgerOptions {
    uint32_t block_size = 16;      // tokens per advertised block (>= 1)
    bool checkpoint_only = false;  // hybrid/recurrent: see "Restorable prefixes" above
};

enum class KvEventType : uint8_t { BlockStored, BlockRemoved, AllBlocksCleared };
const char* to_string(KvEventType type);  // vLLM's tag: "BlockStored", ...

struct KvEvent {
    KvEventType type = KvEventType::BlockStored;
    std::vector<uint64_t> block_hashes;
    std::optional<uint64_t> parent_block_hash;  // BlockStored only; nullopt at the root
    std::vector<Token> token_ids;               // BlockStored: block_hashes.size() * block_size
};

class KvEventLedger {
  public:
    explicit KvEventLedger(KvEventLedgerOptions options = {});

    void add(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
             std::vector<KvEvent>& out);
    void remove(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                std::vector<KvEvent>& out);
    // Everything withdrawn: one BlockRemoved with every advertised block (routers that ignore
    // AllBlocksCleared, like llm-d's, still forget them), then AllBlocksCleared.
    void clear(std::vector<KvEvent>& out);

    // The blocks of an entry this ledger would advertise (empty if none), root first.
    std::vector<uint64_t> chain_of(const NamespaceId& ns, std::span<const Token> tokens) const;
    static uint64_t root_seed(const NamespaceId& ns);
    static uint64_t chain(uint64_t parent, std::span<const Token> block);

    size_t advertised_blocks() const { return refs_.size(); }
    size_t entries() const { return entries_.size(); }
    const KvEventLedgerOptions& options() const { return options_; }

  private:
    struct EntryKey {
        NamespaceId ns;
        uint64_t page = 0;
        size_t len = 0;
        bool operator==(const EntryKey&) const = default;
    };
    struct EntryKeyHash {
        size_t operator()(const EntryKey& k) const noexcept {
            return NamespaceIdHash{}(k.ns) ^ (k.page * 0x9e3779b97f4a7c15ull) ^ k.len;
        }
    };

    KvEventLedgerOptions options_;
    std::unordered_map<EntryKey, std::vector<uint64_t>, EntryKeyHash> entries_;
    std::unordered_map<uint64_t, uint32_t> refs_;  // block hash -> entries advertising it
};

}  // namespace skippy::cache
