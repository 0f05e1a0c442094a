// The fixture of ExactLogitsTest (exact_logits_test.cpp, exact_logits_tiers_test.cpp): one
// model per case served by two schedulers, the prefix cache off and on, and the helpers that
// run prompts on them and compare the logits every token is sampled from, bitwise.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "rpc_servers.h"
#include "runtime/model.h"
#include "server/schedule/scheduler.h"
#include "stage/prefix_cache_stage.h"
#include "test_models.h"

namespace skippy::server::exact_logits {

struct Result {
    std::vector<runtime::Token> tokens;
    std::vector<std::vector<float>> logits;  // per sampled token
    GenerationStats stats;
};

inline GenerationRequest request_for(const std::vector<runtime::Token>& prompt, int max_tokens,
                                     std::shared_ptr<Result> out) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.on_logits = [out](std::span<const float> logits) {
        out->logits.emplace_back(logits.begin(), logits.end());
    };
    return r;
}

inline Result wait_for(const std::shared_ptr<GenerationStream>& stream,
                       std::shared_ptr<Result> out) {
    for (;;) {
        auto event = stream->next(std::chrono::seconds(60));
        if (!event) {
            ADD_FAILURE() << "timeout";
            return *out;
        }
        if (event->kind == StreamEvent::Kind::Delta) {
            out->tokens.insert(out->tokens.end(), event->tokens.begin(), event->tokens.end());
        } else if (event->kind == StreamEvent::Kind::Done) {
            out->stats = event->stats;
            return *out;
        } else {
            ADD_FAILURE() << event->error_message;
            return *out;
        }
    }
}

inline Result run(Scheduler& scheduler, GenerationRequest request, std::shared_ptr<Result> out) {
    auto stream = std::make_shared<GenerationStream>();
    EXPECT_EQ(scheduler.submit(std::move(request), stream), Admission::Accepted);
    return wait_for(stream, std::move(out));
}

inline Result run(Scheduler& scheduler, const std::vector<runtime::Token>& prompt, int max_tokens) {
    auto out = std::make_shared<Result>();
    return run(scheduler, request_for(prompt, max_tokens, out), out);
}

// A chat request: the prompt with its message boundaries, and the end of its turn as the
// next request renders it (none: no end-of-turn work).
inline Result run_chat(
    Scheduler& scheduler, const std::vector<runtime::Token>& prompt, int max_tokens,
    const std::vector<int32_t>& boundaries,
    std::function<std::vector<runtime::Token>(const std::string&)> turn_end = {}) {
    auto out = std::make_shared<Result>();
    GenerationRequest request = request_for(prompt, max_tokens, out);
    request.message_boundaries = boundaries;
    request.render_turn_end = std::move(turn_end);
    return run(scheduler, std::move(request), out);
}

inline void wait_recorded(Scheduler& scheduler, stage::PrefixCacheStage& stage) {
    for (int i = 0;
         i < 5000 && (scheduler.stats().lanes_busy > 0 ||
                      scheduler.stats().turn_ends_deferred > 0 || stage.lanes_pending() > 0);
         ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stage.record_queue()->wait_idle();
}

inline bool same_bits(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b, size_t n) {
    if (a.size() < n || b.size() < n) {
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        if (a[i].size() != b[i].size() ||
            std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) {
            return false;
        }
    }
    return true;
}

struct Case {
    Case(std::string a, bool fa = false, bool on_rpc = false, bool on_gpu = false,
         std::string quantized = "")
        : arch(std::move(a)),
          flash_attn(fa),
          rpc(on_rpc),
          gpu(on_gpu),
          type(std::move(quantized)) {}
    std::string arch;
    bool flash_attn = false;
    bool rpc = false;  // every layer and the output on two rpc-servers (loopback)
    bool gpu = false;  // every layer and the output on the first GPU (a CUDA build)
    std::string type;  // quantized weights (make-model --type); "" = f32
};

inline SchedulerOptions options(bool flash_attn) {
    SchedulerOptions o;
    o.lanes = 2;
    o.context.n_ctx = 4096;
    o.context.n_threads = 1;
    o.context.n_batch = 128;  // several chunks per prompt
    o.context.flash_attn = flash_attn ? runtime::FlashAttn::On : runtime::FlashAttn::Off;
    return o;
}

inline stage::CacheConfig cache_config() {
    stage::CacheConfig c;
    c.min_tokens = 8;
    return c;
}

inline std::vector<runtime::Token> random_tokens(std::mt19937& rng, size_t n) {
    std::uniform_int_distribution<runtime::Token> dist(100, 20000);
    std::vector<runtime::Token> out(n);
    for (auto& t : out) {
        t = dist(rng);
    }
    return out;
}

// Prompts that share `head` random tokens, each with its own random rest (extra[i] tokens).
inline std::vector<std::vector<runtime::Token>> shared_head_prompts(
    std::mt19937& rng, size_t head, std::initializer_list<size_t> extra) {
    const auto shared = random_tokens(rng, head);
    std::vector<std::vector<runtime::Token>> prompts;
    for (const size_t n : extra) {
        auto p = shared;
        const auto rest = random_tokens(rng, n);
        p.insert(p.end(), rest.begin(), rest.end());
        prompts.push_back(p);
    }
    return prompts;
}

// Runs the prompts one after the other.
inline std::vector<Result> run_each(Scheduler& scheduler,
                                    const std::vector<std::vector<runtime::Token>>& prompts,
                                    int max_tokens) {
    std::vector<Result> out;
    for (const auto& p : prompts) {
        out.push_back(run(scheduler, p, max_tokens));
    }
    return out;
}

// Submits every prompt at once, then waits for each.
inline std::vector<Result> run_concurrently(Scheduler& scheduler,
                                            const std::vector<std::vector<runtime::Token>>& prompts,
                                            int max_tokens) {
    std::vector<std::shared_ptr<Result>> outs;
    std::vector<std::shared_ptr<GenerationStream>> streams;
    for (const auto& p : prompts) {
        outs.push_back(std::make_shared<Result>());
        streams.push_back(std::make_shared<GenerationStream>());
        EXPECT_EQ(scheduler.submit(request_for(p, max_tokens, outs.back()), streams.back()),
                  Admission::Accepted);
    }
    std::vector<Result> got;
    for (size_t i = 0; i < prompts.size(); ++i) {
        got.push_back(wait_for(streams[i], outs[i]));
    }
    return got;
}

class ExactLogitsTest : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override {
        arch_ = GetParam().arch;
        const SchedulerOptions o = options(GetParam().flash_attn);
        runtime::ModelLoadOptions load;
        if (GetParam().gpu) {
            // A CUDA build on a machine with a GPU (scripts/gpu-check); skipped elsewhere.
            std::string gpu;
            for (const auto& d : runtime::available_devices()) {
                if (gpu.empty() && d.kind != "RPC" && d.kind != "CPU") {
                    gpu = d.name;
                }
            }
            if (gpu.empty()) {
                GTEST_SKIP() << "no GPU device in this build";
            }
            load.n_gpu_layers = runtime::kGpuLayersAll;
            load.devices = {gpu};
        }
        if (GetParam().rpc) {
            const auto& rpc = skippy::testing::loopback_rpc_servers();
            ASSERT_TRUE(rpc.error.empty()) << rpc.error;
            load.n_gpu_layers = runtime::kGpuLayersAll;
            load.devices = rpc.devices;
            // 1:3 puts layer 0 on the first server and the rest with the output on the second
            // (llama.cpp's split of the 2 or 4 layers + output).
            load.tensor_split = {1, 3};
        }
        // As served: repacked and padded for the dense model, plain for the others (model.h).
        load.repack = runtime::ModelLoadOptions::Repack::Auto;
        model_ = runtime::Model::load(
            skippy::testing::tiny_model(arch_, "exact-logits", 9, GetParam().type), load);
        if (GetParam().rpc) {
            const auto& p = model_->placement();
            ASSERT_EQ(p.layers.front(), "RPC0") << p.map_text();
            ASSERT_EQ(p.layers.back(), "RPC1") << p.map_text();
            ASSERT_EQ(p.output, "RPC1") << p.map_text();
        }
        off_ = std::make_unique<Scheduler>(*model_, o, std::make_unique<stage::NoCacheStage>());
        auto stage = std::make_unique<stage::PrefixCacheStage>(cache_config(), *model_, o.context,
                                                               cache::PayloadKind::KvPages);
        stage_ = stage.get();
        on_ = std::make_unique<Scheduler>(*model_, o, std::move(stage));
        rule_ = stage_->rule();  // (the one rule, from the context the stage is attached to)
    }

    // These prompts have no message boundaries: the body end of plan.h's rule.
    int32_t body_end(size_t n) const { return rule_.body_end(static_cast<int32_t>(n), {}); }
    // What a cached `prefix`-token completion recorded (the end of its body, or without
    // flash attention its end minus the 2 tokens a restore leaves).
    int32_t recorded(size_t prefix) const {
        return rule_.restore_limit(body_end(prefix), static_cast<int32_t>(prefix));
    }
    // The second state a cached completion with a tail recorded: one body chunk before its
    // body end (0: none).
    int32_t before_body_end(size_t prefix) const {
        const int32_t b = body_end(prefix);
        const bool tail = rule_.has_tail() && b < static_cast<int32_t>(prefix);
        return tail && b - rule_.body_min >= rule_.body_min ? b - rule_.body_min : 0;
    }
    // Whether a prompt of `n` tokens that extends a cached `prefix`-token prompt must
    // restore something of it.
    bool can_hit(size_t prefix, size_t n) const {
        const auto len = static_cast<int32_t>(n);
        const auto min_tokens = static_cast<int32_t>(cache_config().min_tokens);
        if (arch_ != "llama") {
            // Recurrent state exists only where it was recorded: the body end, and with a
            // tail also one body chunk before it (a completion extended by a few tokens).
            const auto ok = [&](int32_t r) {
                return r >= min_tokens && rule_.can_restore(r, body_end(n), len);
            };
            return ok(recorded(prefix)) ||
                   (before_body_end(prefix) > 0 && ok(before_body_end(prefix)));
        }
        return rule_.best_restore(recorded(prefix), body_end(n), len) >= min_tokens;
    }

    // Runs `prompt` on both servers; the logits of every sampled token must be bit-identical.
    Result check(const std::vector<runtime::Token>& prompt, const std::string& what, int n = 4) {
        const Result ref = run(*off_, prompt, n);
        const Result got = run(*on_, prompt, n);
        EXPECT_EQ(got.tokens, ref.tokens) << what;
        EXPECT_TRUE(same_bits(got.logits, ref.logits, static_cast<size_t>(n)))
            << what << ": logits differ (cached " << got.stats.cached_tokens << ")";
        wait_recorded(*on_, *stage_);
        EXPECT_EQ(stage_->queued_bytes(), 0u) << "captured bytes still charged to the queue";
        return got;
    }

    // Once the records are in, `prompt` on a lane that holds nothing restores exactly its
    // first `head` tokens from the store (dense: any prefix of an entry, so at least the
    // head minus the body minimum), with the cold logits.
    void expect_restores_head(const std::vector<runtime::Token>& prompt, int32_t head) {
        wait_recorded(*on_, *stage_);
        stage_->debug_forget_lanes();
        const Result r = check(prompt, "prompt with the shared head");
        if (arch_ != "llama") {
            EXPECT_EQ(r.stats.cached_tokens, head);
        } else {
            EXPECT_GE(r.stats.cached_tokens, head - rule_.body_min);
        }
    }

    std::string arch_;
    stage::ExactRule rule_;
    std::unique_ptr<runtime::Model> model_;
    std::unique_ptr<Scheduler> off_;
    std::unique_ptr<Scheduler> on_;
    stage::PrefixCacheStage* stage_ = nullptr;
};

}  // namespace skippy::server::exact_logits
