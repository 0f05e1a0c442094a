"""Raw-socket fuzzing of the HTTP request path of the real skippy server: mutated requests
(bytes flipped, inserted, deleted, duplicated, truncated; headers, lengths and chunk sizes
replaced; fragments sent with pauses) go to 127.0.0.1 over fresh connections. Each must end
in an HTTP status line or a close within a bound, never a hang, and the server must stay
alive and serving; at the end it must exit cleanly.

Bounded: SKIPPY_HTTP_FUZZ_CASES cases (default 400), at most SKIPPY_HTTP_FUZZ_SECONDS
(default 90) of sending; deterministic for a given SKIPPY_HTTP_FUZZ_SEED."""
import concurrent.futures
import json
import os
import random
import re
import socket
import time
import unittest

import skippy_harness as h
from reliability_support import raw_http

CASES = int(os.environ.get("SKIPPY_HTTP_FUZZ_CASES", "400"))
SECONDS = float(os.environ.get("SKIPPY_HTTP_FUZZ_SECONDS", "90"))
SEED = int(os.environ.get("SKIPPY_HTTP_FUZZ_SEED", "1234"))
TIMEOUT_MS = 1500  # header and body timeouts of the fuzzed server
STATUS_LINE = re.compile(rb"^HTTP/1\.[01] [1-5][0-9][0-9] ")


def seeds():
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                       "temperature": 0}).encode()
    completion = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 9]), body[i:i + 9])
                       for i in range(0, len(body), 9)) + b"0\r\n\r\n"
    chat = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return [
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n",
        b"GET /metrics HTTP/1.0\r\n\r\n",
        chat,
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n" % len(completion) + completion,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        b"application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body,
        chat + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # pipelined
    ]


TOKENS = [b"\r\n", b"\n", b"\r", b":", b" ", b"\t", b"\x00", b"\xff", b";", b",", b"0",
          b"-1", b"ffffffffffffffffff", b"99999999999999999999", b"chunked",
          b"Transfer-Encoding: chunked\r\n", b"Content-Length: 0\r\n", b"Content-Length: 7\r\n",
          b"Expect: 100-continue\r\n", b"Connection: close\r\n", b"HTTP/1.0", b"HTTP/2.0",
          b"\r\n\r\n", b"%00", b"../", b"{\"messages\":", b"X-A: " + b"a" * 9000 + b"\r\n"]


def mutate(rng, data, pool):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        pos = rng.randint(0, len(data))
        if op == 0 and data:  # flip bits
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # insert a token
            data[pos:pos] = rng.choice(TOKENS)
        elif op == 2 and data:  # delete a range
            data[pos:pos + rng.randint(1, 16)] = b""
        elif op == 3 and data:  # duplicate a range
            end = min(len(data), pos + rng.randint(1, 64))
            data[pos:pos] = data[pos:end] * rng.randint(1, 8)
        elif op == 4:  # truncate
            data = data[:pos]
        elif op == 5:  # replace a number (lengths, chunk sizes, ids)
            numbers = list(re.finditer(rb"[0-9a-fA-F]+", bytes(data)))
            if numbers:
                m = rng.choice(numbers)
                data[m.start():m.end()] = rng.choice(TOKENS[10:14] + [str(rng.randint(0, 10**6)).encode()])
        elif op == 6:  # many headers
            i = bytes(data).find(b"\r\n")
            if i > 0:
                data[i + 2:i + 2] = b"".join(b"X-%d: v\r\n" % k for k in range(rng.randint(1, 150)))
        elif op == 7:  # splice another seed
            other = rng.choice(pool)
            data[pos:] = other[rng.randint(0, len(other)):]
        else:  # random bytes
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    return bytes(data)


def run_case(port, data, fragments, pause):
    """Sends `data` in `fragments` pieces; returns (first bytes of the answer, seconds)."""
    start = time.time()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    answer = b""
    try:
        step = max(1, len(data) // fragments)
        try:
            for i in range(0, len(data), step):
                sock.sendall(data[i:i + step])
                if pause:
                    time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass
        deadline = time.time() + 2 * TIMEOUT_MS / 1000 + 8
        while time.time() < deadline:
            try:
                sock.settimeout(max(0.05, deadline - time.time()))
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not chunk:
                return answer, time.time() - start, True
            answer += chunk
            if len(answer) > 1 << 20:
                break
        return answer, time.time() - start, False
    finally:
        sock.close()


class HttpFuzzTest(unittest.TestCase):
    def test_mutated_requests(self):
        pool = seeds()
        rng = random.Random(SEED)
        cases = []
        for _ in range(CASES):
            data = mutate(rng, rng.choice(pool), pool)
            cases.append((data, rng.choice([1, 1, 1, 2, 5]), rng.choice([0, 0, 0, 0.05])))
        with h.Server(h.model_path("llama"), "--http-header-timeout-ms", str(TIMEOUT_MS),
                      "--http-body-timeout-ms", str(TIMEOUT_MS), "--lanes", "2") as server:
            port = server.port
            start = time.time()
            problems = []
            outcomes = {}
            with concurrent.futures.ThreadPoolExecutor(16) as pool_:
                futures = []
                for data, fragments, pause in cases:
                    if time.time() - start > SECONDS:
                        break
                    futures.append((data, pool_.submit(run_case, port, data, fragments, pause)))
                for data, future in futures:
                    answer, seconds, closed = future.result()
                    if answer:
                        if not STATUS_LINE.match(answer):
                            problems.append(f"not an HTTP response: {answer[:80]!r} for {data[:120]!r}")
                        outcomes[answer[9:12]] = outcomes.get(answer[9:12], 0) + 1
                    elif not closed:
                        problems.append(f"no answer and no close after {seconds:.1f} s "
                                        f"for {data[:120]!r}")
                    else:
                        outcomes[b"close"] = outcomes.get(b"close", 0) + 1
                    if server.proc.poll() is not None:
                        problems.append("server exited")
                        break
            sent = len(futures)
            print(f"\n  {sent} fuzzed requests in {time.time() - start:.1f} s: " +
                  ", ".join(f"{k.decode()}={v}" for k, v in sorted(outcomes.items())))
            self.assertEqual(problems[:10], [])
            self.assertGreater(sent, min(CASES, 50))
            status, _, body, _ = raw_http(port, seeds()[3])
            self.assertEqual(status, 200, body[:200])
            log = "".join(server.log_lines)
        code = server.stop()
        self.assertEqual(code, 0, log[-2000:])
        self.assertNotIn("terminate called", log)


if __name__ == "__main__":
    unittest.main(verbosity=2)
