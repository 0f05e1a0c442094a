"""Shared helpers for skippy's end-to-end tests: start a real server process on a loopback
port with a generated model, and talk to it over HTTP (Python stdlib only)."""
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

SKIPPY = os.environ.get("SKIPPY_BIN", "")
MODELS_DIR = os.environ.get("SKIPPY_TEST_MODELS", "")
# One compute thread per server: ctest runs tests in parallel on a small machine, and
# ggml's spinning thread barriers slow down badly when cores are oversubscribed.
THREADS = os.environ.get("SKIPPY_TEST_THREADS", "1")
# With flash attention (skippy's default for models with attention) a restore leaves at
# least one 64-token body chunk to prefill, and a short last message is prefilled row by
# row: a follow-up that comes back before the end of the previous turn ran restores up to
# this many tokens before the previous prompt's end (README, Exactness).
FLASH_RESTORE_SLACK = 128

# Small generated models shared by the end-to-end tests (made once by the ctest fixture).
MODEL_SPECS = {
    "llama": ["--arch", "llama", "--layers", "2", "--embd", "128", "--heads", "4", "--ffn", "256"],
    "qwen35": ["--arch", "qwen35", "--layers", "4", "--embd", "128", "--heads", "4", "--ffn", "256"],
    "mamba2": ["--arch", "mamba2", "--layers", "2", "--embd", "128"],
}
# Tool-capable models: the Qwen2.5 chat template (tools, <tool_call> JSON calls) and the
# Qwen2.5/Qwen3 tokenizer, whose <tool_call> / </tool_call> are single tokens.
TOOL_MODEL_ARGS = ["--vocab", "qwen3", "--chat-template", "Qwen-Qwen2.5-7B-Instruct", "--f16"]
MODEL_SPECS.update({
    "llama-tools": ["--arch", "llama", "--layers", "2", "--embd", "128", "--heads", "4",
                    "--ffn", "256"] + TOOL_MODEL_ARGS,
    "qwen35-tools": ["--arch", "qwen35", "--layers", "4", "--embd", "128", "--heads", "4",
                     "--ffn", "256"] + TOOL_MODEL_ARGS,
})


def model_path(kind):
    path = os.path.join(MODELS_DIR, f"test-{kind}.gguf")
    if not os.path.exists(path):
        make_model(kind, path)
    return path


def make_model(kind, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + f".tmp{os.getpid()}"
    subprocess.run([SKIPPY, "make-model", "--out", tmp, "--seed", "3"] + MODEL_SPECS[kind],
                   check=True, stdout=subprocess.DEVNULL)
    os.replace(tmp, path)


class Server:
    """A skippy server process on 127.0.0.1 with an OS-chosen port."""

    def __init__(self, model, *extra_args, env=None):
        args = [SKIPPY, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                "--threads", THREADS] + list(extra_args)
        self.log_lines = []
        # Headers every request sends (e.g. an API key), under the request's own.
        self.default_headers = {}
        full_env = dict(os.environ)
        # The disk tier is per test: off unless a test names a folder (--cache-dir or env).
        full_env.setdefault("SKIPPY_CACHE_DISK", "off")
        full_env.update(env or {})
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, errors="replace", env=full_env)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log_lines.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log_lines))
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True)
        self._drain.start()
        self.base = f"http://127.0.0.1:{self.port}"

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.log_lines.append(line)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def request(self, method, path, body=None, headers=None, raw=None, timeout=120):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(self.default_headers)
        h.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def post_json(self, path, body, **kw):
        status, headers, data = self.request("POST", path, body, **kw)
        return status, json.loads(data) if data else None

    def get_json(self, path, **kw):
        status, _, data = self.request("GET", path, **kw)
        return status, json.loads(data)

    def metrics(self):
        _, _, data = self.request("GET", "/metrics")
        values = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def stream(self, path, body, timeout=120):
        """POST with stream=true; returns (status, list of parsed SSE data payloads)."""
        body = dict(body, stream=True)
        status, _, data = self.request("POST", path, body, timeout=timeout)
        events = []
        for block in data.decode().split("\n\n"):
            if block.startswith("data: "):
                payload = block[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return status, events

    def open_raw_stream(self, path, body):
        """Starts a streaming request on a raw socket (for disconnect tests)."""
        payload = json.dumps(dict(body, stream=True)).encode()
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        return sock

    def wait_settled(self, timeout=30):
        """Idle, and the cache has recorded everything: no deferred end of turn, no lane
        waiting for its export, nothing in the record queue."""
        deadline = time.time() + timeout
        names = ("skippy_lanes_busy", "skippy_requests_queued", "skippy_turn_ends_deferred",
                 "skippy_cache_lanes_pending", "skippy_cache_record_queue_pending")
        while time.time() < deadline:
            m = self.metrics()
            if all(m.get(n, 0) == 0 for n in names):
                return True
            time.sleep(0.05)
        return False

    def access_lines(self, pattern, timeout=10):
        """The access-log lines (stderr) that match the regex `pattern`, waiting up to
        `timeout` for at least one (the stderr reader runs on its own thread)."""
        deadline = time.time() + timeout
        while True:
            lines = [line for line in list(self.log_lines)
                     if "access" in line and re.search(pattern, line)]
            if lines or time.time() >= deadline:
                return lines
            time.sleep(0.02)

    def wait_idle(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            _, health = self.get_json("/health")
            if health["lanes_busy"] == 0 and health["queued"] == 0:
                return True
            time.sleep(0.05)
        return False


def chat(messages, **kw):
    body = {"messages": messages, "temperature": 0, "max_tokens": 8, "return_token_ids": True}
    body.update(kw)
    return body
