// Which JSON Schemas skippy can enforce while decoding. Schemas become grammars through
// llama.cpp's json-schema-to-grammar, which silently skips what it cannot express (number
// ranges, uniqueItems, unsupported regex features, a keyword next to one it prefers, ...).
// A schema that must be a guarantee (response_format, tool arguments under tool_choice
// "required" or a named function) is checked here first: any keyword the converter would
// not enforce is a 400 naming its path, never a silent ignore.
//
// Thread safety: stateless functions.
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace skippy::server {

// Throws ApiError (400, param = `param`) when `schema` is not a JSON Schema object.
void check_schema_wellformed(const nlohmann::json& schema, const std::string& param);

// Throws ApiError (400, param = `param`, message naming the schema path) when the schema
// uses a feature the grammar would not enforce. Annotations (title, description, default,
// examples, $comment, ...) are accepted: they do not constrain values.
void check_schema_enforceable(const nlohmann::json& schema, const std::string& param);

}  // namespace skippy::server
