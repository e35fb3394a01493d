#!/usr/bin/env python3
"""Builds every test binary of the workspace and runs them several at a time.

`cargo test` runs one test binary after another. Most of Shield's end-to-end binaries spend
their time waiting (rate windows, breaker cool-downs, flush intervals, streams paced by the
mock), not computing, so running a few at once shortens the suite without adding load that
matters. Every stack is built to be safe in parallel (own database, own Redis prefix, random
ports), and each binary still runs its own tests in parallel as `cargo test` does. A binary
that shares one Redis Cluster among its tests keeps doing so: a binary is one process here, as
under `cargo test` (cargo-nextest would run each test in its own process and start a cluster
for each).

Knobs (environment):
  SHIELD_TEST_JOBS       binaries at once (default 3)
  SHIELD_TEST_TIMEOUT_S  a binary still running after this long is stopped and fails
                         (default 900)
Arguments are passed to every test binary (a name filter, `--nocapture`, ...).

Each binary's output is printed when it ends, whole, with its time; then the times of all,
slowest first. Exits non-zero when any binary failed, was stopped or could not be built.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# The slowest binaries start first, so that the suite does not end waiting on one of them
# alone (measured: `cargo test` runs of 2026-12; the rest follow in name order).
SLOW_FIRST = [
    "proxy_rate_limits",
    "proxy_recovery",
    "load_reconciliation",
    "proxy_streaming",
    "chaos",
    "redis_cluster",
    "claude_code",
    "codex",
    "keys",
]


def build():
    """Builds every test target; returns (name, kind, package directory, executable)."""
    cmd = ["cargo", "test", "--workspace", "--locked", "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    found = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package_dir = os.path.dirname(msg["manifest_path"])
        found.append((target["name"], target["kind"][0], package_dir, msg["executable"]))
    return found


def order(binaries):
    def rank(binary):
        name = binary[0]
        return (SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST), name)

    return sorted(binaries, key=rank)


running = set()
running_lock = threading.Lock()


def run(binary, args, timeout):
    name, kind, package_dir, executable = binary
    env = dict(os.environ, CARGO_MANIFEST_DIR=package_dir)
    started = time.monotonic()
    # Its own process group: stopping it (a timeout, ctrl-c) stops whatever it started too.
    proc = subprocess.Popen(
        [executable, *args],
        cwd=package_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    with running_lock:
        running.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        stop(proc)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out = b"(its output could not be read: something it started still holds it)"
        status = f"FAILED (still running after {timeout} s; stopped)"
    finally:
        with running_lock:
            running.discard(proc)
    took = time.monotonic() - started
    label = f"{kind} {name} ({os.path.relpath(package_dir)})"
    text = out.decode("utf-8", "replace")
    # One write per binary, so that the outputs of binaries running at once do not interleave.
    sys.stdout.write(f"\n== {label}: {status} in {took:.1f} s\n{text}")
    sys.stdout.flush()
    return label, status, took


def stop(proc):
    """Stops the binary and whatever it started: TERM, 10 s, then KILL to the whole group (a
    child that ignored TERM goes too, even when the binary itself has ended)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_all(signum, _frame):
    """Stopped from outside (ctrl-c, CI's timeout): the binaries running go too."""
    with running_lock:
        for proc in list(running):
            stop(proc)
    os._exit(128 + signum)


def main():
    jobs = int(os.environ.get("SHIELD_TEST_JOBS", "3"))
    timeout = int(os.environ.get("SHIELD_TEST_TIMEOUT_S", "900"))
    args = sys.argv[1:]
    binaries = order(build())
    if not binaries:
        sys.exit("no test binaries found in cargo's build output")
    print(f"== running {len(binaries)} test binaries, {jobs} at a time", flush=True)
    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda b: run(b, args, timeout), binaries))
    wall = time.monotonic() - started
    failed = [r for r in results if r[1] != "ok"]
    print(f"\n== test binaries by time ({wall:.0f} s wall, {sum(r[2] for r in results):.0f} s summed)")
    for label, status, took in sorted(results, key=lambda r: -r[2]):
        print(f"{took:7.1f} s  {status:<10} {label}")
    if failed:
        print(f"\n== {len(failed)} of {len(results)} test binaries failed:")
        for label, status, _ in failed:
            print(f"   {label}: {status}")
        sys.exit(1)


if __name__ == "__main__":
    main()
