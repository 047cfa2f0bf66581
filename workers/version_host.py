"""A companion version's process: one model version, loaded and proven, answering batches over two pipes.

    python -P -m sie.workers.version_host --spec-file version-1.1.0.json --label "replica m-0 version 1.1.0" \
        --in-fd 5 --out-fd 6 [--gpu-indices 0 --gpu-memory-mb 2048]

Started by a replica's worker (``sie.workers.versions.VersionHost``) for the other version of a rollout, so
the two versions never share an interpreter: a python model's package is imported once per process, a
crash or a hang of one version cannot take the other down, and each can be killed alone.  What it does is
what a worker does before it serves (``sie.workers.worker_main``), then a loop::

    check    the node's spec policy and the module archive (check_spec), before anything is imported
    load     create the backend, load it, prove it with the readiness inference (load_proven)
    report   {"event": "ready", "latency_ms": ...}   or   {"event": "error", "detail": ...} and exit 1
    serve    one JSON line in  {"n": 7, "rows": [{...}, ...]}
             one JSON line out {"n": 7, "outputs": [{...}, ...]}  or  {"n": 7, "error": "..."}
    EOF on --in-fd: close the backend, exit 0

Requests and answers travel on dedicated pipes (``--in-fd``/``--out-fd``, passed with ``pass_fds``): stdout and
stderr go to the version's log file, so a model that prints can never corrupt an answer.  An answer's
``error`` is a failed call (the scorer isolates poison rows by bisection, as for an in-process backend); a
process that dies or stops answering is the worker's to detect (``VersionLost``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("sie.version_host")


def _emit(out: BinaryIO, doc: dict[str, Any]) -> None:
    import orjson

    out.write(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    out.flush()


def _load(args: argparse.Namespace) -> tuple[Any, float]:
    """The version's backend, checked, loaded and proven (the worker's own path: ``worker_main``)."""
    from sie.kernel.settings import Settings
    from sie.schemas.spec_policy import SpecPolicy
    from sie.workers.backends import backend_config_from_spec
    from sie.workers.worker_main import check_spec, load_proven, read_spec_file

    settings = Settings()
    policy = SpecPolicy.from_settings(settings)
    spec = read_spec_file(args.spec_file)
    check_spec(spec, policy, args.label)
    config = backend_config_from_spec(spec, policy)
    indices = [int(i) for i in args.gpu_indices.split(",") if i.strip()]
    extra = {"gpu_indices": indices, "gpu_memory_mb": args.gpu_memory_mb, "replica_id": args.label}
    if args.threads is not None:
        extra["threads"] = args.threads
    config = dataclasses.replace(config, config={**config.config, **extra})
    backend, result = load_proven(spec, config)
    return backend, result.latency_ms


def serve(backend: Any, requests: BinaryIO, out: BinaryIO) -> int:
    """Answer request lines until EOF; returns the number of calls answered."""
    import orjson

    calls = 0
    for line in iter(requests.readline, b""):
        try:
            request = orjson.loads(line)
            n, rows = request["n"], request["rows"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            _emit(out, {"n": None, "error": f"unreadable request ({exc})"})
            continue
        try:
            outputs = backend.infer(rows)
            data = orjson.dumps({"n": n, "outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY)
        except Exception as exc:  # a failed call (poison rows, a model error): the worker bisects
            data = orjson.dumps({"n": n, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        out.write(data + b"\n")
        out.flush()
        calls += 1
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sie.workers.version_host", description=__doc__.splitlines()[0])
    parser.add_argument("--spec-file", type=Path, required=True, help="the prepared (localized) ModelService document")
    parser.add_argument("--label", required=True, help="what errors and logs call this version")
    parser.add_argument("--in-fd", type=int, required=True, help="fd requests arrive on")
    parser.add_argument("--out-fd", type=int, required=True, help="fd events and answers are written to")
    parser.add_argument("--gpu-indices", default="", help="node-local GPU indices of the replica")
    parser.add_argument("--gpu-memory-mb", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: the backend's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = os.fdopen(args.out_fd, "wb")
    requests = os.fdopen(args.in_fd, "rb")
    _emit(out, {"event": "loading", "pid": os.getpid()})
    started = time.monotonic()
    try:
        backend, latency_ms = _load(args)
    except Exception as exc:  # SieError (policy, artifact, readiness) or anything the model raised
        log.exception("%s: cannot be loaded", args.label)
        _emit(out, {"event": "error", "detail": str(exc) or type(exc).__name__})
        return 1
    log.info("%s: loaded and proven in %.2fs", args.label, time.monotonic() - started)
    _emit(out, {"event": "ready", "latency_ms": round(latency_ms, 3)})
    try:
        calls = serve(backend, requests, out)
    finally:
        backend.close()
    log.info("%s: %d calls answered; stopping", args.label, calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
