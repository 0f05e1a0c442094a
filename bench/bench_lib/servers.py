"""Server processes (skippy and llama-server) on loopback, and the HTTP client the workloads
use to time requests. Python stdlib only.

Every server runs as a child process of the harness; `stop_all()` (registered with atexit
and called from the signal handlers in run_bench.py) ends the ones still alive, by pid.
"""
import collections
import dataclasses
import http.client
import json
import re
import socket
import shutil
import subprocess
import tempfile
import threading
import time

from . import config

HOST = "127.0.0.1"  # loopback only, by design

_live = []  # ServerProcess objects not yet stopped
_live_lock = threading.Lock()


class ServerError(RuntimeError):
    """A server could not be started or died; carries the tail of its log."""


@dataclasses.dataclass
class Binaries:
    skippy: str
    llama_server: str


@dataclasses.dataclass
class Variant:
    """One server configuration a workload is measured on."""
    label: str                       # "skippy", "llama-server", "skippy-off", ...
    kind: str                        # "skippy" | "llama"
    lanes: int
    cache_mode: str = None           # skippy only; None = skippy's default (not passed)
    extra: tuple = ()                # more server arguments for this variant only

    @property
    def is_skippy(self):
        return self.kind == "skippy"


LLAMA_MODES = ("defaults", "equal")


@dataclasses.dataclass
class ServerSettings:
    """Settings of every server start of one run.

    llama_mode "defaults" (the default): each server as its users run it. Both get only the
    model, lanes / --parallel, the context (-c = lanes x per-lane cells, so both hold the same
    KV memory) and the threads; everything else is the server's own default (llama-server:
    flash attention auto, --cache-ram, context checkpoints, per-slot KV because --parallel is
    explicit). batch / flash_attn are passed only when the user asks for them.

    llama_mode "equal": the same settings on both (decode batch 512, flash attention off
    unless asked, llama-server with --kv-unified, skippy with an explicit --cache-mode)."""
    threads: int = 2
    batch: int = None                # None: each server's default ("equal": 512)
    flash_attn: bool = False         # True: turn it on for both servers
    llama_mode: str = "defaults"
    # How requests reach llama-server: "openai" = /v1/completions and /v1/chat/completions,
    # like skippy; "native" = its /completion endpoint (chat prompts rendered by the harness).
    llama_api: str = "openai"
    skippy_extra: list = dataclasses.field(default_factory=list)
    llama_extra: list = dataclasses.field(default_factory=list)
    ready_timeout: float = 120.0

    @property
    def equal(self):
        return self.llama_mode == "equal"

    def batch_size(self):
        return self.batch if self.batch else (512 if self.equal else None)


def skippy_argv(bins, settings, variant, model, ctx, cache_dir=None):
    argv = [bins.skippy, "serve", "--model", model, "--host", HOST, "--port", "0",
            "--lanes", str(variant.lanes), "--ctx-size", str(ctx),
            "--threads", str(settings.threads)]
    # skippy's disk tier is on by default: every run gets a fresh folder (deleted when the
    # server stops) unless the caller passes one to carry across a restart.
    if cache_dir:
        argv += ["--cache-dir", cache_dir]
    batch = settings.batch_size()
    if batch:
        argv += ["--batch-size", str(batch)]
    if settings.flash_attn:
        argv += list(config.SKIPPY_FLASH_ATTN_ARGS)
    mode = variant.cache_mode or ("lookup-record" if settings.equal else None)
    if mode:
        argv += [config.SKIPPY_CACHE_MODE_FLAG, mode]
    return argv + list(variant.extra) + list(settings.skippy_extra)


def llama_argv(bins, settings, variant, model, ctx, port):
    argv = [bins.llama_server, "-m", model, "--host", HOST, "--port", str(port),
            "--parallel", str(variant.lanes), "-c", str(ctx),
            "-t", str(settings.threads), "-tb", str(settings.threads)]
    batch = settings.batch_size()
    if batch:
        argv += ["-b", str(batch), "-ub", str(batch)]
    if settings.equal:
        # --kv-unified: one KV pool shared by all slots (otherwise each of the N slots gets
        # ctx/N cells); -fa fixed instead of llama-server's "auto".
        argv += ["-fa", "on" if settings.flash_attn else "off", "--kv-unified", "--no-webui"]
    elif settings.flash_attn:
        argv += ["-fa", "on"]
    return argv + list(variant.extra) + list(settings.llama_extra)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server child process; `port` is known once `start()` returns."""

    def __init__(self, label, argv, port=None, log_path=None):
        self.label = label
        self.argv = argv
        self.port = port              # None: parse "listening on http://HOST:PORT" from stderr
        self.log_path = log_path
        self.log = collections.deque(maxlen=400)
        self.proc = None
        self._port_seen = threading.Event()
        self._log_file = None
        self.owned_dir = None  # a cache folder this process alone uses: deleted at stop

    def start(self, ready_timeout):
        self.proc = _spawn(self.argv)
        self._log_file = open(self.log_path, "w") if self.log_path else None
        with _live_lock:
            _live.append(self)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + ready_timeout
        try:
            if self.port is None:
                while not self._port_seen.wait(0.05):
                    self._check_alive(deadline)
            while not self._healthy():
                self._check_alive(deadline)
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def _drain(self):
        pattern = re.compile(r"listening on http://[^:\s]+:(\d+)")
        for line in self.proc.stderr:
            self.log.append(line)
            if self._log_file:
                self._log_file.write(line)
            if self.port is None:
                m = pattern.search(line)
                if m:
                    self.port = int(m.group(1))
                    self._port_seen.set()

    def _check_alive(self, deadline):
        if self.proc.poll() is not None:
            time.sleep(0.2)  # let the drain thread collect the last lines
            raise ServerError(f"{self.label} exited with {self.proc.returncode} during startup:\n"
                              + self.log_tail())
        if time.monotonic() > deadline:
            raise ServerError(f"{self.label} not ready in time:\n" + self.log_tail())

    def _healthy(self):
        try:
            status, _ = http_get(self.port, "/health", timeout=2)
            return status == 200
        except OSError:
            return False

    def log_tail(self, n=40):
        return "".join(list(self.log)[-n:])

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        with _live_lock:
            if self in _live:
                _live.remove(self)
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        if self.owned_dir:
            shutil.rmtree(self.owned_dir, ignore_errors=True)
            self.owned_dir = None
        return self.proc.returncode


def _spawn(argv, attempts=15):
    """Popen, retried for a while if the binary is missing or busy (being relinked)."""
    for attempt in range(attempts):
        try:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, errors="replace")
        except OSError as e:
            if attempt + 1 == attempts:
                raise ServerError(f"cannot start {argv[0]}: {e}") from e
            time.sleep(2.0)


def start_server(bins, settings, variant, model, ctx, log_path=None, cache_dir=None):
    """Starts the server for `variant` and waits until /health answers 200."""
    if variant.is_skippy:
        own_dir = None
        if cache_dir is None:
            own_dir = cache_dir = tempfile.mkdtemp(prefix="skippy-bench-cache-")
        argv = skippy_argv(bins, settings, variant, model, ctx, cache_dir)
        server = ServerProcess(variant.label, argv, None, log_path)
        server.owned_dir = own_dir
        return server.start(settings.ready_timeout)
    last_error = None
    for _ in range(3):  # the free port can be taken between probing and binding: retry
        port = free_port()
        argv = llama_argv(bins, settings, variant, model, ctx, port)
        try:
            return ServerProcess(variant.label, argv, port, log_path).start(settings.ready_timeout)
        except ServerError as e:
            last_error = e
            if "bind" not in str(e).lower() and "address" not in str(e).lower():
                raise
    raise last_error


def stop_all():
    with _live_lock:
        servers = list(_live)
    for server in servers:
        try:
            server.stop()
        except Exception:  # best effort at exit
            pass


# --------------------------------------------------------------------------------------------
# HTTP client


def http_get(port, path, timeout=10):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def http_post_json(port, path, body, timeout=60):
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else None
    finally:
        conn.close()


def scrape_metrics(port):
    """GET /metrics (Prometheus text) -> {name{labels}: value}; {} if unavailable."""
    try:
        status, data = http_get(port, "/metrics", timeout=10)
    except OSError:
        return {}
    if status != 200:
        return {}
    values = {}
    for line in data.decode(errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name] = float(value)
        except ValueError:
            pass
    return values


def tokenize(port, text):
    """llama-server's /tokenize (no BOS). skippy has no tokenize endpoint."""
    status, body = http_post_json(port, "/tokenize", {"content": text}, timeout=60)
    if status != 200:
        raise ServerError(f"/tokenize failed with HTTP {status}: {body}")
    return body["tokens"]


@dataclasses.dataclass
class Timed:
    """One streamed request as seen by the client (times in ms from sending the request)."""
    ok: bool = False
    error: str = ""
    ttft_ms: float = None        # first chunk carrying generated text
    e2e_ms: float = None         # [DONE] / end of stream
    text: str = ""
    first_text: str = ""         # the first chunk's generated text (the prompt's first token)
    prompt_tokens: int = None
    completion_tokens: int = None
    cached_tokens: int = None    # usage.prompt_tokens_details.cached_tokens
    server_ttft_ms: float = None  # skippy.ttft_ms, or llama-server timings.prompt_ms
    cache_decision: str = None   # skippy.cache
    cache_tier: str = None       # skippy.cache_tier: lane / ram / disk / none
    restore_ms: float = None     # skippy.restore_ms: lane choice, lookup and restore
    queue_ms: float = None       # skippy.queue_ms: waiting for a lane
    llama_cache_n: int = None    # llama-server timings.cache_n
    chunks: int = 0
    # llama-server rejected its own output (its chat parser fails when a random-weight model's
    # reply starts with an orphan UTF-8 byte token): the error arrives when the first token
    # is ready, so ttft_ms is still meaningful; text, e2e and token counts are not.
    output_rejected: bool = False


REJECTED_OUTPUT = "does not match the expected"


def stream_request(port, path, body, timeout):
    """POSTs `body` with stream=true and times it. Never raises for HTTP/protocol errors: they
    come back as Timed(ok=False, error=...). The whole request is bounded by `timeout` s."""
    body = dict(body, stream=True)
    if path.startswith("/v1/"):
        body["stream_options"] = {"include_usage": True}
    out = Timed()
    start = time.perf_counter()
    deadline = start + timeout
    conn = http.client.HTTPConnection(HOST, port, timeout=max(1.0, timeout))
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = f"HTTP {resp.status}: {resp.read()[:500].decode(errors='replace')}"
            return out
        pieces = []
        done = False
        while not done:
            if time.perf_counter() > deadline:
                out.error = f"timed out after {timeout:.0f}s"
                return out
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            out.chunks += 1
            if "error" in chunk:
                out.error = "stream error: " + json.dumps(chunk["error"])[:500]
                if REJECTED_OUTPUT in out.error:
                    out.output_rejected = True
                    if out.ttft_ms is None:
                        out.ttft_ms = (time.perf_counter() - start) * 1000.0
                return out
            if "choices" in chunk:  # OpenAI format
                texts = [c.get("text") if c.get("text") is not None
                         else (c.get("delta") or {}).get("content") for c in chunk["choices"]]
            else:                   # llama-server native /completion
                texts = [chunk.get("content")]
            for piece in texts:
                if piece:
                    if out.ttft_ms is None:
                        out.ttft_ms = (time.perf_counter() - start) * 1000.0
                        out.first_text = piece
                    pieces.append(piece)
            _read_stats(chunk, out)
            if chunk.get("stop") is True and "choices" not in chunk:
                done = True  # the native stream ends after its stop chunk, without [DONE]
        out.e2e_ms = (time.perf_counter() - start) * 1000.0
        out.text = "".join(pieces)
        if out.ttft_ms is None:  # nothing visible was generated: the first token ended the stream
            out.ttft_ms = out.e2e_ms
        out.ok = done
        if not done:
            out.error = "stream ended without [DONE]"
        return out
    except (OSError, http.client.HTTPException, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    finally:
        conn.close()


def _read_stats(chunk, out):
    usage = chunk.get("usage")
    if usage:
        out.prompt_tokens = usage.get("prompt_tokens", out.prompt_tokens)
        out.completion_tokens = usage.get("completion_tokens", out.completion_tokens)
        details = usage.get("prompt_tokens_details") or {}
        if "cached_tokens" in details:
            out.cached_tokens = details["cached_tokens"]
    skippy = chunk.get("skippy")
    if skippy:
        out.cache_decision = skippy.get("cache", out.cache_decision)
        out.cache_tier = skippy.get("cache_tier", out.cache_tier)
        if skippy.get("restore_ms") is not None:
            out.restore_ms = skippy["restore_ms"]
        if skippy.get("queue_ms") is not None:
            out.queue_ms = skippy["queue_ms"]
        if skippy.get("ttft_ms") is not None:
            out.server_ttft_ms = skippy["ttft_ms"]
    if "tokens_evaluated" in chunk and chunk.get("stop"):  # native final chunk
        out.prompt_tokens = chunk["tokens_evaluated"]
        out.completion_tokens = chunk.get("tokens_predicted", out.completion_tokens)
    timings = chunk.get("timings")
    if timings:
        if timings.get("prompt_ms") is not None:
            out.server_ttft_ms = timings["prompt_ms"]
        if timings.get("cache_n") is not None:
            out.llama_cache_n = timings["cache_n"]
            if out.cached_tokens is None:
                out.cached_tokens = timings["cache_n"]


def read_events(path, kind):
    """The events of type `kind` ("lookup", "record", ...) in skippy's --cache-events-log
    (JSON lines; unparsable lines skipped); [] if the file cannot be read."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("event") == kind:
                    out.append(e)
    except OSError:
        pass
    return out


def run_main(main, argv, cleanups=()):
    """A benchmark script's entry point: runs main(argv) and exits with its status, stopping
    every server it started (and running `cleanups`) however it ends: normally, on an
    exception, on SIGTERM or at interpreter exit."""
    import atexit
    import signal
    import sys

    def stop():
        stop_all()
        for cleanup in cleanups:
            cleanup()

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    atexit.register(stop)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        sys.exit(main(argv))
    finally:
        stop()
