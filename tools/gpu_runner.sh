#!/usr/bin/env bash
# What a CI GPU job does, on our GPU machine, in steps that each fit one 10-minute device call:
# install, `make reproduce BACKEND=gpu` (notebook by notebook), `make test BACKEND=gpu` (unit
# tests in groups, then nbval notebook by notebook), and the report `gpu_report_<gpu>.md`.
#
#   bash tools/gpu_runner.sh plan              # the calls, in order, one per line
#   bash tools/gpu_runner.sh setup             # install the project (no downloads), record the machine
#   bash tools/gpu_runner.sh reproduce 06      # papermill, real Terra shape (--device cuda --preset terra)
#   bash tools/gpu_runner.sh test engine1      # a group of unit tests (`bash tools/gpu_runner.sh groups` lists them)
#   bash tools/gpu_runner.sh test models       # vLLM 0.26's own model tests, alone on the GPU (not in the lanes)
#   bash tools/gpu_runner.sh nbval 06          # nbval over one notebook, on the GPU
#   bash tools/gpu_runner.sh report            # $OUT/gpu_report_<gpu>.md (+ .json) from everything above
# The report names one commit and the machine's run: set TERRA_NB_RUN (e.g. "H200, one hold")
# and, when the device's .git is not the code's, TERRA_NB_COMMIT; then `python tools/gpu_report.py
# --readme` regenerates the README's GPU section from the committed results/gpu_report_*.json.
#
# Or all of it at once, side by side on the one GPU (what fits a few device calls):
#   bash tools/gpu_runner.sh start             # a snapshot of this checkout ($STATE/tree: later device
#                                              # calls re-copy the checkout under the lanes), its
#                                              # setup, then seven lanes in the background, there:
#                                              #   papermill, papermill2, papermill3: reproduce, the
#                                              #     notebooks spread by their last times (PAPERMILL_LANES)
#                                              #   nbval, nbval2: nbval of every notebook but the longest (08)
#                                              #   engines:   nbval 08, then engine test groups 1 and 3
#                                              #   fast:      the fast test group, in 3 pytest-xdist workers
#   bash tools/gpu_runner.sh lanes             # each lane's steps
#   bash tools/gpu_runner.sh wait 570          # wait up to 570 s; prints the finished steps;
#                                              # always writes the report (partial until all end)
# The lanes share the one GPU and its 16 cores: each lane computes on 2 threads (torch's default,
# a thread per core in every lane, oversubscribed them: nbval 08 took 961 s on an H100 beside three
# lanes, 34 s on two CPU cores), and every engine has a fixed KV cache ($TERRA_NB_KV_CACHE_GIB: 8
# GiB for the Terra-shaped papermill lanes, 1 GiB for the tiny-model lanes; see
# terra_nb.port.vllm_rollout.apply_gpu_settings). With the cache size given, vLLM skips its
# start-up memory profiling, which measures the whole GPU and so failed whenever another lane
# allocated or freed meanwhile ("No available memory for the cache blocks", "Error in memory
# profiling": 4 of the steps of one H100 run). A step whose log still ends so is run once more
# (lanes.log says "retry"), and the report lists such retries. The check lanes run engines eager
# ($TERRA_NB_ENFORCE_EAGER): torch.compile and CUDA graphs are the papermill lanes' to exercise.
#
# The machine: vLLM 0.26 and the notebook tools unpacked in /tmp/site (the bundle of the GPU notes),
# no network. Every step writes its log and summary under $STATE (kept while the machine stays
# warm) and copies them to $OUT (what comes back from the call). Commit the report as
# results/gpu_report_<gpu>.md; the executed notebooks stay out of git (tens of MB with figures).
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=${GPU_SITE:-/tmp/site}   # where the bundle was unpacked
if [ "${1:-plan}" != plan ] && [ "${1:-plan}" != report ] && [ "${1:-plan}" != groups ] && [ "${1:-plan}" != lanes ] && [ "${1:-plan}" != snapshot ]; then
  test -d "$SITE/vllm" || { echo FRESH-MACHINE; exit 3; }
fi
# this checkout's terra_nb first, whatever the editable install points to (see `snapshot`)
export PYTHONPATH=$PWD:$SITE VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
STATE=${GPU_RUNNER_STATE:-/tmp/terra_gpu_runner}
OUT=${OUT:-$STATE/out}
mkdir -p "$STATE" "$OUT"
PY=${PY:-python3}

# make when the machine has it, else the command the make target runs (same arguments)
mk() {  # mk reproduce|test ARGS...
  local target=$1; shift
  if command -v make > /dev/null; then
    if [ "$target" = reproduce ]; then make reproduce BACKEND=gpu PY=$PY SETUP=none REPRODUCE_ARGS="$*"
    else make test BACKEND=gpu PY=$PY SETUP=none TEST_WORKERS=${TEST_WORKERS:-0} PYTEST_ARGS="$*"; fi
  elif [ "$target" = reproduce ]; then
    $PY -m terra_nb.workbook.reproduce --device cuda --preset terra --notebook-parameter 09 preset tiny "$@"
  else $PY -m pytest "$@"; fi
}

ENGINE_TESTS=(test_vllm_engine test_session_rollout test_vllm_engine_v2 test_vllm_trace test_weight_mapping test_toyworld_workbook
              test_teacher_forced test_teacher_forced_bf16 test_bench_pairs test_vllm_release
              test_port_vlm_engine test_vllm_serve_vlm)
groups() {  # name -> pytest arguments
  case "$1" in
    # test_browser: the GPU machine has neither Chromium nor Playwright; .ci/run (CPU CI) runs it
    fast) local a=(tests --ignore tests/test_browser.py --ignore tests/vllm_model_tests); for t in "${ENGINE_TESTS[@]}"; do a+=(--ignore "tests/$t.py"); done; echo "${a[@]}" ;;
    # test_vllm_engine, test_teacher_forced and test_session_rollout share one engine (tests/conftest.py: tiny_llm)
    engine1) echo tests/test_vllm_engine.py tests/test_teacher_forced.py tests/test_session_rollout.py tests/test_vllm_engine_v2.py ;;
    engine2) echo tests/test_vllm_trace.py tests/test_weight_mapping.py tests/test_vllm_release.py ;;
    engine3) echo tests/test_toyworld_workbook.py tests/test_teacher_forced_bf16.py ;;
    engine4) echo tests/test_bench_pairs.py ;;
    # TinyVLM's offline engine, shared by these two (tests/conftest.py: tiny_vlm_llm)
    engine5) echo tests/test_port_vlm_engine.py tests/test_vllm_serve_vlm.py ;;
    # vLLM's own model tests (0.26's here): alone on the GPU, since the initialization tests start each
    # engine at 0.8 of its memory; they come last (the registry checks hung when run after them)
    models) echo tests/vllm_model_tests/test_registry_v026.py tests/vllm_model_tests/test_common_v026.py \
                 tests/vllm_model_tests/test_tensor_schema_v026.py tests/vllm_model_tests/test_initialization_v026.py ;;
    *) echo "unknown test group $1 (fast, engine1..engine5, models)" >&2; return 2 ;;
  esac
}
NOTEBOOKS=$(ls notebooks/[0-9][0-9]_*.ipynb | sed -E 's|notebooks/([0-9][0-9])_.*|\1|')
NOTEBOOKS=${RUNNER_NOTEBOOKS:-$NOTEBOOKS}   # e.g. RUNNER_NOTEBOOKS="04 06": only those
LANES=${RUNNER_LANES:-papermill papermill2 papermill3 nbval nbval2 engines fast}
LONG_NBVAL=${LONG_NBVAL:-08}   # the notebook whose nbval runs in the engines lane (the longest)
# what an engine that lost the start-up memory race prints (vLLM 0.26 and 0.32)
MEMORY_RACE="No available memory for the cache blocks|Error in memory profiling|less than desired GPU memory utilization|CUDA out of memory"

# Which lane runs what: the longest steps spread so that the lanes end together. The step times of
# the H100 run of results/gpu_report_h100.md (all lanes sharing the GPU): papermill 07
# 348 s, 06 232, 04 201, 01 193, 08 183, 05 134, 11 127, 10 103, 03 81, 09 70, 02 38; nbval 08 319,
# 03 156, 05 107, 07 102, others 37-90; test fast 391, engine1-4 107, 109, 82, 44.
PAPERMILL_LANES=("07 03 05" "06 04 09 02" "01 08 11 10")   # a notebook not named here: the last lane
NBVAL2="03 05"                                              # nbval2's notebooks (08: the engines lane)
lane_steps() {  # lane -> its steps, one per line
  local nb i n=${#PAPERMILL_LANES[@]}
  case "$1" in
    papermill|papermill2|papermill3)
      i=$(( ${1#papermill} + 0 )); i=$(( i == 0 ? 0 : i - 1 ))
      for nb in $NOTEBOOKS; do
        local lane_of=$((n - 1))
        for j in $(seq 0 $((n - 1))); do [[ " ${PAPERMILL_LANES[$j]} " == *" $nb "* ]] && lane_of=$j; done
        if [ "$lane_of" = "$i" ]; then echo "reproduce $nb"; fi   # (not `&&`: the function's status)
      done ;;
    nbval) for nb in $NOTEBOOKS; do [ "$nb" = "$LONG_NBVAL" ] || [[ " $NBVAL2 " == *" $nb "* ]] || echo "nbval $nb"; done ;;
    nbval2) for nb in $NOTEBOOKS; do if [[ " $NBVAL2 " == *" $nb "* ]]; then echo "nbval $nb"; fi; done
            for g in ${TEST_GROUPS-engine2 engine4 engine5}; do echo "test $g"; done ;;
    engines) for nb in $NOTEBOOKS; do if [ "$nb" = "$LONG_NBVAL" ]; then echo "nbval $nb"; fi; done
             for g in ${TEST_GROUPS-engine1 engine3}; do echo "test $g"; done ;;
    fast) echo "test fast" ;;
    *) echo "unknown lane $1 (papermill, papermill2, papermill3, nbval, nbval2, engines, fast)" >&2; return 2 ;;
  esac
}

timed() {  # timed NAME CMD...: run, keep the log and {rc, seconds} under $STATE/steps
  local name=$1; shift
  mkdir -p "$STATE/steps"
  local t0=$(date +%s%N)
  "$@" > "$STATE/steps/$name.log" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  local commit=$(git rev-parse HEAD 2> /dev/null | cut -c1-7)
  printf '{"step": "%s", "rc": %d, "seconds": %d.%d, "commit": "%s", "command": "%s"}\n' "$name" "$rc" $((ms / 1000)) \
    $((ms % 1000 / 100)) "$commit" "$*" > "$STATE/steps/$name.json"
  # the log's end, without the engine's per-request chatter
  grep -v -E "it/s\]$|^\((EngineCore|Worker)" "$STATE/steps/$name.log" | tail -40
  cp "$STATE/steps/$name.log" "$STATE/steps/$name.json" "$OUT/"
  return $rc
}

case "${1:-plan}" in
  plan)
    echo setup
    for nb in $NOTEBOOKS; do echo "reproduce $nb"; done
    for g in fast engine1 engine2 engine3 engine4 engine5; do echo "test $g"; done
    for nb in $NOTEBOOKS; do echo "nbval $nb"; done
    echo report ;;
  lanes)  # each lane of `start` and its steps
    # as `lane` reads them: a lane whose steps end in a non-zero status would not start
    for lane in $LANES; do steps=$(lane_steps $lane) || exit 2; echo "$lane: $(echo "$steps" | paste -sd ';' -)"; done ;;
  groups)  # the unit-test groups and their pytest arguments, one per line
    for g in fast engine1 engine2 engine3 engine4 engine5 models; do echo "$g: $(groups $g)"; done ;;
  snapshot)  # snapshot DIR: a copy of the files here (those git does not ignore) and .git
    # `start` runs its lanes in one: every later device call (`wait`) copies the checkout again, and
    # a file being copied is briefly absent (nbval 08 once found no notebook 20 s into a run, and
    # passed when run again on the same commit).
    dest=${2:?where, e.g. $STATE/tree}
    rm -rf "$dest" && mkdir -p "$dest" || exit 1
    git ls-files -co --exclude-standard | while read -r f; do [ -e "$f" ] && echo "$f"; done \
      | tar -cf - -T - .git | tar -xf - -C "$dest" || exit 1
    echo "snapshot: $(find "$dest" -path "$dest/.git" -prune -o -type f -print | wc -l) files in $dest" ;;
  setup)
    $PY -m pip install -q --no-deps --no-build-isolation -e . > "$STATE/pip.log" 2>&1 || { cat "$STATE/pip.log"; exit 1; }
    # What runs: the tree of the files here (content; not the copy's modes, index or HEAD) and git's
    # HEAD (tools/gpu_report.py --record-tree). One report, one run: the steps a kept state folder
    # holds from other files go aside, not into the report.
    tree() { sed -n 's/.*"tree": "\([0-9a-f]*\)".*/\1/p' "$STATE/tree.json" 2> /dev/null; }
    old=$(tree)
    $PY tools/gpu_report.py "$STATE" --record-tree && cp "$STATE/tree.json" "$OUT/"
    if [ -n "$old" ] && [ "$old" != "$(tree)" ] && [ -d "$STATE/steps" ]; then
      mkdir -p "$STATE/previous_${old:0:12}" && mv "$STATE"/steps "$STATE"/reproduce "$STATE"/lanes.log "$STATE/previous_${old:0:12}/" 2> /dev/null
      echo "steps of tree ${old:0:12} moved to $STATE/previous_${old:0:12}"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$STATE/nvidia-smi.txt"
    $PY -c "import json; from terra_nb.workbook.show import environment_info; print(json.dumps(environment_info('cuda'), indent=2))" \
      > "$STATE/environment.json" && cp "$STATE/environment.json" "$OUT/" && cat "$STATE/environment.json" ;;
  reproduce)
    nb=${2:?which notebook, e.g. 06}
    # one output folder per notebook: reproduce clears its folder's results/ at the start
    timed "reproduce_$nb" mk reproduce --only "$nb" --out "$STATE/reproduce/$nb"
    rc=$?; cp "$STATE/reproduce/$nb/summary.json" "$OUT/reproduce_${nb}_summary.json" 2>/dev/null
    cp -r "$STATE/reproduce/$nb/results" "$OUT/reproduce_${nb}_results" 2>/dev/null; exit $rc ;;
  test)
    g=${2:?which group: fast, engine1..engine5, models}; args=$(groups "$g") || exit 2
    timed "test_$g" mk test -p no:cacheprovider $args ;;
  nbval)
    nb=${2:?which notebook, e.g. 06}
    timed "nbval_$nb" mk test -p no:cacheprovider notebooks/${nb}_*.ipynb ;;
  report)
    $PY tools/gpu_report.py "$STATE" --out "$OUT" --run "${TERRA_NB_RUN:-}" --commit "${TERRA_NB_COMMIT:-}" ;;
  lane)   # lane papermill|nbval|engines|fast: its steps in order (started by `start`, in the background)
    lane=${2:?papermill, nbval, engines or fast}
    steps=$(lane_steps "$lane") || exit 2
    case "$lane" in
      papermill*)
        export TERRA_NB_GPU_MEMORY_UTILIZATION=${PAPERMILL_GPU_SHARE:-0.15} TERRA_NB_KV_CACHE_GIB=${PAPERMILL_KV_GIB:-8} \
               TERRA_NB_ENFORCE_EAGER=0 ;;
      fast) export TEST_WORKERS=${FAST_TEST_WORKERS:-3} ;;
    esac
    # The check lanes (tiny model): a small fixed KV cache, eager engines (compile and CUDA graphs
    # are papermill's to exercise). A fixed KV cache (TERRA_NB_KV_CACHE_GIB) means no start-up
    # memory profiling, so no engine can lose the race against another lane's allocations.
    export TERRA_NB_GPU_MEMORY_UTILIZATION=${TERRA_NB_GPU_MEMORY_UTILIZATION:-${CHECKS_GPU_SHARE:-0.05}}
    export TERRA_NB_KV_CACHE_GIB=${TERRA_NB_KV_CACHE_GIB:-${CHECKS_KV_GIB:-1}} TERRA_NB_ENFORCE_EAGER=${TERRA_NB_ENFORCE_EAGER:-1}
    # 16 cores for 7 lanes: torch's default of a thread per core in every lane oversubscribes them
    export OMP_NUM_THREADS=${LANE_THREADS:-2}
    echo "$(date +%T) lane $lane: KV cache $TERRA_NB_KV_CACHE_GIB GiB, eager ${TERRA_NB_ENFORCE_EAGER}, $OMP_NUM_THREADS threads, xdist workers ${TEST_WORKERS:-0}" >> "$STATE/lanes.log"
    echo "$steps" > "$STATE/lane_$lane.plan"
    echo "$(date +%T) lane $lane: engines capped at $TERRA_NB_GPU_MEMORY_UTILIZATION of GPU memory" >> "$STATE/lanes.log"
    while read -r step; do
      [ -n "$step" ] || continue
      echo "$(date +%T) start $step" >> "$STATE/lanes.log"
      OUT=$STATE/out bash "$0" $step > /dev/null 2>&1
      rc=$?
      name=$(echo "$step" | sed 's/^test /test_/; s/^nbval /nbval_/; s/^reproduce /reproduce_/')
      if [ $rc -ne 0 ] && grep -qE "$MEMORY_RACE" "$STATE/steps/$name.log" 2> /dev/null; then
        cp "$STATE/steps/$name.log" "$STATE/steps/$name.attempt1.log.txt"
        echo "$(date +%T) retry $step (exit $rc: $(grep -oE "$MEMORY_RACE" "$STATE/steps/$name.log" | head -1))" >> "$STATE/lanes.log"
        sleep 15; OUT=$STATE/out bash "$0" $step > /dev/null 2>&1; rc=$?
      fi
      echo "$(date +%T) done  $step (exit $rc)" >> "$STATE/lanes.log"
    done <<< "$steps"
    touch "$STATE/lane_$lane.done" ;;
  start)
    # the lanes run in a snapshot of this checkout (see `snapshot`), installed from there
    snap=$STATE/tree
    bash "$0" snapshot "$snap" && bash "$snap/tools/gpu_runner.sh" setup || exit 1
    rm -f "$STATE"/lane_*.done
    for lane in $LANES; do
      setsid nohup bash "$snap/tools/gpu_runner.sh" lane $lane > "$STATE/lane_$lane.log" 2>&1 < /dev/null &
      sleep 5  # engines of different lanes start their profiling apart
    done
    echo "started lanes: $LANES (bash tools/gpu_runner.sh wait SECONDS)" ;;
  wait)
    limit=${2:-570}; t0=$(date +%s)
    lanes_done() { for lane in $LANES; do [ -f "$STATE/lane_$lane.done" ] || return 1; done; }
    until lanes_done; do
      [ $(( $(date +%s) - t0 )) -ge "$limit" ] && break
      sleep 5
    done
    cat "$STATE/lanes.log" 2>/dev/null
    for lane in $LANES; do
      [ -f "$STATE/lane_$lane.done" ] && echo "lane $lane: finished" || echo "lane $lane: running"
    done
    $PY tools/gpu_report.py "$STATE" --out "$OUT" --run "${TERRA_NB_RUN:-}" --commit "${TERRA_NB_COMMIT:-}"
    # one archive of every step's log and record, the papermill summaries and results (no notebooks)
    tar -C "$STATE" -czf "$OUT/gpu_runner_state.tgz" --exclude='*.ipynb' --exclude='figures' --exclude=out --exclude=./tree . 2>/dev/null
    ls "$OUT" ;;
  *) echo "unknown step $1; see: bash tools/gpu_runner.sh plan" >&2; exit 2 ;;
esac
