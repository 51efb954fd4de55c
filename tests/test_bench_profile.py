"""Profiling on the CPU: `python -m terra_nb.bench profile` on our port, and `bench run --profile`
on stock vLLM Llama of the same (tiny) shape with a batch-curve row; a real engine each, cProfile and
torch.profiler sections, the comparison, and the merged results' digest."""
import json

import pytest

import vllm  # noqa: F401  (declared dependency: a broken install must fail, not skip)

from terra_nb.bench import profiling


@pytest.fixture(scope="module")
def parts(tmp_path_factory, bench_main):
    """Both commands in this process (conftest's `bench_main`: the CLI's `main`, its engines shut down
    after it); test_bench_measure.py runs the CLI in a process of its own."""
    tmp = tmp_path_factory.mktemp("profile")

    def cli(args, out):
        stdout = bench_main([*args, "--out", out])
        assert "frame step: 2 requests" in stdout  # the digest is printed
        return json.loads(out.read_text())

    # eager: the profile's sections are the same, and two engines skip torch.compile (~40 s on two cores)
    common = ["--preset", "tiny", "--ckpt-root", str(tmp / "ckpt"), "--engine-kwargs", '{"enforce_eager": true}']
    port = cli(["profile", "--engine", "port", *common, "--batch", "2", "--decode-steps", "4"], tmp / "port.json")
    # The benchmark's own path: stock rows of a batch curve, the engine profiled before them.
    stock = cli(["run", "--rows", "stock_llama_b2", "--profile", *common, "--long-frames", "2", "--n-ctx", "2",
                 "--profile-batch", "2", "--profile-decode-steps", "4"],
                tmp / "part_stock.json")
    return port, stock


@pytest.fixture(scope="module")
def profiles(parts):
    port, stock_part = parts
    return {"port": port, "stock": stock_part["profile"]}


def test_run_with_profile_writes_rows_and_profile(parts):
    _, part = parts
    assert [r["name"] for r in part["rows"]] == ["stock_llama_b2"] and part["rows"][0]["batch"] == 2
    assert part["rows"][0]["frames"] == 2 and part["errors"] == []
    ran = part["rows"][0]["ran_with"]["settings"]   # read back from the engine, not the kwargs asked for
    assert ran["enforce_eager"] is True and ran["max_num_seqs"] >= 1 and ran["attention_backend"]
    assert ran["vllm_env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert part["profile"]["engine"] == "stock" and part["profile"]["spec"]["n_ctx"] == 2


def test_profile_sections_phases_and_kernels(parts, profiles):
    port, stock = profiles["port"], profiles["stock"]
    labels = [s["label"] for s in port["sections"]]
    assert labels == ["front end: 2 requests, 1 token", "frame step: 2 requests x 64 tokens",
                      "decode: 1 x 4 tokens", "decode: 2 x 4 tokens"]
    assert port["env"]["vllm"] and port["dtype"] and port["command"] and parts[1]["env"]["vllm"]
    for res in (port, stock):
        assert [s["label"] for s in res["sections"]] == labels
        for s in res["sections"]:
            assert s["wall_s"] > 0 and s["top_own"] and s["top_cum"]
            assert s["phases"]["engine_step"] > 0 and s["phases"]["model_runner"] > 0
        assert [k["steps"] for k in res["kernels"]] == [4, 4] and res["kernels"][0]["top_cpu"]
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


def test_merge_keeps_a_profile_digest(parts):
    from terra_nb.bench import results as bench_results

    port, stock_part = parts
    port_part = dict(stock_part, rows=[], profile=port)
    res = bench_results.merge([port_part, stock_part])
    digest = res["profile"]
    assert set(digest) == {"port", "stock", "port_vs_stock"}
    assert [s["label"] for s in digest["stock"]["sections"]][0] == "front end: 2 requests, 1 token"
    assert all("top_own" not in s for s in digest["port"]["sections"])  # the full lists stay in the parts
    assert res["curve"] == [dict(batch=2, port_frames_per_s=None, stock_frames_per_s=res["rows"][0]["frames_per_s"],
                                 port_vs_stock=None)]


def test_phases_around_the_forward_are_clocked_not_read_from_cprofile():
    """`engine_step` and `model_runner` come from a clock around the engine's own calls (the client's
    `get_output`, the executor's `execute_model`), whatever cProfile records of them: on the H200
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
