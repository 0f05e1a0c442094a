"""What the reliability tests share (test_reliability.py, test_overload_faults.py,
test_hostile_http.py, test_http_fuzz.py): raw HTTP on
a fresh loopback connection, and the checks of an OpenAI-style error body."""
import json
import socket
import time

CACHE_FLAGS = ["--cache-min-tokens", "16"]
N_VOCAB = 32000  # llama-spm, the tokenizer of the generated test models
SHARED_SYSTEM = ("You are the support assistant of a company that rents boats, kayaks and "
                 "canoes on a large lake. Answer questions about prices, opening hours, safety "
                 "rules, weather, life jackets, deposits and cancellations. Be polite and short. "
                 ) * 3


def user(text):
    return [{"role": "user", "content": text}]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def recv_until(sock, buf, done, deadline):
    """Appends what the socket sends to buf until done(buf), EOF, an error or the deadline."""
    while not done(buf) and time.time() < deadline:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        buf += chunk
    return buf


def raw_http(port, data, timeout=30, read_body=True):
    """Sends raw bytes on a fresh loopback connection; returns (status, headers, body, seconds).
    status is None when the server closed the connection without a response."""
    start = time.time()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading everything
        deadline = time.time() + timeout
        buf = recv_until(sock, b"", lambda b: b"\r\n\r\n" in b, deadline)
        if b"\r\n\r\n" not in buf:
            return None, {}, buf, time.time() - start
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if read_body:
            body = recv_until(sock, body, lambda b: len(b) >= length, deadline)
        return status, headers, body, time.time() - start
    finally:
        sock.close()


def post_bytes(path, body, content_type="application/json", extra=""):
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    head += extra
    head += f"Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class ErrorShapeMixin:
    """Assertions shared by the test classes that expect OpenAI error bodies."""
    server = None

    def assert_error_body(self, data, status, code=None, param=None):
        body = json.loads(data)
        self.assertEqual(set(body), {"error"}, body)
        err = body["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"}, err)
        self.assertIsInstance(err["message"], str)
        self.assertTrue(err["message"])
        self.assertIsInstance(err["type"], str)
        self.assertIsInstance(err["code"], str, err)
        if code is not None:
            self.assertEqual(err["code"], code, err)
        if param is not None:
            self.assertEqual(err["param"], param, err)
        return err

    def expect_error(self, status, path, raw, code=None, param=None, headers=None):
        got, _, data = self.server.request("POST", path, raw=raw, headers=headers)
        self.assertEqual(got, status, data[:300])
        return self.assert_error_body(data, status, code, param)

    def expect_chat_error(self, status, body, code=None, param=None):
        return self.expect_error(status, "/v1/chat/completions", json.dumps(body).encode(),
                                 code, param)

    def expect_completion_error(self, status, body, code=None, param=None):
        return self.expect_error(status, "/v1/completions", json.dumps(body).encode(), code,
                                 param)
