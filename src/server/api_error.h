// ApiError: an error answered to the client with an OpenAI-style body:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
#pragma once

#include <stdexcept>
#include <string>

#include "nlohmann/json.hpp"

namespace skippy::server {

struct ApiError : std::runtime_error {
    ApiError(int http_status, std::string error_type, const std::string& message,
             std::string param_name = "", std::string error_code = "")
        : std::runtime_error(message),
          status(http_status),
          type(std::move(error_type)),
          param(std::move(param_name)),
          code(std::move(error_code)) {}
    int status;
    std::string type;
    std::string param;
    std::string code;
};

inline ApiError invalid_request(const std::string& message, const std::string& param = "",
                                const std::string& code = "") {
    return ApiError(400, "invalid_request_error", message, param, code);
}

inline nlohmann::json error_body(int status, const std::string& type, const std::string& message,
                                 const std::string& param = "", const std::string& code = "") {
    nlohmann::json error = {{"message", message}, {"type", type}};
    error["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    if (!code.empty()) {
        error["code"] = code;
    } else {
        error["code"] = status;
    }
    return nlohmann::json{{"error", error}};
}

inline nlohmann::json error_body(const ApiError& e) {
    return error_body(e.status, e.type, e.what(), e.param, e.code);
}

// JSON text that never throws on invalid UTF-8 (replaced with U+FFFD).
inline std::string dump_json(const nlohmann::json& value) {
    return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace skippy::server
