// MessageBoundaryFinder (memoized, O(messages) per turn) against the brute-force definition
// it replaces (one template render per boundary), on several conversations and on every chat
// template shipped in llama.cpp's models/templates/.
#include "server/prompt/message_boundaries.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>

#include "nlohmann/json.hpp"
#include "runtime/factory/model_factory.h"
#include "server/api/openai_request.h"
#include "test_models.h"

namespace skippy::server {
namespace {

using runtime::ChatMessage;
using runtime::Token;

// ---- the reference: the code this finder replaced, kept verbatim in substance ----

size_t reference_common_prefix(const std::vector<Token>& a, const std::vector<Token>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) {
        ++i;
    }
    return i;
}

class ReferenceTextMap {
  public:
    ReferenceTextMap(const runtime::Model& model, const std::vector<Token>& tokens,
                     const std::string& text) {
        ends_.push_back(0);
        std::string pieces;
        for (Token token : tokens) {
            pieces += model.token_to_piece(token, true);
            ends_.push_back(pieces.size());
        }
        if (pieces.size() >= text.size() &&
            pieces.compare(pieces.size() - text.size(), text.size(), text) == 0) {
            lead_ = pieces.size() - text.size();
            valid_ = true;
        }
    }
    bool valid() const { return valid_; }
    size_t tokens_before(size_t offset) const {
        const auto it = std::upper_bound(ends_.begin(), ends_.end(), offset + lead_);
        return static_cast<size_t>(it - ends_.begin()) - 1;
    }

  private:
    std::vector<size_t> ends_;
    size_t lead_ = 0;
    bool valid_ = false;
};

std::vector<int32_t> reference_boundaries(const runtime::Model& model,
                                          const runtime::ChatTemplate& tmpl,
                                          const std::vector<ChatMessage>& messages,
                                          const std::string& prompt,
                                          const std::vector<Token>& tokens, size_t budget) {
    std::vector<int32_t> out;
    const ReferenceTextMap text_map(model, tokens, prompt);
    auto boundary_of = [&](const std::string& head_text) -> size_t {
        if (text_map.valid() && prompt.compare(0, head_text.size(), head_text) == 0) {
            return text_map.tokens_before(head_text.size());
        }
        return reference_common_prefix(model.tokenize(head_text, true, true), tokens);
    };
    constexpr size_t kRenderFixedCost = 16;
    size_t render_cost = 0;
    for (size_t k = 1; k < messages.size(); ++k) {
        render_cost += (k + kRenderFixedCost) * (messages[k].role == "assistant" ? 2 : 1);
        if (render_cost > budget) {
            break;
        }
        const std::vector<ChatMessage> head(messages.begin(),
                                            messages.begin() + static_cast<long>(k));
        const size_t boundary = boundary_of(tmpl.render(head, false));
        if (boundary > 0) {
            out.push_back(static_cast<int32_t>(boundary));
        }
        if (messages[k].role == "assistant") {
            const size_t earlier_end = boundary_of(tmpl.render(head, true));
            if (earlier_end > 0) {
                out.push_back(static_cast<int32_t>(earlier_end));
            }
        }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

// ---- fixtures ----

// Sanitizer builds run every template render 10-30x slower: they check a sample.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kTemplateStride = 12;
constexpr int kTurns = 5;
constexpr size_t kRewritingTemplates = 2;
#else
constexpr size_t kTemplateStride = 1;
constexpr int kTurns = 10;
constexpr size_t kRewritingTemplates = 5;
#endif

const runtime::Model& tiny_llama() {
    static std::unique_ptr<runtime::Model> model =
        runtime::Model::load(testing::tiny_model("llama", "server-boundaries", 5));
    return *model;
}

std::vector<std::vector<ChatMessage>> conversations() {
    const std::string long_text =
        "The quick brown fox jumps over the lazy dog, again and again; numbers 12345 "
        "and symbols <>&\"' and a second line\nwith a tab\tinside.";
    return {
        {{"system", "You are a helpful assistant."},
         {"user", "Hello!"},
         {"assistant", "Hi, how can I help?"},
         {"user", "Tell me a joke."},
         {"assistant", "Why did the chicken cross the road?"},
         {"user", "Why?"}},
        {{"user", "What is 2+2?"},
         {"assistant", "4"},
         {"user", long_text},
         {"assistant", ""},
         {"user", "and again " + long_text}},
        {{"system", "Think step by step."},
         {"user", "Solve x+1=2."},
         {"assistant", "<think>subtract one</think>x = 1"},
         {"user", "Sure?"},
         {"assistant", "<think>check: 1+1=2</think>Yes."},
         {"user", "Thanks, büyük teşekkürler 🎉"}},
        {{"system", "Tools are available."},
         {"user", "Weather in Paris?"},
         {"assistant", "Let me look that up."},
         {"tool", "{\"temperature\": 21}"},
         {"assistant", "It is 21 degrees."},
         {"user", "And tomorrow?"}},
        {{"user", "first"},
         {"user", "second, no reply in between"},
         {"assistant", "ok"},
         {"user", "third"}},
    };
}

struct Rendered {
    std::string prompt;
    std::vector<Token> tokens;
};

Rendered render_prompt(const runtime::Model& model, const runtime::ChatTemplate& tmpl,
                       const std::vector<ChatMessage>& messages) {
    Rendered r;
    r.prompt = tmpl.render(messages, true);
    r.tokens = model.tokenize(r.prompt, true, true);
    return r;
}

constexpr size_t kBudget = 16384;

// Compares the finder with the reference on `messages`, cold then warm (memo filled).
// Returns the number of boundaries (-1 when the template cannot render the conversation).
int expect_same(const runtime::Model& model, const runtime::ChatTemplate& tmpl,
                const MessageBoundaryFinder& finder, const std::vector<ChatMessage>& messages,
                const std::string& what) {
    Rendered r;
    std::vector<int32_t> want;
    bool reference_throws = false;
    try {
        r = render_prompt(model, tmpl, messages);
        want = reference_boundaries(model, tmpl, messages, r.prompt, r.tokens, kBudget);
    } catch (const std::exception&) {
        reference_throws = true;
    }
    if (reference_throws) {
        EXPECT_ANY_THROW({
            r = render_prompt(model, tmpl, messages);
            finder.find(messages, message_keys(messages), r.prompt, r.tokens);
        }) << what;
        return -1;
    }
    const MessageKeys keys = message_keys(messages);
    EXPECT_EQ(finder.find(messages, keys, r.prompt, r.tokens), want) << what << " (cold)";
    EXPECT_EQ(finder.find(messages, keys, r.prompt, r.tokens), want) << what << " (warm)";
    return static_cast<int>(want.size());
}

// ---- tests ----

TEST(MessageBoundaries, SameAsRenderingEveryHeadWithTheModelTemplate) {
    const auto& model = tiny_llama();
    runtime::ChatTemplate tmpl(model);
    MessageBoundaryFinder finder(model, tmpl, kBudget, 1024);
    for (const auto& messages : conversations()) {
        expect_same(model, tmpl, finder, messages, "default template");
    }
}

TEST(MessageBoundaries, SentencePieceSpacePrefixAfterControlTokens) {
    // llama-spm with ChatML's control tokens: the tokenizer adds a space before every text
    // fragment after <|im_start|> / <|im_end|>, which the rendered text does not have. The
    // finder maps such prompts through its piece table (the reference, which cannot, renders
    // and tokenizes every head); the warm pass must take the memo, not render again.
    const auto model = runtime::Model::load(testing::tiny_chatml_spm_model("server-boundaries"));
    ASSERT_EQ(model->n_vocab(), 32002);
    ASSERT_TRUE(model->is_special_token(32001));  // <|im_start|>
    runtime::ChatTemplate tmpl(*model);
    MessageBoundaryFinder finder(*model, tmpl, kBudget, 1024);
    for (const auto& messages : conversations()) {
        const auto before = finder.stats();
        const int n = expect_same(*model, tmpl, finder, messages, "llama-spm-chatml");
        if (n > 0) {
            const auto after = finder.stats();
            EXPECT_GT(after.memo_hits, before.memo_hits) << "the warm pass rendered again";
        }
    }
}

TEST(MessageBoundaries, SameAsRenderingEveryHeadWithEveryShippedTemplate) {
    const auto& model = tiny_llama();
    std::vector<std::filesystem::path> templates;
    const auto all = testing::shipped_chat_templates();
    ASSERT_GT(all.size(), 10u);
    for (size_t i = 0; i < all.size(); i += kTemplateStride) {
        templates.push_back(all[i]);
    }
    size_t usable = 0;
    size_t compared = 0;
    size_t boundaries = 0;
    for (const auto& path : templates) {
        std::unique_ptr<runtime::ChatTemplate> tmpl;
        try {
            tmpl = std::make_unique<runtime::ChatTemplate>(model, testing::read_text_file(path));
        } catch (const std::exception&) {
            continue;  // llama.cpp cannot load it: no boundaries to compare
        }
        ++usable;
        MessageBoundaryFinder finder(model, *tmpl, kBudget, 1024);
        for (const auto& messages : conversations()) {
            const int n = expect_same(model, *tmpl, finder, messages, path.filename().string());
            if (n >= 0) {
                ++compared;
                boundaries += static_cast<size_t>(n);
            }
        }
    }
    std::cout << templates.size() << " templates, " << usable << " loaded, " << compared
              << " conversations rendered, " << boundaries << " boundaries compared\n";
    EXPECT_GT(usable, templates.size() / 2);
    EXPECT_GT(compared, usable * 2);
}

TEST(MessageBoundaries, BudgetCutsOffLongConversationsAtTheSameMessage) {
    const auto& model = tiny_llama();
    runtime::ChatTemplate tmpl(model);
    MessageBoundaryFinder finder(model, tmpl, 200, 1024);
    std::vector<ChatMessage> messages;
    for (int i = 0; i < 24; ++i) {
        messages.push_back({i % 2 == 0 ? "user" : "assistant", "message " + std::to_string(i)});
    }
    const Rendered r = render_prompt(model, tmpl, messages);
    const auto want = reference_boundaries(model, tmpl, messages, r.prompt, r.tokens, 200);
    EXPECT_EQ(finder.find(messages, message_keys(messages), r.prompt, r.tokens), want);
    EXPECT_LT(want.size(), 2 * messages.size() - 3);  // the budget did cut it off
}

TEST(MessageBoundaries, RememberedTextCountsOnlyWhenThePromptStartsWithIt) {
    const auto& model = tiny_llama();
    runtime::ChatTemplate tmpl(model);
    MessageBoundaryFinder finder(model, tmpl, kBudget, 1024);
    const auto messages = conversations()[0];
    const MessageKeys keys = message_keys(messages);
    // A wrong text remembered for every head (as if the template had changed its output).
    for (size_t k = 1; k < messages.size(); ++k) {
        finder.remember(keys[k], false, "something else entirely");
        finder.remember(keys[k], true, "something else entirely");
    }
    const Rendered r = render_prompt(model, tmpl, messages);
    const auto want = reference_boundaries(model, tmpl, messages, r.prompt, r.tokens, kBudget);
    EXPECT_EQ(finder.find(messages, keys, r.prompt, r.tokens), want);
    EXPECT_EQ(finder.stats().memo_hits, 0u);
}

// A chat growing turn by turn through the request parser (which remembers the prompt and
// the end of each turn): every turn's boundaries equal the reference. Returns the most
// renders any turn after the first made.
uint64_t grow_chat(const runtime::Model& model, const runtime::ChatTemplate& tmpl,
                   const std::string& what) {
    RequestLimits limits;
    limits.n_ctx = 1 << 20;
    OpenAiRequestParser parser(model, tmpl, {"m"}, limits);
    std::vector<ChatMessage> messages = {{"system", "You are terse."}};
    uint64_t most_renders = 0;
    for (int turn = 0; turn < kTurns; ++turn) {
        messages.push_back({"user", "question number " + std::to_string(turn)});
        nlohmann::json body = {{"messages", nlohmann::json::array()}};
        for (const auto& m : messages) {
            body["messages"].push_back({{"role", m.role}, {"content", m.content}});
        }
        const auto before = parser.boundaries().stats();
        const ParsedRequest parsed = parser.parse(Endpoint::ChatCompletions, body.dump());
        const auto after = parser.boundaries().stats();
        const Rendered r = render_prompt(model, tmpl, messages);
        EXPECT_EQ(parsed.generation.prompt, r.tokens) << what;
        EXPECT_EQ(parsed.generation.message_boundaries,
                  reference_boundaries(model, tmpl, messages, r.prompt, r.tokens, kBudget))
            << what << " turn " << turn;
        if (turn > 0) {
            most_renders = std::max(most_renders, after.renders - before.renders);
        }
        const std::string reply =
            (turn % 2 == 0 ? "<think>pondering " + std::to_string(turn) + "</think>" : "") +
            "answer " + std::to_string(turn);
        // The scheduler renders the end of the turn for models that run it (hybrid and
        // recurrent); the HTTP handler prepares the next turn after every reply. Every
        // third turn goes without the scheduler's render, as with a dense model.
        if (turn % 3 != 2) {
            // Tokenized from the prompt's head, as a whole tokenization would.
            const auto tokens = parsed.generation.render_turn_end(reply);
            if (!parsed.chat_parser) {  // (else the reply's reasoning is taken apart)
                auto with_reply = messages;
                with_reply.push_back({"assistant", reply});
                EXPECT_EQ(tokens, model.tokenize(tmpl.render(with_reply, false), true, true))
                    << what << " turn " << turn;
            }
        }
        parsed.prepare_next_turn(reply);
        messages.push_back({"assistant", reply});
    }
    return most_renders;
}

// After the first turn, the boundaries of a chat cost no render at all: the previous
// prompt, the previous messages without generation prompt (rendered while the previous
// request ran) and the end of the previous turn are all remembered.
TEST(MessageBoundaries, NextTurnRendersNothingTheMemoHas) {
    const auto& model = tiny_llama();
    runtime::ChatTemplate tmpl(model);
    EXPECT_EQ(grow_chat(model, tmpl, "default template"), 0u);
}

// Templates that rewrite earlier turns (reasoning stripped from older assistant messages),
// print the date, or have channels: the memo never changes the result.
TEST(MessageBoundaries, GrowingChatMatchesTheReferenceOnRewritingTemplates) {
    const auto& model = tiny_llama();
    const auto dir = testing::shipped_chat_templates().front().parent_path();
    const std::vector<std::string> names = {"Qwen-Qwen3-0.6B.jinja", "openai-gpt-oss-120b.jinja",
                                            "meta-llama-Llama-3.1-8B-Instruct.jinja",
                                            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                                            "google-gemma-2-2b-it.jinja"};
    for (size_t i = 0; i < kRewritingTemplates; ++i) {
        const std::string& name = names[i];
        runtime::ChatTemplate tmpl(model, testing::read_text_file(dir / name));
        grow_chat(model, tmpl, name);
    }
}

}  // namespace
}  // namespace skippy::server
