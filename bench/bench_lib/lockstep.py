"""Paced runs: the servers of a round run side by side and take turns, one request at a time,
each request sent only once every server is idle.

This machine switches between speeds in phases that last tens of seconds (the same prompt
takes ~560 or ~720 ms on every server), so a workload run on one server and then on the
other compares their phases more than the servers. In a paced run the requests of the
variants alternate (A B A B ..., B A B A ... in odd rounds), so every phase hits all of them
alike, and before each request the harness waits until no server process has used the CPU
for a while: a server's work after a response (skippy's end of turn and cache records, a
llama-server slot save) never lands on the other server's request. That is also the client
this models: one that reads the reply (a person, an agent running its tool) before it sends
the next request. bench/README.md says what it changes against back-to-back runs.
"""
import os
import threading
import time

# A server counts as idle after IDLE_WINDOW_S in which all of them used under IDLE_BUSY_S of
# CPU (skippy starts its end-of-turn work 50 ms after a response; a quiet skippy or
# llama-server uses well under 1 ms per window). IDLE_TIMEOUT_S bounds one wait.
IDLE_WINDOW_S = 0.15
IDLE_BUSY_S = 0.003
IDLE_TIMEOUT_S = 20.0


def cpu_seconds(pids):
    """CPU time the processes' threads have run, from /proc/PID/task/TID/schedstat (ns
    resolution; /proc/PID/stat counts 10 ms ticks). Threads gone in between are skipped."""
    total = 0
    for pid in pids:
        base = f"/proc/{pid}/task"
        try:
            tids = os.listdir(base)
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"{base}/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total / 1e9


def wait_idle(pids, window_s=IDLE_WINDOW_S, busy_s=IDLE_BUSY_S, timeout_s=IDLE_TIMEOUT_S):
    """Blocks until the processes used < busy_s of CPU over one window; returns the seconds
    waited (timeout_s at most: a server that never goes quiet does not stall the run)."""
    start = time.monotonic()
    before = cpu_seconds(pids)
    while True:
        time.sleep(window_s)
        now = cpu_seconds(pids)
        if now - before < busy_s or time.monotonic() - start >= timeout_s:
            return time.monotonic() - start
        before = now


class Lockstep:
    """Turns for the runs named `order`: request(label, send) waits for label's turn and for
    idle servers (`pids`), sends, and passes the turn on to the next run still going.
    leave(label) when a run has sent its last request."""

    def __init__(self, order, pids):
        self.order = list(order)
        self.pids = list(pids)
        self.active = set(self.order)
        self.turn = 0
        self.cv = threading.Condition()
        self.waited_s = 0.0
        self.requests = 0

    def request(self, label, send):
        with self.cv:
            self.cv.wait_for(lambda: self.order[self.turn] == label)
        waited = wait_idle(self.pids)
        try:
            return send()
        finally:
            with self.cv:
                self.waited_s += waited
                self.requests += 1
                self._advance()

    def leave(self, label):
        with self.cv:
            self.active.discard(label)
            if self.order[self.turn] == label:
                self._advance()

    def _advance(self):  # (cv held)
        for _ in range(len(self.order)):
            self.turn = (self.turn + 1) % len(self.order)
            if self.order[self.turn] in self.active:
                break
        self.cv.notify_all()
