#!/usr/bin/env python3
"""How long do other requests wait while long prompts are compressed? (issue 17)

Against a running `starling serve` (OpenAI API, token-id prompts, Starling's per-request
`kv_compression` field): start BACKGROUND streaming requests that decode for a long time, wait
until they all stream, then send LONG long-prompt requests with the given compression policy.
While the long requests are in flight, every gap between two tokens of a background request is
an engine step (or several) that the long requests' prefill and compaction held up. Reports,
for that window and for the quiet window before it: the longest gap, its 99th percentile, the
gaps over 250 ms, and the server's own `starling:engine_step_seconds` histogram over the window
(steps over 0.3 s, steps in (0.2, 0.3]), plus the long requests' latencies and errors.
Standard library only (the GPU machine has no network to install anything).

usage: stall_probe.py --base-url http://127.0.0.1:8020 --label after-snapkv \\
         --long-compression '{"method":"snapkv","ratio":0.75}' --output result.json
"""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse
import urllib.request


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        return r.read().decode()


def step_buckets(text):
    """`le` → cumulative count of starling:engine_step_seconds."""
    out = {}
    for line in text.splitlines():
        if line.startswith("starling:engine_step_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[le] = float(line.rsplit(" ", 1)[1])
    return out


def stream_request(base, body, stamps, stop, errors):
    """Streams one completion, appending the arrival time of every token chunk to `stamps`."""
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            errors.append(f"HTTP {resp.status}: {resp.read()[:200]!r}")
            return
        for raw in resp:
            if stop.is_set():
                break
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
    except Exception as e:  # the probe reports, never crashes on one request
        errors.append(repr(e))
    finally:
        conn.close()


def gap_stats(stamp_lists, start, end):
    gaps = []
    for stamps in stamp_lists:
        inside = [t for t in stamps if start <= t <= end]
        gaps.extend(b - a for a, b in zip(inside, inside[1:]))
    gaps.sort()
    if not gaps:
        return {"gaps": 0}
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    return {
        "gaps": len(gaps),
        "max_ms": 1000 * gaps[-1],
        "p99_ms": 1000 * p99,
        "median_ms": 1000 * gaps[len(gaps) // 2],
        "over_250ms": sum(1 for g in gaps if g > 0.25),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--model", help="the served model's name (default: the first of /v1/models)")
    p.add_argument("--background", type=int, default=16)
    p.add_argument("--background-prompt-tokens", type=int, default=512)
    p.add_argument("--background-output-tokens", type=int, default=4000)
    p.add_argument("--long", type=int, default=4)
    p.add_argument("--long-prompt-tokens", type=int, default=28000)
    p.add_argument("--long-output-tokens", type=int, default=16)
    p.add_argument("--long-compression", required=True, help="kv_compression JSON of the long requests")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the long requests")
    p.add_argument("--token-range", default="1000,20000", help="random prompt ids are drawn from here")
    p.add_argument("--output", required=True)
    args = p.parse_args()
    lo, hi = (int(x) for x in args.token_range.split(","))
    if args.model is None:
        with urllib.request.urlopen(args.base_url + "/v1/models", timeout=10) as r:
            args.model = json.load(r)["data"][0]["id"]
    rng = random.Random(17)
    ids = lambda n: [rng.randrange(lo, hi) for _ in range(n)]
    stop = threading.Event()
    errors = []
    background = [[] for _ in range(args.background)]
    threads = []
    for stamps in background:
        body = {"model": args.model, "prompt": ids(args.background_prompt_tokens),
                "max_tokens": args.background_output_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True}
        t = threading.Thread(target=stream_request, args=(args.base_url, body, stamps, stop, errors),
                             daemon=True)
        t.start()
        threads.append(t)
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline and min(len(s) for s in background) < 5:
        if not any(t.is_alive() for t in threads):
            break
        time.sleep(0.05)
    quiet_start = time.perf_counter()
    time.sleep(2.0)
    before = step_buckets(metrics(args.base_url))
    window_start = time.perf_counter()
    compression = json.loads(args.long_compression)
    long_stamps = [[] for _ in range(args.long)]
    long_threads = []
    for stamps in long_stamps:
        body = {"model": args.model, "prompt": ids(args.long_prompt_tokens),
                "max_tokens": args.long_output_tokens, "ignore_eos": True, "temperature": 0,
                "stream": True, "kv_compression": compression}
        t = threading.Thread(target=stream_request,
                             args=(args.base_url, body, stamps, threading.Event(), errors),
                             daemon=True)
        t.start()
        long_threads.append(t)
    for t in long_threads:
        t.join(max(0.0, window_start + args.timeout - time.perf_counter()))
    window_end = time.perf_counter()
    finished = sum(1 for t in long_threads if not t.is_alive())
    after = step_buckets(metrics(args.base_url))
    stop.set()
    delta = {le: after.get(le, 0) - before.get(le, 0) for le in after}
    over = lambda le: delta.get("+Inf", 0) - delta.get(le, 0)
    result = {
        "label": args.label,
        "long_compression": compression,
        "background": args.background,
        "long": args.long,
        "long_prompt_tokens": args.long_prompt_tokens,
        "long_finished": finished,
        "window_s": window_end - window_start,
        "long_latency_s": [s[-1] - window_start if s else None for s in long_stamps],
        "quiet": gap_stats(background, quiet_start, window_start),
        "during_long": gap_stats(background, window_start, window_end),
        "engine_steps": {
            "total": delta.get("+Inf", 0),
            "over_0.3s": over("0.3"),
            "in_0.2_to_0.3s": delta.get("0.3", 0) - delta.get("0.2", 0),
            "over_1s": over("1"),
        },
        "errors": errors[:5],
    }
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    d = result["during_long"]
    print(f"{args.label:<28} long {finished}/{args.long} in {result['window_s']:.1f} s | background gap "
          f"max {d.get('max_ms', 0):.0f} ms p99 {d.get('p99_ms', 0):.0f} ms >250ms {d.get('over_250ms', 0)} | "
          f"steps >0.3s {result['engine_steps']['over_0.3s']:.0f} of {result['engine_steps']['total']:.0f}"
          + (f" | errors {errors[:2]}" if errors else ""), flush=True)


if __name__ == "__main__":
    main()
