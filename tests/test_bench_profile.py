"""The decode-step profile (`python -m terra_nb.bench profile`, `terra_nb.bench.profiling`): on a real
engine through the CLI, and its parts on inputs whose answers are known by hand."""
import json
from types import SimpleNamespace

import pytest

from terra_nb.bench import profiling


@pytest.mark.engine
def test_the_profile_clocks_every_phase_of_a_decode_step_once_a_step(tmp_path, bench_main):
    """The port through the CLI, in this process (conftest's `bench_main`), eager: every phase of
    `STEP_PHASES` is found in this vLLM and clocked once a step, the parts add up to the step, and
    the kernels section comes back (CPU ops here, no GPU)."""
    out = tmp_path / "port.json"
    stdout = bench_main(["profile", "--engine", "port", "--preset", "tiny", "--ckpt-root", str(tmp_path / "ckpt"),
                         "--engine-kwargs", '{"enforce_eager": true}', "--batch", "2", "--decode-steps", "4",
                         "--n-ctx", "2", "--out", str(out)])
    assert "decode step at batch 2:" in stdout   # the digest is printed
    res = json.loads(out.read_text())
    assert res["engine"] == "port" and res["env"]["vllm"] and res["spec"]["n_ctx"] == 2
    assert [st["batch"] for st in res["steps"]] == [1, 2]
    for st in res["steps"]:
        assert st["steps"] >= 4 and set(st["phase_calls"]) == set(profiling.STEP_PHASES)
        assert all(n == st["steps"] for n in st["phase_calls"].values()), st["phase_calls"]
        parts = st["parts_ms_per_step"]
        assert None not in parts.values() and min(parts.values()) >= 0, parts
        assert sum(parts.values()) == pytest.approx(st["wall_ms_per_step"], rel=1e-3)
        assert parts["forward"] > parts["sampling"] > 0
    assert [k["steps"] for k in res["kernels"]] == [4, 4] and res["kernels"][0]["top"]
    assert res["kernels"][0]["device_us_per_step"] is None   # no GPU: no kernel time to report


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


def test_the_clocks_count_each_call_and_put_every_attribute_back():
    """A class's method and an instance's own attribute, clocked and then restored as they were."""
    class Scheduler:
        def schedule(self):
            return "scheduled"

    sched = Scheduler()
    client = SimpleNamespace(get_output=lambda: sched.schedule())
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=sched))))
    llm.llm_engine.engine_core.get_output = client.get_output
    targets = profiling.step_targets(llm)
    assert set(targets) == {"engine_core", "schedule"}   # the phases this engine has
    own, calls = llm.llm_engine.engine_core.get_output, {}
    with profiling.timed_calls(targets, calls) as totals:
        assert llm.llm_engine.engine_core.get_output() == "scheduled"
        llm.llm_engine.engine_core.get_output()
    assert calls == dict(engine_core=2, schedule=2) and totals["engine_core"] >= totals["schedule"] > 0
    assert llm.llm_engine.engine_core.get_output is own and "schedule" not in vars(sched)


def test_a_step_breakdown_without_the_engine_core_in_reach_says_so():
    """An engine core in its own process: nothing to clock, recorded as an error, not raised (the
    kernels still come back from a one-shot GPU run)."""
    res = profiling.step_breakdown(SimpleNamespace(llm_engine=SimpleNamespace()), lambda: None, 4)
    assert res["batch"] == 4 and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in res["error"]
