"""The real agent CLIs against skippy, end to end: Claude Code (`claude -p`, Anthropic
Messages) and Codex CLI (`codex exec`, OpenAI Responses), at the versions pinned in
tests/e2e/package.json. For each client two sessions run in the same working folder and HOME
(their prompts embed both): session 1 must complete without an HTTP or protocol error, and
session 2's first request, which repeats session 1's prompt head (~12k tokens of system
prompt and tool definitions), must restore at least 85% of its prompt from the cache.

The clients talk to the server through a recording proxy on loopback, which logs each
request's status (and error body) and its prompt / cached tokens from the server's /metrics
deltas around the request (skippy: skippy_prompt_tokens_total, skippy_cached_tokens_total;
llama-server, started with --metrics: llamacpp:prompt_tokens_total, which counts only what
it prefilled, and llamacpp:prompt_tokens_cached_total), besides the usage in the reply.

The same two sessions then run on llama-server (SKIPPY_LLAMA_SERVER, same llama.cpp pin) as
its users run it (model, --parallel 1, the same context, its defaults otherwise), and its
restored tokens are printed beside skippy's. The output cap is 32 tokens on both
(Claude Code: CLAUDE_CODE_MAX_OUTPUT_TOKENS; Codex sends none, so both servers get a
server-side default: skippy --max-output-tokens, llama-server -n), so every turn of the
random-weight model ends quickly. A turn cut there is not an error: Claude Code continues a
reply cut at max_tokens up to 3 times (each request appends the partial reply and a "resume"
message) and then ends with exit 1 and "API Error: Claude's response exceeded the 32 output
token maximum"; codex exec exits 1 with "Incomplete response returned, reason:
max_output_tokens". Any other error, an HTTP status other than 200 or a malformed stream
fails the session.
"""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import skippy_harness as h

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fixtures"))
import agent_wire as wire  # noqa: E402
import capture  # noqa: E402

# The smallest model with a tool-calling template (Qwen2.5's), trained context 32k:
# llama-server caps a slot at the training context (llama-tools has 4096).
MODEL = "llama-tools-32k"
h.MODEL_SPECS.setdefault(MODEL, h.MODEL_SPECS["llama-tools"] + ["--ctx", "32768"])
CTX = 32768                    # one lane holds Claude Code's ~12k-token prompt and more
MAX_OUTPUT = 32
CACHED_FRACTION = 0.85
# skippy may restore less than llama-server by this fraction of the prompt (or by
# FLASH_RESTORE_SLACK tokens, if more) before the comparison fails; it runs when
# llama-server answered session 2's first request.
LLAMA_TOLERANCE = 0.02
CLI_TIMEOUT_S = 240
PROMPT = "List the files here"
LLAMA_SERVER = os.environ.get("SKIPPY_LLAMA_SERVER", "")


# --------------------------------------------------------------------------------------------
# Recording proxy


class Recorder:
    """Per-request records of one upstream server: method, path, status, error body, prompt
    and cached tokens, skippy's x-skippy-* response headers."""

    def __init__(self, upstream_port, kind):
        self.upstream_port = upstream_port
        self.kind = kind            # "skippy" | "llama"
        self.records = []
        self.lock = threading.Lock()

    def counters(self):
        """(prompt, cached) token totals from /metrics: skippy's skippy_prompt_tokens_total
        and skippy_cached_tokens_total; llama-server's (--metrics) llamacpp:prompt_tokens_total
        counts only the tokens it prefilled, so its prompt is that plus
        llamacpp:prompt_tokens_cached_total."""
        m = h_metrics(self.upstream_port)
        if self.kind == "skippy":
            return m.get("skippy_prompt_tokens_total", 0), m.get("skippy_cached_tokens_total", 0)
        cached = m.get("llamacpp:prompt_tokens_cached_total", 0)
        return m.get("llamacpp:prompt_tokens_total", 0) + cached, cached


def h_metrics(port):
    values = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return values
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    return values


HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
               "proxy-connection", "te", "upgrade"}


def make_proxy(recorder):
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def read_body(self):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))

        def forward(self):
            body = self.read_body() if self.command in ("POST", "PUT") else None
            rec = {"method": self.command, "path": self.path, "t0": time.time()}
            if self.command == "POST":
                rec["before"] = recorder.counters()
            conn = http.client.HTTPConnection("127.0.0.1", recorder.upstream_port,
                                              timeout=CLI_TIMEOUT_S)
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in HOP_HEADERS and k.lower() != "accept-encoding"}
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_HEADERS:
                        self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                data = b""
                while True:
                    piece = resp.read1(65536)
                    if not piece:
                        break
                    if "ttft_s" not in rec:
                        rec["ttft_s"] = time.time() - rec["t0"]
                    data += piece
                    self.wfile.write(piece)
                    self.wfile.flush()
                rec["status"] = resp.status
                rec["headers"] = {k.lower(): v for k, v in resp.getheaders()
                                  if k.lower().startswith("x-skippy")}
            except OSError as e:
                rec["status"] = None
                rec["error"] = f"{type(e).__name__}: {e}"
                data = b""
            finally:
                conn.close()
                self.close_connection = True
            rec["e2e_s"] = time.time() - rec["t0"]
            if rec.get("status") and rec["status"] != 200:
                rec["error"] = data.decode(errors="replace")[:2000]
            api = "anthropic" if self.path.startswith("/v1/messages") else "responses"
            try:
                if self.command == "POST" and rec.get("status") == 200:
                    events = (wire.parse_sse(data)
                              if data.lstrip().startswith((b"event:", b"data:")) else None)
                    if events is not None:
                        rec["stream_problems"] = wire.stream_problems(
                            api, events, sequence_numbers=recorder.kind == "skippy")
                        rec["usage"] = wire.usage(api, events)
                        rec["stop"] = wire.stop_reason(api, events)
                if self.command == "POST":
                    after = recorder.counters()
                    rec["prompt"] = after[0] - rec["before"][0]
                    rec["cached"] = after[1] - rec["before"][1]
            except Exception as e:  # a record must come back whatever went wrong
                rec["stream_problems"] = [f"recorder: {type(e).__name__}: {e}"]
            finally:
                with recorder.lock:
                    recorder.records.append(rec)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = forward

    return Proxy


def start_proxy(recorder):
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_proxy(recorder))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------------------------------------
# llama-server


class LlamaServer:
    """llama-server as its users run it: the model, one slot, the context, the threads, and
    -n (its default output cap; Codex sends none); --metrics only adds the endpoint the
    recorder reads."""

    def __init__(self, model):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [LLAMA_SERVER, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
             "--parallel", "1", "-c", str(CTX), "-t", h.THREADS, "-tb", h.THREADS,
             "-n", str(MAX_OUTPUT), "--metrics"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("llama-server exited:\n" + self.tail())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("llama-server not ready:\n" + self.tail())

    def tail(self, n=30):
        self.log.seek(0)
        return "".join(self.log.readlines()[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_quiet(recorder, timeout=30):
    """Before the next session: skippy settled (end of turn run, records stored); llama-server
    idle (slot saved to its prompt cache)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if recorder.kind == "skippy":
            m = h_metrics(recorder.upstream_port)
            if all(m.get(n, 0) == 0 for n in (
                    "skippy_lanes_busy", "skippy_requests_queued", "skippy_turn_ends_deferred",
                    "skippy_cache_lanes_pending", "skippy_cache_record_queue_pending")):
                return
        else:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{recorder.upstream_port}/slots", timeout=5) as r:
                    if not any(s.get("is_processing") for s in json.loads(r.read())):
                        return
            except (OSError, ValueError):
                pass
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# Sessions


def cli_command(client, base_url, home):
    if client == "claude_code":
        argv, env = capture.claude_command(base_url, home, PROMPT, max_turns=2,
                                           max_tokens=MAX_OUTPUT)
        env["CLAUDE_CODE_MAX_RETRIES"] = "0"
        return argv, env
    argv, env = capture.codex_command(base_url, home, PROMPT, model="test-llama-tools")
    # no retries: a refused request must show as one failed request, not five
    i = next(n for n, a in enumerate(argv) if a.startswith("model_providers.local="))
    argv[i] = argv[i].rstrip("}") + (",request_max_retries=0,stream_max_retries=0,"
                                     "stream_idle_timeout_ms=300000}")
    return argv, env


def run_session(client, base_url, root):
    home, work = os.path.join(root, "home"), os.path.join(root, "work")
    argv, env = cli_command(client, base_url, home)
    start = time.time()
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                       timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
            "seconds": time.time() - start}


def make_folders(root):
    for d in ("home", "work"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for name, text in (("README.md", "# demo\n"), ("main.py", "print('hello')\n")):
        with open(os.path.join(root, "work", name), "w") as f:
            f.write(text)


def two_sessions(client, upstream_port, kind, root):
    """Runs session 1 and 2 of `client` through a recording proxy; returns (sessions,
    records per session)."""
    make_folders(root)
    recorder = Recorder(upstream_port, kind)
    proxy = start_proxy(recorder)
    base = f"http://127.0.0.1:{proxy.server_address[1]}"
    sessions, per_session = [], []
    try:
        for _ in range(2):
            n = len(recorder.records)
            sessions.append(run_session(client, base, root))
            wait_quiet(recorder)
            per_session.append([r for r in recorder.records[n:] if r["method"] == "POST"])
    finally:
        proxy.shutdown()
        proxy.server_close()
    return sessions, per_session


def api_problems(client, session, records):
    """Why a session did not complete as a client session must: HTTP or protocol errors.
    A turn cut at the output cap is fine (the model is random)."""
    problems = []
    if not records:
        problems.append("the client sent no request")
    for r in records:
        if r.get("status") != 200:
            problems.append(f"{r['method']} {r['path']}: HTTP {r.get('status')}: "
                            f"{r.get('error')}")
        elif r.get("stream_problems"):
            problems.append(f"{r['path']}: malformed stream: {r['stream_problems']}")
    out = session["stdout"] + session["stderr"]
    if client == "claude_code":
        try:
            result = json.loads(session["stdout"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            result = None
        text = str((result or {}).get("result", ""))
        # A reply cut at max_tokens is continued by Claude Code (up to 3 more requests, each
        # with the partial reply appended); when every one is cut it ends with exit 1 and
        # "API Error: Claude's response exceeded the 32 output token maximum": the random
        # model, not an error.
        cut = text.startswith("API Error: Claude's response exceeded the") and \
            "output token maximum" in text
        if result is None:
            problems.append(f"no JSON result (exit {session['rc']}): {out[-1500:]}")
        elif not cut and ("API Error" in text or result.get("is_error") or
                          result.get("subtype") not in ("success", "error_max_turns")):
            problems.append(f"result {result.get('subtype')} (exit {session['rc']}): "
                            f"{text[:1000]}")
    else:
        # codex exec exits 1 when a turn ends at the output cap ("ERROR: Incomplete response
        # returned, reason: max_output_tokens"): that is the random model, not an error.
        errors = [l for l in out.splitlines() if l.startswith("ERROR")
                  and "reason: max_output_tokens" not in l]
        cut = "reason: max_output_tokens" in out
        if errors or (session["rc"] != 0 and not cut):
            problems.append(f"exit {session['rc']}: {errors or out[-1500:]}")
    return problems


def describe(label, per_session):
    lines = []
    for s, records in enumerate(per_session):
        for i, r in enumerate(records):
            lines.append(f"  {label} session {s + 1} request {i + 1}: HTTP {r.get('status')} "
                         f"prompt {r.get('prompt')} cached {r.get('cached')} "
                         f"(usage {r.get('usage')}) stop {r.get('stop')} "
                         f"{r.get('e2e_s', 0):.1f}s {r.get('headers') or ''}")
    return "\n".join(lines)


def fraction(record):
    if not record or not record.get("prompt"):
        return None
    return (record.get("cached") or 0) / record["prompt"]


class AgentCliTest:
    client = None

    def test_two_sessions_share_the_prompt_head(self):
        binary = capture.claude_binary() if self.client == "claude_code" else \
            os.path.join(capture.BIN, "codex")
        if not os.path.exists(binary):
            self.fail(f"{binary} missing: run scripts/setup (npm install in tests/e2e)")
        model = h.model_path(MODEL)
        root = tempfile.mkdtemp(prefix=f"skippy-{self.client}-")
        started = time.time()
        try:
            with h.Server(model, "--lanes", "1", "--ctx-size", str(CTX),
                          "--alias", "test-llama-tools,*",
                          "--max-output-tokens", str(MAX_OUTPUT)) as server:
                sessions, per_session = two_sessions(self.client, server.port, "skippy",
                                                     os.path.join(root, "skippy"))
            skippy_s = time.time() - started
            print(f"\n{self.client} on skippy ({skippy_s:.0f} s; sessions "
                  f"{', '.join('%.0f s' % s['seconds'] for s in sessions)}):\n"
                  + describe("skippy", per_session), flush=True)
            for s, (session, records) in enumerate(zip(sessions, per_session)):
                problems = api_problems(self.client, session, records)
                self.assertEqual(problems, [], f"session {s + 1} on skippy:\n"
                                 + "\n".join(problems))
            first = per_session[1][0]
            got = fraction(first)
            self.assertIsNotNone(got, first)
            self.assertGreaterEqual(got, CACHED_FRACTION,
                                    f"session 2's first request: {first['cached']} of "
                                    f"{first['prompt']} prompt tokens restored")

            if not LLAMA_SERVER or not os.path.exists(LLAMA_SERVER):
                print(f"llama-server not found ({LLAMA_SERVER!r}): comparison skipped")
                return
            started = time.time()
            llama = LlamaServer(model)
            try:
                l_sessions, l_per_session = two_sessions(self.client, llama.port, "llama",
                                                         os.path.join(root, "llama"))
            finally:
                llama.stop()
            l_problems = [p for s, r in zip(l_sessions, l_per_session)
                          for p in api_problems(self.client, s, r)]
            l_first = l_per_session[1][0] if len(l_per_session[1]) else None
            l_got = fraction(l_first)
            print(f"{self.client} on llama-server ({time.time() - started:.0f} s):\n"
                  + describe("llama-server", l_per_session)
                  + (f"\n  llama-server problems: {l_problems}" if l_problems else ""))
            print(f"{self.client} session 2 first request restored: skippy "
                  f"{first['cached']:.0f}/{first['prompt']:.0f} = {got:.3f}, llama-server "
                  + (f"{l_first['cached']}/{l_first['prompt']} = {l_got:.3f}"
                     if l_got is not None else "n/a"), flush=True)
            # llama-server's own output parser may reject a random reply (a stream error
            # after the prompt ran): that does not change what its next request restores.
            if l_got is not None and l_first.get("status") == 200:
                # with flash attention skippy leaves up to FLASH_RESTORE_SLACK tokens of the
                # restored prefix to prefill (README, Exactness)
                slack = max(LLAMA_TOLERANCE, h.FLASH_RESTORE_SLACK / first["prompt"])
                self.assertGreaterEqual(got, l_got - slack,
                                        "skippy restored less than llama-server")
        finally:
            shutil.rmtree(root, ignore_errors=True)


class ClaudeCodeTest(AgentCliTest, unittest.TestCase):
    client = "claude_code"


class CodexTest(AgentCliTest, unittest.TestCase):
    client = "codex"


if __name__ == "__main__":
    unittest.main(verbosity=2)
