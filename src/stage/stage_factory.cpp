#include "stage/stage_factory.h"

namespace skippy::stage {

StageSelection make_stage(const CacheConfig& config, const runtime::Model& model,
                          const runtime::ContextOptions& /*context*/) {
    StageSelection selection;
    selection.backend = std::make_unique<NoCacheStage>();
    selection.summary = std::string("mode=") + cache_mode_name(config.mode) +
                        " payload=" + payload_choice_name(config.payload) + " model_kind=" +
                        std::string(runtime::model_kind_name(model.kind())) +
                        " (prefix cache not wired yet: every request is a miss)";
    return selection;
}

}  // namespace skippy::stage
