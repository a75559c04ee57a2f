"""Several JAX processes as one: a local launcher and :func:`initialize` for scripts.

Launch ``n`` processes of a script on this machine, joined through ``jax.distributed``::

    python -m rigidjax.launch -n 2 [--devices-per-process K] [--port P] script.py [args ...]
    python -m rigidjax.launch -n 2 -m package.module [args ...]

Each child runs ``python script.py args`` with

* ``RIGIDJAX_COORDINATOR_ADDRESS=127.0.0.1:P`` (a free port unless ``--port``),
* ``RIGIDJAX_NUM_PROCESSES=n``, ``RIGIDJAX_PROCESS_ID=i`` (``0 ... n-1``),
* with ``--devices-per-process K``: ``XLA_FLAGS`` plus
  ``--xla_force_host_platform_device_count=K`` (K CPU devices per process) and
  ``JAX_PLATFORMS=cpu``,

and the script calls :func:`initialize` before any other JAX work. The launcher streams the
children's output, waits for all of them and exits with the first non-zero status (``0`` if
all succeeded); when one fails, the others are terminated after ``--grace`` seconds (they
would otherwise wait for the lost peer until JAX's own timeouts). The same script runs
unchanged as one plain process (``initialize`` does nothing then), under SLURM
(``srun python script.py``: JAX reads SLURM's variables) or on hosts started by hand (set
the three ``RIGIDJAX_*`` variables on each; README.md, "Scaling out").

Once initialized, ``jax.devices()`` lists every process's devices, and
:func:`rigidjax.ensemble.ensemble_rollout` shards its members over all of them (each process
passes the same full ensemble; see its docstring).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["initialize", "free_port", "launch", "main", "ENV_COORDINATOR", "ENV_NUM_PROCESSES", "ENV_PROCESS_ID"]

ENV_COORDINATOR = "RIGIDJAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "RIGIDJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "RIGIDJAX_PROCESS_ID"


def _slurm_multi_task(env) -> bool:
    return "SLURM_JOB_ID" in env and int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")) or 1) > 1


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    initialization_timeout: int = 300,
    **kwargs,
) -> dict:
    """Join this process to the others through ``jax.distributed.initialize``, if there are others.

    Sources, first found wins: the arguments (all three); the ``RIGIDJAX_*`` variables (set by
    ``python -m rigidjax.launch`` or by hand: :data:`ENV_COORDINATOR` ``host:port``,
    :data:`ENV_NUM_PROCESSES`, :data:`ENV_PROCESS_ID`); a SLURM step with more than one task
    (``SLURM_JOB_ID``, ``SLURM_NTASKS > 1``: JAX's own SLURM detection picks the
    coordinator, the first node of the step, and a port from the job id); otherwise nothing
    is done (one plain process). Call it before any other JAX computation; calling it again
    after a successful initialization does nothing.

    Args:
        coordinator_address: ``"host:port"`` of process 0's coordinator service.
        num_processes: number of processes (>= 1).
        process_id: this process, ``0 <= process_id < num_processes``.
        initialization_timeout: s, how long to wait for every process to connect.
        **kwargs: passed to ``jax.distributed.initialize`` (e.g. ``local_device_ids``).

    Returns:
        ``{"source": "arguments" | "environment" | "slurm" | "none" | "already",
        "process_id": int, "num_processes": int}`` (after initialization:
        ``jax.process_index()``, ``jax.process_count()``).

    Raises:
        ValueError: only some of the three arguments or variables given, or values out of range.
        RuntimeError: from JAX, e.g. a coordinator that cannot be reached within the timeout.
    """
    import jax

    if jax.distributed.is_initialized():
        return {"source": "already", "process_id": jax.process_index(), "num_processes": jax.process_count()}
    given = (coordinator_address, num_processes, process_id)
    env = os.environ
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
    if any(v is not None for v in given):
        if any(v is None for v in given):
            raise ValueError("initialize: give coordinator_address, num_processes and process_id together, or none")
        source = "arguments"
    elif any(n in env for n in names):
        missing = [n for n in names if n not in env]
        if missing:
            raise ValueError(f"initialize: {', '.join(missing)} not set (the RIGIDJAX_* variables go together)")
        try:
            given = (env[ENV_COORDINATOR], int(env[ENV_NUM_PROCESSES]), int(env[ENV_PROCESS_ID]))
        except ValueError as e:
            raise ValueError(f"initialize: {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers ({e})") from None
        source = "environment"
    elif _slurm_multi_task(env):
        jax.distributed.initialize(initialization_timeout=initialization_timeout, **kwargs)
        return {"source": "slurm", "process_id": jax.process_index(), "num_processes": jax.process_count()}
    else:
        return {"source": "none", "process_id": 0, "num_processes": 1}
    address, n, i = given
    if ":" not in str(address):
        raise ValueError(f"initialize: coordinator address must be 'host:port'; got {address!r}")
    if int(n) < 1 or not 0 <= int(i) < int(n):
        raise ValueError(f"initialize: need num_processes >= 1 and 0 <= process_id < num_processes; got {n}, {i}")
    jax.distributed.initialize(
        coordinator_address=str(address),
        num_processes=int(n),
        process_id=int(i),
        initialization_timeout=initialization_timeout,
        **kwargs,
    )
    return {"source": source, "process_id": jax.process_index(), "num_processes": jax.process_count()}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; another program could take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def launch(
    command: list[str],
    n: int,
    *,
    devices_per_process: int | None = None,
    port: int | None = None,
    grace: float = 10.0,
    env: dict | None = None,
    timeout: float | None = None,
) -> int:
    """Run ``python *command`` as ``n`` local processes joined by :func:`initialize`; their exit status.

    Args:
        command: the arguments after ``python``: ``["script.py", ...]`` or ``["-m", "pkg.mod", ...]``.
        n: number of processes (>= 1).
        devices_per_process: CPU devices per process (sets ``XLA_FLAGS`` and
            ``JAX_PLATFORMS=cpu``); ``None`` leaves the platform and flags as inherited.
        port: coordinator port on 127.0.0.1 (default: a free one).
        grace: s to wait for the others after one process fails, before terminating them.
        env: base environment (default ``os.environ``).
        timeout: s for the whole run; on expiry every process is terminated and 124 returned.

    Returns:
        0 if every process exited with 0, else the first non-zero status seen (a process
        killed by signal ``k``: ``-k``, as :mod:`subprocess` reports it).

    Raises:
        ValueError: ``n < 1``, ``devices_per_process < 1`` or an empty command.
    """
    if n < 1:
        raise ValueError(f"launch: n must be >= 1; got {n}")
    if not command:
        raise ValueError("launch: no command (a script path, or -m module)")
    if devices_per_process is not None and devices_per_process < 1:
        raise ValueError(f"launch: devices_per_process must be >= 1; got {devices_per_process}")
    base = dict(os.environ if env is None else env)
    address = f"127.0.0.1:{port or free_port()}"
    procs = []
    for i in range(n):
        e = dict(base)
        e.update({ENV_COORDINATOR: address, ENV_NUM_PROCESSES: str(n), ENV_PROCESS_ID: str(i)})
        if devices_per_process is not None:
            flags = [f for f in e.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
            e["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices_per_process}"])
            e["JAX_PLATFORMS"] = "cpu"
        procs.append(subprocess.Popen([sys.executable, *command], env=e))
    deadline = None if timeout is None else time.monotonic() + timeout
    status, failed_at = 0, None
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            for p in procs:
                rc = p.poll()
                if rc not in (None, 0) and status == 0:
                    status, failed_at = rc, now
            if deadline is not None and now > deadline:
                status = 124
                break
            if failed_at is not None and now - failed_at > grace:
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        status = 130
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode), 0)
    return status


def main(argv=None) -> int:
    """``python -m rigidjax.launch -n N [--devices-per-process K] script.py [args]``: :func:`launch`
    from the command line; returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="python -m rigidjax.launch",
        description="Run a Python script as N local processes joined by jax.distributed (rigidjax.launch.initialize).",
    )
    ap.add_argument("-n", "--num-processes", type=int, required=True, help="number of processes")
    ap.add_argument("--devices-per-process", type=int, default=None, help="CPU devices per process (XLA_FLAGS)")
    ap.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--grace", type=float, default=10.0, help="s before the others are stopped after a failure")
    ap.add_argument("--timeout", type=float, default=None, help="s for the whole run (exit 124 on expiry)")
    ap.add_argument("-m", dest="module", default=None, help="run a module (as python -m) instead of a script")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args ...] (or the module's args with -m)")
    args = ap.parse_args(argv)
    command = ["-m", args.module, *args.command] if args.module else list(args.command)
    if not command:
        ap.error("give a script (script.py [args]) or -m module [args]")
    try:
        return launch(
            command,
            args.num_processes,
            devices_per_process=args.devices_per_process,
            port=args.port,
            grace=args.grace,
            timeout=args.timeout,
        )
    except ValueError as e:
        ap.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
