#include "stage/stage_factory.h"

#include "stage/prefix_cache_stage.h"

namespace skippy::stage {

namespace {

// Which payload is safe for this model; nullopt + reason when the cache must stay off.
std::optional<ActivePayload> choose_payload(PayloadChoice choice, runtime::ModelKind kind,
                                            std::string& reason) {
    const bool stateful =
        kind == runtime::ModelKind::Hybrid || kind == runtime::ModelKind::Recurrent;
    if (kind == runtime::ModelKind::Swa) {
        reason = "sliding-window attention: cached KV would not match the window, cache disabled";
        return std::nullopt;
    }
    switch (choice) {
        case PayloadChoice::Auto:
            return stateful ? ActivePayload::KvRecurrent : ActivePayload::ResidentKv;
        case PayloadChoice::ResidentKv:
            if (stateful) {
                reason =
                    "resident-kv is unsafe on hybrid/recurrent models (KV-only reuse gives "
                    "wrong tokens), cache disabled";
                return std::nullopt;
            }
            return ActivePayload::ResidentKv;
        case PayloadChoice::KvRecurrent:
            if (!stateful) {
                reason = "kv-recurrent needs a hybrid or recurrent model, cache disabled";
                return std::nullopt;
            }
            return ActivePayload::KvRecurrent;
        case PayloadChoice::FullState:
            return ActivePayload::FullState;
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
    std::optional<ActivePayload> payload;
    if (config.mode == CacheMode::Off) {
        reason = "cache mode off";
    } else {
        payload = choose_payload(config.payload, model.kind(), reason);
    }
    if (!payload) {
        selection.backend = std::make_unique<NoCacheStage>();
        selection.summary = summary + " payload=none (" + reason + ")";
        return selection;
    }
    auto stage = std::make_unique<PrefixCacheStage>(config, model, context, *payload);
    PrefixCacheStage* raw = stage.get();
    selection.metrics = [raw] { return raw->metrics_text(); };
    summary += std::string(" payload=") + active_payload_name(*payload) +
               " min_tokens=" + std::to_string(config.min_tokens) +
               " stride=" + std::to_string(config.stride) +
               " record_limit=" + std::to_string(config.record_limit);
    if (*payload == ActivePayload::ResidentKv) {
        summary += " resident_entries=" + std::to_string(config.resident_max_entries) +
                   " resident_tokens=" +
                   (config.resident_token_budget ? std::to_string(config.resident_token_budget)
                                                 : std::string("ctx"));
    } else {
        summary += " max_entries=" + std::to_string(config.max_entries) +
                   " max_bytes=" + std::to_string(config.max_bytes) +
                   " record_queue=" + std::to_string(config.record_queue_capacity);
    }
    if (!config.events_log_path.empty()) {
        summary += " events_log=" + config.events_log_path;
    }
    selection.backend = std::move(stage);
    selection.summary = summary;
    return selection;
}

}  // namespace skippy::stage
