#!/usr/bin/env python3
"""System calls per request, Shield beside nginx (issue 33): what each process asks of the kernel
to proxy one small request to the static backend.

Starts the bench's stack (bench/run.py with SHIELD_BENCH_HOLD=1), then for each path sends N
requests (default 20,000; oha -c20, keep-alive) while `strace -c -f` counts the system calls of
the process that serves it, and prints the calls per request by name, side by side:

* `shield`: the proxy (every thread), static route, production settings;
* `nginx`: the floor's worker (s-nginx: proxy and static backend in one worker, so its counts
  include the backend's side of each hop, which Shield's do not);
* `nginx2`: the plain proxy worker in front of the backend in the other process (s-nginx2),
  the hop Shield makes.

strace slows every call it sees, so the counts are what matter here, not time. Usage:
python3 bench/syscalls.py [N]. Needs strace and oha.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OHA = shutil.which("oha") or os.path.expanduser("~/.cargo/bin/oha")


def nginx_worker(port):
    """The worker pid of the nginx listening on `port`."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    pids = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    for pid in pids:
        with open(f"/proc/{pid}/cmdline") as f:
            if "worker" in f.read():
                return pid
    return max(pids)


def traced(pid, out, load):
    """`load()` run while `strace -c -f` counts `pid`'s system calls into `out`; its result."""
    tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    subprocess.run(["sleep", "1"])
    try:
        return load()
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=60)


def count(pid, url, body, headers, n, work):
    out = os.path.join(work, f"strace.{pid}.{len(os.listdir(work))}")
    args = [OHA, "--no-tui", "--output-format", "json", "-c", "20", "-n", str(n), "-m", "POST", "-d", body]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    report = json.loads(traced(pid, out, lambda: subprocess.run(args + [url], capture_output=True, text=True)).stdout)
    ok = report.get("statusCodeDistribution", {}).get("200", 0)
    return {name: c / max(ok, 1) for name, c in calls_in(out).items()}, ok


def calls_in(path):
    """System call counts by name from a `strace -c` summary file."""
    calls = {}
    with open(path) as f:
        for line in f:
            fields = line.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
                calls[fields[-1]] = int(fields[3])
    return calls


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    for tool in ("strace", OHA):
        if not shutil.which(tool) and not os.path.exists(tool):
            sys.exit(f"{tool} is missing")
    work = tempfile.mkdtemp(prefix="shield-syscalls-")
    stack = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "run.py")], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, SHIELD_BENCH_HOLD="1", SHIELD_BENCH_PEERS="0"))
    try:
        hold = json.loads(stack.stdout.readline())
        body = hold["bodies"]["static"]
        keyed = {"content-type": "application/json", "authorization": f"Bearer {hold['key']}"}
        plain = {"content-type": "application/json"}
        paths = hold["paths"]
        port = lambda url: int(url.split(":")[2].split("/")[0])  # noqa: E731
        measured = {
            "shield": count(hold["proxy_pid"], paths["s-shield"], body, keyed, n, work),
            "nginx": count(nginx_worker(port(paths["s-nginx"])), paths["s-nginx"], body, plain, n, work),
            "nginx2": count(nginx_worker(port(paths["s-nginx2"])), paths["s-nginx2"], body, plain, n, work),
        }
        names = sorted({c for calls, _ in measured.values() for c in calls},
                       key=lambda c: -max(calls.get(c, 0) for calls, _ in measured.values()))
        print(f"system calls per request, {n} requests each (oha -c20, keep-alive), strace -c -f")
        print(f"{'call':<18}" + "".join(f"{name:>10}" for name in measured))
        for call in names:
            row = [measured[name][0].get(call, 0) for name in measured]
            if max(row) >= 0.005:
                print(f"{call:<18}" + "".join(f"{v:>10.2f}" for v in row))
        print(f"{'total':<18}" + "".join(f"{sum(calls.values()):>10.2f}" for calls, _ in measured.values()))
        print(f"{'answered 200':<18}" + "".join(f"{ok:>10}" for _, ok in measured.values()))
    finally:
        stack.send_signal(signal.SIGTERM)
        stack.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
