#include "server/api/anthropic_context.h"

#include <algorithm>

#include "server/api/api_error.h"
#include "server/api/json_fields.h"

namespace skippy::server {

using nlohmann::json;

namespace {

// {"type": <type>, "value": N} with N >= min; `where` names it in errors.
size_t typed_count(const json& value, const char* type, const std::string& where, size_t min) {
    if (!value.is_object() || value.value("type", "") != type) {
        throw invalid_request("'" + where + "' must be {\"type\": \"" + type + "\", \"value\": N}",
                              where);
    }
    return static_cast<size_t>(
        integer_field(value, "value", 0, static_cast<int64_t>(min), int64_t{1} << 40));
}

std::vector<std::string> name_list(const json& value, const std::string& where) {
    if (!value.is_array()) {
        throw invalid_request("'" + where + "' must be an array of tool names", where);
    }
    std::vector<std::string> names;
    for (const auto& name : value) {
        names.push_back(checked_text(name, where));
    }
    return names;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

size_t tokens_cleared(const TokenCounter& count, size_t before, const json& chat) {
    if (!count) {
        return 0;
    }
    const size_t after = count(chat);
    return before > after ? before - after : 0;
}

// Indices of the assistant turns: each assistant message's turn number (a user message
// that is not only tool results starts a new turn), -1 for other messages.
std::vector<int> assistant_turns(const json& messages, int& n_turns) {
    std::vector<int> turn(messages.size(), -1);
    n_turns = 0;
    bool in_turn = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string role = messages[i].value("role", "");
        if (role == "user") {
            in_turn = false;
        } else if (role == "assistant") {
            if (!in_turn) {
                ++n_turns;
                in_turn = true;
            }
            turn[i] = n_turns - 1;
        }
    }
    return turn;
}

void clear_thinking(const ContextEdits::ClearThinking& edit, json& chat, const TokenCounter& count,
                    json& applied) {
    if (!edit.keep_turns) {
        return;  // keep: all
    }
    json& messages = chat["messages"];
    int n_turns = 0;
    const std::vector<int> turn = assistant_turns(messages, n_turns);
    const int first_kept = n_turns - static_cast<int>(*edit.keep_turns);
    std::vector<int> cleared_turns;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (turn[i] >= 0 && turn[i] < first_kept && messages[i].contains("reasoning_content")) {
            if (cleared_turns.empty() || cleared_turns.back() != turn[i]) {
                cleared_turns.push_back(turn[i]);
            }
        }
    }
    if (cleared_turns.empty()) {
        return;
    }
    const size_t before = count ? count(chat) : 0;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (turn[i] >= 0 && turn[i] < first_kept) {
            messages[i].erase("reasoning_content");
        }
    }
    applied.push_back(json{{"type", "clear_thinking_20251015"},
                           {"cleared_thinking_turns", cleared_turns.size()},
                           {"cleared_input_tokens", tokens_cleared(count, before, chat)}});
}

void clear_tool_uses(const ContextEdits::ClearToolUses& edit, json& chat, const TokenCounter& count,
                     json& applied) {
    if (!count) {
        return;
    }
    json& messages = chat["messages"];
    // Tool uses in order: (assistant message, call index, call id, tool name).
    struct Use {
        size_t message;
        size_t call;
        std::string id;
        std::string name;
    };
    std::vector<Use> uses;
    for (size_t i = 0; i < messages.size(); ++i) {
        const json& m = messages[i];
        if (m.value("role", "") != "assistant" || !m.contains("tool_calls")) {
            continue;
        }
        for (size_t c = 0; c < m["tool_calls"].size(); ++c) {
            const json& call = m["tool_calls"][c];
            uses.push_back(Use{
                i, c, call.value("id", ""),
                call.contains("function") ? call["function"].value("name", "") : std::string()});
        }
    }
    const size_t before = count(chat);
    const size_t measure = edit.trigger_on_tool_uses ? uses.size() : before;
    if (measure <= edit.trigger || uses.size() <= edit.keep) {
        return;
    }
    json edited = chat;
    json& edited_messages = edited["messages"];
    size_t cleared = 0;
    for (size_t u = 0; u + edit.keep < uses.size(); ++u) {
        const Use& use = uses[u];
        if (contains(edit.exclude_tools, use.name)) {
            continue;
        }
        bool changed = false;
        for (json& m : edited_messages) {
            if (m.value("role", "") == "tool" && m.value("tool_call_id", "") == use.id &&
                m.value("content", json("")) != kClearedToolResult) {
                m["content"] = kClearedToolResult;
                changed = true;
            }
        }
        if (edit.clear_all_inputs || contains(edit.clear_inputs_of, use.name)) {
            json& args = edited_messages[use.message]["tool_calls"][use.call]["function"];
            if (args.value("arguments", "") != "{}") {
                args["arguments"] = "{}";
                changed = true;
            }
        }
        cleared += changed ? 1 : 0;
    }
    if (cleared == 0) {
        return;
    }
    const size_t freed = tokens_cleared(count, before, edited);
    if (freed < edit.clear_at_least) {
        return;  // it would not clear enough: nothing is applied
    }
    chat = std::move(edited);
    applied.push_back(json{{"type", "clear_tool_uses_20250919"},
                           {"cleared_tool_uses", cleared},
                           {"cleared_input_tokens", freed}});
}

}  // namespace

ContextEdits parse_context_management(const json* value) {
    ContextEdits out;
    if (value == nullptr) {
        return out;
    }
    if (!value->is_object()) {
        throw invalid_request("'context_management' must be an object", "context_management");
    }
    reject_unknown_fields(*value, {{"edits", FieldUse::Honored}}, "context_management");
    const json* edits = find_field(*value, "edits");
    if (edits == nullptr) {
        return out;
    }
    if (!edits->is_array()) {
        throw invalid_request("'context_management.edits' must be an array",
                              "context_management.edits");
    }
    for (size_t i = 0; i < edits->size(); ++i) {
        const json& e = (*edits)[i];
        const std::string w = "context_management.edits[" + std::to_string(i) + "]";
        if (!e.is_object()) {
            throw invalid_request("'" + w + "' must be an object", w);
        }
        const std::string type = string_field(e, "type", "", w);
        if (type == "clear_thinking_20251015") {
            if (out.thinking || out.tool_uses) {
                throw invalid_request(
                    "'" + w + "': clear_thinking_20251015 must come first and only once", w);
            }
            reject_unknown_fields(e, {{"type", FieldUse::Honored}, {"keep", FieldUse::Honored}}, w);
            ContextEdits::ClearThinking edit;
            edit.keep_turns = 1;
            if (const json* keep = find_field(e, "keep")) {
                if (*keep == "all" || (keep->is_object() && keep->value("type", "") == "all")) {
                    edit.keep_turns.reset();
                } else {
                    edit.keep_turns = typed_count(*keep, "thinking_turns", w + ".keep", 1);
                }
            }
            out.thinking = edit;
        } else if (type == "clear_tool_uses_20250919") {
            if (out.tool_uses) {
                throw invalid_request("'" + w + "': clear_tool_uses_20250919 given twice", w);
            }
            reject_unknown_fields(e,
                                  {{"type", FieldUse::Honored},
                                   {"trigger", FieldUse::Honored},
                                   {"keep", FieldUse::Honored},
                                   {"clear_at_least", FieldUse::Honored},
                                   {"exclude_tools", FieldUse::Honored},
                                   {"clear_tool_inputs", FieldUse::Honored}},
                                  w);
            ContextEdits::ClearToolUses edit;
            if (const json* trigger = find_field(e, "trigger")) {
                edit.trigger_on_tool_uses =
                    trigger->is_object() && trigger->value("type", "") == "tool_uses";
                edit.trigger =
                    typed_count(*trigger, edit.trigger_on_tool_uses ? "tool_uses" : "input_tokens",
                                w + ".trigger", 1);
            }
            if (const json* keep = find_field(e, "keep")) {
                edit.keep = typed_count(*keep, "tool_uses", w + ".keep", 0);
            }
            if (const json* least = find_field(e, "clear_at_least")) {
                edit.clear_at_least = typed_count(*least, "input_tokens", w + ".clear_at_least", 0);
            }
            if (const json* exclude = find_field(e, "exclude_tools")) {
                edit.exclude_tools = name_list(*exclude, w + ".exclude_tools");
            }
            if (const json* inputs = find_field(e, "clear_tool_inputs")) {
                if (inputs->is_boolean()) {
                    edit.clear_all_inputs = inputs->get<bool>();
                } else {
                    edit.clear_inputs_of = name_list(*inputs, w + ".clear_tool_inputs");
                }
            }
            out.tool_uses = edit;
        } else {
            throw invalid_request("'" + w + ".type' '" + type +
                                      "' is not supported (clear_thinking_20251015, "
                                      "clear_tool_uses_20250919)",
                                  w + ".type");
        }
    }
    return out;
}

void apply_context_edits(const ContextEdits& edits, json& chat, const TokenCounter& count_tokens,
                         json& applied) {
    if (edits.thinking) {
        clear_thinking(*edits.thinking, chat, count_tokens, applied);
    }
    if (edits.tool_uses) {
        clear_tool_uses(*edits.tool_uses, chat, count_tokens, applied);
    }
}

}  // namespace skippy::server
