#!/usr/bin/env python3
"""What an ingress of Shield's own would save (issue 33, README "Performance"): the same POST
handler on actix-web and on hyper's http1 server (src/main.rs), a Claude-Code-shaped 148 KB
chat request and a one-line one, oha -c20 for 8 s each, alternating actix, hyper, actix, hyper;
CPU µs per request from /proc/<pid>/stat. Usage: (cd bench/ingress && cargo build --release &&
python3 measure.py). Needs oha (`cargo install oha`)."""
import json, os, subprocess, sys, time
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.chdir(HERE)
import agent_request
OHA = os.path.expanduser("~/.cargo/bin/oha")
_, openai = agent_request.conversation(150000, seed=150000)
big = json.dumps({**openai, "model": "bench-static"})
small = json.dumps({"model": "bench-static", "messages": [{"role": "user", "content": "Say hello in one short sentence."}]})
open("/tmp/big.json", "w").write(big); open("/tmp/small.json", "w").write(small)
print("big body bytes", len(big))
def stat(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]), int(f[12])
def run(kind, body, port):
    p = subprocess.Popen(["target/release/ingress", kind, str(port)])
    time.sleep(0.5)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    args = [OHA, "--no-tui", "-c", "20", "-m", "POST", "-D", body, "-H", "content-type: application/json", "--output-format", "json"]
    subprocess.run(args + ["-z", "2s", url], capture_output=True)
    b = stat(p.pid)
    out = json.loads(subprocess.run(args + ["-z", "8s", url], capture_output=True, text=True).stdout)
    a = stat(p.pid)
    p.terminate(); p.wait()
    n = sum(out["statusCodeDistribution"].values())
    tick = 1e6 / os.sysconf("SC_CLK_TCK") / n
    return out["summary"]["requestsPerSec"], (a[0]-b[0])*tick, (a[1]-b[1])*tick, out["statusCodeDistribution"]
port = 18600
for body in ("/tmp/big.json", "/tmp/small.json"):
    for kind in ("actix", "hyper", "actix", "hyper"):
        port += 1
        rps, user, kernel, codes = run(kind, body, port)
        print(f"{os.path.basename(body):10} {kind:6} {rps:9.0f} rps  cpu {user+kernel:6.1f} us/req (user {user:5.1f} kernel {kernel:5.1f}) {codes}", flush=True)
