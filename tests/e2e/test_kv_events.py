"""KV events in vLLM's format (--kv-events): a Python subscriber (pyzmq SUB + msgpack, as
llm-d's and Dynamo's routers read vLLM) decodes what skippy publishes: the topic
kv@<replica>@<model>, 8-byte big-endian sequence numbers from 0, payloads
[ts, events, data_parallel_rank] with tagged array events; BlockStored chains (parents
known, token ids = the tokens of the stored entries), BlockRemoved on LRU eviction and on
DELETE /v1/cache, replay of missed batches from the ROUTER socket with its end marker, the
counters in /metrics, hybrid models advertising only prefixes a stored state restores, and
a bad endpoint stopping the start-up."""
import os
import socket
import subprocess
import sys
import time
import unittest

import skippy_harness as h

try:
    import msgpack
    import zmq
except ImportError:  # a Python other than Debian's: its packages still load
    sys.path.append("/usr/lib/python3/dist-packages")
    import msgpack
    import zmq

BS = 16
CTX = zmq.Context.instance()
TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank. " * 12,
    "Un vélo rouge attend devant la boulangerie pendant que le soleil se lève. " * 12,
    "Numbers and letters: alpha beta gamma delta epsilon zeta eta theta iota. " * 12,
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Subscriber:
    """Follows the advertised blocks of one publisher and checks every event on the way."""

    def __init__(self, test, endpoint):
        self.t = test
        self.sock = CTX.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sock.connect(endpoint)
        self.batches = []  # (topic, seq, raw payload, decoded payload)
        self.paths = {}    # block hash -> token ids from the root to the block's end
        self.stored = []   # BlockStored events, decoded
        self.removed = 0
        time.sleep(0.3)  # PUB/SUB: the subscription must reach the publisher first

    def close(self):
        self.sock.close(linger=0)

    def drain(self, quiet=0.5):
        """Receives until nothing arrives for `quiet` seconds; returns the new batches."""
        new = []
        while self.sock.poll(int(quiet * 1000)):
            topic, seq, payload = self.sock.recv_multipart()
            self.t.assertEqual(len(seq), 8)
            seq = int.from_bytes(seq, "big")
            self.t.assertEqual(seq, len(self.batches), "sequence numbers start at 0, +1 a batch")
            batch = msgpack.unpackb(payload)
            self.t.assertEqual(len(batch), 3, batch)
            ts, events, rank = batch
            self.t.assertIsInstance(ts, float)
            self.t.assertLess(abs(ts - time.time()), 60)
            self.t.assertEqual(rank, 0)
            self.t.assertTrue(events)
            for ev in events:
                self.apply(ev)
            self.batches.append((topic, seq, payload, batch))
            new.append(batch)
        return new

    def apply(self, ev):
        tag = ev[0]
        if tag == "BlockStored":
            self.t.assertEqual(len(ev), 8, ev)
            _, hashes, parent, token_ids, block_size, lora_id, medium, lora_name = ev
            self.t.assertEqual(block_size, BS)
            self.t.assertEqual((lora_id, medium, lora_name), (None, "CPU", None))
            self.t.assertEqual(len(token_ids), len(hashes) * BS)
            if parent is None:
                base = ()
            else:
                self.t.assertIn(parent, self.paths, "the parent was advertised before")
                base = self.paths[parent]
            for i, hh in enumerate(hashes):
                self.t.assertTrue(0 < hh < 2 ** 64)
                self.t.assertNotIn(hh, self.paths, "only blocks new to routers")
                base = base + tuple(token_ids[i * BS:(i + 1) * BS])
                self.paths[hh] = base
            self.stored.append(ev)
        elif tag == "BlockRemoved":
            self.t.assertEqual(len(ev), 3, ev)
            self.t.assertEqual(ev[2], "CPU")
            for hh in ev[1]:
                self.t.assertIn(hh, self.paths, "only advertised blocks are removed")
                del self.paths[hh]
            self.removed += 1
            # What stays is still an unbroken chain.
            left = set(self.paths.values())
            for p in left:
                self.t.assertTrue(len(p) == BS or p[:-BS] in left)
        elif tag == "AllBlocksCleared":
            self.t.assertEqual(len(ev), 1)
            self.paths.clear()
        else:
            self.t.fail(f"unknown event {ev!r}")


def entries(server):
    _, inv = server.get_json("/v1/cache")
    return [item for ns in inv["namespaces"] for item in ns["items"]], inv["namespace"]


def complete(server, text, add_special=True):
    """A /v1/completions request with the prompt as token ids; returns prompt + output ids."""
    status, tok = server.post_json("/tokenize", {"content": text, "add_special": add_special})
    assert status == 200, tok
    prompt = tok["tokens"]
    status, resp = server.post_json("/v1/completions", {
        "prompt": prompt, "max_tokens": 4, "temperature": 0, "return_token_ids": True})
    assert status == 200, resp
    return prompt + resp["skippy"]["completion_token_ids"]


def gauge(server, name):
    return server.metrics().get(name, 0)


class DenseModel(unittest.TestCase):
    def test_stored_evicted_flushed_replayed(self):
        pub, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        with h.Server(h.model_path("llama"), "--kv-events", pub, "--kv-events-replay", rep,
                      "--replica-id", "replica-1", "--kv-events-block-size", str(BS),
                      "--cache-max-entries", "2") as s:
            self.assertTrue(any("kv events on " + pub in l for l in s.log_lines), s.log_lines)
            sub = Subscriber(self, pub)
            try:
                self.run_checks(s, sub, rep)
            finally:
                sub.close()

    def run_checks(self, s, sub, rep):
        # 1. A recorded request: its full blocks, chained from the root, with its tokens.
        seq_a = complete(s, TEXTS[0])
        self.assertTrue(s.wait_settled())
        sub.drain()
        self.assertTrue(sub.stored, "BlockStored after a recorded request")
        topic = sub.batches[0][0]
        self.assertEqual(topic, b"kv@replica-1@test-llama")
        ents, ns = entries(s)
        self.assertTrue(ents)
        for path in sub.paths.values():
            self.assertEqual(list(path), seq_a[:len(path)], "token ids are the prompt's")
        # Each BlockStored ends at the last full block of a stored entry.
        ends = {e["tokens"] // BS * BS for e in ents}
        for ev in sub.stored:
            self.assertIn(len(sub.paths.get(ev[1][-1], ())), ends)
        self.check_matches_cache(s, sub, [seq_a])

        # 2. More entries than --cache-max-entries: evictions withdraw blocks.
        seqs = [seq_a] + [complete(s, t) for t in TEXTS[1:]]
        self.assertTrue(s.wait_settled())
        sub.drain()
        self.assertGreater(sub.removed, 0, "BlockRemoved for evicted entries")
        self.check_matches_cache(s, sub, seqs)

        # 3. DELETE /v1/cache?namespace= withdraws everything left.
        removed_before = sub.removed
        status, _, _ = s.request("DELETE", "/v1/cache?namespace=" + ns)
        self.assertEqual(status, 200)
        sub.drain()
        self.assertGreater(sub.removed, removed_before)
        self.assertEqual(sub.paths, {})
        self.assertEqual(gauge(s, "skippy_kv_events_advertised_blocks"), 0)

        # 4. Replay from seq 1: the batches a late subscriber missed, then the end marker.
        dealer = CTX.socket(zmq.DEALER)
        dealer.connect(rep)
        try:
            dealer.send_multipart([b"", (1).to_bytes(8, "big")])
            got = []
            while True:
                self.assertTrue(dealer.poll(5000), "replay answered")
                frames = dealer.recv_multipart()
                self.assertEqual(len(frames), 3, frames)
                self.assertEqual(frames[0], b"")
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == -1:
                    self.assertEqual(frames[2], b"")
                    break
                got.append((seq, frames[2]))
        finally:
            dealer.close(linger=0)
        self.assertEqual(got, [(b[1], b[2]) for b in sub.batches[1:]])

        # 5. /metrics counts what was sent.
        m = s.metrics()
        self.assertEqual(m["skippy_kv_events_batches_total"], len(sub.batches))
        events = [ev[0] for b in sub.batches for ev in b[3][1]]
        for kind in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
            self.assertEqual(m[f'skippy_kv_events_events_total{{type="{kind}"}}'],
                             events.count(kind), kind)
        self.assertEqual(m["skippy_kv_events_dropped_total"], 0)
        self.assertEqual(m["skippy_kv_events_replays_total"], 1)

    def check_matches_cache(self, s, sub, seqs):
        """The advertised blocks are exactly the full blocks of the entries in /v1/cache."""
        ents, _ = entries(s)
        advertised = set(sub.paths.values())
        expected = set()
        for e in ents:
            n = e["tokens"] // BS * BS
            # The entry's tokens: a request whose advertised chain reaches that deep.
            owners = [q for q in seqs if tuple(q[:n]) in advertised]
            self.assertTrue(n == 0 or owners, (e["tokens"], sorted(map(len, advertised))))
            for q in owners:
                expected |= {tuple(q[:k]) for k in range(BS, n + 1, BS)}
        # No stale block (of an evicted entry), none missing.
        self.assertEqual(sorted(map(len, advertised)), sorted(map(len, expected)))
        self.assertEqual(advertised, expected)
        self.assertEqual(gauge(s, "skippy_kv_events_advertised_blocks"), len(sub.paths))


class HybridModel(unittest.TestCase):
    def test_only_restorable_prefixes(self):
        pub = f"tcp://127.0.0.1:{free_port()}"
        with h.Server(h.model_path("qwen35"), "--kv-events", pub,
                      "--kv-events-block-size", str(BS)) as s:
            self.assertTrue(any("block-aligned checkpoints only" in l for l in s.log_lines))
            sub = Subscriber(self, pub)
            try:
                # Without BOS this prompt leaves entries on and off the block grid.
                seq = complete(s, TEXTS[0], add_special=False)
                body = h.chat([{"role": "user", "content": TEXTS[1]}], max_tokens=4)
                self.assertEqual(s.post_json("/v1/chat/completions", body)[0], 200)
                self.assertTrue(s.wait_settled())
                sub.drain()
            finally:
                sub.close()
            ents, _ = entries(s)
            lengths = {e["tokens"] for e in ents}
            self.assertTrue(any(n % BS for n in lengths), lengths)
            self.assertTrue(any(n % BS == 0 for n in lengths), lengths)
            self.assertTrue(sub.stored, "block-aligned entries are advertised")
            for ev in sub.stored:
                # The chain of every BlockStored ends exactly where a stored state restores.
                self.assertIn(len(sub.paths[ev[1][-1]]), lengths)
            for path in sub.paths.values():
                # Every advertised block lies under a chain that ends at a stored state.
                self.assertTrue(any(len(p) >= len(path) and p[:len(path)] == path and
                                    len(p) in lengths for p in sub.paths.values()))
            self.assertTrue(any(list(p) == seq[:len(p)] and len(p) in lengths
                                for p in sub.paths.values()), "the completion's entry")


class BadEndpoint(unittest.TestCase):
    def start(self, *args):
        return subprocess.run([h.SKIPPY, "serve", "--model", h.model_path("llama"), "--host",
                               "127.0.0.1", "--port", "0", "--threads", h.THREADS] + list(args),
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, SKIPPY_CACHE_DISK="off"))

    def test_bad_endpoints_stop_the_start_up(self):
        r = self.start("--kv-events", "tcp://127.0.0.1:notaport")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--kv-events tcp://127.0.0.1:notaport", r.stderr)
        self.assertNotIn("listening on", r.stderr)
        same = f"tcp://127.0.0.1:{free_port()}"
        r = self.start("--kv-events", same, "--kv-events-replay", same)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--kv-events-replay " + same, r.stderr)


if __name__ == "__main__":
    unittest.main()
