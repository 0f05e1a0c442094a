"""End-to-end shapes of the non-OpenAI-chat endpoints over raw HTTP: POST /v1/messages
(Anthropic), POST /v1/responses (OpenAI Responses), /tokenize, /detokenize, /v1/models with
the context length, and --alias with several names and the '*' catch-all."""
import json
import unittest

import skippy_harness as h

WEATHER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    "required": ["city"], "additionalProperties": False}


def sse_events(raw):
    """(event name, payload) pairs of an SSE body with `event:` lines."""
    out = []
    for block in raw.decode().split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        if data is not None:
            out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


class ApiFormatsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server(h.model_path("llama-tools"), "--lanes", "2", "--ctx-size", "8192",
                              "--alias", "gpt-4o,claude-3-5-sonnet")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def post_raw(self, path, body):
        return self.server.request("POST", path, body)

    # ---- Anthropic ----

    def test_messages_text_and_usage(self):
        status, resp = self.server.post_json("/v1/messages", {
            "model": "claude-3-5-sonnet", "max_tokens": 6, "temperature": 0,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "Hello"}]})
        self.assertEqual(status, 200, resp)
        self.assertEqual((resp["type"], resp["role"]), ("message", "assistant"))
        self.assertTrue(resp["id"].startswith("msg_"))
        self.assertEqual(resp["content"][0]["type"], "text")
        self.assertIn(resp["stop_reason"], ("end_turn", "max_tokens"))
        u = resp["usage"]
        self.assertLessEqual(u["output_tokens"], 6)
        self.assertGreater(u["input_tokens"] + u["cache_read_input_tokens"], 0)
        # A stop sequence reports itself (greedy output of this model contains an "e").
        status, resp = self.server.post_json("/v1/messages", {
            "model": "claude-3-5-sonnet", "max_tokens": 40, "temperature": 0,
            "stop_sequences": ["e"], "messages": [{"role": "user", "content": "Hello"}]})
        self.assertEqual((resp["stop_reason"], resp["stop_sequence"]), ("stop_sequence", "e"))
        self.assertNotIn("e", resp["content"][0]["text"])

    def test_messages_tool_use_streamed(self):
        body = {"model": "claude-3-5-sonnet", "max_tokens": 300, "temperature": 0,
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": [{"name": "get_weather", "description": "weather",
                           "input_schema": WEATHER_SCHEMA}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
        status, resp = self.server.post_json("/v1/messages", body)
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["stop_reason"], "tool_use")
        block = resp["content"][0]
        self.assertEqual((block["type"], block["name"]), ("tool_use", "get_weather"))
        self.assertIn(block["input"]["city"], ("Paris", "Oslo"))
        status, _, raw = self.post_raw("/v1/messages", dict(body, stream=True))
        self.assertEqual(status, 200)
        events = sse_events(raw)
        names = [n for n, _ in events]
        self.assertEqual(names[0], "message_start")
        self.assertEqual(names[-2:], ["message_delta", "message_stop"])
        self.assertTrue(all(n == p["type"] for n, p in events))
        start = next(p for n, p in events if n == "content_block_start")
        self.assertEqual(start["content_block"]["type"], "tool_use")
        partial = "".join(p["delta"]["partial_json"] for n, p in events
                          if n == "content_block_delta")
        self.assertEqual(json.loads(partial), block["input"])
        self.assertEqual(events[-2][1]["delta"]["stop_reason"], "tool_use")

    def test_messages_errors_are_anthropic_shaped(self):
        for body in [{"messages": [{"role": "user", "content": "x"}]},  # no max_tokens
                     {"max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]},
                     {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                      "tool_choice": {"type": "tool", "name": "nope"},
                      "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
                     {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                      "mcp_servers": []}]:
            with self.subTest(body=body):
                status, resp = self.server.post_json("/v1/messages", body)
                self.assertEqual(status, 400, resp)
                self.assertEqual(resp["type"], "error")
                self.assertEqual(resp["error"]["type"], "invalid_request_error")
                self.assertTrue(resp["error"]["message"])
        status, resp = self.server.post_json("/v1/messages", {
            "model": "claude-unknown", "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}]})
        self.assertEqual((status, resp["error"]["type"]), (404, "not_found_error"))

    def test_count_tokens(self):
        status, resp = self.server.post_json("/v1/messages/count_tokens", {
            "model": "claude-3-5-sonnet", "messages": [{"role": "user", "content": "Hello"}]})
        self.assertEqual(status, 200, resp)
        self.assertGreater(resp["input_tokens"], 0)

    # ---- Responses ----

    def test_responses_text(self):
        status, resp = self.server.post_json("/v1/responses", {
            "model": "gpt-4o", "input": "Hello", "instructions": "Be brief.",
            "max_output_tokens": 6, "temperature": 0})
        self.assertEqual(status, 200, resp)
        self.assertEqual(resp["object"], "response")
        self.assertIn(resp["status"], ("completed", "incomplete"))
        item = resp["output"][0]
        self.assertEqual((item["type"], item["role"]), ("message", "assistant"))
        self.assertEqual(item["content"][0]["type"], "output_text")
        self.assertLessEqual(resp["usage"]["output_tokens"], 6)

    def test_responses_function_call_loop_streamed(self):
        tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}]
        body = {"model": "gpt-4o", "input": [{"role": "user", "content": "weather?"}],
                "tools": tools, "tool_choice": "required", "parallel_tool_calls": False,
                "max_output_tokens": 300, "temperature": 0}
        status, resp = self.server.post_json("/v1/responses", body)
        self.assertEqual(status, 200, resp)
        call = resp["output"][0]
        self.assertEqual((call["type"], call["name"]), ("function_call", "get_weather"))
        self.assertIn(json.loads(call["arguments"])["city"], ("Paris", "Oslo"))
        status, _, raw = self.post_raw("/v1/responses", dict(body, stream=True))
        self.assertEqual(status, 200)
        events = sse_events(raw)
        names = [n for n, _ in events]
        self.assertEqual(names[:3], ["response.created", "response.in_progress",
                                     "response.output_item.added"])
        self.assertEqual(names[-1], "response.completed")
        self.assertIn("response.function_call_arguments.delta", names)
        self.assertIn("response.function_call_arguments.done", names)
        self.assertEqual([p["sequence_number"] for _, p in events], list(range(len(events))))
        done = events[-1][1]["response"]
        self.assertEqual(done["output"][0]["arguments"], call["arguments"])
        # The call and its output go back as input items; the turn is restored from cache.
        follow = {"model": "gpt-4o", "tools": tools, "max_output_tokens": 4, "temperature": 0,
                  "input": body["input"] + [
                      {"type": "function_call", "call_id": call["call_id"], "name": call["name"],
                       "arguments": call["arguments"]},
                      {"type": "function_call_output", "call_id": call["call_id"],
                       "output": "sunny"}]}
        status, resp2 = self.server.post_json("/v1/responses", follow)
        self.assertEqual(status, 200, resp2)
        self.assertGreaterEqual(resp2["usage"]["input_tokens_details"]["cached_tokens"],
                                resp["usage"]["input_tokens"] - h.FLASH_RESTORE_SLACK)

    def test_responses_errors(self):
        for body, param in [({"model": "gpt-4o", "input": "x", "previous_response_id": "r1"},
                             "previous_response_id"),
                            ({"model": "gpt-4o", "input": "x", "tools": [{"type": "web_search"}],
                              "tool_choice": {"type": "web_search"}}, "tool_choice"),
                            ({"model": "gpt-4o", "input": "x", "tools": [{"type": "web_search"}],
                              "tool_choice": "required"}, "tool_choice"),
                            ({"model": "gpt-4o", "input": "x", "conversation": "conv_1"},
                             "conversation"),
                            ({"model": "gpt-4o"}, "input"),
                            ({"model": "gpt-4o", "input": [{"type": "function_call_output",
                                                            "call_id": "nope", "output": "x"}]},
                             "messages[0].tool_call_id")]:
            with self.subTest(param=param):
                status, resp = self.server.post_json("/v1/responses", body)
                self.assertEqual(status, 400, resp)
                self.assertEqual(resp["error"]["param"], param)

    def test_responses_codex_shapes(self):
        """What Codex CLI sends: developer messages, client_metadata, include, store: false,
        reasoning.summary, a namespace tool and a hosted web_search tool beside function
        tools, prompt_cache_key, no max_output_tokens (the server's cap ends the turn); hosted
        and grouped tools are left out and named in x-skippy-dropped-tools, unknown top-level
        fields are accepted and named in x-skippy-ignored-fields."""
        tools = [{"type": "function", "name": "exec_command", "strict": False,
                  "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                 "required": ["cmd"]}},
                 {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
                  "tools": [{"type": "function", "name": "close_agent",
                             "parameters": {"type": "object", "properties": {}}}]},
                 {"type": "web_search", "external_web_access": False}]
        body = {"model": "gpt-4o", "stream": True, "tools": tools, "tool_choice": "auto",
                "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
                "include": ["reasoning.encrypted_content"], "prompt_cache_key": "session-1",
                "client_metadata": {"x-codex-turn-metadata": "{}"},
                "some_future_field": {"x": 1}, "max_output_tokens": 8,
                "input": [{"type": "message", "role": "developer",
                           "content": [{"type": "input_text", "text": "You are Codex."}]},
                          {"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "List the files"}]}]}
        status, headers, raw = self.post_raw("/v1/responses", body)
        self.assertEqual(status, 200, raw)
        names = [n for n, _ in sse_events(raw)]
        self.assertIn(names[-1], ("response.completed", "response.incomplete"))
        lower = {k.lower(): v for k, v in headers.items()}
        self.assertIn("web_search", lower.get("x-skippy-dropped-tools", ""))
        self.assertIn("namespace:multi_agent_v1", lower.get("x-skippy-dropped-tools", ""))
        self.assertIn("some_future_field", lower.get("x-skippy-ignored-fields", ""))
        # A second session (another prompt_cache_key) of the same prompt restores it: the key
        # is a routing hint, not a cache namespace.
        body2 = dict(body, stream=False, prompt_cache_key="session-2")
        status, resp = self.server.post_json("/v1/responses", body2)
        self.assertEqual(status, 200, resp)
        self.assertGreater(resp["usage"]["input_tokens_details"]["cached_tokens"], 0)
        # A function_call item with a namespace, an assistant message with a phase, and a
        # reasoning item with encrypted content replay as history.
        follow = dict(body2, input=body["input"] + [
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None},
            {"type": "message", "role": "assistant", "phase": "commentary",
             "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "exec_command",
             "namespace": None, "arguments": "{\"cmd\": \"ls\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}])
        status, resp = self.server.post_json("/v1/responses", follow)
        self.assertEqual(status, 200, resp)

    def test_messages_claude_code_shapes(self):
        """What Claude Code sends: system blocks with cache_control, a system message after
        the user's, adaptive thinking with display omitted, context_management, output_config,
        metadata, deferred tools and a server tool; all accepted with their meaning."""
        tools = [{"name": "Bash", "description": "Run a command",
                  "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                   "required": ["command"]}},
                 {"name": "Later", "description": "Deferred", "defer_loading": True,
                  "input_schema": {"type": "object", "properties": {}}},
                 {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]
        body = {"model": "claude-3-5-sonnet", "max_tokens": 8, "stream": True,
                "system": [{"type": "text", "text": "You are Claude Code."},
                           {"type": "text", "text": "Be brief.",
                            "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                             {"role": "system", "output_config": {"effort": "medium"},
                              "content": [{"type": "text", "text": "Reminder: be careful.",
                                           "cache_control": {"type": "ephemeral"}}]}],
                "tools": tools, "metadata": {"user_id": "u"},
                "thinking": {"type": "adaptive", "display": "omitted"},
                "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                  "keep": "all"}]},
                "output_config": {"effort": "medium"}, "speed_hint": "fast"}
        status, headers, raw = self.post_raw("/v1/messages?beta=true", body)
        self.assertEqual(status, 200, raw)
        events = sse_events(raw)
        self.assertEqual(events[-1][0], "message_stop")
        delta = [p for n, p in events if n == "message_delta"][0]
        self.assertEqual(delta["context_management"], {"applied_edits": []})
        lower = {k.lower(): v for k, v in headers.items()}
        self.assertIn("web_search", lower.get("x-skippy-dropped-tools", ""))
        self.assertIn("speed_hint", lower.get("x-skippy-ignored-fields", ""))
        # The deferred tool is not rendered until a tool_reference loads it.
        count = {k: body[k] for k in ("model", "system", "messages", "tools")}
        _, base = self.server.post_json("/v1/messages/count_tokens", count)
        without = dict(count, tools=[tools[0]])
        _, plain = self.server.post_json("/v1/messages/count_tokens", without)
        self.assertEqual(base["input_tokens"], plain["input_tokens"])

    def test_messages_system_placement(self):
        for messages in ([{"role": "system", "content": "x"},
                          {"role": "user", "content": "Hi"}],
                         [{"role": "user", "content": "Hi"}, {"role": "system", "content": "a"},
                          {"role": "system", "content": "b"}],
                         [{"role": "user", "content": "Hi"}, {"role": "system", "content": "a"},
                          {"role": "user", "content": "Hi"}]):
            with self.subTest(messages=messages):
                status, resp = self.server.post_json("/v1/messages", {
                    "max_tokens": 4, "messages": messages})
                self.assertEqual(status, 400, resp)
                self.assertIn("system message", resp["error"]["message"])

    def test_messages_context_edits(self):
        """clear_thinking keeps the thinking of the last N assistant turns; clear_tool_uses
        replaces all but the last `keep` tool results once its trigger fires; both are
        reported in context_management.applied_edits."""
        schema = {"type": "object", "properties": {"command": {"type": "string"}}}
        messages = []
        for i in range(3):
            messages += [
                {"role": "user", "content": f"Step {i}: run it"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": f"Thinking about step {i} " * 20,
                     "signature": "sig"},
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash",
                     "input": {"command": f"ls {i}"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{i}",
                     "content": f"output of step {i} " * 30}]}]
        body = {"max_tokens": 2, "temperature": 0, "messages": messages,
                "tools": [{"name": "Bash", "input_schema": schema}],
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "context_management": {"edits": [
                    {"type": "clear_thinking_20251015",
                     "keep": {"type": "thinking_turns", "value": 1}},
                    {"type": "clear_tool_uses_20250919",
                     "trigger": {"type": "tool_uses", "value": 2},
                     "keep": {"type": "tool_uses", "value": 1},
                     "clear_tool_inputs": ["Bash"]}]}}
        status, resp = self.server.post_json("/v1/messages", body)
        self.assertEqual(status, 200, resp)
        edits = {e["type"]: e for e in resp["context_management"]["applied_edits"]}
        self.assertEqual(edits["clear_tool_uses_20250919"]["cleared_tool_uses"], 2)
        self.assertGreater(edits["clear_tool_uses_20250919"]["cleared_input_tokens"], 0)
        # The edited prompt is shorter than the same request without the edits.
        _, plain = self.server.post_json("/v1/messages", dict(body, context_management=None))
        self.assertLess(resp["usage"]["input_tokens"] + resp["usage"]["cache_read_input_tokens"],
                        plain["usage"]["input_tokens"] + plain["usage"]["cache_read_input_tokens"])
        status, resp = self.server.post_json("/v1/messages", dict(body, context_management={
            "edits": [{"type": "clear_tool_uses_20250919"},
                      {"type": "clear_thinking_20251015"}]}))
        self.assertEqual(status, 400, resp)

    # ---- tokenize, models, aliases ----

    def test_tokenize_detokenize_round_trip(self):
        text = "Hello <tool_call> world"
        status, tok = self.server.post_json("/tokenize", {"content": text})
        self.assertEqual(status, 200, tok)
        self.assertIn(151657, tok["tokens"])  # <tool_call> is one token
        status, detok = self.server.post_json("/detokenize", {"tokens": tok["tokens"]})
        self.assertEqual((status, detok["content"]), (200, text))
        status, pieces = self.server.post_json("/tokenize", {"content": text, "with_pieces": True})
        self.assertEqual("".join(p["piece"] for p in pieces["tokens"]), text)
        status, err = self.server.post_json("/detokenize", {"tokens": [-1]})
        self.assertEqual(status, 400)

    def test_models_carry_context_length_and_aliases(self):
        status, models = self.server.get_json("/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual([m["id"] for m in models["data"]], ["gpt-4o", "claude-3-5-sonnet"])
        for m in models["data"]:
            self.assertEqual(m["context_length"], 4096)
        status, one = self.server.get_json("/v1/models/claude-3-5-sonnet")
        self.assertEqual((status, one["id"], one["context_length"]), (200, "claude-3-5-sonnet", 4096))
        status, _ = self.server.get_json("/v1/models/gpt-5")
        self.assertEqual(status, 404)
        status, resp = self.server.post_json("/v1/chat/completions", h.chat(
            [{"role": "user", "content": "x"}], model="claude-3-5-sonnet", max_tokens=1))
        self.assertEqual(status, 200)
        self.assertEqual(resp["model"], "claude-3-5-sonnet")
        status, resp = self.server.post_json("/v1/chat/completions", h.chat(
            [{"role": "user", "content": "x"}], model="gpt-5", max_tokens=1))
        self.assertEqual((status, resp["error"]["code"]), (404, "model_not_found"))

    def test_catch_all_alias(self):
        with h.Server(h.model_path("llama"), "--alias", "local,*") as server:
            status, models = server.get_json("/v1/models")
            self.assertEqual([m["id"] for m in models["data"]], ["local"])
            for name in ["gpt-5", "claude-opus-4", "local"]:
                status, resp = server.post_json("/v1/chat/completions", h.chat(
                    [{"role": "user", "content": "x"}], model=name, max_tokens=1))
                self.assertEqual(status, 200, resp)
                self.assertEqual(resp["model"], name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
