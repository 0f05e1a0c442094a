// ChatTemplate's direct render (runtime/chat_template_direct.h) gives exactly the prompt of
// llama.cpp's full common_chat_templates_apply, for every chat template llama.cpp ships,
// with a SentencePiece and a BPE vocabulary, for conversations with a system prompt, a
// developer message, none, tool calls and results, tools, template kwargs, with and without
// the generation prompt (or both throw).
#include "runtime/chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/model.h"
#include "test_models.h"

namespace skippy::runtime {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kTemplateStride = 8;
#else
constexpr size_t kTemplateStride = 1;
#endif

const Model& spm_model() {
    static std::unique_ptr<Model> model =
        Model::load(testing::tiny_chatml_spm_model("chat-template-direct"));
    return *model;
}

const Model& qwen_model() {
    static std::unique_ptr<Model> model =
        Model::load(testing::tiny_tool_model("chat-template-direct"));
    return *model;
}

struct Case {
    std::string name;
    std::vector<ChatMessage> messages;
    ChatContext context;
};

std::vector<Case> cases() {
    ChatContext tools;
    tools.tools.push_back(
        {"get_weather", "Weather in a city",
         R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"});
    ChatMessage call("assistant", "");
    call.tool_calls.push_back({"call_1", "get_weather", R"({"city":"Oslo"})"});
    ChatMessage result("tool", "cold, -3 C");
    result.tool_call_id = "call_1";
    result.name = "get_weather";
    ChatMessage reasoned("assistant", "It is 4.");
    reasoned.reasoning_content = "2 + 2 = 4";
    ChatContext kwargs;
    kwargs.template_kwargs["custom_flag"] = "true";
    kwargs.enable_thinking = false;
    return {
        {"system first",
         {{"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}},
         {}},
        {"no system", {{"user", "Hi"}, {"assistant", " spaced \n"}, {"user", "<b>x</b>\n"}}, {}},
        {"developer", {{"developer", "Be exact."}, {"user", "2+2?"}}, {}},
        {"one system message", {{"system", "Only this."}}, {}},
        {"reasoning", {{"user", "2+2?"}, reasoned, {"user", "and 3+3?"}}, kwargs},
        {"tool loop",
         {{"system", "Use tools."}, {"user", "Weather in Oslo?"}, call, result},
         tools},
        {"tools, plain chat", {{"user", "Hi"}}, tools},
    };
}

template <typename Render>
std::optional<std::string> rendered(Render&& render) {
    try {
        return render();
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

TEST(ChatTemplateDirect, EveryShippedTemplateRendersAsTheFullPath) {
    const std::vector<std::filesystem::path> all = testing::shipped_chat_templates();
    ASSERT_GT(all.size(), 10u);
    const std::vector<Case> conversations = cases();
    size_t direct = 0;
    size_t tried = 0;
    size_t compared = 0;
    for (size_t i = 0; i < all.size(); i += kTemplateStride) {
        const std::string source = testing::read_text_file(all[i]);
        for (const Model* model : {&spm_model(), &qwen_model()}) {
            std::unique_ptr<ChatTemplate> fast;
            std::unique_ptr<ChatTemplate> full;
            try {
                fast = std::make_unique<ChatTemplate>(*model, source);
                full = std::make_unique<ChatTemplate>(*model, source, false);
            } catch (const std::exception&) {
                continue;
            }
            ++tried;
            EXPECT_FALSE(full->renders_directly());
            if (!fast->renders_directly()) {
                continue;
            }
            ++direct;
            for (const Case& c : conversations) {
                for (const bool generation_prompt : {true, false}) {
                    const auto a = rendered(
                        [&] { return fast->render(c.messages, generation_prompt, c.context); });
                    const auto b = rendered(
                        [&] { return full->render(c.messages, generation_prompt, c.context); });
                    EXPECT_EQ(a, b) << all[i].filename() << ", " << c.name
                                    << (generation_prompt ? ", generation prompt" : "");
                    compared += b.has_value() ? 1 : 0;
                }
            }
        }
    }
    std::printf(
        "[direct render] %zu of %zu template/vocab pairs render directly, %zu prompts "
        "compared\n",
        direct, tried, compared);
    EXPECT_GT(direct, tried / (4 * kTemplateStride));
    EXPECT_GT(compared, direct * 4);
}

TEST(ChatTemplateDirect, TheDefaultChatMLTemplateRendersDirectly) {
    const ChatTemplate tmpl(spm_model());
    EXPECT_TRUE(tmpl.renders_directly());
    const ChatTemplate full(spm_model(), "", false);
    const std::vector<ChatMessage> messages = {{"system", "S"}, {"user", "U"}};
    EXPECT_EQ(tmpl.render(messages, true), full.render(messages, true));
    EXPECT_EQ(tmpl.render(messages, true),
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
              "<|im_start|>assistant\n");
}

}  // namespace
}  // namespace skippy::runtime
