"""Worker threads: a pool that tasks are handed to one at a time (``TaskPool``), one job in the
background (``Background``), a list mapped on threads (``run_parallel``, ``run_calls``) and a
progress callback made thread-safe (``locked_progress``)."""
from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import CancelledError
from typing import Any, TypeVar

__all__ = ["WORKERS", "run_parallel", "run_calls", "TaskPool", "Background", "locked_progress"]

#: worker threads for CPU-bound hashing and copying (one per core; two at least, so reads and
#: writes that wait on the disk overlap with hashing)
WORKERS = max(2, os.cpu_count() or 1)

T = TypeVar("T")
R = TypeVar("R")


def run_parallel(fn: Callable[[T], R], items: Sequence[T], workers: int, *,
                 on_error: Callable[[], None] | None = None) -> list[R]:
    """``[fn(item) for item in items]`` on up to ``workers`` threads (a ``TaskPool``), results
    in order.

    The first exception (or a ``KeyboardInterrupt`` here) stops every item not yet started (a
    worker checks before it starts one, so at most the ``workers`` already running go on) and
    calls ``on_error``, once, from whichever thread saw it (to interrupt those, e.g. cancel
    their transfers: it must be safe from any thread); it is raised once every thread has
    stopped, so nothing keeps writing behind the caller's back. One item, or one worker, runs
    in the calling thread.

    >>> run_parallel(lambda x: x * x, [1, 2, 3], 2)
    [1, 4, 9]
    """
    if not items:
        return []
    if len(items) == 1 or workers <= 1:
        return [fn(item) for item in items]
    results: list[Any] = [None] * len(items)

    def one(i: int, item: T) -> None:
        results[i] = fn(item)

    with TaskPool(min(workers, len(items)), on_stop=on_error) as pool:
        for i, item in enumerate(items):
            pool.submit(functools.partial(one, i, item))
    return results


def run_calls(calls: Sequence[Callable[[], R]], workers: int, *,
              on_error: Callable[[], None] | None = None) -> list[R]:
    """``run_parallel`` of calls that take no argument (a store's ``part_fetches``).

    >>> run_calls([lambda: 1, lambda: 2], 2)
    [1, 2]
    """
    return run_parallel(_call, calls, workers, on_error=on_error)


def _call(fn: Callable[[], R]) -> R:
    return fn()


class TaskPool:
    """Tasks handed one at a time (``submit``) to ``workers`` threads for the length of a
    ``with`` block, the threads already running when the block begins: what is handed over
    first starts at once while the block plans the rest, and then runs on the same threads (a
    pull fetches a member's large chunks while it reads the pack index and plans the pack
    reads, which then take their turn: one thread per core, not one set per kind of work).

    ``__enter__`` waits until every thread runs: a thread started while the block runs Python
    waits for the GIL up to ``sys.getswitchinterval()`` (5 ms) before its first line. Threads
    started in a row that way (one for the large chunks, which then started the pool of its
    ``get_parts``) had the large chunks of a 10,000-tensor pull wait 7-18 ms while its pack
    index was parsed; this pool took that pull from 185-186 to 179 ms (medians of 13-15,
    interleaved, one process).

    ``progress`` is the caller's, made safe across threads; ``self.progress``, what tasks
    report to, raises ``CancelledError`` once the pool stopped, so a transfer stops where it is.
    The first failure stops the pool: tasks not yet started are dropped, ``submit`` and
    ``check`` raise it in the block, and the block's exit, which waits for every thread, raises
    it; a block that failed on its own gets it as a note. ``finish`` runs once every thread
    has stopped, on the last one: closing what the tasks write through, so that a caller that
    stops waiting (a second Ctrl-C while the exit waits) never has it closed under a task.

    >>> seen = []
    >>> with TaskPool(2, seen.append) as pool:
    ...     pool.submit(lambda: pool.progress(3))
    ...     pool.submit(lambda: pool.progress(4))
    >>> sorted(seen)
    [3, 4]
    """

    def __init__(self, workers: int, progress: Callable[[int], None] | None = None, *,
                 finish: Callable[[], None] | None = None, on_stop: Callable[[], None] | None = None) -> None:
        self._finish = finish
        self._on_stop = on_stop
        self._queue: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._live = 0
        self._closed = False
        self._workers = max(1, workers)
        stop, locked = self._stop, locked_progress(progress)

        def report(n: int) -> None:
            if stop.is_set():
                raise CancelledError("stopped: the operation it was part of failed")
            if locked is not None:
                locked(n)
        report._locked = True  # type: ignore[attr-defined]  # locked_progress leaves it as it is
        self.progress: Callable[[int], None] = report

    def _fail(self, exc: BaseException) -> None:
        with self._lock:   # the first failure wins, unless it was only a task told to stop
            if self._error is None or (isinstance(self._error, CancelledError)
                                       and not isinstance(exc, CancelledError)):
                self._error = exc
        self._halt()

    def _halt(self) -> None:
        """Stop the pool (tasks not started are dropped, running ones stop at their next
        report) and, the first time, call ``on_stop``: what interrupts the tasks' transfers."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            on_stop, self._on_stop = self._on_stop, None
        if on_stop is not None:
            on_stop()

    def _run(self, started: threading.Semaphore) -> None:
        started.release()
        try:
            while (task := self._queue.get()) is not None:
                if self._stop.is_set():
                    continue    # dropped: the pool failed
                try:
                    task()
                except BaseException as exc:
                    self._fail(exc)
        finally:
            with self._lock:
                self._live -= 1
                last = self._live == 0
            if last:
                self._finished()

    def _finished(self) -> None:
        finish, self._finish = self._finish, None
        if finish is not None:
            try:
                finish()
            except BaseException as exc:
                self._fail(exc)

    def __enter__(self) -> TaskPool:
        started = threading.Semaphore(0)
        try:
            for _ in range(self._workers):
                thread = threading.Thread(target=self._run, args=(started,), name="pt2reg-worker", daemon=True)
                with self._lock:
                    self._live += 1
                self._threads.append(thread)   # before start: Ctrl-C inside start() may come once it runs
                try:
                    thread.start()
                except BaseException:
                    if thread.ident is None:   # it never ran
                        self._threads.pop()
                        with self._lock:
                            self._live -= 1
                    raise
            for _ in self._threads:
                started.acquire()
        except BaseException:   # no thread, or interrupted: stop those that run, then finish
            self._halt()
            self._close()
            if not self._threads:
                self._finished()
            raise
        return self

    def submit(self, task: Callable[[], Any]) -> None:
        """Run ``task()`` on the next free thread; raises the pool's failure if it failed
        (``RuntimeError`` once the block ended: nothing would run it)."""
        if self._closed:
            raise RuntimeError("TaskPool.submit after its with block")
        self.check()
        self._queue.put(task)

    def submit_all(self, tasks: Iterable[Callable[[], Any]]) -> None:
        for task in tasks:
            self.submit(task)

    def check(self) -> None:
        """Raise the pool's failure now if a task failed already."""
        if self._error is not None:
            raise self._error

    def _close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        try:
            for thread in self._threads:
                thread.join()
        except BaseException:   # interrupted while waiting (Ctrl-C): stop the tasks, then wait for them
            self._halt()
            for thread in self._threads:
                thread.join()
            raise

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if exc is not None:
            self._halt()
        self._close()
        if exc is None:
            self.check()
        elif isinstance(exc, BaseException) and self._error is not None and exc is not self._error \
                and not isinstance(self._error, CancelledError):
            exc.add_note(f"meanwhile, on another thread: {self._error}")



class Background(TaskPool):
    """``work(progress)`` on a thread of its own for the length of a ``with`` block (a push's
    large chunks going up while the rest of it is planned): a ``TaskPool`` of one thread and
    one task. ``progress`` raises ``CancelledError`` once the block failed (or the wait at its
    end was interrupted), so the block's exit does not wait for the rest of a large upload;
    ``check()`` in the block raises the work's error as soon as it failed, the exit raises it
    otherwise; ``result()`` after the block: what ``work`` returned. ``on_stop``: as
    ``TaskPool``'s, called once when the block or the work failed (to wake a work that waits
    on the block, say).

    >>> with Background(lambda progress: 6 * 7, None) as job:
    ...     pass
    >>> job.result()
    42
    """

    def __init__(self, work: Callable[[Callable[[int], None]], R], progress: Callable[[int], None] | None, *,
                 on_stop: Callable[[], None] | None = None) -> None:
        super().__init__(1, progress, on_stop=on_stop)
        self._work = work
        self._value: list[R] = []

    def __enter__(self) -> Background:
        super().__enter__()
        try:
            self.submit(lambda: self._value.append(self._work(self.progress)))
        except BaseException as exc:   # Ctrl-C right here: the thread is not left waiting for work
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def result(self) -> Any:
        self.check()
        return self._value[0]

def locked_progress(progress: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """``progress`` made safe to call from several threads at once."""
    if progress is None or getattr(progress, "_locked", False):
        return progress
    lock = threading.Lock()

    def call(n: int) -> None:
        with lock:
            progress(n)
    call._locked = True  # type: ignore[attr-defined]
    return call

