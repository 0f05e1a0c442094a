// Weight types of generated models: a random model written as F16 and quantized by llama.cpp's
// own quantizer (llama_model_quantize), the path a user's model takes with llama-quantize.
#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <utility>

#include "llama.h"
#include "runtime/factory/model_factory.h"

namespace skippy::runtime {

namespace {

// The llama.cpp file types make-model offers (the imatrix-based IQ types need calibration
// data that random weights do not have).
const std::pair<const char*, llama_ftype> kTypes[] = {
    {"f32", LLAMA_FTYPE_ALL_F32},          {"f16", LLAMA_FTYPE_MOSTLY_F16},
    {"bf16", LLAMA_FTYPE_MOSTLY_BF16},     {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
    {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},     {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M},
    {"q5_k_s", LLAMA_FTYPE_MOSTLY_Q5_K_S}, {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
    {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},     {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
    {"q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S}, {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
    {"q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},     {"q3_k_l", LLAMA_FTYPE_MOSTLY_Q3_K_L},
    {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"q3_k_s", LLAMA_FTYPE_MOSTLY_Q3_K_S},
    {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},
};

}  // namespace

std::vector<std::string> supported_weight_types() {
    std::vector<std::string> out;
    for (const auto& [name, type] : kTypes) {
        out.emplace_back(name);
    }
    return out;
}

bool is_quantized_weight_type(const std::string& type) {
    return !type.empty() && type != "f32" && type != "f16";
}

void quantize_model_file(const std::string& in_path, const std::string& out_path,
                         const std::string& type) {
    const llama_ftype* ftype = nullptr;
    for (const auto& [name, t] : kTypes) {
        if (type == name) {
            ftype = &t;
        }
    }
    if (ftype == nullptr) {
        throw std::runtime_error("make-model: unknown --type '" + type + "'");
    }
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.nthread = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    params.ftype = *ftype;
    if (llama_model_quantize(in_path.c_str(), out_path.c_str(), &params) != 0) {
        std::error_code ec;
        std::filesystem::remove(out_path, ec);
        throw std::runtime_error("make-model: quantizing to " + type + " failed");
    }
}

}  // namespace skippy::runtime
