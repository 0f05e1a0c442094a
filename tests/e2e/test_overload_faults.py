"""Overload and client faults against the real skippy server on loopback HTTP: a full queue
gets 429 with Retry-After, a queue timeout 503, 32 clients at once neither crash the server nor
grow its memory without bound; aborted streams and clients that disconnect free their lanes and
leave the outputs of the others unchanged; a failing record worker is counted while serving
goes on."""
import concurrent.futures
import json
import socket
import threading
import time
import unittest

import skippy_harness as h
from reliability_support import (CACHE_FLAGS, SHARED_SYSTEM, ErrorShapeMixin, post_bytes, rss_kib,
                                 user)


def start_blocker(server, max_tokens=3500):
    """A long streaming request; returns its socket once the first chunk arrived (the lane
    is busy)."""
    sock = server.open_raw_stream("/v1/completions", {
        "prompt": "Blocker:", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0})
    buf = b""
    deadline = time.time() + 60
    while b"data: " not in buf and time.time() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    assert b"data: " in buf, buf[:300]
    return sock


class OverloadTest(ErrorShapeMixin, unittest.TestCase):
    def test_queue_full_gets_429_with_retry_after_and_accepted_ones_complete(self):
        with h.Server(h.model_path("llama"), "--lanes", "1", "--queue-depth", "2",
                      "--ctx-size", "4096") as server:
            self.server = server
            blocker = start_blocker(server)
            body = h.chat(user("Tell me a long story."), max_tokens=24, ignore_eos=True)
            results = []
            lock = threading.Lock()

            def one(_):
                status, headers, data = server.request("POST", "/v1/chat/completions", body,
                                                       timeout=300)
                with lock:
                    results.append((status, headers, data))

            with concurrent.futures.ThreadPoolExecutor(10) as pool:
                futures = [pool.submit(one, i) for i in range(10)]
                # While the blocker holds the only lane, at most 2 wait; the rest are refused.
                deadline = time.time() + 60
                while time.time() < deadline:
                    with lock:
                        if sum(1 for r in results if r[0] == 429) >= 8:
                            break
                    time.sleep(0.05)
                blocker.close()  # frees the lane: the queued requests run
                for f in futures:
                    f.result(timeout=300)
            statuses = sorted(r[0] for r in results)
            self.assertEqual(len(results), 10)
            self.assertGreaterEqual(statuses.count(429), 1, statuses)
            self.assertEqual(set(statuses) - {200, 429}, set(), statuses)
            for status, headers, data in results:
                if status == 429:
                    self.assertIn("Retry-After", headers)
                    self.assertGreaterEqual(int(headers["Retry-After"]), 1)
                    err = self.assert_error_body(data, 429, code="queue_full")
                    self.assertEqual(err["type"], "rate_limit_error")
                else:
                    resp = json.loads(data)
                    self.assertEqual(resp["usage"]["completion_tokens"], 24)
                    self.assertEqual(resp["choices"][0]["finish_reason"], "length")
            print(f"\n  burst of 10 on 1 lane, queue depth 2: {statuses.count(200)} served, "
                  f"{statuses.count(429)} refused with 429")
            self.assertTrue(server.wait_idle(60))
            m = server.metrics()
            self.assertEqual(m["skippy_requests_rejected_total"], statuses.count(429))

    def test_queue_timeout_gets_503_with_retry_after(self):
        with h.Server(h.model_path("llama"), "--lanes", "1", "--queue-timeout-ms", "300",
                      "--ctx-size", "4096") as server:
            self.server = server
            blocker = start_blocker(server)
            try:
                start = time.time()
                status, headers, data = server.request(
                    "POST", "/v1/chat/completions", h.chat(user("wait"), max_tokens=2),
                    timeout=120)
                waited = time.time() - start
            finally:
                blocker.close()
            self.assertEqual(status, 503, data)
            self.assertIn("Retry-After", headers)
            self.assert_error_body(data, 503)
            self.assertGreaterEqual(waited, 0.25)
            self.assertTrue(server.wait_idle(60))
            status, body = server.post_json("/v1/chat/completions",
                                            h.chat(user("after"), max_tokens=2))
            self.assertEqual(status, 200, body)

    def test_load_32_clients_no_crash_bounded_memory_all_accepted_complete(self):
        duration = 20.0
        with h.Server(h.model_path("llama"), "--lanes", "4", "--queue-depth", "8",
                      "--ctx-size", "16384", *CACHE_FLAGS) as server:
            self.server = server
            server.post_json("/v1/chat/completions", h.chat(user("warm up"), max_tokens=4))
            rss_before = rss_kib(server.proc.pid)
            before = server.metrics()
            stop_at = time.time() + duration
            outcomes = []
            problems = []
            lock = threading.Lock()

            def client(index):
                for n in range(10000):
                    if time.time() >= stop_at:
                        return
                    kind = (index + n) % 4
                    messages = [{"role": "system", "content": SHARED_SYSTEM}] + \
                        user(f"client {index} request {n}")
                    body = h.chat(messages, max_tokens=8, prompt_cache_key=f"tenant{index % 3}")
                    try:
                        if kind == 0:
                            status, events = server.stream("/v1/chat/completions", body,
                                                           timeout=180)
                            ok = status != 200 or (
                                events and events[-1] == "[DONE]" and
                                any(e["choices"] and e["choices"][0]["finish_reason"]
                                    for e in events[:-1]))
                        elif kind == 1:
                            status, resp = server.post_json("/v1/completions", {
                                "prompt": f"Completion {index} {n}:", "max_tokens": 8,
                                "temperature": 0.7, "seed": n}, timeout=180)
                            ok = status != 200 or resp["choices"][0]["finish_reason"]
                        else:
                            status, resp = server.post_json("/v1/chat/completions", body,
                                                            timeout=180)
                            ok = status != 200 or resp["choices"][0]["finish_reason"]
                    except Exception as e:  # noqa: BLE001 - any failure is reported below
                        with lock:
                            problems.append(f"client {index}: {e!r}")
                        return
                    with lock:
                        outcomes.append(status)
                        if not ok:
                            problems.append(f"client {index}: incomplete response")
                    if status == 429:
                        time.sleep(0.2)  # back off like a polite client (Retry-After)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
            for t in threads:
                t.start()
            peak = rss_before
            while any(t.is_alive() for t in threads):
                peak = max(peak, rss_kib(server.proc.pid))
                time.sleep(0.5)
                if time.time() > stop_at + 240:
                    break
            for t in threads:
                t.join(timeout=1)
            self.assertFalse(any(t.is_alive() for t in threads), "clients hung (deadlock?)")
            self.assertIsNone(server.proc.poll(), "server crashed under load")
            self.assertTrue(server.wait_idle(60), "lanes still busy after the load")
            rss_after = rss_kib(server.proc.pid)
            after = server.metrics()
            ok = outcomes.count(200)
            refused = outcomes.count(429)
            print(f"\n  load: 32 clients x {duration:.0f}s: {ok} served, {refused} refused (429), "
                  f"RSS before {rss_before / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, "
                  f"after {rss_after / 1024:.1f} MiB")
            self.assertEqual(problems, [])
            self.assertGreater(ok, 0)
            self.assertEqual(set(outcomes) - {200, 429}, set())
            self.assertEqual(after["skippy_requests_completed_total"] -
                             before["skippy_requests_completed_total"], ok)
            self.assertEqual(after["skippy_requests_rejected_total"] -
                             before["skippy_requests_rejected_total"], refused)
            self.assertEqual(after["skippy_requests_failed_total"], 0)
            self.assertEqual(after.get("skippy_cache_errors_total", 0), 0)
            self.assertLess(rss_after - rss_before, 300 * 1024)
            self.assertLess(peak - rss_before, 300 * 1024)
            status, body = server.post_json("/v1/chat/completions",
                                            h.chat(user("still fine?"), max_tokens=2))
            self.assertEqual(status, 200, body)


class FaultTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server(h.model_path("llama"), "--lanes", "2", "--ctx-size", "8192",
                              *CACHE_FLAGS)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def normal(self):
        messages = [{"role": "system", "content": SHARED_SYSTEM}] + user("What does it cost?")
        status, body = self.server.post_json("/v1/chat/completions", h.chat(messages,
                                                                              max_tokens=10))
        self.assertEqual(status, 200, body)
        return body["skippy"]["completion_token_ids"]

    def abort_one(self, i):
        if i % 4 == 0:  # unique long prompt: closed during its prefill
            messages = user(f"Unique {i}: " + "many words here " * 150)
        else:  # shared prefix: served from the cache, then closed
            messages = [{"role": "system", "content": SHARED_SYSTEM}] + user(f"Abort {i}")
        sock = self.server.open_raw_stream("/v1/chat/completions", h.chat(
            messages, max_tokens=3000, ignore_eos=True))
        try:
            if i % 2 == 1:  # after the first chunk
                buf = b""
                deadline = time.time() + 60
                while b"data: " not in buf and time.time() < deadline:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    buf += chunk
                if b"data: " not in buf:
                    return f"abort {i}: no first chunk: {buf[:200]!r}"
            return None
        finally:
            sock.close()  # right after sending (i even) or after the first chunk (i odd)

    def test_aborted_streams_free_lanes_and_keep_outputs(self):
        reference = self.normal()
        before = self.server.metrics()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            problems = [p for p in pool.map(self.abort_one, range(100)) if p]
        self.assertEqual(problems, [])
        self.assertTrue(self.server.wait_idle(120), "lanes not freed after 100 aborted streams")
        _, health = self.server.get_json("/health")
        self.assertEqual((health["lanes_busy"], health["queued"]), (0, 0))
        after = self.server.metrics()

        def delta(name):
            return after.get(name, 0) - before.get(name, 0)

        cancelled = delta("skippy_requests_cancelled_total")
        completed = delta("skippy_requests_completed_total")
        print(f"\n  100 aborted streams: {cancelled:.0f} cancelled, {completed:.0f} completed")
        self.assertGreater(cancelled, 50)
        self.assertEqual(cancelled + completed, 100)
        self.assertEqual(delta("skippy_requests_failed_total"), 0)
        self.assertEqual(after.get("skippy_cache_errors_total", 0), 0)
        self.assertEqual(after.get("skippy_cache_record_worker_failures", 0), 0)
        # Same tokens as before the aborts, and the shared prefix is still a cache hit.
        self.assertEqual(self.normal(), reference)
        messages = [{"role": "system", "content": SHARED_SYSTEM}] + user("And the deposit?")
        status, body = self.server.post_json("/v1/chat/completions", h.chat(messages,
                                                                              max_tokens=4))
        self.assertEqual(status, 200, body)
        self.assertGreater(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_non_streaming_client_disconnect_frees_the_lane(self):
        before = self.server.metrics()
        payload = json.dumps(h.chat(user("Talk for a long time."), max_tokens=3500,
                                    ignore_eos=True)).encode()
        sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=30)
        sock.sendall(post_bytes("/v1/chat/completions", payload).replace(
            b"Connection: close\r\n", b""))
        # Close once tokens flow (not during the prefill, where a timed-out wait notices it).
        deadline = time.time() + 60
        generating = False
        while time.time() < deadline and not generating:
            generating = self.server.metrics()["skippy_decode_calls_total"] >= \
                before["skippy_decode_calls_total"] + 20
            time.sleep(0.01)
        sock.close()
        closed = self.server.metrics()
        self.assertTrue(generating, "the request never started generating")
        self.assertTrue(self.server.wait_idle(60), "the lane stayed busy after the client left")
        after = self.server.metrics()
        # Noticed within a poll interval (50 ms), not after max_tokens.
        extra = after["skippy_decode_calls_total"] - closed["skippy_decode_calls_total"]
        print(f"\n  decode steps after the client closed: {extra:.0f}")
        self.assertLess(extra, 300)
        self.assertEqual(after["skippy_requests_cancelled_total"] -
                         before["skippy_requests_cancelled_total"], 1)
        self.assertEqual(after["skippy_requests_completed_total"] -
                         before["skippy_requests_completed_total"], 0)
        self.assertLess(after["skippy_completion_tokens_total"] -
                        before["skippy_completion_tokens_total"], 3500)

    @unittest.skip("a record-worker failure cannot be provoked over HTTP; covered by the C++ "
                   "stage tests (skippy_cache_record_worker_failures)")
    def test_record_worker_failure_is_counted_and_serving_continues(self):
        pass


if __name__ == "__main__":
    unittest.main(verbosity=2)

