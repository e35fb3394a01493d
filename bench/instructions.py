#!/usr/bin/env python3
"""Instructions per proxied request, counted by valgrind's callgrind: a figure that does not
move with the machine's noise (the same binary gives the same count to within 0.1 %), for
judging a hot-path change before the throughput bench.

Starts the bench's stack (bench/run.py with SHIELD_BENCH_HOLD=1: admin, Redis, Postgres, the
static nginx backend, the bench routes with production settings), then for each binary given
starts its proxy under callgrind on a free port, warms it until it routes, counts the
instructions of N requests (default 2,000, oha -c4, the static route) and prints them per
request. Kernel time is not counted, and `rep movs`/`rep stos` count once per byte (memcpy and
memset of large buffers look dearer than they are): compare binaries, and confirm with
bench/run.py.

Usage: python3 bench/instructions.py [-n N] [-r ROUTE] [-k KEY] [-a BYTES [-m]] BINARY [BINARY ...]
(ROUTE: bench-static, the default; bench-limited, the same with rate limits; bench, the mock.
KEY: plain, the default; governed, a key with an allow-list, an expiry and a budget, issue 32;
-a BYTES: a Claude-Code-shaped request of about BYTES instead of the one-line prompt, issue 33;
-m: that request in Messages' shape, to /v1/messages: converted for the OpenAI-shaped target of
bench-static, relayed as sent with -r bench-static-messages)
Needs valgrind and oha (`cargo install oha`).
"""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OHA = shutil.which("oha") or os.path.expanduser("~/.cargo/bin/oha")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count(binary, hold, n, work, route, key, agent, shape):
    port = free_port()
    env = dict(os.environ, **hold["proxy_env"])
    env["SHIELD_PROXY_ADDR"] = f"127.0.0.1:{port}"
    env.pop("SHIELD_BENCH_HOLD", None)
    out = os.path.join(work, f"callgrind.{port}")
    proxy = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", "--instr-atstart=no",
                              binary, "proxy"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = hold["bodies"]["static"].replace('"bench-static"', json.dumps(route))
        if agent:
            # issue 33: a Claude-Code-shaped request of about `agent` bytes, in Chat Completions'
            # shape or (-m) Messages' (answered by the route's OpenAI-shaped target, converted)
            sys.path.insert(0, os.path.join(ROOT, "bench"))
            import agent_request
            anthropic, openai = agent_request.conversation(agent, seed=agent)
            body = json.dumps({**(anthropic if shape == "messages" else openai), "model": route})
            if shape == "messages":
                url = f"http://127.0.0.1:{port}/v1/messages"
        body_file = os.path.join(work, "body.json")
        with open(body_file, "w") as f:
            f.write(body)
        headers = {"content-type": "application/json", "authorization": f"Bearer {hold[key]}"}
        if shape == "messages":
            headers["anthropic-version"] = "2023-06-01"
        args = [OHA, "--no-tui", "-c", "4", "-m", "POST", "-D", body_file]
        for name, value in headers.items():
            args += ["-H", f"{name}: {value}"]
        deadline = time.time() + 120
        while True:  # until it answers through the route (its snapshot is loaded)
            try:
                subprocess.run(args + ["-n", "100", url], capture_output=True, timeout=60)
                request = urllib.request.Request(url, data=body.encode(), headers=headers)
                if urllib.request.urlopen(request, timeout=10).headers.get("x-shield-route") == route:
                    break
            except Exception:
                pass
            if time.time() > deadline:
                sys.exit(f"{binary} never routed the bench request")
            time.sleep(1)
        subprocess.run(["callgrind_control", "-i", "on", str(proxy.pid)], capture_output=True)
        report = subprocess.run(args + ["-n", str(n), "--output-format", "json", url], capture_output=True, text=True)
        subprocess.run(["callgrind_control", "-i", "off", str(proxy.pid)], capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(proxy.pid)], capture_output=True)
        codes = json.loads(report.stdout).get("statusCodeDistribution", {})
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=120)
    total = 0
    for path in glob.glob(f"{out}.{proxy.pid}*"):
        with open(path) as f:
            for line in f:
                if line.startswith("totals:"):
                    total = max(total, int(line.split()[1]))
    if codes != {"200": n}:
        sys.exit(f"{binary}: not every request was answered 200: {codes}")
    return total / n, max(glob.glob(f"{out}.{proxy.pid}*"), key=os.path.getsize)


def main():
    argv = sys.argv[1:]
    n, route, key, agent, shape = 2000, "bench-static", "key", None, "chat"
    while argv[:1] in (["-n"], ["-r"], ["-k"], ["-a"], ["-m"]):
        if argv[0] == "-m":
            shape, argv = "messages", argv[1:]
            continue
        if argv[0] == "-n":
            n = int(argv[1])
        elif argv[0] == "-a":
            agent = int(argv[1])
        elif argv[0] == "-k":
            key = {"plain": "key", "governed": "governed_key"}[argv[1]]
        else:
            route = argv[1]
        argv = argv[2:]
    if not argv:
        sys.exit(__doc__)
    for tool in ("valgrind", "callgrind_control", OHA):
        if not shutil.which(tool) and not os.path.exists(tool):
            sys.exit(f"{tool} is missing")
    work = tempfile.mkdtemp(prefix="shield-instructions-")
    stack = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "run.py")], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, SHIELD_BENCH_HOLD="1", SHIELD_BENCH_PEERS="0"))
    try:
        hold = json.loads(stack.stdout.readline())
        for binary in argv:
            per_request, profile = count(os.path.abspath(binary), hold, n, work, route, key, agent, shape)
            print(f"{binary}: {per_request:,.0f} instructions/request over {n} requests (profile: {profile})", flush=True)
    finally:
        stack.send_signal(signal.SIGTERM)
        stack.wait(timeout=60)


if __name__ == "__main__":
    main()
