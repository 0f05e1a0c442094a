// The device flags' parsing and what the start-up map and the prefix identity say about a
// placement (runtime/devices.h); no device needed.
#include "runtime/devices.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "runtime/model.h"
#include "test_models.h"

namespace skippy::runtime {
namespace {

DeviceInfo rpc(const std::string& name, const std::string& endpoint) {
    return DeviceInfo{name, endpoint, "RPC", 0, 0};
}

TEST(DevicesTest, FlagsParseAsLlamaServerWrites) {
    EXPECT_EQ(parse_gpu_layers("auto"), kGpuLayersAuto);
    EXPECT_EQ(parse_gpu_layers("all"), kGpuLayersAll);
    EXPECT_EQ(parse_gpu_layers("12"), 12);
    EXPECT_EQ(gpu_layers_name(parse_gpu_layers("0")), "0");
    EXPECT_THROW(parse_gpu_layers("-3"), std::invalid_argument);
    EXPECT_THROW(parse_gpu_layers("many"), std::invalid_argument);
    EXPECT_EQ(parse_tensor_split("3,1"), (std::vector<float>{3, 1}));
    EXPECT_EQ(parse_tensor_split("0.5/0.25/0.25"), (std::vector<float>{0.5f, 0.25f, 0.25f}));
    EXPECT_THROW(parse_tensor_split("3,,1"), std::invalid_argument);
    EXPECT_THROW(parse_tensor_split("-1,1"), std::invalid_argument);
    EXPECT_EQ(parse_split_mode("row"), SplitMode::Row);
    EXPECT_THROW(parse_split_mode("tensor"), std::invalid_argument);
}

TEST(DevicesTest, MapNamesTheDevicesAndTheIdentityOnlyWhatChangesTheBits) {
    DevicePlacement p;
    p.devices = {rpc("RPC0", "10.0.0.5:50052"), rpc("RPC1", "10.0.0.6:50052")};
    p.layers = {"RPC0", "RPC0", "RPC1", "RPC1"};
    p.output = "RPC1";
    p.tensor_split = {1, 1};
    EXPECT_FALSE(p.cpu_only());
    EXPECT_EQ(p.map_text(),
              "layers 0-1 -> RPC0[10.0.0.5:50052], 2-3 -> RPC1[10.0.0.6:50052], "
              "output -> RPC1[10.0.0.6:50052]");
    const std::string id = p.identity();
    EXPECT_EQ(id, "split=layer layers=0-1:RPC#0,2-3:RPC#1 output=RPC#1 devices=RPC,RPC");

    // The same topology on other hosts, ports and device numbers: the same identity.
    DevicePlacement moved = p;
    moved.devices = {rpc("RPC4", "192.168.1.9:6000"), rpc("RPC5", "192.168.1.9:6001")};
    moved.layers = {"RPC4", "RPC4", "RPC5", "RPC5"};
    moved.output = "RPC5";
    EXPECT_EQ(moved.identity(), id);

    // Another split, a CPU layer, a GPU: other identities.
    DevicePlacement other = p;
    other.layers = {"RPC0", "RPC1", "RPC1", "RPC1"};
    EXPECT_NE(other.identity(), id);
    other = p;
    other.layers[0] = "CPU";
    EXPECT_NE(other.identity(), id);
    EXPECT_EQ(other.map_text().rfind("layers 0 -> CPU, 1 -> RPC0[10.0.0.5:50052], ", 0), 0u);
    other = p;
    other.devices[1] = DeviceInfo{"RPC1", "NVIDIA H100 80GB HBM3", "CUDA", 0, 0};
    EXPECT_NE(other.identity(), id);
    EXPECT_NE(other.identity().find("CUDA(NVIDIA H100 80GB HBM3)"), std::string::npos);
}

TEST(DevicesTest, EverythingOnTheCpuKeepsTheIdentityOfBuildsWithoutDevices) {
    DevicePlacement p;
    p.layers = {"CPU", "CPU"};
    EXPECT_TRUE(p.cpu_only());
    EXPECT_EQ(p.identity(), "cpu");
    EXPECT_EQ(p.map_text(), "layers 0-1 -> CPU, output -> CPU");
    // A model loaded with the default options: read from its tensors.
    auto model = Model::load(skippy::testing::tiny_model("qwen35", "devices-test", 3));
    EXPECT_EQ(model->placement().identity(), "cpu");
    EXPECT_EQ(model->placement().map_text(), "layers 0-3 -> CPU, output -> CPU");
    EXPECT_TRUE(model->placement().devices.empty());
}

TEST(DevicesTest, AnUnreachableRpcServerIsNamed) {
    try {
        add_rpc_servers({"127.0.0.1:1"}, std::chrono::milliseconds(2000));
        FAIL() << "no error";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot reach rpc-server 127.0.0.1:1"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(add_rpc_servers({"localhost"}), std::runtime_error);  // no port
}

}  // namespace
}  // namespace skippy::runtime
