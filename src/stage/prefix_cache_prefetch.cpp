// Prefetch (the request's HTTP thread, before the scheduler sees it): a prefix that the disk
// or Redis tier holds, longer than what RAM holds, is read, verified and promoted into RAM,
// so that plan() restores it from RAM without waiting for I/O on the scheduler thread.
#include <algorithm>

#include "cache/prefix_identity.h"
#include "runtime/seq_state_format.h"
#include "stage/prefix_cache_stage.h"

namespace skippy::stage {

namespace {

// The Redis tier's page-prefix pointers are every kv-pages page.
static_assert(cache::kRedisPageTokens == runtime::kKvPageTokens);

cache::PageId page_of(const cache::NamespaceId& ns, std::span<const Token> tokens) {
    return cache::prefix_identity(ns, 0, tokens).page_id();
}

}  // namespace

void PrefixCacheStage::prefetch(const PromptInfo& prompt) {
    if ((!disk_ && !redis_) || !lookups_enabled(prompt)) {
        return;
    }
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const int32_t b = body_end(prompt);
    const int32_t limit = rule_.restore_limit(b, n);
    if (limit < static_cast<int32_t>(policy_.min_tokens)) {
        return;
    }
    const cache::NamespaceId ns = namespace_for(prompt.cache_namespace);
    auto query = prompt.tokens.first(static_cast<size_t>(limit));
    auto ram = exact_->peek_longest(ns, query, match_);
    std::optional<cache::DiskPeek> on_disk;
    if (disk_) {
        on_disk = disk_->peek_longest(ns, query, match_);
    }
    if (on_disk && match_ == cache::PrefixMatch::Stored &&
        !rule_.can_restore(static_cast<int32_t>(on_disk->len), b, n)) {
        // Too close to the body end to restore (restore() then looks a body chunk earlier).
        query = prompt.tokens.first(static_cast<size_t>(std::max(0, b - rule_.body_min)));
        ram = exact_->peek_longest(ns, query, match_);
        on_disk = disk_->peek_longest(ns, query, match_);
    }
    // What the local tiers serve: Redis is asked only for something longer.
    const size_t local = std::max(ram ? ram->len : 0, on_disk ? on_disk->len : 0);
    if (!on_disk || (ram && ram->len >= on_disk->len)) {
        prefetch_redis(prompt, ns, local);
        return;
    }
    std::optional<cache::DiskHit> hit = disk_->acquire_longest(ns, query, match_);
    if (!hit || hit->tokens.size() > context_cells_per_lane_) {
        prefetch_redis(prompt, ns, ram ? ram->len : 0);
        return;
    }
    cache::DiskReadResult read = disk_->read(hit->lease);  // verified; bad entries quarantined
    if (!read.ok()) {
        disk_read_failures_.fetch_add(1);
        prefetch_redis(prompt, ns, ram ? ram->len : 0);
        return;
    }
    const auto cuts = payload_cuts(read.bytes.span(), hit->descriptor);
    const cache::ExactInsertResult r =
        exact_->insert(ns, hit->tokens, hit->page, hit->descriptor, read.bytes.span(), cuts);
    if (r.stored() || r.status == cache::ExactInsertStatus::AlreadyPresent) {
        disk_promotions_.fetch_add(1);
        note_promoted(hit->page, CacheTier::Disk);
    }
    prefetch_redis(prompt, ns, local);
}

void PrefixCacheStage::note_promoted(cache::PageId page, CacheTier tier) {
    std::lock_guard<std::mutex> lock(promoted_mutex_);
    promoted_.push_back({page, tier});
    if (promoted_.size() > 64) {
        promoted_.erase(promoted_.begin());
    }
}

void PrefixCacheStage::prefetch_redis(const PromptInfo& prompt, const cache::NamespaceId& ns,
                                      size_t local_len) {
    if (!redis_) {
        return;
    }
    // At most what the restore rule allows and what a lane holds.
    const auto n = static_cast<int32_t>(prompt.tokens.size());
    const int32_t b = body_end(prompt);
    const auto limit = static_cast<size_t>(std::max(0, rule_.restore_limit(b, n)));
    const size_t max_len = std::min(limit, context_cells_per_lane_);
    const size_t min_len = std::max<size_t>(policy_.min_tokens, local_len + 1);
    if (max_len < min_len) {
        return;
    }
    cache::RedisReadResult read;
    if (match_ == cache::PrefixMatch::Common) {
        // Dense: also an entry longer than what it shares with the prompt (found by its
        // page-prefix pointers), promoted whole, as a disk hit of a longer entry: the RAM
        // restore truncates its KV pages to the common prefix.
        read = redis_->read_longest(ns, prompt.tokens, max_len, min_len, match_,
                                    context_cells_per_lane_);
    } else {
        // Entries that are exact prefixes of the prompt.
        std::optional<size_t> len = redis_->lookup(ns, prompt.tokens, max_len, min_len);
        if (len && !rule_.can_restore(static_cast<int32_t>(*len), b, n)) {
            // Too close to the body end to restore: a body chunk earlier, as the disk tier.
            const auto earlier = static_cast<size_t>(std::max(0, b - rule_.body_min));
            len = earlier >= min_len ? redis_->lookup(ns, prompt.tokens, earlier, min_len)
                                     : std::nullopt;
        }
        if (!len) {
            return;
        }
        read = redis_->read(ns, prompt.tokens.first(*len));  // verified; bad ones quarantined
    }
    if (!read.ok()) {
        return;  // (counted by the store, by reason)
    }
    redis_read_seconds_.observe(read.seconds);
    const std::span<const Token> tokens(read.tokens);  // the entry's path
    if (tokens.size() > context_cells_per_lane_) {
        return;
    }
    if (read.page != page_of(ns, tokens) || read.descriptor.kind != layout_.kind) {
        redis_->quarantine(ns, tokens);  // not what this prompt would have recorded
        return;
    }
    const auto cuts = payload_cuts(read.bytes, read.descriptor);
    const cache::ExactInsertResult r =
        exact_->insert(ns, tokens, read.page, read.descriptor, read.bytes, cuts);
    if (r.stored() || r.status == cache::ExactInsertStatus::AlreadyPresent) {
        redis_promotions_.fetch_add(1);
        note_promoted(read.page, CacheTier::Redis);
    }
}

}  // namespace skippy::stage
