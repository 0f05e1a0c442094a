// Typed access to request JSON fields with OpenAI-style 400 errors that name the field.
// A field whose value is null counts as absent (clients send null for "default").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace skippy::server {

// The field's value, or nullptr when it is absent or null.
const nlohmann::json* find_field(const nlohmann::json& body, const char* name);
double number_field(const nlohmann::json& body, const char* name, double fallback, double min,
                    double max);
int64_t integer_field(const nlohmann::json& body, const char* name, int64_t fallback, int64_t min,
                      int64_t max);
bool bool_field(const nlohmann::json& body, const char* name, bool fallback);
// A string that must be valid UTF-8; `param` names it in the error.
std::string checked_text(const nlohmann::json& value, const std::string& param);
std::string string_field(const nlohmann::json& body, const char* name, const std::string& fallback,
                         const std::string& where = "");

// How the request parser treats a field it knows.
enum class FieldUse {
    Honored,   // changes the output as specified
    Ignored,   // accepted, cannot change the output (metadata, store, user, ...)
    Rejected,  // would change the output and cannot be honoured here: 400 naming it
};
struct FieldRule {
    std::string_view name;
    FieldUse use;
};
// Rejects (400, naming it) the first non-null field of `body` that `rules` do not list.
// `where` prefixes the field's name in the error ("" for the body itself). With `unknown`,
// such fields are accepted instead and their names (prefixed by `where`) appended to it:
// the request body's top level, where a client's next release may add fields that change
// nothing here (DESIGN.md, API policy: accepted and reported).
void reject_unknown_fields(const nlohmann::json& body, std::initializer_list<FieldRule> rules,
                           const std::string& where = "",
                           std::vector<std::string>* unknown = nullptr);

}  // namespace skippy::server
