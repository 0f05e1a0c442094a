// ApiError: an error answered to the client with an OpenAI-style body:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// `code` is always a string (default_error_code() when the error names none).
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

// The `code` of an error that has no more specific one: always a string (clients such as
// the OpenAI SDKs type it so), one per status.
inline const char* default_error_code(int status) {
    switch (status) {
        case 400:
            return "invalid_request";
        case 401:
            return "invalid_api_key";
        case 403:
            return "permission_denied";
        case 404:
            return "not_found";
        case 405:
            return "method_not_allowed";
        case 408:
            return "request_timeout";
        case 413:
            return "request_too_large";
        case 415:
            return "unsupported_media_type";
        case 429:
            return "rate_limit_exceeded";
        case 431:
            return "request_header_fields_too_large";
        case 500:
            return "internal_error";
        case 503:
            return "server_overloaded";
        default:
            return "error";
    }
}

inline nlohmann::json error_body(int status, const std::string& type, const std::string& message,
                                 const std::string& param = "", const std::string& code = "") {
    nlohmann::json error = {{"message", message}, {"type", type}};
    error["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    error["code"] = code.empty() ? std::string(default_error_code(status)) : code;
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
