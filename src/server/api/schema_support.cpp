#include "server/api/schema_support.h"

#include <algorithm>
#include <set>
#include <vector>

#include "runtime/chat_template.h"
#include "server/api/api_error.h"

namespace skippy::server {

using nlohmann::json;

namespace {

const std::set<std::string>& annotation_keywords() {
    static const std::set<std::string> k = {"title",    "description", "default",  "examples",
                                            "$schema",  "$id",         "$comment", "deprecated",
                                            "readOnly", "writeOnly",   "$anchor"};
    return k;
}

const std::set<std::string>& primitive_types() {
    static const std::set<std::string> t = {"string", "number", "integer", "boolean",
                                            "object", "array",  "null"};
    return t;
}

const std::set<std::string>& supported_formats() {
    static const std::set<std::string> f = {"date",  "time",  "date-time", "uuid", "uuid1",
                                            "uuid2", "uuid3", "uuid4",     "uuid5"};
    return f;
}

class Checker {
  public:
    Checker(const json& root, std::string param) : root_(root), param_(std::move(param)) {}

    void check(const json& schema, const std::string& path, int depth) {
        if (depth > 64) {
            fail(path, "nests deeper than 64 levels");
        }
        if (!schema.is_object()) {
            fail(path, "must be a JSON Schema object");
        }
        for (const char* defs : {"$defs", "definitions"}) {
            if (const auto it = schema.find(defs); it != schema.end()) {
                if (!it->is_object()) {
                    fail(path + "/" + defs, "must be an object of schemas");
                }
                for (const auto& [name, sub] : it->items()) {
                    check(sub, path + "/" + defs + "/" + name, depth + 1);
                }
            }
        }
        std::set<std::string> used = {"$defs", "definitions"};
        used.insert(annotation_keywords().begin(), annotation_keywords().end());
        // The converter's order of preference: the first branch that applies takes the
        // schema; keywords it does not read are not enforced.
        if (schema.contains("$ref")) {
            check_ref(schema.at("$ref"), path);
            used.insert("$ref");
        } else if (schema.contains("oneOf")) {
            fail(path, "uses 'oneOf', which cannot be enforced (use 'anyOf')");
        } else if (schema.contains("anyOf")) {
            const json& alts = schema.at("anyOf");
            if (!alts.is_array() || alts.empty()) {
                fail(path + "/anyOf", "must be a non-empty array of schemas");
            }
            for (size_t i = 0; i < alts.size(); ++i) {
                check(alts[i], path + "/anyOf/" + std::to_string(i), depth + 1);
            }
            used.insert("anyOf");
        } else if (schema.contains("type") && schema.at("type").is_array()) {
            const json& types = schema.at("type");
            if (types.empty()) {
                fail(path + "/type", "must not be empty");
            }
            std::set<std::string> all_used;
            for (const auto& t : types) {
                json copy = schema;
                copy["type"] = t;
                const auto branch_used = check_typed(copy, path, depth, /*enforce_unused=*/false);
                all_used.insert(branch_used.begin(), branch_used.end());
            }
            used.insert(all_used.begin(), all_used.end());
        } else {
            const auto branch_used = check_typed(schema, path, depth, true);
            used.insert(branch_used.begin(), branch_used.end());
        }
        for (const auto& [key, value] : schema.items()) {
            if (!used.contains(key)) {
                fail(path, "uses '" + key + "', which cannot be enforced here");
            }
        }
    }

  private:
    [[noreturn]] void fail(const std::string& path, const std::string& what) const {
        throw invalid_request(
            "'" + param_ + "': schema " + (path.empty() ? "#" : path) + " " + what, param_,
            "unsupported_schema");
    }

    void check_ref(const json& ref, const std::string& path) {
        if (!ref.is_string()) {
            fail(path + "/$ref", "must be a string");
        }
        const std::string target = ref.get<std::string>();
        if (target.rfind("#", 0) != 0) {
            fail(path + "/$ref", "'" + target + "' is not a local reference (#/...)");
        }
        // Walk the JSON pointer.
        const json* node = &root_;
        size_t pos = 1;
        while (pos < target.size()) {
            if (target[pos] != '/') {
                fail(path + "/$ref", "'" + target + "' is not a JSON pointer");
            }
            const size_t next = target.find('/', pos + 1);
            const std::string part = target.substr(
                pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
            if (!node->is_object() || !node->contains(part)) {
                fail(path + "/$ref", "'" + target + "' does not resolve");
            }
            node = &node->at(part);
            pos = next == std::string::npos ? target.size() : next;
        }
    }

    void check_int(const json& schema, const char* key, const std::string& path) {
        if (schema.contains(key) && !schema.at(key).is_number_integer() &&
            !schema.at(key).is_number_unsigned()) {
            fail(path + "/" + key, "must be an integer");
        }
    }

    void check_count(const json& schema, const char* key, const std::string& path) {
        if (schema.contains(key)) {
            const json& v = schema.at(key);
            if (!(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) ||
                v.get<int64_t>() > 100000) {
                fail(path + "/" + key, "must be an integer in [0, 100000]");
            }
        }
    }

    // The keywords the converter reads for a schema whose "type" is absent or one string.
    std::set<std::string> check_typed(const json& schema, const std::string& path, int depth,
                                      bool enforce_unused) {
        std::set<std::string> used;
        std::string type;
        if (schema.contains("type")) {
            const json& t = schema.at("type");
            if (!t.is_string() || !primitive_types().contains(t.get<std::string>())) {
                fail(path + "/type",
                     "must be one of string, number, integer, boolean, object, "
                     "array, null");
            }
            type = t.get<std::string>();
            used.insert("type");
        }
        const auto has = [&](const char* key) { return schema.contains(key); };
        if (has("const")) {
            used.insert("const");
            return used;
        }
        if (has("enum")) {
            if (!schema.at("enum").is_array() || schema.at("enum").empty()) {
                fail(path + "/enum", "must be a non-empty array");
            }
            used.insert("enum");
            return used;
        }
        const bool object_like = type.empty() || type == "object";
        if (object_like && (has("properties") || (has("additionalProperties") &&
                                                  schema.at("additionalProperties") != true))) {
            std::set<std::string> names;
            if (has("properties")) {
                const json& props = schema.at("properties");
                if (!props.is_object()) {
                    fail(path + "/properties", "must be an object of schemas");
                }
                for (const auto& [name, sub] : props.items()) {
                    check(sub, path + "/properties/" + name, depth + 1);
                    names.insert(name);
                }
            }
            if (has("required")) {
                const json& req = schema.at("required");
                if (!req.is_array()) {
                    fail(path + "/required", "must be an array of property names");
                }
                for (const auto& name : req) {
                    if (!name.is_string() || !names.contains(name.get<std::string>())) {
                        fail(path + "/required",
                             "names " + name.dump() + ", which is not in 'properties'");
                    }
                }
            }
            if (has("additionalProperties")) {
                const json& extra = schema.at("additionalProperties");
                if (!extra.is_boolean()) {
                    check(extra, path + "/additionalProperties", depth + 1);
                }
            }
            used.insert({"properties", "required", "additionalProperties"});
            return used;
        }
        if (has("allOf")) {
            fail(path, "uses 'allOf', which cannot be enforced");
        }
        const bool array_like = type.empty() || type == "array";
        if (array_like && (has("items") || has("prefixItems"))) {
            const json& items = has("items") ? schema.at("items") : schema.at("prefixItems");
            const std::string key = has("items") ? "items" : "prefixItems";
            if (items.is_array()) {
                for (size_t i = 0; i < items.size(); ++i) {
                    check(items[i], path + "/" + key + "/" + std::to_string(i), depth + 1);
                }
                used.insert(key);  // a tuple: minItems/maxItems are not read
            } else {
                check(items, path + "/" + key, depth + 1);
                check_count(schema, "minItems", path);
                check_count(schema, "maxItems", path);
                used.insert({key, "minItems", "maxItems"});
            }
            return used;
        }
        const bool string_like = type.empty() || type == "string";
        if (string_like && has("pattern")) {
            const json& pattern = schema.at("pattern");
            if (!pattern.is_string()) {
                fail(path + "/pattern", "must be a string");
            }
            if (!runtime::json_schema_pattern_supported(pattern.get<std::string>())) {
                fail(path + "/pattern",
                     "'" + pattern.get<std::string>() +
                         "' uses regular expression features that cannot be enforced (it must "
                         "be anchored with ^...$, without lookarounds, backreferences or "
                         "anchors inside)");
            }
            used.insert("pattern");
            return used;
        }
        if (string_like && has("format")) {
            const json& format = schema.at("format");
            if (!format.is_string() || !supported_formats().contains(format.get<std::string>())) {
                fail(path + "/format", "'" + format.dump() +
                                           "' cannot be enforced (supported: date, time, "
                                           "date-time, uuid)");
            }
            used.insert("format");
            return used;
        }
        if (type == "string" && (has("minLength") || has("maxLength"))) {
            check_count(schema, "minLength", path);
            check_count(schema, "maxLength", path);
            used.insert({"minLength", "maxLength"});
            return used;
        }
        if (type == "integer" && (has("minimum") || has("maximum") || has("exclusiveMinimum") ||
                                  has("exclusiveMaximum"))) {
            for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
                check_int(schema, key, path);
            }
            used.insert({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"});
            return used;
        }
        if (!enforce_unused) {
            // One type of a type list: keywords of the other types are theirs.
            static const std::set<std::string> by_type = {
                "properties", "required",         "additionalProperties",
                "items",      "prefixItems",      "minItems",
                "maxItems",   "pattern",          "format",
                "minLength",  "maxLength",        "minimum",
                "maximum",    "exclusiveMinimum", "exclusiveMaximum"};
            for (const auto& key : by_type) {
                if (has(key.c_str()) && !keyword_applies(key, type)) {
                    used.insert(key);
                }
            }
        }
        return used;
    }

    static bool keyword_applies(const std::string& key, const std::string& type) {
        if (key == "properties" || key == "required" || key == "additionalProperties") {
            return type == "object";
        }
        if (key == "items" || key == "prefixItems" || key == "minItems" || key == "maxItems") {
            return type == "array";
        }
        if (key == "pattern" || key == "format" || key == "minLength" || key == "maxLength") {
            return type == "string";
        }
        return type == "integer" || type == "number";
    }

    const json& root_;
    std::string param_;
};

}  // namespace

namespace {

// Nesting depth of a JSON value (the grammar converter recurses once per level).
size_t json_depth(const json& value, size_t limit) {
    if (limit == 0 || (!value.is_object() && !value.is_array())) {
        return 0;
    }
    size_t deepest = 0;
    for (const auto& item : value) {
        deepest = std::max(deepest, json_depth(item, limit - 1));
    }
    return deepest + 1;
}

}  // namespace

void check_schema_wellformed(const json& schema, const std::string& param) {
    if (!schema.is_object()) {
        throw invalid_request("'" + param + "' must be a JSON Schema object", param);
    }
    constexpr size_t kMaxDepth = 128;
    if (json_depth(schema, kMaxDepth + 1) > kMaxDepth) {
        throw invalid_request(
            "'" + param + "' nests deeper than " + std::to_string(kMaxDepth) + " levels", param);
    }
    if (const auto it = schema.find("type"); it != schema.end()) {
        const auto valid_type = [](const json& t) {
            return t.is_string() && primitive_types().contains(t.get<std::string>());
        };
        bool ok = valid_type(*it);
        if (it->is_array()) {
            ok = !it->empty() && std::all_of(it->begin(), it->end(), valid_type);
        }
        if (!ok) {
            throw invalid_request("'" + param + "' has an invalid 'type' " + it->dump(), param);
        }
    }
    if (const auto it = schema.find("properties"); it != schema.end() && !it->is_object()) {
        throw invalid_request("'" + param + ".properties' must be an object", param);
    }
    if (const auto it = schema.find("required"); it != schema.end() && !it->is_array()) {
        throw invalid_request("'" + param + ".required' must be an array", param);
    }
}

void check_schema_enforceable(const json& schema, const std::string& param) {
    Checker checker(schema, param);
    checker.check(schema, "", 0);
}

}  // namespace skippy::server
