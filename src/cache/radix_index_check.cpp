// RadixIndex diagnostics: node walks, sizes and the invariant check the randomized tests
// run after every operation (radix_index.h: check_invariants).
#include <functional>
#include <sstream>
#include <unordered_set>

#include "cache/radix_index.h"
#include "cache/radix_index_nodes.h"

namespace skippy::cache {

void RadixIndex::for_each_node(const std::function<void(const Node&)>& visit) const {
    std::vector<const Node*> stack;
    for (const auto& [ns, tree] : trees_) {
        stack.push_back(tree->root.get());
    }
    while (!stack.empty()) {
        const Node* node = stack.back();
        stack.pop_back();
        visit(*node);
        for (const auto& c : node->children) {
            stack.push_back(c.get());
        }
    }
}

size_t RadixIndex::distinct_token_count() const {
    size_t n = 0;
    for_each_node([&](const Node& node) { n += node.edge.size(); });
    return n;
}

size_t RadixIndex::node_count() const {
    size_t n = 0;
    for_each_node([&](const Node&) { ++n; });
    return n;
}

std::optional<std::string> RadixIndex::check_invariants() const {
    std::ostringstream err;
    std::unordered_set<EntryId> seen;
    for (const auto& [ns, tree] : trees_) {
        const Node* root = tree->root.get();
        if (!root->edge.empty() || root->has_component() || root->depth != 0 ||
            root->parent != nullptr) {
            err << "bad root in namespace " << ns.short_hex();
            return err.str();
        }
        if (root->children.empty()) {
            err << "empty tree kept for namespace " << ns.short_hex();
            return err.str();
        }
        // Post-order check of the per-kind counts below; pre-order for the rest.
        std::vector<std::pair<const Node*, bool>> stack{{root, false}};
        std::unordered_map<const Node*, std::pair<size_t, size_t>> below;
        while (!stack.empty()) {
            auto [node, expanded] = stack.back();
            stack.pop_back();
            if (!expanded) {
                stack.push_back({node, true});
                for (size_t i = 0; i < node->children.size(); ++i) {
                    const Node* c = node->children[i].get();
                    if (c->edge.empty()) {
                        return std::string("empty edge label");
                    }
                    if (c->parent != node) {
                        return std::string("wrong parent pointer");
                    }
                    if (c->depth != node->depth + c->edge.size()) {
                        return std::string("wrong depth");
                    }
                    if (i > 0 && !(node->children[i - 1]->edge.front() < c->edge.front())) {
                        return std::string("children not unique/sorted by first token");
                    }
                    stack.push_back({c, false});
                }
                if (node != root && !node->has_component() && node->children.size() < 2) {
                    return std::string("componentless node with fewer than two children");
                }
                for (size_t k = 0; k < 2; ++k) {
                    const EntryId id = node->component[k];
                    if (id == kNoEntry) {
                        continue;
                    }
                    const Entry* e = entry_ptr(id);
                    if (e == nullptr || e->node != node || kind_index(e->kind) != k ||
                        !(e->ns == ns)) {
                        return std::string("component does not match its entry");
                    }
                    seen.insert(id);
                }
                continue;
            }
            size_t sum[2] = {0, 0};
            for (size_t k = 0; k < 2; ++k) {
                const EntryId id = node->component[k];
                if (id != kNoEntry && !entries_.at(id).doomed) {
                    sum[k] = 1;
                }
            }
            for (const auto& c : node->children) {
                sum[0] += below.at(c.get()).first;
                sum[1] += below.at(c.get()).second;
            }
            if (sum[0] != node->below[0] || sum[1] != node->below[1]) {
                return std::string("wrong per-kind entry count below a node");
            }
            below[node] = {sum[0], sum[1]};
        }
    }
    if (seen.size() != entries_.size()) {
        return std::string("entries not reachable from any tree");
    }
    size_t unleased[2] = {0, 0};
    size_t counted[2] = {0, 0};
    for (const auto& [id, e] : entries_) {
        const size_t k = kind_index(e.kind);
        ++counted[k];
        if (e.doomed && e.leases == 0) {
            return std::string("doomed entry without lease");
        }
        if (e.leases == 0) {
            ++unleased[k];
            if (lru_[k].count(LruKey{e.last_used, e.id, e.id}) == 0) {
                return std::string("unleased entry missing from LRU");
            }
        }
    }
    for (size_t k = 0; k < 2; ++k) {
        if (lru_[k].size() != unleased[k]) {
            return std::string("LRU set holds leased or stale entries");
        }
        if (counted[k] != count_[k]) {
            return std::string("entry count mismatch");
        }
    }
    return std::nullopt;
}

}  // namespace skippy::cache
