#!/usr/bin/env bash
# Where a proxied request's instructions go (bench/results/proxy-profile.md):
# a 300-byte chat completion through `kvgate serve` (prefix_aware, one
# instance) to a fixed-answer nginx upstream over HTTP/1.1 keep-alive, under
# callgrind. Instructions a request = (run − start-up alone) ÷ requests.
#
#   [BODY_BYTES=16384] scripts/proxy-profile.sh path/to/kvgate [out-dir]
#
# Needs valgrind, nginx and wrk (Debian packages). Instruction counts do not
# depend on what else the machine is doing, so two binaries compare exactly.
set -euo pipefail
bin=$(realpath "$1")
out=${2:-$(mktemp -d)}
mkdir -p "$out"
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
up=18631
gw=18632
answer='{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"A reverse proxy fronts servers; a load balancer spreads requests across them."},"finish_reason":"stop"}],"usage":{"prompt_tokens":64,"completion_tokens":16,"total_tokens":80,"prompt_tokens_details":{"cached_tokens":0}}}'
cat > "$dir/upstream.conf" <<NGINX
daemon off; master_process off; worker_processes 1; pid $dir/up.pid;
error_log $dir/up-error.log warn; events { worker_connections 4096; }
http { access_log off; client_body_temp_path $dir/cb; proxy_temp_path $dir/pt;
  fastcgi_temp_path $dir/ft; uwsgi_temp_path $dir/ut; scgi_temp_path $dir/st;
  keepalive_requests 10000000; keepalive_timeout 3600s; client_body_buffer_size 64k;
  server { listen 127.0.0.1:$up;
    location = /v1/chat/completions { default_type application/json; return 200 '$answer'; }
    location / { return 404; } } }
NGINX
cat > "$dir/kvgate.yaml" <<YAML
server:
  listen: "127.0.0.1:$gw"
  timeouts: { idle_ms: 3600000, client_idle_ms: 3600000, connect_ms: 10000 }
  sse_keepalive_ms: 0
endpoints:
  - name: chat
    models: ["m"]
    instances:
      - url: "http://127.0.0.1:$up"
    routing: { strategy: prefix_aware, concurrency_threshold: 1024 }
YAML
# The benchmark's chat body (benches/overhead/main.rs, chat_body): 300 bytes,
# or BODY_BYTES.
body=$(python3 - "${BODY_BYTES:-300}" <<'PY'
import json, sys
size = int(sys.argv[1])
q = "Summarise the difference between a reverse proxy and a load balancer in two sentences, please."
base = "You are a concise assistant for the ACME support team. "
filler = "Answer from the policy handbook and cite the section you used. "
shell = lambda s: json.dumps({"max_tokens": 64, "messages": [{"content": s, "role": "system"},
    {"content": q, "role": "user"}], "model": "m", "temperature": 0.2}, separators=(",", ":"))
system = base
while len(system) < len(base) + size - len(shell(base)):
    system += filler
print(shell(system[: len(base) + max(0, size - len(shell(base)))]))
PY
)
cat > "$dir/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '$body'
LUA
nginx -c "$dir/upstream.conf" &
wait_up() { for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$1$2" && return; sleep 0.1; done; echo "port $1 never answered" >&2; exit 1; }
# One run under callgrind: $1 = label, $2 = load or idle.
run() {
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.$1" "$bin" serve --config "$dir/kvgate.yaml" >/dev/null 2>"$out/$1.log" &
  local pid=$!
  wait_up "$gw" /health
  if [ "$2" = load ]; then
    wrk -t1 -c4 -d11s -s "$dir/post.lua" "http://127.0.0.1:$gw/v1/chat/completions" > "$out/wrk.txt"
  else
    sleep 11
  fi
  kill -INT "$pid"; wait "$pid" || true
}
run idle idle
run load load
total() { grep -E '^summary:|^totals:' "$1" | head -1 | awk '{print $2}'; }
requests=$(awk '/requests in/ {print $1}' "$out/wrk.txt")
idle=$(total "$out/callgrind.idle"); load=$(total "$out/callgrind.load")
echo "requests $requests; instructions: run $load, start-up alone $idle; per request $(( (load - idle) / requests ))" | tee "$out/summary.txt"
callgrind_annotate --inclusive=no "$out/callgrind.load" 2>/dev/null | head -60 > "$out/self.txt" || true
callgrind_annotate --inclusive=yes "$out/callgrind.load" 2>/dev/null | head -120 > "$out/inclusive.txt" || true
echo "profiles in $out (self.txt, inclusive.txt, callgrind.*)"
