#include "server/serve_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cache/redis_store.h"
#include "runtime/chat_template.h"
#include "runtime/factory/model_factory.h"
#include "runtime/model.h"
#include "server/http/access_log.h"
#include "server/http/api_keys.h"
#include "stage/stage_factory.h"

namespace skippy::server {

namespace {

HttpServer* g_http_server = nullptr;

// The demo model's training context (the default context of each lane): room for an agent
// CLI's system prompt and tools (~15k tokens) and a conversation.
constexpr uint32_t kDemoContext = 32768;
// The demo's default output limit: its random weights never end a reply, and an agent CLI
// that sends no max_tokens would otherwise generate until the lane is full.
constexpr int32_t kDemoMaxOutputTokens = 512;

void handle_signal(int) {
    if (g_http_server != nullptr) {
        g_http_server->stop();
    }
}

std::string cache_dir() {
    if (const char* dir = std::getenv("SKIPPY_CACHE_DIR")) {
        return dir;
    }
    const char* home = std::getenv("HOME");
    return std::string(home != nullptr ? home : "/tmp") + "/.cache/skippy";
}

// " kv=512 MiB" (all lanes' K and V cells, estimated for models whose layers all have
// attention), or "" when that is not known.
std::string kv_cache_summary(const runtime::Model& model, const runtime::ContextOptions& ctx,
                             uint32_t per_lane, uint32_t lanes) {
    auto bytes_per_element = [](const std::string& type) {
        return type == "f32"                     ? 4.0
               : type == "f16" || type == "bf16" ? 2.0
               : type == "q8_0"                  ? 34.0 / 32
               : type == "q4_0"                  ? 18.0 / 32
                                                 : 0.0;
    };
    const double per_element = (bytes_per_element(ctx.type_k) + bytes_per_element(ctx.type_v)) / 2;
    const uint64_t elements = model.kv_elements_per_cell();
    if (elements == 0 || bytes_per_element(ctx.type_k) == 0 || bytes_per_element(ctx.type_v) == 0) {
        return "";
    }
    const double cells = static_cast<double>(per_lane) * lanes;
    const double mib = cells * static_cast<double>(elements) * per_element / (1024.0 * 1024.0);
    return " kv=" + std::to_string(static_cast<uint64_t>(mib + 0.5)) + " MiB";
}

std::string mib(uint64_t bytes) { return std::to_string(bytes / (1024 * 1024)) + " MiB"; }

std::string device_list(const std::vector<runtime::DeviceInfo>& devices) {
    std::string out;
    for (const auto& d : devices) {
        out += (out.empty() ? "" : ", ") + d.label() + " (" + d.kind + ", " + mib(d.free_bytes) +
               " free of " + mib(d.total_bytes) + ")";
    }
    return out.empty() ? std::string("none") : out;
}

// "gpu_layers=auto split=layer tensor_split=1,3": the device settings, for the map line.
std::string device_settings(const runtime::ModelLoadOptions& o) {
    std::string out = "gpu_layers=" + runtime::gpu_layers_name(o.n_gpu_layers) +
                      " split=" + runtime::split_mode_name(o.split_mode);
    if (!o.tensor_split.empty()) {
        std::ostringstream ts;
        for (size_t i = 0; i < o.tensor_split.size(); ++i) {
            ts << (i == 0 ? "" : ",") << o.tensor_split[i];
        }
        out += " tensor_split=" + ts.str();
    }
    if (o.split_mode != runtime::SplitMode::Layer) {
        out += " main_gpu=" + std::to_string(o.main_gpu);
    }
    if (!o.devices.empty()) {
        std::string names;
        for (const auto& d : o.devices) {
            names += (names.empty() ? "" : ",") + d;
        }
        out += " device=" + names;
    }
    return out;
}

}  // namespace

void rewrite_llama_server_flags(std::vector<char*>& args) {
    static char gpu_layers[] = "--gpu-layers";
    static char device[] = "--device";
    static char tensor_split[] = "--tensor-split";
    static char main_gpu[] = "--main-gpu";
    static char split_mode[] = "--split-mode";
    for (auto& arg : args) {
        const std::string a = arg;
        if (a == "-ngl") {
            arg = gpu_layers;
        } else if (a == "-dev") {
            arg = device;
        } else if (a == "-ts") {
            arg = tensor_split;
        } else if (a == "-mg") {
            arg = main_gpu;
        } else if (a == "-sm") {
            arg = split_mode;
        }
    }
}

std::string ensure_demo_model() {
    const std::filesystem::path dir = std::filesystem::path(cache_dir()) / "models";
    // (-v3: a 32768-token training context, the default context of each lane.)
    const std::filesystem::path path = dir / "skippy-demo-llama-tools-v3.gguf";
    if (std::filesystem::exists(path)) {
        return path.string();
    }
    std::filesystem::create_directories(dir);
    runtime::ModelSpec spec;
    spec.arch = "llama";
    spec.name = "skippy-demo";
    spec.n_layer = 4;
    spec.n_embd = 256;
    spec.n_head = 4;
    spec.n_head_kv = 4;
    spec.n_ff = 768;
    spec.n_ctx_train = kDemoContext;
    spec.seed = 7;
    // Tool calls out of the box: the Qwen2.5 chat template (tools, <tool_call> JSON calls)
    // with the Qwen2.5/Qwen3 tokenizer, in which its markers are single tokens.
    spec.vocab = "qwen3";
    spec.chat_template = runtime::chat_template_text("Qwen-Qwen2.5-7B-Instruct");
    spec.f16 = true;
    std::cerr << "skippy: generating the demo model at " << path << "\n";
    const auto tmp = path.string() + ".tmp";
    runtime::make_random_model(spec, tmp);
    std::filesystem::rename(tmp, path);
    return path.string();
}

void add_serve_options(CLI::App& app, ServeConfig& c) {
    app.add_option("-m,--model", c.model_path, "GGUF model to serve (default: built-in demo)")
        ->envname("SKIPPY_MODEL");
    // Devices, as llama-server names them (-ngl, -dev, -ts, -mg, -sm work too:
    // rewrite_llama_server_flags).
    app.add_option_function<std::string>(
           "--gpu-layers,--n-gpu-layers",
           [&c](const std::string& v) {
               try {
                   c.load.n_gpu_layers = runtime::parse_gpu_layers(v);
               } catch (const std::invalid_argument& e) {
                   throw CLI::ValidationError("--gpu-layers", e.what());
               }
           },
           "layers on the devices (-ngl): auto | all | N, counted from the output down "
           "(auto = all: every layer and the output; 0 = CPU only)")
        ->envname("SKIPPY_GPU_LAYERS")
        ->default_str("auto");
    app.add_option("--device", c.load.devices,
                   "devices to use, comma-separated (-dev; names as --list-devices prints "
                   "them: CUDA0, RPC0, ...; none = CPU only; default: every device)")
        ->delimiter(',')
        ->envname("SKIPPY_DEVICE");
    app.add_option_function<std::string>(
           "--tensor-split",
           [&c](const std::string& v) {
               try {
                   c.load.tensor_split = runtime::parse_tensor_split(v);
               } catch (const std::invalid_argument& e) {
                   throw CLI::ValidationError("--tensor-split", e.what());
               }
           },
           "share of the layers per device, e.g. 3,1 (-ts; default: by free memory)")
        ->envname("SKIPPY_TENSOR_SPLIT");
    app.add_option("--main-gpu", c.load.main_gpu,
                   "the device (index in the device list) for --split-mode none, or for "
                   "intermediate results with row (-mg)")
        ->envname("SKIPPY_MAIN_GPU")
        ->capture_default_str();
    app.add_option_function<std::string>(
           "--split-mode",
           [&c](const std::string& v) {
               try {
                   c.load.split_mode = runtime::parse_split_mode(v);
               } catch (const std::invalid_argument& e) {
                   throw CLI::ValidationError("--split-mode", e.what());
               }
           },
           "how layers spread over several devices (-sm): none | layer | row")
        ->envname("SKIPPY_SPLIT_MODE")
        ->default_str("layer");
    app.add_option("--repack", c.repack,
                   "llama.cpp's CPU weight repacking (Q4_K, Q4_0, IQ4_NL ...): auto = on for "
                   "attention-only models (prefill batches are padded to whole groups of 4 rows, "
                   "so a restored prefix is exact), off for models with recurrent state (whose "
                   "padding rows could not be removed again), on, off")
        ->check(CLI::IsMember({"auto", "on", "off"}))
        ->envname("SKIPPY_REPACK")
        ->capture_default_str();
    app.add_option("--rpc", c.rpc_servers,
                   "rpc-servers holding layers, HOST:PORT comma-separated (llama.cpp's RPC "
                   "backend; no authentication: private networks only)")
        ->delimiter(',')
        ->envname("SKIPPY_RPC");
    app.add_flag("--list-devices", c.list_devices, "print the devices (after --rpc) and exit");
    app.add_option("--alias", c.model_aliases,
                   "model names served (comma-separated or repeated; '*' accepts any name)")
        ->delimiter(',')
        ->envname("SKIPPY_MODEL_ALIAS");
    app.add_option("--chat-template-file", c.chat_template_file,
                   "Jinja chat template to use instead of the model's");
    app.add_option("--host", c.http.host, "bind address")
        ->envname("SKIPPY_HOST")
        ->capture_default_str();
    app.add_option("--port", c.http.port, "port (0 = any free port)")
        ->envname("SKIPPY_PORT")
        ->capture_default_str();
    app.add_option("--api-key", c.http.api_keys,
                   "require Authorization: Bearer KEY or x-api-key: KEY (comma-separated or "
                   "repeated: any key authorizes; with several, each key is its own cache "
                   "tenant)")
        ->delimiter(',')
        ->envname("SKIPPY_API_KEY");
    app.add_option("--api-key-file", c.api_key_file,
                   "more API keys, one per line ('#' starts a comment line)")
        ->envname("SKIPPY_API_KEY_FILE");
    app.add_option_function<std::string>(
           "--log-format",
           [&c](const std::string& v) {
               try {
                   c.http.access_log.format = parse_log_format(v);
               } catch (const std::invalid_argument& e) {
                   throw CLI::ValidationError("--log-format", e.what());
               }
           },
           "access log lines: text (skippy: access key=value ...) | json (one object per line)")
        ->envname("SKIPPY_LOG_FORMAT")
        ->default_str("text");
    app.add_option_function<std::string>(
           "--access-log",
           [&c](const std::string& v) {
               if (v != "on" && v != "off") {
                   throw CLI::ValidationError("--access-log", "must be on or off");
               }
               c.http.access_log.enabled = v == "on";
           },
           "one stderr line per HTTP request once its response is complete: on | off")
        ->envname("SKIPPY_ACCESS_LOG")
        ->default_str("on");
    app.add_option("--max-body-bytes", c.http.max_body_bytes, "largest request body (413 above)")
        ->envname("SKIPPY_MAX_BODY_BYTES")
        ->capture_default_str();
    // HTTP connection limits against slow and hostile clients
    // (src/server/http/connection_server.h).
    app.add_option("--http-max-connections", c.http.max_connections,
                   "open connections (503 beyond; at most the open-file limit allows)")
        ->envname("SKIPPY_HTTP_MAX_CONNECTIONS")
        ->capture_default_str();
    app.add_option("--http-threads", c.http.handler_threads,
                   "request handler threads (0 = lanes + queue depth + 4, at most 256)")
        ->envname("SKIPPY_HTTP_THREADS")
        ->capture_default_str();
    app.add_option("--http-header-timeout-ms", c.http.header_timeout_ms,
                   "longest wait for a request head, from connect or its first byte (408)")
        ->envname("SKIPPY_HTTP_HEADER_TIMEOUT_MS")
        ->capture_default_str();
    app.add_option("--http-body-timeout-ms", c.http.body_timeout_ms,
                   "longest wait for a request body after its head (408)")
        ->envname("SKIPPY_HTTP_BODY_TIMEOUT_MS")
        ->capture_default_str();
    app.add_option("--http-idle-timeout-ms", c.http.idle_timeout_ms,
                   "keep-alive: longest wait for the next request on a connection")
        ->envname("SKIPPY_HTTP_IDLE_TIMEOUT_MS")
        ->capture_default_str();
    app.add_option("--http-write-timeout-ms", c.http.write_timeout_ms,
                   "longest a response write may make no progress")
        ->envname("SKIPPY_HTTP_WRITE_TIMEOUT_MS")
        ->capture_default_str();
    app.add_option("--http-max-requests-per-connection", c.http.max_requests_per_connection,
                   "keep-alive: requests on one connection before it is closed")
        ->envname("SKIPPY_HTTP_MAX_REQUESTS_PER_CONNECTION")
        ->capture_default_str();
    app.add_option("--http-max-header-bytes", c.http.max_header_bytes,
                   "largest request head (431 above)")
        ->envname("SKIPPY_HTTP_MAX_HEADER_BYTES")
        ->capture_default_str();
    app.add_option("-c,--ctx-size", c.scheduler.context.n_ctx,
                   "KV cells of all lanes, split evenly (0 = the model's training context "
                   "per lane)")
        ->envname("SKIPPY_CTX_SIZE")
        ->capture_default_str();
    app.add_option("-n,--max-output-tokens", c.max_output_tokens,
                   "output tokens when a request names none, and the most any request gets "
                   "(0 = the lane's room; default 0, 512 for the demo model)")
        ->envname("SKIPPY_MAX_OUTPUT_TOKENS")
        ->check(CLI::Range(0, INT32_MAX));
    app.add_option("--lanes", c.scheduler.lanes, "concurrent request lanes")
        ->envname("SKIPPY_LANES")
        ->capture_default_str();
    app.add_option("-t,--threads", c.scheduler.context.n_threads, "CPU threads (0 = all cores)")
        ->envname("SKIPPY_THREADS")
        ->capture_default_str();
    app.add_option("-b,--batch-size", c.scheduler.context.n_batch, "tokens per decode batch")
        ->envname("SKIPPY_BATCH_SIZE")
        ->capture_default_str();
    app.add_option_function<std::string>(
           "--flash-attn,--fa",
           [&c](const std::string& v) {
               c.scheduler.context.flash_attn = runtime::parse_flash_attn(v);
           },
           "flash attention: auto | on | off (auto = on, except for models without attention)")
        ->envname("SKIPPY_FLASH_ATTN")
        ->default_str("auto");
    app.add_option("--queue-depth", c.scheduler.max_queue_depth,
                   "requests waiting for a lane before 429")
        ->envname("SKIPPY_QUEUE_DEPTH")
        ->capture_default_str();
    int64_t queue_timeout_ms = c.scheduler.queue_timeout.count();
    app.add_option_function<int64_t>(
           "--queue-timeout-ms",
           [&c](const int64_t& ms) { c.scheduler.queue_timeout = std::chrono::milliseconds(ms); },
           "longest wait for a lane before 503")
        ->envname("SKIPPY_QUEUE_TIMEOUT_MS")
        ->default_val(queue_timeout_ms);
    auto& cache = c.cache;
    app.add_option_function<std::string>(
           "--cache-mode",
           [&cache](const std::string& v) { cache.mode = stage::parse_cache_mode(v); },
           "prefix cache: off | record | lookup-record")
        ->envname("SKIPPY_CACHE_MODE")
        ->default_str(stage::cache_mode_name(cache.mode));
    app.add_option_function<std::string>(
           "--cache-payload",
           [&cache](const std::string& v) { cache.payload = stage::parse_payload_choice(v); },
           "auto | kv-pages | full-state")
        ->envname("SKIPPY_CACHE_PAYLOAD")
        ->default_str(stage::payload_choice_name(cache.payload));
    app.add_option("--cache-max-entries", cache.max_entries, "exact-state entries")
        ->envname("SKIPPY_CACHE_MAX_ENTRIES")
        ->capture_default_str();
    app.add_option("--cache-max-bytes", cache.max_bytes, "exact-state physical bytes")
        ->envname("SKIPPY_CACHE_MAX_BYTES")
        ->capture_default_str();
    app.add_option("--cache-min-tokens", cache.min_tokens, "shortest cached prefix")
        ->envname("SKIPPY_CACHE_MIN_TOKENS")
        ->capture_default_str();
    app.add_option("--cache-record-limit", cache.record_limit, "record ladder rungs per request")
        ->envname("SKIPPY_CACHE_RECORD_LIMIT")
        ->capture_default_str();
    app.add_option("--cache-record-queue", cache.record_queue_capacity, "async record queue size")
        ->envname("SKIPPY_CACHE_RECORD_QUEUE")
        ->capture_default_str();
    app.add_option("--cache-events-log", cache.events_log_path, "JSON-lines cache event log")
        ->envname("SKIPPY_CACHE_EVENTS_LOG");
    app.add_option_function<std::string>(
           "--cache-disk",
           [&cache](const std::string& v) {
               if (v != "on" && v != "off") {
                   throw CLI::ValidationError("--cache-disk", "must be on or off");
               }
               cache.disk = v == "on";
           },
           "disk tier of the prefix cache (survives restarts): on | off")
        ->envname("SKIPPY_CACHE_DISK")
        ->default_str("on");
    app.add_option("--cache-dir", cache.disk_dir,
                   "disk tier folder (default: $SKIPPY_CACHE_DIR or ~/.cache/skippy, "
                   "then /prefix-cache)")
        ->envname("SKIPPY_CACHE_DISK_DIR");
    app.add_option("--cache-disk-bytes", cache.disk_max_bytes, "disk tier bound (bytes)")
        ->envname("SKIPPY_CACHE_DISK_BYTES")
        ->capture_default_str();
    app.add_option("--cache-disk-min-free", cache.disk_min_free,
                   "bytes the disk tier leaves free on its filesystem")
        ->envname("SKIPPY_CACHE_DISK_MIN_FREE")
        ->capture_default_str();
    app.add_option("--cache-redis", cache.redis_url,
                   "shared Redis tier for replicas: redis://[[user]:password@]host[:port][/db] "
                   "or unix:///path.sock[?db=N&password=X] (default: off)")
        ->envname("SKIPPY_CACHE_REDIS")
        ->check([](const std::string& url) -> std::string {
            std::string why;
            return cache::parse_redis_url(url, &why) ? std::string() : why;
        });
    app.add_option("--cache-redis-timeout-ms", cache.redis_timeout_ms,
                   "Redis connect and command timeout (ms); a slower Redis is skipped")
        ->envname("SKIPPY_CACHE_REDIS_TIMEOUT_MS")
        ->check(CLI::Range(1u, 60000u))
        ->capture_default_str();
    app.add_option("--cache-redis-prefix", cache.redis_prefix, "prefix of skippy's Redis keys")
        ->envname("SKIPPY_CACHE_REDIS_PREFIX")
        ->capture_default_str();
    // KV events for KV-aware routers, in vLLM's format (kv_event_publisher.h).
    auto& kv = c.kv_events;
    app.add_option("--kv-events", kv.endpoint,
                   "publish the RAM tier's blocks as vLLM KV events on a ZeroMQ PUB socket "
                   "bound here, e.g. tcp://0.0.0.0:5557 (topic kv@<replica-id>@<model>)")
        ->envname("SKIPPY_KV_EVENTS");
    app.add_option("--kv-events-replay", kv.replay_endpoint,
                   "ROUTER socket answering replay requests for missed KV event batches, "
                   "e.g. tcp://0.0.0.0:5558")
        ->envname("SKIPPY_KV_EVENTS_REPLAY");
    app.add_option("--kv-events-block-size", kv.block_size, "tokens per advertised KV block")
        ->envname("SKIPPY_KV_EVENTS_BLOCK_SIZE")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--replica-id", kv.replica_id,
                   "this replica's name in the KV event topic (default: hostname:port)")
        ->envname("SKIPPY_REPLICA_ID");
}

int run_serve(ServeConfig config) {
    // Before any rpc-server connection: a write to a closed connection must fail, not kill.
    std::signal(SIGPIPE, SIG_IGN);
    if (!config.rpc_servers.empty()) {
        const auto names = runtime::add_rpc_servers(config.rpc_servers);
        std::cerr << "skippy: rpc-servers";
        for (size_t i = 0; i < config.rpc_servers.size(); ++i) {
            std::cerr << (i == 0 ? " " : ", ") << config.rpc_servers[i];
        }
        std::cerr << " connected (devices";
        for (const auto& n : names) {
            std::cerr << " " << n;
        }
        std::cerr << "; no authentication: keep them on a private network)\n";
    }
    if (config.list_devices) {
        std::cout << "devices: " << device_list(runtime::available_devices()) << std::endl;
        return 0;
    }
    const bool demo = config.model_path.empty();
    if (demo) {
        config.model_path = ensure_demo_model();
    }
    if (!config.api_key_file.empty()) {
        for (auto& key : read_api_key_file(config.api_key_file)) {
            config.http.api_keys.push_back(std::move(key));
        }
    }
    config.load.repack = config.repack == "on"    ? runtime::ModelLoadOptions::Repack::On
                         : config.repack == "off" ? runtime::ModelLoadOptions::Repack::Off
                                                  : runtime::ModelLoadOptions::Repack::Auto;
    auto model = runtime::Model::load(config.model_path, config.load);
    if (model->repacked() &&
        (model->kind() == runtime::ModelKind::Hybrid ||
         model->kind() == runtime::ModelKind::Recurrent) &&
        config.cache.mode != stage::CacheMode::Off) {
        std::cerr << "skippy: --repack on with a model with recurrent state and the prefix cache "
                     "on: restores of repacked weight types (Q4_K, Q4_0, IQ4_NL ...) are not "
                     "bit-exact\n";
    }
    const runtime::DevicePlacement& placement = model->placement();
    std::string template_override;
    if (!config.chat_template_file.empty()) {
        std::ifstream in(config.chat_template_file);
        if (!in) {
            throw std::runtime_error("cannot read " + config.chat_template_file);
        }
        std::stringstream ss;
        ss << in.rdbuf();
        template_override = ss.str();
    }
    runtime::ChatTemplate chat_template(*model, template_override);
    // The context of each lane: the model's training context unless --ctx-size splits
    // another total (like llama-server's -c with --parallel).
    std::string ctx_source = "--ctx-size / lanes";
    if (config.scheduler.context.n_ctx == 0) {
        const uint64_t train = model->n_ctx_train() > 0 ? model->n_ctx_train() : 4096;
        config.scheduler.context.n_ctx = static_cast<uint32_t>(
            std::min<uint64_t>(train * std::max<uint32_t>(1, config.scheduler.lanes), UINT32_MAX));
        ctx_source = model->n_ctx_train() > 0 ? "model's training context" : "default";
    }
    if (config.cache.disk_dir.empty()) {
        config.cache.disk_dir = cache_dir() + "/prefix-cache";
    }
    // Bound before anything is stored: a bad endpoint stops the start-up with its name.
    std::unique_ptr<KvEventPublisher> kv_events;
    if (!config.kv_events.endpoint.empty()) {
        config.kv_events.checkpoint_only = model->kind() == runtime::ModelKind::Hybrid ||
                                           model->kind() == runtime::ModelKind::Recurrent;
        kv_events = std::make_unique<KvEventPublisher>(config.kv_events);
        config.cache.on_entry_change = kv_events->observer();
    }
    auto stage_backend = stage::make_stage(config.cache, *model, config.scheduler.context);
    if (kv_events) {
        stage_backend.metrics = [cache_metrics = stage_backend.metrics, pub = kv_events.get()] {
            return (cache_metrics ? cache_metrics() : std::string()) + pub->metrics_text();
        };
    }
    const std::string cache_summary = stage_backend.summary;
    Scheduler scheduler(*model, config.scheduler, std::move(stage_backend.backend));

    std::vector<std::string> model_ids;
    for (const auto& alias : config.model_aliases) {
        if (!alias.empty() &&
            std::find(model_ids.begin(), model_ids.end(), alias) == model_ids.end()) {
            model_ids.push_back(alias);
        }
    }
    if (demo && model_ids.empty()) {
        // The demo answers to any model name: agent CLIs send their own (claude-opus-*, ...).
        model_ids.push_back("*");
    }
    if (std::all_of(model_ids.begin(), model_ids.end(), [](const auto& id) { return id == "*"; })) {
        model_ids.insert(model_ids.begin(),
                         std::filesystem::path(config.model_path).stem().string());
    }
    const std::string model_id = model_ids.front();
    RequestLimits limits;
    limits.n_ctx = scheduler.n_ctx();
    limits.max_output_tokens = config.max_output_tokens >= 0 ? config.max_output_tokens
                               : demo                        ? kDemoMaxOutputTokens
                                                             : 0;
    OpenAiRequestParser parser(*model, chat_template, model_ids, limits);
    HttpServer http(config.http, scheduler, parser, model_id, stage_backend.metrics);
    const int port = http.bind();
    std::string kv_events_note;
    if (kv_events) {
        std::string replica = config.kv_events.replica_id;
        if (replica.empty()) {
            char host[256] = {};
            gethostname(host, sizeof(host) - 1);
            replica = std::string(host) + ":" + std::to_string(port);
        }
        kv_events->start("kv@" + replica + "@" + model_id);
        kv_events_note = "skippy: kv events on " + config.kv_events.endpoint + " topic " +
                         kv_events->topic() +
                         " block_size=" + std::to_string(config.kv_events.block_size) +
                         (config.kv_events.checkpoint_only ? " (block-aligned checkpoints only)"
                                                           : std::string()) +
                         (config.kv_events.replay_endpoint.empty()
                              ? std::string()
                              : " replay on " + config.kv_events.replay_endpoint) +
                         "\n";
    }
    const ApiKeys keys(config.http.api_keys);
    const auto& ctx = config.scheduler.context;
    const std::string max_output =
        limits.max_output_tokens > 0
            ? std::to_string(limits.max_output_tokens) +
                  (demo && config.max_output_tokens < 0 ? " (demo default)" : "")
            : std::string("lane room");

    std::cerr << "skippy: model " << config.model_path << " (" << model->arch() << ", "
              << runtime::model_kind_name(model->kind()) << ", " << model->n_params()
              << " params)\n"
              << "skippy: id=" << model_id
              << (model_ids.size() > 1 ? " (aliases: " + std::to_string(model_ids.size()) + ")"
                                       : std::string())
              << " ctx=" << scheduler.n_ctx() * config.scheduler.lanes
              << " lanes=" << config.scheduler.lanes << " ctx per lane=" << scheduler.n_ctx()
              << " (" << ctx_source << ")"
              << kv_cache_summary(*model, ctx, scheduler.n_ctx(), config.scheduler.lanes)
              << " max_output_tokens=" << max_output << " flash_attn="
              << runtime::flash_attn_name(runtime::resolve_flash_attn(
                     config.scheduler.context.flash_attn, model->kind()))
              << " threads=" << config.scheduler.context.n_threads
              << " batch=" << config.scheduler.context.n_batch
              << " queue_depth=" << config.scheduler.max_queue_depth << " auth=" << keys.summary()
              << " log_format=" << log_format_name(config.http.access_log.format)
              << " access_log=" << (config.http.access_log.enabled ? "on" : "off") << "\n"
              << "skippy: devices " << device_list(placement.devices) << "\n"
              << "skippy: " << placement.map_text() << " (" << device_settings(config.load)
              << "; read from the loaded model's weights)\n"
              << "skippy: cache " << cache_summary << "\n"
              << kv_events_note << "skippy: listening on http://" << config.http.host << ":" << port
              << std::endl;
    g_http_server = &http;
    std::signal(SIGINT, handle_signal);
    std::signal(SIGTERM, handle_signal);
    std::signal(SIGPIPE, SIG_IGN);
    http.listen();
    g_http_server = nullptr;
    std::cerr << "skippy: shutting down\n";
    scheduler.stop();
    return 0;
}

}  // namespace skippy::server
