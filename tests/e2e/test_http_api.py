"""End-to-end tests of skippy's OpenAI HTTP surface against a real server process."""
import concurrent.futures
import json
import os
import re
import socket
import tempfile
import time
import unittest

import skippy_harness as h


class HttpApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server(h.model_path("llama"), "--lanes", "4", "--ctx-size", "8192")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, messages, **kw):
        status, body = self.server.post_json("/v1/chat/completions", h.chat(messages, **kw))
        self.assertEqual(status, 200, body)
        return body

    def test_models_and_health(self):
        status, models = self.server.get_json("/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(models["object"], "list")
        self.assertEqual(models["data"][0]["id"], "test-llama")
        status, health = self.server.get_json("/health")
        self.assertEqual((status, health["status"]), (200, "ok"))

    def test_chat_completion_shape_and_exact_usage(self):
        body = self.chat([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Say something."}], max_tokens=6)
        self.assertEqual(body["object"], "chat.completion")
        choice = body["choices"][0]
        self.assertEqual(choice["message"]["role"], "assistant")
        self.assertIsInstance(choice["message"]["content"], str)
        usage = body["usage"]
        ids = body["skippy"]["completion_token_ids"]
        self.assertEqual(usage["completion_tokens"], len(ids))
        self.assertEqual(usage["prompt_tokens"], body["skippy"]["prompt_token_count"])
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
        self.assertIn("cached_tokens", usage["prompt_tokens_details"])
        if choice["finish_reason"] == "length":
            self.assertEqual(len(ids), 6)

    def test_greedy_is_deterministic_and_stream_matches(self):
        messages = [{"role": "user", "content": "Tell me about caches."}]
        a = self.chat(messages, max_tokens=12)
        b = self.chat(messages, max_tokens=12)
        self.assertEqual(a["skippy"]["completion_token_ids"], b["skippy"]["completion_token_ids"])
        status, events = self.server.stream("/v1/chat/completions",
                                            h.chat(messages, max_tokens=12,
                                                   stream_options={"include_usage": True}))
        self.assertEqual(status, 200)
        self.assertEqual(events[-1], "[DONE]")
        chunks = events[:-1]
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        streamed_ids = [t for c in chunks if c["choices"]
                        for t in c["choices"][0]["delta"].get("skippy_token_ids", [])]
        self.assertEqual(text, a["choices"][0]["message"]["content"])
        self.assertEqual(streamed_ids, a["skippy"]["completion_token_ids"])
        finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        self.assertEqual(len(finals), 1)
        usage_chunk = chunks[-1]
        self.assertEqual(usage_chunk["choices"], [])
        self.assertEqual(usage_chunk["usage"], a["usage"])

    def test_completions_with_token_prompt_counts_prompt_exactly(self):
        status, body = self.server.post_json("/v1/completions", {
            "prompt": [1, 450, 4996, 17354, 1701], "max_tokens": 4, "temperature": 0,
            "return_token_ids": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["usage"]["prompt_tokens"], 5)
        self.assertEqual(body["usage"]["completion_tokens"],
                         len(body["skippy"]["completion_token_ids"]))
        status, events = self.server.stream("/v1/completions", {
            "prompt": [1, 450, 4996, 17354, 1701], "max_tokens": 4, "temperature": 0})
        self.assertEqual(status, 200)
        text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        self.assertEqual(text, body["choices"][0]["text"])

    def test_stop_string_cuts_output(self):
        messages = [{"role": "user", "content": "Write a long story about a dragon."}]
        full = self.chat(messages, max_tokens=24)["choices"][0]["message"]["content"]
        self.assertGreater(len(full), 6)
        stop = full[3:6]
        cut = self.chat(messages, max_tokens=24, stop=[stop, "zzzz-never"])
        self.assertEqual(cut["choices"][0]["finish_reason"], "stop")
        self.assertEqual(cut["choices"][0]["message"]["content"], full[:full.index(stop)])
        status, events = self.server.stream("/v1/chat/completions",
                                            h.chat(messages, max_tokens=24, stop=stop))
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]
                       if e["choices"])
        self.assertEqual(text, full[:full.index(stop)])

    def test_max_tokens_and_max_completion_tokens(self):
        body = self.chat([{"role": "user", "content": "Count."}], max_tokens=None,
                         max_completion_tokens=3, ignore_eos=True)
        self.assertEqual(body["usage"]["completion_tokens"], 3)
        self.assertEqual(body["choices"][0]["finish_reason"], "length")

    def test_sampling_with_seed_is_reproducible(self):
        messages = [{"role": "user", "content": "Pick words."}]
        a = self.chat(messages, temperature=0.9, top_p=0.9, top_k=40, seed=1234, max_tokens=10)
        b = self.chat(messages, temperature=0.9, top_p=0.9, top_k=40, seed=1234, max_tokens=10)
        self.assertEqual(a["skippy"]["completion_token_ids"], b["skippy"]["completion_token_ids"])

    def test_concurrent_requests_match_sequential(self):
        prompts = [f"Topic number {i}: explain it." for i in range(6)]
        sequential = [self.chat([{"role": "user", "content": p}], max_tokens=10)
                      ["skippy"]["completion_token_ids"] for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            parallel = list(pool.map(lambda p: self.chat([{"role": "user", "content": p}],
                                                         max_tokens=10)
                                     ["skippy"]["completion_token_ids"], prompts))
        self.assertEqual(parallel, sequential)

    def test_errors_have_openai_shape(self):
        cases = [
            ("/v1/chat/completions", b"{not json", 400),
            ("/v1/chat/completions", json.dumps({"model": "nope", "messages": [
                {"role": "user", "content": "x"}]}).encode(), 404),
            ("/v1/chat/completions", json.dumps({"max_tokens": 3}).encode(), 400),
            ("/v1/chat/completions", json.dumps({"messages": []}).encode(), 400),
            ("/v1/chat/completions", json.dumps({"messages": [{"role": "wizard",
                                                               "content": "x"}]}).encode(), 400),
            ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                 "n": 17}).encode(), 400),
            ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                 "max_tokens": -5}).encode(), 400),
            ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                 "temperature": "hot"}).encode(), 400),
            ("/v1/completions", json.dumps({"prompt": [5, -1]}).encode(), 400),
            ("/v1/completions", json.dumps({"prompt": "word " * 3000}).encode(), 400),
        ]
        for path, raw, expected in cases:
            with self.subTest(raw=raw[:60]):
                status, _, data = self.server.request("POST", path, raw=raw)
                self.assertEqual(status, expected, data)
                err = json.loads(data)["error"]
                self.assertTrue(err["message"])
                self.assertIn("type", err)
                self.assertIn("param", err)
                self.assertIn("code", err)
        status, _, data = self.server.request("POST", "/v1/completions",
                                              raw=json.dumps({"prompt": "word " * 3000}).encode())
        self.assertEqual(json.loads(data)["error"]["code"], "context_length_exceeded")
        status, _, data = self.server.request("POST", "/v1/chat/completions", raw=b"{}",
                                              headers={"Content-Type": "text/plain"})
        self.assertEqual(status, 415)
        # The server still serves normally afterwards.
        self.chat([{"role": "user", "content": "still alive?"}], max_tokens=2)

    def test_every_error_code_is_a_string(self):
        ok = [{"role": "user", "content": "x"}]
        cases = [
            ("POST", "/v1/chat/completions", b"{not json", None, 400, "invalid_request"),
            ("POST", "/v1/chat/completions", json.dumps({"messages": ok, "verbosity": "low"})
             .encode(), None, 400, "unsupported_parameter"),
            ("POST", "/v1/nothing-here", b"{}", None, 404, "not_found"),
            ("POST", "/v1/chat/completions", json.dumps({"model": "nope", "messages": ok})
             .encode(), None, 404, "model_not_found"),
            ("POST", "/v1/chat/completions", b"{}", {"Content-Type": "text/plain"}, 415,
             "unsupported_media_type"),
            ("POST", "/v1/responses", b"{}", {"Content-Type": "text/plain"}, 415,
             "unsupported_media_type"),
        ]
        for method, path, raw, headers, status, code in cases:
            with self.subTest(path=path, status=status):
                got, _, data = self.server.request(method, path, raw=raw, headers=headers)
                self.assertEqual(got, status, data)
                err = json.loads(data)["error"]
                self.assertIsInstance(err["code"], str)
                self.assertEqual(err["code"], code)
        # 413: a declared body over the limit is refused before it is read.
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 999999999\r\n\r\n")
            data = b""
            while b"}}" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertIn(b" 413 ", head.split(b"\r\n")[0])
        self.assertEqual(json.loads(body)["error"]["code"], "request_too_large")

    def test_unknown_top_level_fields_are_accepted_and_reported(self):
        before = self.server.metrics()
        body = h.chat([{"role": "user", "content": "Hi"}], max_tokens=2,
                      client_metadata={"session": "s1"}, some_future_flag=True)
        status, headers, data = self.server.request("POST", "/v1/chat/completions", body)
        self.assertEqual(status, 200, data)
        headers = {k.lower(): v for k, v in headers.items()}
        self.assertEqual(headers.get("x-skippy-ignored-fields"),
                         "client_metadata, some_future_flag")
        self.assertNotIn("x-skippy-dropped-tools", headers)
        after = self.server.metrics()
        for field in ["client_metadata", "some_future_flag"]:
            name = f'skippy_request_ignored_fields_total{{field="{field}"}}'
            self.assertEqual(after[name] - before.get(name, 0), 1, name)
        lines = self.server.access_lines(r"ignored_fields=client_metadata,some_future_flag")
        self.assertEqual(len(lines), 1, lines)
        # A request without them carries no header.
        status, headers, _ = self.server.request("POST", "/v1/chat/completions",
                                                 h.chat([{"role": "user", "content": "Hi"}],
                                                        max_tokens=2))
        self.assertEqual(status, 200)
        self.assertNotIn("x-skippy-ignored-fields", {k.lower() for k in headers})

    def test_access_log_lines_and_rejected_counts(self):
        name = 'skippy_http_responses_rejected_total{status="400",code="unsupported_parameter"}'
        before = self.server.metrics().get(name, 0)
        status, _, _ = self.server.request("POST", "/v1/chat/completions?x=1", h.chat(
            [{"role": "user", "content": "x"}], verbosity="high"))
        self.assertEqual(status, 400)
        lines = self.server.access_lines(r"path=/v1/chat/completions status=400 "
                                         r"code=unsupported_parameter")
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith("skippy: access method=POST "), lines[0])
        self.assertEqual(self.server.metrics()[name] - before, 1)
        # A generation: tokens, cache and timings; streamed ones are logged at their end.
        messages = [{"role": "user", "content": "Access log probe, streamed."}]
        status, events = self.server.stream("/v1/chat/completions",
                                            h.chat(messages, max_tokens=3, ignore_eos=True))
        self.assertEqual(status, 200)
        lines = self.server.access_lines(r"status=200 model=test-llama prompt_tokens=\d+ "
                                         r"cached_tokens=\d+ generated_tokens=3 finish=length")
        self.assertTrue(lines)
        for key in ["cache=", "cache_tier=", "queue_ms=", "ttft_ms=", "total_ms="]:
            self.assertIn(key, lines[-1])
        # Health checks and /metrics are requests too.
        self.server.get_json("/health")
        self.assertTrue(self.server.access_lines(r"method=GET path=/health status=200"))
        self.assertTrue(self.server.access_lines(r"method=GET path=/metrics status=200"))

    def test_client_disconnect_frees_the_lane(self):
        before = self.server.metrics()["skippy_requests_cancelled_total"]
        sock = self.server.open_raw_stream("/v1/chat/completions", h.chat(
            [{"role": "user", "content": "Go on forever."}], max_tokens=1500, ignore_eos=True))
        received = sock.recv(4096)
        self.assertIn(b"200", received.split(b"\r\n")[0])
        sock.close()
        self.assertTrue(self.server.wait_idle(60))
        after = self.server.metrics()["skippy_requests_cancelled_total"]
        self.assertEqual(after, before + 1)


AGENT_SYSTEM = ("You are a coding agent. You read files, run commands and edit code in the "
                "user's repository. Explain what you change and keep answers short. Never "
                "delete files without asking. Prefer small, reviewed steps over large ones. ") * 2


class AgentClientTest(unittest.TestCase):
    """Several API keys (each its own cache tenant), the JSON access log, and max_tokens
    beyond the context (clamped)."""
    KEY_A = "sk-agent-a"
    KEY_B = "sk-agent-b"

    @classmethod
    def setUpClass(cls):
        cls.key_dir = tempfile.TemporaryDirectory()
        key_file = os.path.join(cls.key_dir.name, "keys")
        with open(key_file, "w") as f:
            f.write(f"# the second tenant\n\n  {cls.KEY_B}  \n")
        cls.server = h.Server(h.model_path("llama"), "--lanes", "2", "--ctx-size", "2048",
                              "--cache-min-tokens", "16", "--api-key", cls.KEY_A,
                              "--api-key-file", key_file, "--log-format", "json")
        cls.server.default_headers = {"Authorization": f"Bearer {cls.KEY_A}"}

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.key_dir.cleanup()

    def ask(self, key, system, question="How do I run the tests?", **kw):
        body = h.chat([{"role": "system", "content": system},
                       {"role": "user", "content": question}], max_tokens=4, **kw)
        status, resp = self.server.post_json("/v1/chat/completions", body,
                                             headers={"Authorization": f"Bearer {key}"})
        self.assertEqual(status, 200, resp)
        self.assertTrue(self.server.wait_settled(60))
        return resp["usage"]["prompt_tokens_details"]["cached_tokens"], \
            resp["skippy"]["completion_token_ids"]

    def json_lines(self, until=None, timeout=10):
        """The access records (JSON lines on stderr). With `until`, waits up to `timeout`
        until until(records) holds: a line is written after its response, and the stderr
        reader runs on its own thread."""
        deadline = time.time() + timeout
        while True:
            out = []
            for line in list(self.server.log_lines):
                if line.startswith("{"):
                    record = json.loads(line)
                    if record.get("event") == "access":
                        out.append(record)
            if until is None or until(out) or time.time() >= deadline:
                return out
            time.sleep(0.02)

    def test_startup_line_names_the_tenants(self):
        log = "".join(self.server.log_lines)
        self.assertIn("auth=on (2 keys, per-key cache tenants)", log)
        self.assertIn("log_format=json", log)

    def test_each_api_key_is_its_own_cache_tenant(self):
        a1 = self.ask(self.KEY_A, AGENT_SYSTEM)
        b1 = self.ask(self.KEY_B, AGENT_SYSTEM)
        a2 = self.ask(self.KEY_A, AGENT_SYSTEM)
        b2 = self.ask(self.KEY_B, AGENT_SYSTEM)
        print(f"\n  cached tokens a1={a1[0]} b1={b1[0]} a2={a2[0]} b2={b2[0]}")
        self.assertEqual(a1[0], 0)
        self.assertEqual(b1[0], 0, "key B restored a prefix recorded under key A")
        self.assertGreater(a2[0], 0, "key A must hit its own prefix")
        self.assertGreater(b2[0], 0, "key B must hit its own prefix")
        self.assertEqual({tuple(r[1]) for r in (a1, b1, a2, b2)}, {tuple(a1[1])})
        def tenants_of(records):
            return {r.get("tenant") for r in records
                    if r["path"] == "/v1/chat/completions" and r["status"] == 200}

        tenants = tenants_of(self.json_lines(lambda rs: len(tenants_of(rs) - {None}) >= 2))
        self.assertGreaterEqual(len(tenants - {None}), 2, tenants)
        self.assertTrue(all(t is None or re.fullmatch(r"key:[0-9a-f]{8}", t) for t in tenants))

    def test_prompt_cache_key_shares_and_cache_salt_separates(self):
        system = "Session test. " + AGENT_SYSTEM
        first = self.ask(self.KEY_A, system, prompt_cache_key="session-1")
        second = self.ask(self.KEY_A, system, prompt_cache_key="session-2")
        salted = self.ask(self.KEY_A, system, cache_salt="project-x")
        salted_again = self.ask(self.KEY_A, system, cache_salt="project-x")
        other_key_salted = self.ask(self.KEY_B, system, cache_salt="project-x")
        print(f"\n  cached tokens session-1={first[0]} session-2={second[0]} salt={salted[0]} "
              f"salt again={salted_again[0]} key B + salt={other_key_salted[0]}")
        self.assertEqual(first[0], 0)
        self.assertGreater(second[0], 0, "prompt_cache_key must not separate the cache")
        self.assertEqual(salted[0], 0, "cache_salt must separate the cache")
        self.assertGreater(salted_again[0], 0)
        self.assertEqual(other_key_salted[0], 0, "the same salt under another key is shared")

    def test_unauthorized_requests_are_401_logged_and_counted(self):
        name = 'skippy_http_responses_rejected_total{status="401",code="invalid_api_key"}'
        before = self.server.metrics().get(name, 0)
        status, _, data = self.server.request("POST", "/v1/chat/completions",
                                              h.chat([{"role": "user", "content": "x"}]),
                                              headers={"Authorization": "Bearer sk-wrong"})
        self.assertEqual(status, 401)
        self.assertEqual(json.loads(data)["error"]["code"], "invalid_api_key")
        status, _, data = self.server.request("POST", "/v1/messages", {"max_tokens": 1},
                                              headers={"Authorization": "", "x-api-key": "no"})
        self.assertEqual(status, 401)
        self.assertEqual(self.server.metrics()[name] - before, 2)
        def refused_of(records):
            return [r for r in records if r["status"] == 401]

        refused = refused_of(self.json_lines(lambda rs: len(refused_of(rs)) >= 2))
        self.assertEqual({r["code"] for r in refused}, {"invalid_api_key"})
        self.assertEqual({r["path"] for r in refused}, {"/v1/chat/completions", "/v1/messages"})

    def test_max_tokens_beyond_the_context_is_clamped(self):
        status, models = self.server.get_json("/v1/models")
        n_ctx = models["data"][0]["context_length"]
        self.assertEqual(n_ctx, 1024)
        body = h.chat([{"role": "user", "content": "Write forever."}], max_tokens=1_000_000,
                      ignore_eos=True)
        status, resp = self.server.post_json("/v1/chat/completions", body)
        self.assertEqual(status, 200, resp)
        usage = resp["usage"]
        room = n_ctx - usage["prompt_tokens"]
        print(f"\n  prompt {usage['prompt_tokens']} + completion {usage['completion_tokens']} "
              f"(lane {n_ctx})")
        self.assertEqual(resp["choices"][0]["finish_reason"], "length")
        self.assertLessEqual(usage["completion_tokens"], room)
        self.assertGreaterEqual(usage["completion_tokens"], room - 2)
        def match(r):
            return (r["path"] == "/v1/chat/completions"
                    and r.get("generated_tokens") == usage["completion_tokens"])

        record = [r for r in self.json_lines(lambda rs: any(map(match, rs))) if match(r)]
        self.assertTrue(record)
        self.assertEqual(record[-1]["finish"], "length")


if __name__ == "__main__":
    unittest.main(verbosity=2)
