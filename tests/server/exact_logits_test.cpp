// Exactness, checked bitwise: the logits every token is sampled from are identical with the
// prefix cache on and off, for dense, hybrid and recurrent models, at several prefix lengths
// and through every restore path (the lane itself, a stored entry imported in full, the
// lane's KV plus a stored recurrent checkpoint, the end of a chat turn, the disk tier, the
// shared Redis tier).
// The Rpc/ instances run the same with the model split over two rpc-servers on loopback
// (llama.cpp's RPC backend): every layer's KV and recurrent state lives in the servers'
// buffers, and the cache exports and imports it from there (label rpc).
#include "exact_logits_fixture.h"

namespace skippy::server::exact_logits {
namespace {

TEST_P(ExactLogitsTest, EveryRestorePathGivesTheColdLogits) {
    std::mt19937 rng(17);
    const auto base = random_tokens(rng, 400);
    for (size_t len : {40u, 129u, 300u}) {
        SCOPED_TRACE("prefix " + std::to_string(len));
        std::vector<runtime::Token> prefix(base.begin(), base.begin() + static_cast<long>(len));
        check(prefix, "cold");
        // Same prefix, a different tail of several lengths: restored from the lane itself.
        for (size_t tail : {1u, 2u, 37u}) {
            auto prompt = prefix;
            const auto extra = random_tokens(rng, tail);
            prompt.insert(prompt.end(), extra.begin(), extra.end());
            const Result r = check(prompt, "lane hit, tail " + std::to_string(tail));
            std::printf("[exact] %s len %zu tail %zu cached %d\n", arch_.c_str(), len, tail,
                        r.stats.cached_tokens);
            if (can_hit(len, prompt.size())) {
                EXPECT_GT(r.stats.cached_tokens, 0) << "tail " << tail;
            }
        }
        // From the stored entries only (the lanes forget what they hold).
        stage_->debug_forget_lanes();
        auto prompt = prefix;
        const auto extra = random_tokens(rng, 5);
        prompt.insert(prompt.end(), extra.begin(), extra.end());
        const Result r = check(prompt, "stored entry");
        if (can_hit(len, prompt.size())) {
            EXPECT_GT(r.stats.cached_tokens, 0);
        }
    }
}

TEST_P(ExactLogitsTest, StoredEntryServesASharedPrefix) {
    // A prompt that diverges from a stored one inside it: dense entries serve the common
    // prefix (imported, then trimmed); hybrid/recurrent ones only where state was recorded.
    std::mt19937 rng(41);
    const auto base = random_tokens(rng, 260);
    check(base, "cold");
    for (size_t common : {60u, 131u, 200u}) {
        SCOPED_TRACE("common prefix " + std::to_string(common));
        stage_->debug_forget_lanes();
        std::vector<runtime::Token> prompt(base.begin(), base.begin() + static_cast<long>(common));
        const auto extra = random_tokens(rng, 23);
        prompt.insert(prompt.end(), extra.begin(), extra.end());
        const Result r = check(prompt, "diverging prompt");
        if (arch_ == "llama") {
            const auto n = static_cast<int32_t>(prompt.size());
            EXPECT_EQ(r.stats.cached_tokens,
                      rule_.best_restore(std::min(static_cast<int32_t>(common), recorded(260)),
                                         body_end(prompt.size()), n));
        }
    }
}

TEST_P(ExactLogitsTest, ACompletionExtendedByAFewTokensRestoresFromTheStore) {
    // The next request of a completion client appends fewer tokens than a body chunk: it
    // restores the body end of the cached prompt, or with flash attention one body chunk
    // before it (a rest shorter than that would need other kernels than the cold prefill).
    std::mt19937 rng(53);
    for (size_t len : {200u, 333u}) {
        SCOPED_TRACE("prefix " + std::to_string(len));
        const auto prefix = random_tokens(rng, len);
        check(prefix, "cold");
        stage_->debug_forget_lanes();
        auto prompt = prefix;
        const auto extra = random_tokens(rng, 29);
        prompt.insert(prompt.end(), extra.begin(), extra.end());
        const Result r = check(prompt, "extended by 29 tokens");
        const auto n = static_cast<int32_t>(prompt.size());
        const int32_t b = body_end(prompt.size());
        if (rule_.can_restore(recorded(len), b, n)) {
            EXPECT_EQ(r.stats.cached_tokens, recorded(len));  // (no flash attention)
        } else if (arch_ == "llama") {
            EXPECT_EQ(r.stats.cached_tokens, rule_.best_restore(recorded(len), b, n));
        } else {
            // The last prefill chunk end at least a body chunk before the body end.
            EXPECT_GT(r.stats.cached_tokens, 0);
            EXPECT_LE(r.stats.cached_tokens, before_body_end(len));
            EXPECT_GT(r.stats.cached_tokens, before_body_end(len) - options(true).context.n_batch);
        }
    }
}

TEST_P(ExactLogitsTest, ChatTurnEndsAreExact) {
    // A chat whose next request renders prompt + reply + a new message: the end of the
    // turn is prefilled canonically and the next turn restores all of it. The requests
    // carry their message boundaries, so plan.h's chat rule applies (with flash attention:
    // a short last message is the tail; a long one makes the prompt all body).
    std::mt19937 rng(23);
    std::vector<runtime::Token> history = random_tokens(rng, 90);
    std::vector<int32_t> boundaries = {90};
    const std::vector<runtime::Token> sep = {7, 8, 9};
    const size_t message_sizes[] = {20, 9, 41, 70, 27};
    for (int turn = 0; turn < 5; ++turn) {
        SCOPED_TRACE("turn " + std::to_string(turn));
        auto msg = random_tokens(rng, message_sizes[turn]);
        std::vector<runtime::Token> prompt = history;
        prompt.insert(prompt.end(), msg.begin(), msg.end());
        const auto n = static_cast<int32_t>(prompt.size());
        const int32_t b = rule_.body_end(n, boundaries);
        const int max_tokens = 6;
        const Result ref = run_chat(*off_, prompt, max_tokens, boundaries);
        std::vector<runtime::Token> reply_tokens = ref.tokens;
        const Result got = run_chat(
            *on_, prompt, max_tokens, boundaries, [prompt, sep, reply_tokens](const std::string&) {
                std::vector<runtime::Token> turn_tokens = prompt;
                turn_tokens.insert(turn_tokens.end(), reply_tokens.begin(), reply_tokens.end());
                turn_tokens.insert(turn_tokens.end(), sep.begin(), sep.end());
                return turn_tokens;
            });
        EXPECT_EQ(got.tokens, ref.tokens);
        EXPECT_TRUE(same_bits(got.logits, ref.logits, max_tokens))
            << "cached " << got.stats.cached_tokens << ", body end " << b << " of " << n;
        std::printf("[exact] %s chat turn %d: prompt %d body end %d cached %d\n", arch_.c_str(),
                    turn, n, b, got.stats.cached_tokens);
        if (turn > 0 && (arch_ == "llama" || rule_.has_tail())) {
            // The lane holds the whole turn end in the body regime (hybrid: with a
            // checkpoint at its end): it restores as much of it as the rule lets this
            // prompt take.
            EXPECT_EQ(got.stats.cached_tokens,
                      rule_.best_restore(static_cast<int32_t>(history.size()), b, n));
        } else if (turn > 0) {
            // Everything but the new message (and the 2 tokens a restore leaves) is restored.
            EXPECT_GE(got.stats.cached_tokens, static_cast<int32_t>(history.size()) - 2);
        }
        wait_recorded(*on_, *stage_);
        history = prompt;
        history.insert(history.end(), ref.tokens.begin(), ref.tokens.end());
        history.insert(history.end(), sep.begin(), sep.end());
        boundaries.push_back(static_cast<int32_t>(history.size()));
    }
}

TEST_P(ExactLogitsTest, AShortMessageAfterALongTurnEndRestoresTheTurnEnd) {
    // A turn whose end the client renders long (a long reply), then a short message (< 64
    // tokens, as people answer). With flash attention that message is the prompt's tail
    // (plan.h) for a model with recurrent state: restored at the turn end, prefilled row by
    // row. A dense model's tail is at most 16 tokens, so it computes these 20 in a body
    // chunk from a body chunk before its end (any position: the KV pages hold them all).
    std::mt19937 rng(43);
    const std::vector<runtime::Token> prompt = random_tokens(rng, 300);
    const std::vector<int32_t> boundaries = {120, 200};
    const std::vector<runtime::Token> rest_of_reply = random_tokens(rng, 150);
    const int max_tokens = 4;
    const Result ref = run_chat(*off_, prompt, max_tokens, boundaries);
    std::vector<runtime::Token> history = prompt;
    history.insert(history.end(), ref.tokens.begin(), ref.tokens.end());
    history.insert(history.end(), rest_of_reply.begin(), rest_of_reply.end());
    const Result got = run_chat(*on_, prompt, max_tokens, boundaries,
                                [history](const std::string&) { return history; });
    EXPECT_TRUE(same_bits(got.logits, ref.logits, max_tokens));
    wait_recorded(*on_, *stage_);

    const auto a = static_cast<int32_t>(history.size());
    std::vector<runtime::Token> next = history;
    const auto message = random_tokens(rng, 20);
    next.insert(next.end(), message.begin(), message.end());
    const std::vector<int32_t> next_bounds = {120, 200, 300, a};
    const Result ref2 = run_chat(*off_, next, max_tokens, next_bounds);
    const Result got2 = run_chat(*on_, next, max_tokens, next_bounds);
    EXPECT_EQ(got2.tokens, ref2.tokens);
    EXPECT_TRUE(same_bits(got2.logits, ref2.logits, max_tokens))
        << "cached " << got2.stats.cached_tokens;
    const auto n = static_cast<int32_t>(next.size());
    const int32_t expected =
        arch_ == "llama" ? rule_.best_restore(a, rule_.body_end(n, next_bounds), n) : a;
    EXPECT_EQ(got2.stats.cached_tokens, expected) << "turn end " << a << ", prompt " << n;
}

TEST_P(ExactLogitsTest, ConcurrentRequestsKeepPrefillLogitsExact) {
    // Prefill chunks run one lane per llama_decode, so the first token's logits are exact
    // under concurrency; decode steps of several lanes share one batch (other kernels), so
    // later tokens are compared against a run with the same concurrency instead.
    std::mt19937 rng(31);
    const auto prompts = shared_head_prompts(rng, 150, {10, 11});
    const std::vector<Result> solo = run_each(*off_, prompts, 4);
    run(*on_, std::vector<runtime::Token>(prompts[0].begin(), prompts[0].begin() + 150), 1);
    wait_recorded(*on_, *stage_);
    const std::vector<Result> got = run_concurrently(*on_, prompts, 4);
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_TRUE(same_bits(got[i].logits, solo[i].logits, 1)) << "request " << i;
        const bool all = same_bits(got[i].logits, solo[i].logits, 4);
        std::printf("[exact] %s concurrent request %zu: first token exact, later tokens %s\n",
                    arch_.c_str(), i, all ? "exact too" : "differ (batched decode steps)");
    }
}

TEST_P(ExactLogitsTest, ConcurrentRequestsWithASharedHeadPrefillItOnce) {
    // Nothing cached: the second request waits while the first prefills the shared head,
    // then copies it from the first one's lane (hybrid/recurrent models: the first lane
    // pauses where the second copies its state), and both first tokens have the cold
    // logits. With a 450-token head the first lane's chunk [384, 512) is split for the pause
    // (at 448 with flash attention: both halves at least 64 rows).
    struct Shape {
        size_t head;
        std::initializer_list<size_t> rest;
    };
    std::mt19937 rng(47);
    for (const Shape& shape : {Shape{400, {70, 100}}, Shape{450, {300, 320}}}) {
        const auto head = static_cast<int32_t>(shape.head);
        const auto prompts = shared_head_prompts(rng, shape.head, shape.rest);
        const std::vector<Result> solo = run_each(*off_, prompts, 2);
        const std::vector<Result> got = run_concurrently(*on_, prompts, 2);
        for (size_t i = 0; i < prompts.size(); ++i) {
            EXPECT_TRUE(same_bits(got[i].logits, solo[i].logits, 1))
                << "head " << head << ", request " << i;
        }
        const int32_t copied = std::max(got[0].stats.cached_tokens, got[1].stats.cached_tokens);
        // Dense: the second request waits until the first is within 64 tokens of the shared
        // head's end, then copies what it has. Hybrid/recurrent: the first pauses at the
        // longest point of the head where the chunks around it stay exact (the rule's limits
        // are far below).
        EXPECT_GE(copied, head - 64) << "head " << head;
        EXPECT_LE(copied, head);
        std::printf("[exact] %s: shared head of %d tokens, %d copied from the peer lane\n",
                    arch_.c_str(), head, copied);
        wait_recorded(*on_, *stage_);
    }
}

TEST_P(ExactLogitsTest, AHeadSharedByConcurrentRequestsIsRecordedForTheNextOne) {
    // Two requests run at once with a 200-token head in common and nothing cached: the
    // second records the state at the end of that head (hybrid/recurrent models restore
    // only where state was recorded), so a third prompt with the same head, on a lane that
    // holds nothing, restores exactly the head, with the cold logits.
    std::mt19937 rng(59);
    const auto prompts = shared_head_prompts(rng, 200, {100, 120, 90});
    run_concurrently(*on_, {prompts[0], prompts[1]}, 2);
    expect_restores_head(prompts[2], 200);
}

TEST_P(ExactLogitsTest, AHeadSharedByConsecutiveRequestsIsRecordedForTheNextOne) {
    // The same as above, one request after the other, with an unrelated prompt on the
    // other lane in between: the second runs on the first one's lane (its state, or the
    // least recently used lane), where no other lane holds the head, and still records
    // the head it shares with what that lane held. (Under load the concurrent case above
    // can run this way too: the first request ends before the second is admitted.)
    std::mt19937 rng(61);
    const auto prompts = shared_head_prompts(rng, 200, {100, 120, 90});
    run(*on_, prompts[0], 2);
    run(*on_, random_tokens(rng, 150), 2);
    run(*on_, prompts[1], 2);
    expect_restores_head(prompts[2], 200);
}

TEST_P(ExactLogitsTest, AChatTurnWhoseEndNeverRanRestoresThePreviousPrompt) {
    // One lane, two conversations taking turns at once: the end of X's first turn never
    // runs (Y takes the lane first), so X's second turn restores X's first prompt (its body
    // end) from the store, and prefills the reply with the new message.
    SchedulerOptions o = options(GetParam().flash_attn);
    o.lanes = 1;
    auto stage = std::make_unique<stage::PrefixCacheStage>(cache_config(), *model_, o.context,
                                                           cache::PayloadKind::KvPages);
    stage::PrefixCacheStage* one_stage = stage.get();
    Scheduler one(*model_, o, std::move(stage));
    std::mt19937 rng(59);
    const auto system = random_tokens(rng, 100);
    const std::vector<runtime::Token> sep = {7, 8, 9};
    // Submits a chat turn; the returned function waits for its result.
    auto start_chat = [&](const std::vector<runtime::Token>& prompt,
                          std::vector<int32_t> boundaries, Scheduler& scheduler, bool turn_end) {
        auto out = std::make_shared<Result>();
        GenerationRequest req = request_for(prompt, 4, out);
        req.message_boundaries = std::move(boundaries);
        if (turn_end) {
            // The reply as the scheduler thread sampled it (out->tokens is the client's copy,
            // written by this thread while the turn end may already run).
            auto reply = std::make_shared<std::vector<runtime::Token>>();
            req.on_sampled = [reply](runtime::Token token) { reply->push_back(token); };
            req.render_turn_end = [prompt, sep, reply](const std::string&) {
                std::vector<runtime::Token> t = prompt;
                t.insert(t.end(), reply->begin(), reply->end());
                t.insert(t.end(), sep.begin(), sep.end());
                return t;
            };
        }
        auto stream = std::make_shared<GenerationStream>();
        EXPECT_EQ(scheduler.submit(std::move(req), stream), Admission::Accepted);
        return [stream, out] { return wait_for(stream, out); };
    };
    auto chat = [&](const std::vector<runtime::Token>& prompt, std::vector<int32_t> boundaries,
                    Scheduler& scheduler, bool turn_end) {
        return start_chat(prompt, std::move(boundaries), scheduler, turn_end)();
    };
    std::vector<runtime::Token> x1 = system;
    std::vector<runtime::Token> y1 = system;
    for (auto* p : {&x1, &y1}) {
        const auto msg = random_tokens(rng, 80);
        p->insert(p->end(), msg.begin(), msg.end());
    }
    // Y waits for the lane while X's first turn runs, so it takes the lane before X's turn
    // end can start (that starts only once the scheduler has been idle for a while).
    auto x1_done = start_chat(x1, {100}, one, true);
    auto y1_done = start_chat(y1, {100}, one, true);
    const Result x1_out = x1_done();
    y1_done();
    // X's body end was exported when Y took the lane; its insert is the record worker's.
    one_stage->record_queue()->wait_idle();
    std::vector<runtime::Token> x2 = x1;
    x2.insert(x2.end(), x1_out.tokens.begin(), x1_out.tokens.end());
    x2.insert(x2.end(), sep.begin(), sep.end());
    const auto x2_reply_end = static_cast<int32_t>(x2.size());
    const auto msg = random_tokens(rng, 80);
    x2.insert(x2.end(), msg.begin(), msg.end());
    const std::vector<int32_t> x2_bounds = {100, 180, x2_reply_end};
    const Result ref = chat(x2, x2_bounds, *off_, false);
    const Result got = chat(x2, x2_bounds, one, true);
    EXPECT_TRUE(same_bits(got.logits, ref.logits, 4))
        << "logits differ (cached " << got.stats.cached_tokens << ")";
    const int32_t x1_body =
        rule_.body_end(static_cast<int32_t>(x1.size()), std::vector<int32_t>{100});
    const auto n2 = static_cast<int32_t>(x2.size());
    if (arch_ == "llama") {
        EXPECT_EQ(got.stats.cached_tokens,
                  rule_.best_restore(x1_body, rule_.body_end(n2, x2_bounds), n2));
    }
    std::printf("[exact] %s: second turn after an abandoned turn end restored %d of %d\n",
                arch_.c_str(), got.stats.cached_tokens, n2);
}

TEST_P(ExactLogitsTest, ALaneRestoredFromTheStoreKeepsNoCheckpointOfItsPreviousPrompt) {
    // One lane: A, then B (another prompt after the same short head), then A again, restored
    // from the store into the lane that held B, then C, a prompt inside A's: C must not
    // restore a recurrent checkpoint the lane took for B.
    SchedulerOptions o = options(GetParam().flash_attn);
    o.lanes = 1;
    auto stage = std::make_unique<stage::PrefixCacheStage>(cache_config(), *model_, o.context,
                                                           cache::PayloadKind::KvPages);
    stage::PrefixCacheStage* one_stage = stage.get();
    Scheduler one(*model_, o, std::move(stage));
    std::mt19937 rng(53);
    const auto head = random_tokens(rng, 20);
    auto a = head;
    auto b = head;
    const auto a_rest = random_tokens(rng, 380);
    const auto b_rest = random_tokens(rng, 380);
    a.insert(a.end(), a_rest.begin(), a_rest.end());
    b.insert(b.end(), b_rest.begin(), b_rest.end());
    auto c = std::vector<runtime::Token>(a.begin(), a.begin() + 360);
    const auto c_rest = random_tokens(rng, 40);
    c.insert(c.end(), c_rest.begin(), c_rest.end());
    for (const auto* p : {&a, &b, &a}) {
        run(one, *p, 2);
        wait_recorded(one, *one_stage);
    }
    const Result ref = run(*off_, c, 3);
    const Result got = run(one, c, 3);
    EXPECT_TRUE(same_bits(got.logits, ref.logits, 3))
        << "logits differ (cached " << got.stats.cached_tokens << ")";
    std::printf("[exact] %s: C restored %d tokens (%s)\n", arch_.c_str(), got.stats.cached_tokens,
                got.stats.cache_tier.c_str());
    wait_recorded(one, *one_stage);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
    return info.param.arch + (info.param.type.empty() ? "" : "_" + info.param.type) +
           (info.param.flash_attn ? "_fa_on" : "") + (info.param.rpc ? "_rpc" : "") +
           (info.param.gpu ? "_gpu" : "");
}

INSTANTIATE_TEST_SUITE_P(Families, ExactLogitsTest,
                         ::testing::Values(Case{"llama", false}, Case{"qwen35", false},
                                           Case{"mamba2", false}, Case{"llama", true},
                                           Case{"qwen35", true}, Case{"mamba2", true}),
                         case_name);

// Quantized weights as people run them (make-model --type): the dense model at Q4_K_M with and
// without flash attention, the hybrid and recurrent ones at Q8_0.
INSTANTIATE_TEST_SUITE_P(Quantized, ExactLogitsTest,
                         ::testing::Values(Case{"llama", true, false, false, "q4_k_m"},
                                           Case{"llama", false, false, false, "q4_k_m"},
                                           Case{"qwen35", true, false, false, "q8_0"},
                                           Case{"mamba2", false, false, false, "q8_0"}),
                         case_name);

// The three families split over two rpc-servers: flash attention as served by default
// (on for models with attention), and the dense model without it too (its V cache is then
// transposed: the export reads it one embedding row at a time).
INSTANTIATE_TEST_SUITE_P(Rpc, ExactLogitsTest,
                         ::testing::Values(Case{"llama", true, true}, Case{"qwen35", true, true},
                                           Case{"mamba2", false, true}, Case{"llama", false, true}),
                         case_name);

// The three families with every layer on a GPU (scripts/gpu-check runs them in a CUDA build;
// skipped where no GPU device exists, as in the CPU build CI uses).
INSTANTIATE_TEST_SUITE_P(Gpu, ExactLogitsTest,
                         ::testing::Values(Case{"llama", true, false, true},
                                           Case{"llama", false, false, true},
                                           Case{"qwen35", true, false, true},
                                           Case{"mamba2", false, false, true}),
                         case_name);

}  // namespace
}  // namespace skippy::server::exact_logits
