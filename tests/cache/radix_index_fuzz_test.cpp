// Randomized comparison of RadixIndex against a flat reference model.
// Depth: SKIPPY_FUZZ_SEEDS (default 4) x SKIPPY_FUZZ_STEPS (default 10000).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cache/radix_index.h"
#include "test_util.h"

namespace skippy::cache {
namespace {

struct ModelEntry {
    ComponentKind kind;
    size_t ns;
    std::vector<Token> tokens;
    uint64_t value;
    uint64_t last_used;
    uint32_t leases = 0;
    bool doomed = false;
};

size_t lcp(const std::vector<Token>& a, std::span<const Token> b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) {
        ++n;
    }
    return n;
}

class Model {
  public:
    std::map<EntryId, ModelEntry> entries;
    uint64_t clock = 0;

    std::optional<EntryId> at(ComponentKind kind, size_t ns,
                              const std::vector<Token>& tokens) const {
        for (const auto& [id, e] : entries) {
            if (e.kind == kind && e.ns == ns && e.tokens == tokens) {
                return id;
            }
        }
        return std::nullopt;
    }
    void touch(EntryId id) { entries.at(id).last_used = ++clock; }
    std::optional<EntryId> exact_hit(size_t ns, std::span<const Token> q) const {
        std::optional<EntryId> best;
        size_t best_len = 0;
        for (const auto& [id, e] : entries) {
            if (e.kind != ComponentKind::Exact || e.ns != ns || e.doomed) {
                continue;
            }
            if (e.tokens.size() <= q.size() && lcp(e.tokens, q) == e.tokens.size() &&
                e.tokens.size() > best_len) {
                best = id;
                best_len = e.tokens.size();
            }
        }
        return best;
    }
    size_t resident_best(size_t ns, std::span<const Token> q) const {
        size_t best = 0;
        for (const auto& [id, e] : entries) {
            if (e.kind == ComponentKind::Resident && e.ns == ns && !e.doomed) {
                best = std::max(best, lcp(e.tokens, q));
            }
        }
        return best;
    }
    std::optional<EntryId> lru(ComponentKind kind, EntryId exclude) const {
        std::optional<EntryId> best;
        for (const auto& [id, e] : entries) {
            if (e.kind != kind || e.leases > 0 || id == exclude) {
                continue;
            }
            if (!best ||
                std::pair(e.last_used, id) < std::pair(entries.at(*best).last_used, *best)) {
                best = id;
            }
        }
        return best;
    }
};

class RadixFuzz {
  public:
    explicit RadixFuzz(uint64_t seed) : rng_(seed) {
        namespaces_.push_back(test::test_namespace());
        namespaces_.push_back(test::test_namespace("fuzz-tenant"));
    }

    void run(uint64_t steps) {
        for (uint64_t step = 0; step < steps; ++step) {
            const unsigned op = static_cast<unsigned>(rng_() % 100);
            SCOPED_TRACE(::testing::Message() << "step " << step << " op " << op);
            if (op < 30) {
                do_insert();
            } else if (op < 45) {
                do_exact_lookup(op % 2 == 0);
            } else if (op < 60) {
                do_resident_lookup(op % 2 == 0);
            } else if (op < 68) {
                do_acquire();
            } else if (op < 76) {
                do_release();
            } else if (op < 84) {
                do_remove();
            } else if (op < 87) {
                do_remove_if();
            } else if (op < 94) {
                do_evict();
            } else if (op < 95) {
                // Drain a kind completely now and then (reaches the empty-tree states).
                for (size_t i = 0; i < 64 && !HasFailure(); ++i) {
                    do_evict();
                }
            } else if (op < 97) {
                do_touch();
            } else {
                do_path_queries();
            }
            auto err = index_.check_invariants();
            ASSERT_FALSE(err.has_value()) << *err;
            ASSERT_NO_FATAL_FAILURE(compare_sizes());
            if (step % 64 == 0) {
                ASSERT_NO_FATAL_FAILURE(compare_all());
            }
            if (::testing::Test::HasFatalFailure()) {
                return;
            }
        }
        compare_all();
        leases_.clear();
        if (steps >= 2000) {
            for (const char* what :
                 {"insert.inserted", "insert.replaced", "insert.already_present", "insert.leased",
                  "exact.hit", "exact.miss", "resident.hit", "resident.miss", "resident.partial",
                  "release.frees_doomed", "remove.removed", "remove.deferred", "remove.leased",
                  "remove.not_found", "evict.some", "evict.none"}) {
                EXPECT_GT(coverage_[what], 0u) << "fuzz never reached " << what;
            }
        }
    }

  private:
    void seen(const std::string& what) { ++coverage_[what]; }
    std::map<std::string, uint64_t> coverage_;

  public:
  private:
    static bool HasFailure() { return ::testing::Test::HasFailure(); }
    ComponentKind random_kind() {
        return rng_() % 2 ? ComponentKind::Exact : ComponentKind::Resident;
    }
    std::vector<Token> random_path() {
        const size_t len = 1 + rng_() % 10;
        return test::random_tokens(rng_, len, 3);
    }
    // A query: often a stored path, a prefix of one, or an extension of one.
    std::vector<Token> random_query() {
        if (!model_.entries.empty() && rng_() % 3 != 0) {
            auto it = model_.entries.begin();
            std::advance(it, static_cast<ptrdiff_t>(rng_() % model_.entries.size()));
            std::vector<Token> q = it->second.tokens;
            const unsigned how = static_cast<unsigned>(rng_() % 3);
            if (how == 0 && q.size() > 1) {
                q.resize(1 + rng_() % (q.size() - 1));
            } else if (how == 1) {
                auto extra = test::random_tokens(rng_, 1 + rng_() % 4, 3);
                q.insert(q.end(), extra.begin(), extra.end());
            }
            return q;
        }
        return test::random_tokens(rng_, rng_() % 12, 3);
    }
    std::optional<EntryId> random_entry() {
        if (model_.entries.empty()) {
            return std::nullopt;
        }
        auto it = model_.entries.begin();
        std::advance(it, static_cast<ptrdiff_t>(rng_() % model_.entries.size()));
        return it->first;
    }
    void erase_model(EntryId id) { model_.entries.erase(id); }

    void do_insert() {
        ComponentKind kind = random_kind();
        size_t ns = rng_() % namespaces_.size();
        std::vector<Token> path = random_path();
        if (auto id = random_entry(); id && rng_() % 2 == 0) {
            // Re-insert at a stored path: exercises AlreadyPresent / Replaced / Leased.
            const ModelEntry& e = model_.entries.at(*id);
            kind = e.kind;
            ns = e.ns;
            path = e.tokens;
        }
        const uint64_t value = rng_() % 4;
        InsertResult r = index_.insert(kind, namespaces_[ns], path, value);
        auto existing = model_.at(kind, ns, path);
        if (existing) {
            ModelEntry& e = model_.entries.at(*existing);
            if (e.doomed || (e.value != value && e.leases > 0)) {
                seen("insert.leased");
                ASSERT_EQ(r.status, InsertStatus::Leased);
                ASSERT_EQ(r.entry, *existing);
                return;
            }
            if (e.value == value) {
                seen("insert.already_present");
                ASSERT_EQ(r.status, InsertStatus::AlreadyPresent);
                ASSERT_EQ(r.entry, *existing);
                model_.touch(*existing);
                return;
            }
            seen("insert.replaced");
            ASSERT_EQ(r.status, InsertStatus::Replaced);
            ASSERT_TRUE(r.replaced);
            ASSERT_EQ(r.replaced->entry, *existing);
            ASSERT_EQ(r.replaced->value, e.value);
            erase_model(*existing);
        } else {
            seen("insert.inserted");
            ASSERT_EQ(r.status, InsertStatus::Inserted);
        }
        ASSERT_EQ(model_.entries.count(r.entry), 0u);
        model_.entries[r.entry] = ModelEntry{kind, ns, path, value, ++model_.clock};
    }

    void do_exact_lookup(bool touch) {
        const size_t ns = rng_() % namespaces_.size();
        const std::vector<Token> q = random_query();
        auto got =
            touch ? index_.lookup_exact(namespaces_[ns], q) : index_.peek_exact(namespaces_[ns], q);
        auto want = model_.exact_hit(ns, q);
        ASSERT_EQ(got.has_value(), want.has_value());
        seen(got ? "exact.hit" : "exact.miss");
        if (!got) {
            return;
        }
        ASSERT_EQ(got->entry, *want);
        const ModelEntry& e = model_.entries.at(*want);
        ASSERT_EQ(got->len, e.tokens.size());
        ASSERT_EQ(got->value, e.value);
        if (touch) {
            model_.touch(*want);
        }
    }

    void do_resident_lookup(bool touch) {
        const size_t ns = rng_() % namespaces_.size();
        const std::vector<Token> q = random_query();
        auto got = touch ? index_.lookup_resident(namespaces_[ns], q)
                         : index_.peek_resident(namespaces_[ns], q);
        const size_t best = model_.resident_best(ns, q);
        seen(best == 0 ? "resident.miss" : "resident.hit");
        if (best == 0) {
            ASSERT_FALSE(got.has_value());
            return;
        }
        ASSERT_TRUE(got.has_value());
        ASSERT_EQ(got->matched_len, best);
        auto it = model_.entries.find(got->entry);
        ASSERT_NE(it, model_.entries.end());
        const ModelEntry& e = it->second;
        ASSERT_EQ(e.kind, ComponentKind::Resident);
        ASSERT_EQ(e.ns, ns);
        ASSERT_FALSE(e.doomed);
        ASSERT_EQ(lcp(e.tokens, q), best);
        ASSERT_EQ(got->stored_len, e.tokens.size());
        if (got->matched_len < got->stored_len) {
            seen("resident.partial");
        }
        ASSERT_EQ(got->value, e.value);
        if (touch) {
            model_.touch(got->entry);
        }
    }

    void do_acquire() {
        // Sometimes an id that never existed.
        const EntryId id = rng_() % 8 == 0 ? EntryId{999999} : random_entry().value_or(1);
        Lease lease = index_.acquire(id);
        auto it = model_.entries.find(id);
        const bool expect = it != model_.entries.end() && !it->second.doomed;
        ASSERT_EQ(lease.held(), expect);
        if (expect) {
            ++it->second.leases;
            leases_.push_back(std::move(lease));
        }
    }

    void do_release() {
        if (leases_.empty()) {
            return;
        }
        const size_t i = rng_() % leases_.size();
        const EntryId id = leases_[i].entry();
        leases_.erase(leases_.begin() + static_cast<ptrdiff_t>(i));  // releases
        ModelEntry& e = model_.entries.at(id);
        --e.leases;
        if (e.leases == 0 && e.doomed) {
            seen("release.frees_doomed");
            erase_model(id);
        }
    }

    RemoveStatus model_remove(EntryId id, LeasedRemoval policy) {
        const RemoveStatus s = model_remove_impl(id, policy);
        seen(std::string("remove.") + to_string(s));
        return s;
    }
    RemoveStatus model_remove_impl(EntryId id, LeasedRemoval policy) {
        ModelEntry& e = model_.entries.at(id);
        if (e.doomed) {
            return RemoveStatus::Deferred;
        }
        if (e.leases > 0) {
            if (policy == LeasedRemoval::Fail) {
                return RemoveStatus::Leased;
            }
            e.doomed = true;
            return RemoveStatus::Deferred;
        }
        erase_model(id);
        return RemoveStatus::Removed;
    }

    void do_remove() {
        const LeasedRemoval policy = rng_() % 2 ? LeasedRemoval::Fail : LeasedRemoval::Defer;
        if (rng_() % 2 == 0) {
            auto id = random_entry();
            if (!id) {
                return;
            }
            RemoveResult r = index_.remove(*id, policy);
            const uint64_t value = model_.entries.at(*id).value;
            ASSERT_EQ(r.status, model_remove(*id, policy));
            if (r.status == RemoveStatus::Removed) {
                ASSERT_EQ(r.removed->value, value);
            }
            return;
        }
        const ComponentKind kind = random_kind();
        const size_t ns = rng_() % namespaces_.size();
        const std::vector<Token> path = random_query();
        RemoveResult r = index_.remove(kind, namespaces_[ns], path, policy);
        auto id = model_.at(kind, ns, path);
        if (!id) {
            seen("remove.not_found");
            ASSERT_EQ(r.status, RemoveStatus::NotFound);
            return;
        }
        ASSERT_EQ(r.status, model_remove(*id, policy));
    }

    void do_remove_if() {
        const ComponentKind kind = random_kind();
        const uint64_t pick = rng_() % 4;
        const LeasedRemoval policy = rng_() % 2 ? LeasedRemoval::Fail : LeasedRemoval::Defer;
        RemoveIfResult r = index_.remove_if(
            kind, [&](const EntryInfo& e) { return e.value == pick; }, policy);
        size_t removed = 0, deferred = 0, skipped = 0;
        std::vector<EntryId> ids;
        for (const auto& [id, e] : model_.entries) {
            if (e.kind == kind && !e.doomed && e.value == pick) {
                ids.push_back(id);
            }
        }
        for (EntryId id : ids) {
            switch (model_remove(id, policy)) {
                case RemoveStatus::Removed:
                    ++removed;
                    break;
                case RemoveStatus::Deferred:
                    ++deferred;
                    break;
                case RemoveStatus::Leased:
                    ++skipped;
                    break;
                case RemoveStatus::NotFound:
                    break;
            }
        }
        ASSERT_EQ(r.removed.size(), removed);
        ASSERT_EQ(r.deferred, deferred);
        ASSERT_EQ(r.leased_skipped, skipped);
    }

    void do_evict() {
        const ComponentKind kind = random_kind();
        const EntryId exclude = rng_() % 3 == 0 ? random_entry().value_or(kNoEntry) : kNoEntry;
        auto want = model_.lru(kind, exclude);
        auto got = index_.evict_lru(kind, exclude);
        ASSERT_EQ(got.has_value(), want.has_value());
        seen(got ? "evict.some" : "evict.none");
        if (got) {
            ASSERT_EQ(got->entry, *want);
            ASSERT_EQ(got->value, model_.entries.at(*want).value);
            ASSERT_EQ(got->token_count, model_.entries.at(*want).tokens.size());
            erase_model(*want);
        }
    }

    void do_touch() {
        auto id = random_entry();
        if (!id) {
            ASSERT_FALSE(index_.touch(424242));
            return;
        }
        ASSERT_TRUE(index_.touch(*id));
        model_.touch(*id);
    }

    void do_path_queries() {
        const ComponentKind kind = random_kind();
        const size_t ns = rng_() % namespaces_.size();
        const std::vector<Token> q = random_query();
        auto path = index_.entries_on_path(kind, namespaces_[ns], q);
        std::vector<EntryId> want;
        for (const auto& [id, e] : model_.entries) {
            if (e.kind == kind && e.ns == ns && !e.doomed && e.tokens.size() <= q.size() &&
                lcp(e.tokens, q) == e.tokens.size()) {
                want.push_back(id);
            }
        }
        std::sort(want.begin(), want.end(), [&](EntryId a, EntryId b) {
            return model_.entries.at(a).tokens.size() < model_.entries.at(b).tokens.size();
        });
        ASSERT_EQ(path.size(), want.size());
        for (size_t i = 0; i < path.size(); ++i) {
            ASSERT_EQ(path[i].entry, want[i]);
        }
        auto found = index_.find(kind, namespaces_[ns], q);
        auto at = model_.at(kind, ns, q);
        const bool visible = at && !model_.entries.at(*at).doomed;
        ASSERT_EQ(found.has_value(), visible);
        if (visible) {
            ASSERT_EQ(*found, *at);
        }
    }

    void compare_sizes() {
        size_t n[2] = {0, 0};
        for (const auto& [id, e] : model_.entries) {
            ++n[static_cast<size_t>(e.kind)];
        }
        ASSERT_EQ(index_.size(ComponentKind::Resident), n[0]);
        ASSERT_EQ(index_.size(ComponentKind::Exact), n[1]);
        ASSERT_EQ(index_.clock(), model_.clock);
    }

    void compare_all() {
        for (const auto& [id, e] : model_.entries) {
            auto info = index_.info(id);
            ASSERT_TRUE(info.has_value());
            ASSERT_EQ(info->kind, e.kind);
            ASSERT_EQ(info->ns, namespaces_[e.ns]);
            ASSERT_EQ(info->value, e.value);
            ASSERT_EQ(info->leases, e.leases);
            ASSERT_EQ(info->doomed, e.doomed);
            ASSERT_EQ(info->last_used, e.last_used);
            ASSERT_EQ(index_.tokens_of(id), e.tokens);
        }
    }

    std::mt19937_64 rng_;
    std::vector<NamespaceId> namespaces_;
    RadixIndex index_;
    Model model_;
    std::vector<Lease> leases_;  // declared after index_: released before it is destroyed
};

TEST(RadixIndexFuzz, MatchesFlatReferenceModel) {
    const uint64_t seeds = test::fuzz_seeds();
    const uint64_t steps = test::fuzz_steps();
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
        SCOPED_TRACE(::testing::Message() << "seed " << seed);
        RadixFuzz fuzz(seed);
        fuzz.run(steps);
        if (HasFatalFailure()) {
            return;
        }
    }
}

}  // namespace
}  // namespace skippy::cache
