#!/usr/bin/env python3
"""Shield's added latency and throughput against the mock LLM, and against a peer, in one run.

Starts (release build) the mock LLM, an nginx reverse proxy in front of it (the proxy floor),
Shield (admin + proxy, real Postgres and Redis) routing to the mock through a route, and
LiteLLM's proxy (`pip install 'litellm[proxy]'`, one worker, its default settings) pointed at
the same mock; then drives each with wrk at keep-alive concurrency 20 and prints RPS, p50 and
p99 for each, and Shield's figures relative to the direct call, the nginx floor and LiteLLM.

Added latency is measured where it means overhead rather than queueing: at a moderate load every
path serves easily (20 keep-alive connections each pausing 2-6 ms between requests, ~5,000
requests/s), and one request at a time (wrk -c1). At saturation (c20) latency is concurrency / throughput
(Little's law), so there a slower path shows "added latency" that is only its lower throughput.
Set SHIELD_BENCH_PEERS=0 to leave LiteLLM out.

Two backends: the mock LLM, and a static nginx `return 200` of a fixed ~700-byte completion
(the cheapest possible upstream: a backend that burns CPU on the same cores hides the gateway's
own cost). For each gateway process the CPU it used per request over the c20 window is printed
(utime + stime from /proc/<pid>/stat ÷ requests answered).

SHIELD_BENCH_BASE_ENV='{"NAME": "value"}' gives that proxy extra variables (the same binary as
its own baseline with tracing on, say). SHIELD_BENCH_BASELINE=/path/to/an/older/shield adds that binary's proxy (same admin, Redis and
routes) as the "base" paths, so a change is measured before and after in one run.

Every Shield route runs with what a production route has on (issue 19): a rule (that does not
match), PII and secrets guardrails in monitor mode on input and output, a monthly budget with
priced targets (cost per call), usage and metrics. A third route, `bench-limited`, is the static
route with rate limits set far above the load (10M requests and 10G tokens a minute): the
`s-limits` path against `s-shield` in the same run is what admission, leases and the
`x-ratelimit-*` headers cost (issue 18: at most 2 %). `s-keyed` is the static route called with
a governed key (issue 32: a route allow-list, an expiry and a monthly budget far above the
load): against `s-shield`, what a key's allow-list, expiry and budget checks cost.

Paced latency uses oha when it is installed (`cargo install oha`): a fixed offered rate
(`-q`, default 5,000 requests/s; SHIELD_BENCH_RATE) over 20 connections, each request timed from
its scheduled send (`--latency-correction`), so a stall is not hidden by the load generator
waiting (coordinated omission). Without oha it falls back to wrk with 2-6 ms pauses.

The saturated (c20) figures are the median of SHIELD_BENCH_ROUNDS rounds (default 3), the paths
taken in turn within each round (in reverse order every other round), so a slow spell of a shared
machine lands on every path alike rather than on whichever ran then.

Usage: bench/run.sh [seconds per run, default 10]
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIELD = os.path.join(ROOT, "target", "release", "shield")
DURATION = int(sys.argv[1]) if len(sys.argv) > 1 else 10
CONCURRENCY = 20
MOCK_BODY = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "Say hello in one short sentence."}]})
STATIC_BODY = json.dumps({"model": "bench-static", "messages": [{"role": "user", "content": "Say hello in one short sentence."}]})
LIMITED_BODY = json.dumps({"model": "bench-limited", "messages": [{"role": "user", "content": "Say hello in one short sentence."}]})
RATE = int(os.environ.get("SHIELD_BENCH_RATE", "5000"))
ROUNDS = int(os.environ.get("SHIELD_BENCH_ROUNDS", "3"))
# SHIELD_BENCH_HOLD=1: start the stack, print its pids, paths and key as JSON, and wait (for perf or
# strace by hand). SHIELD_BENCH_QUICK=1: only the static backend's saturated paths (nginx floor, shield, base).
QUICK = os.environ.get("SHIELD_BENCH_QUICK") == "1"
# SHIELD_BENCH_PACED_ROUNDS=1: also the paced run of the static paths in every round (issue 33).
PACED_EVERY_ROUND = os.environ.get("SHIELD_BENCH_PACED_ROUNDS") == "1"
OHA = shutil.which("oha") or (os.path.expanduser("~/.cargo/bin/oha") if os.path.exists(os.path.expanduser("~/.cargo/bin/oha")) else None)
BODY = MOCK_BODY
# What the static backend answers to every request: a fixed chat completion of ~700 bytes.
STATIC_COMPLETION = json.dumps({
    "id": "chatcmpl-static0123456789", "object": "chat.completion", "created": 1764547200, "model": "static-1",
    "system_fingerprint": "fp_static",
    "choices": [{"index": 0, "message": {"role": "assistant", "content":
        "Hello! This is a fixed answer from a static backend, long enough to look like a short real completion "
        "that a model would give to a greeting, so that the gateway parses and relays a realistic body.",
        "refusal": None}, "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 14, "completion_tokens": 48, "total_tokens": 62,
              "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}},
}, separators=(",", ":"))
# The same answer in Messages' shape, at /v1/messages (the `bench-static-messages` route: a
# Messages request relayed to an Anthropic-shaped target, for bench/instructions.py -m).
STATIC_MESSAGE = json.dumps({
    "id": "msg_static0123456789", "type": "message", "role": "assistant", "model": "static-1",
    "content": [{"type": "text", "text": "Hello! This is a fixed answer from a static backend."}],
    "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 14, "output_tokens": 12},
}, separators=(",", ":"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception:
            time.sleep(0.1)
    sys.exit(f"{url} did not answer within {seconds} s")


def request(method, url, token=None, body=None):
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None)
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as response:
        return json.loads(response.read() or b"null")


def cpu_ticks(pid):
    """utime + stime of `pid`, in clock ticks."""
    return sum(cpu_split(pid))


def cpu_split(pid):
    """(utime, stime) of `pid`, in clock ticks: user space and the kernel on its behalf."""
    return proc_stat(pid)[:2]


def proc_stat(pid):
    """(utime, stime, minor page faults, each thread's voluntary and involuntary context switches)
    of `pid`: a fault is the kernel giving the process a page it touched for the first time (or
    again, after the allocator gave it back); a voluntary switch is a thread going to sleep with nothing to do
    (a worker's epoll_wait finding no event, then woken), an involuntary one a thread the
    scheduler took off its core for another (the load generator, nginx: they share the cores)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    switches = {}  # per thread: a thread that ends takes its counts along
    for task in glob.glob(f"/proc/{pid}/task/*/status"):
        counts = [0, 0]
        try:
            with open(task) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        counts[0] = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        counts[1] = int(line.split()[1])
        except OSError:  # a thread that ended between the listing and the read
            continue
        switches[task.split("/")[4]] = counts
    return int(fields[11]), int(fields[12]), int(fields[7]), switches


def switches_between(before, after):
    """(voluntary, involuntary) context switches of the threads alive at the end, since `before`."""
    return tuple(sum(counts[i] - before.get(tid, [0, 0])[i] for tid, counts in after.items()) for i in (0, 1))


def wrk(url, headers, connections=CONCURRENCY, duration=None, pause_ms=None, pid=None):
    script = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
    if pause_ms:
        script.write(f"function delay() return math.random({pause_ms[0]}, {pause_ms[1]}) end\n")
    script.write('wrk.method = "POST"\n')
    script.write(f"wrk.body = {json.dumps(BODY)}\n")
    for name, value in headers.items():
        script.write(f'wrk.headers["{name}"] = "{value}"\n')
    script.close()
    threads = "-t2" if connections > 1 else "-t1"
    subprocess.run(["wrk", threads, f"-c{connections}", "-d2s", "-s", script.name, url], capture_output=True)  # warm-up
    before = proc_stat(pid) if pid else None
    out = subprocess.run(
        ["wrk", threads, f"-c{connections}", f"-d{duration or DURATION}s", "--latency", "-s", script.name, url],
        capture_output=True, text=True,
    ).stdout
    os.unlink(script.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    pct = {p: to_ms(v) for p, v in re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M)}
    answered = int(re.search(r"(\d+) requests in", out).group(1))
    cpu_us = user_us = faults = voluntary = involuntary = None
    if pid:
        after = proc_stat(pid)
        per_request = 1e6 / os.sysconf("SC_CLK_TCK") / max(answered, 1)
        user_us = (after[0] - before[0]) * per_request
        cpu_us = user_us + (after[1] - before[1]) * per_request
        faults = (after[2] - before[2]) / max(answered, 1)
        voluntary, involuntary = (n / max(answered, 1) for n in switches_between(before[3], after[3]))
    return {"rps": rps, "p50": pct["50"], "p99": pct["99"], "non_2xx": int(errors.group(1)) if errors else 0,
            "cpu_us": cpu_us, "user_us": user_us, "faults": faults, "voluntary": voluntary, "involuntary": involuntary}


def paced(url, headers, pid=None):
    """p50/p99 at a fixed offered rate every path serves (RATE requests/s over CONCURRENCY
    keep-alive connections), each request timed from its scheduled send (oha
    --latency-correction). Without oha: wrk with each connection pausing 2-6 ms."""
    if not OHA:
        return wrk(url, headers, pause_ms=(2, 6), pid=pid)
    args = [OHA, "--no-tui", "--output-format", "json", "-c", str(CONCURRENCY), "-q", str(RATE), "--latency-correction",
            "-m", "POST", "-d", BODY]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    subprocess.run(args + ["-z", "2s", url], capture_output=True)  # warm-up
    out = subprocess.run(args + ["-z", f"{DURATION}s", url], capture_output=True, text=True).stdout
    report = json.loads(out)
    codes = report.get("statusCodeDistribution", {})
    ok = sum(v for k, v in codes.items() if k.startswith("2"))
    return {"rps": report["summary"]["requestsPerSec"], "p50": report["latencyPercentiles"]["p50"] * 1000,
            "p99": report["latencyPercentiles"]["p99"] * 1000, "non_2xx": sum(codes.values()) - ok, "cpu_us": None,
            "user_us": None, "faults": None, "voluntary": None, "involuntary": None}


def ttft(port, path, headers, n=300):
    """Time to first token of `n` sequential streamed calls over one keep-alive connection:
    from sending the request to reading the first `data:` line (ms, sorted)."""
    import http.client
    body = json.dumps({**json.loads(BODY), "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    times = []
    for i in range(n + 20):
        started = time.perf_counter()
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        first = None
        while True:
            line = response.readline()
            if not line:
                break
            if first is None and line.startswith(b"data:"):
                first = time.perf_counter()
            if line.strip() == b"data: [DONE]":
                response.read()
                break
        if i >= 20 and first is not None:  # the first 20 warm up
            times.append((first - started) * 1000)
    conn.close()
    return sorted(times)


def pct(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p / 100))]


def to_ms(text):
    number, unit = re.match(r"([\d.]+)(\w+)", text).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def print_c20(results, baseline):
    """The saturated (c20) table and Shield's ratios to the nginx floor (and to the baseline)."""
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"\nShield benchmark, {time.strftime('%Y-%m-%d')}, commit {commit}, {os.cpu_count()} cores, "
          f"wrk -t2 -c{CONCURRENCY} -d{DURATION}s, keep-alive, POST /v1/chat/completions; "
          f"c20 figures: median of {ROUNDS} rounds\n")
    print("paths: direct / nginx / shield / base (SHIELD_BENCH_BASELINE) to the mock LLM; s-* the same to a static nginx backend")
    # CPU per request split: user space (the gateway's own instructions) and the kernel on its
    # behalf (system calls, loopback TCP): issue 33 asks why the floor ratio moves with the CPU.
    # Page faults per request: memory the kernel hands the process afresh, counted in kernel time.
    # Context switches per request (vcsw: the process's threads sleeping for want of work, then
    # woken; icsw: taken off a core for another process): each costs scheduler time in the kernel.
    print(f"{'path':<10}{'RPS':>10}{'p50 ms':>10}{'p99 ms':>10}{'non-2xx':>10}{'CPU us/req':>12}{'user':>8}{'kernel':>8}"
          f"{'faults':>8}{'vcsw':>8}{'icsw':>8}")
    for name, r in results.items():
        cpu = f"{r['cpu_us']:>12.1f}" if r.get("cpu_us") is not None else f"{'':>12}"
        if r.get("user_us") is not None:
            cpu += f"{r['user_us']:>8.1f}{r['cpu_us'] - r['user_us']:>8.1f}{r['faults']:>8.2f}"
            cpu += f"{r['voluntary']:>8.2f}{r['involuntary']:>8.2f}"
        print(f"{name:<10}{r['rps']:>10.0f}{r['p50']:>10.3f}{r['p99']:>10.3f}{r['non_2xx']:>10}{cpu}")
    for prefix in [p for p in ("", "s-") if f"{p}shield" in results and f"{p}nginx" in results]:
        s_, n_ = results[f"{prefix}shield"], results[f"{prefix}nginx"]
        line = f"{prefix or 'mock '}backend: shield / nginx floor {s_['rps'] / n_['rps']:.0%}"
        if baseline:
            b_ = results[f"{prefix}base"]
            line += (f"; shield / base {s_['rps'] / b_['rps']:.1%}; CPU us/req shield {s_['cpu_us']:.1f} "
                     f"vs base {b_['cpu_us']:.1f}")
        print(line)
    if "s-nginx2" in results and "s-shield" in results:
        print(f"s-backend: shield / nginx proxy in front of a backend in another process (s-nginx2) "
              f"{results['s-shield']['rps'] / results['s-nginx2']['rps']:.0%}")
    if "s-keyed" in results and "s-shield" in results:
        gov, plain = results["s-keyed"], results["s-shield"]
        print(f"governed key on the static route (s-keyed vs s-shield): throughput {gov['rps'] / plain['rps']:.1%}, "
              f"CPU us/req {gov['cpu_us']:.1f} vs {plain['cpu_us']:.1f} (issue 32: within noise)")


def main():
    # A stopped bench (SIGTERM) still stops its children and drops its database (`finally`).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install -y wrk nginx-light")
    work = tempfile.mkdtemp(prefix="shield-bench-")
    ports = {name: free_port() for name in ("mock", "nginx", "static", "nginx_static", "static1", "nginx_static1", "admin",
                                           "proxy", "base", "litellm")}
    baseline = os.environ.get("SHIELD_BENCH_BASELINE")
    peers = os.environ.get("SHIELD_BENCH_PEERS", "1") != "0" and shutil.which("litellm") is not None
    db = f"shield_bench_{uuid.uuid4().hex[:12]}"
    env = dict(
        os.environ,
        DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{db}",
        SHIELD_REDIS_PREFIX=f"bench{uuid.uuid4().hex[:8]}:",
        SHIELD_ADMIN_ADDR=f"127.0.0.1:{ports['admin']}",
        SHIELD_PROXY_ADDR=f"127.0.0.1:{ports['proxy']}",
        SHIELD_JWT_SECRET="bench-jwt-secret-bench-jwt-secret-0123",
        SHIELD_VAULT_KEY="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        RUST_LOG="warn",
    )
    children = []

    def start(*args, binary=SHIELD, extra_env=None, name=None):
        log = open(os.path.join(work, f"{name or args[0]}.log"), "w")
        child = subprocess.Popen([binary, *args], env=dict(env, **(extra_env or {})), stdout=log, stderr=log)
        children.append(child)
        return child

    try:
        start("mock-llm", "--addr", f"127.0.0.1:{ports['mock']}")
        subprocess.run([SHIELD, "migrate"], env=env, check=True, capture_output=True)
        created = json.loads(subprocess.run([SHIELD, "tenant", "create", "bench", "--admin-email", "bench@example.com"],
                                            env=env, check=True, capture_output=True, text=True).stdout)
        token = subprocess.run([SHIELD, "token", "issue", "--tenant", created["tenant"], "--scopes",
                                "tenant:read,config:write,registry:write"], env=env, check=True, capture_output=True, text=True).stdout.strip()
        start("admin")
        pids = {"shield": start("proxy").pid}
        if baseline:
            # SHIELD_BENCH_BASE_ENV (JSON): extra variables for that proxy — e.g. the same binary
            # with tracing on against a dead collector (issue 31).
            base_env = json.loads(os.environ.get("SHIELD_BENCH_BASE_ENV", "{}"))
            pids["base"] = start("proxy", binary=baseline, name="base-proxy",
                                 extra_env={"SHIELD_PROXY_ADDR": f"127.0.0.1:{ports['base']}", **base_env}).pid
            wait_http(f"http://127.0.0.1:{ports['base']}/healthz")
        wait_http(f"http://127.0.0.1:{ports['mock']}/healthz")
        wait_http(f"http://127.0.0.1:{ports['admin']}/healthz")
        wait_http(f"http://127.0.0.1:{ports['proxy']}/healthz")
        admin = f"http://127.0.0.1:{ports['admin']}/v1/tenant/me"
        price = {"input_per_mtok": 2.5, "output_per_mtok": 10}
        request("PUT", f"{admin}/gateway/targets/mock", token, {
            "base_url": f"http://127.0.0.1:{ports['mock']}/v1", "model": "mock-1", "allow_private": True, "auth": {"mode": "none"},
            "price": price})
        request("PUT", f"{admin}/gateway/targets/static", token, {
            "base_url": f"http://127.0.0.1:{ports['static']}/v1", "model": "static-1", "allow_private": True, "auth": {"mode": "none"},
            "price": price})
        request("PUT", f"{admin}/gateway/targets/static-anthropic", token, {
            "base_url": f"http://127.0.0.1:{ports['static']}/v1", "model": "static-1", "flavor": "anthropic",
            "allow_private": True, "auth": {"mode": "none"}, "price": price})
        # What a production route has on: a rule (that does not match), a budget, guardrails.
        production = {"rules": [{"when": {"role": ["contractor"]}, "deny": "Contractors cannot use this route"}],
                      "budget": {"monthly": 1000000, "at_limit": "warn"}}
        request("PUT", f"{admin}/guardrails", token, {"pii_detection": {"mode": "monitor"}, "secrets_detection": {"mode": "monitor"}})
        request("PUT", f"{admin}/gateway/routes/bench", token, {"targets": ["mock"], **production})
        request("PUT", f"{admin}/gateway/routes/bench-static", token, {"targets": ["static"], **production})
        request("PUT", f"{admin}/gateway/routes/bench-static-messages", token, {"targets": ["static-anthropic"], **production})
        request("PUT", f"{admin}/gateway/routes/bench-limited", token, {
            "targets": ["static"], **production, "limits": {"rpm": 10_000_000, "tpm": 10_000_000_000}})
        key = request("POST", f"{admin}/keys", token, {"name": "bench"})["key"]
        a_year = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 365 * 86400))
        governed_key = request("POST", f"{admin}/keys", token, {
            "name": "bench-governed", "routes": ["bench*"], "expires_at": a_year,
            "budget": {"monthly": 1000000, "action": "block"}, "metadata": {"owner": "bench"}})["key"]

        # Two nginx processes, one worker each: the static backend Shield calls, and the
        # proxies. The floor (`s-nginx`) is issue 19's: one nginx worker that is both the proxy
        # and the static backend behind it. `s-nginx2` is the same proxy in front of the other
        # process's backend: two workers on two cores, so a higher floor, and the proxy
        # worker's own CPU per request (what a plain proxy hop costs) is printed.
        def static_server(port):
            return ("\n  server {\n    listen 127.0.0.1:%d;\n    location / { default_type application/json; "
                    "return 200 '%s'; }\n    location /v1/messages { default_type application/json; return 200 '%s'; }\n  }"
                    % (port, STATIC_COMPLETION, STATIC_MESSAGE))

        def head(name):
            return (f"worker_processes 1; daemon off; pid {work}/{name}.pid; error_log {work}/{name}-error.log;\n"
                    "events { worker_connections 1024; }\n")

        backend_conf = os.path.join(work, "backend.conf")
        with open(backend_conf, "w") as f:
            f.write(head("backend") + "http {\n  access_log off;" + static_server(ports["static"]) + "\n}\n")
        conf = os.path.join(work, "nginx.conf")
        with open(conf, "w") as f:
            f.write(head("nginx") + f"""
http {{
  access_log off;
  upstream mock {{ server 127.0.0.1:{ports['mock']}; keepalive 64; }}
  upstream static {{ server 127.0.0.1:{ports['static']}; keepalive 64; }}
  upstream static1 {{ server 127.0.0.1:{ports['static1']}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{ports['nginx']};
    location / {{ proxy_pass http://mock; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
  server {{
    listen 127.0.0.1:{ports['nginx_static']};
    location / {{ proxy_pass http://static; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
  server {{
    listen 127.0.0.1:{ports['nginx_static1']};
    location / {{ proxy_pass http://static1; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}{static_server(ports['static1'])}
}}
""")
        nginx_workers = {}
        for name, path in (("backend", backend_conf), ("nginx", conf)):
            master = subprocess.Popen(["nginx", "-c", path, "-p", work], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            children.append(master)
            nginx_workers[name] = master.pid
        wait_http(f"http://127.0.0.1:{ports['nginx']}/healthz")
        wait_http(f"http://127.0.0.1:{ports['nginx_static']}/healthz")
        wait_http(f"http://127.0.0.1:{ports['nginx_static1']}/healthz")
        # CPU per request of the floor's worker (the master only supervises).
        floor_worker = subprocess.run(["pgrep", "-P", str(nginx_workers["nginx"])], capture_output=True, text=True).stdout.split()
        floor_pid = int(floor_worker[0]) if floor_worker else None
        plain = {"Content-Type": "application/json"}
        keyed = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        governed = {"Content-Type": "application/json", "Authorization": f"Bearer {governed_key}"}
        chat = "/v1/chat/completions"
        targets = {
            "direct": (f"http://127.0.0.1:{ports['mock']}{chat}", plain, None),
            "nginx": (f"http://127.0.0.1:{ports['nginx']}{chat}", plain, None),
            "shield": (f"http://127.0.0.1:{ports['proxy']}{chat}", keyed, pids["shield"]),
        }
        if baseline:
            targets["base"] = (f"http://127.0.0.1:{ports['base']}{chat}", keyed, pids["base"])
        targets.update({
            "s-direct": (f"http://127.0.0.1:{ports['static']}{chat}", plain, None),
            "s-nginx": (f"http://127.0.0.1:{ports['nginx_static1']}{chat}", plain, None),
            "s-nginx2": (f"http://127.0.0.1:{ports['nginx_static']}{chat}", plain, floor_pid),
            "s-shield": (f"http://127.0.0.1:{ports['proxy']}{chat}", keyed, pids["shield"]),
            "s-limits": (f"http://127.0.0.1:{ports['proxy']}{chat}", keyed, pids["shield"]),
            "s-keyed": (f"http://127.0.0.1:{ports['proxy']}{chat}", governed, pids["shield"]),
        })
        if baseline:
            targets["s-base"] = (f"http://127.0.0.1:{ports['base']}{chat}", keyed, pids["base"])
        if QUICK:
            # The iteration loop of a hot-path change: the static backend's c20 paths only.
            targets = {name: t for name, t in targets.items() if name in ("s-nginx", "s-nginx2", "s-shield", "s-keyed", "s-base")}
        global BODY
        bodies = {name: STATIC_BODY if name.startswith("s-") else MOCK_BODY for name in targets}
        bodies["s-limits"] = LIMITED_BODY

        def each(measure, backwards=False):
            global BODY
            out = {}
            order = list(targets.items())
            for name, (url, headers, pid) in (reversed(order) if backwards else order):
                BODY = bodies[name]
                out[name] = measure(url, headers, pid)
            return {name: out[name] for name in targets}

        if os.environ.get("SHIELD_BENCH_HOLD") == "1":
            # For profiling by hand (perf, strace): the stack stays up until this is stopped.
            proxy_env = {k: v for k, v in env.items() if k.startswith("SHIELD_") or k in ("REDIS_URL", "RUST_LOG")}
            print(json.dumps({"proxy_pid": pids["shield"], "key": key, "governed_key": governed_key, "proxy_env": proxy_env, "paths": {n: t[0] for n, t in targets.items()},
                              "bodies": {"static": STATIC_BODY, "mock": MOCK_BODY}}), flush=True)
            while True:
                time.sleep(3600)
        perf_out = os.environ.get("SHIELD_BENCH_PERF")
        if perf_out:
            # A CPU profile of the proxy over one static-backend c20 window (for `perf report`).
            BODY = STATIC_BODY
            url, headers, pid = targets["s-shield"]
            recorder = subprocess.Popen(["perf", "record", "-F", "1999", "-p", str(pid),
                                         "-o", perf_out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wrk(url, headers, pid=pid)
            recorder.send_signal(signal.SIGINT)
            recorder.wait(timeout=120)
            print(f"profile of the proxy (s-shield, c{CONCURRENCY}) in {perf_out}")
        # Every other round takes the paths in reverse order: a path's place in a round (right
        # after a heavy one, say, on a machine whose CPU credit varies) then favours none.
        rounds = []
        paced_rounds = []
        for i in range(ROUNDS):
            rounds.append(each(lambda url, headers, pid: wrk(url, headers, pid=pid), backwards=i % 2 == 1))
            if PACED_EVERY_ROUND:
                # Issue 33: a stall shows in one round's paced p99, not in a median of rounds.
                paced_round = {}
                for name in (n for n in ("s-nginx", "s-shield", "s-base") if n in targets):
                    BODY = bodies[name]
                    paced_round[name] = paced(targets[name][0], targets[name][1])
                paced_rounds.append(paced_round)
        if paced_rounds:
            print(f"\npaced p99 ms in every round (oha -q {RATE} --latency-correction):")
            for name in paced_rounds[0]:
                print(f"{name:<10}" + "".join(f"{r[name]['p99']:>9.3f}" for r in paced_rounds)
                      + f"   (non-2xx {sum(r[name]['non_2xx'] for r in paced_rounds)})")

        def median(values):
            values = sorted(v for v in values if v is not None)
            return values[len(values) // 2] if values else None

        results = {name: {field: median([r[name][field] for r in rounds]) for field in rounds[0][name]}
                   for name in rounds[0]}
        if QUICK:
            print_c20(results, baseline)
            return
        # Unloaded latency: one connection, so the cores are not saturated and the difference
        # is what one pass through the gateway costs.
        serial = each(lambda url, headers, pid: wrk(url, headers, connections=1, duration=max(3, DURATION // 2)))
        fixed = each(lambda url, headers, pid: paced(url, headers, pid=pid))
        BODY = MOCK_BODY
        if peers:
            # Measured after Shield's runs. LiteLLM's proxy with the mock as an OpenAI-compatible model named like Shield's route.
            # It refuses to start without a master key; callers authenticate with it, as with Shield.
            litellm_key = f"sk-bench-{uuid.uuid4().hex}"
            litellm_conf = os.path.join(work, "litellm.yaml")
            with open(litellm_conf, "w") as f:
                f.write(f"""model_list:
  - model_name: bench
    litellm_params:
      model: openai/mock-1
      api_base: http://127.0.0.1:{ports['mock']}/v1
      api_key: not-used
""")
            log = open(os.path.join(work, "litellm.log"), "w")
            children.append(subprocess.Popen(["litellm", "--config", litellm_conf, "--host", "127.0.0.1", "--port", str(ports["litellm"])],
                                             env=dict(os.environ, LITELLM_LOG="ERROR", LITELLM_MASTER_KEY=litellm_key),
                                             stdout=log, stderr=log))
            wait_http(f"http://127.0.0.1:{ports['litellm']}/health/liveliness", seconds=120)
            results["litellm"] = wrk(f"http://127.0.0.1:{ports['litellm']}/v1/chat/completions",
                                     {"Content-Type": "application/json", "Authorization": f"Bearer {litellm_key}"})
            # Stopped before anything else is measured: an idle Python server still takes CPU.
            children[-1].send_signal(signal.SIGTERM)
            children[-1].wait(timeout=30)
            children.pop()

        print_c20(results, baseline)
        lim, unl = results["s-limits"], results["s-shield"]
        print(f"rate limits on the static route (s-limits vs s-shield): throughput {lim['rps'] / unl['rps']:.1%}, "
              f"CPU us/req {lim['cpu_us']:.1f} vs {unl['cpu_us']:.1f} (issue 18: drop <= 2 %)")
        print(f"\nunloaded (wrk -t1 -c1): one request at a time")
        print(f"{'path':<10}{'RPS':>10}{'p50 ms':>10}{'p99 ms':>10}")
        for name, r in serial.items():
            print(f"{name:<10}{r['rps']:>10.0f}{r['p50']:>10.3f}{r['p99']:>10.3f}")
        sd, ss = serial["direct"], serial["shield"]
        print(f"\nunloaded: shield added p50 {ss['p50'] - sd['p50']:+.3f} ms, added p99 {ss['p99'] - sd['p99']:+.3f} ms")
        how = (f"oha -c{CONCURRENCY} -q {RATE} --latency-correction: a fixed offered rate, timed from each scheduled send"
               if OHA else f"wrk -c{CONCURRENCY}, each connection pausing 2-6 ms between requests: ~5,000 requests/s")
        print(f"\npaced ({how})")
        print(f"{'path':<10}{'RPS':>10}{'p50 ms':>10}{'p99 ms':>10}{'non-2xx':>10}")
        for name, r in fixed.items():
            print(f"{name:<10}{r['rps']:>10.0f}{r['p50']:>10.3f}{r['p99']:>10.3f}{r['non_2xx']:>10}")
        for prefix in ("", "s-"):
            fd, fs = fixed[f"{prefix}direct"], fixed[f"{prefix}shield"]
            print(f"paced, {prefix or 'mock '}backend: shield added p50 {fs['p50'] - fd['p50']:+.3f} ms, "
                  f"added p99 {fs['p99'] - fd['p99']:+.3f} ms (target <= 0.5)")
        direct_ttft = ttft(ports["mock"], "/v1/chat/completions", {"Content-Type": "application/json"})
        shield_ttft = ttft(ports["proxy"], "/v1/chat/completions", {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        print("\nstreaming, time to first token (300 sequential calls, one keep-alive connection)")
        print(f"{'path':<8}{'p50 ms':>10}{'p99 ms':>10}")
        for name, values in (("direct", direct_ttft), ("shield", shield_ttft)):
            print(f"{name:<8}{pct(values, 50):>10.3f}{pct(values, 99):>10.3f}")
        print(f"streaming: shield added TTFT p50 {pct(shield_ttft, 50) - pct(direct_ttft, 50):+.3f} ms, "
              f"p99 {pct(shield_ttft, 99) - pct(direct_ttft, 99):+.3f} ms")
        streaming = {"direct": {"p50": pct(direct_ttft, 50), "p99": pct(direct_ttft, 99)},
                     "shield": {"p50": pct(shield_ttft, 50), "p99": pct(shield_ttft, 99)}}
        d, n, s = results["direct"], results["nginx"], results["shield"]
        print(f"\nat c{CONCURRENCY}: shield added p50 over direct: {s['p50'] - d['p50']:+.3f} ms")
        print(f"shield added p99 over direct: {s['p99'] - d['p99']:+.3f} ms (saturated: mostly lower throughput, see above)")
        print(f"shield throughput / nginx floor: {s['rps'] / n['rps']:.0%} (target >= 75%)")
        print(f"shield throughput / direct: {s['rps'] / d['rps']:.0%}")
        if peers:
            l = results["litellm"]
            print(f"shield throughput / litellm: {s['rps'] / max(l['rps'], 0.001):.0f}x (target >= 100x); "
                  f"litellm non-2xx: {l['non_2xx']}")
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        print(json.dumps({"date": time.strftime("%Y-%m-%d"), "commit": commit, "c20": results, "c1": serial, "paced": fixed, "ttft": streaming}))
    finally:
        stop(children, db, work)


def stop(children, db, work):
    """Stops every child, drops the bench's database and removes its directory."""
    for child in children:
        child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'],
                   capture_output=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
