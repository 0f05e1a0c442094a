#include "server/api/json_fields.h"

#include <algorithm>
#include <cmath>

#include "server/api/api_error.h"
#include "server/api/text_output.h"

namespace skippy::server {

using nlohmann::json;

const json* find_field(const json& body, const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) {
        return nullptr;
    }
    return &*it;
}

double number_field(const json& body, const char* name, double fallback, double min, double max) {
    const json* value = find_field(body, name);
    if (value == nullptr) {
        return fallback;
    }
    if (!value->is_number()) {
        throw invalid_request(std::string("'") + name + "' must be a number", name);
    }
    const double v = value->get<double>();
    if (!std::isfinite(v) || v < min || v > max) {
        throw invalid_request(std::string("'") + name + "' must be between " + std::to_string(min) +
                                  " and " + std::to_string(max),
                              name);
    }
    return v;
}

int64_t integer_field(const json& body, const char* name, int64_t fallback, int64_t min,
                      int64_t max) {
    const json* value = find_field(body, name);
    if (value == nullptr) {
        return fallback;
    }
    if (!value->is_number_integer() && !value->is_number_unsigned()) {
        throw invalid_request(std::string("'") + name + "' must be an integer", name);
    }
    if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(max)) {
        throw invalid_request(std::string("'") + name + "' is too large", name);
    }
    const int64_t v = value->get<int64_t>();
    if (v < min || v > max) {
        throw invalid_request(std::string("'") + name + "' must be between " + std::to_string(min) +
                                  " and " + std::to_string(max),
                              name);
    }
    return v;
}

bool bool_field(const json& body, const char* name, bool fallback) {
    const json* value = find_field(body, name);
    if (value == nullptr) {
        return fallback;
    }
    if (!value->is_boolean()) {
        throw invalid_request(std::string("'") + name + "' must be a boolean", name);
    }
    return value->get<bool>();
}

std::string checked_text(const json& value, const std::string& param) {
    if (!value.is_string()) {
        throw invalid_request("'" + param + "' must be a string", param);
    }
    const auto& text = value.get_ref<const std::string&>();
    if (!is_valid_utf8(text)) {
        throw invalid_request("'" + param + "' is not valid UTF-8", param);
    }
    return text;
}

std::string string_field(const json& body, const char* name, const std::string& fallback,
                         const std::string& where) {
    const json* value = find_field(body, name);
    if (value == nullptr) {
        return fallback;
    }
    return checked_text(*value, where.empty() ? std::string(name) : where + "." + name);
}

void reject_unknown_fields(const json& body, std::span<const FieldRule> rules,
                           const std::string& where, std::vector<std::string>* unknown) {
    if (!body.is_object()) {
        return;
    }
    for (const auto& [key, value] : body.items()) {
        if (value.is_null()) {
            continue;
        }
        bool known = false;
        for (const auto& rule : rules) {
            if (rule.name == key) {
                if (rule.use == FieldUse::Rejected) {
                    const std::string param = where.empty() ? key : where + "." + key;
                    throw invalid_request(
                        "Unsupported parameter: '" + param + "' is not supported by this server",
                        param, "unsupported_parameter");
                }
                known = true;
                break;
            }
        }
        if (!known) {
            const std::string param = where.empty() ? key : where + "." + key;
            if (unknown != nullptr) {
                if (std::find(unknown->begin(), unknown->end(), param) == unknown->end()) {
                    unknown->push_back(param);
                }
                continue;
            }
            throw invalid_request(
                "Unsupported parameter: '" + param + "' is not supported by this server", param,
                "unsupported_parameter");
        }
    }
}

std::string text_of_parts(const json& content, const std::string& where, const TextParts& rules,
                          const SpecialPart& special) {
    if (content.is_string()) {
        return checked_text(content, where);
    }
    if (!content.is_array()) {
        throw invalid_request(
            "'" + where + "' must be a string or an array of " + std::string(rules.array_of),
            where);
    }
    std::vector<FieldRule> fields = {{"type", FieldUse::Honored}, {"text", FieldUse::Honored}};
    for (std::string_view name : rules.ignored) {
        fields.push_back({name, FieldUse::Ignored});
    }
    std::string out;
    for (size_t i = 0; i < content.size(); ++i) {
        const json& part = content[i];
        const std::string w = where + "[" + std::to_string(i) + "]";
        if (special && special(part, w, out)) {
            continue;
        }
        const std::string type = part.is_object() ? part.value("type", "") : "";
        if (std::find(rules.types.begin(), rules.types.end(), type) == rules.types.end()) {
            throw invalid_request("'" + w + "' must be " + std::string(rules.expected) + " (" +
                                      std::string(rules.unsupported) + ")",
                                  w);
        }
        reject_unknown_fields(part, fields, w);
        out += checked_text(part.value("text", json("")), w + ".text");
    }
    return out;
}

}  // namespace skippy::server
