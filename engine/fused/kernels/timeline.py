# mypy: disable-error-code="no-untyped-def,untyped-decorator,no-untyped-call"
"""Per-program timestamps of the small-batch path's kernels: a diagnostic, off by default.

With programmatic dependent launch a kernel's programs become resident while the kernel
before it still runs, wait, and then work; where the block scheduler puts them, and what
they share a multiprocessor with, has moved whole passes by up to 25% (NOTES v28, v30)
for reasons a kernel trace cannot show (it sees one start and one end per kernel). While
a :class:`Timeline` records (:func:`recording`), the kernels that take a ``trace_ptr``
argument (the deferred layer's GEMMs, attention, the embeddings and the QA head) are
launched with ``TRACE`` on and every program writes one row of :data:`FIELDS` into the
launch's slot of the timeline's buffer: when it started, when its PDL wait returned and
when it finished (``%globaltimer``, ns, one clock for the whole GPU), the same on its
multiprocessor's cycle counter (``%clock64``, precise but per SM), and the SM it ran on.
CUDA graphs captured while recording keep writing their slots at every replay.

Off (no recording), the kernels compile with ``TRACE`` false: the timer reads and the
store are not in their code (``tests/unit/test_timeline.py`` checks the SASS), and a
launch pays one global lookup on the host. The recorded times include the timer reads'
own cost (a few instructions a program) but are otherwise the kernels' own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# One row per program, int64.
# ``product_ns``, ``epilogue_ns`` and ``counted_ns``: marks inside a program (the main
# product done: a deferred GEMM's K loop, attention's key loop; its output computed,
# before the stores: a GEMM's before its conversion to the stored type, attention's
# after it; the tile counter returned, in a GEMM whose last program of a tile finishes
# it), each the mark before it where a kernel has no such point (the embeddings, the QA
# head, attention's tile-list path).
FIELDS = ("start_ns", "waited_ns", "end_ns", "start_clk", "waited_clk", "end_clk", "sm",
          "program", "product_ns", "epilogue_ns", "counted_ns")
_WIDTH = tl.constexpr(len(FIELDS))


@triton.jit
def _clock():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def stamp(TRACE: tl.constexpr):
    """(global ns, SM cycles) now where ``TRACE``, else (0, 0) and no instruction."""
    if TRACE:
        return tl.extra.cuda.globaltimer(), _clock()
    else:
        return 0, 0


@triton.jit
def record(trace_ptr, start, waited, product, epilogue, counted, TRACE: tl.constexpr):
    """Store this program's row (``start``/``waited``: :func:`stamp` at its start and
    after its PDL wait; ``product``, ``epilogue``, ``counted``: the marks of
    :data:`FIELDS`; the end stamped here) at its flat program index in ``trace_ptr``."""
    if TRACE:
        end_ns = tl.extra.cuda.globaltimer()
        end_clk = _clock()
        pid = (tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
               + tl.program_id(2) * tl.num_programs(0) * tl.num_programs(1))
        row = trace_ptr + pid.to(tl.int64) * _WIDTH
        tl.store(row, start[0])
        tl.store(row + 1, waited[0])
        tl.store(row + 2, end_ns)
        tl.store(row + 3, start[1])
        tl.store(row + 4, waited[1])
        tl.store(row + 5, end_clk)
        tl.store(row + 6, tl.extra.cuda.smid().to(tl.int64))
        tl.store(row + 7, pid.to(tl.int64))
        tl.store(row + 8, product[0])
        tl.store(row + 9, epilogue[0])
        tl.store(row + 10, counted[0])


@dataclass(frozen=True)
class Launch:
    """One recorded launch: its kernel's role, its programs and its rows' first index."""

    name: str
    programs: int
    first: int


class Timeline:
    """A buffer of ``capacity`` program rows on ``device`` (made now, outside any graph's
    memory pool) and the launches given slots in it, in launch order."""

    def __init__(self, device: torch.device, capacity: int = 1 << 17) -> None:
        self.device, self.capacity = torch.device(device), capacity
        self.rows = torch.zeros((capacity, len(FIELDS)), dtype=torch.int64, device=device)
        self.launches: list[Launch] = []
        self._used = 0

    def slot(self, name: str, programs: int) -> torch.Tensor:
        """The rows of a launch of ``programs`` programs."""
        if programs < 1:
            raise ValueError(f"a launch has at least one program, got {programs}")
        if self._used + programs > self.capacity:
            raise RuntimeError(f"the timeline holds {self.capacity} program rows: "
                               f"make it larger")
        self.launches.append(Launch(name, programs, self._used))
        view = self.rows[self._used : self._used + programs]
        self._used += programs
        return view

    def launch_rows(self) -> list[tuple[Launch, torch.Tensor]]:
        """Every launch and its rows as they are now, copied to the host once."""
        host = self.rows.cpu()
        return [(launch, host[launch.first : launch.first + launch.programs])
                for launch in self.launches]


_active: Timeline | None = None


@contextlib.contextmanager
def recording(timeline: Timeline) -> Iterator[Timeline]:
    """Launches in this block (in any thread) write their programs' rows to ``timeline``.
    A CUDA graph captured inside keeps its slots' addresses: keep ``timeline`` alive as
    long as the graph may replay (its replays write there)."""
    global _active
    if _active is not None:
        raise RuntimeError("a timeline is already recording")
    _active = timeline
    try:
        yield timeline
    finally:
        _active = None


def trace_slot(name: str, grid: tuple[int, ...]) -> torch.Tensor | None:
    """A launch's rows while a timeline records (None when none does, or for an empty
    grid). Launch wrappers pass ``trace_ptr=fallback if slot is None else slot`` and
    ``TRACE=slot is not None``; the kernel never touches the fallback."""
    if _active is None:
        return None
    programs = math.prod(int(v) for v in grid)
    return None if programs == 0 else _active.slot(name, programs)
