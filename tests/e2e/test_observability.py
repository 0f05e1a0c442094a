"""Observability of the prefix cache through the real server: every miss reason (never_seen,
evicted, quarantined, below_min_tokens, diverged, namespace, cache_off, restore_failed) and
diverged_at, in the response, the access log and /metrics; /metrics parsed by a real
Prometheus parser (Debian's python3-prometheus-client); token-weighted accounting; the
cache inspection endpoints (GET/DELETE /v1/cache, /v1/cache/requests, /v1/cache/stats, the
SSE stream /v1/cache/events) with and without per-key tenants."""
import json
import shutil
import sys
import tempfile
import threading
import unittest
import urllib.request

import skippy_harness as h
from test_disk_tier import corrupt_blocks

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # a Python other than Debian's: its package still parses
    sys.path.append("/usr/lib/python3/dist-packages")
    from prometheus_client.parser import text_string_to_metric_families

LONG_A = "You are a careful assistant for a bicycle shop. Answer briefly and politely. " * 12
LONG_B = "Tu es un assistant qui parle de cuisine, de recettes et de marchés locaux. " * 12


def ask(server, system, user="Hello?", **kw):
    body = h.chat([{"role": "system", "content": system}, {"role": "user", "content": user}],
                  max_tokens=4, **kw)
    status, resp = server.post_json("/v1/chat/completions", body)
    assert status == 200, resp
    return resp


def families(server):
    _, _, data = server.request("GET", "/metrics")
    return list(text_string_to_metric_families(data.decode()))


def sample(fams, name, **labels):
    """The value of the sample `name` whose labels include `labels` (summed), or 0."""
    total = 0.0
    for fam in fams:
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


class MissReasons(unittest.TestCase):
    def check_reason(self, server, resp, reason, client_reason=None, tier=None):
        sk = resp["skippy"]
        self.assertEqual(sk["miss_reason"], client_reason or reason, sk)
        self.assertEqual(resp["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        if tier:
            self.assertEqual(sk.get("miss_tier"), tier, sk)
        self.assertTrue(server.access_lines(rf"miss_reason={reason}\b"), reason)
        server.wait_idle()
        self.assertGreaterEqual(
            sample(families(server), "skippy_cache_requests_total", reason=reason), 1, reason)

    def test_never_seen_below_min_tokens_cache_off_and_diverged_at(self):
        with h.Server(h.model_path("llama"), "--lanes", "1") as s:
            # A timestamp early in the system prompt: every request misses, and diverged_at
            # says where the prompt stopped matching the one before.
            first = ask(s, "Time: 10:00:01. " + LONG_A)
            self.check_reason(s, first, "never_seen")
            self.assertEqual(first["skippy"]["diverged_at"], 0)
            s.wait_settled()
            second = ask(s, "Time: 10:00:02. " + LONG_A)
            self.check_reason(s, second, "never_seen")
            self.assertGreater(second["skippy"]["diverged_at"], 0)
            self.assertLess(second["skippy"]["diverged_at"], 32)  # the template, "Time: 10:00:0"
            # The same prompt again: a hit, diverged_at covers what was restored.
            s.wait_settled()
            third = ask(s, "Time: 10:00:02. " + LONG_A)
            self.assertEqual(third["skippy"]["cache"], "exact_hit")
            self.assertIsNone(third["skippy"]["miss_reason"])
            self.assertGreaterEqual(third["skippy"]["diverged_at"],
                                    third["usage"]["prompt_tokens_details"]["cached_tokens"])
            self.check_reason(s, ask(s, "Hi."), "below_min_tokens")
            self.check_reason(s, ask(s, LONG_A, cache_prompt=False), "cache_off")
            self.assertIsNone(ask(s, LONG_A, cache_prompt=False)["skippy"]["diverged_at"])
        with h.Server(h.model_path("llama"), "--cache-mode", "off") as off:
            self.check_reason(off, ask(off, LONG_A), "cache_off")

    def test_evicted_from_ram(self):
        with h.Server(h.model_path("llama"), "--lanes", "1", "--cache-max-entries", "1") as s:
            ask(s, LONG_A)
            s.wait_settled()
            ask(s, LONG_B)  # its record evicts A's entry; the lane holds B
            s.wait_settled()
            resp = ask(s, LONG_A)
            self.check_reason(s, resp, "evicted", tier="ram")
            m = families(s)
            self.assertGreaterEqual(sample(m, "skippy_cache_requests_total", decision="miss",
                                           tier="ram", reason="evicted"), 1)
            self.assertGreaterEqual(sample(m, "skippy_cache_evictions_total"), 1)

    def test_restore_failed(self):
        with h.Server(h.model_path("llama"), "--lanes", "1",
                      env={"SKIPPY_TEST_FAIL_RESTORES": "1"}) as s:
            reference = ask(s, LONG_A)
            s.wait_settled()
            ask(s, LONG_B)
            s.wait_settled()
            resp = ask(s, LONG_A)  # restored from RAM: the import fails, the entry goes
            self.assertEqual(resp["skippy"]["cache"], "error")
            self.check_reason(s, resp, "restore_failed")
            self.assertEqual(resp["skippy"]["completion_token_ids"],
                             reference["skippy"]["completion_token_ids"])
            self.assertGreaterEqual(sample(families(s), "skippy_cache_quarantined_total"), 1)

    def test_quarantined_on_disk(self):
        folder = tempfile.mkdtemp(prefix="skippy-obs-disk-")
        try:
            args = ("--lanes", "1", "--cache-dir", folder)
            env = {"SKIPPY_CACHE_DISK": "on"}
            with h.Server(h.model_path("llama"), *args, env=env) as first:
                ask(first, LONG_A)
                first.wait_settled()
            self.assertGreater(corrupt_blocks(folder), 0)
            with h.Server(h.model_path("llama"), *args, env=env) as second:
                self.check_reason(second, ask(second, LONG_A), "quarantined", tier="disk")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def test_namespace_is_reported_to_the_operator_only(self):
        with h.Server(h.model_path("llama"), "--lanes", "2") as s:
            ask(s, LONG_A, cache_salt="tenant-x")
            s.wait_settled()
            resp = ask(s, LONG_A, cache_salt="tenant-y")
            # The client is never told another tenant holds its prompt; the operator is.
            self.check_reason(s, resp, "namespace", client_reason="never_seen")
            self.assertEqual(resp["skippy"]["diverged_at"], 0)

    def test_diverged_on_a_model_with_recurrent_state(self):
        # Such a model restores only where a state was taken: a prompt that shares a long
        # head with a stored one, but diverges before any of its states, misses.
        words = " ".join(f"item{i}" for i in range(220))
        head = " ".join(f"item{i}" for i in range(70))
        with h.Server(h.model_path("qwen35"), "--lanes", "1") as s:
            body = {"prompt": words, "max_tokens": 2, "temperature": 0}
            status, first = s.post_json("/v1/completions", body)
            self.assertEqual(status, 200, first)
            s.wait_settled()
            status, resp = s.post_json("/v1/completions",
                                       dict(body, prompt=head + " zebra" * 150))
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["skippy"]["cache"], "miss", resp["skippy"])
            self.assertGreaterEqual(resp["skippy"]["diverged_at"], 64, resp["skippy"])
            self.check_reason(s, resp, "diverged")


class Metrics(unittest.TestCase):
    def test_metrics_parse_and_account_by_tokens(self):
        with h.Server(h.model_path("llama"), "--lanes", "2") as s:
            for i in range(3):
                ask(s, LONG_A, user=f"Question number {i}: when do you open?")
                s.wait_settled()
            ask(s, "Hi.")
            s.wait_idle()
            fams = families(s)
            names = [f.name for f in fams]
            self.assertEqual(len(names), len(set(names)), "a family is written twice")
            by_name = {f.name: f for f in fams}
            for f in fams:
                self.assertTrue(f.name.startswith("skippy_"), f.name)
                self.assertFalse(f.name.endswith("_ms"), f"{f.name}: base units are seconds")
                if f.type == "counter":
                    for smp in f.samples:
                        self.assertTrue(smp.name.endswith("_total") or
                                        smp.name.endswith("_created"), smp.name)
            ttft = by_name["skippy_time_to_first_token_seconds"]
            self.assertEqual(ttft.type, "histogram")
            for cache in ("hit", "miss"):
                self.assertGreaterEqual(sample([ttft], "skippy_time_to_first_token_seconds_count",
                                               cache=cache), 1, cache)
                buckets = [smp.value for smp in ttft.samples
                           if smp.name.endswith("_bucket") and smp.labels["cache"] == cache]
                self.assertEqual(buckets, sorted(buckets), "buckets are cumulative")
            self.assertEqual(by_name["skippy_cache_restore_seconds"].type, "histogram")
            prompt = sample(fams, "skippy_prompt_tokens_total")
            cached = sample(fams, "skippy_cached_tokens_total")
            prefilled = sample(fams, "skippy_prefilled_tokens_total")
            self.assertGreater(cached, 0)
            self.assertEqual(prompt, cached + prefilled)
            self.assertGreater(sample(fams, "skippy_cache_restored_tokens_total"), 0)
            self.assertGreater(sample(fams, "skippy_prefill_tokens_per_second"), 0)
            self.assertGreater(sample(fams, "skippy_cache_prefill_saved_seconds_total"), 0)
            self.assertGreaterEqual(sample(fams, "skippy_cache_requests_total",
                                           decision="exact_hit"), 2)
            self.assertGreaterEqual(sample(fams, "skippy_cache_requests_total",
                                           reason="below_min_tokens"), 1)
            # The dashboard's JSON says the same.
            _, stats = s.get_json("/v1/cache/stats")
            self.assertEqual(stats["tokens"]["prompt"], prompt)
            self.assertEqual(stats["tokens"]["cached"], cached)
            self.assertAlmostEqual(stats["tokens"]["hit_rate"], cached / prompt, places=6)
            self.assertEqual(stats["requests"]["total"], 4)
            self.assertGreater(stats["prefill"]["saved_seconds"], 0)
            self.assertGreater(stats["ttft"]["hit"]["p50_ms"], 0)
            self.assertGreater(stats["ttft"]["miss"]["p50_ms"], 0)
            self.assertGreater(stats["memory"]["ram"]["bytes"], 0)
            self.assertGreater(stats["memory"]["ram"]["budget_bytes"], 0)
            self.assertEqual(len(stats["recent"]), 4)


class Inspection(unittest.TestCase):
    def test_cache_requests_and_flush_without_keys(self):
        with h.Server(h.model_path("llama"), "--lanes", "1") as s:
            ask(s, LONG_A)
            s.wait_settled()
            ask(s, LONG_B, cache_salt="other")
            s.wait_settled()
            status, inv = s.get_json("/v1/cache")
            self.assertEqual(status, 200)
            self.assertTrue(inv["enabled"])
            self.assertEqual(len(inv["namespaces"]), 2)
            mine = [ns for ns in inv["namespaces"] if ns["yours"]][0]
            self.assertGreaterEqual(mine["entries"], 1)
            item = mine["items"][0]
            for key in ("page", "tokens", "bytes", "tiers", "hits", "last_hit", "stored_at"):
                self.assertIn(key, item)
            self.assertEqual(item["tiers"], ["ram"])
            self.assertGreater(item["tokens"], 64)
            self.assertNotIn("token_ids", json.dumps(inv))
            # The last requests, newest first.
            status, reqs = s.get_json("/v1/cache/requests?limit=5")
            self.assertEqual(status, 200)
            self.assertEqual(len(reqs["data"]), 2)
            r = reqs["data"][0]
            for key in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "cache",
                        "cache_tier", "miss_reason", "diverged_at", "queue_ms", "restore_ms",
                        "ttft_ms", "total_ms"):
                self.assertIn(key, r)
            self.assertEqual(r["prompt_tokens"], r["cached_tokens"] + r["prefilled_tokens"])
            self.assertEqual(s.request("GET", "/v1/cache/requests?limit=x")[0], 400)
            # A flush of one namespace leaves the other.
            other = [ns for ns in inv["namespaces"] if not ns["yours"]][0]
            status, _, body = s.request("DELETE", "/v1/cache?namespace=" + other["namespace"])
            self.assertEqual(status, 200, body)
            self.assertGreaterEqual(json.loads(body)["removed"], 1)
            _, inv = s.get_json("/v1/cache")
            self.assertEqual([ns["namespace"] for ns in inv["namespaces"]], [mine["namespace"]])
            self.assertEqual(s.request("DELETE", "/v1/cache?namespace=0123456789abcdef")[0], 404)
            # Flushing the caller's own namespace: the lane no longer serves it either.
            status, _, body = s.request("DELETE", "/v1/cache")
            self.assertEqual(status, 200, body)
            resp = ask(s, LONG_A)
            self.assertEqual(resp["skippy"]["cache"], "miss", resp["skippy"])

    def test_tenants_see_only_their_own(self):
        keys = ["sk-alpha", "sk-beta"]
        with h.Server(h.model_path("llama"), "--lanes", "2", "--api-key", ",".join(keys)) as s:
            alpha = {"Authorization": "Bearer sk-alpha"}
            beta = {"Authorization": "Bearer sk-beta"}
            s.default_headers = alpha
            ask(s, LONG_A)
            s.default_headers = beta
            ask(s, LONG_B)
            s.wait_settled()
            s.default_headers = {}
            self.assertEqual(s.request("GET", "/v1/cache")[0], 401)
            self.assertEqual(s.request("GET", "/v1/cache/requests")[0], 401)
            self.assertEqual(s.request("GET", "/dashboard")[0], 200)  # the page holds no data
            _, _, body = s.request("GET", "/v1/cache", headers=alpha)
            inv = json.loads(body)
            self.assertEqual(len(inv["namespaces"]), 1, inv)
            self.assertTrue(inv["namespaces"][0]["yours"])
            _, _, body = s.request("GET", "/v1/cache", headers=beta)
            self.assertNotEqual(json.loads(body)["namespace"], inv["namespace"])
            _, _, body = s.request("GET", "/v1/cache/requests", headers=alpha)
            self.assertEqual(len(json.loads(body)["data"]), 1)
            # Another tenant's namespace cannot be flushed; one's own can.
            _, _, body = s.request("GET", "/v1/cache", headers=beta)
            theirs = json.loads(body)["namespace"]
            status, _, _ = s.request("DELETE", "/v1/cache?namespace=" + theirs, headers=alpha)
            self.assertEqual(status, 403)
            status, _, body = s.request("DELETE", "/v1/cache", headers=alpha)
            self.assertEqual(status, 200, body)
            _, _, body = s.request("GET", "/v1/cache", headers=beta)
            self.assertEqual(json.loads(body)["namespaces"][0]["entries"], 1)

    def test_event_stream(self):
        with h.Server(h.model_path("llama"), "--lanes", "1") as s:
            got = []
            ready = threading.Event()

            def listen():
                with urllib.request.urlopen(s.base + "/v1/cache/events", timeout=60) as resp:
                    self.assertEqual(resp.headers["Content-Type"], "text/event-stream")
                    ready.set()
                    event = None
                    for raw in resp:
                        line = raw.decode().rstrip("\n")
                        if line.startswith("event: "):
                            event = line[7:]
                        elif line.startswith("data: ") and event == "request":
                            got.append(json.loads(line[6:]))
                            return

            t = threading.Thread(target=listen, daemon=True)
            t.start()
            self.assertTrue(ready.wait(30))
            ask(s, LONG_A)
            t.join(30)
            self.assertEqual(len(got), 1)
            self.assertEqual(got[0]["cache"], "miss")
            self.assertEqual(got[0]["miss_reason"], "never_seen")


class Progress(unittest.TestCase):
    def test_return_progress_streams_prompt_progress(self):
        with h.Server(h.model_path("llama"), "--lanes", "1", "--batch-size", "128") as s:
            body = h.chat([{"role": "user", "content": "word " * 600}], return_progress=True)
            for warm in (False, True):
                status, events = s.stream("/v1/chat/completions", body)
                self.assertEqual(status, 200)
                progress = [e["prompt_progress"] for e in events
                            if isinstance(e, dict) and "prompt_progress" in e]
                self.assertGreaterEqual(len(progress), 2 if warm else 4, progress)
                done = [e for e in events if isinstance(e, dict) and "skippy" in e][-1]
                total = progress[0]["total"]
                self.assertEqual(progress[-1]["processed"], total)
                self.assertEqual([p["processed"] for p in progress],
                                 sorted(p["processed"] for p in progress))
                self.assertEqual(progress[0]["processed"], progress[0]["cache"])
                self.assertEqual(progress[0]["cache"], 0 if not warm else progress[-1]["cache"])
                self.assertEqual(done["skippy"]["cache"], "exact_hit" if warm else "miss")
                s.wait_settled()
            # Not asked for: none (and never in a non-streamed response).
            status, events = s.stream("/v1/chat/completions", h.chat(
                [{"role": "user", "content": "word " * 600}]))
            self.assertFalse([e for e in events if isinstance(e, dict) and "prompt_progress" in e])
            _, headers, _ = s.request("POST", "/v1/chat/completions", body)
            self.assertNotIn("x-skippy-ignored-fields", {k.lower() for k in headers})


class ResponseFields(unittest.TestCase):
    def test_every_api_carries_the_skippy_object(self):
        with h.Server(h.model_path("llama"), "--lanes", "1") as s:
            status, resp = s.post_json("/v1/messages", {
                "model": "test-llama", "max_tokens": 4, "system": LONG_A,
                "messages": [{"role": "user", "content": "Hello?"}]})
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["skippy"]["miss_reason"], "never_seen")
            s.wait_settled()
            status, resp = s.post_json("/v1/responses", {
                "model": "test-llama", "max_output_tokens": 4, "instructions": LONG_A,
                "input": "Hello?"})
            self.assertEqual(status, 200, resp)
            self.assertIn("skippy", resp)
            self.assertIn("diverged_at", resp["skippy"])
            status, events = s.stream("/v1/chat/completions", h.chat(
                [{"role": "system", "content": LONG_A}, {"role": "user", "content": "Hi"}]))
            last = [e for e in events if isinstance(e, dict) and "skippy" in e]
            self.assertTrue(last)
            self.assertIn("miss_reason", last[-1]["skippy"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
