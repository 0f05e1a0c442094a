// Anthropic's context editing (`context_management.edits`, beta context-management-2025-06-27)
// applied to a Messages request before it is rendered, as the API reference defines it:
//
//   clear_thinking_20251015  keep: "all" | {"type": "thinking_turns", "value": N} (default 1):
//                            thinking blocks of all but the last N assistant turns are removed
//                            (a turn: the assistant messages between two user messages that
//                            are not only tool results).
//   clear_tool_uses_20250919 once the prompt passes `trigger` ({"type": "input_tokens" |
//                            "tool_uses", "value"}, default 100000 input tokens), the results
//                            of all but the last `keep` tool uses ({"type": "tool_uses",
//                            "value"}, default 3) are replaced by a placeholder, oldest first,
//                            skipping `exclude_tools`; `clear_tool_inputs` (bool or tool names)
//                            also empties the calls' inputs; with `clear_at_least` ({"type":
//                            "input_tokens", "value"}) nothing is cleared unless that many
//                            tokens would be.
//
// What was applied is reported as the response's context_management.applied_edits.
// Thread safety: stateless functions.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace skippy::server {

// Prompt tokens of a chat completions body (rendered and tokenized as it would be served).
using TokenCounter = std::function<size_t(const nlohmann::json& chat)>;

struct ContextEdits {
    struct ClearThinking {
        std::optional<size_t> keep_turns;  // nullopt: keep all
    };
    struct ClearToolUses {
        bool trigger_on_tool_uses = false;  // false: on input tokens
        size_t trigger = 100000;
        size_t keep = 3;
        size_t clear_at_least = 0;
        std::vector<std::string> exclude_tools;
        bool clear_all_inputs = false;
        std::vector<std::string> clear_inputs_of;
    };
    std::optional<ClearThinking> thinking;
    std::optional<ClearToolUses> tool_uses;
};

// Placeholder that replaces a cleared tool result (Anthropic does not publish its text).
inline constexpr const char* kClearedToolResult = "[tool result cleared to save context]";

// Throws ApiError (400 naming the field) for an edit it does not know or a malformed one.
ContextEdits parse_context_management(const nlohmann::json* value);
// Apply the edits to a chat completions body converted from the request (assistant
// reasoning_content, tool messages and tool_calls), thinking first as the API requires, and
// append an applied_edits entry for each that changed something. `count_tokens` measures
// cleared_input_tokens and the clear_tool_uses trigger; without it tool uses are never
// cleared (and cleared_input_tokens is 0).
void apply_context_edits(const ContextEdits& edits, nlohmann::json& chat,
                         const TokenCounter& count_tokens, nlohmann::json& applied);

}  // namespace skippy::server
