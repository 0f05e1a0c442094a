// Devices: where a model's layers run. The CPU, local GPUs (llama.cpp's CUDA backend, in a
// build that has it) and other machines through llama.cpp's RPC backend (`rpc-server` on each
// host). The flags follow llama-server's (-ngl, --device, --tensor-split, --main-gpu,
// --split-mode, --rpc); ModelLoadOptions (model.h) carries them to the load, and
// Model::placement() reports where every layer ended up.
//
//   auto rpc = skippy::runtime::add_rpc_servers({"127.0.0.1:50052", "127.0.0.1:50053"});
//   skippy::runtime::ModelLoadOptions o;
//   o.n_gpu_layers = skippy::runtime::kGpuLayersAll;
//   auto model = skippy::runtime::Model::load(path, o);
//   std::cerr << model->placement().map_text() << "\n";  // layers 0-1 -> RPC0[...], ...
//
// The RPC protocol has no authentication: an rpc-server belongs on loopback or a private
// network. llama.cpp's RPC client aborts the process when a connection breaks while serving
// (GGML_ABORT "Remote RPC server crashed or returned malformed response"); add_rpc_servers
// turns that abort into a message naming the rpc-server and exit status kRpcLostExitCode.
//
// Thread safety: add_rpc_servers and available_devices change or read process-wide ggml
// registries: call them from one thread before serving.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

struct llama_model;

namespace skippy::runtime {

// --gpu-layers values besides a count: every layer and the output on the devices. "auto" is
// llama-server's default; skippy does not shrink it to the devices' free memory the way
// llama-server's --fit does (set a count when the model is larger than the devices).
inline constexpr int32_t kGpuLayersAuto = -1;
inline constexpr int32_t kGpuLayersAll = -2;
// "auto" | "all" | N >= 0; throws std::invalid_argument otherwise.
int32_t parse_gpu_layers(const std::string& value);
std::string gpu_layers_name(int32_t n_gpu_layers);

// How layers are spread over several devices (llama.cpp's --split-mode; "tensor" is not
// offered: experimental upstream).
enum class SplitMode { None, Layer, Row };
SplitMode parse_split_mode(const std::string& value);  // "none" | "layer" | "row"
const char* split_mode_name(SplitMode mode);

// "3,1" or "3/1" -> {3, 1}; throws std::invalid_argument on a bad number or too many devices.
std::vector<float> parse_tensor_split(const std::string& value);

struct DeviceInfo {
    std::string name;         // ggml_backend_dev_name: "CUDA0", "RPC0", "CPU"
    std::string description;  // "NVIDIA H100 80GB HBM3", the rpc-server's "host:port"
    std::string kind;         // the backend: "CUDA", "RPC", "CPU", ...
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
    // "RPC0[127.0.0.1:50052]", "CUDA0[NVIDIA H100 80GB HBM3]", "CPU"
    std::string label() const;
};

// Every registered device other than the CPU (GPUs, the rpc-servers' devices), in
// llama.cpp's order.
std::vector<DeviceInfo> available_devices();

// The exit status after an rpc-server went away while serving (EX_UNAVAILABLE).
inline constexpr int kRpcLostExitCode = 69;

// Connects to each rpc-server ("host:port", IPv4 or a host name), each connect bounded by
// `connect_timeout`, then registers it with ggml as llama.cpp's --rpc does. Throws
// std::runtime_error naming the endpoint when one cannot be reached or is not an
// rpc-server of this protocol version. Returns the device names the servers added ("RPC0",
// "RPC1", ...: one per device of each server). Installs the handler for a lost connection
// (above) and ignores SIGPIPE (a write to a closed connection must fail, not kill).
std::vector<std::string> add_rpc_servers(
    const std::vector<std::string>& endpoints,
    std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(5000));

// Where a loaded model's weights live, read from the model's tensors (llama.cpp keeps the
// layer -> device assignment private; each tensor's buffer names its device).
struct DevicePlacement {
    std::vector<DeviceInfo> devices;  // the model's devices, in llama.cpp's order (none: CPU)
    std::vector<std::string> layers;  // per layer: "CPU", "RPC0", or "RPC0+CPU" when mixed
    std::string output = "CPU";       // the output head (norm + projection)
    SplitMode split_mode = SplitMode::Layer;
    std::vector<float> tensor_split;  // as given (empty: llama.cpp's default, by free memory)
    int32_t main_gpu = 0;

    bool cpu_only() const;
    // "layers 0-1 -> RPC0[127.0.0.1:50052], 2-3 -> RPC1[127.0.0.1:50053], output -> CPU"
    std::string map_text() const;
    // What changes the bits, without host addresses or ports (part of the prefix identity):
    // "cpu" when nothing runs on a device; otherwise the split mode, each layer's device as
    // backend kind + its position among the model's devices of that kind, the output's,
    // the kinds of the devices (a GPU with its model name: an rpc-server's description is
    // only its address), and for row splits the proportions and the main device, e.g.
    // "split=layer layers=0:RPC#0,1-3:RPC#1 output=RPC#1 devices=RPC,RPC".
    std::string identity() const;
};

// The placement of a loaded model (Model::load calls it); the split settings are the ones
// the model was loaded with.
DevicePlacement read_placement(const llama_model* model, SplitMode split_mode,
                               std::vector<float> tensor_split, int32_t main_gpu);

}  // namespace skippy::runtime
