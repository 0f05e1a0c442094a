// skippy: OpenAI-compatible LLM server with an exact prefix cache.
//   skippy [serve] [--model PATH] ...   serve a GGUF (no --model: the built-in demo model)
//   skippy make-model --arch llama|qwen35|mamba2 --out PATH ...
#include <CLI/CLI.hpp>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "runtime/factory/model_factory.h"
#include "server/serve_command.h"

namespace {

void add_make_model_options(CLI::App& cmd, skippy::runtime::ModelSpec& spec, std::string& out) {
    cmd.add_option("--arch", spec.arch, "llama (dense), qwen35 (hybrid), mamba2 (recurrent)")
        ->capture_default_str();
    cmd.add_option("-o,--out", out, "output GGUF path")->required();
    cmd.add_option("--name", spec.name, "general.name (default skippy-random-<arch>)");
    cmd.add_option("--layers", spec.n_layer, "number of layers")->capture_default_str();
    cmd.add_option("--embd", spec.n_embd, "embedding size")->capture_default_str();
    cmd.add_option("--heads", spec.n_head, "attention heads")->capture_default_str();
    cmd.add_option("--heads-kv", spec.n_head_kv, "KV heads (GQA)")->capture_default_str();
    cmd.add_option("--ffn", spec.n_ff, "feed-forward size")->capture_default_str();
    cmd.add_option("--ctx", spec.n_ctx_train, "training context length")->capture_default_str();
    cmd.add_option("--seed", spec.seed, "weight seed")->capture_default_str();
    cmd.add_flag("--f16", spec.f16, "store weight matrices as f16 (default f32)");
    cmd.add_option("--type", spec.type,
                   "weight type: f32, f16, bf16, q8_0, q6_k, q5_k_m, q5_k_s, q5_0, q5_1, "
                   "q4_k_m, q4_k_s, q4_0, q4_1, q3_k_l, q3_k_m, q3_k_s, q2_k (quantized by "
                   "llama.cpp's quantizer from an f16 model)")
        ->check(CLI::IsMember(skippy::runtime::supported_weight_types()));
    cmd.add_option("--vocab", spec.vocab,
                   "tokenizer: llama.cpp models/ggml-vocab-<NAME>.gguf, or qwen3 / "
                   "llama-spm-chatml (qwen2 / llama-spm with their chat control tokens)")
        ->capture_default_str();
    cmd.add_option_function<std::string>(
        "--chat-template",
        [&spec](const std::string& v) {
            spec.chat_template = skippy::runtime::chat_template_text(v);
        },
        "Jinja chat template stored in the model: a file, or the NAME of llama.cpp's "
        "models/templates/NAME.jinja (default: a minimal ChatML template)");
}

// One malloc arena for the whole process, unless the user set glibc's own knob. By default
// glibc gives each thread that allocates concurrently its own arena (up to 8 per core) and
// keeps what a thread frees for that thread. skippy's big, short-lived buffers (a disk
// entry read by an HTTP thread, its promotion into RAM blocks, record copies on the worker
// threads) were then held once per thread: larger than RAM, dense Q4_K_M, an 89 MiB cache
// budget, anonymous RSS 966 MiB with the disk tier vs 713 RAM only. With one arena: 741 MiB,
// revisit TTFT 762 vs 757 ms (40 conversations, 30 revisits; issue 31's note). Threads now
// share one malloc lock; its cost was not measurable there.
void limit_malloc_arenas() {
#if defined(__GLIBC__)
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (std::getenv("MALLOC_ARENA_MAX") == nullptr &&
        (tunables == nullptr || std::strstr(tunables, "arena_max") == nullptr)) {
        mallopt(M_ARENA_MAX, 1);
    }
#endif
}

}  // namespace

int main(int argc, char** argv) {
    limit_malloc_arenas();  // before any thread starts
    CLI::App app{"skippy: an OpenAI-compatible LLM server with an exact prefix cache"};
    app.require_subcommand(0, 1);
    skippy::server::ServeConfig serve_config;
    CLI::App* serve = app.add_subcommand("serve", "serve a model over the OpenAI API (default)");
    skippy::server::add_serve_options(*serve, serve_config);

    skippy::runtime::ModelSpec spec;
    std::string out_path;
    CLI::App* make_model = app.add_subcommand("make-model", "write a random-weight GGUF model");
    add_make_model_options(*make_model, spec, out_path);

    // llama-server's -ngl, -dev, -ts, -mg, -sm: CLI11 reads only one letter after one dash.
    std::vector<char*> args(argv, argv + argc);
    skippy::server::rewrite_llama_server_flags(args);
    // `skippy` with no subcommand behaves like `skippy serve`, with serve's options.
    if (argc > 1 && std::string(argv[1]).rfind("-", 0) == 0 && std::string(argv[1]) != "-h" &&
        std::string(argv[1]) != "--help") {
        static char serve_word[] = "serve";
        args.insert(args.begin() + 1, serve_word);
    }
    try {
        app.parse(static_cast<int>(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }

    try {
        if (make_model->parsed()) {
            skippy::runtime::make_random_model(spec, out_path);
            std::cout << "wrote " << out_path << " ("
                      << std::filesystem::file_size(out_path) / (1024 * 1024) << " MiB)\n";
            return 0;
        }
        return skippy::server::run_serve(serve_config);
    } catch (const std::exception& e) {
        std::cerr << "skippy: " << e.what() << "\n";
        return 1;
    }
}
