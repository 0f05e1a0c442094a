// ExactLogitsTest through the slower tiers (exact_logits_fixture.h): an entry restored from
// the disk tier, and from the shared Redis tier by another replica, gives the cold logits.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "exact_logits_fixture.h"

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

// A redis-server of the test's own on a unix socket in a temp folder (none: skip).
class TestRedis {
  public:
    explicit TestRedis(const std::string& name)
        : dir_(std::filesystem::temp_directory_path() /
               ("skippy-exact-redis-" + std::to_string(::getpid()) + "-" + name)) {
        std::filesystem::remove_all(dir_);
        std::filesystem::create_directories(dir_);
        sock_ = (dir_ / "r.sock").string();
        if (::access("/usr/bin/redis-server", X_OK) != 0) {
            return;
        }
        pid_ = ::fork();
        if (pid_ == 0) {
            const std::string log = (dir_ / "redis.log").string();
            if (std::freopen(log.c_str(), "a", stdout) != nullptr) {
                ::dup2(STDOUT_FILENO, STDERR_FILENO);
            }
            ::execl("/usr/bin/redis-server", "redis-server", "--port", "0", "--unixsocket",
                    sock_.c_str(), "--save", "", "--appendonly", "no", "--dir", dir_.c_str(),
                    static_cast<char*>(nullptr));
            ::_exit(127);
        }
        // Ready once a connection is accepted: the socket file appears at bind(), before
        // listen(), and a connect in between is refused.
        for (int i = 0; i < 1000 && !accepts(); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    ~TestRedis() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        std::filesystem::remove_all(dir_);
    }
    bool running() const { return pid_ > 0 && accepts(); }
    std::string url() const { return "unix://" + sock_; }

  private:
    bool accepts() const {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd < 0) {
            return false;
        }
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock_.c_str());
        const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
        ::close(fd);
        return ok;
    }

    std::filesystem::path dir_;
    std::string sock_;
    pid_t pid_ = -1;
};

TEST_P(ExactLogitsTest, ARestoreFromTheRedisTierGivesTheColdLogits) {
    // A replica records prompts to the shared Redis tier; another one (its own RAM, no disk)
    // restores them from Redis, with the cold logits.
    std::signal(SIGPIPE, SIG_IGN);  // as skippy serve
    TestRedis redis(arch_ + (GetParam().flash_attn ? "-fa" : "") + (GetParam().rpc ? "-rpc" : "") +
                    (GetParam().gpu ? "-gpu" : ""));
    if (!redis.running()) {
        GTEST_SKIP() << "redis-server is not installed";
    }
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
