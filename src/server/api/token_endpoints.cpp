#include "server/api/token_endpoints.h"

#include <vector>

#include "server/api/api_error.h"
#include "server/api/json_fields.h"
#include "server/api/text_output.h"

namespace skippy::server {

using nlohmann::json;

json tokenize_response(const runtime::Model& model, const json& body, size_t max_content_bytes) {
    if (!body.is_object()) {
        throw invalid_request("request body must be a JSON object");
    }
    reject_unknown_fields(body, {{"content", FieldUse::Honored},
                                 {"add_special", FieldUse::Honored},
                                 {"parse_special", FieldUse::Honored},
                                 {"with_pieces", FieldUse::Honored},
                                 {"model", FieldUse::Ignored}});
    const json* content = find_field(body, "content");
    if (content == nullptr) {
        throw invalid_request("'content' is required", "content");
    }
    const std::string text = checked_text(*content, "content");
    if (text.size() > max_content_bytes) {
        throw invalid_request("'content' is too long", "content");
    }
    const auto tokens = model.tokenize(text, bool_field(body, "add_special", false),
                                       bool_field(body, "parse_special", true));
    json out = json::array();
    if (bool_field(body, "with_pieces", false)) {
        for (const auto t : tokens) {
            out.push_back(json{{"id", t}, {"piece", as_sent_utf8(model.token_to_piece(t, true))}});
        }
    } else {
        out = tokens;
    }
    return json{{"tokens", out}};
}

json detokenize_response(const runtime::Model& model, const json& body) {
    if (!body.is_object()) {
        throw invalid_request("request body must be a JSON object");
    }
    reject_unknown_fields(body, {{"tokens", FieldUse::Honored}, {"model", FieldUse::Ignored}});
    const json* tokens = find_field(body, "tokens");
    if (tokens == nullptr || !tokens->is_array()) {
        throw invalid_request("'tokens' is required and must be an array of token ids", "tokens");
    }
    std::vector<runtime::Token> ids;
    for (const auto& t : *tokens) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model.n_vocab()) {
            throw invalid_request("token id " + t.dump() + " is outside the vocabulary (0.." +
                                      std::to_string(model.n_vocab() - 1) + ")",
                                  "tokens");
        }
        ids.push_back(static_cast<runtime::Token>(t.get<int64_t>()));
    }
    return json{{"content", model.detokenize(ids, true)}};
}

}  // namespace skippy::server
