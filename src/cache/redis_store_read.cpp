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

}  // namespace

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
    std::vector<size_t> lengths;
    if (replies[0]->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < replies[0]->elements; ++i) {
            const redisReply* e = replies[0]->element[i];
            size_t v = 0;
            if (e->type == REDIS_REPLY_STRING &&
                std::from_chars(e->str, e->str + e->len, v).ec == std::errc() && v >= 1 &&
                v <= max_len) {
                lengths.push_back(v);
            }
        }
    } else if (is_error(replies[0])) {
        count_error(RedisErrorKind::Reply, error_text(replies[0]));
    }
    std::sort(lengths.rbegin(), lengths.rend());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    if (lengths.size() > options_.max_candidates) {
        lengths.resize(options_.max_candidates);
    }
    // The manifests of those prefixes of the query, longest first, a batch per round trip
    // (the lengths of other conversations of the namespace are candidates too).
    constexpr size_t kBatch = 64;
    std::optional<size_t> found;
    const auto t0 = Clock::now();
    for (size_t i = 0; i < lengths.size() && !found; i += kBatch) {
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
        if (!pipeline(c.get(), cmds, replies)) {
            mark_down(kind_of(c.get()), c->errstr);
            return std::nullopt;
        }
        for (size_t j = 0; j < replies.size(); ++j) {
            if (replies[j]->type == REDIS_REPLY_INTEGER && replies[j]->integer > 0) {
                found = lengths[i + j];
                break;
            }
        }
    }
    give_back(std::move(c));
    std::lock_guard lock(mu_);
    ++counters_.lookups;
    ++(found ? counters_.hits : counters_.misses);
    return found;
}

RedisReadResult RedisStore::read(const NamespaceId& ns, std::span<const Token> tokens) {
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
            bad_keys.insert(bad_keys.begin(), manifest_key(ns, tokens));
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
    const std::string mkey = manifest_key(ns, tokens);
    if (!pipeline(c.get(), {{"GET", mkey}}, replies)) {
        const std::string why = c->errstr;
        mark_down(kind_of(c.get()), why);
        return finish(RedisReadError::Down, why);
    }
    if (replies[0]->type == REDIS_REPLY_NIL) {
        give_back(std::move(c));
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
    if (!(m->ns == ns) || m->tokens.size() != tokens.size() ||
        !std::equal(tokens.begin(), tokens.end(), m->tokens.begin())) {
        give_back(std::move(c));
        return finish(RedisReadError::BadManifest, mkey + ": another namespace or token path");
    }
    if (m->descriptor.token_end != tokens.size() || m->descriptor.token_begin != 0) {
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
    return finish(RedisReadError::None, {});
}

}  // namespace skippy::cache
