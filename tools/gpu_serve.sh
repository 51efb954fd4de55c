#!/usr/bin/env bash
# The serving load test on a GPU machine: the server in a process of its own
# (`python -m terra_nb.serve`), the load test against it (`--url`), both on the same engine
# arguments; optionally a py-spy profile of the server's process while the load runs. The server
# admits as many sessions as its engine schedules (max_num_seqs, SESSIONS by default).
#
#   OUT=out SESSIONS=256 FRAMES=6 TRIALS=5 NAME=h100x1_url_256 bash tools/gpu_serve.sh
#
# Env: OUT (results folder), NAME (result file stem), SESSIONS, FRAMES, TRIALS, PORT, MODEL,
# ENGINE_ARGS (space-separated KEY=VALUE, given to both sides), PYSPY (path of a py-spy binary: profile
# the server while the load runs, raw collapsed stacks at $OUT/$NAME.pyspy.txt).
set -euo pipefail
OUT=${OUT:?set OUT}; NAME=${NAME:?set NAME}
SESSIONS=${SESSIONS:-256}; FRAMES=${FRAMES:-6}; TRIALS=${TRIALS:-5}; PORT=${PORT:-8011}
MODEL=${MODEL:-data/toy/model}
ENGINE_ARGS=${ENGINE_ARGS:-"gpu_memory_utilization=0.35 max_num_seqs=$SESSIONS"}
eargs=(); for a in $ENGINE_ARGS; do eargs+=(--engine-arg "$a"); done
mkdir -p "$OUT"

python3 -m terra_nb.serve --model "$MODEL" --port "$PORT" --log-level warning \
    "${eargs[@]}" > "$OUT/$NAME.server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $server 2>/dev/null || { echo "server died"; tail -50 "$OUT/$NAME.server.log"; exit 1; }
    sleep 1
done
spy=
if [ -n "${PYSPY:-}" ]; then
    "$PYSPY" record --pid $server --rate 200 --format raw --nonblocking --threads -o "$OUT/$NAME.pyspy.txt" \
        > "$OUT/$NAME.pyspy.log" 2>&1 &
    spy=$!
fi
python3 -m terra_nb.serve.load --url "http://127.0.0.1:$PORT" --sessions "$SESSIONS" --frames "$FRAMES" \
    --trials "$TRIALS" "${eargs[@]}" --out "$OUT/$NAME.json" 2>&1 | grep -v " INFO \| WARNING " | tail -30
[ -n "$spy" ] && { kill -INT $spy 2>/dev/null || true; wait $spy 2>/dev/null || true; }
kill -TERM $server 2>/dev/null || true
wait $server 2>/dev/null || true
trap - EXIT
echo "done: $OUT/$NAME.json"
