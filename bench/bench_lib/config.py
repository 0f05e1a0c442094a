"""What the benchmark runs: model shapes and workload sizes per profile (full, quick,
realistic). Pure data; change sizes here, not in the workload code."""

# Random-weight models written by `skippy make-model` (real 32k llama-spm tokenizer with
# ChatML's <|im_end|> / <|im_start|> appended as control tokens, as ChatML fine-tunes of
# 32k-SPM models have them, and a ChatML template: message markers are special tokens, as
# in every real ChatML model). Full-size models are ~50-60M parameters, half of them in the
# 32k-vocabulary embedding and output matrices, so that on 2 CPU cores prefill and decode
# compute dominate HTTP/JSON overhead by orders of magnitude.
VOCAB = ["--vocab", "llama-spm-chatml"]
MODELS = {
    "full": {
        "llama": ["--arch", "llama", "--layers", "6", "--embd", "512", "--heads", "8",
                  "--heads-kv", "4", "--ffn", "1536", "--ctx", "16384", "--seed", "7"] + VOCAB,
        "qwen35": ["--arch", "qwen35", "--layers", "8", "--embd", "512", "--heads", "8",
                   "--heads-kv", "2", "--ffn", "1536", "--ctx", "16384", "--seed", "7"] + VOCAB,
        "mamba2": ["--arch", "mamba2", "--layers", "12", "--embd", "512",
                   "--ctx", "16384", "--seed", "7"] + VOCAB,
    },
    "quick": {
        "llama": ["--arch", "llama", "--layers", "2", "--embd", "128", "--heads", "4",
                  "--heads-kv", "4", "--ffn", "256", "--ctx", "2048", "--seed", "7"] + VOCAB,
        "qwen35": ["--arch", "qwen35", "--layers", "4", "--embd", "128", "--heads", "4",
                   "--heads-kv", "4", "--ffn", "256", "--ctx", "2048", "--seed", "7"] + VOCAB,
        "mamba2": ["--arch", "mamba2", "--layers", "2", "--embd", "128",
                   "--ctx", "2048", "--seed", "7"] + VOCAB,
    },
    # Shapes of real small models at the quantizations people run them with (random weights,
    # quantized by make-model with llama.cpp's quantizer from an f16 model: `--type`). Only
    # with --profile realistic, never in the default run. make-model derives the head size
    # from embd / heads (no separate head-size option), so the heads are chosen to give the
    # real head size where the model has one.
    "realistic": {
        # Llama-3.2-1B-like dense: 16 layers, embd 2048, 32 heads / 8 KV (head size 64, as
        # the real model), ffn 8192; Q4_K_M (~0.75 GB with the 32k vocabulary).
        "llama": ["--arch", "llama", "--layers", "16", "--embd", "2048", "--heads", "32",
                  "--heads-kv", "8", "--ffn", "8192", "--ctx", "16384", "--type", "q4_k_m",
                  "--seed", "7"] + VOCAB,
        # The same shape and weights at Q8_0 (~1.2 GB): the same KV cache, 8-bit matrices.
        "llama-q8": ["--arch", "llama", "--layers", "16", "--embd", "2048", "--heads", "32",
                     "--heads-kv", "8", "--ffn", "8192", "--ctx", "16384", "--type", "q8_0",
                     "--seed", "7"] + VOCAB,
        # Qwen3.5-0.8B-like hybrid: 24 layers (make-model's qwen35 puts full attention on
        # every 4th), embd 1024, ffn 3584, 8 heads / 2 KV (the 4:1 grouping) so that the
        # head size is 128 (Qwen3-Next's linear-attention head size; make-model also uses it
        # as the gated delta net's state size); Q8_0 (~0.5 GB).
        "qwen35": ["--arch", "qwen35", "--layers", "24", "--embd", "1024", "--heads", "8",
                   "--heads-kv", "2", "--ffn", "3584", "--ctx", "16384", "--type", "q8_0",
                   "--seed", "7"] + VOCAB,
        # Mamba2-370m-like recurrent: 48 layers, embd 1024 (make-model: d_inner 2048,
        # d_state 64, 32 SSM heads of 64), ~0.37B params, Q8_0 (~0.4 GB).
        "mamba2": ["--arch", "mamba2", "--layers", "48", "--embd", "1024",
                   "--ctx", "16384", "--type", "q8_0", "--seed", "7"] + VOCAB,
    },
}

# Model -> family (the skippy payload class). A second model of a family (the realistic
# profile's llama-q8) gets its own column in the summary and the README table: COLUMN.
FAMILY = {"llama": "dense", "llama-q8": "dense", "qwen35": "hybrid", "mamba2": "recurrent"}
COLUMN = {"llama-q8": "dense-q8"}   # summary key; default: the family


def column(model):
    return COLUMN.get(model, FAMILY[model])


# Workload sizes. Token counts are exact for token-id prompts (family, concurrency, cold) and
# fitted with llama-server's /tokenize for text (chat, multisession, agent, agent_edits).
# lane_ctx: KV cells per lane; both servers get -c / --ctx-size = lanes x lane_ctx (a
# workload's own lane_ctx overrides the profile's). *deadline_s bound one run of one
# workload on one server; requests also have their own timeout.
PROFILES = {
    "full": {
        "rounds": 2,                 # ABBA...: each workload alternates servers this many times
        "lane_ctx": 16384,
        "request_timeout_s": 300,
        "family": {"prefixes": [128, 1024, 4096], "reps": 10, "deadline_s": 420},
        "chat": {"conversations": 8, "turns": 6, "system_tokens": 1024,
                 "user_tokens": [40, 80], "max_tokens": 8, "lanes": 1, "deadline_s": 420},
        "multisession": {"conversations": 16, "turns": 6, "system_tokens": 1024,
                         "user_tokens": [40, 80], "max_tokens": 8, "lanes": 2, "clients": 1,
                         "lane_ctx": 4096, "deadline_s": 600},
        "agent": {"system_tokens": 600, "task_tokens": 60, "append_tokens": [200, 500],
                  "max_context": 8192, "max_turns": 40, "max_tokens": 16, "lanes": 1,
                  "deadline_s": 480},
        "agent_edits": {"system_tokens": 600, "task_tokens": 60, "append_tokens": [200, 500],
                        "reasoning_tokens": [60, 120], "truncated_tokens": 40,
                        "max_context": 8192, "max_turns": 30, "max_tokens": 16, "lanes": 1,
                        "deadline_s": 480},
        "concurrency": {"clients": 8, "requests_per_client": 3, "lanes": 8, "lane_ctx": 2048,
                        "shared_prefix_tokens": 512, "suffix_tokens": [64, 192],
                        "unique_tokens": [256, 640], "max_tokens": 32, "deadline_s": 300},
        "cold": {"prompts": 8, "prompt_tokens": 1024, "max_tokens": 8, "deadline_s": 240},
        "restart": {"prefix_tokens": 4096, "reps": 3, "lane_ctx": 8192, "deadline_s": 300},
        # ram_ratio: working set / --cache-max-bytes (skippy's floor is 8x a lane capture,
        # so ~100 conversations are needed for 10x); zipf_s: skew of the revisit order.
        # One round (3 servers, ~1-2 min per model on a quiet 2-core machine): the 100
        # cold first visits dominate; --rounds N runs N.
        "larger_than_ram": {"conversations": 100, "prefix_tokens": 384, "turn_tokens": [32, 64],
                            "revisits": 100, "max_visits": 4, "zipf_s": 0.6, "ram_ratio": 10,
                            "max_tokens": 4, "lane_ctx": 2048, "rounds": 1,
                            "deadline_s": 420},
    },
    "quick": {
        "rounds": 2,
        "lane_ctx": 2048,
        "request_timeout_s": 60,
        "family": {"prefixes": [128, 512], "reps": 3, "deadline_s": 60},
        "chat": {"conversations": 3, "turns": 3, "system_tokens": 128,
                 "user_tokens": [10, 20], "max_tokens": 4, "lanes": 1, "deadline_s": 60},
        "multisession": {"conversations": 3, "turns": 3, "system_tokens": 128,
                         "user_tokens": [10, 20], "max_tokens": 4, "lanes": 2, "clients": 1,
                         "lane_ctx": 1024, "deadline_s": 60},
        "agent": {"system_tokens": 64, "task_tokens": 16, "append_tokens": [40, 80],
                  "max_context": 512, "max_turns": 12, "max_tokens": 4, "lanes": 1,
                  "deadline_s": 60},
        "agent_edits": {"system_tokens": 64, "task_tokens": 16, "append_tokens": [40, 80],
                        "reasoning_tokens": [10, 20], "truncated_tokens": 8,
                        "max_context": 1024, "max_turns": 7, "max_tokens": 4, "lanes": 1,
                        "deadline_s": 60},
        "concurrency": {"clients": 4, "requests_per_client": 2, "lanes": 4, "lane_ctx": 512,
                        "shared_prefix_tokens": 48, "suffix_tokens": [8, 24],
                        "unique_tokens": [32, 64], "max_tokens": 8, "deadline_s": 60},
        "cold": {"prompts": 3, "prompt_tokens": 96, "max_tokens": 4, "deadline_s": 60},
        "restart": {"prefix_tokens": 256, "reps": 2, "lane_ctx": 1024, "deadline_s": 60},
        "larger_than_ram": {"conversations": 12, "prefix_tokens": 96, "turn_tokens": [8, 16],
                            "revisits": 12, "max_visits": 4, "zipf_s": 0.6, "ram_ratio": 10,
                            "max_tokens": 2, "lane_ctx": 512, "deadline_s": 60},
    },
    # Real-model shapes (0.38B-1.1B parameters with the 32k vocabulary, Q4_K_M / Q8_0) are
    # 10-100x slower per token than the full profile's models. Measured with skippy on 2
    # busy cores (load ~2-3), cold 512-token prompt: dense Q4_K_M ~29 ms/token (the f16
    # shape: a cold 1024-token prompt ~25-35 s), qwen35 Q8_0 ~7 ms/token, mamba2 Q8_0
    # ~8 ms/token; decode ~150-270 / 19 / 58 ms per token. Hence fewer repetitions and
    # conversations, shorter contexts, long deadlines. Estimated wall time per model, all
    # workloads: dense ~80 min (family ~12, larger_than_ram ~15, agent_edits ~11, the others
    # 5-8 each), qwen35 ~17, mamba2 ~20; bench/README.md has the table and the subsets for a
    # 40-minute window (--models, --workloads; --prepare makes the models beforehand).
    "realistic": {
        "rounds": 2,
        "lane_ctx": 8192,
        "request_timeout_s": 600,
        "family": {"prefixes": [128, 1024, 4096], "reps": 3, "deadline_s": 900},
        "chat": {"conversations": 4, "turns": 4, "system_tokens": 1024,
                 "user_tokens": [40, 80], "max_tokens": 8, "lanes": 1, "deadline_s": 900},
        "multisession": {"conversations": 6, "turns": 4, "system_tokens": 512,
                         "user_tokens": [40, 80], "max_tokens": 8, "lanes": 2, "clients": 1,
                         "lane_ctx": 4096, "deadline_s": 900},
        "agent": {"system_tokens": 600, "task_tokens": 60, "append_tokens": [200, 500],
                  "max_context": 3072, "max_turns": 16, "max_tokens": 8, "lanes": 1,
                  "deadline_s": 900},
        "agent_edits": {"system_tokens": 600, "task_tokens": 60, "append_tokens": [200, 500],
                        "reasoning_tokens": [60, 120], "truncated_tokens": 40,
                        "max_context": 3072, "max_turns": 16, "max_tokens": 8, "lanes": 1,
                        "deadline_s": 900},
        "concurrency": {"clients": 4, "requests_per_client": 2, "lanes": 4, "lane_ctx": 2048,
                        "shared_prefix_tokens": 512, "suffix_tokens": [32, 96],
                        "unique_tokens": [128, 320], "max_tokens": 16, "deadline_s": 900},
        "cold": {"prompts": 6, "prompt_tokens": 512, "max_tokens": 8, "deadline_s": 900},
        "restart": {"prefix_tokens": 2048, "reps": 2, "lane_ctx": 4096, "deadline_s": 900},
        # One round, as in the full profile (4 variants; the cold first visits dominate).
        # skippy's budget never falls below 8.8 lane captures (its capture queue's share),
        # so a ~10x working set needs ~10 x 8.8 conversations of about the largest capture's
        # size: 96 conversations revisited at most once (max_visits 2 keeps the largest
        # capture near the average), 64 revisits. 28 min for the 4 variants (measured).
        "larger_than_ram": {"conversations": 96, "prefix_tokens": 192, "turn_tokens": [32, 64],
                            "revisits": 64, "max_visits": 2, "zipf_s": 0.6, "ram_ratio": 10,
                            "max_tokens": 4, "lane_ctx": 2048, "rounds": 1,
                            "deadline_s": 2400},
    },
}

WORKLOADS = ["family", "chat", "multisession", "agent", "agent_edits", "concurrency", "cold",
             "restart", "larger_than_ram"]

# skippy's flags that the harness names, in one place (the lead may rename them).
SKIPPY_FLASH_ATTN_ARGS = ["--flash-attn", "on"]   # only passed when --flash-attn is asked for
SKIPPY_CACHE_MODE_FLAG = "--cache-mode"
SKIPPY_CACHE_OFF = "off"
SKIPPY_CACHE_PAYLOAD_FLAG = "--cache-payload"  # not passed by default: skippy picks its payload
