// RedisStore: the queue and writer thread, lookups and verified reads (redis_store.h).
#include "cache/redis_store.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3 states on the stack
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <unordered_map>

#include "cache/redis_wire.h"

namespace skippy::cache {

using namespace detail;

namespace {

using Clock = std::chrono::steady_clock;

void default_log(std::string_view line) { std::cerr << line << '\n'; }

RedisStoreOptions with_defaults(RedisStoreOptions o) {
    if (!o.log) {
        o.log = default_log;
    }
    if (o.block_bytes == 0) {
        o.block_bytes = kDefaultBlockBytes;
    }
    return o;
}

}  // namespace

std::vector<std::pair<size_t, Hash128>> detail::page_prefix_keys(const NamespaceId& ns,
                                                                 std::span<const Token> tokens,
                                                                 size_t page, size_t lo) {
    std::vector<std::pair<size_t, Hash128>> out;
    if (page == 0) {
        return out;
    }
    lo = std::max(lo, page);
    XXH3_state_t state;  // as disk::entry_key: the namespace digest, then the tokens
    XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, ns.digest().bytes.data(), ns.digest().bytes.size());
    for (size_t b = page; b <= tokens.size(); b += page) {
        XXH3_128bits_update(&state, tokens.data() + (b - page), page * sizeof(Token));
        if (b >= lo) {
            const XXH128_hash_t h = XXH3_128bits_digest(&state);
            out.emplace_back(b, Hash128{h.low64, h.high64});
        }
    }
    return out;
}

void detail::RedisReplyFree::operator()(::redisReply* r) const {
    if (r != nullptr) {
        freeReplyObject(r);
    }
}

const char* to_string(RedisSubmit s) {
    switch (s) {
        case RedisSubmit::Queued:
            return "queued";
        case RedisSubmit::AlreadyQueued:
            return "already_queued";
        case RedisSubmit::DroppedFull:
            return "dropped_full";
        case RedisSubmit::Down:
            return "down";
        case RedisSubmit::Invalid:
            return "invalid";
        case RedisSubmit::Stopped:
            return "stopped";
    }
    return "?";
}

const char* to_string(RedisReadError e) {
    switch (e) {
        case RedisReadError::None:
            return "none";
        case RedisReadError::Down:
            return "down";
        case RedisReadError::NotFound:
            return "not_found";
        case RedisReadError::BadManifest:
            return "bad_manifest";
        case RedisReadError::MissingBlock:
            return "missing_block";
        case RedisReadError::Truncated:
            return "truncated";
        case RedisReadError::ChecksumMismatch:
            return "checksum_mismatch";
        case RedisReadError::Count:
            break;
    }
    return "?";
}

const char* to_string(RedisErrorKind k) {
    switch (k) {
        case RedisErrorKind::Connect:
            return "connect";
        case RedisErrorKind::Timeout:
            return "timeout";
        case RedisErrorKind::Io:
            return "io";
        case RedisErrorKind::Reply:
            return "reply";
        case RedisErrorKind::Oom:
            return "oom";
        case RedisErrorKind::Count:
            break;
    }
    return "?";
}

RedisStore::RedisStore(RedisStoreOptions options, RedisUrl url)
    : options_(with_defaults(std::move(options))),
      url_(std::move(url)),
      cutter_(BlockStoreOptions{.block_bytes = options_.block_bytes}) {}

RedisOpenResult RedisStore::open(RedisStoreOptions options) {
    RedisOpenResult out;
    std::string why;
    std::optional<RedisUrl> url = parse_redis_url(options.url, &why);
    if (!url) {
        out.message = "--cache-redis: " + why;
        return out;
    }
    std::unique_ptr<RedisStore> store(new RedisStore(std::move(options), std::move(*url)));
    // One connection now, for the start-up note; a Redis that is down is retried later.
    Conn c = store->connect(&why);
    if (c) {
        out.message = "up";
        store->give_back(std::move(c));
    } else {
        out.message = "down at start-up (" + why + "); retrying every " +
                      std::to_string(store->options_.backoff.count()) + " ms";
        store->mark_down(RedisErrorKind::Connect, why);
    }
    store->writer_ = std::thread([s = store.get()] { s->writer_loop(); });
    out.store = std::move(store);
    return out;
}

RedisStore::~RedisStore() { close(true); }

std::string RedisStore::block_key(const Hash128& hash) const {
    return options_.prefix + "b:" + hex128(hash);
}

std::string RedisStore::manifest_key(const NamespaceId& ns, std::span<const Token> tokens) const {
    return options_.prefix + "m:" + ns.hex() + ":" + hex128(disk::entry_key(ns, tokens));
}

std::string RedisStore::lengths_key(const NamespaceId& ns) const {
    return options_.prefix + "l:" + ns.hex();
}

std::string RedisStore::pointer_key(const NamespaceId& ns, std::span<const Token> prefix) const {
    return options_.prefix + "p:" + ns.hex() + ":" + hex128(disk::entry_key(ns, prefix));
}

bool RedisStore::up() const { return up_.load(std::memory_order_relaxed); }

RedisStats RedisStore::stats() const {
    std::lock_guard lock(mu_);
    RedisStats s = counters_;
    s.up = !down_;
    s.queue_depth = queue_.size() + (busy_ ? 1 : 0);
    return s;
}

void RedisStore::debug_pause_writer(bool paused) {
    std::lock_guard lock(mu_);
    paused_ = paused;
    work_cv_.notify_all();
}

// ---- writes ----

RedisSubmit RedisStore::submit_write(const NamespaceId& ns, std::span<const Token> tokens,
                                     PageId page, const PayloadDescriptor& descriptor,
                                     PayloadSnapshot snapshot, std::vector<size_t> cuts) {
    Job job;
    job.ns = ns;
    job.tokens.assign(tokens.begin(), tokens.end());
    job.page = page;
    job.descriptor = descriptor;
    job.snapshot = std::move(snapshot);
    job.cuts = std::move(cuts);
    return submit_job(std::move(job));
}

RedisSubmit RedisStore::submit_write(const NamespaceId& ns, std::span<const Token> tokens,
                                     PageId page, const PayloadDescriptor& descriptor,
                                     std::vector<uint8_t> bytes, std::vector<size_t> cuts) {
    Job job;
    job.ns = ns;
    job.tokens.assign(tokens.begin(), tokens.end());
    job.page = page;
    job.descriptor = descriptor;
    job.bytes = std::move(bytes);
    job.cuts = std::move(cuts);
    return submit_job(std::move(job));
}

RedisSubmit RedisStore::submit_job(Job job) {
    if (job.tokens.empty() || job.descriptor.validate_against(job.size()).has_value()) {
        return RedisSubmit::Invalid;
    }
    job.key = disk::entry_key(job.ns, job.tokens);
    std::lock_guard lock(mu_);
    if (stopping_) {
        return RedisSubmit::Stopped;
    }
    if (down_ && Clock::now() < retry_at_) {
        ++counters_.dropped_down;
        return RedisSubmit::Down;
    }
    if (queued_keys_.contains(job.key)) {
        return RedisSubmit::AlreadyQueued;
    }
    const uint64_t size = job.size();
    if (queue_.size() >= options_.queue_capacity ||
        (options_.max_queued_bytes != 0 &&
         counters_.queued_bytes + size > options_.max_queued_bytes)) {
        ++counters_.dropped_full;
        return RedisSubmit::DroppedFull;
    }
    queued_keys_.insert(job.key);
    counters_.queued_bytes += size;
    ++counters_.submitted;
    queue_.push_back(std::move(job));
    work_cv_.notify_one();
    return RedisSubmit::Queued;
}

void RedisStore::enqueue_remove(std::vector<std::string> keys) {
    Job job;
    job.remove = true;
    job.keys = std::move(keys);
    std::lock_guard lock(mu_);
    if (stopping_ && !drain_) {
        return;
    }
    queue_.push_front(std::move(job));  // (not bounded: small, and rare)
    work_cv_.notify_one();
}

void RedisStore::quarantine(const NamespaceId& ns, std::span<const Token> tokens) {
    {
        std::lock_guard lock(mu_);
        ++counters_.quarantines;
    }
    enqueue_remove({manifest_key(ns, tokens)});
}

void RedisStore::writer_loop() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);  // EPIPE instead (see redis_store.h)
    std::unique_lock lock(mu_);
    for (;;) {
        work_cv_.wait(lock, [&] {
            return (stopping_ && (!drain_ || queue_.empty())) || (!paused_ && !queue_.empty());
        });
        if (queue_.empty() || (stopping_ && !drain_)) {
            break;
        }
        Job job = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        const uint64_t size = job.size();
        lock.unlock();
        if (job.remove) {
            run_remove(job);
        } else {
            run_write(job);
        }
        const bool removal = job.remove;
        job = Job();
        lock.lock();
        if (!removal) {
            counters_.queued_bytes -= std::min(counters_.queued_bytes, size);
        }
        busy_ = false;
        idle_cv_.notify_all();
    }
    // Dropped on close(false).
    for (const Job& job : queue_) {
        counters_.queued_bytes -= std::min(counters_.queued_bytes, job.size());
    }
    queue_.clear();
    queued_keys_.clear();
    writer_done_ = true;
    idle_cv_.notify_all();
    lock.unlock();
    writer_conn_.reset();
}

bool RedisStore::writer_connection(std::string* why) {
    if (writer_conn_ && writer_generation_ != generation_.load()) {
        writer_conn_.reset();  // opened before an outage: stale
    }
    if (writer_conn_) {
        return true;
    }
    if (!available()) {
        *why = "the tier is down";
        return false;
    }
    writer_generation_ = generation_.load();
    writer_conn_ = connect(why);
    if (!writer_conn_) {
        mark_down(RedisErrorKind::Connect, *why);
        return false;
    }
    writer_fresh_ = true;
    mark_up();
    return true;
}

bool RedisStore::writer_pipeline(const std::vector<std::vector<std::string_view>>& commands,
                                 std::vector<Reply>& replies) {
    const bool fresh = writer_fresh_;
    writer_fresh_ = false;
    if (pipeline(writer_conn_.get(), commands, replies)) {
        return true;
    }
    if (fresh) {
        return false;
    }
    // An idle connection Redis closed (a restart nobody noticed yet): once more, on a new one.
    std::string why;
    writer_conn_.reset();
    writer_generation_ = generation_.load();
    writer_conn_ = connect(&why);
    if (!writer_conn_) {
        mark_down(RedisErrorKind::Connect, why);
        return false;
    }
    return pipeline(writer_conn_.get(), commands, replies);
}

std::string RedisStore::writer_lost() {
    if (!writer_conn_) {
        return "the tier is down";  // (writer_pipeline's reconnect failed: marked down there)
    }
    std::string why = writer_conn_->errstr;
    mark_down(kind_of(writer_conn_.get()), why);
    writer_conn_.reset();
    return why;
}

void RedisStore::run_remove(Job& job) {
    std::string why;
    if (!writer_connection(&why)) {
        return;  // the keys stay: a read verifies them again (and fails again)
    }
    std::vector<Command> cmds;
    for (const auto& k : job.keys) {
        cmds.push_back({"DEL", k});
    }
    std::vector<Reply> replies;
    if (!writer_pipeline(cmds, replies)) {
        writer_lost();
        return;
    }
    // A namespace: every manifest and pointer matching the patterns (SCAN, a page per round
    // trip).
    for (const std::string& pattern : job.patterns) {
        std::string cursor = "0";
        do {
            if (!pipeline(writer_conn_.get(), {{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}},
                          replies)) {
                writer_lost();
                return;
            }
            const redisReply* r = replies[0].get();
            if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING ||
                r->element[1]->type != REDIS_REPLY_ARRAY) {
                count_error(RedisErrorKind::Reply, "SCAN: unexpected reply");
                return;
            }
            cursor.assign(r->element[0]->str, r->element[0]->len);
            Command del{"DEL"};
            for (size_t i = 0; i < r->element[1]->elements; ++i) {
                const redisReply* k = r->element[1]->element[i];
                del.emplace_back(k->str, k->len);
            }
            if (del.size() > 1) {
                std::vector<Reply> ignored;  // (`del` points into `replies`: kept until sent)
                if (!pipeline(writer_conn_.get(), {del}, ignored)) {
                    writer_lost();
                    return;
                }
            }
        } while (cursor != "0");
    }
}

void RedisStore::remove_namespace(const NamespaceId& ns) {
    Job job;
    job.remove = true;
    job.keys = {lengths_key(ns)};
    job.patterns = {options_.prefix + "m:" + ns.hex() + ":*",
                    options_.prefix + "p:" + ns.hex() + ":*"};
    std::lock_guard lock(mu_);
    if (stopping_) {
        return;
    }
    queue_.push_back(std::move(job));
    work_cv_.notify_one();
}

void RedisStore::run_write(Job& job) {
    struct Done {  // the key leaves queued_keys_ whatever happens
        RedisStore* s;
        Hash128 key;
        ~Done() {
            std::lock_guard lock(s->mu_);
            s->queued_keys_.erase(key);
        }
    } done{this, job.key};
    auto drop = [&](uint64_t RedisStats::*counter, std::string why) {
        std::lock_guard lock(mu_);
        ++(counters_.*counter);
        counters_.last_error = std::move(why);
    };
    // A RAM entry's blocks are sent where they are when they are the blocks this store cuts,
    // else joined into the writer's buffer; verified against the RAM tier's checksum first.
    ReconstructError error = ReconstructError::None;
    const PreparedPayload prep =
        job.snapshot ? cutter_.prepare(*job.snapshot, job.cuts, write_buffer_, &error)
                     : cutter_.prepare(job.bytes, job.cuts);
    if (error != ReconstructError::None) {
        drop(&RedisStats::write_failures, "write rejected: the payload did not reconstruct");
        return;
    }
    if (prep.error != InsertError::None) {
        drop(&RedisStats::write_failures, std::string("write rejected: ") + to_string(prep.error));
        return;
    }
    if (std::string why; !writer_connection(&why)) {
        drop(&RedisStats::dropped_down, "write dropped: " + why);
        return;
    }
    auto lost = [&]() { drop(&RedisStats::dropped_down, "write dropped: " + writer_lost()); };
    // Unique blocks of the payload (by hash: XXH3-128 collisions are not planned for; a read
    // verifies every block against its hash and size anyway).
    std::vector<std::string> block_keys;
    std::vector<size_t> first_of;  // index in prep.blocks of each unique block
    std::unordered_map<Hash128, size_t, Hash128Hash> seen;
    for (size_t i = 0; i < prep.blocks.size(); ++i) {
        if (seen.emplace(prep.blocks[i].hash, block_keys.size()).second) {
            block_keys.push_back(block_key(prep.blocks[i].hash));
            first_of.push_back(i);
        }
    }
    const std::string mkey = manifest_key(job.ns, job.tokens);
    std::vector<Command> cmds;
    cmds.push_back({"EXISTS", mkey});
    for (const auto& k : block_keys) {
        cmds.push_back({"EXISTS", k});
    }
    std::vector<Reply> replies;
    if (!writer_pipeline(cmds, replies)) {
        lost();
        return;
    }
    auto exists = [](const Reply& r) { return r->type == REDIS_REPLY_INTEGER && r->integer > 0; };
    if (exists(replies[0])) {
        std::lock_guard lock(mu_);
        ++counters_.write_skipped;
        return;
    }
    auto refused = [&](const Reply& r) {
        const bool oom = is_oom(r);
        count_error(oom ? RedisErrorKind::Oom : RedisErrorKind::Reply, error_text(r));
        std::lock_guard lock(mu_);
        ++(oom ? counters_.dropped_oom : counters_.write_failures);
    };
    // Missing blocks, a few per round trip (hiredis copies a pipeline into its buffer).
    constexpr size_t kBlocksPerBatch = 16;
    std::vector<size_t> missing;
    for (size_t u = 0; u < block_keys.size(); ++u) {
        if (!exists(replies[u + 1])) {
            missing.push_back(u);
        }
    }
    uint64_t new_bytes = 0;
    for (size_t i = 0; i < missing.size(); i += kBlocksPerBatch) {
        cmds.clear();
        for (size_t k = i; k < std::min(missing.size(), i + kBlocksPerBatch); ++k) {
            const auto& b = prep.blocks[first_of[missing[k]]];
            cmds.push_back({"SET", block_keys[missing[k]],
                            std::string_view(reinterpret_cast<const char*>(b.data), b.size)});
            new_bytes += b.size;
        }
        if (!pipeline(writer_conn_.get(), cmds, replies)) {
            lost();
            return;
        }
        for (const Reply& r : replies) {
            if (is_error(r)) {
                refused(r);  // (the blocks stored so far stay, for the next write needing them)
                return;
            }
        }
    }
    const size_t new_blocks = missing.size();
    disk::Manifest m;
    m.ns = job.ns;
    m.page = job.page;
    m.descriptor = job.descriptor;
    m.tokens = job.tokens;
    for (const auto& b : prep.blocks) {
        m.blocks.push_back(disk::BlockRef{disk::BlockKey{b.hash, 0}, b.size});
    }
    m.payload_checksum = disk::payload_checksum(prep.size, m.blocks);
    const std::vector<uint8_t> manifest = disk::encode_manifest(m);
    // The manifest is the commit point: sent once every block is stored.
    if (!pipeline(
            writer_conn_.get(),
            {{"SET", mkey,
              std::string_view(reinterpret_cast<const char*>(manifest.data()), manifest.size())}},
            replies)) {
        lost();
        return;
    }
    if (is_error(replies[0])) {
        refused(replies[0]);
        return;
    }
    // The length, and for an entry whose KV pages truncate (dense models: kv-pages without
    // recurrent state) the page-prefix pointers: any prefix of it is servable.
    const std::string len = std::to_string(job.tokens.size());
    const std::string lkey = lengths_key(job.ns);
    cmds.clear();
    cmds.push_back({"ZADD", lkey, len, len});
    const bool truncates = job.descriptor.kind == PayloadKind::KvPages &&
                           job.descriptor.recurrent_bytes == 0 && job.descriptor.kv_bytes > 0;
    std::vector<std::string> pointers;  // key, value, key, value, ...
    if (truncates) {
        const std::string value = len + ":" + mkey;
        for (const auto& [b, key] :
             page_prefix_keys(job.ns, job.tokens, options_.page_tokens, options_.page_tokens)) {
            pointers.push_back(options_.prefix + "p:" + job.ns.hex() + ":" + hex128(key));
            pointers.push_back(value);
        }
        for (size_t i = 0; i < pointers.size(); i += 2) {
            cmds.push_back({"SET", pointers[i], pointers[i + 1]});
        }
    }
    if (!pipeline(writer_conn_.get(), cmds, replies)) {
        lost();
        return;
    }
    for (size_t i = 1; i < replies.size(); ++i) {
        if (is_error(replies[i])) {  // (the entry is still found at its exact length)
            count_error(is_oom(replies[i]) ? RedisErrorKind::Oom : RedisErrorKind::Reply,
                        error_text(replies[i]));
            break;
        }
    }
    if (is_error(replies[0])) {
        refused(replies[0]);  // not findable by lookups: the manifest goes too
        std::vector<Reply> ignored;
        if (!pipeline(writer_conn_.get(), {{"DEL", mkey}}, ignored)) {
            lost();
        }
        return;
    }
    std::lock_guard lock(mu_);
    ++counters_.writes;
    counters_.written_bytes += new_bytes;
    counters_.new_blocks += new_blocks;
    counters_.reused_blocks += prep.blocks.size() - new_blocks;
}

void RedisStore::flush() {
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [&] { return writer_done_ || (queue_.empty() && !busy_) || paused_; });
}

void RedisStore::close(bool drain) {
    std::lock_guard close_lock(close_mu_);
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
        drain_ = drain;
        paused_ = false;
        work_cv_.notify_all();
    }
    if (writer_.joinable()) {
        writer_.join();
    }
    std::lock_guard lock(pool_mu_);
    pool_.clear();
}

}  // namespace skippy::cache
