"""Hostile-load end-to-end tests against the real skippy server on loopback HTTP: slow
clients (slowloris), connection floods, the connection cap, and protocol edge cases (oversize
and many headers, pipelining, HTTP/1.0, Expect: 100-continue, chunked bodies with bad chunk
sizes). Every case must end in a clear status or a close within a bound, never a hang or a
crash, and the server must keep serving. Every loop is bounded in count and time; only
127.0.0.1 is used."""
import json
import os
import resource
import select
import socket
import statistics
import struct
import time
import unittest

import skippy_harness as h
from reliability_support import raw_http, recv_until, rss_kib


def raise_fd_limit(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, wanted), hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def connect(port, timeout=10):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def chat_bytes(max_tokens=4, version="HTTP/1.1", extra=""):
    body = json.dumps({"messages": [{"role": "user", "content": "Hello there"}],
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    head = (f"POST /v1/chat/completions {version}\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n")
    return head.encode(), body


def timed_chat(server):
    start = time.time()
    status, body = server.post_json("/v1/chat/completions", h.chat(
        [{"role": "user", "content": "Hello there"}], max_tokens=4), timeout=60)
    return status, time.time() - start


def metric(server, name):
    """A /metrics value; -1 when the scrape itself is refused (at the connection cap)."""
    try:
        return server.metrics().get(name, 0)
    except ValueError:  # a 503 error body instead of metrics
        return -1


def wait_for(predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def read_responses(sock, count, deadline):
    """Reads up to `count` complete responses (Content-Length bodies); returns a list of
    (status, headers, body) and whether the server closed the connection afterwards."""
    out = []
    buf = b""
    while len(out) < count and time.time() < deadline:
        buf = recv_until(sock, buf, lambda b: b"\r\n\r\n" in b, deadline)
        if b"\r\n\r\n" not in buf:
            break
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        rest = recv_until(sock, rest, lambda b: len(b) >= length, deadline)
        out.append((int(lines[0].split()[1]), headers, rest[:length]))
        buf = rest[length:]
    return out


class SlowClientsTest(unittest.TestCase):
    HEADER_TIMEOUT_MS = 5000

    @classmethod
    def setUpClass(cls):
        raise_fd_limit(4096)
        cls.server = h.Server(h.model_path("llama"), "--lanes", "2",
                              "--http-header-timeout-ms", str(cls.HEADER_TIMEOUT_MS),
                              "--http-body-timeout-ms", str(cls.HEADER_TIMEOUT_MS))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_1000_slow_connections_do_not_delay_a_request(self):
        port = self.server.port
        baseline = []
        for _ in range(3):
            status, seconds = timed_chat(self.server)
            self.assertEqual(status, 200)
            baseline.append(seconds)
        slow = []
        try:
            start = time.time()
            for i in range(1000):  # 800 stop inside the head, 200 inside the body
                sock = connect(port)
                if i % 5:
                    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 b"Content-Ty")
                else:
                    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                                 b'{"messages"')
                slow.append(sock)
            opened = time.time() - start
            self.assertTrue(wait_for(
                lambda: metric(self.server, "skippy_http_connections_open") >= 1000, 10))
            delays = []
            for _ in range(5):
                status, seconds = timed_chat(self.server)
                self.assertEqual(status, 200)
                delays.append(seconds)
            status, _, _, health_seconds = raw_http(port, b"GET /health HTTP/1.1\r\n"
                                                          b"Host: 127.0.0.1\r\n\r\n", timeout=10)
            self.assertEqual(status, 200)
            worst = max(delays) - statistics.median(baseline)
            print(f"\n  1000 slow connections (opened in {opened:.2f} s): chat requests "
                  f"{min(delays) * 1000:.0f}-{max(delays) * 1000:.0f} ms (baseline "
                  f"{statistics.median(baseline) * 1000:.0f} ms), /health "
                  f"{health_seconds * 1000:.0f} ms")
            self.assertLess(worst, 1.0)
            self.assertLess(health_seconds, 1.0)
            # The slow ones are answered 408 once their time is up, and their lanes / handler
            # threads were never taken.
            deadline = time.time() + self.HEADER_TIMEOUT_MS / 1000 + 5
            timed_out = 0
            for sock in slow[:100]:
                sock.settimeout(max(0.1, deadline - time.time()))
                buf = recv_until(sock, b"", lambda b: b"\r\n\r\n" in b, deadline)
                timed_out += buf.startswith(b"HTTP/1.1 408")
            self.assertEqual(timed_out, 100)
        finally:
            for sock in slow:
                sock.close()
        self.assertTrue(wait_for(
            lambda: metric(self.server, "skippy_http_connections_open") <= 1, 10))
        self.assertGreaterEqual(metric(self.server, "skippy_http_header_timeouts_total"), 80)

    def test_trickled_head_is_cut_at_the_header_timeout(self):
        # One byte every 200 ms keeps the socket busy but the head never ends in time.
        sock = connect(self.server.port)
        start = time.time()
        data = b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200
        response = b""
        try:
            for byte in data:
                sock.sendall(bytes([byte]))
                sock.settimeout(0.2)
                try:
                    response = sock.recv(4096)
                    break
                except socket.timeout:
                    pass
                if time.time() - start > self.HEADER_TIMEOUT_MS / 1000 + 5:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            sock.close()
        self.assertTrue(response.startswith(b"HTTP/1.1 408"), response[:100])
        self.assertLess(time.time() - start, self.HEADER_TIMEOUT_MS / 1000 + 3)


class FloodTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise_fd_limit(4096)
        cls.server = h.Server(h.model_path("llama"), "--lanes", "2")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_5000_connections_opened_and_dropped(self):
        port = self.server.port
        for _ in range(20):  # warm-up: allocator pools, caches
            self.assertEqual(timed_chat(self.server)[0], 200)
            raw_http(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.5)
        baseline = rss_kib(self.server.proc.pid)
        start = time.time()
        for round_ in range(10):
            batch = []
            for i in range(500):
                sock = connect(port)
                kind = i % 4
                if kind == 1:
                    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                elif kind == 2:
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                elif kind == 3:  # reset instead of a close
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                batch.append(sock)
            for sock in batch:
                sock.close()
            self.assertLess(time.time() - start, 120)
        flood_seconds = time.time() - start
        self.assertTrue(wait_for(
            lambda: metric(self.server, "skippy_http_connections_open") <= 1, 15))
        status, seconds = timed_chat(self.server)
        self.assertEqual(status, 200)
        time.sleep(0.5)
        after = rss_kib(self.server.proc.pid)
        print(f"\n  5000 connections opened and dropped in {flood_seconds:.1f} s: RSS "
              f"{baseline / 1024:.1f} -> {after / 1024:.1f} MiB, next chat {seconds * 1000:.0f} ms")
        # Under ThreadSanitizer (scripts/test's TSan run sets TSAN_OPTIONS) the server's RSS
        # also holds TSan's shadow memory and allocator caches, which grow with the handler
        # threads' work (35 MiB seen for these 5000 connections and 1250 logged requests,
        # against 0.5 MiB in the normal build): a leak shows in the normal build's run.
        bound_kib = (96 if os.environ.get("TSAN_OPTIONS") else 32) * 1024
        self.assertLess(after - baseline, bound_kib)
        self.assertGreaterEqual(metric(self.server, "skippy_http_connections_accepted_total"),
                                5000)


class ConnectionCapTest(unittest.TestCase):
    def test_connections_beyond_the_cap_get_503_at_once(self):
        raise_fd_limit(1024)
        with h.Server(h.model_path("llama"), "--http-max-connections", "100",
                      "--http-header-timeout-ms", "30000") as server:
            self.assertEqual(metric(server, "skippy_http_connections_max"), 100)
            held = [connect(server.port) for _ in range(99)]
            try:
                # All 99 accepted (this scrape is the 100th), then the last one.
                self.assertTrue(wait_for(
                    lambda: metric(server, "skippy_http_connections_open") == 100, 10))

                def top_up():
                    # The 100th connection races the scrape's close: if the server
                    # still counted the scrape, it refused the newcomer (503, close).
                    # Drop what the server answered and hold 100 live connections.
                    alive = []
                    for sock in held:
                        readable, _, _ = select.select([sock], [], [], 0)
                        if readable:
                            sock.close()
                        else:
                            alive.append(sock)
                    held[:] = alive
                    while len(held) < 100:
                        held.append(connect(server.port))
                    time.sleep(0.2)

                def refused():
                    status, _, _, _ = raw_http(server.port, b"GET /health HTTP/1.1\r\n"
                                                            b"Host: x\r\n\r\n", timeout=5)
                    return status == 503
                # Three refusals in a row: the scrape's own connection is gone too.
                self.assertTrue(wait_for(
                    lambda: top_up() or (refused() and refused() and refused()), 20))
                extra = [connect(server.port) for _ in range(20)]
                statuses = []
                start = time.time()
                for sock in extra:
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    buf = recv_until(sock, b"", lambda b: b"\r\n\r\n" in b, time.time() + 5)
                    statuses.append(buf[:12])
                    self.assertIn(b"Retry-After: 1", buf)
                    sock.close()
                self.assertEqual(set(statuses), {b"HTTP/1.1 503"})
                self.assertLess(time.time() - start, 5)
            finally:
                for sock in held:
                    sock.close()
            self.assertTrue(wait_for(
                lambda: raw_http(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                                 timeout=5)[0] == 200, 10))
            self.assertGreaterEqual(metric(server, "skippy_http_connections_rejected_total"), 20)


class ProtocolEdgeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = h.Server(h.model_path("llama"), "--http-body-timeout-ms", "2000",
                              "--http-idle-timeout-ms", "1000",
                              "--http-max-requests-per-connection", "3")
        cls.port = cls.server.port

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def tearDown(self):
        # Whatever the case did, the server still serves.
        status, _, _, _ = raw_http(self.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                                   timeout=10)
        self.assertEqual(status, 200)

    def assert_error(self, data, statuses, bound=5.0):
        status, headers, body, seconds = raw_http(self.port, data, timeout=bound + 5)
        self.assertIn(status, statuses, body[:200])
        self.assertLess(seconds, bound)
        self.assertEqual(headers.get("connection"), "close")
        self.assertIn("error", json.loads(body))
        return status

    def test_oversize_header_line(self):
        self.assert_error(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n", {431})

    def test_oversize_head(self):
        headers = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 4000) for i in range(12))
        self.assert_error(b"GET /health HTTP/1.1\r\n" + headers + b"\r\n", {431})

    def test_many_headers(self):
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
        self.assert_error(b"GET /health HTTP/1.1\r\n" + headers + b"\r\n", {431})

    def test_garbage_request_line(self):
        self.assert_error(b"\x00\x01 not http at all\r\n\r\n", {400})

    def test_content_length_and_chunked_together(self):
        self.assert_error(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 5\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", {400})

    def test_chunked_bodies_with_bad_chunk_sizes(self):
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        cases = {
            b"zz\r\n{}\r\n0\r\n\r\n": {400},
            b"-5\r\n{}\r\n0\r\n\r\n": {400},
            b"\r\n\r\n": {400},
            b"12345678901234567\r\n": {400},  # more hex digits than 64 bits hold
            b"fffffff\r\n{}": {413},  # larger than --max-body-bytes
            b"2\r\n{}XY0\r\n\r\n": {400},  # chunk data not followed by CRLF
            b"10\r\n{}": {408},  # fewer bytes than announced, then silence
        }
        for body, statuses in cases.items():
            with self.subTest(body=body):
                self.assert_error(head + body, statuses)

    def test_valid_chunked_body(self):
        head, body = chat_bytes()
        head = head.replace(b"Content-Length: %d\r\n" % len(body), b"Transfer-Encoding: chunked\r\n")
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7])
                           for i in range(0, len(body), 7)) + b"0\r\n\r\n"
        status, _, response, _ = raw_http(self.port, head + chunked)
        self.assertEqual(status, 200, response[:200])
        self.assertEqual(json.loads(response)["object"], "chat.completion")

    def test_pipelined_requests_are_answered_in_order(self):
        head, body = chat_bytes()
        data = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + head + body +
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        with connect(self.port) as sock:
            sock.sendall(data)
            responses = read_responses(sock, 3, time.time() + 30)
            self.assertEqual([r[0] for r in responses], [200, 200, 200])
            self.assertIn(b'"lanes"', responses[0][2])
            self.assertIn(b'"chat.completion"', responses[1][2])
            self.assertIn(b'"list"', responses[2][2])
            # --http-max-requests-per-connection 3: the third closes the connection.
            self.assertEqual(responses[2][1].get("connection"), "close")
            self.assertEqual(recv_until(sock, b"", lambda b: False, time.time() + 5), b"")

    def test_http_1_0(self):
        status, headers, body, _ = raw_http(self.port, b"GET /health HTTP/1.0\r\n\r\n")
        self.assertEqual(status, 200)
        head, body = chat_bytes(version="HTTP/1.0")
        with connect(self.port) as sock:
            sock.sendall(head + body)
            responses = read_responses(sock, 1, time.time() + 30)
            self.assertEqual(responses[0][0], 200)
            # HTTP/1.0 without keep-alive: closed after the response.
            self.assertEqual(recv_until(sock, b"", lambda b: False, time.time() + 5), b"")

    def test_expect_100_continue(self):
        head, body = chat_bytes(extra="Expect: 100-continue\r\n")
        with connect(self.port) as sock:
            sock.sendall(head)
            interim = recv_until(sock, b"", lambda b: b"\r\n\r\n" in b, time.time() + 5)
            self.assertTrue(interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim)
            sock.sendall(body)
            responses = read_responses(sock, 1, time.time() + 30)
            self.assertEqual(responses[0][0], 200)
        # A declared body over the limit is refused before the client sends it.
        self.assert_error(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                          b"Content-Length: 100000000\r\n\r\n", {413})

    def test_idle_keep_alive_connection_is_closed(self):
        with connect(self.port) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_responses(sock, 1, time.time() + 10)[0][0], 200)
            start = time.time()
            self.assertEqual(recv_until(sock, b"", lambda b: False, time.time() + 5), b"")
            self.assertLess(time.time() - start, 3)  # --http-idle-timeout-ms 1000


if __name__ == "__main__":
    unittest.main(verbosity=2)
