#include "runtime/devices.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <utility>

#include "ggml-backend.h"
#include "ggml-rpc.h"
#include "ggml.h"
#include "llama.h"
#include "runtime/model.h"

extern "C" void ggml_print_backtrace(void);  // ggml.c (not in its public headers)
// llama.cpp internals with C++ linkage, defined in libllama (llama-ext.h, llama-model.h at
// the pin): the model's devices, and its tensors by name (each tensor's buffer names the
// device it was loaded to; llama.h does not expose the layer -> device assignment).
int32_t llama_model_n_devices(const llama_model* model);
ggml_backend_dev_t llama_model_get_device(const llama_model* model, int i);
const std::vector<std::pair<std::string, ggml_tensor*>>& llama_internal_get_tensor_map(
    const llama_model* model);

namespace skippy::runtime {

namespace {

using Clock = std::chrono::steady_clock;

// ---- endpoints and sockets --------------------------------------------------------------

struct Endpoint {
    std::string host;
    int port = 0;
};

// "host:port" as llama.cpp's RPC client parses it (the first ':' splits; IPv4 or a name).
Endpoint parse_endpoint(const std::string& text) {
    const auto colon = text.find(':');
    Endpoint e;
    if (colon == std::string::npos || colon == 0 ||
        text.find(':', colon + 1) != std::string::npos) {
        throw std::runtime_error("--rpc: '" + text + "' is not HOST:PORT");
    }
    e.host = text.substr(0, colon);
    const std::string port = text.substr(colon + 1);
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || end == nullptr || *end != '\0' || p < 1 || p > 65535) {
        throw std::runtime_error("--rpc: '" + text + "' has no valid port");
    }
    e.port = static_cast<int>(p);
    return e;
}

class Fd {
  public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) {
            ::close(fd_);
        }
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }

  private:
    int fd_;
};

int remaining_ms(Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left > 0 ? static_cast<int>(left) : 0;
}

// A TCP connection to `e` within the deadline (non-blocking connect + poll); -1 and `why`
// on failure. (A host name is resolved first, without a bound on the resolver's time.)
int connect_within(const Endpoint& e, Clock::time_point deadline, std::string& why) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(e.port));
    if (::inet_pton(AF_INET, e.host.c_str(), &addr.sin_addr) != 1) {
        addrinfo hints{};
        hints.ai_family = AF_INET;  // the RPC client resolves IPv4 only (gethostbyname)
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* res = nullptr;
        if (::getaddrinfo(e.host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
            why = "cannot resolve host '" + e.host + "'";
            return -1;
        }
        addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
        ::freeaddrinfo(res);
    }
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        why = std::string("socket: ") + std::strerror(errno);
        return -1;
    }
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        if (errno != EINPROGRESS) {
            why = std::strerror(errno);
            ::close(fd);
            return -1;
        }
        pollfd p{fd, POLLOUT, 0};
        const int n = ::poll(&p, 1, remaining_ms(deadline));
        int err = 0;
        socklen_t len = sizeof err;
        if (n <= 0) {
            why = "no answer to the connect within the timeout";
            ::close(fd);
            return -1;
        }
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
            why = std::strerror(err != 0 ? err : errno);
            ::close(fd);
            return -1;
        }
    }
    return fd;
}

bool io_within(int fd, bool write, uint8_t* data, size_t size, Clock::time_point deadline) {
    size_t done = 0;
    while (done < size) {
        const ssize_t n = write ? ::send(fd, data + done, size - done, MSG_NOSIGNAL)
                                : ::recv(fd, data + done, size - done, 0);
        if (n > 0) {
            done += static_cast<size_t>(n);
            continue;
        }
        if (n == 0 && !write) {
            return false;  // closed
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return false;
        }
        pollfd p{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
        if (::poll(&p, 1, remaining_ms(deadline)) <= 0) {
            return false;
        }
    }
    return true;
}

// The RPC protocol's HELLO (ggml-rpc.cpp at the pin: cmd 14, the 24 bytes of transport
// capabilities; the answer: version major, minor, patch, padding, capabilities). Zero
// capabilities ask for plain TCP. Throws with the reason when `endpoint` is not an
// rpc-server of this protocol that answers within the timeout.
void check_rpc_server(const std::string& endpoint, std::chrono::milliseconds timeout) {
    constexpr uint8_t kCmdHello = 14;
    constexpr size_t kCapsSize = 24;
    const Endpoint e = parse_endpoint(endpoint);
    const auto deadline = Clock::now() + timeout;
    std::string why;
    const Fd fd(connect_within(e, deadline, why));
    const std::string start_it = " (start it there with `rpc-server -H <address> -p " +
                                 std::to_string(e.port) + "`, on a private network only)";
    if (fd.get() < 0) {
        throw std::runtime_error("cannot reach rpc-server " + endpoint + ": " + why + start_it);
    }
    std::array<uint8_t, 1 + 8 + kCapsSize> hello{};
    hello[0] = kCmdHello;
    const uint64_t size = kCapsSize;
    std::memcpy(hello.data() + 1, &size, sizeof size);
    std::array<uint8_t, 8 + 4 + kCapsSize> answer{};
    if (!io_within(fd.get(), true, hello.data(), hello.size(), deadline) ||
        !io_within(fd.get(), false, answer.data(), answer.size(), deadline)) {
        throw std::runtime_error(
            "rpc-server " + endpoint + " accepted the connection but did not answer within " +
            std::to_string(timeout.count()) +
            " ms: not an rpc-server, or one busy with another client (an rpc-server serves one "
            "client at a time)");
    }
    uint64_t answer_size = 0;
    std::memcpy(&answer_size, answer.data(), sizeof answer_size);
    const uint8_t major = answer[8];
    if (answer_size != 4 + kCapsSize || major != RPC_PROTO_MAJOR_VERSION ||
        answer[9] > RPC_PROTO_MINOR_VERSION) {
        throw std::runtime_error("rpc-server " + endpoint + " speaks RPC protocol " +
                                 std::to_string(major) + "." + std::to_string(answer[9]) +
                                 ", this build " + std::to_string(RPC_PROTO_MAJOR_VERSION) + "." +
                                 std::to_string(RPC_PROTO_MINOR_VERSION) +
                                 " (run the rpc-server built with this skippy: "
                                 "scripts/setup installs it next to llama-server)");
    }
}

// ---- a lost connection while serving ----------------------------------------------------

// The registered endpoints, for the abort handler (fixed storage read without a lock: it
// runs on whichever thread llama.cpp aborts in, possibly while another registers).
constexpr size_t kMaxEndpoints = GGML_RPC_MAX_SERVERS;
std::array<std::array<char, 256>, kMaxEndpoints> g_endpoints{};
std::atomic<size_t> g_n_endpoints{0};
std::atomic<int> g_connecting{-1};  // index of the endpoint being registered, or -1

void on_ggml_abort(const char* message) {
    // Every abort of llama.cpp's RPC client comes from ggml-rpc.cpp (file:line: message).
    const bool rpc = std::strstr(message, "ggml-rpc.cpp") != nullptr;
    if (!rpc) {
        // What ggml prints without a handler; then it aborts.
        std::fprintf(stderr, "%s\n", message);
        ggml_print_backtrace();
        return;
    }
    const int connecting = g_connecting.load();
    if (connecting >= 0) {
        std::fprintf(stderr, "skippy: cannot connect to rpc-server %s (llama.cpp: %s)\n",
                     g_endpoints[static_cast<size_t>(connecting)].data(), message);
        std::fflush(stderr);
        ::_exit(1);
    }
    // Which rpc-server went away: the ones that refuse a connection now (the others still
    // serve this process, so they accept into their backlog).
    std::string gone;
    const size_t n = g_n_endpoints.load();
    for (size_t i = 0; i < n; ++i) {
        std::string why;
        try {
            const Endpoint e = parse_endpoint(g_endpoints[i].data());
            const Fd fd(connect_within(e, Clock::now() + std::chrono::milliseconds(500), why));
            if (fd.get() >= 0) {
                continue;
            }
        } catch (...) {
        }
        gone += (gone.empty() ? "" : ", ") + std::string(g_endpoints[i].data());
    }
    if (gone.empty()) {
        for (size_t i = 0; i < n; ++i) {
            gone += (i == 0 ? "one of " : ", ") + std::string(g_endpoints[i].data());
        }
    }
    const char* short_message = std::strstr(message, "ggml-rpc.cpp");  // without the path
    std::fprintf(stderr,
                 "skippy: rpc-server %s went away (llama.cpp's RPC client: %s); exiting with "
                 "status %d. Restart the rpc-server, then skippy with the same --cache-dir: "
                 "the disk tier keeps every committed entry.\n",
                 gone.c_str(), short_message != nullptr ? short_message : message,
                 kRpcLostExitCode);
    std::fflush(stderr);
    ::_exit(kRpcLostExitCode);
}

std::string trim_float(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
    return buf;
}

DeviceInfo describe(ggml_backend_dev_t dev) {
    DeviceInfo d;
    d.name = ggml_backend_dev_name(dev);
    d.description = ggml_backend_dev_description(dev);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    d.kind = reg != nullptr ? ggml_backend_reg_name(reg) : d.name;
    size_t free = 0;
    size_t total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    d.free_bytes = free;
    d.total_bytes = total;
    return d;
}

}  // namespace

int32_t parse_gpu_layers(const std::string& value) {
    if (value == "auto") return kGpuLayersAuto;
    if (value == "all") return kGpuLayersAll;
    char* end = nullptr;
    const long n = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || end == nullptr || *end != '\0' || n < 0 || n > 100000) {
        throw std::invalid_argument("gpu layers must be auto, all or a count >= 0, got '" + value +
                                    "'");
    }
    return static_cast<int32_t>(n);
}

std::string gpu_layers_name(int32_t n_gpu_layers) {
    if (n_gpu_layers == kGpuLayersAuto) return "auto";
    if (n_gpu_layers < 0) return "all";
    return std::to_string(n_gpu_layers);
}

SplitMode parse_split_mode(const std::string& value) {
    if (value == "none") return SplitMode::None;
    if (value == "layer") return SplitMode::Layer;
    if (value == "row") return SplitMode::Row;
    throw std::invalid_argument("split mode must be none, layer or row");
}

const char* split_mode_name(SplitMode mode) {
    switch (mode) {
        case SplitMode::None:
            return "none";
        case SplitMode::Layer:
            return "layer";
        case SplitMode::Row:
            return "row";
    }
    return "?";
}

std::vector<float> parse_tensor_split(const std::string& value) {
    std::vector<float> out;
    size_t start = 0;
    while (start <= value.size()) {
        const size_t end = value.find_first_of(",/", start);
        const std::string part =
            value.substr(start, end == std::string::npos ? std::string::npos : end - start);
        char* stop = nullptr;
        const float f = std::strtof(part.c_str(), &stop);
        if (part.empty() || stop == nullptr || *stop != '\0' || !(f >= 0.0f) || f > 1e9f) {
            throw std::invalid_argument("tensor split must be proportions >= 0 like 3,1, got '" +
                                        value + "'");
        }
        out.push_back(f);
        if (end == std::string::npos) {
            break;
        }
        start = end + 1;
    }
    if (out.size() > llama_max_devices()) {
        throw std::invalid_argument("tensor split names " + std::to_string(out.size()) +
                                    " devices, this build supports " +
                                    std::to_string(llama_max_devices()));
    }
    return out;
}

std::string DeviceInfo::label() const {
    return kind == "CPU" || description.empty() ? name : name + "[" + description + "]";
}

std::vector<DeviceInfo> available_devices() {
    ensure_backend_initialized();
    std::vector<DeviceInfo> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        if (type == GGML_BACKEND_DEVICE_TYPE_CPU || type == GGML_BACKEND_DEVICE_TYPE_ACCEL) {
            continue;
        }
        out.push_back(describe(dev));
    }
    return out;
}

std::vector<std::string> add_rpc_servers(const std::vector<std::string>& endpoints,
                                         std::chrono::milliseconds connect_timeout) {
    ensure_backend_initialized();
    std::signal(SIGPIPE, SIG_IGN);
    static std::mutex mutex;
    const std::lock_guard<std::mutex> lock(mutex);
    ggml_backend_reg_t rpc_reg = ggml_backend_reg_by_name("RPC");
    if (rpc_reg == nullptr) {
        throw std::runtime_error(
            "--rpc: this build of llama.cpp has no RPC backend "
            "(scripts/setup builds it with GGML_RPC=ON)");
    }
    using AddServer = ggml_backend_reg_t (*)(const char* endpoint);
    auto add_server = reinterpret_cast<AddServer>(
        ggml_backend_reg_get_proc_address(rpc_reg, "ggml_backend_rpc_add_server"));
    if (add_server == nullptr) {
        throw std::runtime_error(
            "--rpc: llama.cpp's RPC backend lacks ggml_backend_rpc_add_server");
    }
    // Every endpoint answers before any is registered: a wrong list changes nothing.
    for (const auto& endpoint : endpoints) {
        check_rpc_server(endpoint, connect_timeout);
    }
    std::vector<std::string> names;
    ggml_set_abort_callback(on_ggml_abort);
    for (const auto& endpoint : endpoints) {
        size_t index = g_n_endpoints.load();
        for (size_t i = 0; i < g_n_endpoints.load(); ++i) {
            if (endpoint == g_endpoints[i].data()) {
                index = i;
            }
        }
        if (index == g_n_endpoints.load()) {
            if (index >= kMaxEndpoints || endpoint.size() >= g_endpoints[index].size()) {
                throw std::runtime_error("--rpc: at most " + std::to_string(kMaxEndpoints) +
                                         " rpc-servers");
            }
            std::snprintf(g_endpoints[index].data(), g_endpoints[index].size(), "%s",
                          endpoint.c_str());
            g_n_endpoints.store(index + 1);
        }
        g_connecting.store(static_cast<int>(index));
        ggml_backend_reg_t reg = add_server(endpoint.c_str());  // connects (aborts on failure)
        g_connecting.store(-1);
        if (reg == nullptr) {
            throw std::runtime_error("rpc-server " + endpoint + " reports no devices");
        }
        // ggml_backend_register would list a server added twice twice.
        bool known = false;
        for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
            known = known || ggml_backend_reg_get(i) == reg;
        }
        if (!known) {
            ggml_backend_register(reg);
        }
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
            names.emplace_back(ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i)));
        }
    }
    return names;
}

bool DevicePlacement::cpu_only() const {
    if (output != "CPU") {
        return false;
    }
    for (const auto& l : layers) {
        if (l != "CPU") {
            return false;
        }
    }
    return true;
}

namespace {

// Each name of a '+'-joined list ("RPC0+CPU") replaced by its value in `names_to`, when it
// has one.
std::string rename_each(const std::string& names,
                        const std::map<std::string, std::string>& names_to) {
    std::string out;
    size_t start = 0;
    while (start <= names.size()) {
        const size_t end = names.find('+', start);
        const std::string name = names.substr(start, end == std::string::npos ? end : end - start);
        const auto it = names_to.find(name);
        out += (out.empty() ? "" : "+") + (it != names_to.end() ? it->second : name);
        if (end == std::string::npos) {
            break;
        }
        start = end + 1;
    }
    return out;
}

}  // namespace

std::string DevicePlacement::map_text() const {
    std::map<std::string, std::string> labels;
    for (const auto& d : devices) {
        labels[d.name] = d.label();
    }
    // "RPC0+CPU" -> "RPC0[127.0.0.1:50052]+CPU"
    auto label = [&](const std::string& names) { return rename_each(names, labels); };
    std::string out = "layers ";
    for (size_t i = 0; i < layers.size();) {
        size_t j = i;
        while (j + 1 < layers.size() && layers[j + 1] == layers[i]) {
            ++j;
        }
        out += (i == 0 ? "" : ", ") + std::to_string(i) + (j > i ? "-" + std::to_string(j) : "") +
               " -> " + label(layers[i]);
        i = j + 1;
    }
    out += std::string(layers.empty() ? "" : ", ") + "output -> " + label(output);
    return out;
}

std::string DevicePlacement::identity() const {
    if (cpu_only()) {
        return "cpu";  // what every build without devices has always named
    }
    // Each device as KIND#i, i its position among the model's devices of that kind: the
    // addresses of rpc-servers and the numbering of devices across processes stay out.
    std::map<std::string, std::string> tag;
    std::map<std::string, int> per_kind;
    std::string kinds;
    for (const auto& d : devices) {
        tag[d.name] = d.kind + "#" + std::to_string(per_kind[d.kind]++);
        kinds += (kinds.empty() ? "" : ",") + d.kind;
        if (d.kind != "RPC" && !d.description.empty()) {
            kinds += "(" + d.description + ")";  // a GPU's model; an rpc-server's is its address
        }
    }
    auto as_tag = [&](const std::string& names) { return rename_each(names, tag); };
    std::string out = std::string("split=") + split_mode_name(split_mode) + " layers=";
    for (size_t i = 0; i < layers.size();) {
        size_t j = i;
        while (j + 1 < layers.size() && layers[j + 1] == layers[i]) {
            ++j;
        }
        out += (i == 0 ? "" : ",") + std::to_string(i) + (j > i ? "-" + std::to_string(j) : "") +
               ":" + as_tag(layers[i]);
        i = j + 1;
    }
    out += " output=" + as_tag(output) + " devices=" + kinds;
    if (split_mode == SplitMode::Row) {
        // Rows of each matrix spread by these proportions; intermediate results on main.
        std::string ts;
        for (const float f : tensor_split) {
            ts += (ts.empty() ? "" : ",") + trim_float(f);
        }
        out += " tensor_split=" + (ts.empty() ? std::string("memory") : ts) +
               " main=" + std::to_string(main_gpu);
    }
    return out;
}

DevicePlacement read_placement(const llama_model* model, SplitMode split_mode,
                               std::vector<float> tensor_split, int32_t main_gpu) {
    DevicePlacement p;
    p.split_mode = split_mode;
    p.tensor_split = std::move(tensor_split);
    p.main_gpu = main_gpu;
    for (int32_t i = 0; i < llama_model_n_devices(model); ++i) {
        if (ggml_backend_dev_t dev = llama_model_get_device(model, i)) {
            p.devices.push_back(describe(dev));
        }
    }
    const auto n_layer = static_cast<size_t>(std::max(0, llama_model_n_layer(model)));
    std::vector<std::set<std::string>> layer_devices(n_layer);
    std::set<std::string> output_devices;
    for (const auto& [name, tensor] : llama_internal_get_tensor_map(model)) {
        if (tensor == nullptr || tensor->buffer == nullptr) {
            continue;
        }
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(tensor->buffer);
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        // Host buffers (the CPU's, a GPU backend's pinned host memory) are the CPU's.
        const std::string where = dev == nullptr || ggml_backend_buft_is_host(buft) ||
                                          ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU
                                      ? std::string("CPU")
                                      : std::string(ggml_backend_dev_name(dev));
        if (name.rfind("blk.", 0) == 0) {
            const size_t il = std::strtoul(name.c_str() + 4, nullptr, 10);
            if (il < n_layer) {
                layer_devices[il].insert(where);
            }
        } else if (name.rfind("output", 0) == 0 ||
                   (name.rfind("token_embd", 0) == 0 && where != "CPU")) {
            // (The input embeddings always stay on the CPU; a copy elsewhere is a tied
            // output head.)
            output_devices.insert(where);
        }
    }
    auto join = [](const std::set<std::string>& where) {
        std::string out;
        for (const auto& d : where) {
            if (d != "CPU") {
                out += (out.empty() ? "" : "+") + d;
            }
        }
        if (where.count("CPU") > 0 || out.empty()) {
            out += out.empty() ? "CPU" : "+CPU";
        }
        return out;
    };
    for (const auto& where : layer_devices) {
        p.layers.push_back(join(where));
    }
    p.output = join(output_devices);
    return p;
}

}  // namespace skippy::runtime
