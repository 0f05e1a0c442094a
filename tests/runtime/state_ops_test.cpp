// Runtime state operations the prefix cache relies on, on real generated models:
// sequence copy/remove, per-sequence state export/import (full and partial-only),
// and model-kind reporting.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "runtime/inference_context.h"
#include "runtime/model.h"
#include "runtime/factory/model_factory.h"
#include "runtime/sampler.h"
#include "test_models.h"

namespace skippy::runtime {
namespace {

using skippy::testing::continue_greedy;

std::string model_for(const std::string& arch) {
    return skippy::testing::tiny_model(arch, "state-ops-test", 11);
}

// Decodes `tokens` into `seq` from position `pos0` in one batch.
int32_t prefill(InferenceContext& ctx, SeqId seq, const std::vector<Token>& tokens, Pos pos0) {
    std::vector<Token> padded(static_cast<size_t>(pos0), 0);
    padded.insert(padded.end(), tokens.begin(), tokens.end());
    return skippy::testing::prefill(ctx, seq, padded, static_cast<size_t>(pos0), padded.size());
}

class StateOpsTest : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        model_ = Model::load(model_for(GetParam()));
        ContextOptions options;
        options.n_ctx = 512;
        options.n_seq_max = 3;
        options.n_batch = 128;
        options.n_threads = 1;
        ctx_ = std::make_unique<InferenceContext>(*model_, options);
        prompt_ = model_->tokenize("The quick brown fox jumps over the lazy dog again", true, true);
        ASSERT_GT(prompt_.size(), 8u);
    }
    std::unique_ptr<Model> model_;
    std::unique_ptr<InferenceContext> ctx_;
    std::vector<Token> prompt_;
};

TEST_P(StateOpsTest, ReportsModelKind) {
    const std::string arch = GetParam();
    EXPECT_EQ(model_->arch(), arch);
    if (arch == "llama") {
        EXPECT_EQ(model_->kind(), ModelKind::Dense);
    } else if (arch == "qwen35") {
        EXPECT_EQ(model_->kind(), ModelKind::Hybrid);
    } else {
        EXPECT_EQ(model_->kind(), ModelKind::Recurrent);
    }
    EXPECT_EQ(model_->weights_digest().rfind("xxh3-128:", 0), 0u);
}

TEST_P(StateOpsTest, ExportedFullStateRestoresIntoFreshLaneWithIdenticalContinuation) {
    // Reference: the prompt minus its last token, checkpointed, then the last token + 8 more.
    std::vector<Token> head(prompt_.begin(), prompt_.end() - 1);
    prefill(*ctx_, 0, head, 0);
    const std::vector<uint8_t> state = ctx_->state_export(0, StateScope::Full);
    ASSERT_FALSE(state.empty());
    EXPECT_EQ(state.size(), ctx_->state_size(0, StateScope::Full));
    const auto n_head = static_cast<Pos>(head.size());
    int32_t idx = prefill(*ctx_, 0, {prompt_.back()}, n_head);
    const auto reference = continue_greedy(*ctx_, 0, n_head + 1, idx, 8);

    // Restore into a different, empty lane and continue the same way.
    ctx_->seq_clear(0);
    ASSERT_TRUE(ctx_->state_import(state, 1, StateScope::Full));
    EXPECT_EQ(ctx_->seq_pos_max(1), n_head - 1);
    idx = prefill(*ctx_, 1, {prompt_.back()}, n_head);
    EXPECT_EQ(continue_greedy(*ctx_, 1, n_head + 1, idx, 8), reference);
}

TEST_P(StateOpsTest, PartialOnlyStateIsTheRecurrentPart) {
    prefill(*ctx_, 0, prompt_, 0);
    const size_t full = ctx_->state_size(0, StateScope::Full);
    const size_t partial = ctx_->state_size(0, StateScope::PartialOnly);
    if (model_->kind() == ModelKind::Dense) {
        // A plain KV cache has no partial part: llama.cpp ignores the flag.
        EXPECT_EQ(partial, full);
    } else if (model_->kind() == ModelKind::Hybrid) {
        EXPECT_GT(partial, 64u);
        EXPECT_LT(partial, full);
    } else {
        EXPECT_GT(partial, 64u);
    }
    const auto bytes = ctx_->state_export(0, StateScope::PartialOnly);
    EXPECT_EQ(bytes.size(), partial);
}

TEST_P(StateOpsTest, TruncatedStateIsRejected) {
    prefill(*ctx_, 0, prompt_, 0);
    auto state = ctx_->state_export(0, StateScope::Full);
    state.resize(state.size() / 2);
    EXPECT_FALSE(ctx_->state_import(state, 1, StateScope::Full));
    EXPECT_EQ(ctx_->seq_pos_max(1), -1);
    EXPECT_FALSE(ctx_->state_import({}, 1, StateScope::Full));
}

TEST_P(StateOpsTest, SequenceCopyAndRemove) {
    std::vector<Token> head(prompt_.begin(), prompt_.end() - 1);
    prefill(*ctx_, 0, head, 0);
    const auto n_head = static_cast<Pos>(head.size());
    ctx_->seq_copy(0, 2);
    EXPECT_EQ(ctx_->seq_pos_max(2), n_head - 1);
    int32_t idx = prefill(*ctx_, 0, {prompt_.back()}, n_head);
    const auto reference = continue_greedy(*ctx_, 0, n_head + 1, idx, 6);
    ctx_->seq_clear(0);
    EXPECT_EQ(ctx_->seq_pos_max(0), -1);
    // The copy is independent of the removed original.
    EXPECT_EQ(ctx_->seq_pos_max(2), n_head - 1);
    idx = prefill(*ctx_, 2, {prompt_.back()}, n_head);
    EXPECT_EQ(continue_greedy(*ctx_, 2, n_head + 1, idx, 6), reference);
    if (model_->kind() == ModelKind::Dense) {
        // Attention KV can be truncated to a prefix and extended again.
        EXPECT_TRUE(ctx_->seq_remove(2, 4, -1));
        EXPECT_EQ(ctx_->seq_pos_max(2), 3);
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, StateOpsTest, ::testing::Values("llama", "qwen35", "mamba2"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace skippy::runtime
