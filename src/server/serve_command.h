// `skippy serve`: configuration (CLI flags + SKIPPY_* environment variables) and start-up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model.h"
#include "server/http/http_server.h"
#include "server/observe/kv_event_publisher.h"
#include "server/schedule/scheduler.h"
#include "stage/cache_config.h"

namespace CLI {
class App;
}

namespace skippy::server {

struct ServeConfig {
    ServeConfig() {
        scheduler.context.n_ctx = 0;  // 0: the model's training context per lane
        load.n_gpu_layers = runtime::kGpuLayersAuto;
    }
    std::string model_path;  // empty = built-in demo model (generated once, cached on disk)
    // Model names requests may use (the first one is reported first); "*" accepts any name.
    // Empty: the file stem.
    std::vector<std::string> model_aliases;
    std::string chat_template_file;
    std::string api_key_file;  // more keys for http.api_keys, one per line
    // Output tokens when a request names none, and the most any request gets; 0 = the lane's
    // room, -1 = the default (0, or 512 for the demo model, whose random weights never stop).
    int32_t max_output_tokens = -1;
    // Devices (-ngl, --device, --tensor-split, --main-gpu, --split-mode); the default "auto"
    // puts every layer on the devices there are (none in a CPU build without --rpc).
    runtime::ModelLoadOptions load;
    std::vector<std::string> rpc_servers;  // --rpc HOST:PORT,...: registered before the load
    std::string repack = "auto";  // --repack: auto (on for attention-only models) | on | off
    bool list_devices = false;             // print the devices and exit
    HttpServerOptions http;
    SchedulerOptions scheduler;
    stage::CacheConfig cache;
    KvEventsOptions kv_events;  // --kv-events*: off unless an endpoint is given
};

void add_serve_options(CLI::App& app, ServeConfig& config);
// Loads the model, starts the scheduler and serves until SIGINT/SIGTERM. Returns exit code.
int run_serve(ServeConfig config);
// llama-server's multi-letter single-dash flags (-ngl, -dev, -ts, -mg, -sm), which CLI11
// would read as bundles of short flags, rewritten to their long names in place.
void rewrite_llama_server_flags(std::vector<char*>& args);
// Path of the built-in demo model, generating it first if needed.
std::string ensure_demo_model();

}  // namespace skippy::server
