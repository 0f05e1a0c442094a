// The scheduler with the real prefix-cache stage on generated models: corrupted stored
// bytes are quarantined and the request still returns exactly the uncached tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>

#include "cache/prefix_identity.h"
#include "runtime/factory/model_factory.h"
#include "runtime/model.h"
#include "server/schedule/scheduler.h"
#include "stage/prefix_cache_stage.h"
#include "test_models.h"

namespace skippy::server {
namespace {

std::string model_for(const std::string& arch) {
    return skippy::testing::tiny_model(arch, "cache-integration-test", 5);
}

struct Output {
    std::vector<runtime::Token> tokens;
    GenerationStats stats;
};

Output run(Scheduler& scheduler, const std::vector<runtime::Token>& prompt, int max_tokens) {
    GenerationRequest request;
    request.prompt = prompt;
    request.max_tokens = max_tokens;
    request.sampling.temperature = 0;
    request.ignore_eos = true;
    auto stream = std::make_shared<GenerationStream>();
    EXPECT_EQ(scheduler.submit(request, stream), Admission::Accepted);
    Output out;
    for (;;) {
        auto event = stream->next(std::chrono::seconds(60));
        if (!event) {
            ADD_FAILURE() << "timeout";
            return out;
        }
        if (event->kind == StreamEvent::Kind::Delta) {
            out.tokens.insert(out.tokens.end(), event->tokens.begin(), event->tokens.end());
        } else if (event->kind == StreamEvent::Kind::Done) {
            out.stats = event->stats;
            return out;
        } else {
            ADD_FAILURE() << event->error_message;
            return out;
        }
    }
}

// The scheduler hands a lane's records to the queue when it releases the lane (after the
// reply): wait for that, then for the record worker.
void wait_recorded(Scheduler& scheduler, stage::PrefixCacheStage& stage) {
    for (int i = 0;
         i < 2000 && (scheduler.stats().lanes_busy > 0 ||
                      scheduler.stats().turn_ends_deferred > 0 || stage.lanes_pending() > 0);
         ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stage.record_queue()->wait_idle();
}

SchedulerOptions options() {
    SchedulerOptions o;
    o.lanes = 2;
    o.context.n_ctx = 1024;
    o.context.n_threads = 1;
    o.context.n_batch = 256;
    return o;
}

stage::CacheConfig cache_config() {
    stage::CacheConfig c;
    c.min_tokens = 16;
    c.record_limit = 6;
    return c;
}

class CacheIntegrationTest : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        model_ = runtime::Model::load(model_for(GetParam()));
        std::mt19937 rng(7);
        std::uniform_int_distribution<runtime::Token> dist(100, 20000);
        for (int i = 0; i < 150; ++i) {
            prompt_.push_back(dist(rng));
        }
        Scheduler uncached(*model_, options(), std::make_unique<stage::NoCacheStage>());
        reference_ = run(uncached, prompt_, 8).tokens;
        ASSERT_EQ(reference_.size(), 8u);
    }

    std::unique_ptr<Scheduler> cached(stage::PrefixCacheStage** stage_out) {
        const auto payload = cache::PayloadKind::KvPages;
        auto stage = std::make_unique<stage::PrefixCacheStage>(cache_config(), *model_,
                                                               options().context, payload);
        *stage_out = stage.get();
        return std::make_unique<Scheduler>(*model_, options(), std::move(stage));
    }

    std::unique_ptr<runtime::Model> model_;
    std::vector<runtime::Token> prompt_;
    std::vector<runtime::Token> reference_;
};

TEST_P(CacheIntegrationTest, WarmRunIsIdenticalAndRestoresMostOfThePrompt) {
    stage::PrefixCacheStage* stage = nullptr;
    auto scheduler = cached(&stage);
    EXPECT_EQ(run(*scheduler, prompt_, 8).tokens, reference_);
    wait_recorded(*scheduler, *stage);
    const Output warm = run(*scheduler, prompt_, 8);
    EXPECT_EQ(warm.tokens, reference_);
    EXPECT_EQ(warm.stats.cache_decision, "exact_hit");
    EXPECT_NE(warm.stats.cache_tier, "none");  // lane or ram: the turn just recorded
    EXPECT_NE(warm.stats.cache_tier, "disk");
    EXPECT_GE(warm.stats.cached_tokens, 128);
}

TEST_P(CacheIntegrationTest, CorruptedEntryIsQuarantinedAndOutputStaysExact) {
    stage::PrefixCacheStage* stage = nullptr;
    auto scheduler = cached(&stage);
    EXPECT_EQ(run(*scheduler, prompt_, 8).tokens, reference_);
    wait_recorded(*scheduler, *stage);

    stage->debug_forget_lanes();  // restore from the stored entry, not the lane
    auto* exact = stage->exact_cache();
    const auto ns = stage->namespace_for("");
    const std::span<const runtime::Token> query(prompt_.data(), prompt_.size() - 1);
    const auto before = exact->peek_longest(ns, query);
    ASSERT_TRUE(before.has_value());
    const auto key = query.first(before->len);
    ASSERT_TRUE(exact->debug_corrupt(ns, key, before->payload_bytes / 2));
    const auto quarantined_before = exact->stats().quarantined;
    // Stop recording so the fallback prefill cannot store the same page again.
    stage->record_queue()->stop(false);

    const Output after = run(*scheduler, prompt_, 8);
    EXPECT_EQ(after.tokens, reference_);
    EXPECT_FALSE(exact->contains(ns, key, before->page)) << "corrupted entry still stored";
    EXPECT_EQ(exact->stats().quarantined, quarantined_before + 1);
    EXPECT_NE(stage->metrics_text().find("skippy_cache_quarantined_total 1"), std::string::npos);
    EXPECT_FALSE(exact->debug_check().has_value()) << *exact->debug_check();
}

TEST_P(CacheIntegrationTest, RandomByteFlipsAcrossEntriesNeverChangeOutputs) {
    stage::PrefixCacheStage* stage = nullptr;
    auto scheduler = cached(&stage);
    // Several prompts sharing prefixes, recorded at several ladder rungs each.
    std::vector<std::vector<runtime::Token>> prompts;
    std::vector<std::vector<runtime::Token>> expected;
    {
        Scheduler uncached(*model_, options(), std::make_unique<stage::NoCacheStage>());
        for (int variant = 0; variant < 4; ++variant) {
            auto p = prompt_;
            p.resize(96 + 16 * static_cast<size_t>(variant));
            p.push_back(300 + variant);
            prompts.push_back(p);
            expected.push_back(run(uncached, p, 6).tokens);
        }
    }
    for (const auto& p : prompts) {
        run(*scheduler, p, 6);
    }
    wait_recorded(*scheduler, *stage);
    stage->debug_forget_lanes();  // restore from the stored entry, not the lane
    auto* exact = stage->exact_cache();
    const auto ns = stage->namespace_for("");
    std::mt19937 rng(99);
    size_t corrupted = 0;
    for (const auto& p : prompts) {
        for (size_t len = 16; len < p.size(); ++len) {
            const std::span<const runtime::Token> key(p.data(), len);
            const auto entry = exact->peek_longest(ns, key);
            if (entry && entry->len == len) {
                std::uniform_int_distribution<size_t> offset(0, entry->payload_bytes - 1);
                corrupted += exact->debug_corrupt(ns, key, offset(rng)) ? 1 : 0;
            }
        }
    }
    // Dense lanes keep one entry, the longest (it serves every prefix of itself); the
    // others one per checkpoint.
    EXPECT_GE(corrupted, std::string(GetParam()) == "llama" ? 1u : 4u);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(run(*scheduler, prompts[i], 6).tokens, expected[i]) << "prompt " << i;
    }
    wait_recorded(*scheduler, *stage);
    EXPECT_FALSE(exact->debug_check().has_value());
    EXPECT_GT(exact->stats().quarantined, 0u);
}

INSTANTIATE_TEST_SUITE_P(Models, CacheIntegrationTest,
                         ::testing::Values("qwen35", "mamba2", "llama"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace skippy::server
