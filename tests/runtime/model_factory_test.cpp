#include "runtime/factory/model_factory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "greedy_probe.h"

namespace skippy::runtime {
namespace {

namespace fs = std::filesystem;

// Tiny but complete models: 2-4 layers, n_embd 128 (the 32000-token embedding dominates).
ModelSpec tiny_spec(const std::string& arch) {
    ModelSpec spec;
    spec.arch = arch;
    spec.n_layer = arch == "qwen35" ? 4 : 2;  // qwen35: 3 gated-delta-net layers + 1 attention
    spec.n_embd = 128;
    spec.n_head = 2;
    spec.n_head_kv = arch == "llama" ? 1 : 2;  // llama: exercise GQA
    spec.n_ff = 256;
    spec.seed = 42;
    return spec;
}

// One thread: ctest runs test processes in parallel and llama.cpp's workers spin.
GreedyProbeOptions probe_options() {
    GreedyProbeOptions o;
    o.n_ctx = 256;
    o.n_threads = 1;
    return o;
}

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class ModelFactoryTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = fs::path(::testing::TempDir()) /
               ("skippy-model-factory-" + std::to_string(static_cast<long>(::getpid())));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    static void TearDownTestSuite() {
        std::error_code ec;
        fs::remove_all(dir_, ec);
        models_.clear();
    }

    // Generates (once per suite) the tiny model for `arch`.
    static const std::string& model_for(const std::string& arch) {
        auto it = models_.find(arch);
        if (it == models_.end()) {
            const std::string path = (dir_ / (arch + ".gguf")).string();
            make_random_model(tiny_spec(arch), path);
            it = models_.emplace(arch, path).first;
        }
        return it->second;
    }

    static fs::path dir_;
    static std::map<std::string, std::string> models_;
};

fs::path ModelFactoryTest::dir_;
std::map<std::string, std::string> ModelFactoryTest::models_;

TEST_F(ModelFactoryTest, SupportedArchs) {
    const auto archs = supported_model_archs();
    for (const char* a : {"llama", "qwen35", "mamba2"}) {
        EXPECT_NE(std::find(archs.begin(), archs.end(), a), archs.end()) << a;
    }
}

TEST_F(ModelFactoryTest, VocabPath) {
    const std::string path = vocab_gguf_path("llama-spm");
    EXPECT_TRUE(fs::is_regular_file(path)) << path;
    EXPECT_NE(path.find("ggml-vocab-llama-spm.gguf"), std::string::npos);
    EXPECT_THROW(vocab_gguf_path("no-such-vocab"), std::runtime_error);
    EXPECT_THROW(vocab_gguf_path("../etc"), std::runtime_error);
}

TEST_F(ModelFactoryTest, ResolveDerivesSsmDefaults) {
    const ModelSpec m = resolve_model_spec(tiny_spec("mamba2"));
    EXPECT_EQ(m.ssm_d_inner, 256u);
    EXPECT_EQ(m.ssm_dt_rank, 4u);
    EXPECT_EQ(m.ssm_d_conv, 4u);
    EXPECT_EQ(m.ssm_n_group, 1u);
    EXPECT_EQ(m.name, "skippy-random-mamba2");

    const ModelSpec q = resolve_model_spec(tiny_spec("qwen35"));
    EXPECT_EQ(q.ssm_d_state, 64u);
    EXPECT_EQ(q.ssm_d_inner, q.ssm_d_state * q.ssm_dt_rank);
    EXPECT_EQ(q.full_attention_interval, 4u);
    EXPECT_FALSE(q.chat_template.empty());
}

TEST_F(ModelFactoryTest, InvalidSpecsThrow) {
    const std::string out = (dir_ / "invalid.gguf").string();
    ModelSpec s = tiny_spec("llama");
    s.arch = "gpt-17";
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("llama");
    s.n_embd = 130;  // not divisible by n_head
    s.n_head = 4;
    s.n_head_kv = 4;
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("llama");
    s.n_head = 4;
    s.n_head_kv = 3;  // does not divide n_head
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("llama");
    s.n_layer = 0;
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("llama");
    s.vocab = "no-such-vocab";
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("qwen35");
    s.n_layer = 1;
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("qwen35");
    s.ssm_d_inner = 100;  // must be d_state * dt_rank
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("mamba2");
    s.ssm_dt_rank = 3;  // does not divide d_inner = 256
    EXPECT_THROW(make_random_model(s, out), std::runtime_error);

    s = tiny_spec("llama");
    EXPECT_THROW(make_random_model(s, (dir_ / "no-such-dir" / "m.gguf").string()),
                 std::runtime_error);

    EXPECT_FALSE(fs::exists(out));
}

class ModelFactoryArchTest : public ModelFactoryTest,
                             public ::testing::WithParamInterface<std::string> {};

TEST_P(ModelFactoryArchTest, LoadsAndGeneratesDeterministically) {
    const std::string arch = GetParam();
    const std::string& path = model_for(arch);

    const GreedyResult a1 =
        greedy_probe(path, "The quick brown fox jumps over the lazy dog", 12, probe_options());
    const GreedyResult a2 =
        greedy_probe(path, "The quick brown fox jumps over the lazy dog", 12, probe_options());
    const GreedyResult b =
        greedy_probe(path, "Once upon a time, in a land far away,", 12, probe_options());

    EXPECT_EQ(a1.arch, arch);
    EXPECT_EQ(a1.name, "skippy-random-" + arch);
    EXPECT_EQ(a1.n_vocab, 32000);
    EXPECT_EQ(a1.is_recurrent, arch == "mamba2");
    EXPECT_EQ(a1.is_hybrid, arch == "qwen35");
    EXPECT_GT(a1.n_params, 0u);
    EXPECT_GT(a1.seq_state_size, 0u);

    // The real SPM tokenizer: BOS first, then actual word pieces.
    ASSERT_GE(a1.prompt_tokens.size(), 5u);
    EXPECT_EQ(a1.prompt_tokens.front(), 1);

    EXPECT_TRUE(a1.all_finite);
    EXPECT_TRUE(b.all_finite);
    ASSERT_EQ(a1.tokens.size(), 12u);
    EXPECT_EQ(a1.tokens, a2.tokens) << "greedy generation must be deterministic";
    EXPECT_EQ(a1.text, a2.text);
    EXPECT_NE(a1.tokens, b.tokens) << "different prompts should give different outputs";
    for (const int32_t t : a1.tokens) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, a1.n_vocab);
    }
}

TEST_P(ModelFactoryArchTest, OutputDependsOnEarlyContext) {
    // Prompts that differ only in their first word: a model whose output only followed
    // the last token would be useless for KV-cache / recurrent-state tests.
    const std::string& path = model_for(GetParam());
    const auto a =
        greedy_generate(path, "The quick brown fox jumps over the lazy dog", 12, probe_options());
    const auto b =
        greedy_generate(path, "A quick brown fox jumps over the lazy dog", 12, probe_options());
    EXPECT_NE(a, b);
}

TEST_P(ModelFactoryArchTest, ChatTemplateRendersWithCommonChat) {
    const std::string& path = model_for(GetParam());
    const std::string prompt =
        render_chat_prompt(path, {{"system", "Be brief."}, {"user", "Hi there"}}, true);
    EXPECT_EQ(prompt,
              "<|im_start|>system\nBe brief.<|im_end|>\n"
              "<|im_start|>user\nHi there<|im_end|>\n"
              "<|im_start|>assistant\n");
    const std::string no_gen = render_chat_prompt(path, {{"user", "Hi"}}, false);
    EXPECT_EQ(no_gen, "<|im_start|>user\nHi<|im_end|>\n");

    // And the rendered prompt decodes.
    const GreedyResult r = greedy_probe(path, prompt, 4, probe_options());
    EXPECT_TRUE(r.all_finite);
    EXPECT_EQ(r.tokens.size(), 4u);
}

TEST_F(ModelFactoryTest, ProbeRejectsBadInput) {
    const std::string& path = model_for("llama");
    GreedyProbeOptions small = probe_options();
    small.n_ctx = 8;
    EXPECT_THROW(greedy_probe(path, "The quick brown fox jumps over the lazy dog", 4, small),
                 std::runtime_error);
    EXPECT_THROW(greedy_probe((dir_ / "missing.gguf").string(), "Hi", 1, probe_options()),
                 std::runtime_error);
    EXPECT_THROW(render_chat_prompt((dir_ / "missing.gguf").string(), {{"user", "Hi"}}),
                 std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelFactoryArchTest,
                         ::testing::Values("llama", "qwen35", "mamba2"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST_F(ModelFactoryTest, SameSpecWritesIdenticalFile) {
    const fs::path p1 = dir_ / "det-1.gguf";
    const fs::path p2 = dir_ / "det-2.gguf";
    ModelSpec s = tiny_spec("mamba2");
    s.n_layer = 1;
    make_random_model(s, p1.string());
    make_random_model(s, p2.string());
    EXPECT_EQ(read_file(p1), read_file(p2));

    const fs::path p3 = dir_ / "det-3.gguf";
    s.seed = 43;
    make_random_model(s, p3.string());
    EXPECT_NE(read_file(p1), read_file(p3));
    EXPECT_NE(greedy_generate(p1.string(), "Hello world", 8, probe_options()),
              greedy_generate(p3.string(), "Hello world", 8, probe_options()));
    fs::remove(p1);
    fs::remove(p2);
    fs::remove(p3);
}

TEST_F(ModelFactoryTest, F16VariantLoads) {
    for (const std::string arch : {"llama", "qwen35", "mamba2"}) {
        const fs::path path = dir_ / (arch + "-f16.gguf");
        ModelSpec s = tiny_spec(arch);
        s.f16 = true;
        make_random_model(s, path.string());
        const GreedyResult h = greedy_probe(path.string(), "Hello world", 6, probe_options());
        EXPECT_TRUE(h.all_finite) << arch;
        EXPECT_EQ(h.tokens.size(), 6u) << arch;
        EXPECT_EQ(h.tokens, greedy_generate(path.string(), "Hello world", 6, probe_options()))
            << arch;

        const GreedyResult f = greedy_probe(model_for(arch), "Hello world", 1, probe_options());
        EXPECT_EQ(h.n_params, f.n_params) << arch;
        EXPECT_LT(h.model_size, f.model_size * 6 / 10) << arch << ": matrices should be F16";
        fs::remove(path);
    }
}

// --type: written as F16, then quantized by llama.cpp's quantizer; the result loads, generates
// finite logits deterministically, and is smaller than the F16 file.
TEST_F(ModelFactoryTest, QuantizedTypesLoad) {
    for (const std::string arch : {"llama", "qwen35", "mamba2"}) {
        const fs::path f16 = dir_ / (arch + "-ref-f16.gguf");
        ModelSpec base = tiny_spec(arch);
        base.f16 = true;
        make_random_model(base, f16.string());
        for (const std::string type : {"q8_0", "q4_k_m"}) {
            const fs::path path = dir_ / (arch + "-" + type + ".gguf");
            ModelSpec s = tiny_spec(arch);
            s.type = type;
            make_random_model(s, path.string());
            EXPECT_FALSE(fs::exists(path.string() + ".f16.tmp")) << arch << " " << type;
            const GreedyResult q = greedy_probe(path.string(), "Hello world", 4, probe_options());
            EXPECT_TRUE(q.all_finite) << arch << " " << type;
            EXPECT_EQ(q.tokens, greedy_generate(path.string(), "Hello world", 4, probe_options()))
                << arch << " " << type;
            EXPECT_LT(fs::file_size(path), fs::file_size(f16)) << arch << " " << type;
            fs::remove(path);
        }
        fs::remove(f16);
    }
    ModelSpec bad = tiny_spec("llama");
    bad.type = "q9_9";
    EXPECT_THROW(make_random_model(bad, (dir_ / "bad.gguf").string()), std::runtime_error);
}

TEST_F(ModelFactoryTest, BpeVocabWithMerges) {
    const fs::path path = dir_ / "gpt2-vocab.gguf";
    ModelSpec s = tiny_spec("llama");
    s.vocab = "gpt-2";
    s.n_embd = 64;
    s.n_layer = 1;
    make_random_model(s, path.string());
    const GreedyResult r =
        greedy_probe(path.string(), "Hello world, hello tokenizer", 4, probe_options());
    EXPECT_TRUE(r.all_finite);
    EXPECT_GT(r.n_vocab, 50000);
    EXPECT_GE(r.prompt_tokens.size(), 4u);
    fs::remove(path);
}

}  // namespace
}  // namespace skippy::runtime
