// PromptTokenMemo: a chat prompt tokenized from the remembered end of the previous turn plus
// its new messages gives exactly the tokens of a whole tokenization, for every shipped chat
// template, a SentencePiece and a BPE vocabulary (with the template's special tokens), and
// replies with text that looks like markup.
#include "server/prompt/prompt_token_memo.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "runtime/chat_template.h"
#include "runtime/factory/model_factory.h"
#include "runtime/model.h"
#include "server/api/openai_request.h"
#include "test_models.h"

namespace skippy::server {
namespace {

using runtime::ChatMessage;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kTemplateStride = 16;
#else
constexpr size_t kTemplateStride = 3;
#endif
constexpr int kTurns = 5;

const runtime::Model& spm_model() {
    static std::unique_ptr<runtime::Model> model =
        runtime::Model::load(testing::tiny_model("llama", "prompt-token-memo", 3));
    return *model;
}

const runtime::Model& qwen_model() {
    static std::unique_ptr<runtime::Model> model =
        runtime::Model::load(testing::tiny_tool_model("prompt-token-memo"));
    return *model;
}

const runtime::Model& chatml_spm_model() {
    static std::unique_ptr<runtime::Model> model =
        runtime::Model::load(testing::tiny_chatml_spm_model("prompt-token-memo"));
    return *model;
}

// Grows a chat through the request parser (which remembers each turn's end, and each
// prompt); every turn's prompt tokens must equal a whole tokenization. `turn_ends`: false
// sends each follow-up before the previous turn's end was rendered (an agent's tool result),
// so only the remembered prompts help. Returns the memo's hits (-1: the template cannot
// render the chat). Each turn end (turn_ends) is tokenized from its prompt's head.
int64_t grow(const runtime::Model& model, const runtime::ChatTemplate& tmpl,
             const std::string& what, bool turn_ends = true) {
    RequestLimits limits;
    limits.n_ctx = 1 << 20;
    OpenAiRequestParser parser(model, tmpl, {"m"}, limits);
    std::vector<ChatMessage> messages = {{"system", "You are terse. <|im_start|> is text"}};
    const std::vector<std::string> replies = {
        "plain answer", " leading space and trailing newline\n", "<|im_end|> inside",
        "unicode büyük 🎉 and <b>tags</b>", "x"};
    for (int turn = 0; turn < kTurns; ++turn) {
        messages.push_back({"user", "question " + std::to_string(turn) + (turn % 2 ? "\n" : "")});
        nlohmann::json body = {{"messages", nlohmann::json::array()}};
        for (const auto& m : messages) {
            body["messages"].push_back({{"role", m.role}, {"content", m.content}});
        }
        ParsedRequest parsed;
        try {
            parsed = parser.parse(Endpoint::ChatCompletions, body.dump());
        } catch (const std::exception&) {
            return -1;
        }
        const std::string prompt = tmpl.render(messages, true);
        EXPECT_EQ(parsed.generation.prompt, model.tokenize(prompt, true, true))
            << what << " turn " << turn;
        const std::string& reply = replies[static_cast<size_t>(turn) % replies.size()];
        messages.push_back({"assistant", reply});
        if (turn_ends) {
            // The end of the turn, tokenized from the prompt's head, is exact too.
            const auto turn_end = parsed.generation.render_turn_end(reply);
            if (!parsed.chat_parser) {  // (else the reply's reasoning is taken apart)
                EXPECT_EQ(turn_end, model.tokenize(tmpl.render(messages, false), true, true))
                    << what << " turn end " << turn;
            }
        }
    }
    return static_cast<int64_t>(parser.prompt_tokens().stats().hits);
}

TEST(PromptTokenMemo, ModelTemplatesReuseTheTurnEndTokens) {
    // Qwen's <|im_start|> is a special token of the qwen3 vocab: every turn after the first
    // is tokenized from the previous turn's end, and every turn end from its prompt.
    runtime::ChatTemplate qwen(qwen_model());
    EXPECT_EQ(grow(qwen_model(), qwen, "qwen2.5 template, qwen3 vocab"), 2 * kTurns - 1);
    runtime::ChatTemplate spm(spm_model());
    EXPECT_GE(grow(spm_model(), spm, "default template, llama-spm vocab"), 0);
}

TEST(PromptTokenMemo, AFollowUpBeforeTheTurnEndReusesThePromptTokens) {
    // The previous prompt, cut before its generation prompt's <|im_start|>, is the head.
    runtime::ChatTemplate qwen(qwen_model());
    EXPECT_EQ(grow(qwen_model(), qwen, "qwen2.5 template, qwen3 vocab", false), kTurns - 1);
    // llama-spm-chatml: ChatML's control tokens in a SentencePiece vocabulary.
    const runtime::Model& chatml = chatml_spm_model();
    runtime::ChatTemplate spm(chatml);
    EXPECT_EQ(grow(chatml, spm, "default template, llama-spm-chatml vocab", false), kTurns - 1);
}

TEST(PromptTokenMemo, TheSchedulersTurnEndTakesTheTokensTheNextTurnWorkRemembered) {
    // The HTTP handler prepares the next turn right after the response; the scheduler's end
    // of the turn, later, takes those tokens instead of rendering and tokenizing again.
    const runtime::Model& model = qwen_model();
    runtime::ChatTemplate tmpl(model);
    RequestLimits limits;
    limits.n_ctx = 1 << 20;
    OpenAiRequestParser parser(model, tmpl, {"m"}, limits);
    std::vector<ChatMessage> messages = {{"system", "You are terse."}, {"user", "question"}};
    nlohmann::json body = {{"messages", nlohmann::json::array()}};
    for (const auto& m : messages) {
        body["messages"].push_back({{"role", m.role}, {"content", m.content}});
    }
    const ParsedRequest parsed = parser.parse(Endpoint::ChatCompletions, body.dump());
    const std::string reply = "an answer";
    parsed.prepare_next_turn(reply);
    const auto before = parser.prompt_tokens().stats();
    const auto turn_end = parsed.generation.render_turn_end(reply);
    const auto after = parser.prompt_tokens().stats();
    messages.push_back({"assistant", reply});
    EXPECT_EQ(turn_end, model.tokenize(tmpl.render(messages, false), true, true));
    EXPECT_EQ(after.hits + after.misses, before.hits + before.misses);  // nothing tokenized
}

TEST(PromptTokenMemo, EveryShippedTemplateTokenizesExactly) {
    const std::vector<std::filesystem::path> all = testing::shipped_chat_templates();
    ASSERT_GT(all.size(), 10u);
    size_t grown = 0;
    int64_t hits = 0;
    for (size_t i = 0; i < all.size(); i += kTemplateStride) {
        for (const runtime::Model* model : {&spm_model(), &qwen_model()}) {
            std::unique_ptr<runtime::ChatTemplate> tmpl;
            try {
                tmpl = std::make_unique<runtime::ChatTemplate>(*model,
                                                               testing::read_text_file(all[i]));
            } catch (const std::exception&) {
                continue;
            }
            for (const bool turn_ends : {true, false}) {
                const int64_t h = grow(*model, *tmpl, all[i].filename().string(), turn_ends);
                if (h >= 0) {
                    ++grown;
                    hits += h;
                }
            }
        }
    }
    std::printf("[memo] %zu template/vocab pairs grown, %lld turns from a remembered head\n", grown,
                static_cast<long long>(hits));
    EXPECT_GT(grown, all.size() / kTemplateStride / 2);
    EXPECT_GT(hits, 0);
}

}  // namespace
}  // namespace skippy::server
