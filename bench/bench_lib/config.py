"""What the benchmark runs: model shapes and workload sizes for the full run and for the
--quick smoke run. Pure data; change sizes here, not in the workload code."""

# Random-weight models written by `skippy make-model` (real 32k llama-spm tokenizer, ChatML
# template). Full-size models are ~50-60M parameters, half of them in the 32k-vocabulary
# embedding and output matrices, so that on 2 CPU cores prefill and decode compute dominate
# HTTP/JSON overhead by orders of magnitude.
MODELS = {
    "full": {
        "llama": ["--arch", "llama", "--layers", "6", "--embd", "512", "--heads", "8",
                  "--heads-kv", "4", "--ffn", "1536", "--ctx", "16384", "--seed", "7"],
        "qwen35": ["--arch", "qwen35", "--layers", "8", "--embd", "512", "--heads", "8",
                   "--heads-kv", "2", "--ffn", "1536", "--ctx", "16384", "--seed", "7"],
        "mamba2": ["--arch", "mamba2", "--layers", "12", "--embd", "512",
                   "--ctx", "16384", "--seed", "7"],
    },
    "quick": {
        "llama": ["--arch", "llama", "--layers", "2", "--embd", "128", "--heads", "4",
                  "--heads-kv", "4", "--ffn", "256", "--ctx", "2048", "--seed", "7"],
        "qwen35": ["--arch", "qwen35", "--layers", "4", "--embd", "128", "--heads", "4",
                   "--heads-kv", "4", "--ffn", "256", "--ctx", "2048", "--seed", "7"],
        "mamba2": ["--arch", "mamba2", "--layers", "2", "--embd", "128",
                   "--ctx", "2048", "--seed", "7"],
    },
}

FAMILY = {"llama": "dense", "qwen35": "hybrid", "mamba2": "recurrent"}

# Workload sizes. Token counts are exact for token-id prompts (family, concurrency, cold) and
# fitted with llama-server's /tokenize for text (chat, agent). *_deadline_s bound one run of
# one workload on one server; requests also have their own timeout.
PROFILES = {
    "full": {
        "rounds": 2,                 # ABAB...: each workload alternates servers this many times
        "ctx": 16384,                # --ctx-size / -c for every server start
        "request_timeout_s": 300,
        "family": {"prefixes": [128, 1024, 4096], "reps": 10, "deadline_s": 420},
        "chat": {"conversations": 8, "turns": 6, "system_tokens": 1024,
                 "user_tokens": [40, 80], "max_tokens": 8, "lanes": 1, "deadline_s": 420},
        "agent": {"system_tokens": 600, "task_tokens": 60, "append_tokens": [200, 500],
                  "max_context": 8192, "max_turns": 40, "max_tokens": 16, "lanes": 1,
                  "deadline_s": 480},
        "concurrency": {"clients": 8, "requests_per_client": 3, "lanes": 8,
                        "shared_prefix_tokens": 512, "suffix_tokens": [64, 192],
                        "unique_tokens": [256, 640], "max_tokens": 32, "deadline_s": 300},
        "cold": {"prompts": 8, "prompt_tokens": 1024, "max_tokens": 8, "deadline_s": 240},
    },
    "quick": {
        "rounds": 2,
        "ctx": 2048,
        "request_timeout_s": 60,
        "family": {"prefixes": [128, 512], "reps": 3, "deadline_s": 60},
        "chat": {"conversations": 3, "turns": 3, "system_tokens": 128,
                 "user_tokens": [10, 20], "max_tokens": 4, "lanes": 1, "deadline_s": 60},
        "agent": {"system_tokens": 64, "task_tokens": 16, "append_tokens": [40, 80],
                  "max_context": 512, "max_turns": 12, "max_tokens": 4, "lanes": 1,
                  "deadline_s": 60},
        "concurrency": {"clients": 4, "requests_per_client": 2, "lanes": 4,
                        "shared_prefix_tokens": 48, "suffix_tokens": [8, 24],
                        "unique_tokens": [32, 64], "max_tokens": 8, "deadline_s": 60},
        "cold": {"prompts": 3, "prompt_tokens": 96, "max_tokens": 4, "deadline_s": 60},
    },
}

WORKLOADS = ["family", "chat", "agent", "concurrency", "cold"]
