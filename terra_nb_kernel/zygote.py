"""Notebook kernels forked from a process that has already imported torch and transformers.

Every notebook starts with `import terra_nb`, which imports torch and transformers: about 9 s of
CPU per kernel on the 2-core CI machine, paid again by each of the workbook's notebooks under
`make test` and `make reproduce`. A *zygote* imports `PRELOAD` once; each later kernel is a fork of
it that then runs ipykernel exactly as `python -m ipykernel_launcher` does, and starts in about a
second.

A forked kernel must behave like a fresh one, so the zygote is used only where that holds:

* **Same environment.** The kernel's environment must equal the one the zygote imported under
  (apart from `PER_KERNEL_PREFIXES`): variables read at interpreter start or at import time
  (`PYTHONWARNINGS`, `LD_PRELOAD`, `TRANSFORMERS_*`, `OMP_*`) then had the values the kernel would
  have read. Any other difference and the kernel starts the ordinary way (and the next zygote
  serves the new environment).
* **Nothing a notebook sets first.** vLLM is not preloaded: its logger reads `VLLM_LOGGING_LEVEL`
  at import, and the notebooks set that variable before they import vLLM.
* **A CPU build of torch.** Forking after CUDA's driver is loaded is unsafe; with a CUDA or ROCm
  build the zygote exits before it serves (the GPU machine starts every kernel the ordinary way).
* **A process like a fresh kernel's.** The fork gets its own session (jupyter starts kernels with
  `start_new_session`), the launcher's working directory, command line, environment and standard
  streams, fresh seeds for `random` and numpy's global generator, and `tqdm.auto`'s choice of
  progress bar made again inside the kernel (`_choose_progress_bars_again`).
* **Signals and death.** Jupyter signals the process group of the process it started: the
  *launcher* (`terra_nb_kernel.launch`), which relays each signal to the kernel's group and exits
  with the kernel's status. When the launcher is killed (SIGKILL cannot be relayed), the kernel
  sees its watch pipe close and kills its own group, as jupyter's `killpg` would have.

Where no zygote is ready (the first kernel of a run, while the zygote imports), or it refuses, the
launcher runs ipykernel itself. `TERRA_NB_KERNEL_ZYGOTE=off` turns the zygote off.

Standard library only: the launcher imports this module in a bare interpreter.
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass

PRELOAD = ("torch", "transformers", "terra_nb")
SOCKET_VAR = "TERRA_NB_KERNEL_ZYGOTE"
"""In a kernel's environment: the zygote's socket path (set by the starter), or "off"."""
PER_KERNEL_PREFIXES = ("JPY_", "VLLM_")
"""Variables allowed to differ between the zygote and a kernel (which gets its own values): jupyter's
per-kernel ones, and vLLM's, which nothing preloaded reads (vLLM is not preloaded; `main` checks).
An in-process vLLM engine sets some of its own in the process that starts kernels, with values new
for every engine (`VLLM_DIST_IDENT`)."""
LAUNCHER = "terra_nb_kernel.launch"
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HEADER = struct.Struct("!Q")
"""A request's first bytes (sent with the file descriptors): the length of its JSON body."""
NOT_HERE = 3
"""The zygote's exit status where it must not fork (a GPU build of torch): no zygote is started again."""


def comparable(env: dict[str, str]) -> dict[str, str]:
    """`env` without the variables that may differ between the zygote and a kernel it forks."""
    return {k: v for k, v in env.items() if k != SOCKET_VAR and not k.startswith(PER_KERNEL_PREFIXES)}


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """Names of the variables whose values differ between two environments (comparable parts)."""
    a, b = comparable(a), comparable(b)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


# ---- the starter's side: one zygote per process that starts kernels (a pytest worker, reproduce)

class Zygote:
    """A zygote process serving kernels whose environment equals `env`."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] | None = None):
        self.env = {k: v for k, v in env.items() if k != SOCKET_VAR}
        self.dir = tempfile.mkdtemp(prefix="terra-nb-zygote-")
        self.path = os.path.join(self.dir, "socket")
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "terra_nb_kernel.zygote", self.path, *(PRELOAD if preload is None else preload)], env=self.env,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def serves(self, env: dict[str, str]) -> bool:
        return self.process.poll() is None and not differences(self.env, env)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_zygote: Zygote | None = None


def kernel_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` for a kernel about to start, with the zygote's socket where one serves this environment.

    Starts a zygote for `env` where none serves it, replacing the last one (that kernel starts the
    ordinary way while the new zygote imports). A process's environment changes rarely but does
    change: an in-process vLLM engine sets variables of its own (a pytest worker's first engine),
    and every kernel started afterwards inherits them."""
    global _zygote
    if SOCKET_VAR in env or os.environ.get(SOCKET_VAR) == "off":
        return env  # the caller chose (a zygote of its own, or "off")
    if not _forkable_torch() or (_zygote is not None and _zygote.process.poll() == NOT_HERE):
        return env
    if _zygote is not None and _zygote.serves(env):
        return {**env, SOCKET_VAR: _zygote.path}
    if _zygote is not None:
        _zygote.stop()  # kernels forked from it run on; their launchers then wait on them directly
    _zygote = Zygote(env)
    return env


def _forkable_torch() -> bool:
    """False where this process has imported a GPU build of torch (the zygote checks for itself)."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    return version is None or not (getattr(version, "cuda", None) or getattr(version, "hip", None))


@atexit.register
def _stop_zygote() -> None:
    if _zygote is not None:
        _zygote.stop()


def kernel_argv(argv: list[str]) -> list[str]:
    """A kernel spec's command line with ipykernel's launcher replaced by `LAUNCHER`."""
    out = list(argv)
    for i in range(len(out) - 1):
        if out[i] == "-m" and out[i + 1] == "ipykernel_launcher":
            out[i + 1] = LAUNCHER
    return out


# ---- the zygote process

@dataclass
class Job:
    """What a forked child runs: a kernel with the launcher's command line, environment and streams."""
    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]  # stdin, stdout, stderr, the launcher's watch pipe


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, HEADER.size, 4)
    if len(head) != HEADER.size or len(fds) != 4:
        for fd in fds:
            os.close(fd)
        raise ValueError("malformed request")
    size, body = HEADER.unpack(head)[0], b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("request cut short")
        body += chunk
    return json.loads(body), fds


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the launcher is gone; nothing to tell


def serve(path: str, env: dict[str, str]) -> Job | None:
    """Accept kernel requests on `path` until the starter exits. Returns only in a forked child."""
    tmp = path + ".binding"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(tmp)
    listener.listen(16)
    os.rename(tmp, path)  # appears only now, ready: a launcher that finds no socket starts normally
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    starter, children = os.getppid(), {}
    try:
        while os.getppid() == starter:
            ready, _, _ = select.select([listener, wake_r], [], [], 1.0)
            if wake_r in ready:
                os.read(wake_r, 4096)
            _reap(children)
            if listener in ready:
                job = _accept(listener, env, children)
                if job is not None:  # in the child
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    return job
    finally:
        if os.getpid() == _zygote_pid:
            listener.close()
            _unlink_quietly(path)
    return None


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # the starter removed the zygote's folder first


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            conn.close()


def _accept(listener: socket.socket, env: dict[str, str], children: dict) -> Job | None:
    conn, _ = listener.accept()
    conn.settimeout(10)
    try:
        request, fds = _receive(conn)
    except (OSError, ValueError) as e:
        print(f"zygote: refused a request: {e}", file=sys.stderr, flush=True)
        conn.close()
        return None
    differ = differences(env, request["env"])
    if differ:
        for fd in fds:
            os.close(fd)
        _send(conn, {"refused": "environment differs in " + ", ".join(differ)})
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        for other in children.values():
            other.close()
        return Job(request["argv"], request["env"], request["cwd"], fds)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    _send(conn, {"pid": pid})
    return None


def run_kernel(job: Job, added: dict[str, str]) -> None:
    """In the forked child: become a fresh kernel process and run ipykernel."""
    os.setsid()
    for target, fd in enumerate(job.fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    os.set_inheritable(job.fds[3], False)  # the kernel's own subprocesses need not hold it
    _watch_launcher(job.fds[3])
    os.chdir(job.cwd)
    os.environ.clear()
    # what the preloaded imports added to the environment, as they would have in this process
    os.environ.update({**added, **job.env})  # the launcher's, without SOCKET_VAR
    sys.argv = list(job.argv)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # `random` reseeds itself after a fork; numpy does not
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()  # what `python -m ipykernel_launcher` runs, in three steps
    app.initialize()
    _choose_progress_bars_again()
    app.start()


def _choose_progress_bars_again() -> None:
    """`tqdm.auto` picks its bar when it is imported: a notebook widget where IPython says a kernel
    runs, else text. The zygote imported it (through transformers) outside any kernel, so re-run
    that choice in place once the kernel exists: the module objects stay, and transformers looks
    `tqdm.auto.tqdm` up at every call. (huggingface_hub's download bars subclassed the text bar at
    import and keep it; the workbook downloads nothing.)"""
    import importlib
    import warnings

    if "tqdm.autonotebook" not in sys.modules:
        return
    from tqdm import TqdmExperimentalWarning

    with warnings.catch_warnings():  # as tqdm.auto itself imports it
        warnings.simplefilter("ignore", TqdmExperimentalWarning)
        importlib.reload(sys.modules["tqdm.autonotebook"])
    if "tqdm.auto" in sys.modules:
        importlib.reload(sys.modules["tqdm.auto"])


def _watch_launcher(fd: int) -> None:
    """Kill this kernel's process group when the launcher dies (its end of the pipe closes)."""
    import threading

    def watch() -> None:
        while os.read(fd, 1):
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="terra-nb-launcher-watch", daemon=True).start()


_zygote_pid = os.getpid()


def main(path: str, preload: list[str]) -> None:
    # like ipykernel_launcher: the working directory is not on sys.path while ipykernel loads
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    before = dict(os.environ)
    for name in preload:
        importlib.import_module(name)
    if "vllm" in sys.modules:
        print("zygote: the preload imported vLLM, which reads VLLM_* variables: not serving", file=sys.stderr, flush=True)
        sys.exit(NOT_HERE)
    torch = sys.modules.get("torch")
    if torch is not None and (torch.version.cuda or getattr(torch.version, "hip", None)):
        print("zygote: torch is a GPU build; forking after its driver loads is unsafe: not serving",
              file=sys.stderr, flush=True)
        sys.exit(NOT_HERE)
    added = {k: v for k, v in os.environ.items() if k not in before}
    job = serve(path, before)
    if job is None:  # the starter exited
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    else:
        run_kernel(job, added)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
