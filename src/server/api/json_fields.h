// Typed access to request JSON fields with OpenAI-style 400 errors that name the field.
// A field whose value is null counts as absent (clients send null for "default").
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
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
void reject_unknown_fields(const nlohmann::json& body, std::span<const FieldRule> rules,
                           const std::string& where = "",
                           std::vector<std::string>* unknown = nullptr);
inline void reject_unknown_fields(const nlohmann::json& body,
                                  std::initializer_list<FieldRule> rules,
                                  const std::string& where = "",
                                  std::vector<std::string>* unknown = nullptr) {
    reject_unknown_fields(body, std::span<const FieldRule>(rules.begin(), rules.size()), where,
                          unknown);
}

// The text of a message's content in any dialect: a string, or an array of text parts.
// A part is an object whose "type" is one of `types`, with "text" and the `ignored` fields
// (FieldUse::Ignored); anything else is a 400 naming the part:
// "'<where>[i]' must be <expected> (<unsupported>)". `special` may take a part first: it
// returns true after appending that part's text to `out`.
struct TextParts {
    std::vector<std::string_view> types;
    std::vector<std::string_view> ignored;
    std::string_view expected;     // "a text block"
    std::string_view unsupported;  // "images and documents are not supported"
    std::string_view array_of;     // "blocks": "must be a string or an array of blocks"
};
using SpecialPart =
    std::function<bool(const nlohmann::json& part, const std::string& where, std::string& out)>;
std::string text_of_parts(const nlohmann::json& content, const std::string& where,
                          const TextParts& rules, const SpecialPart& special = nullptr);

}  // namespace skippy::server
