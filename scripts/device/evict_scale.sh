#!/usr/bin/env bash
# Issue 17 on the H200, one unattended device call (about 7 minutes): eviction at serving scale.
#  1. parity of the new window-score kernels (SnapKV/TOVA) and of the key-score and compaction
#     kernels they sit beside, against the CPU reference, up to 30k tokens;
#  2. compaction time of one 28k-token prompt per method (one prefill chunk, so one compaction
#     of the whole cache; from the engine's debug log): SnapKV against KeyDiff;
#  3. stall figures before/after: 16 requests decode while 4 prompts of 28k tokens arrive with a
#     compression policy; the longest gap between two tokens of a decoding request, and the
#     server's starling:engine_step_seconds histogram over that window (scripts/bench/stall_probe.py).
#     "before" is the main branch's binary (host SnapKV scoring, every compaction inside one
#     step), "after" this branch's (scores where the cache lives, compaction spread over steps
#     under --compaction-step-budget-tokens; "unbudgeted" = the same with the budget off).
#
# Built here (scripts/device/build_evict_scale.sh), carried in .device/ (about 55 MiB; the
# "before" binary can be staged instead, see that script):
#   .device/starling           this branch, release, stripped
#   .device/starling-before    main at the issue's base commit, release, stripped
#   .device/tests/parity-*     starling-cuda's parity test binary, stripped
# Staged on the machine: $HOME/stage/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (../shared/tools/
# stage-chunks, 18 pieces). Results: $OUT/evict_scale.md (the table) and $OUT/evict_scale.tgz.
#  4. (PHASES=saturation, a second call of about 4 minutes) ITL p99 and output tokens/s at
#     saturation on synthetic qwen2.5-7b, 8 GiB of KV, 48 prompts of 3k tokens: none, keydiff@0.5,
#     and keydiff@0.5 with the budget off (every compaction inside its step, as before).
#   PHASES="parity timing stall" (default; "compaction": `starling bench compaction`, one layer
#   selected on the host vs on the device, ~1 minute), ARMS (stall arms, default below), LONG_TIMEOUT;
#   saturation: SAT_PROMPTS (48), SAT_OUTPUT (256 tokens), SAT_ARMS ("none keydiff@0.5
#   keydiff@0.5-unbudgeted"; suffixes -unbudgeted, -bN budget, -nN every_n_tokens, -before the
#   .device/starling-before binary), TOKENIZER (default the staged Qwen GGUF; any GGUF serves the
#   synthetic preset's API).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
PHASES=${PHASES:-parity timing stall}
ARMS=${ARMS:-after-snapkv after-keydiff after-tova after-snapkv-unbudgeted before-keydiff before-snapkv}
LONG_TIMEOUT=${LONG_TIMEOUT:-60}
name=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
gguf=$HOME/stage/$name
work=$HOME/evict_scale
# Each call returns only its own runs: a later call in the same lease would pack an earlier
# call's arms beside its own.
rm -rf "$work"
mkdir -p "$work"
md=$OUT/evict_scale.md
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$work/date.txt"
echo "# Issue 17 on $(sed -n 2p "$work/date.txt")" > "$md"
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $gguf" | sha256sum -c - \
  || { echo "model not staged at $gguf" | tee -a "$md"; }

wait_health() { wait_healthy "$1" "" 180; }

serve() { # serve BINARY PORT LOG [flags...]: starts a server in the background, sets $pid
  local bin=$1 port=$2 log=$3; shift 3
  STARLING_LOG=info,starling_engine::engine::compaction=debug "$bin" serve --device cuda \
    --model "$gguf" --max-model-len 32768 --port "$port" "$@" > "$log" 2>&1 &
  pid=$!
  wait_health "$port" || { echo "server on $port did not start:"; tail -5 "$log"; }
}

stop() { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }

if [[ " $PHASES " == *" parity "* ]]; then
  echo "== parity (window scores, key scores, compaction)"
  exe=$(ls .device/tests/parity-* | head -1)
  timeout 240 "$exe" --include-ignored --test-threads 1 window_scores key_scores compaction selection 2>&1 \
    | tee "$work/parity.log" | grep -E "window_scores|key_scores|compact|select|test result|panicked"
  { echo; echo "## Parity"; echo '```'; grep -E "^window_scores|test result" "$work/parity.log"; echo '```'; } >> "$md"
fi

if [[ " $PHASES " == *" compaction "* ]]; then
  echo "== one layer's compaction: host selection vs device selection (starling bench compaction)"
  timeout 300 .device/starling bench compaction --output "$work/compaction.json" 2>&1 | tee "$work/compaction.log"
  { echo; echo "## One layer's KeyDiff@0.5 compaction, wall ms (bench compaction)"; echo;
    grep -E "^\|" "$work/compaction.log"; } >> "$md"
fi

if [[ " $PHASES " == *" timing "* ]]; then
  echo "== compaction of one 28k prompt per method (one chunk)"
  serve .device/starling 8030 "$work/timing.log" --max-num-batched-tokens 32768
  for method in keydiff snapkv tova knorm streaming_llm; do
    python3 - "$method" <<'EOF'
import json, random, sys, urllib.request
rng = random.Random(3)
# The server answers 404 for a model name it does not serve: ask it for its name.
model = json.load(urllib.request.urlopen("http://127.0.0.1:8030/v1/models"))["data"][0]["id"]
body = {"model": model, "prompt": [rng.randrange(1000, 20000) for _ in range(28000)], "max_tokens": 4,
        "ignore_eos": True, "temperature": 0, "kv_compression": {"method": sys.argv[1], "ratio": 0.75}}
req = urllib.request.Request("http://127.0.0.1:8030/v1/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=600).read()
EOF
  done
  stop
  { echo; echo "## One 28k-token prompt compacted at once (ratio 0.75, 28 layers)"; echo
    echo "| method | tokens | compaction ms | steps |"; echo "|---|---:|---:|---:|"
    i=0; for method in keydiff snapkv tova knorm streaming_llm; do
      line=$(grep "compaction of" "$work/timing.log" | sed -n "$((i + 1))p"); i=$((i + 1))
      echo "$line" | sed -E "s/.*: ([0-9]+) layers, ([0-9]+) -> ([0-9]+) tokens, ([0-9.]+) ms over ([0-9]+) steps.*/| $method | \2 -> \3 | \4 | \5 |/"
    done; } >> "$md"
  tail -8 "$md"
fi

if [[ " $PHASES " == *" stall "* ]]; then
  echo "== stalls: 16 decoding requests, 4 x 28k-token prompts arriving"
  port=8040
  for arm in $ARMS; do
    port=$((port + 1))
    # Decode graphs are recorded lazily per batch-size bucket: off, so a bucket first seen
    # inside the window (the long requests joining the decode batch) is not mistaken for a stall.
    bin=.device/starling; flags=(--cuda-graphs off)
    case $arm in
      before-*) bin=${BEFORE_BIN:-.device/starling-before} ;;
      *-unbudgeted) flags+=(--compaction-step-budget-tokens 0) ;;
    esac
    [ -x "$bin" ] || { echo "$arm: no $bin, skipped"; continue; }
    method=${arm#*-}; method=${method%-unbudgeted}
    serve "$bin" "$port" "$work/serve_$arm.log" "${flags[@]}"
    timeout $((LONG_TIMEOUT + 150)) python3 scripts/bench/stall_probe.py --base-url "http://127.0.0.1:$port" \
      --label "$arm" --long-compression "{\"method\":\"$method\",\"ratio\":0.75}" \
      --timeout "$LONG_TIMEOUT" --output "$work/stall_$arm.json"
    stop
  done
  python3 - "$work" >> "$md" <<'EOF'
import glob, json, sys
rows = [json.load(open(p)) for p in sorted(glob.glob(sys.argv[1] + "/stall_*.json"))]
print("\n## Other requests' waits while 4 prompts of 28k tokens arrive (ratio 0.75)\n")
print("| arm | long done | window s | quiet gap max ms | gap max ms | gap p99 ms | gaps > 250 ms | steps > 0.3 s | steps > 1 s | long latency s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    q, d, s = r["quiet"], r["during_long"], r["engine_steps"]
    lat = ", ".join("%.1f" % x if x is not None else "-" for x in r["long_latency_s"])
    print(f"| {r['label']} | {r['long_finished']}/{r['long']} | {r['window_s']:.1f} | {q.get('max_ms', 0):.0f} | "
          f"{d.get('max_ms', 0):.0f} | {d.get('p99_ms', 0):.0f} | {d.get('over_250ms', 0)} | {s['over_0.3s']:.0f} | "
          f"{s['over_1s']:.0f} | {lat} |")
EOF
  tail -10 "$md"
fi
if [[ " $PHASES " == *" saturation "* ]]; then
  SAT_PROMPTS=${SAT_PROMPTS:-48}; SAT_OUTPUT=${SAT_OUTPUT:-256}
  SAT_ARMS=${SAT_ARMS:-none keydiff@0.5 keydiff@0.5-unbudgeted}
  echo "== saturation: synthetic qwen2.5-7b, 8 GiB KV, $SAT_PROMPTS x 3k-token prompts, $SAT_OUTPUT out"
  port=8060
  for arm in $SAT_ARMS; do
    port=$((port + 1)); policy=${arm%%-*}
    method=${policy%@*}; ratio=${policy#*@}; [ "$method" = none ] && ratio=0
    flags=()
    case $arm in
      *-unbudgeted) flags=(--compaction-step-budget-tokens 0) ;;
      *-b[0-9]*) flags=(--compaction-step-budget-tokens "${arm##*-b}") ;;
    esac
    every=""; [[ $arm == *-n[0-9]* ]] && every=",\"every_n_tokens\":${arm##*-n}"
    # An arm ending in -before runs .device/starling-before (e.g. host selection, before the
    # device selection of session 23), the others this tree's binary.
    bin=.device/starling; [[ $arm == *-before ]] && bin=.device/starling-before
    STARLING_LOG=info,starling_engine::engine::compaction=debug $bin serve --device cuda --load-format synthetic --model qwen2.5-7b --tokenizer "${TOKENIZER:-$gguf}" \
      --max-model-len 4096 --max-num-batched-tokens 1024 --kv-cache-memory 8GiB \
      --kv-compression "{\"method\":\"$method\",\"ratio\":$ratio$every}" --port $port "${flags[@]}" \
      > "$work/sat_$arm.log" 2>&1 &
    pid=$!
    wait_health $port || { echo "$arm: server did not start"; tail -5 "$work/sat_$arm.log"; continue; }
    timeout 240 .device/starling bench serve --base-url http://127.0.0.1:$port --model qwen2.5-7b \
      --dataset random --random-input-len 3072 --random-output-len "$SAT_OUTPUT" --ignore-eos --seed 5 \
      --num-prompts "$SAT_PROMPTS" --max-concurrency "$SAT_PROMPTS" --output-json "$work/sat_$arm.json" | tail -3
    stop
  done
  python3 - "$work" "$SAT_PROMPTS" "$SAT_OUTPUT" $SAT_ARMS >> "$md" <<'EOF2'
import json, os, sys
n, out = sys.argv[2], sys.argv[3]
print(f"\n## Saturation (synthetic qwen2.5-7b, 8 GiB KV, {n} x 3072 in / {out} out, concurrency {n})\n")
import re
print("| policy | output tok/s | ITL p99 ms | ITL median ms | TPOT median ms | compactions | compaction ms mean / max | steps per compaction max |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for arm in sys.argv[4:]:
    path = f"{sys.argv[1]}/sat_{arm}.json"
    if not os.path.exists(path):
        print(f"| {arm} | - | - | - | - | - | - | - |"); continue
    m = json.load(open(path))["run"]["metrics"]
    # "compaction of SeqId(..): L layers, a -> b tokens, X ms over S steps" (debug log)
    found = [(float(x), int(s)) for x, s in re.findall(r"compaction of .*?([0-9.]+) ms over ([0-9]+) steps",
             open(f"{sys.argv[1]}/sat_{arm}.log", errors="replace").read())]
    ms = [x for x, _ in found]
    comp = f"{sum(ms) / len(ms):.2f} / {max(ms):.2f}" if ms else "-"
    log = open(f"{sys.argv[1]}/sat_{arm}.log", errors="replace").read()
    # Host time by phase: "(score S, select L, compact C)" before session 23's device
    # selection, "(issuing: score S, select + compact C)" after it.
    phases = [tuple(map(float, p)) for p in re.findall(r"\(score ([0-9.]+), select ([0-9.]+), compact ([0-9.]+)\)", log)]
    issued = [tuple(map(float, p)) for p in re.findall(r"\(issuing: score ([0-9.]+), select \+ compact ([0-9.]+)\)", log)]
    if phases:
        comp += " (score {:.2f}, select {:.2f}, compact {:.2f})".format(*(sum(p[i] for p in phases) / len(phases) for i in range(3)))
    elif issued:
        comp += " (issuing: score {:.2f}, select + compact {:.2f})".format(*(sum(p[i] for p in issued) / len(issued) for i in range(2)))
    steps = max((s for _, s in found), default=0)
    print(f"| {arm} | {m['output_throughput']:.0f} | {m['itl']['p99_ms']:.1f} | {m['itl']['median_ms']:.1f} | "
          f"{m['tpot']['median_ms']:.1f} | {len(ms)} | {comp} | {steps} |")
EOF2
  tail -6 "$md"
fi
tar czf "$OUT/evict_scale.tgz" -C "$HOME" evict_scale
