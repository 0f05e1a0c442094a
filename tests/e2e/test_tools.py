"""End-to-end tests of tool calling, structured output and logprobs on /v1/chat/completions
and /v1/completions, with a generated tool-capable model (Qwen2.5 chat template, Qwen
tokenizer) on a real server: tool_choice required / named / none / auto, parallel calls,
streamed delta.tool_calls, tool messages in the history, response_format, logprobs, and the
400s for input that cannot be honoured."""
import json
import unittest

import skippy_harness as h

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 12},
        "safe": {"type": "boolean"}},
        "required": ["query", "safe"], "additionalProperties": False}}}
TOOLS = [WEATHER, SEARCH]
ASK = [{"role": "system", "content": "You can call tools."},
       {"role": "user", "content": "What is the weather in Paris for three days?"}]


def validate(value, schema):
    """A JSON Schema check for the subset the tests use."""
    if "enum" in schema:
        return value in schema["enum"]
    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict):
            return False
        props = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(validate(v, props[k]) for k, v in value.items() if k in props)
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema.get("minimum", value) <= value <= schema.get("maximum", value))
    if t == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, list) and all(validate(v, schema["items"]) for v in value)
    return True


def schema_of(name):
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def tool_chat(**kw):
    body = {"messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 300}
    body.update(kw)
    return body


def collect_stream(events):
    """Rebuilds the message from streamed chunks, as the openai client does."""
    content, calls, finish = "", {}, None
    for e in events:
        if e == "[DONE]":
            continue
        for c in e["choices"]:
            d = c["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls", []):
                call = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                if "id" in tc:
                    call["id"] = tc["id"]
                    call["type"] = tc["type"]
                fn = tc.get("function", {})
                call["name"] += fn.get("name", "")
                call["arguments"] += fn.get("arguments", "")
            finish = c["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


class ToolCallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server(h.model_path("llama-tools"), "--lanes", "2", "--ctx-size", "8192")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def post(self, body, path="/v1/chat/completions"):
        status, resp = self.server.post_json(path, body)
        self.assertEqual(status, 200, resp)
        return resp

    def expect_400(self, body, param=None, path="/v1/chat/completions"):
        status, resp = self.server.post_json(path, body)
        self.assertEqual(status, 400, resp)
        err = resp["error"]
        self.assertEqual(err["type"], "invalid_request_error")
        self.assertTrue(err["message"])
        if param is not None:
            self.assertEqual(err["param"], param, err)
        return err

    def assert_valid_calls(self, calls, names=None):
        self.assertTrue(calls)
        ids = set()
        for call in calls:
            self.assertEqual(call["type"], "function")
            self.assertTrue(call["id"].startswith("call_"))
            ids.add(call["id"])
            fn = call["function"]
            if names:
                self.assertIn(fn["name"], names)
            args = json.loads(fn["arguments"])
            self.assertTrue(validate(args, schema_of(fn["name"])), fn)
        self.assertEqual(len(ids), len(calls), "tool call ids must be unique")

    def test_required_is_a_guaranteed_valid_call(self):
        for ask in ["Weather?", "Find cats", "Hello there", "Plan my trip to Lima"]:
            with self.subTest(ask=ask):
                resp = self.post(tool_chat(messages=[{"role": "user", "content": ask}],
                                           tool_choice="required", parallel_tool_calls=False))
                choice = resp["choices"][0]
                self.assertEqual(choice["finish_reason"], "tool_calls", choice)
                self.assertIsNone(choice["message"]["content"])
                self.assertEqual(len(choice["message"]["tool_calls"]), 1)
                self.assert_valid_calls(choice["message"]["tool_calls"])

    def test_named_tool_choice_calls_that_function(self):
        for name in ["get_weather", "search"]:
            with self.subTest(name=name):
                resp = self.post(tool_chat(tool_choice={"type": "function",
                                                        "function": {"name": name}},
                                           parallel_tool_calls=False))
                calls = resp["choices"][0]["message"]["tool_calls"]
                self.assert_valid_calls(calls, names={name})
                self.assertEqual(resp["choices"][0]["finish_reason"], "tool_calls")

    def test_parallel_calls(self):
        resp = self.post(tool_chat(tool_choice="required", parallel_tool_calls=True,
                                   max_tokens=600))
        choice = resp["choices"][0]
        calls = choice["message"]["tool_calls"]
        if choice["finish_reason"] == "length":
            calls = calls[:-1]  # the call cut by max_tokens
        self.assertGreaterEqual(len(calls), 2, "this model and prompt make several calls")
        self.assert_valid_calls(calls)

    def test_streamed_tool_calls_match_the_response(self):
        body = tool_chat(tool_choice="required", parallel_tool_calls=False)
        resp = self.post(body)
        status, events = self.server.stream("/v1/chat/completions", body)
        self.assertEqual(status, 200)
        self.assertEqual(events[-1], "[DONE]")
        first = events[0]["choices"][0]["delta"]
        self.assertEqual(first["role"], "assistant")
        content, calls, finish = collect_stream(events)
        self.assertEqual(finish, "tool_calls")
        want = resp["choices"][0]["message"]["tool_calls"]
        self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                         [(c["function"]["name"], c["function"]["arguments"]) for c in want])
        # The first chunk of a call carries its id, type and name; later ones only arguments.
        starts = [tc for e in events[:-1] for c in e["choices"]
                  for tc in c["delta"].get("tool_calls", []) if "id" in tc]
        self.assertEqual(len(starts), 1)
        self.assertEqual(starts[0]["function"]["arguments"], "")
        self.assertTrue(calls[0]["id"].startswith("call_"))

    def test_tool_choice_none_and_auto_answer_with_text(self):
        for choice in ["none", "auto"]:
            with self.subTest(tool_choice=choice):
                resp = self.post(tool_chat(tool_choice=choice, max_tokens=12))
                c = resp["choices"][0]
                self.assertNotIn("tool_calls", c["message"])
                self.assertIsInstance(c["message"]["content"], str)
                self.assertIn(c["finish_reason"], ("stop", "length"))

    def test_history_with_tool_calls_and_results(self):
        first = self.post(tool_chat(tool_choice="required", parallel_tool_calls=False))
        msg = first["choices"][0]["message"]
        history = ASK + [{"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]},
                         {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                          "content": "sunny, 21 C"}]
        resp = self.post(tool_chat(messages=history, tool_choice="none", max_tokens=8))
        self.assertGreater(resp["usage"]["prompt_tokens"], first["usage"]["prompt_tokens"])
        # The previous turn was recorded: the follow-up restores it (with flash attention,
        # up to a body chunk and a tail before its end).
        self.assertGreaterEqual(resp["usage"]["prompt_tokens_details"]["cached_tokens"],
                                first["usage"]["prompt_tokens"] - h.FLASH_RESTORE_SLACK)

    def test_response_format_json_schema(self):
        schema = {"type": "object", "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["answer", "confidence"], "additionalProperties": False}
        for stream in [False, True]:
            body = {"messages": [{"role": "user", "content": "Is the sky blue?"}],
                    "temperature": 0, "max_tokens": 200,
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": "verdict", "strict": True, "schema": schema}}}
            if stream:
                status, events = self.server.stream("/v1/chat/completions", body)
                self.assertEqual(status, 200)
                text, _, finish = collect_stream(events)
            else:
                resp = self.post(body)
                text = resp["choices"][0]["message"]["content"]
                finish = resp["choices"][0]["finish_reason"]
            self.assertEqual(finish, "stop", text)
            self.assertTrue(validate(json.loads(text), schema), text)

    def test_response_format_on_completions(self):
        schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                         "maximum": 99}},
                  "required": ["n"], "additionalProperties": False}
        resp = self.post({"prompt": "Pick a number:", "temperature": 0, "max_tokens": 100,
                          "response_format": {"type": "json_schema",
                                              "json_schema": {"name": "n", "schema": schema}}},
                         path="/v1/completions")
        self.assertTrue(validate(json.loads(resp["choices"][0]["text"]), schema))

    def test_chat_logprobs(self):
        body = {"messages": ASK, "temperature": 0, "max_tokens": 6, "logprobs": True,
                "top_logprobs": 3, "return_token_ids": True}
        resp = self.post(body)
        content = resp["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), resp["usage"]["completion_tokens"])
        for entry in content:
            self.assertLessEqual(entry["logprob"], 0.0)
            self.assertEqual(len(entry["top_logprobs"]), 3)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(entry["top_logprobs"][0]["logprob"], entry["logprob"], places=5)
            self.assertEqual(bytes(entry["bytes"]).decode("utf-8", "replace"),
                             entry["token"].encode("utf-8", "replace").decode("utf-8", "replace"))
        status, events = self.server.stream("/v1/chat/completions", body)
        streamed = [x for e in events[:-1] for c in e["choices"]
                    if c.get("logprobs") for x in c["logprobs"]["content"]]
        self.assertEqual([(x["token"], round(x["logprob"], 4)) for x in streamed],
                         [(x["token"], round(x["logprob"], 4)) for x in content])
        # Without top_logprobs: the chosen token's logprob only.
        resp = self.post({"messages": ASK, "temperature": 0, "max_tokens": 3, "logprobs": True})
        self.assertEqual(resp["choices"][0]["logprobs"]["content"][0]["top_logprobs"], [])
        resp = self.post({"messages": ASK, "temperature": 0, "max_tokens": 3})
        self.assertIsNone(resp["choices"][0]["logprobs"])

    def test_completion_logprobs(self):
        body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 5, "logprobs": 2}
        resp = self.post(body, path="/v1/completions")
        lp = resp["choices"][0]["logprobs"]
        self.assertEqual(len(lp["tokens"]), resp["usage"]["completion_tokens"])
        self.assertEqual("".join(lp["tokens"]), resp["choices"][0]["text"])
        self.assertTrue(all(len(t) == 2 for t in lp["top_logprobs"]))
        self.assertEqual(lp["text_offset"][0], 0)
        status, events = self.server.stream("/v1/completions", body)
        streamed = [t for e in events[:-1] for c in e["choices"] if c.get("logprobs")
                    for t in c["logprobs"]["tokens"]]
        self.assertEqual(streamed, lp["tokens"])

    def test_n_choices(self):
        resp = self.post({"messages": ASK, "temperature": 0, "max_tokens": 5, "n": 3})
        choices = resp["choices"]
        self.assertEqual([c["index"] for c in choices], [0, 1, 2])
        # Greedy: every choice is the same text; the later ones hit the cache.
        self.assertEqual(len({c["message"]["content"] for c in choices}), 1)
        self.assertEqual(resp["usage"]["completion_tokens"],
                         sum(1 for _ in range(3)) * (resp["usage"]["completion_tokens"] // 3))
        status, events = self.server.stream("/v1/chat/completions",
                                            {"messages": ASK, "temperature": 0.8, "seed": 5,
                                             "max_tokens": 5, "n": 2})
        self.assertEqual(status, 200)
        self.assertEqual({c["index"] for e in events[:-1] for c in e["choices"]}, {0, 1})

    def test_bad_tool_input_is_400_and_server_keeps_serving(self):
        bad_params = dict(WEATHER["function"], parameters={"type": "objekt"})
        cases = [
            (tool_chat(tools=[{"type": "function", "function": bad_params}]),
             "tools[0].function.parameters"),
            (tool_chat(tools=[{"type": "function", "function": dict(WEATHER["function"],
                                                                    parameters=[1, 2])}]),
             "tools[0].function.parameters"),
            (tool_chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
             "tools[0].function.name"),
            (tool_chat(tools=[{"type": "retrieval"}]), "tools[0].type"),
            (tool_chat(tools=[WEATHER, WEATHER]), "tools[1].function.name"),
            (tool_chat(tool_choice={"type": "function", "function": {"name": "missing"}}),
             "tool_choice"),
            (tool_chat(tool_choice="sometimes"), "tool_choice"),
            ({"messages": ASK, "tool_choice": "required"}, "tool_choice"),
            (tool_chat(messages=ASK + [{"role": "tool", "tool_call_id": "call_nope",
                                        "content": "x"}]), "messages[2].tool_call_id"),
            (tool_chat(messages=ASK + [{"role": "tool", "content": "x"}]),
             "messages[2].tool_call_id"),
            (tool_chat(messages=ASK + [{"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "search", "arguments": "{not json"}}]}]),
             "messages[2].tool_calls[0].function.arguments"),
            (tool_chat(grammar="root ::= \"x\""), "grammar"),
            (tool_chat(response_format={"type": "json_object"}), "response_format"),
            (tool_chat(functions=[WEATHER["function"]]), "functions"),
            (tool_chat(web_search_options={}), "web_search_options"),
        ]
        for body, param in cases:
            with self.subTest(param=param):
                self.expect_400(body, param)
        self.post(tool_chat(tool_choice="required", parallel_tool_calls=False))

    def test_unenforceable_schemas_are_400(self):
        schemas = [
            {"type": "object", "properties": {"x": {"type": "number", "minimum": 0}}},
            {"type": "object", "properties": {"x": {"type": "string", "format": "email"}}},
            {"type": "object", "properties": {"x": {"type": "string",
                                                    "pattern": "^(?=a)a$"}}},
            {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "string"},
                                                    "uniqueItems": True}}},
            {"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}]}}},
            {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["y"]},
            {"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}},
            {"type": "object", "properties": {"x": {"type": "string", "maxLength": 3,
                                                    "pattern": "^a+$"}}},
        ]
        for schema in schemas:
            with self.subTest(schema=schema):
                err = self.expect_400(
                    {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
                        "name": "s", "schema": schema}}},
                    "response_format.json_schema.schema")
                self.assertEqual(err["code"], "unsupported_schema")
                tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
                self.expect_400(tool_chat(tools=[tool], tool_choice="required"),
                                "tools[0].function.parameters")
        # The same schemas are accepted with tool_choice auto (no guarantee is promised).
        tool = {"type": "function", "function": {"name": "f", "parameters": schemas[0]}}
        self.post(tool_chat(tools=[tool], tool_choice="auto", max_tokens=2))

    def test_unsupported_fields_are_400_naming_them(self):
        # Known fields that would change the output and cannot be honoured: 400 naming them.
        for field, value in [("audio", {"voice": "x"}), ("verbosity", "low"),
                             ("functions", []), ("web_search_options", {})]:
            with self.subTest(field=field):
                err = self.expect_400({"messages": ASK, field: value}, field)
                self.assertIn(field, err["message"])
        # A field skippy does not know at all is accepted and named in a response header.
        status, headers, _ = self.server.request(
            "POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, "frobnicate": 1})
        self.assertEqual(status, 200)
        self.assertIn("frobnicate", {k.lower(): v for k, v in headers.items()}
                      .get("x-skippy-ignored-fields", ""))
        self.expect_400({"prompt": "x", "echo": True}, "echo", path="/v1/completions")
        self.expect_400({"prompt": "x", "best_of": 3}, "best_of", path="/v1/completions")
        # Fields that cannot change the output are accepted.
        self.post({"messages": ASK, "max_tokens": 2, "user": "u1", "metadata": {"a": "b"},
                   "store": False, "service_tier": "auto"})


class NoToolTemplateTest(unittest.TestCase):
    def test_tools_on_a_template_without_tools_are_400(self):
        with h.Server(h.model_path("llama")) as server:
            status, resp = server.post_json("/v1/chat/completions", tool_chat())
            self.assertEqual(status, 400, resp)
            self.assertEqual(resp["error"]["param"], "tools")
            # response_format works on any template and tokenizer (here SentencePiece).
            schema = {"type": "object", "properties": {"a": {"type": "boolean"}},
                      "required": ["a"], "additionalProperties": False}
            status, resp = server.post_json("/v1/chat/completions", {
                "messages": ASK, "temperature": 0, "max_tokens": 100,
                "response_format": {"type": "json_schema", "json_schema": {"name": "a",
                                                                           "schema": schema}}})
            self.assertEqual(status, 200, resp)
            self.assertTrue(validate(json.loads(resp["choices"][0]["message"]["content"]),
                                     schema))


if __name__ == "__main__":
    unittest.main(verbosity=2)
