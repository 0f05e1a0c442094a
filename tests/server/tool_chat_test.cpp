// Tool calling through the chat layer with a tiny tool-capable model (Qwen2.5 template, Qwen
// tokenizer): prompts with tools render the same whichever tool_choice constrains them,
// required/named/parallel grammars, the streamed reply accumulator, and the cache's chat
// positions in a tool loop (message boundaries equal the brute-force reference, and each
// turn's end, rendered with its tool calls, is a prefix of the next request's prompt).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "nlohmann/json.hpp"
#include "runtime/chat_template.h"
#include "runtime/factory/model_factory.h"
#include "runtime/model.h"
#include "server/api/api_error.h"
#include "server/api/chat_reply.h"
#include "server/api/openai_request.h"
#include "server/api/schema_support.h"
#include "test_models.h"

namespace skippy::server {
namespace {

using nlohmann::json;
using runtime::ChatMessage;
using runtime::Token;

const runtime::Model& tool_model() {
    static std::unique_ptr<runtime::Model> model =
        runtime::Model::load(skippy::testing::tiny_tool_model("tool-chat"));
    return *model;
}

const runtime::ChatTemplate& tool_template() {
    static runtime::ChatTemplate tmpl(tool_model());
    return tmpl;
}

const char* kWeatherSchema =
    R"({"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]}},)"
    R"("required":["city"],"additionalProperties":false})";

runtime::ChatContext tools_context() {
    runtime::ChatContext ctx;
    ctx.tools.push_back({"get_weather", "Weather in a city", kWeatherSchema});
    ctx.tools.push_back(
        {"search", "Search", R"({"type":"object","properties":{"q":{"type":"string"}}})"});
    return ctx;
}

std::vector<ChatMessage> ask() { return {{"system", "Use tools."}, {"user", "Weather in Paris?"}}; }

TEST(ToolChat, TemplateSupportsTools) {
    EXPECT_TRUE(tool_template().supports_tool_calls());
    EXPECT_EQ(tool_model().tokenize("<tool_call>", false, true).size(), 1u);
}

TEST(ToolChat, PromptDoesNotDependOnTheConstraints) {
    const auto& tmpl = tool_template();
    const auto ctx = tools_context();
    const std::string rendered = tmpl.render(ask(), true, ctx);
    EXPECT_NE(rendered.find("get_weather"), std::string::npos);
    for (const auto choice :
         {runtime::ToolChoice::Auto, runtime::ToolChoice::None, runtime::ToolChoice::Required}) {
        for (const char* forced : {"", "search"}) {
            runtime::ChatConstraints c;
            c.tool_choice = choice;
            c.forced_tool = forced;
            EXPECT_EQ(tmpl.apply(ask(), ctx, c).prompt, rendered);
        }
    }
}

TEST(ToolChat, RequiredGrammarAllowsNoTextAndNamedKnowsOnlyItsTool) {
    const auto& tmpl = tool_template();
    runtime::ChatConstraints c;
    c.tool_choice = runtime::ToolChoice::Required;
    const auto required = tmpl.apply(ask(), tools_context(), c);
    ASSERT_FALSE(required.grammar.empty());
    EXPECT_FALSE(required.grammar_lazy);
    const auto root = required.grammar.substr(required.grammar.find("root ::="));
    EXPECT_EQ(root.substr(0, root.find('\n')).find("until-"), std::string::npos) << root;
    // The generation prompt (already at the end of the prompt) is not in the grammar.
    EXPECT_EQ(root.find("<|im_start|>"), std::string::npos) << root;
    EXPECT_TRUE(required.grammar_prefill.empty());
    EXPECT_NE(required.grammar.find("tool-search"), std::string::npos);

    c.forced_tool = "get_weather";
    c.parallel_tool_calls = false;
    const auto named = tmpl.apply(ask(), tools_context(), c);
    EXPECT_EQ(named.grammar.find("tool-search"), std::string::npos);
    EXPECT_NE(named.grammar.find("tool-get-weather"), std::string::npos);
    EXPECT_NE(named.grammar.find("tool-calls ::= tool-call space\n"), std::string::npos)
        << named.grammar;

    runtime::ChatConstraints autoc;
    const auto lazy = tmpl.apply(ask(), tools_context(), autoc);
    EXPECT_TRUE(lazy.grammar_lazy);
    EXPECT_FALSE(lazy.trigger_tokens.empty() && lazy.trigger_patterns.empty());
    EXPECT_TRUE(lazy.grammar_prefill.empty());
}

const std::string kReply =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
    "\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"umbrella\"}}\n</tool_call>";

std::shared_ptr<const runtime::ChatOutputParser> auto_parser() {
    runtime::ChatConstraints c;
    c.parallel_tool_calls = true;
    return tool_template().apply(ask(), tools_context(), c).parser;
}

TEST(ToolChat, ParserFindsTheCalls) {
    const auto reply = parse_reply(auto_parser().get(), kReply, "call_x_");
    ASSERT_EQ(reply.tool_calls.size(), 2u);
    EXPECT_EQ(reply.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(reply.tool_calls[0].arguments), json::parse(R"({"city":"Paris"})"));
    EXPECT_EQ(reply.tool_calls[0].id, "call_x_0");
    EXPECT_EQ(reply.tool_calls[1].id, "call_x_1");
    EXPECT_TRUE(reply.content.empty());
    // Plain text stays content.
    EXPECT_EQ(parse_reply(auto_parser().get(), "just text", "c").content, "just text");
}

// Streaming one byte at a time reports exactly the final message, announces each call once
// with its full name, and the blocks open and close in order.
TEST(ToolChat, AccumulatorStreamsTheFinalMessage) {
    for (const std::string& text : {kReply, std::string("Let me check.") + kReply}) {
        ReplyAccumulator acc(auto_parser(), "call_y_");
        ReplyBlocks blocks;
        std::string content;
        std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
        std::vector<BlockEvent> events;
        const auto take = [&](const std::vector<ReplyDelta>& deltas) {
            for (const auto& d : deltas) {
                switch (d.kind) {
                    case ReplyDelta::Kind::Content:
                        content += d.text;
                        break;
                    case ReplyDelta::Kind::Reasoning:
                        break;
                    case ReplyDelta::Kind::ToolCallStart:
                        ASSERT_EQ(d.index, calls.size());
                        EXPECT_EQ(d.id, "call_y_" + std::to_string(d.index));
                        calls.emplace_back(d.name, "");
                        break;
                    case ReplyDelta::Kind::ToolCallArguments:
                        ASSERT_LT(d.index, calls.size());
                        calls[d.index].second += d.text;
                        break;
                }
            }
            auto e = blocks.add(deltas);
            events.insert(events.end(), e.begin(), e.end());
        };
        for (const char c : text) {
            take(acc.append(std::string(1, c)));
        }
        take(acc.finish());
        auto closing = blocks.close();
        events.insert(events.end(), closing.begin(), closing.end());
        const auto& final_reply = acc.reply();
        EXPECT_EQ(content, final_reply.content);
        ASSERT_EQ(calls.size(), final_reply.tool_calls.size());
        for (size_t i = 0; i < calls.size(); ++i) {
            EXPECT_EQ(calls[i].first, final_reply.tool_calls[i].name);
            EXPECT_EQ(calls[i].second, final_reply.tool_calls[i].arguments);
        }
        // Open/Close pairs in order, one block open at a time.
        size_t open = 0;
        size_t opened = 0;
        for (const auto& e : events) {
            if (e.type == BlockEvent::Type::Open) {
                EXPECT_EQ(open, 0u);
                EXPECT_EQ(e.block, opened++);
                ++open;
            } else if (e.type == BlockEvent::Type::Close) {
                EXPECT_EQ(open, 1u);
                --open;
            }
        }
        EXPECT_EQ(open, 0u);
        EXPECT_EQ(opened, final_reply.tool_calls.size() + (final_reply.content.empty() ? 0 : 1));
    }
}

// The brute-force boundary definition (message_boundaries.h), with the tools context.
std::vector<int32_t> reference_boundaries(const std::vector<ChatMessage>& messages,
                                          const runtime::ChatContext& ctx,
                                          const std::vector<Token>& tokens) {
    const auto& model = tool_model();
    std::vector<int32_t> out;
    auto boundary_of = [&](const std::string& text) {
        // The prompt's tokens that end at or before the head's text (the head is a prefix
        // here), else the common prefix of the tokenizations.
        const auto head = model.tokenize(text, true, true);
        size_t i = 0;
        while (i < head.size() && i < tokens.size() && head[i] == tokens[i]) {
            ++i;
        }
        return i;
    };
    for (size_t k = 1; k < messages.size(); ++k) {
        const std::vector<ChatMessage> head(messages.begin(),
                                            messages.begin() + static_cast<long>(k));
        if (const size_t b = boundary_of(tool_template().render(head, false, ctx)); b > 0) {
            out.push_back(static_cast<int32_t>(b));
        }
        if (messages[k].role == "assistant") {
            if (const size_t b = boundary_of(tool_template().render(head, true, ctx)); b > 0) {
                out.push_back(static_cast<int32_t>(b));
            }
        }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

json tools_json() {
    return json::array(
        {json{{"type", "function"},
              {"function", {{"name", "get_weather"}, {"parameters", json::parse(kWeatherSchema)}}}},
         json{{"type", "function"},
              {"function",
               {{"name", "search"},
                {"parameters",
                 json::parse(R"({"type":"object","properties":{"q":{"type":"string"}}})")}}}}});
}

// A tool loop through the request parser: every turn's boundaries equal the reference, and
// the end of each turn (the reply with its tool calls, as the next request renders it) is a
// prefix of the next request's prompt: the state recorded there is what the next turn hits.
TEST(ToolChat, ToolLoopTurnEndsArePrefixesOfTheNextPrompt) {
    RequestLimits limits;
    limits.n_ctx = 1 << 16;
    OpenAiRequestParser parser(tool_model(), tool_template(), {"m"}, limits);
    json messages = json::array({json{{"role", "system"}, {"content", "Use tools."}},
                                 json{{"role", "user"}, {"content", "Weather in Paris?"}}});
    std::vector<Token> turn_end;
    for (int turn = 0; turn < 4; ++turn) {
        const json body = {{"messages", messages},
                           {"tools", tools_json()},
                           {"tool_choice", "required"},
                           {"parallel_tool_calls", true}};
        const ParsedRequest parsed = parser.parse(Endpoint::ChatCompletions, body.dump());
        const auto& prompt = parsed.generation.prompt;
        if (!turn_end.empty()) {
            ASSERT_LT(turn_end.size(), prompt.size());
            EXPECT_TRUE(std::equal(turn_end.begin(), turn_end.end(), prompt.begin()))
                << "turn " << turn;
        }
        std::vector<ChatMessage> parsed_messages = parser.parse_messages(messages);
        const auto context = parse_chat_options(body, ChatLimits{}).context;
        EXPECT_EQ(parsed.generation.message_boundaries,
                  reference_boundaries(parsed_messages, context, prompt))
            << "turn " << turn;
        // The model "answers" with calls; the client sends them back with results.
        const std::string reply = turn % 2 == 0 ? kReply : kReply.substr(0, kReply.find("\n<tool"));
        turn_end = parsed.generation.render_turn_end(reply);
        const auto calls = parse_reply(parsed.chat_parser.get(), reply, parsed.tool_call_id_base);
        json tool_calls = json::array();
        for (const auto& call : calls.tool_calls) {
            tool_calls.push_back(
                json{{"id", call.id},
                     {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        messages.push_back(
            json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", tool_calls}});
        for (const auto& call : calls.tool_calls) {
            messages.push_back(json{{"role", "tool"},
                                    {"tool_call_id", call.id},
                                    {"content", "result of " + call.name}});
        }
    }
}

// A reasoning template (Qwen3: <think> blocks): reasoning_content is parsed out of the reply,
// enable_thinking reaches the template, and the turn end renders the reply as the client
// sends it back (content and calls, no reasoning).
TEST(ReasoningTemplate, ReasoningIsSeparatedAndKwargsReachTheTemplate) {
    runtime::ChatTemplate qwen3(tool_model(), runtime::chat_template_text("Qwen-Qwen3-0.6B"));
    EXPECT_TRUE(qwen3.supports_thinking());
    runtime::ChatContext ctx;
    runtime::ChatConstraints c;
    const auto p = qwen3.apply(ask(), ctx, c);
    const auto reply =
        parse_reply(p.parser.get(), "<think>\nweighing it\n</think>\n\nIt is sunny.", "c");
    EXPECT_EQ(reply.reasoning_content.substr(0, 11), "weighing it");
    EXPECT_EQ(reply.content, "It is sunny.");
    runtime::ChatContext no_think;
    no_think.enable_thinking = false;
    no_think.template_kwargs["enable_thinking"] = "false";
    const std::string off = qwen3.apply(ask(), no_think, c).prompt;
    EXPECT_NE(off, p.prompt);
    EXPECT_NE(off.find("<think>\n\n</think>"), std::string::npos) << off;

    RequestLimits limits;
    limits.n_ctx = 1 << 16;
    OpenAiRequestParser parser(tool_model(), qwen3, {"m"}, limits);
    const json messages = json::array({json{{"role", "user"}, {"content", "Weather?"}}});
    const auto parsed =
        parser.parse(Endpoint::ChatCompletions, json{{"messages", messages}}.dump());
    ASSERT_NE(parsed.chat_parser, nullptr);
    const auto turn_end = parsed.generation.render_turn_end("<think>\nhmm\n</think>\n\nSunny.");
    // The client sends the content back without the reasoning: so does the turn end. (This
    // template rewrites an assistant turn once a user message follows it, so the next
    // request's hit lands on the last unchanged message boundary instead.)
    const std::string text = tool_model().detokenize(turn_end, true);
    EXPECT_EQ(text.find("hmm"), std::string::npos) << text;
    EXPECT_NE(text.find("Sunny."), std::string::npos) << text;
}

TEST(SchemaSupport, AcceptsWhatTheGrammarEnforces) {
    for (
        const char* text : {
            R"({"type":"object","properties":{"a":{"type":"string","maxLength":3}},"required":["a"],"additionalProperties":false})",
            R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":1,"maxItems":3})",
            R"({"anyOf":[{"type":"string"},{"type":"null"}]})",
            R"({"type":["string","null"],"maxLength":4})",
            R"({"$defs":{"p":{"type":"object","properties":{"n":{"$ref":"#/$defs/p"}}}},"$ref":"#/$defs/p"})",
            R"({"type":"string","pattern":"^[a-z]+(-[a-z]+)*$","description":"slug"})",
            R"({"type":"string","format":"date-time"})",
            R"({"enum":["a","b",1]})",
            R"({"type":"object"})",
            R"({})",
        }) {
        EXPECT_NO_THROW(check_schema_enforceable(json::parse(text), "s")) << text;
    }
}

TEST(SchemaSupport, RejectsWhatItWouldSkip) {
    for (const char* text : {
             R"({"type":"number","minimum":0})",
             R"({"type":"integer","multipleOf":2})",
             R"({"oneOf":[{"type":"string"}]})",
             R"({"allOf":[{"type":"string"}]})",
             R"({"type":"array","items":{"type":"string"},"uniqueItems":true})",
             R"({"type":"object","properties":{"a":{}},"required":["b"]})",
             R"({"type":"object","properties":{},"minProperties":1})",
             R"({"type":"string","format":"email"})",
             R"({"type":"string","pattern":"(?=x)x"})",
             R"({"type":"string","pattern":"abc"})",
             R"({"type":"string","pattern":"^a$","maxLength":2})",
             R"({"$ref":"http://example.com/x.json"})",
             R"({"$ref":"#/$defs/missing"})",
             R"({"type":"strung"})",
             R"({"type":"array","minItems":2})",
             R"({"not":{"type":"string"}})",
         }) {
        try {
            check_schema_enforceable(json::parse(text), "s");
            ADD_FAILURE() << "accepted " << text;
        } catch (const ApiError& e) {
            EXPECT_EQ(e.status, 400);
            EXPECT_EQ(e.param, "s");
            EXPECT_EQ(e.code, "unsupported_schema");
        }
    }
}

}  // namespace
}  // namespace skippy::server
