// rpc-servers on loopback for tests that split a model over devices: llama.cpp's
// `rpc-server` (built by scripts/setup from the same pin, SKIPPY_RPC_SERVER_BIN), started once
// per test process on free 127.0.0.1 ports, registered with runtime::add_rpc_servers, and
// stopped when the process that started them ends (PR_SET_PDEATHSIG).
//
//   const auto& rpc = skippy::testing::loopback_rpc_servers();
//   ASSERT_TRUE(rpc.error.empty()) << rpc.error;
//   options.devices = rpc.devices;  // {"RPC0", "RPC1"}
#pragma once

#include <string>
#include <vector>

namespace skippy::testing {

struct RpcServers {
    std::vector<std::string> endpoints;  // "127.0.0.1:PORT"
    std::vector<std::string> devices;    // their devices' names ("RPC0", "RPC1")
    std::vector<int> pids;
    std::string error;  // why they could not be started (then everything else is empty)
};

// The path of the rpc-server built with skippy's llama.cpp.
std::string rpc_server_binary();

// Two rpc-servers (one compute thread each), started and registered on the first call.
const RpcServers& loopback_rpc_servers();

// Starts one rpc-server on a free loopback port, waits until it accepts connections and
// returns its pid and endpoint (pid -1 and the reason in `endpoint` on failure). It dies with
// the calling thread.
int start_rpc_server(std::string& endpoint);

}  // namespace skippy::testing
