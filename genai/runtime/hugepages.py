"""Back a session's host memory (its weights, prepacked) with 2 MiB pages.

A decode step on the CPU streams every weight once; with 4 KiB pages a 100 MB model spans
about 25,000 pages, far more than the TLB holds, so each step pays page walks. Linux can back
anonymous memory with transparent huge pages (THP), but in its common ``madvise`` mode only
where a process asks. `backing_new_memory` returns the C heap's free pages to the kernel and
notes which 2 MiB chunks of anonymous memory are wholly resident before a block runs (session
creation); afterwards it asks the kernel to collapse every chunk that became wholly resident
into a huge page (``MADV_HUGEPAGE`` + ``MADV_COLLAPSE``, Linux 6.1+): fresh mappings and
reused heap alike. This runs on a background thread, so loading does not wait for the copy.

Chunks that were already filled are left alone (another engine's session in the same process
keeps its pages); chunks the block touched only partly are too (collapsing would make them
wholly resident). Anywhere this is unavailable (not Linux, THP off, an older kernel) nothing
happens: it is an optimisation, never a requirement. ``GENAI_HUGEPAGES=0`` switches it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25
_THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass
class HugePageReport:
    """What `backing_new_memory` did: bytes asked for and bytes the kernel collapsed.

    The collapse runs on a background thread (copying costs the kernel about 7 ms per 2 MiB
    here); `wait` blocks until it is over."""

    requested: int = 0
    collapsed: int = 0
    #: Bytes the kernel would not collapse (``EINVAL``): chunks only ever read (all of them the
    #: shared zero page), or memory another thread unmapped or changed since the scan. Not an
    #: error: collapsing them would gain nothing.
    refused: int = 0
    #: Why nothing was attempted (None when it was).
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = field(default=None, repr=False, compare=False)

    def wait(self, timeout: float | None = None) -> HugePageReport:
        """Block until the background collapse is over (or ``timeout`` seconds); returns self."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self

    @property
    def done(self) -> bool:
        """Whether the collapse is over (True when nothing was attempted)."""
        return self._thread is None or not self._thread.is_alive()


def anonymous_ranges(maps_text: str) -> list[tuple[int, int]]:
    """Address ranges of the private, writable, anonymous mappings (including ``[heap]``) in
    the text of ``/proc/<pid>/maps``, merged where they touch."""
    ranges: list[tuple[int, int]] = []
    for line in maps_text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        perms = parts[1]
        path = parts[5].strip() if len(parts) == 6 else ""
        if not (perms.startswith("rw") and perms[3] == "p"):
            continue
        if path and path != "[heap]":
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    return ranges


def _unavailable() -> str | None:
    if os.environ.get("GENAI_HUGEPAGES", "1") == "0":
        return "switched off by GENAI_HUGEPAGES=0"
    if not sys.platform.startswith("linux"):
        return f"transparent huge pages are Linux-only (this is {sys.platform})"
    try:
        setting = _THP_SETTING.read_text()
    except OSError:
        return "the kernel has no transparent huge pages"
    if "[never]" in setting:
        return "transparent huge pages are set to never"
    return None


def _read_maps() -> list[tuple[int, int]]:
    return anonymous_ranges(Path("/proc/self/maps").read_text())


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def filled_chunks(ranges: list[tuple[int, int]]) -> set[int]:
    """Start addresses of the whole 2 MiB chunks inside ``ranges`` whose pages are all
    resident (``mincore``)."""
    mincore = _libc().mincore
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    mincore.restype = ctypes.c_int
    per_chunk = HUGE_PAGE // os.sysconf("SC_PAGE_SIZE")
    block = 256  # chunks per mincore call (512 MiB)
    vec = ctypes.create_string_buffer(per_chunk * block)
    out: set[int] = set()
    for start, end in ranges:
        lo = -(-start // HUGE_PAGE) * HUGE_PAGE
        hi = end // HUGE_PAGE * HUGE_PAGE
        for first in range(lo, hi, HUGE_PAGE * block):
            count = min(block, (hi - first) // HUGE_PAGE)
            if mincore(first, count * HUGE_PAGE, vec) != 0:
                continue
            pages = vec.raw
            for i in range(count):
                if pages.find(b"\x00", i * per_chunk, (i + 1) * per_chunk) < 0:
                    out.add(first + i * HUGE_PAGE)
    return out


def merge_chunks(chunks: set[int]) -> list[tuple[int, int]]:
    """Chunk start addresses as sorted ``(start, end)`` ranges, touching chunks merged."""
    out: list[tuple[int, int]] = []
    for chunk in sorted(chunks):
        if out and out[-1][1] == chunk:
            out[-1] = (out[-1][0], chunk + HUGE_PAGE)
        else:
            out.append((chunk, chunk + HUGE_PAGE))
    return out


def _release_free_heap() -> None:
    """Return the C heap's free pages to the kernel (glibc ``malloc_trim``), so memory the
    block reuses shows up as newly filled."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes = (ctypes.c_size_t,)
        trim(0)


def collapse(ranges: list[tuple[int, int]], report: HugePageReport) -> None:
    """Ask the kernel to back each range with huge pages, now (``MADV_COLLAPSE``) and after
    any later fault (``MADV_HUGEPAGE``). Failures are recorded in ``report``, not raised.

    The kernel goes on past a chunk it cannot collapse but then fails the whole call, so a
    failed range is asked again chunk by chunk (chunks already collapsed answer at once) to
    count what was collapsed and what was refused."""
    madvise = _libc().madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    for start, end in ranges:
        report.requested += end - start
        madvise(start, end - start, _MADV_HUGEPAGE)
        if madvise(start, end - start, _MADV_COLLAPSE) == 0:
            report.collapsed += end - start
            continue
        for chunk in range(start, end, HUGE_PAGE):
            if madvise(chunk, HUGE_PAGE, _MADV_COLLAPSE) == 0:
                report.collapsed += HUGE_PAGE
            elif (code := ctypes.get_errno()) == errno.EINVAL:
                report.refused += HUGE_PAGE
            else:
                report.errors.append(f"{chunk:#x}+{HUGE_PAGE}: {os.strerror(code)}")


@contextlib.contextmanager
def backing_new_memory(enabled: bool = True, background: bool = True) -> Iterator[HugePageReport]:
    """Run the block, then collapse the anonymous memory it mapped and filled into 2 MiB pages,
    on a background thread unless ``background`` is False.

    Yields the `HugePageReport`, filled in as the collapse goes (see `HugePageReport.wait`)."""
    report = HugePageReport()
    reason = None if enabled else "not enabled"
    reason = reason or _unavailable()
    if reason is not None:
        report.skipped = reason
        yield report
        return
    _release_free_heap()
    before = filled_chunks(_read_maps())
    yield report
    chunks = merge_chunks(filled_chunks(_read_maps()) - before)
    if not chunks:
        return
    if not background:
        collapse(chunks, report)
        return
    # ctypes drops the GIL around each madvise, so the caller goes on while the kernel copies.
    thread = threading.Thread(
        target=collapse, args=(chunks, report), name="genai-hugepages", daemon=True
    )
    report._thread = thread
    thread.start()
