"""What ``rigidjax fit`` and ``rigidjax fit-pendulum`` share: JAX's persistent compilation
cache, progress output, the input options (column map, units, unit check), loading several
paths, and the checks of output paths."""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from pathlib import Path

from ..identify import keep_programs
from ..io import LENGTH_UNITS, RATE_UNITS, TIME_UNITS, WINDOWS, describe_windows, has_ros_bags, load, replacing

__all__ = [
    "NO_CACHE_ENV",
    "CACHE_MIN_COMPILE_S",
    "add_cache_option",
    "compilation_cache_dir",
    "enable_compilation_cache",
    "Progress",
    "error",
    "add_input_options",
    "load_options",
    "plain_csv",
    "prepare_outputs",
    "write_output",
    "replacing",
    "load_paths",
]

NO_CACHE_ENV = "RIGIDJAX_NO_COMPILATION_CACHE"
#: programs that compile faster than this are not written to the cache (JAX's default is 1 s;
#: 0: every program, also the small eager operations of building and judging a fit, so that a
#: repeated command compiles nothing)
CACHE_MIN_COMPILE_S = 0.0

# ----------------------------------------------------------------------------- compilation cache


def add_cache_option(parser) -> None:
    """``--no-cache`` on a subcommand (the persistent compilation cache is on by default)."""
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help=f"do not use JAX's persistent compilation cache (also: {NO_CACHE_ENV}=1)",
    )


def _user_cache_root(environ) -> Path:
    home = Path(environ.get("HOME") or Path.home())
    if sys.platform == "win32":
        return Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    if sys.platform == "darwin":
        return home / "Library" / "Caches"
    return Path(environ.get("XDG_CACHE_HOME") or home / ".cache")


def compilation_cache_dir(no_cache: bool = False, environ=None) -> Path | None:
    """Where the command line keeps compiled programs, or ``None`` when turned off.

    ``<user cache>/rigidjax/jax-compilation-cache``: ``$XDG_CACHE_HOME`` or ``~/.cache`` on
    Linux, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows. Off with ``no_cache``
    (``--no-cache``) or ``RIGIDJAX_NO_COMPILATION_CACHE`` set to anything but ``""``, ``0``,
    ``false``, ``no``.
    """
    environ = os.environ if environ is None else environ
    if no_cache or environ.get(NO_CACHE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return None
    return _user_cache_root(environ) / "rigidjax" / "jax-compilation-cache"


def enable_compilation_cache(no_cache: bool = False) -> Path | None:
    """Point JAX's persistent compilation cache at :func:`compilation_cache_dir` (the command
    line only: the library never changes global JAX configuration), and keep the fit's traced
    programs beside it (``programs/``, :mod:`rigidjax.identify._stored`: a repeated run neither
    traces nor compiles them). Programs compiling in less than :data:`CACHE_MIN_COMPILE_S` are
    not stored in the compilation cache. Returns the folder, or ``None`` (off, or
    the folder cannot be created: a warning, and the run goes on without the cache)."""
    import jax

    d = compilation_cache_dir(no_cache)
    if d is None:
        return None
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"warning: compilation cache off: cannot create {d}: {e.strerror or e}", file=sys.stderr)
        return None
    jax.config.update("jax_compilation_cache_dir", str(d))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    keep_programs(d.parent / "programs")
    return d


# ----------------------------------------------------------------------------- progress

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class Progress:
    """Progress of one command on ``stream`` (stderr): elapsed time, the phase (loading with
    its file count, compiling, fitting with the LM iteration and the problems still iterating
    out of the total), the compilations seen (count, seconds, cache hits).

    On a terminal one line is redrawn (at most 5 times a second); otherwise plain lines are
    written when the phase changes and every ``every`` seconds (a heartbeat thread keeps
    them coming during a long compilation, when no iteration reports). ``quiet``: nothing.
    """

    def __init__(self, quiet: bool = False, stream=None, every: float = 10.0, tty: bool | None = None):
        self.stream = sys.stderr if stream is None else stream
        self.quiet = quiet
        self.tty = (getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.every = every if not self.tty else 0.2
        self.t0 = time.perf_counter()
        self.phase = ""
        self.iteration = 0
        self.active = None
        self.total = None
        self.compiles = 0
        self.compile_s = 0.0
        self.hits = 0
        self._last = -1e9
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._listening = False

    # jax.monitoring listeners: count the programs compiled and those loaded from the cache
    def _on_duration(self, event, duration, **kw):
        if event == _COMPILE_EVENT:
            self.compiles += 1
            self.compile_s += duration

    def _on_event(self, event, **kw):
        if event == _CACHE_HIT_EVENT:
            self.hits += 1

    def __enter__(self):
        if not self.quiet:
            import jax.monitoring as monitoring

            monitoring.register_event_duration_secs_listener(self._on_duration)
            monitoring.register_event_listener(self._on_event)
            self._listening = True
            self._thread = threading.Thread(target=self._heartbeat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        if self._listening:
            import jax.monitoring as monitoring

            for unregister, fn in (
                (getattr(monitoring, "unregister_event_duration_listener", None), self._on_duration),
                (getattr(monitoring, "unregister_event_listener", None), self._on_event),
            ):
                try:
                    if unregister is not None:
                        unregister(fn)
                except (ValueError, AssertionError, KeyError):
                    pass
            self._listening = False
        if self.tty and not self.quiet and self._last > -1e9:
            self.stream.write("\n")
            self.stream.flush()

    def _heartbeat(self):
        while not self._stop.wait(self.every):
            self._emit(force=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def line(self) -> str:
        s = f"[{self.elapsed():7.1f} s] {self.phase}"
        if self.phase.startswith("fitting"):
            s += f": LM iteration {self.iteration}"
            if self.active is not None:
                s += f", {self.active} of {self.total} start(s) iterating"
        if self.compiles or self.hits:
            s += f"; compiled {self.compiles} program(s) in {self.compile_s:.1f} s"
            s += f", {self.hits} from the cache" if self.hits else ""
        return s

    def _emit(self, force=False):
        if self.quiet or not self.phase:
            return
        with self._lock:
            now = time.perf_counter()
            if not force and now - self._last < self.every:
                return
            self._last = now
            if self.tty:
                self.stream.write("\r\033[K" + self.line())
            else:
                self.stream.write(self.line() + "\n")
            self.stream.flush()

    def set_phase(self, phase: str):
        """A new phase, shown at once (``loading 2/3: PATH``, ``compiling ...``, ...)."""
        self.phase = phase
        self._emit(force=True)

    def start_fit(self, n_problems: int, what: str):
        """Before the fit: ``compiling`` until the first iteration reports."""
        self.total = n_problems
        self.iteration = 0
        self.set_phase(f"compiling (then fitting {what})")

    def tick(self, n_active):
        """The fit's ``progress(n_active)`` callback (after every LM iteration)."""
        self.iteration += 1
        if self.iteration == 1:
            self.phase = "fitting"
        n_active = int(n_active)
        if self.active is not None and n_active > self.active:
            self.total = None  # more than before: the fit's next stage (a new set of problems)
        self.active = n_active
        self.total = max(self.total or 0, n_active)
        self._emit(force=self.iteration == 1)


def error(cmd: str, msg: str) -> int:
    print(f"rigidjax {cmd}: error: {msg}", file=sys.stderr)
    return 2


def add_input_options(p, windows: str = "auto") -> None:
    g = p.add_argument_group("input (rigidjax.io)")
    g.add_argument(
        "--windows",
        choices=list(WINDOWS),
        default=windows,
        help="where the windows come from (app exports): auto = segments.csv, else free flights detected from the "
        "rate (|d omega/dt| <= |omega|^2/sqrt(3) at a rate well above the hand-held level; rigidjax.io.detect), "
        "else the whole recording; file = segments.csv or the whole recording; detect = detected even where "
        f"segments.csv exists (default {windows}). Detected windows are listed with their rows (--segment N)",
    )
    g.add_argument(
        "--columns",
        default=None,
        metavar="MAP",
        help="plain CSV: which column holds each quantity, e.g. t=Time,wx=gx,wy=gy,wz=-gz (a leading - negates; "
        "quantities t, wx..wz, qw..qz, r11..r33, x..z, tau_x..tau_z)",
    )
    g.add_argument(
        "--topic",
        default=None,
        metavar="NAME",
        help="ROS bag (rosbag2 folder, .mcap, .db3 or ROS 1 .bag; pip install 'rigidjax[ros]'): "
        "the sensor_msgs/msg/Imu topic to read (default: the bag's only one)",
    )
    g.add_argument("--time-unit", choices=list(TIME_UNITS), default=None, help="unit of the time column (default s)")
    g.add_argument("--rate-unit", choices=list(RATE_UNITS), default=None, help="unit of the rates (default rad/s)")
    g.add_argument(
        "--length-unit", choices=list(LENGTH_UNITS), default=None, help="plain CSV: unit of x,y,z (default m)"
    )
    g.add_argument(
        "--no-unit-check",
        action="store_true",
        help="skip the load-time check (more than 1 rad per sample, or a median step of 1 s or more, is refused)",
    )


def load_options(args) -> dict:
    return dict(
        time_unit=args.time_unit,
        rate_unit=args.rate_unit,
        check_units=not args.no_unit_check,
        windows=getattr(args, "windows", "auto"),
    )


def plain_csv(path) -> bool:
    p = Path(path)
    return p.suffix.lower() == ".csv" and p.name not in ("Raw Data.csv", "Gyroscope.csv")


def prepare_outputs(cmd, args) -> int | None:
    """Check the output paths before the fit, not after it: missing folders are created (like
    simulate --out); a folder in the way or one that cannot be written exits 2 at once."""
    import os

    for opt, out in (("--json", args.json), ("--plot", args.plot)):
        if not out:
            continue
        p = Path(out)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return error(cmd, f"{opt} {out}: cannot create its folder {p.parent}: {e.strerror or e}")
        if p.is_dir():
            return error(cmd, f"{opt} {out}: is a folder; give a file name")
        if not os.access(p if p.exists() else p.parent, os.W_OK):
            return error(cmd, f"{opt} {out}: not writable")
    return None


def write_output(cmd, opt, path, write) -> int | None:
    """``write(tmp)`` into a temporary path moved onto ``path`` when complete
    (:func:`replacing`); an ``OSError`` is the message ``{opt} {path}: cannot write`` and exit
    status 2 (returned), else ``None``."""
    try:
        with replacing(path) as tmp:
            write(tmp)
    except OSError as e:
        return error(cmd, f"{opt} {path}: cannot write: {e.strerror or e}")
    return None


def load_paths(cmd, paths, args, progress: Progress | None = None, select=None):
    """Windows of every path in ``paths`` (warnings printed), or an exit code. ``--columns`` and
    ``--length-unit`` go to the plain CSV files among them, ``--topic`` to the ROS bags.
    Detected windows (no segments.csv) are listed on stdout with their rows, as ``--segment``
    counts them."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    for path in paths:
        if not Path(path).exists():
            return error(cmd, f"{path}: no such file or folder")
    plain = [p for p in paths if plain_csv(p)]
    if (args.columns or args.length_unit) and not plain:
        return error(cmd, "--columns and --length-unit apply to plain CSV files; none of the paths is one")
    topic = getattr(args, "topic", None)
    bags = [p for p in paths if has_ros_bags(p)]
    if topic is not None and not bags:
        return error(
            cmd,
            "--topic applies to ROS bags (rosbag2 folder, .mcap, .db3, ROS 1 .bag, or a folder holding them); "
            "none of the paths is one",
        )
    segs = []
    for i, path in enumerate(paths):
        if progress is not None:
            progress.set_phase(f"loading {i + 1}/{len(paths)}: {path}")
        extra = dict(columns=args.columns, length_unit=args.length_unit) if path in plain else {}
        if path in bags:
            extra = dict(topic=topic)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            segs += load(path, **load_options(args), **extra)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
    if select:
        segs = [s for s in segs if select.lower() in s.comment.lower()]
        if not segs:
            return error(cmd, f"no window's comment contains {select!r}")
    listing = describe_windows(segs)
    if listing:
        print(listing)
    return segs
