// make_stage: chooses the stage backend (cache payload) for a model from the configuration
// and what the model reports (dense / SWA / hybrid / recurrent).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/inference_context.h"
#include "runtime/model.h"
#include "stage/cache_config.h"
#include "stage/stage_backend.h"

namespace skippy::stage {

struct StageSelection {
    std::unique_ptr<StageBackend> backend;
    std::string summary;                   // effective settings, printed at start-up
    std::function<std::string()> metrics;  // Prometheus text of the cache (may be empty)
};

StageSelection make_stage(const CacheConfig& config, const runtime::Model& model,
                          const runtime::ContextOptions& context);

}  // namespace skippy::stage
