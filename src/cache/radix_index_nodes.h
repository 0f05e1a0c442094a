// RadixIndex's node, tree and entry records: private to radix_index*.cpp (the index itself
// and its diagnostics), not part of the cache's interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cache/radix_index.h"

namespace skippy::cache {

struct RadixIndex::Node {
    std::vector<Token> edge;  // label from the parent; empty only at the root
    Node* parent = nullptr;
    std::vector<std::unique_ptr<Node>> children;  // sorted by edge.front()
    size_t depth = 0;                             // tokens from the root to this node
    EntryId component[2] = {kNoEntry, kNoEntry};
    size_t below[2] = {0, 0};  // non-doomed entries of each kind in this subtree (incl. self)

    bool has_component() const { return component[0] != kNoEntry || component[1] != kNoEntry; }
};

struct RadixIndex::Tree {
    std::unique_ptr<Node> root = std::make_unique<Node>();
};

struct RadixIndex::Entry {
    EntryId id = kNoEntry;
    ComponentKind kind = ComponentKind::Exact;
    NamespaceId ns;
    Node* node = nullptr;
    uint64_t value = 0;
    uint64_t last_used = 0;
    uint32_t leases = 0;
    bool doomed = false;
};

inline size_t kind_index(ComponentKind kind) { return static_cast<size_t>(kind); }

}  // namespace skippy::cache
