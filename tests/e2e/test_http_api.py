"""End-to-end tests of skippy's OpenAI HTTP surface against a real server process."""
import concurrent.futures
import json
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
