"""`python -m terra_nb.serve --model DIR`: the world-model server (see `terra_nb.serve`).

It listens on 127.0.0.1:8000 unless told otherwise (--host, --port), once its engine has started:
about a minute on a CPU (importing vLLM and starting its engine process); GET /health answers 200
from then on, so poll it for readiness. SIGTERM, SIGINT or SIGHUP stop it at any time (exit status
0); the engine's processes never outlive it (on Linux, even after `kill -9`); if the engine dies,
every session is told and it exits with status 1, for a supervisor to start it again.
With --data-parallel-size N it runs N engine cores (ranks, vLLM's data parallelism): vLLM's load
balancer places each new session on a rank and keeps it there, the server admits N times one
rank's sessions, and /health reports each rank's load."""
from __future__ import annotations

import argparse
import json
import sys

from .app import IDLE_TIMEOUT_S, CapacityError
from .server import EngineDied, StopWhileStarting, run, serve


def engine_arg(text: str) -> tuple[str, object]:
    """`KEY=VALUE` -> (KEY, VALUE read as JSON, else the string): `--engine-arg max_num_seqs=64`."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def ranks(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text}")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m terra_nb.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Terra checkpoint folder (e.g. data/toy/model)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--max-sessions", type=int, default=None,
                   help="sessions (from their start) and rollouts at once, at most the engine's max_num_seqs times "
                        "--data-parallel-size (the default; max_num_seqs is 32 on the CPU, raise it with --engine-arg "
                        "max_num_seqs=N); one more is refused at once (server_full; HTTP 503 on POST)")
    p.add_argument("--data-parallel-size", type=ranks, default=None, metavar="N",
                   help="engine cores (ranks), each a whole model with its own KV cache (default: 1). vLLM's load "
                        "balancer places each new session on the rank with the fewest requests in flight and keeps "
                        "it there; a frame message names its rank; /health's `ranks` gives each rank's load. On a "
                        "GPU host each rank takes a GPU; on the CPU each gets a KV cache sized for its max_num_seqs")
    p.add_argument("--max-frames", type=int, default=1000,
                   help="new frames of a rollout or a session at most (too_many_frames)")
    p.add_argument("--idle-timeout", type=seconds, default=IDLE_TIMEOUT_S, metavar="SECONDS",
                   help=f"close a WebSocket that sends nothing for this long while the server waits for its next "
                        f"message (idle_timeout; default: {IDLE_TIMEOUT_S:g} s; the time its frames take does not count)")
    p.add_argument("--decoder", choices=("auto", "toy", "none"), default="auto",
                   help="decode frames to PNG for clients that ask (auto: the toy world's model only)")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="vLLM's stats off: /metrics then shows no vLLM metrics (a little less work a step)")
    p.add_argument("--engine-arg", type=engine_arg, action="append", default=[], metavar="KEY=VALUE",
                   help="a vLLM engine argument over make_async_engine's defaults (repeatable), e.g. max_num_seqs=64")
    p.add_argument("--log-level", default="info")
    return p


def engine_args(args) -> dict:
    """The --engine-arg pairs, and --data-parallel-size over them."""
    pairs = dict(args.engine_arg)
    if args.data_parallel_size is not None:
        pairs["data_parallel_size"] = args.data_parallel_size
    return pairs


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    stops = StopWhileStarting().install()
    print(f"terra_nb.serve: starting the engine on {args.model}; then http://{args.host}:{args.port}/ "
          "(the page), /health, /metrics, POST /v1/rollouts, WS /v1/sessions", flush=True)
    try:
        run(serve(args.model, args.host, args.port, metrics=not args.disable_log_stats, decoder=args.decoder,
                  max_sessions=args.max_sessions, max_frames=args.max_frames, idle_timeout=args.idle_timeout,
                  log_level=args.log_level, engine_args=engine_args(args)))
    except CapacityError as err:
        sys.exit(f"terra_nb.serve: {err}")
    except EngineDied as err:
        sys.exit(f"terra_nb.serve: {err}; exiting with status 1")
    except BaseException:
        if stops.signal is None:
            raise
        # a stop signal while no graceful shutdown could take it (the engine starting, or stopping): its processes are killed
        stops.stopped()
        print(f"terra_nb.serve: stopped by {stops.signal}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
