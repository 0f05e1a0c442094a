#include "stage/stage_factory.h"

#include <algorithm>
#include <string>

#include "stage/prefix_cache_stage.h"

namespace skippy::stage {

namespace {

// Which payload is exact for this model and context; nullopt + reason when the cache must
// stay off.
std::optional<cache::PayloadKind> choose_payload(PayloadChoice choice, runtime::ModelKind kind,
                                                 const runtime::ContextOptions& context,
                                                 std::string& reason) {
    if (kind == runtime::ModelKind::Swa) {
        reason = "sliding-window attention: cached KV would not match the window, cache disabled";
        return std::nullopt;
    }
    const int32_t min_chunk =
        ExactRule::for_model(
            runtime::resolve_flash_attn(context.flash_attn, kind) == runtime::FlashAttn::On,
            kind != runtime::ModelKind::Dense)
            .body_min;
    if (static_cast<int64_t>(std::min(context.n_batch, context.n_ubatch)) < 2 * min_chunk) {
        reason = "batches of " + std::to_string(std::min(context.n_batch, context.n_ubatch)) +
                 " tokens cannot keep every prefill chunk at the " + std::to_string(min_chunk) +
                 " tokens exactness needs with this attention kernel (plan.h); cache disabled";
        return std::nullopt;
    }
    switch (choice) {
        case PayloadChoice::Auto:
        case PayloadChoice::KvPages:
            return cache::PayloadKind::KvPages;
        case PayloadChoice::FullState:
            return cache::PayloadKind::FullState;
    }
    reason = "unknown payload";
    return std::nullopt;
}

}  // namespace

StageSelection make_stage(const CacheConfig& config, const runtime::Model& model,
                          const runtime::ContextOptions& context) {
    StageSelection selection;
    std::string summary = std::string("mode=") + cache_mode_name(config.mode) +
                          " model_kind=" + std::string(runtime::model_kind_name(model.kind()));
    std::string reason;
    std::optional<cache::PayloadKind> payload;
    if (config.mode == CacheMode::Off) {
        reason = "cache mode off";
    } else {
        payload = choose_payload(config.payload, model.kind(), context, reason);
    }
    if (!payload) {
        selection.backend = std::make_unique<NoCacheStage>();
        selection.summary = summary + " payload=none (" + reason + ")";
        return selection;
    }
    auto stage = std::make_unique<PrefixCacheStage>(config, model, context, *payload);
    PrefixCacheStage* raw = stage.get();
    selection.metrics = [raw] { return raw->metrics_text(); };
    summary += std::string(" payload=") + cache::to_string(*payload) +
               " min_tokens=" + std::to_string(config.min_tokens) +
               " record_limit=" + std::to_string(config.record_limit) +
               " max_entries=" + std::to_string(config.max_entries) +
               " max_bytes=" + std::to_string(config.max_bytes) +
               " record_queue=" + std::to_string(config.record_queue_capacity);
    if (!config.events_log_path.empty()) {
        summary += " events_log=" + config.events_log_path;
    }
    summary += " " + raw->disk_note();
    if (!raw->redis_note().empty()) {
        summary += " " + raw->redis_note();
    }
    selection.backend = std::move(stage);
    selection.summary = summary;
    return selection;
}

}  // namespace skippy::stage
