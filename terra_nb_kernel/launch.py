"""`python -m terra_nb_kernel.launch -f CONNECTION_FILE ...`: the workbook's kernel command.

Asks the zygote named by `$TERRA_NB_KERNEL_ZYGOTE` (see `terra_nb_kernel.zygote`) to fork a kernel
with this process's command line, environment, working directory and standard streams, then stands
in for it: every signal jupyter sends here goes on to the kernel's process group, and this process
exits with the kernel's status. Where there is no zygote, or it refuses, this process runs
ipykernel itself, exactly as `python -m ipykernel_launcher` would.
"""
from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import sys
import time

from terra_nb_kernel.zygote import HEADER, RELAYED, SOCKET_VAR


def forked_kernel(path: str, argv: list[str]) -> int | None:
    """Run the kernel as a fork of the zygote at `path`; its exit code, or None if it was refused."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        return None
    watch_r, watch_w = os.pipe()  # this process holds watch_w until it exits: the kernel then reads EOF
    env = {k: v for k, v in os.environ.items() if k != SOCKET_VAR}
    body = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
    try:
        socket.send_fds(conn, [HEADER.pack(len(body))], [0, 1, 2, watch_r])
        conn.sendall(body)
    except OSError:
        return None
    finally:
        os.close(watch_r)
    replies = conn.makefile("r")
    first = json.loads(replies.readline() or "{}")
    if "pid" not in first:
        if first.get("refused"):
            print(f"terra_nb_kernel: the zygote refused ({first['refused']}); starting normally", file=sys.stderr)
        return None
    pid = first["pid"]
    for sig in RELAYED:
        signal.signal(sig, lambda signum, _frame: _relay(pid, signum))
    last = replies.readline()
    if last:
        return json.loads(last)["exit"]
    while _alive(pid):  # the zygote went away first: wait for the kernel itself
        time.sleep(0.2)
    return 0


def _relay(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)  # the kernel leads its own session and group
    except OSError:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def main() -> None:
    argv = list(sys.argv)
    path = os.environ.get(SOCKET_VAR)
    code = forked_kernel(path, argv) if path and path != "off" and os.path.exists(path) else None
    if code is None:  # the ordinary start, in this process
        os.environ.pop(SOCKET_VAR, None)
        sys.argv = argv
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
        return
    if code < 0:  # killed by a signal: end the same way, so jupyter sees the same status
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
