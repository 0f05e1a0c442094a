// RedisStore against a real redis-server (started per test on a unix socket in a temp dir;
// skipped when redis-server is not installed): round trip, longest prefix, namespaces,
// partial eviction, tampered/truncated blocks, bad manifests, Redis killed / stopped /
// restarted, a full queue, OOM, URL parsing.
#include "cache/redis_store.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>

#include <chrono>
#include <csignal>
#include <mutex>
#include <thread>

#include "disk_test_util.h"
#include "redis_server.h"

namespace skippy::cache {
namespace {

using namespace test;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

class RedisStoreTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!skippy::testing::RedisServer::installed()) {
            GTEST_SKIP() << "redis-server is not installed";
        }
        // As skippy serve does: a write to a connection Redis closed fails, not kills.
        std::signal(SIGPIPE, SIG_IGN);
        start_server();
    }
    void TearDown() override { stop_server(); }

    void start_server() { ASSERT_TRUE(redis_.start()) << redis_.error(); }
    void stop_server() { redis_.stop(); }
    // One command on a fresh connection (the test's own redis-cli).
    std::string cli(std::vector<std::string> args) {
        redisContext* c = redisConnectUnix(redis_.socket().c_str());
        EXPECT_TRUE(c != nullptr && c->err == 0);
        std::vector<const char*> argv;
        std::vector<size_t> lens;
        for (const auto& a : args) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        auto* r = static_cast<redisReply*>(
            redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
        std::string out;
        if (r != nullptr) {
            if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
                r->type == REDIS_REPLY_ERROR) {
                out.assign(r->str, r->len);
            } else if (r->type == REDIS_REPLY_INTEGER) {
                out = std::to_string(r->integer);
            } else if (r->type == REDIS_REPLY_NIL) {
                out = "(nil)";
            }
            freeReplyObject(r);
        }
        redisFree(c);
        return out;
    }
    std::unique_ptr<RedisStore> open(RedisStoreOptions o = {}) {
        if (o.url.empty()) {
            o.url = redis_.url();
        }
        o.timeout = std::chrono::milliseconds(100);
        if (o.backoff == std::chrono::milliseconds(2000)) {
            o.backoff = std::chrono::milliseconds(300);
        }
        o.block_bytes = 4096;
        o.log = [this](std::string_view line) {
            std::lock_guard lock(log_mu_);
            logs_.emplace_back(line);
        };
        RedisOpenResult r = RedisStore::open(std::move(o));
        EXPECT_TRUE(r.store) << r.message;
        return std::move(r.store);
    }
    size_t log_lines() {
        std::lock_guard lock(log_mu_);
        return logs_.size();
    }
    static RedisSubmit submit(RedisStore& s, const NamespaceId& ns, const PrefixPayload& p) {
        return s.submit_write(ns, p.tokens, p.page, p.descriptor, p.bytes, p.cuts);
    }
    // The first block key of the entry (from its manifest).
    std::string first_block(RedisStore& s, const NamespaceId& ns, const PrefixPayload& p) {
        const std::string m = cli({"GET", s.manifest_key(ns, p.tokens)});
        std::string why;
        auto man = disk::decode_manifest(
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(m.data()), m.size()), &why);
        EXPECT_TRUE(man) << why;
        return man ? s.block_key(man->blocks.front().key.hash) : std::string();
    }

    skippy::testing::RedisServer redis_;
    std::mutex log_mu_;
    std::vector<std::string> logs_;
};

TEST_F(RedisStoreTest, RoundTrip) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 1, 300);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().writes, 1u);
    std::vector<Token> query = p.tokens;
    query.push_back(5);
    query.push_back(6);
    auto len = store->lookup(ns, query, query.size());
    ASSERT_TRUE(len);
    EXPECT_EQ(*len, p.tokens.size());
    RedisReadResult r = store->read(ns, std::span<const Token>(query).first(*len));
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.bytes, p.bytes);
    EXPECT_EQ(r.page, p.page);
    EXPECT_EQ(r.descriptor, p.descriptor);
    // A second write of the same entry is skipped; a longer one reuses the shared blocks.
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().write_skipped, 1u);
    const PrefixPayload longer = prefix_payload(ns, 1, 400);
    ASSERT_EQ(submit(*store, ns, longer), RedisSubmit::Queued);
    store->flush();
    const RedisStats s = store->stats();
    EXPECT_EQ(s.writes, 2u);
    EXPECT_GT(s.reused_blocks, 0u);
    EXPECT_TRUE(s.up);
    EXPECT_EQ(s.reads, 1u);
    // max_len bounds the answer.
    EXPECT_EQ(store->lookup(ns, longer.tokens, 399), std::optional<size_t>(300));
    EXPECT_EQ(store->lookup(ns, longer.tokens, 299), std::nullopt);
    EXPECT_EQ(store->lookup(ns, longer.tokens, 400, 350), std::optional<size_t>(400));
}

TEST_F(RedisStoreTest, ManyBlocksGoInSeveralBatches) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 2, 64 * 50);  // 50 blocks of 4 KiB
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().new_blocks, 50u);
    RedisReadResult r = store->read(ns, p.tokens);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.bytes, p.bytes);
}

TEST_F(RedisStoreTest, LongestPrefixAmongSeveralLengths) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    for (size_t n : {100, 200, 300, 500}) {
        ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 3, n)), RedisSubmit::Queued);
    }
    // Another conversation with other tokens: its lengths are candidates, never hits.
    ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 4, 450)), RedisSubmit::Queued);
    store->flush();
    const PrefixPayload q = prefix_payload(ns, 3, 470);
    EXPECT_EQ(store->lookup(ns, q.tokens, q.tokens.size()), std::optional<size_t>(300));
    RedisReadResult r = store->read(ns, std::span<const Token>(q.tokens).first(300));
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.bytes, prefix_payload(ns, 3, 300).bytes);
    // Diverging at 150: only the 100-token entry is a prefix.
    std::vector<Token> other = q.tokens;
    other[150] += 1;
    EXPECT_EQ(store->lookup(ns, other, other.size()), std::optional<size_t>(100));
}

TEST_F(RedisStoreTest, LongestPrefixBelowManyOtherLengths) {
    // A shared head of 150 tokens below 100 other conversations' longer entries: found in
    // the second batch of candidates.
    RedisStoreOptions o;
    o.queue_capacity = 128;
    auto store = open(o);
    const NamespaceId ns = test_namespace();
    for (size_t i = 0; i < 100; ++i) {
        ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 100 + i, 201 + i, 64)),
                  RedisSubmit::Queued);
    }
    ASSERT_EQ(submit(*store, ns, prefix_payload(ns, 3, 150, 64)), RedisSubmit::Queued);
    store->flush();
    const PrefixPayload q = prefix_payload(ns, 3, 470, 64);
    EXPECT_EQ(store->lookup(ns, q.tokens, q.tokens.size()), std::optional<size_t>(150));
}

TEST_F(RedisStoreTest, NamespacesAreIsolated) {
    auto store = open();
    const NamespaceId a = test_namespace("tenant-a");
    const NamespaceId b = test_namespace("tenant-b");
    const PrefixPayload p = prefix_payload(a, 5, 200);
    ASSERT_EQ(submit(*store, a, p), RedisSubmit::Queued);
    store->flush();
    EXPECT_TRUE(store->lookup(a, p.tokens, p.tokens.size()));
    EXPECT_FALSE(store->lookup(b, p.tokens, p.tokens.size()));
    EXPECT_EQ(store->read(b, p.tokens).error, RedisReadError::NotFound);
    // A manifest copied under another namespace's key is refused (its namespace differs).
    cli({"SET", store->manifest_key(b, p.tokens), cli({"GET", store->manifest_key(a, p.tokens)})});
    RedisReadResult r = store->read(b, p.tokens);
    EXPECT_EQ(r.error, RedisReadError::BadManifest);
    EXPECT_TRUE(r.bytes.empty());
}

TEST_F(RedisStoreTest, RemoveNamespace) {
    auto store = open();
    const NamespaceId a = test_namespace("tenant-a");
    const NamespaceId b = test_namespace("tenant-b");
    for (size_t n : {100, 200, 300}) {
        ASSERT_EQ(submit(*store, a, prefix_payload(a, 6, n)), RedisSubmit::Queued);
    }
    const PrefixPayload other = prefix_payload(b, 6, 200);
    ASSERT_EQ(submit(*store, b, other), RedisSubmit::Queued);
    store->flush();
    store->remove_namespace(a);
    store->flush();
    const PrefixPayload p = prefix_payload(a, 6, 300);
    EXPECT_FALSE(store->lookup(a, p.tokens, p.tokens.size()));
    EXPECT_EQ(cli({"EXISTS", store->lengths_key(a)}), "0");
    EXPECT_TRUE(store->read(b, other.tokens).ok());
}

TEST_F(RedisStoreTest, MissingBlockIsAnErrorAndQuarantines) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 7, 300);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    ASSERT_EQ(cli({"DEL", first_block(*store, ns, p)}), "1");
    RedisReadResult r = store->read(ns, p.tokens);
    EXPECT_EQ(r.error, RedisReadError::MissingBlock);
    EXPECT_TRUE(r.bytes.empty());
    store->flush();
    EXPECT_EQ(cli({"EXISTS", store->manifest_key(ns, p.tokens)}), "0");
    EXPECT_FALSE(store->lookup(ns, p.tokens, p.tokens.size()));
    const RedisStats s = store->stats();
    EXPECT_EQ(s.read_failures[static_cast<size_t>(RedisReadError::MissingBlock)], 1u);
    EXPECT_EQ(s.quarantines, 1u);
}

TEST_F(RedisStoreTest, TamperedAndTruncatedBlocksAreNeverReturned) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 8, 300);
    const PrefixPayload q = prefix_payload(ns, 9, 300);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    ASSERT_EQ(submit(*store, ns, q), RedisSubmit::Queued);
    store->flush();
    const std::string bp = first_block(*store, ns, p);
    const std::string byte = cli({"GETRANGE", bp, "10", "10"});
    cli({"SETRANGE", bp, "10", std::string(1, static_cast<char>(byte[0] ^ 0x40))});
    RedisReadResult r = store->read(ns, p.tokens);
    EXPECT_EQ(r.error, RedisReadError::ChecksumMismatch);
    EXPECT_TRUE(r.bytes.empty());
    const std::string bq = first_block(*store, ns, q);
    const std::string value = cli({"GET", bq});
    cli({"SET", bq, value.substr(0, value.size() - 1)});
    r = store->read(ns, q.tokens);
    EXPECT_EQ(r.error, RedisReadError::Truncated);
    EXPECT_TRUE(r.bytes.empty());
    store->flush();
    // Manifests and the bad blocks are deleted: a new write stores good bytes again.
    EXPECT_EQ(cli({"EXISTS", store->manifest_key(ns, p.tokens)}), "0");
    EXPECT_EQ(cli({"EXISTS", bp}), "0");
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    r = store->read(ns, p.tokens);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.bytes, p.bytes);
}

TEST_F(RedisStoreTest, BadManifestIsRefused) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 10, 200);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    const std::string key = store->manifest_key(ns, p.tokens);
    std::string m = cli({"GET", key});
    m[m.size() / 2] ^= 1;
    cli({"SET", key, m});
    EXPECT_EQ(store->read(ns, p.tokens).error, RedisReadError::BadManifest);
    store->flush();
    EXPECT_EQ(cli({"EXISTS", key}), "0");
    cli({"SET", key, "garbage"});
    EXPECT_EQ(store->read(ns, p.tokens).error, RedisReadError::BadManifest);
}

TEST_F(RedisStoreTest, RedisKilledThenRestarted) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 11, 200);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    ASSERT_TRUE(store->lookup(ns, p.tokens, p.tokens.size()));
    const size_t logs_before = log_lines();
    stop_server();
    for (int i = 0; i < 20; ++i) {
        const auto t0 = Clock::now();
        EXPECT_FALSE(store->lookup(ns, p.tokens, p.tokens.size()));
        EXPECT_FALSE(store->read(ns, p.tokens).ok());
        EXPECT_LT(seconds_since(t0), 0.1 * 2 + 0.1);
    }
    EXPECT_FALSE(store->up());
    EXPECT_EQ(submit(*store, ns, p), RedisSubmit::Down);
    RedisStats s = store->stats();
    EXPECT_EQ(s.outages, 1u);
    EXPECT_GT(s.skipped_down, 0u);
    EXPECT_GT(s.errors[static_cast<size_t>(RedisErrorKind::Io)] +
                  s.errors[static_cast<size_t>(RedisErrorKind::Connect)],
              0u);
    EXPECT_EQ(log_lines(), logs_before + 1);  // one line per outage
    // Back (empty: no persistence): after the back-off, writes and reads work again.
    start_server();
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    EXPECT_FALSE(store->lookup(ns, p.tokens, p.tokens.size()));
    EXPECT_TRUE(store->up());
    EXPECT_EQ(log_lines(), logs_before + 2);  // and one when it is back
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    EXPECT_TRUE(store->lookup(ns, p.tokens, p.tokens.size()));
    EXPECT_TRUE(store->read(ns, p.tokens).ok());
}

TEST_F(RedisStoreTest, StoppedRedisTimesOut) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 12, 200);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    ASSERT_TRUE(store->lookup(ns, p.tokens, p.tokens.size()));
    redis_.signal(SIGSTOP);  // hangs: connections open, no replies
    auto t0 = Clock::now();
    EXPECT_FALSE(store->lookup(ns, p.tokens, p.tokens.size()));
    EXPECT_LT(seconds_since(t0), 0.1 + 0.15);
    t0 = Clock::now();
    EXPECT_EQ(store->read(ns, p.tokens).error, RedisReadError::Down);  // at once while down
    EXPECT_LT(seconds_since(t0), 0.05);
    EXPECT_GE(store->stats().errors[static_cast<size_t>(RedisErrorKind::Timeout)], 1u);
    redis_.signal(SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    EXPECT_TRUE(store->lookup(ns, p.tokens, p.tokens.size()));
}

TEST_F(RedisStoreTest, FullQueueDrops) {
    RedisStoreOptions o;
    o.queue_capacity = 2;
    auto store = open(o);
    const NamespaceId ns = test_namespace();
    store->debug_pause_writer(true);
    EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 20, 100)), RedisSubmit::Queued);
    EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 20, 100)), RedisSubmit::AlreadyQueued);
    EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 21, 100)), RedisSubmit::Queued);
    EXPECT_EQ(submit(*store, ns, prefix_payload(ns, 22, 100)), RedisSubmit::DroppedFull);
    EXPECT_EQ(store->stats().dropped_full, 1u);
    store->debug_pause_writer(false);
    store->flush();
    EXPECT_EQ(store->stats().writes, 2u);
    EXPECT_EQ(store->stats().queued_bytes, 0u);
}

TEST_F(RedisStoreTest, OutOfMemoryDropsTheWrite) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    ASSERT_EQ(cli({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "OK");
    ASSERT_EQ(cli({"CONFIG", "SET", "maxmemory", "1mb"}), "OK");
    const PrefixPayload p = prefix_payload(ns, 30, 64 * 40, 64 * 1024);  // 2.5 MiB
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    const RedisStats s = store->stats();
    EXPECT_EQ(s.writes, 0u);
    EXPECT_EQ(s.dropped_oom, 1u);
    EXPECT_GE(s.errors[static_cast<size_t>(RedisErrorKind::Oom)], 1u);
    EXPECT_TRUE(s.up);  // an OOM is not an outage
    EXPECT_FALSE(store->lookup(ns, p.tokens, p.tokens.size()));
}

// A dense model's entry: attention KV pages only, which truncate to any prefix.
PrefixPayload kv_payload(const NamespaceId& ns, uint64_t seed, size_t n_tokens) {
    PrefixPayload p = prefix_payload(ns, seed, n_tokens);
    p.descriptor.kind = PayloadKind::KvPages;
    p.descriptor.kv_bytes = p.bytes.size();
    p.descriptor.recurrent_bytes = 0;
    return p;
}

TEST_F(RedisStoreTest, CommonPrefixOfALongerEntry) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = kv_payload(ns, 40, 300);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    // A pointer per page of the entry (64, 128, 192, 256), none beyond.
    const std::span<const Token> path(p.tokens);
    for (size_t b : {64, 128, 192, 256}) {
        EXPECT_EQ(cli({"GET", store->pointer_key(ns, path.first(b))}),
                  "300:" + store->manifest_key(ns, p.tokens))
            << b;
    }
    // A prompt sharing the first 200 tokens, then another turn.
    std::vector<Token> prompt = kv_payload(ns, 40, 400).tokens;
    prompt[200] += 1;
    EXPECT_FALSE(store->lookup(ns, prompt, prompt.size()));  // not an exact prefix
    RedisReadResult r = store->read_longest(ns, prompt, prompt.size(), 1, PrefixMatch::Stored);
    EXPECT_EQ(r.error, RedisReadError::NotFound);
    r = store->read_longest(ns, prompt, prompt.size(), 1, PrefixMatch::Common);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.len, 200u);  // the whole common prefix, not only the page boundary
    EXPECT_EQ(r.tokens, p.tokens);
    EXPECT_EQ(r.bytes, p.bytes);
    EXPECT_EQ(r.page, p.page);
    EXPECT_EQ(r.descriptor, p.descriptor);
    // max_len caps what it serves; min_len above what it shares: a miss.
    r = store->read_longest(ns, prompt, 150, 1, PrefixMatch::Common);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.len, 150u);
    EXPECT_EQ(store->read_longest(ns, prompt, prompt.size(), 201, PrefixMatch::Common).error,
              RedisReadError::NotFound);
    // An entry longer than a lane holds is not a candidate.
    EXPECT_EQ(store->read_longest(ns, prompt, prompt.size(), 1, PrefixMatch::Common, 299).error,
              RedisReadError::NotFound);
    // An exact prefix at least as deep as the deepest pointer wins; a shallower one does not.
    const PrefixPayload exact = kv_payload(ns, 40, 195);
    ASSERT_EQ(submit(*store, ns, exact), RedisSubmit::Queued);
    const PrefixPayload shallow = kv_payload(ns, 40, 100);
    ASSERT_EQ(submit(*store, ns, shallow), RedisSubmit::Queued);
    store->flush();
    r = store->read_longest(ns, prompt, prompt.size(), 1, PrefixMatch::Common);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.len, 195u);
    EXPECT_EQ(r.tokens, exact.tokens);
    EXPECT_EQ(r.bytes, exact.bytes);
    EXPECT_EQ(store->stats().quarantines, 0u);
}

TEST_F(RedisStoreTest, FullStateEntriesHaveNoPointers) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 41, 300);  // full-state: does not truncate
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    EXPECT_EQ(cli({"EXISTS", store->pointer_key(ns, std::span<const Token>(p.tokens).first(64))}),
              "0");
    std::vector<Token> prompt = p.tokens;
    prompt[200] += 1;
    EXPECT_EQ(store->read_longest(ns, prompt, prompt.size(), 1, PrefixMatch::Common).error,
              RedisReadError::NotFound);
}

TEST_F(RedisStoreTest, DanglingPointerIsAMiss) {
    auto store = open();
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = kv_payload(ns, 42, 300);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    std::vector<Token> prompt = p.tokens;
    prompt[250] += 1;
    const std::string pointer = store->pointer_key(ns, std::span<const Token>(prompt).first(192));
    ASSERT_EQ(cli({"EXISTS", pointer}), "1");
    // The manifest evicted: a miss, not an error, and the pointer goes.
    ASSERT_EQ(cli({"DEL", store->manifest_key(ns, p.tokens)}), "1");
    RedisReadResult r = store->read_longest(ns, prompt, prompt.size(), 1, PrefixMatch::Common);
    EXPECT_EQ(r.error, RedisReadError::NotFound);
    store->flush();
    EXPECT_EQ(cli({"EXISTS", pointer}), "0");
    // A pointer to another conversation's entry (tampered): a miss too.
    const PrefixPayload other = kv_payload(ns, 43, 300);
    ASSERT_EQ(submit(*store, ns, other), RedisSubmit::Queued);
    store->flush();
    cli({"SET", pointer, "300:" + store->manifest_key(ns, other.tokens)});
    r = store->read_longest(ns, prompt, prompt.size(), 1, PrefixMatch::Common);
    EXPECT_EQ(r.error, RedisReadError::NotFound);
    store->flush();
    EXPECT_EQ(cli({"EXISTS", pointer}), "0");
    EXPECT_TRUE(store->read(ns, other.tokens).ok());  // (that entry is fine)
    const RedisStats s = store->stats();
    EXPECT_EQ(s.quarantines, 0u);
    EXPECT_TRUE(s.up);
}

TEST_F(RedisStoreTest, PointersAreIsolatedAndRemovedByNamespace) {
    auto store = open();
    const NamespaceId a = test_namespace("tenant-a");
    const NamespaceId b = test_namespace("tenant-b");
    const PrefixPayload pa = kv_payload(a, 44, 300);
    const PrefixPayload pb = kv_payload(b, 44, 300);  // the same tokens, another tenant
    ASSERT_EQ(submit(*store, a, pa), RedisSubmit::Queued);
    store->flush();
    std::vector<Token> prompt = pa.tokens;
    prompt[200] += 1;
    EXPECT_TRUE(store->read_longest(a, prompt, prompt.size(), 1, PrefixMatch::Common).ok());
    EXPECT_EQ(store->read_longest(b, prompt, prompt.size(), 1, PrefixMatch::Common).error,
              RedisReadError::NotFound);
    // a's pointer copied under b's key: it names a's manifest, never read for b.
    const std::span<const Token> head = std::span<const Token>(prompt).first(192);
    cli({"SET", store->pointer_key(b, head), cli({"GET", store->pointer_key(a, head)})});
    EXPECT_EQ(store->read_longest(b, prompt, prompt.size(), 1, PrefixMatch::Common).error,
              RedisReadError::NotFound);
    ASSERT_EQ(submit(*store, b, pb), RedisSubmit::Queued);
    store->flush();
    store->remove_namespace(a);
    store->flush();
    for (size_t n : {64, 128, 192, 256}) {
        EXPECT_EQ(
            cli({"EXISTS", store->pointer_key(a, std::span<const Token>(pa.tokens).first(n))}),
            "0");
        EXPECT_EQ(
            cli({"EXISTS", store->pointer_key(b, std::span<const Token>(pb.tokens).first(n))}),
            "1");
    }
    EXPECT_EQ(store->read_longest(a, prompt, prompt.size(), 1, PrefixMatch::Common).error,
              RedisReadError::NotFound);
    RedisReadResult r = store->read_longest(b, prompt, prompt.size(), 1, PrefixMatch::Common);
    ASSERT_TRUE(r.ok()) << r.detail;
    EXPECT_EQ(r.tokens, pb.tokens);
}

TEST(RedisUrl, Parses) {
    std::string why;
    auto u = parse_redis_url("redis://localhost", &why);
    ASSERT_TRUE(u) << why;
    EXPECT_EQ(u->host, "localhost");
    EXPECT_EQ(u->port, 6379);
    EXPECT_EQ(u->db, 0);
    u = parse_redis_url("redis://:s3cret@10.0.0.5:6380/2", &why);
    ASSERT_TRUE(u) << why;
    EXPECT_EQ(u->host, "10.0.0.5");
    EXPECT_EQ(u->port, 6380);
    EXPECT_EQ(u->db, 2);
    EXPECT_EQ(u->user, "");
    EXPECT_EQ(u->password, "s3cret");
    EXPECT_EQ(u->redacted().find("s3cret"), std::string::npos);
    u = parse_redis_url("redis://alice:pw@redis.internal/1", &why);
    ASSERT_TRUE(u) << why;
    EXPECT_EQ(u->user, "alice");
    EXPECT_EQ(u->password, "pw");
    EXPECT_EQ(u->db, 1);
    u = parse_redis_url("unix:///run/redis/r.sock?db=3&password=x", &why);
    ASSERT_TRUE(u) << why;
    EXPECT_TRUE(u->unix_socket);
    EXPECT_EQ(u->path, "/run/redis/r.sock");
    EXPECT_EQ(u->db, 3);
    EXPECT_EQ(u->password, "x");
    EXPECT_FALSE(parse_redis_url("rediss://host", &why));
    EXPECT_NE(why.find("TLS"), std::string::npos);
    EXPECT_FALSE(parse_redis_url("http://host", &why));
    EXPECT_FALSE(parse_redis_url("redis://host:0", &why));
    EXPECT_FALSE(parse_redis_url("redis://host/x", &why));
    EXPECT_FALSE(parse_redis_url("unix://relative.sock", &why));
    RedisStoreOptions tls;
    tls.url = "rediss://h";
    EXPECT_FALSE(RedisStore::open(tls).store);
}

TEST_F(RedisStoreTest, AuthAndSelect) {
    ASSERT_EQ(cli({"CONFIG", "SET", "requirepass", "pw"}), "OK");
    RedisStoreOptions o;
    o.url = redis_.url() + "?db=2&password=pw";
    auto store = open(o);
    const NamespaceId ns = test_namespace();
    const PrefixPayload p = prefix_payload(ns, 40, 200);
    ASSERT_EQ(submit(*store, ns, p), RedisSubmit::Queued);
    store->flush();
    EXPECT_EQ(store->stats().writes, 1u);
    EXPECT_TRUE(store->read(ns, p.tokens).ok());
    RedisStoreOptions bad;
    bad.url = redis_.url() + "?password=wrong";
    auto other = open(bad);
    EXPECT_FALSE(other->up());
    EXPECT_FALSE(other->lookup(ns, p.tokens, p.tokens.size()));
}

}  // namespace
}  // namespace skippy::cache
