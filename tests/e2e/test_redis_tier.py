"""The shared Redis tier through real servers: two replicas (their own RAM and disk tiers)
share one redis-server; turn 1-3 of a conversation on replica A, turn 4 on replica B restores
from Redis (cache_tier "redis") with the output of a cache-off server, for dense, hybrid and
recurrent models; for the dense model also a turn whose assistant text differs from what A
generated (found by the page-prefix pointers). A tampered or deleted block in Redis is never imported (same output,
counted in /metrics). Redis hung (SIGSTOP) or killed mid-run: both replicas keep answering,
no request waits long for it. The test starts its own redis-server on a unix socket."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import skippy_harness as h
from test_disk_tier import resume_turn
from test_prefix_cache import SYSTEM, USER_TURNS, conversation

REDIS_SERVER = os.environ.get("SKIPPY_REDIS_SERVER", "/usr/bin/redis-server")
FLAGS = ["--cache-min-tokens", "16", "--lanes", "2", "--ctx-size", "8192"]


class Redis:
    """A redis-server of the test's own (no persistence) on a unix socket, and a minimal
    RESP client for the checks and the faults."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="skippy-redis-")
        self.sock = os.path.join(self.dir, "r.sock")
        self.url = "unix://" + self.sock
        self.proc = None
        self.start()

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if self.cmd("PING") == "PONG":
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def cmd(self, *args):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(self.sock)
            out = b"*%d\r\n" % len(args)
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(out)
            with s.makefile("rb") as f:
                return self._reply(f)

    def _reply(self, f):
        line = f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2]
        if kind == b"*":
            return [self._reply(f) for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")


def replica(model, redis, *extra, folder=None):
    args = list(FLAGS) + ["--cache-redis", redis.url]
    if folder:
        args += ["--cache-disk", "on", "--cache-dir", folder]
    return h.Server(model, *args, *extra)


def wait_redis_written(server, timeout=30):
    """Until the replica's records are in and its Redis writer is idle."""
    server.wait_settled()
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if m.get("skippy_cache_redis_write_queue_depth", 1) == 0 and \
                m.get("skippy_cache_redis_writes_total", 0) > 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"nothing written to Redis: {server.metrics()}")


@unittest.skipUnless(os.access(REDIS_SERVER, os.X_OK), "redis-server is not installed")
class SharedTierTest(unittest.TestCase):
    def setUp(self):
        self.redis = Redis()
        self.tmp = tempfile.mkdtemp(prefix="skippy-redis-dirs-")

    def tearDown(self):
        self.redis.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check(self, kind):
        model = h.model_path(kind)
        with h.Server(model, "--cache-mode", "off", *FLAGS) as off:
            reference = conversation(off, USER_TURNS[:4])
        with replica(model, self.redis, folder=os.path.join(self.tmp, "a")) as a, \
                replica(model, self.redis, folder=os.path.join(self.tmp, "b")) as b:
            self.assertIn("redis=unix://", "".join(a.log_lines))
            got = conversation(a, USER_TURNS[:3])
            for turn in range(3):
                self.assertEqual(got[turn][0], reference[turn][0], f"turn {turn}")
            wait_redis_written(a)
            status, resp = resume_turn(b, reference, 3)
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["skippy"]["completion_token_ids"], reference[3][0])
            cached = resp["usage"]["prompt_tokens_details"]["cached_tokens"]
            prompt = resp["usage"]["prompt_tokens"]
            print(f"\n  {kind}: turn 4 on replica B restored {cached} of {prompt} tokens from "
                  f"{resp['skippy']['cache_tier']}")
            self.assertGreater(cached, 0)
            self.assertEqual(resp["skippy"]["cache_tier"], "redis")
            m = b.metrics()
            self.assertEqual(m.get("skippy_cache_redis_up"), 1)
            self.assertGreater(m.get("skippy_cache_redis_reads_total", 0), 0)
            self.assertGreater(m.get("skippy_cache_redis_promotions_total", 0), 0)
            self.assertGreater(m.get('skippy_cache_lookups_total{decision="exact_hit",'
                                     'tier="redis"}', 0), 0)
            self.assertGreater(m.get('skippy_cache_restored_tokens_total{tier="redis"}', 0), 0)
            _, stats = b.get_json("/v1/cache/stats")
            self.assertGreater(stats["tiers"]["redis"]["cached_tokens"], 0)

    def test_dense(self):
        self.check("llama")

    def test_dense_other_reply_text(self):
        """Turn 2 moves to replica B with another assistant text than A generated (a client
        that edits or re-renders the reply): no entry in Redis is a prefix of B's prompt (A
        recorded its turn end: prompt + generated reply), but A's entry shares the prompt of
        turn 1 with it. B finds it by its page-prefix pointers and restores the common prefix
        (the KV pages truncated), with the output of a cache-off server."""
        model = h.model_path("llama")
        edited = [(None, None, "Yes, we are open from nine to six today.")]
        with h.Server(model, "--cache-mode", "off", *FLAGS) as off:
            status, reference = resume_turn(off, edited, 1)
            self.assertEqual(status, 200, reference)
        with replica(model, self.redis, folder=os.path.join(self.tmp, "a")) as a, \
                replica(model, self.redis, folder=os.path.join(self.tmp, "b")) as b:
            first = conversation(a, USER_TURNS[:1])
            self.assertNotEqual(first[0][2], edited[0][2])
            wait_redis_written(a)
            turn1 = first[0][1]["prompt_tokens"]
            keys = self.redis.cmd("KEYS", "skippy:l:*")
            self.assertEqual(len(keys), 1)
            lengths = [int(x) for x in self.redis.cmd("ZRANGE", keys[0], 0, -1)]
            # Every entry is longer than what B's prompt shares with it: none is a prefix.
            self.assertTrue(lengths and min(lengths) > turn1, (lengths, turn1))
            self.assertTrue(self.redis.cmd("KEYS", "skippy:p:*"))
            status, resp = resume_turn(b, edited, 1)
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["skippy"]["completion_token_ids"],
                             reference["skippy"]["completion_token_ids"])
            cached = resp["usage"]["prompt_tokens_details"]["cached_tokens"]
            print(f"\n  dense, another reply text: turn 2 on replica B restored {cached} of "
                  f"{resp['usage']['prompt_tokens']} tokens from {resp['skippy']['cache_tier']} "
                  f"(entries in Redis: {lengths} tokens, turn 1's prompt: {turn1})")
            self.assertGreater(cached, 0)
            self.assertEqual(resp["skippy"]["cache_tier"], "redis")
            m = b.metrics()
            self.assertGreater(m.get("skippy_cache_redis_promotions_total", 0), 0)
            self.assertGreater(m.get('skippy_cache_restored_tokens_total{tier="redis"}', 0), 0)

    def test_hybrid(self):
        self.check("qwen35")

    def test_recurrent(self):
        self.check("mamba2")


@unittest.skipUnless(os.access(REDIS_SERVER, os.X_OK), "redis-server is not installed")
class FaultTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = h.model_path("llama")
        with h.Server(cls.model, "--cache-mode", "off", *FLAGS) as off:
            cls.reference = conversation(off, USER_TURNS[:4])

    def setUp(self):
        self.redis = Redis()

    def tearDown(self):
        self.redis.stop()

    def bad_blocks_are_never_imported(self, damage, reason):
        with replica(self.model, self.redis) as a, replica(self.model, self.redis) as b:
            conversation(a, USER_TURNS[:3])
            wait_redis_written(a)
            blocks = self.redis.cmd("KEYS", "skippy:b:*")
            self.assertTrue(blocks)
            for key in blocks:
                damage(key)
            status, resp = resume_turn(b, self.reference, 3)
            self.assertEqual(status, 200, resp)
            self.assertEqual(resp["skippy"]["completion_token_ids"], self.reference[3][0])
            self.assertNotEqual(resp["skippy"]["cache_tier"], "redis")
            m = b.metrics()
            self.assertGreater(
                m.get(f'skippy_cache_redis_read_failures_total{{reason="{reason}"}}', 0), 0, m)
            self.assertEqual(m.get("skippy_cache_redis_reads_total", 0), 0)
            self.assertEqual(m.get("skippy_cache_errors_total", 0), 0)  # nothing imported
            # The manifest that named the bad block is deleted (asynchronously).
            self.assertGreater(m.get("skippy_cache_redis_quarantined_total", 0), 0)

    def test_tampered_block(self):
        def flip(key):
            byte = self.redis.cmd("GETRANGE", key, 20, 20)
            self.redis.cmd("SETRANGE", key, 20, bytes([byte[0] ^ 0x55]))
        self.bad_blocks_are_never_imported(flip, "checksum_mismatch")

    def test_deleted_block(self):
        self.bad_blocks_are_never_imported(lambda key: self.redis.cmd("DEL", key),
                                           "missing_block")

    def test_redis_hung_then_killed_mid_run(self):
        bound = 10.0  # seconds per request on a loaded 2-core machine (normal: well under 1)
        with replica(self.model, self.redis) as a, replica(self.model, self.redis) as b:
            conversation(a, USER_TURNS[:2])
            wait_redis_written(a)
            results = []
            lock = threading.Lock()

            def client(server, name):
                for i in range(8):
                    # (long enough to be looked up and recorded: the system prompt)
                    messages = [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": f"{name} {i}: {USER_TURNS[i % 6]}"}]
                    t0 = time.time()
                    status, _ = server.post_json("/v1/chat/completions",
                                                 h.chat(messages, max_tokens=4))
                    with lock:
                        results.append((name, i, status, time.time() - t0))
                    time.sleep(0.05)

            threads = [threading.Thread(target=client, args=(s, n))
                       for s, n in ((a, "A"), (b, "B"))]
            for t in threads:
                t.start()
            time.sleep(0.3)
            self.redis.kill(signal.SIGSTOP)  # hung: connections stay open, nothing answers
            time.sleep(1.0)
            self.redis.kill(signal.SIGKILL)
            for t in threads:
                t.join(120)
            self.assertEqual(len(results), 16)
            for name, i, status, seconds in results:
                self.assertEqual(status, 200, (name, i))
                self.assertLess(seconds, bound, (name, i))
            # The conversation still resumes (from the local tiers or a prefill), exactly.
            status, resp = resume_turn(b, self.reference, 2)
            self.assertEqual(status, 200)
            self.assertEqual(resp["skippy"]["completion_token_ids"], self.reference[2][0])
            for server in (a, b):
                m = server.metrics()
                self.assertEqual(m.get("skippy_cache_redis_up"), 0)
                self.assertGreater(m.get("skippy_cache_redis_outages_total", 0), 0)
                log = "".join(server.log_lines)
                # Logged once per outage, not per request.
                self.assertEqual(log.count("redis tier"), m["skippy_cache_redis_outages_total"],
                                 log)
            print(f"\n  Redis hung then killed: {len(results)} requests, slowest "
                  f"{max(r[3] for r in results):.2f} s")


@unittest.skipUnless(os.access(REDIS_SERVER, os.X_OK), "redis-server is not installed")
class StartUpTest(unittest.TestCase):
    def test_redis_down_at_start_up_is_not_fatal_and_rediss_is_refused(self):
        model = h.model_path("llama")
        missing = tempfile.mktemp(prefix="skippy-no-redis-", suffix=".sock")
        with h.Server(model, *FLAGS, "--cache-redis", "unix://" + missing) as s:
            self.assertIn("down at start-up", "".join(s.log_lines))
            status, _ = s.post_json("/v1/chat/completions",
                                    h.chat([{"role": "user", "content": "hi"}], max_tokens=2))
            self.assertEqual(status, 200)
            self.assertEqual(s.metrics().get("skippy_cache_redis_up"), 0)
        proc = subprocess.run([h.SKIPPY, "serve", "--model", model, "--cache-redis",
                               "rediss://127.0.0.1:6380"], capture_output=True, text=True,
                              timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("TLS", proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
