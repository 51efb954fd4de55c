"""Profiling on the CPU: `python -m terra_nb.bench profile` on our port and on stock vLLM Llama of
the same (tiny) shape; a real engine each, cProfile and torch.profiler sections, and the comparison."""
import json

import pytest

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.bench import profiling


pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def profiles(tmp_path_factory, bench_main):
    """Both engines profiled through the CLI in this process (conftest's `bench_main`: the CLI's
    `main`, its engines shut down after it)."""
    tmp = tmp_path_factory.mktemp("profile")
    # eager: the profile's sections are the same, and two engines skip torch.compile (~40 s on two cores)
    common = ["--preset", "tiny", "--ckpt-root", str(tmp / "ckpt"), "--engine-kwargs", '{"enforce_eager": true}',
              "--batch", "2", "--decode-steps", "4", "--n-ctx", "2"]
    out = {}
    for engine in ("port", "stock"):
        stdout = bench_main(["profile", "--engine", engine, *common, "--out", str(tmp / f"{engine}.json")])
        assert "frame step: 2 requests" in stdout  # the digest is printed
        out[engine] = json.loads((tmp / f"{engine}.json").read_text())
    return out


def test_profile_sections_phases_and_kernels(profiles):
    port, stock = profiles["port"], profiles["stock"]
    labels = [s["label"] for s in port["sections"]]
    assert labels == ["front end: 2 requests, 1 token", "frame step: 2 requests x 64 tokens",
                      "decode: 1 x 4 tokens", "decode: 2 x 4 tokens"]
    assert port["env"]["vllm"] and port["engine"] == "port" and stock["engine"] == "stock" and port["spec"]["n_ctx"] == 2
    for res in (port, stock):
        assert [s["label"] for s in res["sections"]] == labels
        for s in res["sections"]:
            assert s["wall_s"] > 0 and s["top_own"] and s["top_cum"]
            assert s["phases"]["engine_step"] > 0 and s["phases"]["model_runner"] > 0
        assert [k["steps"] for k in res["kernels"]] == [4, 4] and res["kernels"][0]["top_cpu"]
    # Where a decode step goes, clocked around the engine's own calls at 1 rollout and at the batch:
    # every phase is found in this vLLM and clocked once a step, and the core's step encloses its calls
    for res in (port, stock):
        assert [st["batch"] for st in res["steps"]] == [1, 2]
        for st in res["steps"]:
            assert st["steps"] >= 4 and set(st["phase_calls"]) == set(profiling.STEP_PHASES)
            assert all(n == st["steps"] for n in st["phase_calls"].values()), st["phase_calls"]
            parts = st["parts_ms_per_step"]
            assert None not in parts.values() and min(parts.values()) >= 0, parts
            assert sum(parts.values()) == pytest.approx(st["wall_ms_per_step"], rel=1e-3)
            assert parts["forward"] > parts["sampling"] > 0
    # Our processor runs for the port's requests only; stock has no multimodal path at all.
    assert port["sections"][0]["phases"]["our_processor"] > 0
    assert stock["sections"][0]["phases"]["our_processor"] == 0
    assert stock["sections"][2]["phases"]["embed_input_ids"] == 0


def test_compare_and_digest(profiles):
    rows = profiling.compare(profiles["port"], profiles["stock"])
    assert [r["section"] for r in rows][1] == "frame step: 2 requests x 64 tokens"
    for r in rows:
        assert r["ratio"] == pytest.approx(r["port_wall_s"] / r["stock_wall_s"], abs=1e-3)
    text = "\n".join(profiling.summary_lines(profiles["port"]))
    assert "frame step" in text and "ms own" in text


def test_phases_around_the_forward_are_clocked_not_read_from_cprofile():
    """`engine_step` and `model_runner` come from a clock around the engine's own calls (the client's
    `get_output`, the executor's `execute_model`), whatever cProfile records of them: on a GPU
    (Python 3.12, vLLM 0.26) cProfile kept none of the frames around the forward and both read 0.
    Here the step's own work is a C function (time.sleep), which no cProfile entry names."""
    import time
    from types import SimpleNamespace

    class Executor:
        def execute_model(self):
            time.sleep(0.05)

    executor = Executor()
    client = SimpleNamespace(engine_core=SimpleNamespace(model_executor=executor))
    client.get_output = lambda: (executor.execute_model(), time.sleep(0.1))  # one step, the model inside
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=client))
    get_output = client.get_output
    res = profiling.profiled(lambda: llm.llm_engine.engine_core.get_output(), "step", profiling.engine_targets(llm))
    assert 0.15 <= res["phases"]["engine_step"] < 1.0
    assert 0.05 <= res["phases"]["model_runner"] < res["phases"]["engine_step"]
    assert client.get_output is get_output and "execute_model" not in vars(executor)  # the clocks are gone
    # an engine core in its own process: the client's wait is clocked, the executor is out of reach
    llm_mp = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(get_output=lambda: time.sleep(0.02))))
    res = profiling.profiled(lambda: llm_mp.llm_engine.engine_core.get_output(), "mp", profiling.engine_targets(llm_mp))
    assert res["phases"]["engine_step"] >= 0.02 and res["phases"]["model_runner"] == 0
    assert set(res["phases"]) == set(profiling.PHASES)


@pytest.fixture(scope="module")
def front_end(tmp_path_factory, bench_main):
    """`python -m terra_nb.bench frontend` on the port, tiny shape, 1 and 2 frames, 1 and 2 requests a call."""
    tmp = tmp_path_factory.mktemp("frontend")
    stdout = bench_main(["frontend", "--engine", "port", "--preset", "tiny", "--ckpt-root", str(tmp / "ckpt"),
                         "--engine-kwargs", '{"enforce_eager": true}', "--frames", "1,2", "--batches", "1,2",
                         "--repeats", "2", "--profile-batches", "2", "--out", str(tmp / "port.json")])
    assert "port 2 frames x 2:" in stdout and "profile at 2 requests a call:" in stdout
    return json.loads((tmp / "port.json").read_text())


def test_front_end_per_request_and_its_parts(front_end):
    rows = front_end["front_end"]
    assert [(r["frames"], r["batch"]) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert [r["prompt_tokens"] for r in rows] == [70, 70, 140, 140]
    assert front_end["command"].startswith("python -m terra_nb.bench frontend") and front_end["env"]["vllm"]
    for r in rows:
        assert len(r["front_end_ms_per_request_trials"]) == 2 and r["front_end_ms_per_request"] > 0
        parts = r["parts_ms_per_request"]
        # the engine core ran in this process: its add_request and the block hashes are in the enqueue
        assert parts["render"] > 0 and parts["process_inputs"] > 0 and parts["engine_add_request"] > 0
        assert 0 < parts["our_processor"] < parts["render"] and parts["block_hashes"] > 0
        assert parts["mm_receiver_cache"] == 0  # make_llm keeps no multimodal processor cache
        own = r["port_code_ms_per_request"]   # the port's own code, clocked in the timed enqueues
        assert set(own) == set(profiling.PORT_CODE) and own["prompt_checks"] > 0 and own["action_checks"] > 0
        assert own["item_hashes"] > 0 and own["front_door"] > 0
        assert 0 < sum(own.values()) < r["front_end_ms_per_request"]
    # profile's sections on the same engine, comparable with a `profile` file's
    prof = front_end["profiles"]["2"]
    assert [s["label"] for s in prof["sections"]][:2] == ["front end: 2 requests, 1 token", "frame step: 2 requests x 64 tokens"]
    assert prof["sections"][0]["phases"]["our_processor"] > 0 and prof["spec"]["batch"] == 2


def test_front_end_record_rows_and_comparison(front_end, tmp_path, bench_main):
    stock = dict(front_end, engine="stock",
                 front_end=[dict(r, front_end_ms_per_request=r["front_end_ms_per_request"] / 2) for r in front_end["front_end"]])
    for name, res in (("stock", stock), ("port", front_end)):
        (tmp_path / f"{name}.json").write_text(json.dumps(res))
    stdout = bench_main(["frontend-record", "--side", f"stock={tmp_path / 'stock.json'}", "--side",
                         f"port={tmp_path / 'port.json'}", "--commit", "abc1234", "--run", "cmd",
                         "--out", str(tmp_path / "rec.json")])
    assert "port, ms" in stdout
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["commit"] == "abc1234" and rec["versions"]["vllm"] == front_end["env"]["vllm"]
    assert list(rec["sides"]) == ["stock", "port"] and rec["date"] == front_end["env"]["date"]
    rows = profiling.front_end_rows(rec)
    assert rows[0]["frames"] == 1 and rows[0]["requests a call"] == 1
    assert rows[0]["port, ms"] == pytest.approx(2 * rows[0]["stock, ms"])
    parts = profiling.front_end_parts(rec, frames=2, batch=2)
    assert [p["side"] for p in parts] == ["stock", "port"] and parts[1]["render"] > parts[1]["our_processor"] > 0
    # the profiled sections side by side: stock's walls halved -> the port 2x slower in every section
    halved = {b: dict(p, sections=[dict(sec, wall_s=sec["wall_s"] / 2) for sec in p["sections"]])
              for b, p in front_end["profiles"].items()}
    prof_rows = profiling.profile_rows(dict(rec, sides={"stock": dict(stock, profiles=halved), "port": front_end}), "port")
    assert [r["requests a call"] for r in prof_rows] == [2] * len(front_end["profiles"]["2"]["sections"])
    assert all(r["port / stock"] == pytest.approx(2.0, rel=0.01) for r in prof_rows if r["stock, s"])
    from terra_nb.bench.plots import front_end_plot

    fig = front_end_plot(rec)
    assert len(fig.axes) == 2 and [line.get_label() for line in fig.axes[0].lines] == ["stock", "port"]


def test_kernels_are_told_apart_by_name_attention_before_matmul():
    """FlashAttention's Hopper kernels are CUTLASS kernels: attention must win over matmul."""
    assert profiling.kernel_kind("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90") == "attention"
    assert profiling.kernel_kind("nvjet_sm90_tst_128x8_64x12_4x1_v_bz_TNT") == "matmul"
    assert profiling.kernel_kind("void cutlass::device_kernel<cutlass_3x_scaled_mm_sm90_fp8") == "matmul"
    assert profiling.kernel_kind("void vllm::rms_norm_kernel<c10::BFloat16>") == "other"


def test_step_parts_split_a_step_without_overlap():
    phases = dict(engine_core=10.0, schedule=1.0, execute_model=4.0, prepare_inputs=1.5, sample_tokens=2.0, sampler=1.0,
                  update_from_output=0.5, output_processing=0.25)
    parts = profiling.step_parts(phases, wall_ms=11.0)
    assert parts == dict(scheduler=1.5, input_preparation=1.5, sampling=1.0, forward=3.5, waiting_for_gpu=2.5,
                         output_processing=0.25, front_end_rest=0.75)
    assert profiling.step_parts({k: v for k, v in phases.items() if k != "sampler"}, 11.0)["sampling"] is None


def test_a_step_breakdown_without_the_engine_core_in_reach_says_so():
    """An engine core in its own process: nothing to clock, recorded as an error, not raised (the
    profile's other sections still come back from a one-shot GPU run)."""
    from types import SimpleNamespace

    llm = SimpleNamespace(llm_engine=SimpleNamespace())
    res = profiling.step_breakdown(llm, lambda: None, 4)
    assert res["batch"] == 4 and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in res["error"]


def test_port_code_clocks_count_only_their_calls_and_put_every_function_back():
    from terra_nb.port import vllm_frontdoor, vllm_processing
    from terra_nb.port.layout import FrameLayout

    before = (vllm_processing.action_placeholder_ranges, vllm_frontdoor.check_request,
              vllm_processing.LlamaActionMultiModalProcessor.__dict__["_validate_request"])
    with profiling.clocked_port_code() as own:
        ranges = vllm_processing.action_placeholder_ranges(3, FrameLayout())
    assert [r.offset for r in ranges] == [576, 1158, 1740]   # the clocked function still answers
    assert own["placeholders"] > 0 and own["item_hashes"] == own["front_door"] == 0
    assert (vllm_processing.action_placeholder_ranges, vllm_frontdoor.check_request,
            vllm_processing.LlamaActionMultiModalProcessor.__dict__["_validate_request"]) == before


def test_port_code_rows_split_the_ports_extra_front_end():
    own = dict(prompt_checks=0.1, action_checks=0.05, item_hashes=0.02, placeholders=0.01, front_door=0.02)
    record = dict(sides=dict(
        stock=dict(front_end=[dict(frames=6, batch=128, front_end_ms_per_request=0.25)]),
        port=dict(front_end=[dict(frames=6, batch=128, front_end_ms_per_request=0.85, port_code_ms_per_request=own),
                             dict(frames=9, batch=128, front_end_ms_per_request=1.0)])))
    (row,) = profiling.port_code_rows(record, "port")   # 9 frames: stock did not time it
    assert row == {"frames": 6, "requests a call": 128, "port, ms": 0.85, "stock, ms": 0.25, "port's extra, ms": 0.6,
                   "of it the port's own code, ms": 0.2, "of it vLLM's, ms": 0.4}
    assert profiling.port_code_sentence(dict(record, device="GPU"), "port") == (
        "On GPU (prompts of 6 frames, 128 requests a call), a request's front end cost the port 0.60 to 0.60 ms more "
        "than stock's: its own code 0.20 to 0.20 ms, vLLM's part 0.40 to 0.40 ms.")
    record["sides"]["stock"]["front_end"][0]["front_end_ms_per_request"] = 0.9   # the port's front end the cheaper
    assert "the port 0.05 ms less to 0.05 ms less than stock's: its own code" in profiling.port_code_sentence(
        dict(record, device="GPU"), "port")
    record["sides"]["port"]["front_end"][0].pop("port_code_ms_per_request")   # a file from before the clocks
    assert profiling.port_code_rows(record, "port") == [] and profiling.port_code_sentence(record, "port") is None
