"""The disk tier of the prefix cache through the real server: a conversation survives a
restart (the next turn after the restart restores from disk, with the output of a
cache-off server), for dense, hybrid and recurrent models; kill -9 while recording never
leaves an entry that is served torn; a second server on the same folder runs without it;
a corrupted block on disk is quarantined and the output stays exact."""
import os
import shutil
import signal
import tempfile
import time
import unittest

import skippy_harness as h
from test_prefix_cache import SYSTEM, USER_TURNS, conversation

FLAGS = ["--cache-min-tokens", "16", "--lanes", "2", "--ctx-size", "8192"]


def disk_server(model, folder, *extra):
    return h.Server(model, *FLAGS, "--cache-disk", "on", "--cache-dir", folder, *extra)


def corrupt_blocks(folder):
    """Flips one byte in the middle of every stored block file of a disk tier under
    `folder`; returns how many were changed."""
    flipped = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if "blocks" in root and os.path.getsize(path) > 64:
                with open(path, "r+b") as f:
                    f.seek(os.path.getsize(path) // 2)
                    byte = f.read(1)
                    f.seek(-1, 1)
                    f.write(bytes([byte[0] ^ 0xFF]))
                flipped += 1
    return flipped


def resume_turn(server, reference, turn):
    """Posts turn `turn` of the USER_TURNS conversation whose earlier replies are those of
    `reference` (conversation()'s result); returns (status, response)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for user, (_, _, reply) in zip(USER_TURNS[:turn], reference[:turn]):
        messages += [{"role": "user", "content": user},
                     {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": USER_TURNS[turn]})
    return server.post_json("/v1/chat/completions", h.chat(messages, max_tokens=8))


def wait_for_disk(server, entries, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if m.get("skippy_cache_disk_entries", 0) >= entries and \
                m.get("skippy_cache_disk_write_queue_depth", 0) == 0:
            return m
        time.sleep(0.1)
    raise AssertionError(f"disk tier did not reach {entries} entries: {server.metrics()}")


class RestartTest(unittest.TestCase):
    def check(self, kind):
        model = h.model_path(kind)
        with h.Server(model, "--cache-mode", "off", *FLAGS) as off:
            reference = conversation(off, USER_TURNS[:4])
        folder = tempfile.mkdtemp(prefix=f"skippy-disk-{kind}-")
        try:
            with disk_server(model, folder) as first:
                got = conversation(first, USER_TURNS[:3])
                for turn in range(3):
                    self.assertEqual(got[turn][0], reference[turn][0], f"turn {turn}")
            # Stopped (SIGTERM): the records went to disk. A new process on the same folder
            # serves the conversation's fourth turn from disk.
            with disk_server(model, folder) as second:
                self.assertIn("entries, reconciled in", "".join(second.log_lines))
                status, resp = resume_turn(second, reference, 3)
                self.assertEqual(status, 200, resp)
                self.assertEqual(resp["skippy"]["completion_token_ids"], reference[3][0])
                cached = resp["usage"]["prompt_tokens_details"]["cached_tokens"]
                prompt = resp["usage"]["prompt_tokens"]
                print(f"\n  {kind}: after restart turn 4 restored {cached} of {prompt} tokens "
                      f"({resp['skippy']['cache']})")
                self.assertGreater(cached, prompt // 2)
                self.assertEqual(resp["skippy"]["cache_tier"], "disk")
                m = second.metrics()
                self.assertGreater(m.get("skippy_cache_disk_promotions_total", 0), 0)
                self.assertGreater(m.get('skippy_cache_lookups_total{decision="exact_hit",'
                                         'tier="disk"}', 0), 0)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def test_dense(self):
        self.check("llama")

    def test_hybrid(self):
        self.check("qwen35")

    def test_recurrent(self):
        self.check("mamba2")


class CrashTest(unittest.TestCase):
    def test_kill_9_while_recording_never_serves_torn_entries(self):
        model = h.model_path("qwen35")
        with h.Server(model, "--cache-mode", "off", *FLAGS) as off:
            reference = [conversation(off, [f"Crash {i}: {USER_TURNS[i % 6]}"])[0][0]
                         for i in range(6)]
        folder = tempfile.mkdtemp(prefix="skippy-disk-crash-")
        try:
            kills = 0
            deadline = time.time() + 90
            for i in range(12):
                if time.time() > deadline:
                    break
                server = disk_server(model, folder)
                try:
                    got = conversation(server, [f"Crash {i % 6}: {USER_TURNS[i % 6]}"])[0][0]
                    self.assertEqual(got, reference[i % 6], f"run {i}: output differs")
                    # The records are being written now: kill at a different moment each run.
                    time.sleep((i % 4) * 0.02)
                finally:
                    os.kill(server.proc.pid, signal.SIGKILL)
                    server.proc.wait(10)
                    kills += 1
            with disk_server(model, folder) as last:
                for i in range(6):
                    got = conversation(last, [f"Crash {i}: {USER_TURNS[i]}"])[0][0]
                    self.assertEqual(got, reference[i], f"after {kills} kills: output differs")
                m = last.metrics()
                self.assertEqual(m.get("skippy_cache_errors_total", 0), 0)
                self.assertEqual(m.get("skippy_cache_disk_read_failures_total", 0), 0)
            print(f"\n  {kills} SIGKILLs while recording: no torn entry served")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class FolderTest(unittest.TestCase):
    def test_second_server_on_the_same_folder_runs_without_it(self):
        model = h.model_path("llama")
        folder = tempfile.mkdtemp(prefix="skippy-disk-lock-")
        try:
            with disk_server(model, folder) as first, disk_server(model, folder) as second:
                log = "".join(second.log_lines)
                self.assertIn("disk=off", log)
                self.assertIn("pid", log)  # names the owner
                status, _ = second.post_json("/v1/chat/completions",
                                             h.chat([{"role": "user", "content": "hi"}],
                                                    max_tokens=2))
                self.assertEqual(status, 200)
                self.assertIn("disk=" + folder, "".join(first.log_lines))
            mode = os.stat(folder).st_mode & 0o777
            self.assertEqual(mode, 0o700, oct(mode))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def test_corrupted_block_is_quarantined_and_output_stays_exact(self):
        model = h.model_path("llama")
        with h.Server(model, "--cache-mode", "off", *FLAGS) as off:
            reference = conversation(off, USER_TURNS[:2])
        folder = tempfile.mkdtemp(prefix="skippy-disk-corrupt-")
        try:
            with disk_server(model, folder) as first:
                conversation(first, USER_TURNS[:2])
            self.assertGreater(corrupt_blocks(folder), 0)
            with disk_server(model, folder) as second:
                got = conversation(second, USER_TURNS[:2])
                self.assertEqual([t[0] for t in got], [t[0] for t in reference])
                m = second.metrics()
                self.assertGreater(m.get("skippy_cache_disk_read_failures_total", 0), 0)
                self.assertEqual(m.get("skippy_cache_errors_total", 0), 0)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
