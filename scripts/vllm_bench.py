#!/usr/bin/env python3
"""The real-engine cell of the routing benchmark: two real vLLM engines (the
CPU build of vLLM 0.32, SmolLM2-135M, `scripts/vllm.sh`) behind kvgate,
`prefix_aware` against `longest_prefix` and `kv_aware`, on shared documents.

The engines run with a small KV cache (`--blocks`, 80 blocks of 32 tokens
by default: each engine holds about five of the documents, the fleet about all
eight, so where a document lives matters) and KV events. Each strategy's first
pass (round 1) meets engines started just before it (`scripts/vllm.sh stop`,
then `start`): a fleet after a deploy, a restart or a scale-out, whose first
requests are slower than later ones, is what the router meets first. Before
every later pass both engines' prefix caches are emptied (vLLM's dev-mode
`/reset_prefix_cache`) with the engines left running (warm). A fresh gateway
starts for every pass (`target/release/kvgate serve`), so nothing it learned
carries over; `kv_aware`'s gateway follows
the engines' events and tokenizes with the model folder, `longest_prefix`'s
learns each engine's capacity from `vllm:cache_config_info`. Every strategy
gets the same shuffled list of requests — D documents of ~W words as the
system prompt × Q short questions — sent by C closed-loop clients (each sends
its next request when its last one has answered), streaming, through the
official OpenAI SDK. Measured per request: TTFT (first SSE chunk, as the
client sees it) and the engine's own usage.prompt_tokens_details.cached_tokens.
Per pass: engine-cached ÷ prompt tokens, P50/P90 TTFT, wall time for the
fixed work, and each engine's share of the prompt tokens (from its /metrics).
Passes repeat `--rounds` times with fresh documents, strategies interleaved;
the report judges the first pass and the warm passes apart
(`--no-cold-first-round`: every pass on warm engines, as before). It also
shows what each pass's gateway learned of the engines (`/admin/explain`:
tokens a character, each instance's pace) beside the truth measured straight
on the engines after the pass (cold prompts of three sizes: prefill rate,
step, so the overhead a queued request costs; `--no-pace-truth` skips it),
and the gateway's decisions by outcome (`/metrics`).

    python3 scripts/vllm_bench.py                      # writes bench/results/vllm.md
    python3 scripts/vllm_bench.py --docs 2 --questions 2 --rounds 1 --out /tmp/v.md   # quick

Needs python3 with `openai` (tests/sdk/requirements.txt), cargo, and
`scripts/vllm.sh` (run here when KVGATE_VLLM_* are unset; minutes the first time).
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

# For `/admin/explain`, which shows what the gateway learned of each engine.
ADMIN_TOKEN = "vllm-bench-admin-token-0123456789abcdef"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = (
    "river signal copper lantern harvest orbit granite velvet compass meadow thunder cipher harbor "
    "ember glacier saffron account policy customer invoice shipping warehouse refund product ticket "
    "region quarter budget contract supplier delivery schedule priority audit review compliance"
).split()


def log(*a):
    print("[vllm_bench]", *a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, timeout=10):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def metrics(url):
    """{name: summed value} of a Prometheus text page."""
    out = {}
    for line in http("GET", url + "/metrics")[1].splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        name = key.partition("{")[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out


def shell_env(argv):
    out = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO).stdout
    return dict(shlex.split(line)[1].split("=", 1) for line in out.splitlines() if line.startswith("export "))


def document(nonce, k, words):
    r = random.Random(f"{nonce}-{k}")
    body = " ".join(r.choice(VOCAB) for _ in range(words))
    return f"Handbook {k} ({nonce}). Answer questions about it. {body}"


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = (len(xs) - 1) * q
    lo, hi = int(i), min(int(i) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def empty_caches(urls, model):
    for u in urls:
        deadline = time.time() + 60
        while True:
            try:
                if http("POST", u + "/reset_prefix_cache")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"{u} would not reset its prefix cache")
            time.sleep(0.2)
        # One step, so that the engine publishes AllBlocksCleared.
        OpenAI(base_url=u + "/v1", api_key="unused").completions.create(model=model, prompt="Hi", max_tokens=1)


def gateway_yaml(strategy, port, env, prefix_length):
    urls = env["KVGATE_VLLM_URLS"].split(",")
    events = env["KVGATE_VLLM_EVENTS"].split(",")
    replay = env["KVGATE_VLLM_REPLAY"].split(",")
    lines = []
    for i, u in enumerate(urls):
        kv = f', kv_events: "{events[i]}", kv_replay: "{replay[i]}"' if strategy == "kv_aware" else ""
        lines.append(f'      - {{ id: e{i}, url: "{u}"{kv} }}\n')
    yaml = (
        f'server:\n  listen: "127.0.0.1:{port}"\nadmin:\n  token: "{ADMIN_TOKEN}"\nendpoints:\n  - name: vllm\n'
        f'    models: ["{env["KVGATE_VLLM_SERVED_MODEL"]}"]\n    instances:\n{"".join(lines)}'
        f"    routing:\n      strategy: {strategy}\n"
        # The window must end inside the document, or prefix_aware keys each
        # (document, question) pair apart and scatters a document's questions.
        f"      prefix_length: {prefix_length}\n"
    )
    if strategy == "kv_aware":
        yaml += (
            f'      tokenizer: "{env["KVGATE_VLLM_MODEL"]}/tokenizer.json"\n'
            f'      block_size: {env["KVGATE_VLLM_BLOCK_SIZE"]}\n'
        )
    return yaml


def messages(docs, k, q):
    return [
        {"role": "system", "content": docs[k]},
        {"role": "user", "content": f"Question {q}: in one sentence, what does item {q} say?"},
    ]


def explain(base, msgs, model):
    """What the gateway learned of the engines, from `/admin/explain`: its
    tokens a character and prompt-token estimate for `msgs`, and each
    instance's pace. None where it has nothing to show (or will not say)."""
    body = json.dumps({"model": model, "messages": msgs, "max_tokens": 1}).encode()
    req = urllib.request.Request(base + "/admin/explain/v1/chat/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", "authorization": f"Bearer {ADMIN_TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            v = json.loads(r.read())
    except (OSError, ValueError) as e:
        log("explain failed:", repr(e))
        return None
    return {
        "units": v.get("units"),
        "estimate": v.get("prompt_tokens_estimate"),
        "pace": {i.get("id"): i.get("pace") for i in v.get("instances", []) if isinstance(i, dict)},
    }


def gateway_counts(base):
    """The gateway's routing decisions by outcome and instance, and
    `kv_aware`'s fallbacks to the approximate index by reason, from its
    /metrics: {"decisions e0 cache_hit": n, "fallback e1 silent": n, ...}."""
    out = {}
    try:
        page = http("GET", base + "/metrics")[1]
    except OSError:
        return out
    for line in page.splitlines():
        name = line.partition("{")[0]
        if name not in ("kvgate_routing_decisions_total", "kvgate_kv_fallback_total"):
            continue
        labels = dict(kv.split("=", 1) for kv in line[line.find("{") + 1: line.rfind("}")].split(",") if "=" in kv)
        labels = {k: v.strip('"') for k, v in labels.items()}
        what = labels.get("outcome") or labels.get("reason") or "?"
        kind = "decisions" if name.startswith("kvgate_routing") else "fallback"
        key = f"{kind} {labels.get('upstream', '?')} {what}"
        try:
            out[key] = out.get(key, 0) + int(float(line.rpartition(" ")[2]))
        except ValueError:
            pass
    return out


def dump_decisions(base, n, path):
    """Every decision of the pass as the console explains it (per instance:
    in flight, queued prefill, matched blocks, fill and each cost term), one
    JSON object a line in `path`: what a pass's placements rest on."""
    with open(path, "w") as out:
        for seq in range(n):
            req = urllib.request.Request(f"{base}/console/api/decisions/{seq}",
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    out.write(r.read().decode() + "\n")
            except OSError as e:
                out.write(json.dumps({"seq": seq, "error": repr(e)}) + "\n")


def engine_pace(url, model, args, nonce):
    """The engine's own prefill rate and fixed latency, measured directly on
    it while idle: streamed TTFT of cold prompts of three sizes (fresh text,
    so nothing is cached), fitted by least squares as latency + tokens/rate.
    The truth the gateway's learned pace is compared against."""
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    xs, ys, gaps = [], [], []
    for rep in range(2):
        for words in (40, 300, 900):
            start = time.perf_counter()
            first, usage, stamps = None, None, []
            for chunk in client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": document(f"{nonce}-{rep}", words, words)}],
                max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True},
            ):
                now = time.perf_counter()
                if first is None:
                    first = now - start
                if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                    stamps.append(now)
                if chunk.usage:
                    usage = chunk.usage
            gaps += [b - a for a, b in zip(stamps, stamps[1:])]
            if usage and first:
                cached = (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
                xs.append(usage.prompt_tokens - cached)
                ys.append(first)
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    if slope <= 0:
        return None
    step = statistics.median(gaps) if gaps else None
    return {"tokens_per_s": 1.0 / slope, "latency_ms": (my - slope * mx) * 1e3,
            "step_ms": step * 1e3 if step else None, "overhead_tokens": step / slope if step else None}


def start_engines(args, env):
    """Stops any engines of this script and starts two fresh ones; their
    addresses go into `env`."""
    subprocess.run(["bash", env["KVGATE_VLLM_SCRIPT"], "stop"], cwd=REPO, check=False, capture_output=True)
    log(f"starting 2 engines with {args.blocks} blocks each (about a minute)")
    env.update(shell_env(["bash", env["KVGATE_VLLM_SCRIPT"], "start", "2", "--blocks", str(args.blocks)]))


def run_pass(strategy, args, env, workdir, order, docs, rnd, cold):
    learned, decisions = None, {}
    if cold:
        start_engines(args, env)
    urls = env["KVGATE_VLLM_URLS"].split(",")
    model = env["KVGATE_VLLM_SERVED_MODEL"]
    if not cold:
        # A fresh engine's cache is empty already; a warm one's is emptied.
        empty_caches(urls, model)
    before = [metrics(u) for u in urls]
    port = free_port()
    cfg = os.path.join(workdir, f"{rnd}-{strategy}.yaml")
    with open(cfg, "w") as f:
        f.write(gateway_yaml(strategy, port, env, args.prefix_length))
    gw_log = open(os.path.join(workdir, f"{rnd}-{strategy}-kvgate.log"), "w")
    gw = subprocess.Popen(
        [os.path.join(REPO, "target/release/kvgate"), "serve", "--config", cfg],
        stdout=gw_log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if http("GET", base + "/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if gw.poll() is not None or time.time() > deadline:
                raise SystemExit(f"kvgate did not start; see {gw_log.name}")
            time.sleep(0.2)
        if strategy == "kv_aware":
            time.sleep(1.0)  # its subscriptions connect and replay
        local = threading.local()

        def one(item):
            k, q = item
            if not hasattr(local, "client"):
                local.client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
            start = time.perf_counter()
            first, usage = None, None
            try:
                for chunk in local.client.chat.completions.create(
                    model=model,
                    messages=messages(docs, k, q),
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
                return {"error": repr(e)}
            details = usage.prompt_tokens_details if usage else None
            return {
                "ttft": first,
                "prompt_tokens": usage.prompt_tokens if usage else 0,
                "cached_tokens": (details.cached_tokens or 0) if details else 0,
            }

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(one, order))
        wall = time.perf_counter() - t0
        k, q = order[-1]
        learned = explain(base, messages(docs, k, q), model)
        decisions = gateway_counts(base)
        dump_decisions(base, len(order), os.path.join(workdir, f"{rnd}-{strategy}-decisions.jsonl"))
        last = results[-1]
        if learned is not None and "error" not in last:
            learned["truth_prompt_tokens"] = last["prompt_tokens"]
    finally:
        os.killpg(gw.pid, signal.SIGTERM)
        gw.wait()
    after = [metrics(u) for u in urls]
    truth = [engine_pace(u, model, args, f"{rnd}-{strategy}-{i}") for i, u in enumerate(urls)] if args.pace_truth else []
    prompt_by_engine = [a.get("vllm:prompt_tokens_total", 0) - b.get("vllm:prompt_tokens_total", 0) for a, b in zip(after, before)]
    return {"strategy": strategy, "round": rnd, "cold": cold, "results": results, "wall": wall,
            "per_engine": prompt_by_engine, "learned": learned, "truth": truth,
            "decisions": decisions}


def summarise(runs):
    res = [r for run in runs for r in run["results"]]
    ok = [r for r in res if "error" not in r]
    ttft = [r["ttft"] for r in ok]
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    per = [sum(x) for x in zip(*[run["per_engine"] for run in runs])]
    return {
        "n": len(res),
        "errors": len(res) - len(ok),
        "cached": cached / prompt if prompt else 0.0,
        "p50": percentile(ttft, 0.5),
        "p90": percentile(ttft, 0.9),
        "wall": sum(run["wall"] for run in runs),
        "walls": [run["wall"] for run in runs],
        "shares": [x / (sum(per) or 1) for x in per],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=8, help="distinct documents")
    ap.add_argument("--questions", type=int, default=3, help="questions per document")
    ap.add_argument("--words", type=int, default=380, help="document size in words (≈ 1.3 SmolLM2 tokens each)")
    ap.add_argument("--clients", type=int, default=2, help="closed-loop clients")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=80, help="each engine's KV cache, in blocks of 32 tokens")
    ap.add_argument("--rounds", type=int, default=3, help="passes of every strategy, fresh documents each")
    ap.add_argument("--strategies", default="prefix_aware,longest_prefix,kv_aware")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=os.path.join(REPO, "bench/results/vllm.md"))
    ap.add_argument("--prefix-length", type=int, default=1024, help="routing.prefix_length (characters; kvgate's minimum)")
    ap.add_argument("--skip-build", action="store_true", help="use target/release/kvgate as it is")
    ap.add_argument("--no-pace-truth", dest="pace_truth", action="store_false",
                    help="skip measuring each engine's prefill rate directly after every pass")
    ap.add_argument("--no-cold-first-round", action="store_true",
                    help="start the engines once; every pass on warm engines with emptied caches")
    args = ap.parse_args()

    env = dict(os.environ)
    if not env.get("KVGATE_VLLM_SCRIPT"):
        env.update(shell_env(["bash", "scripts/vllm.sh"]))
    if not args.skip_build:
        log("building kvgate (release)")
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "kvgate"], cwd=REPO, check=True)
    if args.no_cold_first_round:
        start_engines(args, env)
    started = datetime.datetime.now(datetime.timezone.utc)
    workdir = tempfile.mkdtemp(prefix="kvgate-vllm-bench-")
    log("logs and configs in", workdir)
    runs = []
    strategies = args.strategies.split(",")
    try:
        for rnd in range(1, args.rounds + 1):
            nonce = secrets.token_hex(4)
            docs = [document(nonce, k, args.words) for k in range(args.docs)]
            order = [(k, q) for q in range(args.questions) for k in range(args.docs)]
            random.Random(args.seed + rnd).shuffle(order)
            # Strategies in a rotating order, so none always runs first.
            for strategy in strategies[rnd % len(strategies):] + strategies[: rnd % len(strategies)]:
                cold = rnd == 1 and not args.no_cold_first_round
                runs.append(run_pass(strategy, args, env, workdir, order, docs, rnd, cold))
                s = summarise([runs[-1]])
                log(f"round {rnd} {strategy}{' (fresh engines)' if cold else ''}: cached {s['cached']:.1%}, p50 {s['p50']*1e3:.0f} ms, "
                    f"p90 {s['p90']*1e3:.0f} ms, wall {s['wall']:.1f} s, errors {s['errors']}")
    finally:
        subprocess.run(["bash", env["KVGATE_VLLM_SCRIPT"], "stop"], cwd=REPO, check=False)
    report(args, runs, strategies, started)
    if any(summarise([r])["errors"] for r in runs):
        raise SystemExit("some requests failed: see the report")


def table(runs, strategies):
    """The per-strategy table and the dominance verdicts for `runs`."""
    sums = {s: summarise([r for r in runs if r["strategy"] == s]) for s in strategies}
    lines = [
        "| strategy | requests | errors | cached | TTFT P50 | TTFT P90 | wall (sum of passes) | wall per pass | engine shares |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for s in strategies:
        x = sums[s]
        lines.append(
            f"| {s} | {x['n']} | {x['errors']} | {x['cached']:.1%} | {x['p50']*1e3:.0f} ms | {x['p90']*1e3:.0f} ms | "
            f"{x['wall']:.1f} s | {', '.join(f'{w:.1f}' for w in x['walls'])} | {' / '.join(f'{v:.0%}' for v in x['shares'])} |"
        )
    base = sums.get("prefix_aware")
    if base:
        lines += ["", "Against `prefix_aware` (the dominance targets: cached within 1 point, P90 ≤ 1.05×, wall ≤ 1.03×):", ""]
        for s in strategies:
            if s == "prefix_aware":
                continue
            x = sums[s]
            d = (x["cached"] - base["cached"]) * 100
            p90 = x["p90"] / base["p90"]
            wall = x["wall"] / base["wall"]
            ok = d >= -1 and p90 <= 1.05 and wall <= 1.03
            lines.append(
                f"- `{s}`: cached {d:+.1f} points, P90 TTFT {p90:.2f}×, wall {wall:.2f}× — "
                + ("meets all three" if ok else "misses: " + ", ".join(
                    n for n, bad in (("cached", d < -1), ("P90", p90 > 1.05), ("wall", wall > 1.03)) if bad))
            )
    return lines


def learned_table(runs):
    """What each pass's gateway had learned of the engines at its end, beside
    the truth: the engine's prompt_tokens for the pass's last request against
    the gateway's estimate of it, and each engine's prefill rate and fixed
    latency measured directly on it after the pass (`engine_pace`)."""
    lines = [
        "## What the gateway learned, against the engines' truth",
        "",
        "At the end of each pass, from `/admin/explain` for the pass's last request: the tokens a character in use "
        "(and the answers it rests on; 8 make it learned), the prompt-token estimate it gives against the engine's own "
        "`usage.prompt_tokens` for that request, and each instance's pace (learned after 16 streamed answers with "
        "queues that vary; before that, after two answers, the first answers' reading — the gap between an answer's "
        "tokens times the prefill rate an unqueued first token shows; before any answer, the 256-token guess). *Truth*: each engine's prefill rate and latency fitted from "
        "cold prompts of three sizes sent straight to it while idle, after the pass (the latency intercept is within "
        "this loaded machine's noise), its step as the median gap between streamed tokens, and so the overhead a "
        "queued request costs in prefill tokens, step × rate. `kv_aware` tokenizes the prompt "
        "with the model's tokenizer, so its estimate does not rest on the learned ratio.",
        "",
        "| round | strategy | tokens/char (answers) | estimate vs engine | instance | pace source (answers) | learned rate tok/s | overhead tok | step ms | latency ms | truth rate tok/s | truth latency ms | truth step ms | truth overhead tok |",
        "| ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    fmt = lambda v, f="{:.0f}": "–" if v is None else f.format(v)  # noqa: E731
    for r in runs:
        l = r.get("learned")
        if not l:
            continue
        u = l.get("units") or {}
        units = f"{fmt(u.get('tokens_per_char'), '{:.3f}')} ({u.get('answers', '–')})"
        est = f"{fmt(l.get('estimate'))} vs {fmt(l.get('truth_prompt_tokens'))}"
        truth = r.get("truth") or []
        for n, (iid, p) in enumerate(sorted((l.get("pace") or {}).items())):
            p = p or {}
            t = truth[n] if n < len(truth) and truth[n] else {}
            source = str(p.get("source", ""))
            src = "learned" if source.startswith("learned") else "first answers" if source.startswith("first") else "guess"
            lines.append(
                f"| {r['round']}{' (fresh)' if r['cold'] else ''} | {r['strategy']} | {units if n == 0 else ''} | "
                f"{est if n == 0 else ''} | {iid} | {src} ({p.get('answers', '–')}) | {fmt(p.get('tokens_per_s'))} | "
                f"{fmt(p.get('overhead_tokens'))} | {fmt(p.get('step_ms'), '{:.1f}')} | {fmt(p.get('latency_ms'))} | "
                f"{fmt(t.get('tokens_per_s'))} | {fmt(t.get('latency_ms'))} | {fmt(t.get('step_ms'), '{:.1f}')} | "
                f"{fmt(t.get('overhead_tokens'))} |"
            )
    return lines


def decisions_table(runs):
    """Each pass's routing decisions by outcome and instance, as its gateway
    counted them (`kvgate_routing_decisions_total`), and `kv_aware`'s
    fallbacks to the approximate index (`kvgate_kv_fallback_total`)."""
    lines = ["## The gateway's decisions in each pass", "",
             "From each pass's gateway `/metrics` at its end: `kvgate_routing_decisions_total` by instance and outcome "
             "(cache_hit: the instance holding the longest prefix; cache_spread: another; cold: nobody held any; "
             "affinity / overflow: hashing), and `kv_aware`'s `kvgate_kv_fallback_total` (an instance looked up in the "
             "approximate index instead of its events), by instance and reason.", "",
             "| round | strategy | decisions and fallbacks |", "| ---: | --- | --- |"]
    for r in runs:
        d = r.get("decisions") or {}
        lines.append(f"| {r['round']}{' (fresh)' if r['cold'] else ''} | {r['strategy']} | "
                     + (", ".join(f"{k}: {v}" for k, v in sorted(d.items())) or "–") + " |")
    return lines


def report(args, runs, strategies, started):
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    cold = [r for r in runs if r["cold"]]
    warm = [r for r in runs if not r["cold"]]
    lines = [
        "# Real vLLM behind kvgate: the routing benchmark's real-engine cell",
        "",
        f"- Command: `python3 scripts/vllm_bench.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}`".rstrip() + "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True, text=True).stdout.strip()}",
        f"- Machine: {os.cpu_count()} logical cores ({cpu}), the engines on one core each, gateway and clients sharing them; "
        f"load average (1, 5, 15 min) at the end: {load}",
        "",
        f"Two vLLM 0.32 engines (CPU build, SmolLM2-135M-Instruct, `scripts/vllm.sh start 2 --blocks {args.blocks}`: "
        f"{args.blocks} KV blocks of 32 tokens each, prefix caching, KV events) behind kvgate (routing.prefix_length "
        f"{args.prefix_length}, inside every document; every other setting each strategy's default). Workload: {args.docs} documents of "
        f"~{args.words} words as the system prompt × {args.questions} questions, shuffled, {args.clients} closed-loop clients, "
        f"streaming, {args.max_tokens} output tokens; {args.rounds} rounds with fresh documents, strategies in a rotating order, "
        "a fresh gateway before every pass. "
        + ("Each strategy's first pass meets engines started just before it (a fleet after a deploy or a restart); "
           "later passes run on the same engines with their prefix caches emptied. " if cold else
           "Every pass on engines started once, caches emptied before it. ")
        + "*Cached* is the engines' own `cached_tokens` ÷ `prompt_tokens`; TTFT is the client's; "
        "wall is the time for the whole fixed workload (lower is better); shares are each engine's prompt tokens.",
        "",
    ]
    if cold:
        lines += ["## First pass after the engines start", ""] + table(cold, strategies) + [""]
    if warm:
        lines += [f"## Warm engines ({'rounds 2–' + str(args.rounds) if cold else 'every round'})", ""] + table(warm, strategies) + [""]
    lines += ["## All passes", ""] + table(runs, strategies) + [""] + learned_table(runs) + [""] + decisions_table(runs)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    log("wrote", args.out)


if __name__ == "__main__":
    main()
