"""Work on every core, by mechanism: worker threads (``tasks``), hashing and copying byte ranges
(``ranges``), getting written bytes to the disk while a copy goes on (``writeback``), the
cyclic collector held off (``gc_hold``) and CRC-32 for zip headers (``crc``).

    >>> import tempfile; f = tempfile.TemporaryFile(); _ = f.write(b"abcdef"); f.flush()
    >>> [h.size for h in hash_ranges([[Segment(f.fileno(), 0, 3)], [Segment(f.fileno(), 3, 3)]])]
    [3, 3]
"""
from __future__ import annotations

from .crc import crc32, crc32_combine, crc32_later
from .gc_hold import GC_HOLD_SECONDS, gc_held
from .ranges import (
                     BATCH_BYTES,
                     BUFFER,
                     Hashed,
                     Job,
                     Output,
                     Segment,
                     group_consecutive,
                     hash_copy,
                     hash_ranges,
                     pwrite_all,
                     split_where,
                     thread_buffer,
)
from .tasks import WORKERS, Background, TaskPool, locked_progress, run_calls, run_parallel
from .writeback import FLUSH_BYTES, Flusher, preallocate, start_writeback

__all__ = ["WORKERS", "BUFFER", "BATCH_BYTES", "Segment", "Hashed", "Job", "hash_copy", "hash_ranges", "run_parallel",
           "run_calls", "group_consecutive", "split_where", "preallocate", "start_writeback", "crc32_combine",
           "crc32", "crc32_later",
           "locked_progress", "gc_held", "GC_HOLD_SECONDS", "Background", "TaskPool", "pwrite_all", "Output",
           "thread_buffer", "Flusher", "FLUSH_BYTES"]
