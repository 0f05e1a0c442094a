#include "cache/kv_event_ledger.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace skippy::cache {

namespace {

uint64_t nonzero(uint64_t h) { return h == 0 ? 1 : h; }

}  // namespace

const char* to_string(KvEventType type) {
    switch (type) {
        case KvEventType::BlockStored:
            return "BlockStored";
        case KvEventType::BlockRemoved:
            return "BlockRemoved";
        case KvEventType::AllBlocksCleared:
            return "AllBlocksCleared";
    }
    return "?";
}

KvEventLedger::KvEventLedger(KvEventLedgerOptions options) : options_(options) {
    options_.block_size = std::max<uint32_t>(1, options_.block_size);
}

uint64_t KvEventLedger::root_seed(const NamespaceId& ns) {
    static constexpr char kLabel[] = "skippy-kv-events-v1";
    std::array<uint8_t, sizeof(kLabel) - 1 + 32> buf{};
    std::memcpy(buf.data(), kLabel, sizeof(kLabel) - 1);
    std::memcpy(buf.data() + sizeof(kLabel) - 1, ns.digest().bytes.data(), 32);
    return nonzero(XXH3_64bits(buf.data(), buf.size()));
}

uint64_t KvEventLedger::chain(uint64_t parent, std::span<const Token> block) {
    // Token ids as little-endian int32 whatever the host, so hashes agree across platforms.
    std::vector<uint8_t> bytes(block.size() * 4);
    for (size_t i = 0; i < block.size(); ++i) {
        const auto v = static_cast<uint32_t>(block[i]);
        bytes[4 * i] = static_cast<uint8_t>(v);
        bytes[4 * i + 1] = static_cast<uint8_t>(v >> 8);
        bytes[4 * i + 2] = static_cast<uint8_t>(v >> 16);
        bytes[4 * i + 3] = static_cast<uint8_t>(v >> 24);
    }
    return nonzero(XXH3_64bits_withSeed(bytes.data(), bytes.size(), parent));
}

std::vector<uint64_t> KvEventLedger::chain_of(const NamespaceId& ns,
                                              std::span<const Token> tokens) const {
    const size_t bs = options_.block_size;
    if (options_.checkpoint_only && tokens.size() % bs != 0) {
        return {};
    }
    const size_t n = tokens.size() / bs;
    std::vector<uint64_t> hashes;
    hashes.reserve(n);
    uint64_t h = root_seed(ns);
    for (size_t i = 0; i < n; ++i) {
        h = chain(h, tokens.subspan(i * bs, bs));
        hashes.push_back(h);
    }
    return hashes;
}

void KvEventLedger::add(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                        std::vector<KvEvent>& out) {
    EntryKey key{ns, page.value(), tokens.size()};
    if (entries_.contains(key)) {
        return;
    }
    std::vector<uint64_t> hashes = chain_of(ns, tokens);
    if (hashes.empty()) {
        return;
    }
    // Blocks already advertised form a prefix of the chain (a block's count never exceeds
    // its parent's), so the new ones are the suffix from the first count that was 0.
    size_t first_new = hashes.size();
    for (size_t i = 0; i < hashes.size(); ++i) {
        if (refs_[hashes[i]]++ == 0 && first_new == hashes.size()) {
            first_new = i;
        }
    }
    if (first_new < hashes.size()) {
        const size_t bs = options_.block_size;
        KvEvent ev;
        ev.type = KvEventType::BlockStored;
        ev.block_hashes.assign(hashes.begin() + static_cast<std::ptrdiff_t>(first_new),
                               hashes.end());
        if (first_new > 0) {
            ev.parent_block_hash = hashes[first_new - 1];
        }
        const auto from = tokens.begin() + static_cast<std::ptrdiff_t>(first_new * bs);
        ev.token_ids.assign(from, tokens.begin() + static_cast<std::ptrdiff_t>(hashes.size() * bs));
        out.push_back(std::move(ev));
    }
    entries_.emplace(std::move(key), std::move(hashes));
}

void KvEventLedger::remove(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                           std::vector<KvEvent>& out) {
    auto it = entries_.find(EntryKey{ns, page.value(), tokens.size()});
    if (it == entries_.end()) {
        return;
    }
    KvEvent ev;
    ev.type = KvEventType::BlockRemoved;
    const std::vector<uint64_t>& hashes = it->second;
    for (size_t i = hashes.size(); i-- > 0;) {  // deepest first
        auto ref = refs_.find(hashes[i]);
        if (ref != refs_.end() && --ref->second == 0) {
            refs_.erase(ref);
            ev.block_hashes.push_back(hashes[i]);
        }
    }
    entries_.erase(it);
    if (!ev.block_hashes.empty()) {
        out.push_back(std::move(ev));
    }
}

void KvEventLedger::clear(std::vector<KvEvent>& out) {
    if (!refs_.empty()) {
        KvEvent removed;
        removed.type = KvEventType::BlockRemoved;
        removed.block_hashes.reserve(refs_.size());
        for (const auto& [hash, count] : refs_) {
            removed.block_hashes.push_back(hash);
        }
        out.push_back(std::move(removed));
    }
    KvEvent cleared;
    cleared.type = KvEventType::AllBlocksCleared;
    out.push_back(std::move(cleared));
    refs_.clear();
    entries_.clear();
}

}  // namespace skippy::cache
