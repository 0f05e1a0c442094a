// ExactLogitsTest through the slower tiers (exact_logits_fixture.h): an entry restored from
// the disk tier, and from the shared Redis tier by another replica, gives the cold logits.
#include <unistd.h>

#include <csignal>

#include "exact_logits_fixture.h"
#include "redis_server.h"

namespace skippy::server::exact_logits {
namespace {

TEST_P(ExactLogitsTest, ARestoreFromTheDiskTierGivesTheColdLogits) {
    // A stage records prompts to its disk tier and goes away; a new stage on the same folder
    // (a restarted server) restores them from disk, with the cold logits.
    const auto dir = std::filesystem::temp_directory_path() /
                     ("skippy-exact-disk-" + std::to_string(::getpid()) + "-" + arch_ +
                      (GetParam().flash_attn ? "-fa" : "") + (GetParam().rpc ? "-rpc" : ""));
    std::filesystem::remove_all(dir);
    stage::CacheConfig c = cache_config();
    c.disk = true;
    c.disk_dir = dir.string();
    const SchedulerOptions o = options(GetParam().flash_attn);
    std::mt19937 rng(71);
    const auto first = random_tokens(rng, 300);
    auto second = first;
    const auto extra = random_tokens(rng, 5);
    second.insert(second.end(), extra.begin(), extra.end());
    {
        auto stage = std::make_unique<stage::PrefixCacheStage>(c, *model_, o.context,
                                                               cache::PayloadKind::KvPages);
        stage::PrefixCacheStage* raw = stage.get();
        Scheduler scheduler(*model_, o, std::move(stage));
        run(scheduler, first, 2);
        wait_recorded(scheduler, *raw);
    }  // the stage drains its record queue and its disk writer
    {
        auto stage = std::make_unique<stage::PrefixCacheStage>(c, *model_, o.context,
                                                               cache::PayloadKind::KvPages);
        Scheduler scheduler(*model_, o, std::move(stage));
        const Result ref = run(*off_, second, 4);
        const Result got = run(scheduler, second, 4);
        EXPECT_EQ(got.tokens, ref.tokens);
        EXPECT_TRUE(same_bits(got.logits, ref.logits, 4))
            << "logits differ (cached " << got.stats.cached_tokens << ")";
        if (can_hit(first.size(), second.size())) {
            EXPECT_GT(got.stats.cached_tokens, 0);
            EXPECT_EQ(got.stats.cache_tier, "disk");
        }
        std::printf("[exact] %s: restored %d of %zu tokens from %s\n", arch_.c_str(),
                    got.stats.cached_tokens, second.size(), got.stats.cache_tier.c_str());
    }
    std::filesystem::remove_all(dir);
}

TEST_P(ExactLogitsTest, ARestoreFromTheRedisTierGivesTheColdLogits) {
    // A replica records prompts to the shared Redis tier; another one (its own RAM, no disk)
    // restores them from Redis, with the cold logits.
    std::signal(SIGPIPE, SIG_IGN);  // as skippy serve
    if (!skippy::testing::RedisServer::installed()) {
        GTEST_SKIP() << "redis-server is not installed";
    }
    skippy::testing::RedisServer redis;
    ASSERT_TRUE(redis.start()) << redis.error();
    stage::CacheConfig c = cache_config();
    c.disk = false;
    c.redis_url = redis.url();
    c.redis_timeout_ms = 2000;  // (a loaded test machine)
    const SchedulerOptions o = options(GetParam().flash_attn);
    std::mt19937 rng(73);
    const auto first = random_tokens(rng, 300);
    auto second = first;
    const auto extra = random_tokens(rng, 5);
    second.insert(second.end(), extra.begin(), extra.end());
    {
        auto stage = std::make_unique<stage::PrefixCacheStage>(c, *model_, o.context,
                                                               cache::PayloadKind::KvPages);
        stage::PrefixCacheStage* raw = stage.get();
        ASSERT_TRUE(raw->redis_store() != nullptr) << raw->redis_note();
        Scheduler scheduler(*model_, o, std::move(stage));
        run(scheduler, first, 2);
        wait_recorded(scheduler, *raw);
        raw->redis_store()->flush();
        EXPECT_GT(raw->redis_store()->stats().writes, 0u);
    }
    auto stage = std::make_unique<stage::PrefixCacheStage>(c, *model_, o.context,
                                                           cache::PayloadKind::KvPages);
    stage::PrefixCacheStage* raw = stage.get();
    Scheduler scheduler(*model_, o, std::move(stage));
    const Result ref = run(*off_, second, 4);
    const Result got = run(scheduler, second, 4);
    EXPECT_EQ(got.tokens, ref.tokens);
    EXPECT_TRUE(same_bits(got.logits, ref.logits, 4))
        << "logits differ (cached " << got.stats.cached_tokens << ")";
    if (can_hit(first.size(), second.size())) {
        EXPECT_GT(got.stats.cached_tokens, 0);
        EXPECT_EQ(got.stats.cache_tier, "redis");
        EXPECT_GT(raw->redis_store()->stats().reads, 0u);
    }
    std::printf("[exact] %s: restored %d of %zu tokens from %s\n", arch_.c_str(),
                got.stats.cached_tokens, second.size(), got.stats.cache_tier.c_str());
}

}  // namespace
}  // namespace skippy::server::exact_logits
