// RedisStore: lookups and verified reads, on the calling thread (redis_store.h).
#include <algorithm>
#include <charconv>
#include <unordered_map>

#include "cache/redis_store.h"
#include "cache/redis_wire.h"

namespace skippy::cache {

using namespace detail;

namespace {

using Clock = std::chrono::steady_clock;

std::vector<size_t> lengths_of(const redisReply* r, size_t max_len, size_t max_candidates) {
    std::vector<size_t> lengths;
    if (r->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < r->elements; ++i) {
            const redisReply* e = r->element[i];
            size_t v = 0;
            if (e->type == REDIS_REPLY_STRING &&
                std::from_chars(e->str, e->str + e->len, v).ec == std::errc() && v >= 1 &&
                v <= max_len) {
                lengths.push_back(v);
            }
        }
    }
    std::sort(lengths.rbegin(), lengths.rend());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    if (lengths.size() > max_candidates) {
        lengths.resize(max_candidates);
    }
    return lengths;
}

size_t common_prefix(std::span<const Token> a, std::span<const Token> b) {
    const size_t n = std::min(a.size(), b.size());
    return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + n, b.begin()).first -
                               a.begin());
}

}  // namespace

bool RedisStore::longest_existing(redisContext* c, const NamespaceId& ns,
                                  std::span<const Token> tokens, const std::vector<size_t>& lengths,
                                  std::optional<size_t>* found) {
    // The manifests of those prefixes of the query, longest first, a batch per round trip
    // (the lengths of other conversations of the namespace are candidates too).
    constexpr size_t kBatch = 64;
    std::vector<Reply> replies;
    const auto t0 = Clock::now();
    for (size_t i = 0; i < lengths.size() && !*found; i += kBatch) {
        if (i > 0 && Clock::now() - t0 > options_.timeout) {
            break;  // a slow Redis: what the first batches found (nothing) is the answer
        }
        const size_t end = std::min(lengths.size(), i + kBatch);
        std::vector<std::string> keys;
        std::vector<Command> cmds;
        keys.reserve(end - i);
        for (size_t j = i; j < end; ++j) {
            keys.push_back(manifest_key(ns, tokens.first(lengths[j])));
        }
        for (const auto& k : keys) {
            cmds.push_back({"EXISTS", k});
        }
        if (!pipeline(c, cmds, replies)) {
            mark_down(kind_of(c), c->errstr);
            return false;
        }
        for (size_t j = 0; j < replies.size(); ++j) {
            if (replies[j]->type == REDIS_REPLY_INTEGER && replies[j]->integer > 0) {
                *found = lengths[i + j];
                break;
            }
        }
    }
    return true;
}

std::optional<size_t> RedisStore::lookup(const NamespaceId& ns, std::span<const Token> tokens,
                                         size_t max_len, size_t min_len) {
    max_len = std::min(max_len, tokens.size());
    if (max_len < std::max<size_t>(1, min_len)) {
        return std::nullopt;
    }
    Conn c = acquire();
    if (!c) {
        return std::nullopt;
    }
    std::vector<Reply> replies;
    const std::string lo = std::to_string(std::max<size_t>(1, min_len));
    const std::string hi = std::to_string(max_len);
    // Longest first, at most max_candidates of them.
    const std::string limit = std::to_string(options_.max_candidates);
    if (!pipeline(c.get(), {{"ZREVRANGEBYSCORE", lengths_key(ns), hi, lo, "LIMIT", "0", limit}},
                  replies)) {
        mark_down(kind_of(c.get()), c->errstr);
        return std::nullopt;
    }
    mark_up();
    if (is_error(replies[0])) {
        count_error(RedisErrorKind::Reply, error_text(replies[0]));
    }
    const std::vector<size_t> lengths =
        lengths_of(replies[0].get(), max_len, options_.max_candidates);
    std::optional<size_t> found;
    if (!longest_existing(c.get(), ns, tokens, lengths, &found)) {
        return std::nullopt;
    }
    give_back(std::move(c));
    std::lock_guard lock(mu_);
    ++counters_.lookups;
    ++(found ? counters_.hits : counters_.misses);
    return found;
}

RedisReadResult RedisStore::read(const NamespaceId& ns, std::span<const Token> tokens) {
    return read_manifest(ns, tokens.empty() ? std::string() : manifest_key(ns, tokens), tokens, 0,
                         {}, 0, tokens.size());
}

RedisReadResult RedisStore::read_manifest(const NamespaceId& ns, const std::string& mkey,
                                          std::span<const Token> tokens, size_t shared,
                                          const std::string& pointer, size_t min_len,
                                          size_t max_len) {
    const auto t0 = Clock::now();
    RedisReadResult out;
    std::vector<std::string> bad_keys;
    auto finish = [&](RedisReadError e, std::string detail) -> RedisReadResult {
        out.error = e;
        out.detail = std::move(detail);
        out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        const bool bad =
            e != RedisReadError::None && e != RedisReadError::Down && e != RedisReadError::NotFound;
        {
            std::lock_guard lock(mu_);
            if (e == RedisReadError::None) {
                ++counters_.reads;
                counters_.read_bytes += out.bytes.size();
                counters_.read_seconds_sum += out.seconds;
                ++counters_.read_seconds_count;
            } else {
                ++counters_.read_failures[static_cast<size_t>(e)];
                if (bad) {
                    ++counters_.quarantines;
                    counters_.last_error = "redis read: " + out.detail;
                }
            }
        }
        if (bad) {
            bad_keys.insert(bad_keys.begin(), mkey);
            enqueue_remove(std::move(bad_keys));
        }
        if (e != RedisReadError::None) {
            out.bytes.clear();
        }
        return std::move(out);
    };
    if (tokens.empty()) {
        return finish(RedisReadError::NotFound, "no tokens");
    }
    Conn c = acquire();
    if (!c) {
        return finish(RedisReadError::Down, "the tier is down");
    }
    std::vector<Reply> replies;
    if (!pipeline(c.get(), {{"GET", mkey}}, replies)) {
        const std::string why = c->errstr;
        mark_down(kind_of(c.get()), why);
        return finish(RedisReadError::Down, why);
    }
    if (replies[0]->type == REDIS_REPLY_NIL) {
        give_back(std::move(c));
        if (shared > 0) {
            enqueue_remove({pointer});  // dangling: the entry was evicted or deleted
        }
        return finish(RedisReadError::NotFound, "no manifest " + mkey);
    }
    if (replies[0]->type != REDIS_REPLY_STRING) {
        give_back(std::move(c));
        return finish(RedisReadError::Down, "GET " + mkey + ": unexpected reply");
    }
    std::string why;
    std::optional<disk::Manifest> m = disk::decode_manifest(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(replies[0]->str),
                                 replies[0]->len),
        &why);
    if (!m) {
        give_back(std::move(c));
        return finish(RedisReadError::BadManifest, mkey + ": " + why);
    }
    if (shared == 0) {
        if (!(m->ns == ns) || m->tokens.size() != tokens.size() ||
            !std::equal(tokens.begin(), tokens.end(), m->tokens.begin())) {
            give_back(std::move(c));
            return finish(RedisReadError::BadManifest, mkey + ": another namespace or token path");
        }
        out.len = tokens.size();
    } else {
        // Led by a page-prefix pointer: the manifest must be its own key's, and share the
        // pointer's prefix with the query (else the pointer is stale: a miss, and it goes).
        if (!(m->ns == ns) || manifest_key(ns, m->tokens) != mkey) {
            give_back(std::move(c));
            return finish(RedisReadError::BadManifest, mkey + ": another namespace or token path");
        }
        if (m->tokens.size() < shared || tokens.size() < shared ||
            !std::equal(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(shared),
                        m->tokens.begin())) {
            give_back(std::move(c));
            enqueue_remove({pointer});
            return finish(RedisReadError::NotFound, pointer + " leads to another prefix");
        }
        out.len = std::min(common_prefix(m->tokens, tokens), max_len);
        if (out.len < min_len) {
            give_back(std::move(c));
            return finish(RedisReadError::NotFound, mkey + ": shares fewer than min_len tokens");
        }
    }
    if (m->descriptor.token_end != m->tokens.size() || m->descriptor.token_begin != 0) {
        give_back(std::move(c));
        return finish(RedisReadError::BadManifest, mkey + ": descriptor covers other tokens");
    }
    // Unique blocks, one MGET.
    std::vector<std::string> keys;
    std::unordered_map<Hash128, size_t, Hash128Hash> index;
    for (const auto& b : m->blocks) {
        if (index.emplace(b.key.hash, keys.size()).second) {
            keys.push_back(block_key(b.key.hash));
        }
    }
    Command mget{"MGET"};
    for (const auto& k : keys) {
        mget.push_back(k);
    }
    if (!pipeline(c.get(), {mget}, replies)) {
        const std::string err = c->errstr;
        mark_down(kind_of(c.get()), err);
        return finish(RedisReadError::Down, err);
    }
    give_back(std::move(c));
    const redisReply* arr = replies[0].get();
    if (arr->type != REDIS_REPLY_ARRAY || arr->elements != keys.size()) {
        return finish(RedisReadError::Down, "MGET: unexpected reply");
    }
    // Verify every unique block before assembling anything.
    std::vector<bool> verified(keys.size(), false);
    uint64_t total = 0;
    for (const auto& b : m->blocks) {
        total += b.size;
    }
    out.bytes.reserve(total);
    for (const auto& b : m->blocks) {
        const size_t u = index.at(b.key.hash);
        const redisReply* e = arr->element[u];
        if (e->type != REDIS_REPLY_STRING) {
            return finish(RedisReadError::MissingBlock, "block " + keys[u] + " is missing");
        }
        if (e->len != b.size) {
            bad_keys.push_back(keys[u]);
            return finish(RedisReadError::Truncated, "block " + keys[u] + " has " +
                                                         std::to_string(e->len) + " bytes, not " +
                                                         std::to_string(b.size));
        }
        const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(e->str), e->len);
        if (!verified[u]) {
            if (xxh3_128(data) != b.key.hash) {
                bad_keys.push_back(keys[u]);
                return finish(RedisReadError::ChecksumMismatch,
                              "block " + keys[u] + " does not match its hash");
            }
            verified[u] = true;
        }
        out.bytes.insert(out.bytes.end(), data.begin(), data.end());
    }
    if (disk::payload_checksum(out.bytes.size(), m->blocks) != m->payload_checksum ||
        m->descriptor.validate_against(out.bytes.size()).has_value()) {
        return finish(RedisReadError::ChecksumMismatch, mkey + ": payload checksum or size");
    }
    out.page = m->page;
    out.descriptor = m->descriptor;
    out.tokens = std::move(m->tokens);
    return finish(RedisReadError::None, {});
}

RedisReadResult RedisStore::read_longest(const NamespaceId& ns, std::span<const Token> tokens,
                                         size_t max_len, size_t min_len, PrefixMatch match,
                                         size_t max_entry_len) {
    max_len = std::min(max_len, tokens.size());
    min_len = std::max<size_t>(1, min_len);
    auto miss = [&](RedisReadError e, std::string why) {
        RedisReadResult r;
        r.error = e;
        r.detail = std::move(why);
        return r;
    };
    const size_t page = options_.page_tokens;
    if (match == PrefixMatch::Stored || page == 0) {
        const std::optional<size_t> len = lookup(ns, tokens, max_len, min_len);
        if (!len) {
            return miss(up() ? RedisReadError::NotFound : RedisReadError::Down, "no entry");
        }
        return read(ns, tokens.first(*len));
    }
    if (max_len < min_len) {
        return miss(RedisReadError::NotFound, "nothing to look up");
    }
    Conn c = acquire();
    if (!c) {
        return miss(RedisReadError::Down, "the tier is down");
    }
    // An entry sharing min_len tokens or more has a pointer at every boundary up to there (its
    // own, or a newer entry's sharing as much): the boundaries from min_len's page on.
    std::vector<std::pair<size_t, Hash128>> bounds =
        page_prefix_keys(ns, tokens.first(max_len), page, std::max(page, min_len / page * page));
    if (bounds.size() > options_.max_pointers) {
        bounds.erase(bounds.begin(), bounds.end() - static_cast<ptrdiff_t>(options_.max_pointers));
    }
    std::vector<std::string> pointer_keys;
    pointer_keys.reserve(bounds.size());
    for (const auto& [b, key] : bounds) {
        pointer_keys.push_back(options_.prefix + "p:" + ns.hex() + ":" + hex128(key));
    }
    // One round trip: the exact lengths and every pointer.
    const std::string lo = std::to_string(min_len);
    const std::string hi = std::to_string(max_len);
    const std::string limit = std::to_string(options_.max_candidates);
    const std::string lkey = lengths_key(ns);
    std::vector<Command> cmds{{"ZREVRANGEBYSCORE", lkey, hi, lo, "LIMIT", "0", limit}};
    if (!pointer_keys.empty()) {
        Command mget{"MGET"};
        for (const auto& k : pointer_keys) {
            mget.push_back(k);
        }
        cmds.push_back(std::move(mget));
    }
    std::vector<Reply> replies;
    if (!pipeline(c.get(), cmds, replies)) {
        const std::string why = c->errstr;
        mark_down(kind_of(c.get()), why);
        return miss(RedisReadError::Down, why);
    }
    mark_up();
    if (is_error(replies[0])) {
        count_error(RedisErrorKind::Reply, error_text(replies[0]));
    }
    // The deepest pointer to an entry short enough.
    const std::string manifests = options_.prefix + "m:" + ns.hex() + ":";
    size_t deepest = 0;
    std::string pointer;
    std::string target;
    if (replies.size() > 1 && replies[1]->type == REDIS_REPLY_ARRAY &&
        replies[1]->elements == pointer_keys.size()) {
        for (size_t i = pointer_keys.size(); i-- > 0;) {
            const redisReply* e = replies[1]->element[i];
            if (e->type != REDIS_REPLY_STRING) {
                continue;
            }
            const std::string_view v(e->str, e->len);
            const size_t colon = v.find(':');
            size_t entry_len = 0;
            if (colon == std::string_view::npos ||
                std::from_chars(v.data(), v.data() + colon, entry_len).ec != std::errc() ||
                entry_len < bounds[i].first) {
                continue;
            }
            if (entry_len > max_entry_len || !v.substr(colon + 1).starts_with(manifests)) {
                continue;  // (a shallower pointer may name a shorter entry)
            }
            deepest = bounds[i].first;
            pointer = pointer_keys[i];
            target.assign(v.substr(colon + 1));
            break;
        }
    } else if (replies.size() > 1 && is_error(replies[1])) {
        count_error(RedisErrorKind::Reply, error_text(replies[1]));
    }
    // The exact answer, when it is at least as deep.
    const std::vector<size_t> lengths =
        lengths_of(replies[0].get(), max_len, options_.max_candidates);
    std::vector<size_t> deep;
    for (size_t len : lengths) {
        if (len >= deepest) {
            deep.push_back(len);
        }
    }
    std::optional<size_t> exact;
    if (!longest_existing(c.get(), ns, tokens, deep, &exact)) {
        return miss(RedisReadError::Down, "the tier is down");
    }
    give_back(std::move(c));
    {
        std::lock_guard lock(mu_);
        ++counters_.lookups;
        ++(exact || deepest > 0 ? counters_.hits : counters_.misses);
    }
    if (exact) {
        return read(ns, tokens.first(*exact));
    }
    if (deepest == 0) {
        return miss(RedisReadError::NotFound, "no entry");
    }
    RedisReadResult r = read_manifest(ns, target, tokens, deepest, pointer, min_len, max_len);
    if (r.error != RedisReadError::NotFound) {
        return r;
    }
    // The pointer led nowhere (deleted): a shorter exact entry, if any.
    std::vector<size_t> shallow;
    for (size_t len : lengths) {
        if (len < deepest) {
            shallow.push_back(len);
        }
    }
    if (shallow.empty() || !(c = acquire())) {
        return r;
    }
    exact.reset();
    if (!longest_existing(c.get(), ns, tokens, shallow, &exact)) {
        return r;
    }
    give_back(std::move(c));
    return exact ? read(ns, tokens.first(*exact)) : r;
}

}  // namespace skippy::cache
