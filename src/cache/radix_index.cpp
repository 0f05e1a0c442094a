#include "cache/radix_index.h"

#include <algorithm>
#include <functional>
#include <sstream>
#include <unordered_set>

#include "cache/radix_index_nodes.h"

namespace skippy::cache {

namespace {

template <typename NodeT>
auto child_slot(NodeT* node, Token first) {
    return std::lower_bound(node->children.begin(), node->children.end(), first,
                            [](const auto& child, Token t) { return child->edge.front() < t; });
}

template <typename NodeT>
NodeT* child_of(NodeT* node, Token first) {
    auto it = child_slot(node, first);
    if (it == node->children.end() || (*it)->edge.front() != first) {
        return nullptr;
    }
    return it->get();
}

size_t common_prefix(std::span<const Token> a, std::span<const Token> b) {
    const size_t n = std::min(a.size(), b.size());
    return static_cast<size_t>(
        std::mismatch(a.begin(), a.begin() + static_cast<ptrdiff_t>(n), b.begin()).first -
        a.begin());
}

}  // namespace

const char* to_string(ComponentKind kind) {
    return kind == ComponentKind::Resident ? "resident" : "exact";
}

const char* to_string(InsertStatus status) {
    switch (status) {
        case InsertStatus::Inserted:
            return "inserted";
        case InsertStatus::Replaced:
            return "replaced";
        case InsertStatus::AlreadyPresent:
            return "already_present";
        case InsertStatus::Leased:
            return "leased";
        case InsertStatus::EmptyKey:
            return "empty_key";
    }
    return "?";
}

const char* to_string(RemoveStatus status) {
    switch (status) {
        case RemoveStatus::Removed:
            return "removed";
        case RemoveStatus::Deferred:
            return "deferred";
        case RemoveStatus::Leased:
            return "leased";
        case RemoveStatus::NotFound:
            return "not_found";
    }
    return "?";
}

RadixIndex::RadixIndex() = default;
RadixIndex::~RadixIndex() = default;

RadixIndex::Tree* RadixIndex::tree_for(const NamespaceId& ns) const {
    auto it = trees_.find(ns);
    return it == trees_.end() ? nullptr : it->second.get();
}

RadixIndex::Entry* RadixIndex::entry_ptr(EntryId id) {
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : &it->second;
}

const RadixIndex::Entry* RadixIndex::entry_ptr(EntryId id) const {
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : &it->second;
}

EntryInfo RadixIndex::make_info(const Entry& e) const {
    EntryInfo info;
    info.entry = e.id;
    info.kind = e.kind;
    info.ns = e.ns;
    info.token_count = e.node->depth;
    info.value = e.value;
    info.leases = e.leases;
    info.doomed = e.doomed;
    info.last_used = e.last_used;
    info.insert_seq = e.id;
    return info;
}

RemovedEntry RadixIndex::make_removed(const Entry& e) const {
    RemovedEntry r;
    r.entry = e.id;
    r.kind = e.kind;
    r.ns = e.ns;
    r.token_count = e.node->depth;
    r.value = e.value;
    return r;
}

RadixIndex::Node* RadixIndex::ensure_node(Tree& tree, std::span<const Token> tokens) {
    Node* node = tree.root.get();
    size_t pos = 0;
    while (pos < tokens.size()) {
        auto slot = child_slot(node, tokens[pos]);
        if (slot == node->children.end() || (*slot)->edge.front() != tokens[pos]) {
            auto leaf = std::make_unique<Node>();
            leaf->edge.assign(tokens.begin() + static_cast<ptrdiff_t>(pos), tokens.end());
            leaf->parent = node;
            leaf->depth = tokens.size();
            Node* raw = leaf.get();
            node->children.insert(slot, std::move(leaf));
            return raw;
        }
        Node* child = slot->get();
        const size_t p = common_prefix(child->edge, tokens.subspan(pos));
        if (p == child->edge.size()) {
            node = child;
            pos += p;
            continue;
        }
        // Split the edge: node -> mid (edge[0, p)) -> child (edge[p, ...)).
        auto mid = std::make_unique<Node>();
        mid->edge.assign(child->edge.begin(), child->edge.begin() + static_cast<ptrdiff_t>(p));
        mid->parent = node;
        mid->depth = node->depth + p;
        mid->below[0] = child->below[0];
        mid->below[1] = child->below[1];
        child->edge.erase(child->edge.begin(), child->edge.begin() + static_cast<ptrdiff_t>(p));
        child->parent = mid.get();
        Node* raw_mid = mid.get();
        mid->children.push_back(std::move(*slot));
        *slot = std::move(mid);
        node = raw_mid;
        pos += p;
    }
    return node;
}

const RadixIndex::Node* RadixIndex::find_node(const NamespaceId& ns,
                                              std::span<const Token> tokens) const {
    const Tree* tree = tree_for(ns);
    if (tree == nullptr || tokens.empty()) {
        return nullptr;
    }
    const Node* node = tree->root.get();
    size_t pos = 0;
    while (pos < tokens.size()) {
        const Node* child = child_of(node, tokens[pos]);
        if (child == nullptr) {
            return nullptr;
        }
        const size_t p = common_prefix(child->edge, tokens.subspan(pos));
        if (p != child->edge.size()) {
            return nullptr;
        }
        node = child;
        pos += p;
    }
    return node;
}

void RadixIndex::adjust_below(ComponentKind kind, Node* node, int delta) {
    const size_t k = kind_index(kind);
    for (; node != nullptr; node = node->parent) {
        node->below[k] = static_cast<size_t>(static_cast<ptrdiff_t>(node->below[k]) + delta);
    }
}

void RadixIndex::set_last_used(Entry& e, uint64_t stamp) {
    auto& lru = lru_[kind_index(e.kind)];
    if (e.leases == 0) {
        lru.erase(LruKey{e.last_used, e.id, e.id});
    }
    e.last_used = stamp;
    if (e.leases == 0) {
        lru.insert(LruKey{e.last_used, e.id, e.id});
    }
}

InsertResult RadixIndex::insert(ComponentKind kind, const NamespaceId& ns,
                                std::span<const Token> tokens, uint64_t value) {
    InsertResult result;
    if (tokens.empty()) {
        result.status = InsertStatus::EmptyKey;
        return result;
    }
    const size_t k = kind_index(kind);
    // Decide first without touching the structure, so a refused insert changes nothing.
    if (const Node* existing = find_node(ns, tokens);
        existing != nullptr && existing->component[k] != kNoEntry) {
        Entry& old = entries_.at(existing->component[k]);
        result.entry = old.id;
        if (old.doomed || (old.value != value && old.leases > 0)) {
            result.status = InsertStatus::Leased;
            return result;
        }
        if (old.value == value) {
            set_last_used(old, ++clock_);
            result.status = InsertStatus::AlreadyPresent;
            return result;
        }
        // Replace in place: the node keeps its structure, the entry is new.
        Node* node = old.node;
        result.replaced = make_removed(old);
        const EntryId old_id = old.id;
        lru_[k].erase(LruKey{old.last_used, old_id, old_id});
        entries_.erase(old_id);
        --count_[k];
        node->component[k] = kNoEntry;
        adjust_below(kind, node, -1);
        result.status = InsertStatus::Replaced;
    } else {
        result.status = InsertStatus::Inserted;
    }

    auto& tree_slot = trees_[ns];
    if (!tree_slot) {
        tree_slot = std::make_unique<Tree>();
    }
    Node* node = ensure_node(*tree_slot, tokens);

    Entry e;
    e.id = next_entry_++;
    e.kind = kind;
    e.ns = ns;
    e.node = node;
    e.value = value;
    e.last_used = ++clock_;
    node->component[k] = e.id;
    adjust_below(kind, node, +1);
    lru_[k].insert(LruKey{e.last_used, e.id, e.id});
    ++count_[k];
    result.entry = e.id;
    entries_.emplace(e.id, std::move(e));
    return result;
}

std::optional<ExactMatch> RadixIndex::find_exact(const NamespaceId& ns,
                                                 std::span<const Token> q) const {
    const Tree* tree = tree_for(ns);
    if (tree == nullptr) {
        return std::nullopt;
    }
    const size_t k = kind_index(ComponentKind::Exact);
    const Node* node = tree->root.get();
    const Node* best = nullptr;
    size_t pos = 0;
    while (pos < q.size()) {
        const Node* child = child_of(node, q[pos]);
        if (child == nullptr) {
            break;
        }
        const size_t p = common_prefix(child->edge, q.subspan(pos));
        if (p != child->edge.size()) {
            break;
        }
        node = child;
        pos += p;
        if (node->component[k] != kNoEntry && !entries_.at(node->component[k]).doomed) {
            best = node;
        }
    }
    if (best == nullptr) {
        return std::nullopt;
    }
    const Entry& e = entries_.at(best->component[k]);
    return ExactMatch{e.id, e.value, best->depth};
}

std::optional<ResidentMatch> RadixIndex::find_common(ComponentKind kind, const NamespaceId& ns,
                                                     std::span<const Token> q) const {
    const Tree* tree = tree_for(ns);
    if (tree == nullptr) {
        return std::nullopt;
    }
    const size_t k = kind_index(kind);
    const Node* node = tree->root.get();
    const Node* best = nullptr;
    size_t best_len = 0;
    size_t pos = 0;
    while (pos < q.size()) {
        const Node* child = child_of(node, q[pos]);
        if (child == nullptr || child->below[k] == 0) {
            break;
        }
        const size_t p = common_prefix(child->edge, q.subspan(pos));
        best = child;  // every path below `child` shares these pos + p tokens
        best_len = pos + p;
        if (p != child->edge.size()) {
            break;
        }
        node = child;
        pos += p;
    }
    if (best == nullptr) {
        return std::nullopt;
    }
    // Any live entry in best's subtree serves; take the shallowest-first, lowest-token
    // path (deterministic).
    const Node* m = best;
    while (m->component[k] == kNoEntry || entries_.at(m->component[k]).doomed) {
        const Node* next = nullptr;
        for (const auto& c : m->children) {
            if (c->below[k] > 0) {
                next = c.get();
                break;
            }
        }
        m = next;  // below[k] > 0 guarantees a live entry below
    }
    const Entry& e = entries_.at(m->component[k]);
    return ResidentMatch{e.id, e.value, best_len, m->depth};
}

std::optional<ExactMatch> RadixIndex::peek_exact(const NamespaceId& ns,
                                                 std::span<const Token> query) const {
    return find_exact(ns, query);
}

std::optional<ExactMatch> RadixIndex::lookup_exact(const NamespaceId& ns,
                                                   std::span<const Token> query) {
    auto m = find_exact(ns, query);
    if (m) {
        touch(m->entry);
    }
    return m;
}

std::optional<ResidentMatch> RadixIndex::peek_resident(const NamespaceId& ns,
                                                       std::span<const Token> query) const {
    return find_common(ComponentKind::Resident, ns, query);
}

std::optional<ResidentMatch> RadixIndex::lookup_resident(const NamespaceId& ns,
                                                         std::span<const Token> query) {
    auto m = find_common(ComponentKind::Resident, ns, query);
    if (m) {
        touch(m->entry);
    }
    return m;
}

std::optional<ResidentMatch> RadixIndex::peek_exact(const NamespaceId& ns,
                                                    std::span<const Token> query,
                                                    PrefixMatch match) const {
    if (match == PrefixMatch::Common) {
        return find_common(ComponentKind::Exact, ns, query);
    }
    const auto m = find_exact(ns, query);
    if (!m) {
        return std::nullopt;
    }
    return ResidentMatch{m->entry, m->value, m->len, m->len};
}

std::optional<ResidentMatch> RadixIndex::lookup_exact(const NamespaceId& ns,
                                                      std::span<const Token> query,
                                                      PrefixMatch match) {
    auto m = peek_exact(ns, query, match);
    if (m) {
        touch(m->entry);
    }
    return m;
}

std::optional<EntryId> RadixIndex::find(ComponentKind kind, const NamespaceId& ns,
                                        std::span<const Token> tokens) const {
    const Node* node = find_node(ns, tokens);
    if (node == nullptr) {
        return std::nullopt;
    }
    const EntryId id = node->component[kind_index(kind)];
    if (id == kNoEntry || entries_.at(id).doomed) {
        return std::nullopt;
    }
    return id;
}

std::vector<EntryInfo> RadixIndex::entries_on_path(ComponentKind kind, const NamespaceId& ns,
                                                   std::span<const Token> tokens) const {
    std::vector<EntryInfo> out;
    const Tree* tree = tree_for(ns);
    if (tree == nullptr) {
        return out;
    }
    const size_t k = kind_index(kind);
    const Node* node = tree->root.get();
    size_t pos = 0;
    while (pos < tokens.size()) {
        const Node* child = child_of(node, tokens[pos]);
        if (child == nullptr) {
            break;
        }
        const size_t p = common_prefix(child->edge, tokens.subspan(pos));
        if (p != child->edge.size()) {
            break;
        }
        node = child;
        pos += p;
        if (node->component[k] != kNoEntry) {
            const Entry& e = entries_.at(node->component[k]);
            if (!e.doomed) {
                out.push_back(make_info(e));
            }
        }
    }
    return out;
}

bool RadixIndex::touch(EntryId entry) {
    Entry* e = entry_ptr(entry);
    if (e == nullptr) {
        return false;
    }
    set_last_used(*e, ++clock_);
    return true;
}

Lease RadixIndex::acquire(EntryId entry) {
    if (!acquire_raw(entry)) {
        return Lease();
    }
    return Lease(this, entry);
}

bool RadixIndex::acquire_raw(EntryId entry) {
    Entry* e = entry_ptr(entry);
    if (e == nullptr || e->doomed) {
        return false;
    }
    if (e->leases == 0) {
        lru_[kind_index(e->kind)].erase(LruKey{e->last_used, e->id, e->id});
    }
    ++e->leases;
    return true;
}

std::optional<RemovedEntry> RadixIndex::release_raw(EntryId entry) {
    Entry* e = entry_ptr(entry);
    if (e == nullptr || e->leases == 0) {
        return std::nullopt;
    }
    --e->leases;
    if (e->leases > 0) {
        return std::nullopt;
    }
    if (e->doomed) {
        return erase_entry(entry);
    }
    lru_[kind_index(e->kind)].insert(LruKey{e->last_used, e->id, e->id});
    return std::nullopt;
}

void RadixIndex::release_lease(EntryId entry) noexcept { (void)release_raw(entry); }

void RadixIndex::normalize(const NamespaceId& ns, Node* node) {
    Tree* tree = tree_for(ns);
    Node* root = tree->root.get();
    while (node != root && !node->has_component()) {
        Node* parent = node->parent;
        auto slot = child_slot(parent, node->edge.front());
        if (node->children.empty()) {
            parent->children.erase(slot);  // destroys node
            node = parent;
            continue;
        }
        if (node->children.size() == 1) {
            std::unique_ptr<Node> child = std::move(node->children.front());
            child->edge.insert(child->edge.begin(), node->edge.begin(), node->edge.end());
            child->parent = parent;
            *slot = std::move(child);  // destroys node; first token unchanged
        }
        break;
    }
    if (root->children.empty()) {
        trees_.erase(ns);
    }
}

RemovedEntry RadixIndex::erase_entry(EntryId id) {
    Entry& e = entries_.at(id);
    const size_t k = kind_index(e.kind);
    RemovedEntry removed = make_removed(e);
    if (e.leases == 0) {
        lru_[k].erase(LruKey{e.last_used, e.id, e.id});
    }
    Node* node = e.node;
    node->component[k] = kNoEntry;
    if (!e.doomed) {
        adjust_below(e.kind, node, -1);
    }
    const NamespaceId ns = e.ns;
    entries_.erase(id);
    --count_[k];
    normalize(ns, node);
    return removed;
}

void RadixIndex::doom(Entry& e) {
    if (e.doomed) {
        return;
    }
    e.doomed = true;
    adjust_below(e.kind, e.node, -1);
}

RemoveResult RadixIndex::remove_entry(Entry& e, LeasedRemoval leased) {
    RemoveResult result;
    if (e.doomed) {
        result.status = RemoveStatus::Deferred;
        return result;
    }
    if (e.leases > 0) {
        if (leased == LeasedRemoval::Fail) {
            result.status = RemoveStatus::Leased;
        } else {
            doom(e);
            result.status = RemoveStatus::Deferred;
        }
        return result;
    }
    result.removed = erase_entry(e.id);
    result.status = RemoveStatus::Removed;
    return result;
}

RemoveResult RadixIndex::remove(EntryId entry, LeasedRemoval leased) {
    Entry* e = entry_ptr(entry);
    if (e == nullptr) {
        return RemoveResult{};
    }
    return remove_entry(*e, leased);
}

RemoveResult RadixIndex::remove(ComponentKind kind, const NamespaceId& ns,
                                std::span<const Token> tokens, LeasedRemoval leased) {
    const Node* node = find_node(ns, tokens);
    if (node == nullptr || node->component[kind_index(kind)] == kNoEntry) {
        return RemoveResult{};
    }
    return remove_entry(entries_.at(node->component[kind_index(kind)]), leased);
}

RemoveIfResult RadixIndex::remove_if(ComponentKind kind,
                                     const std::function<bool(const EntryInfo&)>& pred,
                                     LeasedRemoval leased) {
    RemoveIfResult result;
    std::vector<EntryId> ids;
    for (const auto& [id, e] : entries_) {
        if (e.kind == kind && !e.doomed) {
            ids.push_back(id);
        }
    }
    std::sort(ids.begin(), ids.end());
    for (EntryId id : ids) {
        Entry& e = entries_.at(id);
        if (!pred(make_info(e))) {
            continue;
        }
        RemoveResult r = remove_entry(e, leased);
        if (r.status == RemoveStatus::Removed) {
            result.removed.push_back(*r.removed);
        } else if (r.status == RemoveStatus::Deferred) {
            ++result.deferred;
        } else if (r.status == RemoveStatus::Leased) {
            ++result.leased_skipped;
        }
    }
    return result;
}

std::optional<EntryInfo> RadixIndex::lru_victim(ComponentKind kind, EntryId exclude) const {
    for (const LruKey& key : lru_[kind_index(kind)]) {
        const EntryId id = std::get<2>(key);
        if (id != exclude) {
            return make_info(entries_.at(id));
        }
    }
    return std::nullopt;
}

std::optional<RemovedEntry> RadixIndex::evict_lru(ComponentKind kind, EntryId exclude) {
    auto victim = lru_victim(kind, exclude);
    if (!victim) {
        return std::nullopt;
    }
    return erase_entry(victim->entry);
}

std::optional<EntryInfo> RadixIndex::info(EntryId entry) const {
    const Entry* e = entry_ptr(entry);
    if (e == nullptr) {
        return std::nullopt;
    }
    return make_info(*e);
}

std::vector<Token> RadixIndex::tokens_of(EntryId entry) const {
    const Entry* e = entry_ptr(entry);
    if (e == nullptr) {
        return {};
    }
    std::vector<Token> out(e->node->depth);
    size_t end = out.size();
    for (const Node* n = e->node; n->parent != nullptr; n = n->parent) {
        end -= n->edge.size();
        std::copy(n->edge.begin(), n->edge.end(), out.begin() + static_cast<ptrdiff_t>(end));
    }
    return out;
}

std::vector<EntryInfo> RadixIndex::entries(ComponentKind kind) const {
    std::vector<EntryInfo> out;
    for (const auto& [id, e] : entries_) {
        if (e.kind == kind) {
            out.push_back(make_info(e));
        }
    }
    std::sort(out.begin(), out.end(),
              [](const EntryInfo& a, const EntryInfo& b) { return a.entry < b.entry; });
    return out;
}

std::vector<NamespaceId> RadixIndex::namespaces() const {
    std::vector<NamespaceId> out;
    out.reserve(trees_.size());
    for (const auto& [ns, tree] : trees_) {
        out.push_back(ns);
    }
    return out;
}

size_t RadixIndex::longest_elsewhere(const NamespaceId& ns, std::span<const Token> query,
                                     size_t max_namespaces) const {
    size_t best = 0;
    size_t visited = 0;
    for (const auto& [other, tree] : trees_) {
        if (other == ns) {
            continue;
        }
        if (visited++ == max_namespaces) {
            break;
        }
        if (auto m = peek_exact(other, query, PrefixMatch::Common)) {
            best = std::max(best, m->matched_len);
        }
    }
    return best;
}

size_t RadixIndex::size(ComponentKind kind) const { return count_[kind_index(kind)]; }

size_t RadixIndex::leased_count(ComponentKind kind) const {
    // Every unleased entry is in the LRU set and no leased one is (check_invariants).
    const size_t k = kind_index(kind);
    return count_[k] - lru_[k].size();
}

}  // namespace skippy::cache
