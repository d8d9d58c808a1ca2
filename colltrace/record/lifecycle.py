"""How a rank's trace ends: footer on exit, error record on exception, stacks on hang, SIGTERM and fatal signals."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from colltrace.record.memory import MemorySampler, oom_size
from colltrace.trace import schema
from colltrace.trace.frames import user_frame

if TYPE_CHECKING:
    from colltrace.record.tracer import Tracer

_MAX_FRAMES = 40
_MAX_DUMPS = 10
# signals handled in Python that say nothing about the rank's own course: a DataLoader's worker exited
_UNTOLD = frozenset(getattr(signal, name) for name in ("SIGCHLD",) if hasattr(signal, name))


def thread_stacks(rec: Any) -> list[dict[str, Any]]:
    """Python stacks of all threads, innermost frame last; with its records' tid where the thread has recorded."""
    names = {t.ident: t.name for t in threading.enumerate()}
    tids = getattr(rec, "tids", {})
    out = []
    for ident, frame in sys._current_frames().items():
        frames = traceback.extract_stack(frame)[-_MAX_FRAMES:]
        thread = {
            "thread": names.get(ident, str(ident)),
            "ident": ident,
            "frames": [[f.filename, f.lineno, f.name, (f.line or "").strip()] for f in frames],
        }
        if ident in tids:
            thread["tid"] = tids[ident]
        out.append(thread)
    return out


class Lifecycle:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.recorder: Any = None
        self.ended = False
        self.has_left = False  # destroy_process_group() of the default group returned (left())
        self._fault_file: Any = None
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self._wakeup_r = -1
        self.hang_s = 0.0
        self.watch: Watch | None = None
        self.memory: MemorySampler | None = None  # the process's memory, sampled by the watchdog (record/memory.py)
        self._prev_excepthook: Any = None
        self._prev_threadhook: Any = None

    def start(
        self, recorder: Any, hang_s: float, hang_floor_s: float = 0.0, autoreport: bool = False, world: int = 0,
        memory: bool = False,
    ) -> None:  # fmt: skip
        self.recorder = recorder
        self.hang_s = hang_s
        if memory and os.path.exists("/proc/self/statm"):  # Linux: elsewhere no memory samples, and nothing said
            try:
                self.memory = MemorySampler(recorder.writer)
                self.memory.sample(recorder.ctx.step)
            except Exception as e:
                self.memory = None
                recorder.warn_once("memory sampling could not start", e)
        try:
            self.watch = Watch(recorder.writer, hang_floor_s, autoreport, stalls=world <= STALL_WORLD_MAX)
        except Exception as e:  # the live extras step aside; the end records below must be set up
            recorder.warn_once("the live watchdog could not start", e)
        atexit.register(self.footer)
        try:  # multiprocessing children (mp.spawn) leave through os._exit: atexit does not run
            from multiprocessing import util

            util.Finalize(None, self.footer, exitpriority=-100)
        except Exception:
            pass
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_threadhook = threading.excepthook
        threading.excepthook = self._thread_excepthook
        self._enable_faulthandler(recorder.writer.fault_path)
        self._install_sigterm()
        self._watchdog = threading.Thread(target=self._watch, name="colltrace-watchdog", daemon=True)
        self._watchdog.start()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a forked child (a DataLoader worker): this rank's trace is its parent's. Write nothing to it,
        and hand back what was set up for the parent: the SIGTERM handler and its wakeup pipe (a worker's
        SIGTERM must not kill the parent), faulthandler's file, the footer."""
        if self.recorder is None or self.ended:
            return
        self.ended = True
        self.tracer.stop()
        try:
            atexit.unregister(self.footer)
            if self._wakeup_r >= 0 and threading.current_thread() is threading.main_thread():
                signal.set_wakeup_fd(-1)
                if signal.getsignal(signal.SIGTERM) is _noop_handler:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if self._fault_file is not None:
                faulthandler.disable()
        except Exception:
            pass

    # -- clean exit and exceptions ----------------------------------------------------------

    def footer(self) -> None:
        if self.ended or self.recorder is None:
            return
        self.ended = True
        self._stop.set()
        if self.watch is not None:
            self.watch.finished(self.recorder)
            self.watch.gone()
        rec = self.recorder
        try:
            rec.poll(final=True)  # async Works that finished since the watchdog's last look
        except Exception:
            pass
        if self._wakeup_r >= 0:  # a signal the script handled just before it exited (a preemption notice)
            self._read_signals(terminate=False)
        try:
            rec.writer.event(
                {
                    "ev": schema.EV_FOOTER,
                    "t_ns": time.time_ns(),
                    "step": rec.ctx.step,
                    "in_flight": rec.in_flight,
                }
            )
            rec.writer.flush()
        except Exception:
            pass

    def left(self) -> None:
        """destroy_process_group() of the default group returned: the rank's part in the job ended cleanly. Said
        durably (a framework may end the process next, Ray with a signal); the watchdog calls no hang after it."""
        rec = self.recorder
        if rec is None or self.ended or self.has_left:
            return
        self.has_left = True
        try:
            rec.poll(final=True)
        except Exception:
            pass
        try:
            ev = {"ev": schema.EV_DESTROYED, "t_ns": time.time_ns(), "step": rec.ctx.step, "in_flight": rec.in_flight}
            # other threads that issued collectives and still run: a framework tearing the group down from a
            # thread of its own while the training loop goes on (Ray after another worker failed) is no clean end
            me, alive = threading.get_ident(), {t.ident for t in threading.enumerate()}
            busy = sorted(tid for ident, tid in rec.tids.items() if ident != me and ident in alive)
            if busy:
                ev["busy"] = busy
                ev["threads"] = [t for t in thread_stacks(rec) if t.get("tid") in busy]
            rec.writer.event(ev)
            rec.writer.flush()
        except Exception:
            pass

    def error(self, exc: BaseException, tb: Any = None) -> None:
        rec = self.recorder
        if rec is None or self.ended:  # ended: a forked child's (its parent's trace) or after the footer
            return
        try:
            ev = {"ev": schema.EV_ERROR, **_error_fields(rec, exc, tb)}
            asked = oom_size(exc)
            if asked is not None:  # out of memory: the size asked for, and where memory stood
                ev["oom_size"] = asked
                self.sample_memory(force=True, oom=asked)
            rec.writer.event(ev)
        except Exception:
            pass

    def sample_memory(self, force: bool = False, oom: int | None = None) -> None:
        """The watchdog's look at the process's memory; forced (a line whatever moved) at an out-of-memory error."""
        mem, rec = self.memory, self.recorder
        if mem is None or rec is None:
            return
        try:
            mem.sample(rec.ctx.step, force)
            if oom is not None and mem.cuda is not None:
                mem.cuda_event(rec.ctx.step, oom)
        except Exception as e:
            self.memory = None
            rec.warn_once("memory sampling failed", e)

    def _excepthook(self, etype: Any, value: BaseException, tb: Any) -> None:
        if not isinstance(value, (SystemExit,)):
            self.error(value, tb)
        hook = self._prev_excepthook or sys.__excepthook__
        hook(etype, value, tb)

    def _thread_excepthook(self, args: Any) -> None:
        """A thread of the job died of an exception (a batch producer, an upload thread): its main thread may
        wait for it forever, in no collective. Recorded as a thread_error event, then handed on."""
        try:
            rec = self.recorder
            if not issubclass(args.exc_type, SystemExit) and not self.ended and rec is not None:
                tb = traceback.extract_tb(args.exc_traceback)
                ev = {"ev": schema.EV_THREAD_ERROR, **_error_fields(rec, args.exc_value, args.exc_traceback),
                      "thread": getattr(args.thread, "name", "") or "",
                      "where": user_frame([(f.filename, f.lineno or 0, f.name) for f in reversed(tb)])}  # fmt: skip
                tid = rec.tids.get(getattr(args.thread, "ident", None))
                if tid is not None:  # a thread that recorded: the analysis knows whether it ran the training loop
                    ev["tid"] = tid
                rec.writer.event(ev)
        except Exception:
            pass
        hook = self._prev_threadhook or threading.__excepthook__
        hook(args)

    def patch_spawn_wrap(self, patches: Any) -> None:
        """mp.spawn children catch the exception themselves and exit(1): record it there.

        Patched when torch is imported: a spawned child resolves `_wrap` while unpickling its
        target, right after importing torch and before any user code runs."""
        try:
            import importlib

            # not `import torch.multiprocessing.spawn`: that name is shadowed by the function
            spawn_mod = importlib.import_module("torch.multiprocessing.spawn")
        except Exception:
            return
        lifecycle = self

        def make(orig: Any) -> Any:
            def _wrap(fn: Any, i: int, args: Any, *rest: Any, **kw: Any) -> Any:
                def traced_fn(*a: Any, **k: Any) -> Any:
                    try:
                        return fn(*a, **k)
                    except Exception as e:
                        lifecycle.error(e)
                        raise

                return orig(traced_fn, i, args, *rest, **kw)

            _wrap.__module__ = orig.__module__
            _wrap.__qualname__ = orig.__qualname__
            return _wrap

        patches.wrap(spawn_mod, "_wrap", make)

    def patch_process_bootstrap(self, patches: Any) -> None:
        """Plain multiprocessing.Process children: BaseProcess._bootstrap catches what escapes run(), prints it
        and exits 1, past sys.excepthook (its footer is written before, at util._exit_function): record it on
        its way out of run().

        Patched when torch is imported: a forked child inherits it; a spawned one imports torch while it
        unpickles its Process (the target's module), before _bootstrap runs."""
        try:
            from multiprocessing import process
        except Exception:
            return
        lifecycle = self

        def make(orig: Any) -> Any:
            def _bootstrap(proc: Any, *args: Any, **kw: Any) -> Any:
                try:
                    proc.run = _recording_run(proc.run, lifecycle)  # the instance's: a subclass's own run too
                except Exception:
                    pass  # it runs as it would untraced
                return orig(proc, *args, **kw)

            _bootstrap.__module__ = orig.__module__
            _bootstrap.__qualname__ = orig.__qualname__
            return _bootstrap

        patches.wrap(process.BaseProcess, "_bootstrap", make)

    # -- fatal signals and SIGTERM ----------------------------------------------------------

    def _enable_faulthandler(self, path: str) -> None:
        if faulthandler.is_enabled():
            return  # the user's own faulthandler keeps its file
        try:
            mode = getattr(self.recorder.writer, "file_mode", 0o600)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            self._fault_file = os.fdopen(fd, "w")  # must stay open for the process's life
            faulthandler.enable(file=self._fault_file, all_threads=True)
        except Exception:
            pass

    def _install_sigterm(self) -> None:
        """Record SIGTERM even while the main thread is blocked inside a collective.

        A Python-level handler only runs between bytecodes of the main thread, which never comes
        while gloo or NCCL blocks it; the C-level handler writes to the wakeup fd, which our
        watchdog thread reads. It records, then dies of SIGTERM as the launcher expects.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return  # the user handles SIGTERM; leave it to them
            r, w = os.pipe()
            os.set_blocking(w, False)
            os.set_blocking(r, False)
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            if old != -1:  # someone else (asyncio) owns the wakeup fd
                signal.set_wakeup_fd(old)
                os.close(r)
                os.close(w)
                return
            signal.signal(signal.SIGTERM, _noop_handler)
            self._wakeup_r = r
        except Exception:
            pass

    def _on_signal(self, signum: int) -> None:
        rec = self.recorder
        try:
            rec.writer.event(
                {"ev": schema.EV_SIGNAL, "t_ns": time.time_ns(), "signal": signal.Signals(signum).name,
                 "in_flight": rec.in_flight}
            )  # fmt: skip
            rec.writer.event({"ev": schema.EV_STACKS, "reason": "signal", "t_ns": time.time_ns(),
                              "waiting": rec.waiting, "threads": thread_stacks(rec)})  # fmt: skip
        except Exception:
            pass
        if signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is _noop_handler:
            if self.watch is not None:
                self.watch.gone()
            _die_of(signum)  # ours still: die of it, as the launcher expects
        # else the script set its own handler since (a checkpoint on SIGTERM): it runs in the main thread, and
        # decides; recorded all the same

    def _read_signals(self, terminate: bool) -> None:
        """The signals Python's C-level handler wrote to our wakeup fd since the last look: SIGTERM (with
        `terminate`: record it and die of it) and those the script handles itself."""
        try:
            data = os.read(self._wakeup_r, 64)
        except OSError:  # nothing there (non-blocking), or closed
            return
        for signum in data:
            if signum == signal.SIGTERM:
                if terminate:
                    self._on_signal(signum)
            elif signum not in _UNTOLD:
                self._caught(signum)

    def _caught(self, signum: int) -> None:
        """A signal the script handles itself arrived (Python's C-level handler wrote it to our wakeup fd, as it
        does for every signal with a Python handler): a preemption notice, a timer. What the rank did next
        (leave the loop, save) may be its answer, and the other ranks were not told."""
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        try:
            self.recorder.writer.event({"ev": schema.EV_SIGNAL_CAUGHT, "t_ns": time.time_ns(), "signal": name,
                                        "step": self.recorder.ctx.step})  # fmt: skip
        except Exception:
            pass

    # -- hang watchdog -----------------------------------------------------------------------

    def _watch(self) -> None:
        import select

        rec = self.recorder
        poll = 0.5 if not self.hang_s else min(0.5, max(0.05, self.hang_s / 4))  # keep <= 0.5: FLAG_POLLED
        dumped_at = -1
        dumps = 0
        while not self._stop.is_set():
            if self._wakeup_r >= 0:
                try:
                    ready, _, _ = select.select([self._wakeup_r], [], [], poll)
                except (OSError, ValueError):
                    ready = []
                if ready:
                    self._read_signals(terminate=True)
            else:
                time.sleep(poll)
            try:
                rec.poll()  # async Works that finished with nobody waiting on them
            except Exception as e:
                rec.warn_once("polling async collectives failed", e)
            self.sample_memory()
            last = rec.progress_ns()
            idle = (time.monotonic_ns() - last) / 1e9
            watch = self.watch
            if watch is not None:
                try:
                    watch.tick(rec, last, idle)  # heartbeat, stacks asked for, the job's usual wait
                except Exception as e:
                    rec.warn_once("the live watchdog failed", e)
            if dumps >= _MAX_DUMPS or last == dumped_at or self.has_left:
                continue
            fixed = bool(self.hang_s) and idle >= self.hang_s
            usual = watch.stuck(idle) if watch is not None else None
            if fixed or usual is not None:
                dumped_at = last
                dumps += 1
                try:
                    ev = {"ev": schema.EV_STACKS, "reason": "hang", "t_ns": time.time_ns(), "idle_s": round(idle, 3),
                          "in_flight": rec.in_flight, "waiting": rec.waiting, "threads": thread_stacks(rec)}  # fmt: skip
                    if usual is not None:
                        ev["usual_s"] = round(usual, 3)
                    rec.writer.event(ev)
                except Exception:
                    pass
                if watch is not None:
                    watch.hung()


HANG_FACTOR = 20.0  # stuck: this many times the longest wait between two progress events the job has shown
STALL_S = 5.0  # a rank blocked this long in a collective asks whether the job has stalled (reads every rank)
_STALL_EVERY_S = 30.0  # ... at most this often, and at most _MAX_STALLS times: a job that waits by design
# ... in a world of at most this many ranks: reading a bigger one costs a training process seconds and its memory
# (docs/evaluation.md), so there only a hang (the usual wait's multiple) reads it, once
STALL_WORLD_MAX = 256
_MIN_GAPS = 10  # ... once this many of its half-second looks saw progress
_REPORT_EVERY_S = 30.0  # the written report is made again this often while the hang lasts, if it changed
_MAX_REPORTS = 5
_MAX_STALLS = 20


class Watch:
    """What the watchdog does for a live run: touch the rank's heartbeat, answer a request for its stacks,
    learn the job's usual wait between progress events (issues and completions) to call a hang in seconds,
    and, on the rank that takes the lock first, write report.md and report.json into the run directory."""

    def __init__(self, writer: Any, floor_s: float, autoreport: bool, stalls: bool = True) -> None:
        from colltrace.trace import live

        self.live = live
        self.writer = writer
        self.run_dir = writer.run_dir
        self.floor_s = floor_s
        self.autoreport = autoreport
        self.beat_path = live.heartbeat_path(self.run_dir, writer.rank)
        self.request_path = live.request_path(self.run_dir)
        self.lock_path = os.path.join(live.live_dir(self.run_dir), live.REPORT_LOCK)
        self.beat_at = 0.0
        self.seen_ns = 0  # the request file's mtime when last read
        self.answered = ""
        self.prev_last = 0
        self.usual = 0.0  # the longest gap between two progress events seen (at the watchdog's resolution)
        self.gaps = 0
        self.reporter = False  # this rank holds the report lock
        self.wrote = False  # ... and wrote the run's report (and live/status.json), which a stall's end takes back
        self.stalls = 0 if stalls else _MAX_STALLS  # times it read the run on a stall of its own
        self.stall = False  # the report it holds the lock for is a stall's (else a hang's)
        self.reported_last = 0
        self.stall_at = -_STALL_EVERY_S
        self.reports = 0
        self.reported_at = 0.0
        self.said = ""
        self.rec: Any = None
        self.idle = 0.0
        self.thread: threading.Thread | None = None

    def gone(self) -> None:
        """The rank ends (exit, a signal it dies of): its heartbeat goes with it, so that a reader right after
        does not take it for a live rank that will not answer."""
        self.beat_at = float("inf")  # a last tick of the watchdog thread does not put it back
        try:
            os.unlink(self.beat_path)
        except OSError:
            pass

    def tick(self, rec: Any, last: int, idle: float) -> None:
        self.rec, self.idle = rec, idle
        now = time.monotonic()
        if now - self.beat_at >= self.live.HEARTBEAT_S:
            self.beat_at = now
            try:
                os.utime(self.beat_path)
            except FileNotFoundError:  # who beats: a reader on this host can see it died
                self.live.make_dir(os.path.dirname(self.beat_path), self.run_dir)
                self.live.write_file(self.beat_path, f"{socket.gethostname()} {os.getpid()}\n", self.run_dir)
        try:
            mtime = os.stat(self.request_path).st_mtime_ns
        except OSError:
            mtime = 0
        if mtime and mtime != self.seen_ns:
            self.seen_ns = mtime
            rid = self.live.read_request(self.request_path)
            if rid and rid != self.answered:
                self.answer(rec, rid, idle)
        if last != self.prev_last:
            if self.prev_last:
                self.usual = max(self.usual, (last - self.prev_last) / 1e9)
                self.gaps += 1
            self.prev_last = last
            if self.reporter:
                self.resumed()
        elif self.reporter and self.reports < _MAX_REPORTS and now - self.reported_at >= _REPORT_EVERY_S:
            self.report_aside()  # the hang goes on: has the picture changed (a rank died, another hung)?
        elif (idle >= STALL_S and self.autoreport and not self.reporter and self.stalls < _MAX_STALLS
              and now - self.stall_at >= _STALL_EVERY_S and _blocked(rec)):  # fmt: skip
            self.stalls += 1
            self.stall_at = now
            self.hung(stall=True)  # what every rank knows says whether someone waits for someone (_report)

    def answer(self, rec: Any, rid: str, idle: float) -> None:
        self.answered = rid
        self.writer.event({"ev": schema.EV_STACKS, "reason": "request", "request": rid, "t_ns": time.time_ns(),
                           "idle_s": round(idle, 3), "in_flight": rec.in_flight, "waiting": rec.waiting, "threads": thread_stacks(rec)})  # fmt: skip

    def stuck(self, idle: float) -> float | None:
        """The job's usual wait when `idle` is a hang by it (HANG_FACTOR times it, the floor at least)."""
        if not self.floor_s or self.gaps < _MIN_GAPS:
            return None
        return self.usual if idle >= max(self.floor_s, HANG_FACTOR * self.usual) else None

    def hung(self, stall: bool = False) -> None:
        """This rank is blocked (a stall: STALL_S in a collective) or hung (by the job's usual wait): the first
        rank to take the lock writes the run's report."""
        self.stall = stall
        if not self.autoreport or self.reporter:
            return
        try:
            self.live.make_dir(self.live.live_dir(self.run_dir), self.run_dir)
            fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, self.live.modes(self.run_dir)[0])
        except OSError:
            return  # another rank writes it
        os.write(fd, str(self.writer.rank).encode())
        os.close(fd)
        self.reporter = True
        self.reported_last = self.prev_last  # its progress when it saw the stall or hang
        self.report_aside()

    def finished(self, rec: Any) -> None:
        """The rank exits cleanly: a stall or hang it reported that it got past since (it made progress after it:
        the job went on, and ended before the watchdog's next look) is taken back."""
        if self.reporter and rec.progress_ns() != self.reported_last:
            if self.thread is not None:
                self.thread.join(timeout=10)  # a report being written: taken back once it is
            self.resumed()

    def resumed(self) -> None:
        """This rank made progress again: the stall or hang it reported is over. What it wrote is taken back (a
        job that waited 20 s for a save ends with no report in its directory) and the lock let go."""
        if self.thread is not None and self.thread.is_alive():
            return  # its report is being written: taken back on the next progress
        if self.wrote:
            for name in ("report.md", "report.json", os.path.join(self.live.LIVE_DIR, self.live.STATUS_NAME)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.run_dir, name))
        self.let_go()
        self.wrote = False
        self.said = ""
        self.reports = 0

    def let_go(self) -> None:
        """Release the report lock: another rank (or this one, later) may write the run's report."""
        self.reporter = False
        with contextlib.suppress(OSError):
            os.unlink(self.lock_path)

    def report_aside(self) -> None:
        """Make the report in a thread of its own: the watchdog goes on taking SIGTERM and answering requests
        (a scheduler's SIGKILL follows its SIGTERM by seconds)."""
        if self.thread is not None and self.thread.is_alive():
            return
        self.reports += 1
        self.reported_at = time.monotonic()
        self.thread = threading.Thread(target=self.report, name="colltrace-report", daemon=True)
        self.thread.start()

    def report(self) -> None:
        """Ask every live rank for its stacks, then write the report beside the traces (atomically)."""
        try:
            self._report()
        except Exception as e:
            if self.rec is not None:
                self.rec.warn_once("writing the run's report failed", e)

    def _report(self) -> None:
        from colltrace.report.build import both_reports
        from colltrace.report.words import LIVE_SAID

        got = self.live.ask(self.run_dir, asking=lambda rid: self.answer(self.rec, rid, self.idle))
        md, js, status = both_reports(self.run_dir, got.not_answered if got is not None else ())
        if status is None and self.stall and not self.wrote:
            self.let_go()  # nobody waits for anyone in particular (a long collective every member is in): no stall
            return
        head = md.splitlines()[0].split(LIVE_SAID)[0] if md else ""  # not its ticking seconds
        if head == self.said:
            return
        self.said = head
        for name, text in (("report.md", md), ("report.json", js)):
            self.live.write_file(os.path.join(self.run_dir, name), text, self.run_dir)
        if status is not None:
            import json

            status["level"] = "stalled" if self.stall else "hung"
            status_path = os.path.join(self.live.live_dir(self.run_dir), self.live.STATUS_NAME)
            self.live.write_file(status_path, json.dumps(status, indent=1) + "\n", self.run_dir)
        self.wrote = True


def _blocked(rec: Any) -> bool:
    """The rank's newest record is a collective still in flight: it waits in it (not computing between two)."""
    writer = rec.writer
    idx = writer.last_idx
    w = writer.live_word(idx) if idx >= 0 else -1
    return w >= 0 and writer.t_done_ns[w] == 0


def _recording_run(run: Any, lifecycle: Lifecycle) -> Any:
    def recording_run() -> Any:
        try:
            return run()
        except BaseException as e:
            tb = e.__traceback__
            if tb is not None and tb.tb_next is not None:
                e.__traceback__ = tb.tb_next  # this frame out of the traceback the child prints (Python >= 3.11)
            if not isinstance(e, SystemExit):  # sys.exit() is an exit, as in _excepthook
                lifecycle.error(e)
            raise

    return recording_run


def _error_fields(rec: Any, exc: BaseException, tb: Any) -> dict[str, Any]:
    """An exception's fields of an error or thread_error event: what it is, its traceback, and the collective it
    came out of (with what the rank was handling then)."""
    text = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
    return {
        "t_ns": time.time_ns(),
        "type": type(exc).__name__,
        "qualname": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:2000],
        "traceback": text[-8000:],
        "step": rec.ctx.step,
        "in_flight": rec.in_flight,
        "in_collective": (at := _raised_by_collective(rec, exc)),
        "while_handling": _handling(rec) if at is not None else None,
    }


def _raised_by_collective(rec: Any, exc: BaseException) -> int | None:
    """idx of the collective this exception (or one it was raised from) came out of, else None."""
    failure = rec.last_failure
    if failure is None:
        return None
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if e is failure[0]:
            return failure[1]
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


_SHIM_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim.py")  # batch_isend_irecv's wrapper


def _handling(rec: Any) -> dict[str, str] | None:
    """The exception of the rank's own that it was handling when the collective an error came out of failed
    (rec.last_failure; a save or a barrier in an `except` block, a `finally`): the first of that failure's chain
    (type, message, its innermost frame of the user's), or None (no such chain)."""
    failure = rec.last_failure
    if failure is None:
        return None
    first, seen = None, {id(failure[0])}
    e = failure[0].__cause__ or failure[0].__context__
    while e is not None and id(e) not in seen:
        first = e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    if first is None:
        return None
    tb = traceback.extract_tb(first.__traceback__)
    if any(f.filename.startswith("<colltrace traced ") or f.filename == _SHIM_FILE for f in tb):
        return None  # an earlier collective's failure (a timeout, then a barrier in `finally`): not its own
    frames = [(f.filename, f.lineno or 0, f.name) for f in reversed(tb)]
    return {"type": type(first).__name__, "message": str(first)[:500], "where": user_frame(frames)}


def _noop_handler(signum: int, frame: Any) -> None:
    """Python-level SIGTERM handler: the watchdog thread does the work (see _install_sigterm)."""


def _die_of(signum: int) -> None:
    """Restore the default action and re-raise, from any thread (signal.signal is main-thread only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(ctypes.c_int(signum), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), signum)
        time.sleep(5)
    except Exception:
        pass
    os._exit(128 + signum)
