"""Layers on other machines (llama.cpp's RPC backend) through the real server, with two
rpc-servers on loopback: the start-up map of layers to devices; an rpc-server that cannot be
reached at start-up (a message naming it, a non-zero exit, no hang); one that goes away while
serving (skippy exits with status 69 and a message naming it); and the restart, with the
rpc-servers on other ports and the same --cache-dir, serving the conversation's next turn
from the disk tier with the output of a cache-off server on the same topology."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import skippy_harness as h
from test_disk_tier import resume_turn, wait_for_disk
from test_prefix_cache import USER_TURNS, conversation

RPC_SERVER = os.environ.get("SKIPPY_RPC_SERVER", "")
FLAGS = ["--cache-min-tokens", "16", "--lanes", "2", "--ctx-size", "4096",
         "--tensor-split", "1,3"]
RPC_LOST_STATUS = 69


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """An rpc-server on 127.0.0.1 with a free port (one compute thread)."""

    def __init__(self):
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen([RPC_SERVER, "-H", "127.0.0.1", "-p", str(self.port),
                                          "-t", "1"], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            deadline = time.time() + 20
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    # (The rpc-server reads no HELLO from this one and serves the next client.)
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    self.endpoint = f"127.0.0.1:{self.port}"
                    return
                except OSError:
                    time.sleep(0.02)
            self.stop()
        raise RuntimeError("rpc-server did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def rpc_server_flags(servers):
    return ["--rpc", ",".join(s.endpoint for s in servers)]


@unittest.skipUnless(RPC_SERVER and os.path.exists(RPC_SERVER), "no rpc-server (scripts/setup)")
class RpcTest(unittest.TestCase):
    def test_unreachable_rpc_server_exits_naming_it(self):
        port = free_port()  # nothing listens there
        t0 = time.time()
        proc = subprocess.run([h.SKIPPY, "serve", "--model", h.model_path("llama"),
                               "--port", "0", "--rpc", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, SKIPPY_CACHE_DISK="off"))
        elapsed = time.time() - t0
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"cannot reach rpc-server 127.0.0.1:{port}", proc.stderr)
        self.assertLess(elapsed, 30)
        print(f"\n  unreachable rpc-server: exit {proc.returncode} after {elapsed:.1f} s: "
              f"{proc.stderr.strip().splitlines()[-1]}")

    def check(self, kind):
        model = h.model_path(kind)
        folder = tempfile.mkdtemp(prefix=f"skippy-rpc-{kind}-")
        servers = [RpcServer(), RpcServer()]
        try:
            # The reference: the same topology with the cache off (an rpc-server serves one
            # client at a time, so one skippy after the other).
            with h.Server(model, "--cache-mode", "off", *FLAGS,
                          *rpc_server_flags(servers)) as off:
                reference = conversation(off, USER_TURNS[:3])
            with h.Server(model, "--cache-disk", "on", "--cache-dir", folder, *FLAGS,
                          *rpc_server_flags(servers)) as first:
                log = "".join(first.log_lines)
                a, b = servers[0].endpoint, servers[1].endpoint
                # --tensor-split 1,3 over the layers + output (2 + 1, or 4 + 1 for qwen35).
                layers = (f"layers 0-1 -> RPC0[{a}], 2-3 -> RPC1[{b}]" if kind == "qwen35"
                          else f"layers 0 -> RPC0[{a}], 1 -> RPC1[{b}]")
                self.assertIn(f"skippy: {layers}, output -> RPC1[{b}]", log)
                print("\n  " + re.search(r"skippy: layers [^\n]*", log).group(0))
                got = conversation(first, USER_TURNS[:2])
                for turn in range(2):
                    self.assertEqual(got[turn][0], reference[turn][0], f"turn {turn}")
                self.assertTrue(first.wait_settled())
                wait_for_disk(first, 1)
                # One rpc-server goes away while serving: the next request's computation
                # fails, and skippy exits naming it.
                servers[1].stop()
                try:
                    first.post_json("/v1/chat/completions",
                                    h.chat([{"role": "user", "content": "Are you there?"}]),
                                    timeout=30)
                except OSError:
                    pass  # the connection closes as the process exits
                status = first.proc.wait(timeout=60)
                self.assertEqual(status, RPC_LOST_STATUS, "".join(first.log_lines[-5:]))
                time.sleep(0.2)  # the stderr reader's last lines
                message = "".join(first.log_lines)
                self.assertIn(f"rpc-server {b} went away", message)
                print("  " + re.search(r"skippy: rpc-server [^\n]*", message).group(0)[:160])
            for s in servers:
                s.stop()
            # Restart on other ports (the identity names no address): the third turn
            # restores the conversation from disk, with the cache-off output.
            servers = [RpcServer(), RpcServer()]
            with h.Server(model, "--cache-disk", "on", "--cache-dir", folder, *FLAGS,
                          *rpc_server_flags(servers)) as second:
                status, resp = resume_turn(second, reference, 2)
                self.assertEqual(status, 200, resp)
                self.assertEqual(resp["skippy"]["completion_token_ids"], reference[2][0])
                cached = resp["usage"]["prompt_tokens_details"]["cached_tokens"]
                prompt = resp["usage"]["prompt_tokens"]
                print(f"  after the restart on other ports: restored {cached} of {prompt} "
                      f"tokens from {resp['skippy']['cache_tier']}")
                self.assertGreater(cached, 0)
                self.assertEqual(resp["skippy"]["cache_tier"], "disk")
        finally:
            for s in servers:
                s.stop()
            shutil.rmtree(folder, ignore_errors=True)

    def test_dense(self):
        self.check("llama")

    def test_hybrid(self):
        self.check("qwen35")

    def test_recurrent(self):
        self.check("mamba2")


if __name__ == "__main__":
    unittest.main(verbosity=2)
