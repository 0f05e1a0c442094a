"""The prefix cache across an agent's tool loop: each turn sends the previous request, the
assistant's tool calls and their results; the server restores the end of the previous turn
(recorded as the next request renders it, tool calls included), so cached_tokens covers at
least 90% of the previous request's prompt, and every output is identical to the cache
off. On a dense and a hybrid model."""
import json
import unittest

import skippy_harness as h

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the project",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string", "enum": ["README.md", "src/main.cpp", "CMakeLists.txt"]},
        "line": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["path", "line"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite",
        "parameters": {"type": "object", "properties": {
            "filter": {"type": "string", "enum": ["all", "unit", "e2e"]}},
            "required": ["filter"], "additionalProperties": False}}}]
SYSTEM = ("You are a coding agent. Read the files you need with read_file, run the tests with "
          "run_tests, and explain what you found. Keep tool calls minimal. ") * 3
TURNS = 6
FLAGS = ["--cache-min-tokens", "16", "--lanes", "2", "--ctx-size", "16384"]


def tool_loop(server, stream=False):
    """Runs the loop; returns per turn (assistant message, usage, finish_reason)."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Why does the build fail?"}]
    out = []
    for turn in range(TURNS):
        last = turn == TURNS - 1
        body = {"messages": messages, "tools": TOOLS, "temperature": 0,
                "tool_choice": "none" if last else "required", "parallel_tool_calls": False,
                "max_tokens": 16 if last else 400}
        status, resp = server.post_json("/v1/chat/completions", body)
        assert status == 200, resp
        choice = resp["choices"][0]
        message = choice["message"]
        out.append((message, resp["usage"], choice["finish_reason"]))
        if last:
            break
        assert choice["finish_reason"] == "tool_calls", choice
        messages.append({"role": "assistant", "content": message["content"],
                         "tool_calls": message["tool_calls"]})
        for call in message["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": f"result of {call['function']['name']} {args} "
                                        f"at turn {turn}: ok"})
    return out


def strip_ids(turns):
    """Tool call ids are random per response; everything else must match."""
    out = []
    for message, usage, finish in turns:
        calls = [(c["function"]["name"], c["function"]["arguments"])
                 for c in message.get("tool_calls") or []]
        out.append((message.get("content"), calls, usage["completion_tokens"],
                    usage["prompt_tokens"], finish))
    return out


class ToolLoopCacheTest:
    kind = None

    def test_tool_loop_hits_the_cache_with_identical_output(self):
        model = h.model_path(self.kind)
        with h.Server(model, "--cache-mode", "off", *FLAGS) as off:
            reference = tool_loop(off)
        with h.Server(model, *FLAGS) as on:
            cached = tool_loop(on)
        self.assertEqual(strip_ids(cached), strip_ids(reference))
        for turn in range(1, TURNS):
            previous_prompt = cached[turn - 1][1]["prompt_tokens"]
            got = cached[turn][1]["prompt_tokens_details"]["cached_tokens"]
            self.assertGreaterEqual(got, previous_prompt - h.FLASH_RESTORE_SLACK,
                                    f"turn {turn}: {got} cached of {previous_prompt}")
        for turn in range(TURNS):
            self.assertEqual(reference[turn][1]["prompt_tokens_details"]["cached_tokens"], 0)


class DenseToolLoopTest(ToolLoopCacheTest, unittest.TestCase):
    kind = "llama-tools"


class HybridToolLoopTest(ToolLoopCacheTest, unittest.TestCase):
    kind = "qwen35-tools"


if __name__ == "__main__":
    unittest.main(verbosity=2)
