// RedisStore: the shared tier of the exact-state cache, below RAM and disk. Replicas of one
// model share one Redis: an entry recorded by one replica is restored by another. Entries
// (namespace + token path -> page id, descriptor, payload bytes) are stored as content-
// addressed blocks and one manifest per entry, in the disk tier's manifest format
// (disk_format.h), so both carry checksums and nothing unverified is ever returned.
//
//   RedisOpenResult opened = RedisStore::open({.url = "redis://10.0.0.5:6379/0"});
//   if (!opened.store) fail(opened.message);               // bad URL (rediss://: no TLS)
//   RedisStore& redis = *opened.store;                     // (Redis down: retried later)
//
//   // after a local record (any thread; never waits for Redis)
//   redis.submit_write(ns, tokens, page, descriptor, snapshot, cuts);
//
//   // local miss -> Redis (network I/O on the calling thread, bounded by the timeout)
//   if (std::optional<size_t> len = redis.lookup(ns, prompt, prompt.size())) {
//       RedisReadResult r = redis.read(ns, prompt.first(*len));  // verified, or quarantined
//       if (r.ok()) promote(r.page, r.descriptor, r.bytes);
//   }
//   // dense models (PrefixMatch::Common): also an entry longer than the shared part
//   RedisReadResult r = redis.read_longest(ns, prompt, max_len, min_len, PrefixMatch::Common);
//   if (r.ok()) promote(r.tokens, r.page, r.descriptor, r.bytes);  // serves r.len tokens
//   redis.stats();                                         // counters for /metrics
//
// Keys (prefix "skippy:" by default; RedisStoreOptions::prefix):
//   <prefix>b:<32 hex>                    a block: its raw bytes, named by their XXH3-128
//                                         (high word first, as the disk tier's block files)
//   <prefix>m:<ns hex>:<entry key hex>    an entry's manifest: disk::encode_manifest bytes
//                                         (entry key: disk::entry_key(ns, tokens))
//   <prefix>l:<ns hex>                    sorted set of the token lengths of the namespace's
//                                         entries (score = member = length), for lookups
//   <prefix>p:<ns hex>:<prefix key hex>   page-prefix pointer: "<entry length>:<manifest key>"
//                                         of the newest entry whose tokens start with that
//                                         prefix (a multiple of page_tokens long; prefix key:
//                                         disk::entry_key(ns, prefix)); truncatable entries only
// The namespace digest covers the weights, llama.cpp's version, the KV layout, the device
// layout and the tenant (prompt_cache_key): tenants never see each other's entries.
//
// Write (its own thread and connection): reconstruct the snapshot, cut it into blocks (the
// disk tier's block size and cuts), one pipelined EXISTS for the manifest and every block,
// SET the missing blocks, SET the manifest (the commit point), then ZADD the length and, for
// an entry whose payload truncates to any prefix (kv-pages without recurrent state: dense
// models), SET a page-prefix pointer per page_tokens boundary, pipelined. A write
// never blocks the submitter: the queue is bounded (entries and bytes), a full queue drops
// the write and counts it.
//
// Read (calling thread, a small pool of connections): lookup = ZREVRANGEBYSCORE of the lengths
// <= max_len (the longest 256), then pipelined EXISTS of the manifests of those prefixes of the
// query, 64 a round trip; the longest existing wins. read = GET manifest, decode and verify it
// (checksum, namespace, tokens, descriptor), MGET its blocks, verify every block's size and
// XXH3-128 and the payload checksum, and only then return the bytes. Anything wrong (a block
// missing because Redis evicted it, truncated or tampered bytes, a bad manifest) returns an error
// with its reason, is counted, and the manifest (and any bad block) is deleted by the writer
// thread.
//
// Failures. Every connect and command has a timeout (100 ms by default). A connection error
// or a timeout marks the tier down for a back-off (2 s), logged once per outage and once
// when it comes back; while down, lookups, reads and writes return at once. A write refused
// with OOM (maxmemory with noeviction) is dropped and counted. No caller ever waits on Redis
// beyond the timeout per command, and no error escapes as an exception. The process must
// ignore SIGPIPE (skippy serve does; the writer thread blocks it for itself): a write to a
// connection Redis closed then fails with EPIPE instead of killing the process.
//
// Thread safety. Every public member may be called from any thread. Each connection is used
// by one thread at a time (the pool's mutex hands them out); the writer's connection is the
// writer thread's own. Counters are under one mutex, never held during network I/O.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cache/block_store.h"
#include "cache/disk_format.h"
#include "cache/namespace_id.h"
#include "cache/page_id.h"
#include "cache/payload_descriptor.h"
#include "cache/radix_index.h"
#include "cache/token.h"

struct redisContext;
struct redisReply;

namespace skippy::cache {

// redis://[user:]password@host[:port][/db], redis://host[:port][/db],
// unix:///path/to.sock[?db=N&password=X&user=U]. rediss:// is refused (no TLS in hiredis
// 0.14, Debian's).
struct RedisUrl {
    bool unix_socket = false;
    std::string host;  // TCP
    int port = 6379;
    std::string path;  // unix socket
    int db = 0;
    std::string user;  // empty: AUTH <password> (Redis < 6 style)
    std::string password;
    std::string redacted() const;  // for logs: the password replaced by "***"
};
std::optional<RedisUrl> parse_redis_url(std::string_view url, std::string* why);

// The kv-pages page size (runtime::kKvPageTokens; prefix_cache_prefetch.cpp checks they agree).
inline constexpr size_t kRedisPageTokens = 64;

struct RedisStoreOptions {
    std::string url;
    std::string prefix = "skippy:";
    std::chrono::milliseconds timeout{100};   // connect and each command
    std::chrono::milliseconds backoff{2000};  // down -> next try
    size_t queue_capacity = 16;               // queued writes, not counting the one running
    uint64_t max_queued_bytes = 1ull << 30;   // payload bytes held by the queue
    size_t block_bytes = kDefaultBlockBytes;
    size_t pool_size = 4;         // idle read connections kept
    size_t max_candidates = 256;  // lengths tried per lookup, longest first (64 a round trip)
    // Page-prefix pointers every page_tokens (the kv-pages page size, runtime::kKvPageTokens);
    // 0: none written or read.
    size_t page_tokens = kRedisPageTokens;
    size_t max_pointers = 512;  // deepest boundaries read per lookup (one MGET)
    // Once per outage, and once when the tier is back; default: one line on stderr.
    std::function<void(std::string_view)> log;
};

struct RedisOpenResult {
    std::unique_ptr<class RedisStore> store;  // null iff the URL is unusable
    std::string message;  // the error, or a note ("up", "down at start-up: ...")
};

enum class RedisSubmit : uint8_t {
    Queued,
    AlreadyQueued,
    DroppedFull,  // queue full (entries or bytes)
    Down,         // the tier is down (back-off)
    Invalid,      // empty tokens, descriptor inconsistent with the bytes
    Stopped,
};
const char* to_string(RedisSubmit s);

enum class RedisReadError : uint8_t {
    None,
    Down,          // tier down or the command failed (connection, timeout): not the entry's fault
    NotFound,      // no manifest (evicted, deleted)
    BadManifest,   // does not decode, or not this namespace / tokens / descriptor
    MissingBlock,  // partially evicted
    Truncated,     // a block of another size
    ChecksumMismatch,  // a block's hash or the payload checksum
    Count,
};
const char* to_string(RedisReadError e);

struct RedisReadResult {
    RedisReadError error = RedisReadError::None;
    std::string detail;
    PageId page;
    PayloadDescriptor descriptor;
    std::vector<uint8_t> bytes;  // the verified payload
    // read_longest: the entry's token path (longer than `len` when it was found by a page-prefix
    // pointer) and how many tokens of the query it serves (its common prefix with the query,
    // at most max_len).
    std::vector<Token> tokens;
    size_t len = 0;
    double seconds = 0;
    bool ok() const { return error == RedisReadError::None; }
};

// Errors by kind (skippy_cache_redis_errors_total{kind}).
enum class RedisErrorKind : uint8_t { Connect, Timeout, Io, Reply, Oom, Count };
const char* to_string(RedisErrorKind k);

struct RedisStats {
    bool up = true;
    uint64_t outages = 0;
    uint64_t lookups = 0;  // lookups that reached Redis
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t skipped_down = 0;  // lookups, reads and writes refused while down
    uint64_t reads = 0;         // verified reads
    uint64_t read_bytes = 0;
    std::array<uint64_t, static_cast<size_t>(RedisReadError::Count)> read_failures{};
    uint64_t quarantines = 0;  // manifests deleted as bad
    double read_seconds_sum = 0;
    uint64_t read_seconds_count = 0;
    uint64_t submitted = 0;
    uint64_t writes = 0;         // manifests committed
    uint64_t written_bytes = 0;  // block bytes sent (blocks already there are not)
    uint64_t new_blocks = 0;
    uint64_t reused_blocks = 0;
    uint64_t write_skipped = 0;  // the manifest was there already
    uint64_t dropped_full = 0;
    uint64_t dropped_down = 0;  // submitted while down, or lost to an error mid-write
    uint64_t dropped_oom = 0;
    uint64_t write_failures = 0;  // the snapshot did not reconstruct, bad cuts
    std::array<uint64_t, static_cast<size_t>(RedisErrorKind::Count)> errors{};
    size_t queue_depth = 0;  // queued + running
    uint64_t queued_bytes = 0;
    std::string last_error;
};

namespace detail {
struct RedisReplyFree {
    void operator()(::redisReply* r) const;
};
using RedisReplyPtr = std::unique_ptr<::redisReply, RedisReplyFree>;
}  // namespace detail

class RedisStore {
  public:
    // Never throws; a Redis that cannot be reached is not an error (it is retried).
    static RedisOpenResult open(RedisStoreOptions options);
    ~RedisStore();  // close(true)
    RedisStore(const RedisStore&) = delete;
    RedisStore& operator=(const RedisStore&) = delete;

    // Queues a write; `snapshot` shares the RAM tier's blocks (no copy). `cuts`: block
    // boundaries as in BlockStore::prepare.
    RedisSubmit submit_write(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                             const PayloadDescriptor& descriptor, PayloadSnapshot snapshot,
                             std::vector<size_t> cuts = {});
    RedisSubmit submit_write(const NamespaceId& ns, std::span<const Token> tokens, PageId page,
                             const PayloadDescriptor& descriptor, std::vector<uint8_t> bytes,
                             std::vector<size_t> cuts = {});

    // Length of the longest stored entry that is a prefix of `tokens`, at least min_len and
    // at most max_len tokens; nullopt on a miss or while down.
    std::optional<size_t> lookup(const NamespaceId& ns, std::span<const Token> tokens,
                                 size_t max_len, size_t min_len = 1);
    // Reads and verifies the entry stored exactly at `tokens`. Bad entries are quarantined.
    RedisReadResult read(const NamespaceId& ns, std::span<const Token> tokens);
    // Lookup and read in one: the entry that serves the longest prefix of `tokens` (at least
    // min_len, at most max_len tokens). Stored: lookup() then read(). Common: also entries
    // longer than what they share with `tokens`, found by their page-prefix pointers (at most
    // max_entry_len tokens long); r.tokens is the entry's path, r.len what it serves. A miss is
    // NotFound.
    RedisReadResult read_longest(const NamespaceId& ns, std::span<const Token> tokens,
                                 size_t max_len, size_t min_len, PrefixMatch match,
                                 size_t max_entry_len = SIZE_MAX);
    // Deletes the entry's manifest (asynchronously; a restore of its bytes failed).
    void quarantine(const NamespaceId& ns, std::span<const Token> tokens);
    // Deletes every entry of the namespace (asynchronously: its manifests, pointers and length set;
    // the blocks, which other namespaces may share, are left to Redis' eviction).
    void remove_namespace(const NamespaceId& ns);

    // Waits until every queued write and deletion is done.
    void flush();
    // Stops the writer (drain: finish queued writes first; else drop them).
    void close(bool drain = true);

    RedisStats stats() const;
    bool up() const;
    const RedisUrl& url() const { return url_; }
    const RedisStoreOptions& options() const { return options_; }

    // Keys, for tests and tools.
    std::string block_key(const Hash128& hash) const;
    std::string manifest_key(const NamespaceId& ns, std::span<const Token> tokens) const;
    std::string lengths_key(const NamespaceId& ns) const;
    // The page-prefix pointer of tokens[0, n) (n a multiple of page_tokens).
    std::string pointer_key(const NamespaceId& ns, std::span<const Token> prefix) const;
    // Tests: the writer takes no job while paused.
    void debug_pause_writer(bool paused);

  private:
    struct Job {
        bool remove = false;  // quarantine: delete `keys`
        std::vector<std::string> keys;
        std::vector<std::string> patterns;  // remove: and every key SCAN finds with them
        NamespaceId ns;
        std::vector<Token> tokens;
        PageId page;
        PayloadDescriptor descriptor;
        std::vector<uint8_t> bytes;  // (empty while `snapshot` holds the payload)
        std::optional<PayloadSnapshot> snapshot;
        std::vector<size_t> cuts;
        Hash128 key;
        uint64_t size() const { return snapshot ? snapshot->size() : bytes.size(); }
    };
    struct ContextFree {
        void operator()(redisContext* c) const;
    };

    using Conn = std::unique_ptr<redisContext, ContextFree>;

    RedisStore(RedisStoreOptions options, RedisUrl url);
    RedisSubmit submit_job(Job job);
    void writer_loop();
    void run_write(Job& job);
    void run_remove(Job& job);
    // Connection handling (redis_store_conn.cpp).
    Conn connect(std::string* why);
    Conn acquire();             // null: down, or the connect failed (marked down)
    void give_back(Conn conn);  // kept if healthy and the pool has room
    bool available();           // false while down; true once per back-off to retry
    void mark_down(RedisErrorKind kind, const std::string& why);
    void mark_up();
    void count_error(RedisErrorKind kind, const std::string& why);
    // Error kind of a failed connection (timeout or I/O).
    static RedisErrorKind kind_of(const redisContext* c);
    void enqueue_remove(std::vector<std::string> keys);
    // Read side (redis_store_read.cpp). The longest of `lengths` whose manifest exists (a
    // prefix of `tokens`); false: the connection failed (marked down).
    bool longest_existing(redisContext* c, const NamespaceId& ns, std::span<const Token> tokens,
                          const std::vector<size_t>& lengths, std::optional<size_t>* found);
    // GET the manifest `mkey`, verify it and its blocks. shared == 0: the entry is exactly
    // `query`; else its path must start with query[0, shared) (`pointer` led to it: deleted
    // when the entry is gone or does not match) and serve at least min_len of `query`.
    RedisReadResult read_manifest(const NamespaceId& ns, const std::string& mkey,
                                  std::span<const Token> query, size_t shared,
                                  const std::string& pointer, size_t min_len, size_t max_len);
    // Writer thread: its connection (reopened after an outage), and the first command
    // batch of a job, retried once on a new connection when the old one was idle.
    bool writer_connection(std::string* why);
    std::string writer_lost();  // marks the tier down, drops the connection; why
    bool writer_pipeline(const std::vector<std::vector<std::string_view>>& commands,
                         std::vector<detail::RedisReplyPtr>& replies);

    const RedisStoreOptions options_;
    const RedisUrl url_;
    BlockStore cutter_;  // only prepare(): cuts and hashes (thread-safe)

    mutable std::mutex mu_;  // counters, down state, queue
    std::condition_variable work_cv_;
    std::condition_variable idle_cv_;
    std::deque<Job> queue_;
    std::unordered_set<Hash128, Hash128Hash> queued_keys_;
    bool busy_ = false;
    bool paused_ = false;
    bool stopping_ = false;
    bool drain_ = true;
    bool writer_done_ = false;
    bool down_ = false;
    std::chrono::steady_clock::time_point retry_at_{};
    RedisStats counters_;
    std::atomic<bool> up_{true};

    std::mutex pool_mu_;
    std::vector<Conn> pool_;

    std::atomic<uint64_t> generation_{0};  // outages so far (connections older are stale)
    Conn writer_conn_;                     // writer thread only
    uint64_t writer_generation_ = 0;
    bool writer_fresh_ = false;
    // Writer thread only: a queued snapshot whose blocks are not this store's is joined here.
    std::vector<uint8_t> write_buffer_;
    std::mutex close_mu_;
    std::thread writer_;
};

}  // namespace skippy::cache
