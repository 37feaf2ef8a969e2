"""Proc output: where a proc's stdout, stderr and ``logging`` records go.

In a proc, :data:`capture` puts the output in one of three modes:

* ``direct`` -- untouched: the proc writes to the file descriptors it
  inherited (a local proc: the client's terminal).
* ``file`` -- both descriptors go to a per-host log file (a remote proc that
  does not stream); lines written from Python are prefixed with the actor (or
  the proc) that wrote them, and appended whole.
* ``stream`` -- both descriptors go into pipes read by the ``monarch-output``
  thread, Python-level writes are tagged with the writing actor, and the lines
  travel to the root client in batches (one message per burst, never one per
  line) where :data:`printer` prints them with their prefix
  ``[<actor or proc> <host>]``, in the order each proc wrote them.

:meth:`Capture.drain` sends everything still buffered (a stopping proc calls
it before its last batch), so nothing printed before ``stop()`` is lost.

In the root, :class:`Printer` prints streamed lines at once, or, with an
aggregation window, collects the lines of a proc mesh for the window and
prints identical ones once with a count: ``[16 similar lines] step 10 loss 0.12``.
"""

from __future__ import annotations

import collections
import errno
import io
import logging
import os
import selectors
import stat
import sys
import threading
import time
from typing import Any, Callable, Optional

from monarch_core._proc._state import actor_name

logger = logging.getLogger("monarch.logs")

DIRECT, FILE, STREAM = "direct", "file", "stream"
#: Seconds a burst of output waits for more before it is sent.
COALESCE = 0.005
MAX_LINE = 64 << 10


#: Where the log files of remote procs go, and what their folder must be.
LOG_DIR_SETTING = "MONARCH_PROC_LOG_DIR"


def private_dir(path: str, what: str = f"the proc log folder ({LOG_DIR_SETTING})") -> None:
    """Make ``path`` a folder of this user's that nobody else may enter
    (mode 0700), or check that the one there is: a real folder (not a link),
    owned by this user, with no access for group or others.  Otherwise
    ``PermissionError`` that names the path, what was found and the fix
    (another user who creates the folder first must not get our files)."""
    parent = os.path.dirname(path.rstrip("/")) or "."
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    me = os.geteuid()
    fix = f"remove it (or `chmod 700` it if it is yours), or set {LOG_DIR_SETTING} to a folder only you can use"
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise PermissionError(f"{what} {path} is {kind}; {fix}")
    if st.st_uid != me:
        raise PermissionError(f"{what} {path} belongs to {_user(st.st_uid)}, not to this process's user "
                              f"{_user(me)}: another user may read or replace the logs there; {fix}")
    if st.st_mode & 0o077:
        raise PermissionError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: other users may enter it; "
                              f"it must be 0700 (`chmod 700 {path}`), or set {LOG_DIR_SETTING} to another folder")


def open_private_log(path: str) -> int:
    """Open (create) the log file ``path`` for appending, readable by this
    user only (0600), in a folder :func:`private_dir` accepts; a link at
    ``path`` is not followed.  The descriptor; ``PermissionError`` that says
    what to fix."""
    private_dir(os.path.dirname(path) or ".")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PermissionError(f"the proc log file {path} is a symbolic link; it is not followed: "
                                  "remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"the proc log file {path} is not a regular file of {_user(os.geteuid())}; remove it")
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o600)  # written by an older version: private from now on
    return fd


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def whole_lines() -> None:
    """Make this proc's ``sys.stdout`` and ``sys.stderr`` write each line
    whole, as soon as it ends (line-buffered, not write-through), whatever
    the interpreter chose: with ``PYTHONUNBUFFERED=1`` a ``print`` writes
    each of its pieces on its own, and procs sharing a terminal mixed the
    words of their lines; to a pipe, stdout is block-buffered, and a local
    proc's prints appeared only when it ended.  ``flush()`` still writes a
    line not ended yet (a progress bar)."""
    for s in (sys.stdout, sys.stderr):
        if isinstance(s, io.TextIOWrapper):
            try:
                s.reconfigure(line_buffering=True, write_through=False)
            except (ValueError, OSError):  # pragma: no cover - a closed stream
                pass


class _ProcStream(io.TextIOBase):
    """What ``sys.stdout`` / ``sys.stderr`` are in a proc whose output is
    captured: whole lines, tagged with the actor that wrote them."""

    def __init__(self, capture: Capture, fd: int, original: Any) -> None:
        self._capture = capture
        self._fd = fd
        self._original = original
        self._partial = ""
        self._lock = threading.Lock()

    # the attributes code expects of sys.stdout
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", "utf-8") or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return getattr(self._original, "errors", "strict") or "strict"

    @property
    def buffer(self) -> Any:
        return self._original.buffer

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        with self._lock:
            text = self._partial + s
            if "\n" not in text:
                self._partial = text if len(text) < MAX_LINE else ""
                if len(text) >= MAX_LINE:
                    self._capture.lines(self._fd, actor_name(), [text])
                return len(s)
            *whole, self._partial = text.split("\n")
        self._capture.lines(self._fd, actor_name(), whole)
        return len(s)

    def flush(self) -> None:
        with self._lock:
            rest, self._partial = self._partial, ""
        if rest:
            self._capture.lines(self._fd, actor_name(), [rest])


class Capture:
    """The output of this proc (one per process; see the module docstring)."""

    def __init__(self) -> None:
        self.mode = DIRECT
        self.lock = threading.RLock()
        self.send: Optional[Callable[[list], None]] = None
        self.label = ""
        #: where mode ``file`` writes (a remote proc's per-host log file; None: no such file)
        self.log_path: Optional[str] = None
        self.log_file: Optional[str] = None  # the file being written now (mode ``file``)
        self._queue: collections.deque[tuple] = collections.deque()
        self._saved: dict[int, int] = {}  # fd -> a duplicate of what it was before we touched it
        self._streams: dict[int, _ProcStream] = {}
        self._originals: dict[int, Any] = {}
        self._pipes: dict[int, int] = {}  # read end -> the fd it serves
        self._partial: dict[int, bytes] = {}
        self._file_fd: Optional[int] = None
        self._thread: Optional[threading.Thread] = None
        self._wake_r: Optional[int] = None
        self._wake_w: Optional[int] = None
        self._signalled = False

    # -------------------------------------------------------------- set up
    def configure(self, *, label: str, send: Callable[[list], None], log_path: Optional[str] = None) -> None:
        self.label = label
        self.send = send
        self.log_path = log_path

    def set_mode(self, mode: str) -> None:
        """Switch to ``mode`` (draining what the old mode holds); ``file``
        needs a ``log_path`` (:meth:`configure`)."""
        if mode not in (DIRECT, FILE, STREAM):
            raise ValueError(f"unknown output mode {mode!r}")
        if mode == FILE and self.log_path is None:
            raise ValueError("this proc has no log file (only procs on remote hosts do)")
        with self.lock:
            if mode == self.mode:
                return
            self.drain()
            self._undo()
            if mode == FILE:
                self._to_file(self.log_path)  # type: ignore[arg-type]
            elif mode == STREAM:
                self._to_pipes()
            self.mode = mode

    def quiet_mode(self) -> str:
        """Where output goes when it is not streamed: the log file, or the inherited descriptors."""
        return FILE if self.log_path is not None else DIRECT

    def _save(self, fd: int) -> None:
        if fd not in self._saved:
            self._saved[fd] = os.dup(fd)

    def _install_streams(self) -> None:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            orig = getattr(sys, name)
            if isinstance(orig, _ProcStream):
                continue
            try:
                orig.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing to flush
                pass
            self._originals[fd] = orig
            s = self._streams[fd] = _ProcStream(self, fd, orig)
            setattr(sys, name, s)
            _repoint_handlers(orig, s)

    def _restore_streams(self) -> None:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            s = self._streams.pop(fd, None)
            orig = self._originals.pop(fd, None)
            if s is not None and orig is not None:
                s.flush()
                if getattr(sys, name) is s:
                    setattr(sys, name, orig)
                _repoint_handlers(s, orig)

    def _to_file(self, path: str) -> None:
        fd = open_private_log(path)
        self._file_fd = fd
        self.log_file = path
        for target in (1, 2):
            self._save(target)
            os.dup2(fd, target)
        self._install_streams()

    def _to_pipes(self) -> None:
        for target in (1, 2):
            r, w = os.pipe()
            self._save(target)
            os.dup2(w, target)
            os.close(w)
            os.set_blocking(r, False)
            self._pipes[r] = target
            self._partial[r] = b""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._install_streams()
        self._thread = threading.Thread(target=self._run, name="monarch-output", daemon=True)
        self._thread.start()

    def _undo(self) -> None:
        """Back to the descriptors the proc started with (mode ``direct``)."""
        self._restore_streams()
        for target, saved in list(self._saved.items()):
            os.dup2(saved, target)
        if self._pipes:
            thread, self._thread = self._thread, None
            self._wake()
            if thread is not None:
                thread.join(2.0)
            for r in list(self._pipes):
                self._read_pipe(r, final=True)
                os.close(r)
            self._pipes.clear()
            for fd in (self._wake_r, self._wake_w):
                if fd is not None:
                    os.close(fd)
            self._wake_r = self._wake_w = None
        if self._file_fd is not None:
            os.close(self._file_fd)
            self._file_fd = None
            self.log_file = None
        self.mode = DIRECT

    # -------------------------------------------------------------- lines
    def lines(self, fd: int, who: Optional[str], texts: list[str]) -> None:
        """Whole lines written from Python (any thread)."""
        if self.mode == STREAM:
            q = self._queue
            now = time.time()
            for t in texts:
                q.append((fd, who, t, now))
            self._wake()
            return
        prefix = f"[{who or self.label}] "
        data = "".join(prefix + t + "\n" for t in texts).encode("utf-8", "replace")
        try:
            os.write(fd, data)
        except OSError:  # pragma: no cover - the descriptor is gone
            pass

    def _wake(self) -> None:
        if self._signalled or self._wake_w is None:
            return
        self._signalled = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # pragma: no cover
            pass

    def _read_pipe(self, r: int, final: bool = False) -> None:
        fd = self._pipes[r]
        while True:
            try:
                chunk = os.read(r, 65536)
            except BlockingIOError:
                chunk = None
            except OSError:
                chunk = b""
            if not chunk:
                break
            data = self._partial[r] + chunk
            *whole, rest = data.split(b"\n")
            if len(rest) >= MAX_LINE:
                whole.append(rest)
                rest = b""
            self._partial[r] = rest
            now = time.time()
            for line in whole:
                self._queue.append((fd, None, line.decode("utf-8", "replace"), now))
            if chunk is None:
                break
        if final and self._partial.get(r):
            self._queue.append((fd, None, self._partial[r].decode("utf-8", "replace"), time.time()))
            self._partial[r] = b""

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        for r in list(self._pipes):
            sel.register(r, selectors.EVENT_READ)
        assert self._wake_r is not None
        wake_r = self._wake_r
        sel.register(wake_r, selectors.EVENT_READ)
        try:
            while self._thread is threading.current_thread():
                sel.select(1.0)
                time.sleep(COALESCE)
                try:
                    while os.read(wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                self._signalled = False
                with self.lock:
                    if self._thread is not threading.current_thread():
                        break
                    for r in list(self._pipes):
                        self._read_pipe(r)
                    self._send_queued()
        finally:
            sel.close()

    def _send_queued(self) -> None:
        q = self._queue
        if not q:
            return
        batch = []
        while q:
            try:
                batch.append(q.popleft())
            except IndexError:
                break
        send = self.send
        if send is None:
            return
        try:
            send(batch)
        except Exception:  # noqa: BLE001 - the root is gone: nothing to show them to
            logger.debug("could not send %d output lines", len(batch), exc_info=True)

    def before_reply(self) -> None:
        """An endpoint is about to reply (the actor's thread): the lines it
        wrote from Python are sent first, so that its caller's next line comes
        after them.  Costs a length check when nothing is waiting."""
        if self._queue and self.mode == STREAM:
            with self.lock:
                self._send_queued()

    def drain(self) -> None:
        """Send (or write) everything buffered now (a stopping proc calls it)."""
        with self.lock:
            for s in list(self._streams.values()):
                s.flush()
            for name in ("stdout", "stderr"):
                try:
                    getattr(sys, name).flush()
                except Exception:  # noqa: BLE001
                    pass
            if self.mode == STREAM:
                for r in list(self._pipes):
                    self._read_pipe(r, final=True)
                self._send_queued()


def _repoint_handlers(old: Any, new: Any) -> None:
    """``logging`` handlers writing to ``old`` write to ``new`` from now on."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for h in lg.handlers:
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is old:
                h.setStream(new)


capture = Capture()


# ------------------------------------------------------------------ the root's printer


class Printer:
    """Prints the lines procs stream to the root client (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: proc mesh name -> aggregation window in seconds (0: print at once)
        self.windows: dict[str, float] = {}
        #: (the window of a mesh whose logging_option was not called: none, each line printed as it comes, in
        #: the order written -- what an endpoint printed before it returned shows before its caller's next line)
        self.default_window = 0.0
        #: print the time each line was written (``MONARCH_LOG_TIMESTAMPS``; read when the first batch comes)
        self.timestamps: Optional[bool] = None
        #: group -> (deadline, {(stream, text): [count, first prefix]}) for windows being filled
        self._open: dict[str, tuple[float, dict]] = {}
        self._thread: Optional[threading.Thread] = None
        self._cond = threading.Condition(self.lock)
        self._log_files: set[str] = set()

    def set_window(self, group: str, seconds: Optional[float]) -> None:
        with self.lock:
            self.windows[group] = float(seconds or 0.0)

    def add(self, batch: dict) -> None:
        """A proc's batch with output lines (any thread)."""
        log_file = batch.get("log_file")
        if log_file and log_file not in self._log_files:
            self._log_files.add(log_file)
            logger.info("output of procs on host %s goes to %s (ProcMesh.logging_option(stream_to_client=True) "
                        "streams it to this client)", batch.get("host"), log_file)
        out = batch.get("output") or ()
        if not out:
            return
        host = batch.get("host") or "?"
        label = batch.get("proc_name") or batch.get("proc")
        group = str(batch.get("group") or label)
        size = int(batch.get("group_size") or 1)
        if self.timestamps is None:
            from monarch_core import settings

            self.timestamps = bool(settings.get("MONARCH_LOG_TIMESTAMPS"))
        stamp = self.timestamps
        with self.lock:
            window = self.windows.get(group, self.default_window)
            if window <= 0 or size <= 1:
                self._write([(item[0], f"[{item[1] or label} {host}{_when(item, stamp)}] {item[2]}") for item in out])
                return
            entry = self._open.get(group)
            if entry is None:
                entry = self._open[group] = (time.monotonic() + window, {})
                self._ensure_thread()
                self._cond.notify()
            lines = entry[1]
            for item in out:
                k = (item[0], item[2])
                v = lines.get(k)
                if v is None:
                    lines[k] = [1, f"{item[1] or label} {host}{_when(item, stamp)}"]
                else:
                    v[0] += 1

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="monarch-log-aggregator", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self.lock:
            while True:
                if not self._open:
                    self._cond.wait(30.0)
                    if not self._open:
                        self._thread = None
                        return
                    continue
                now = time.monotonic()
                due = [g for g, (deadline, _l) in self._open.items() if deadline <= now]
                for g in due:
                    self._print_group(self._open.pop(g)[1])
                if self._open:
                    self._cond.wait(max(0.0, min(d for d, _l in self._open.values()) - now))

    def _print_group(self, lines: dict) -> None:
        out = []
        for (fd, text), (n, prefix) in lines.items():
            out.append((fd, f"[{n} similar lines] {text}" if n > 1 else f"[{prefix}] {text}"))
        self._write(out)

    @staticmethod
    def _write(lines: list[tuple[int, str]]) -> None:
        """Print ``lines`` in their order: each run of consecutive lines of one
        stream is written and flushed before the next run (a proc's stdout and
        stderr lines interleave as it wrote them)."""
        i, n = 0, len(lines)
        while i < n:
            fd = lines[i][0]
            j = i
            while j < n and lines[j][0] == fd:
                j += 1
            stream = sys.stderr if fd == 2 else sys.stdout
            try:
                stream.write("".join(t + "\n" for _f, t in lines[i:j]))
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed terminal
                pass
            i = j

    def flush(self, group: Optional[str] = None) -> None:
        """Print what the open windows hold now (``group``: only that proc mesh's)."""
        with self.lock:
            for g in [g for g in self._open if group is None or g == group]:
                self._print_group(self._open.pop(g)[1])


def _when(item: tuple, stamp: bool) -> str:
    """`` HH:MM:SS.mmm``, the time a streamed line was written (``stamp``:
    ``MONARCH_LOG_TIMESTAMPS``), or nothing."""
    if not stamp or len(item) < 4:
        return ""
    t = item[3]
    return time.strftime(" %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


printer = Printer()
