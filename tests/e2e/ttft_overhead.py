"""Measures what a chat request costs outside the scheduler: the client-observed time to the
first streamed token minus the server's own TTFT (`skippy.ttft_ms`, counted from the moment
the request is queued). The difference is HTTP, JSON, chat-template rendering, tokenization,
message boundaries and the wake-up of the handler thread.

Each repetition is one conversation of two turns: a prompt of MESSAGES-2 messages, then the
same messages + the reply + a new user message (MESSAGES messages, about TOKENS tokens); the
second is the warm path of a chat or an agent loop. Not a test (no assertions); run by hand:

  python3 tests/e2e/ttft_overhead.py --skippy build/skippy [--messages 40 --tokens 8000]
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def conversation(rng, n_messages, words_per_message):
    words = ["alpha", "river", "stone", "quiet", "market", "orange", "seven", "window",
             "garden", "silver", "motion", "paper", "cloud", "forest", "number", "simple",
             "yellow", "bridge", "planet", "summer", "letter", "engine", "castle", "mirror"]
    messages = [{"role": "system", "content": "You are a careful assistant. " +
                 " ".join(rng.choice(words) for _ in range(words_per_message))}]
    for i in range(1, n_messages):
        role = "user" if i % 2 == 1 else "assistant"
        messages.append({"role": role, "content": f"{role} {i}: " +
                         " ".join(rng.choice(words) for _ in range(words_per_message))})
    return messages


def stream_chat(port, messages, max_tokens):
    """Returns (client ms to the first token, server ttft ms, reply text, prompt tokens,
    server parse ms)."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.connect()
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    text = []
    server_ttft = None
    parse_ms = None
    prompt_tokens = None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            content = choice.get("delta", {}).get("content")
            if content:
                if first is None:
                    first = (time.perf_counter() - start) * 1000
                text.append(content)
        if "skippy" in chunk:
            server_ttft = chunk["skippy"]["ttft_ms"]
            parse_ms = chunk["skippy"].get("parse_ms")
        if chunk.get("usage"):
            prompt_tokens = chunk["usage"]["prompt_tokens"]
    conn.close()
    return first, server_ttft, "".join(text), prompt_tokens, parse_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skippy", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--messages", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="2")
    args = ap.parse_args()
    os.environ["SKIPPY_BIN"] = os.path.abspath(args.skippy)
    os.environ["SKIPPY_TEST_THREADS"] = args.threads
    os.environ.setdefault("SKIPPY_TEST_MODELS",
                          os.path.join(os.path.dirname(os.environ["SKIPPY_BIN"]), "test-models"))
    import skippy_harness as h
    model = args.model or h.model_path("llama")
    rng = random.Random(7)
    words_per_message = max(4, args.tokens * 10 // args.messages // 12)
    cold, warm, parse = [], [], []
    with h.Server(model, "--ctx-size", str(2 * args.tokens + 4096), "--lanes", "1") as server:
        # Calibrate: one throwaway request (also warms the process up).
        stream_chat(server.port, conversation(rng, 4, 8), 2)
        for rep in range(args.reps):
            messages = conversation(rng, args.messages - 2, words_per_message)
            c_first, c_server, reply, _, _ = stream_chat(server.port, messages, 4)
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "one more question, please"}]
            w_first, w_server, _, n_tokens, w_parse = stream_chat(server.port, messages, 4)
            cold.append(c_first - c_server)
            warm.append(w_first - w_server)
            parse.append(w_parse or 0.0)
            print(f"rep {rep}: {len(messages)} messages, {n_tokens} tokens: first turn "
                  f"client {c_first:.1f} ms server {c_server:.1f} ms; next turn client "
                  f"{w_first:.1f} ms server {w_server:.1f} ms -> overhead {warm[-1]:.1f} ms "
                  f"(of which parse {parse[-1]:.1f} ms)")
    print(f"client minus server TTFT, median of {args.reps}: next turn (warm) "
          f"{statistics.median(warm):.1f} ms (parse + tokenize {statistics.median(parse):.1f} ms), "
          f"first turn (cold) {statistics.median(cold):.1f} ms")


if __name__ == "__main__":
    main()
