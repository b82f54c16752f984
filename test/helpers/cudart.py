"""A stand-in for CUDA's runtime as torch exposes it (``torch.cuda.cudart()``), for the tests of
page-locked batch slots: there is no GPU on the machines the suite runs on (test/bench/gpu_check.sh
runs the real thing)."""

from __future__ import annotations


class FakeCudart:
    """A stand-in for ``torch.cuda.cudart()`` (no GPU here): records the calls, in order, and
    refuses registrations after the ``refuse_after``-th (CUDA's ``cudaErrorHostMemoryAlreadyRegistered``
    or an out-of-memory would do the same)."""

    def __init__(self, refuse_after: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.refuse_after = refuse_after

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 (CUDA's name)
        self.calls.append(("register", ptr, size, flags))
        registered = sum(1 for c in self.calls if c[0] == "register")
        return 2 if self.refuse_after is not None and registered > self.refuse_after else 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        self.calls.append(("unregister", ptr))
        return 0


class FakeEvent:
    """A stand-in for a recorded ``torch.cuda.Event``: the device is past it once ``done``."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


class FakeEvents:
    """Makes :class:`FakeEvent` s (``PageLocks(event=...)``) and keeps them, in order."""

    def __init__(self) -> None:
        self.made: list[FakeEvent] = []

    def __call__(self) -> FakeEvent:
        self.made.append(FakeEvent())
        return self.made[-1]


class TimedEvent:
    """A stand-in for a recorded ``torch.cuda.Event(enable_timing=True)``, recorded at ``at``
    milliseconds on the device's clock."""

    def __init__(self, at: float) -> None:
        self.at = at

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: TimedEvent) -> float:
        return other.at - self.at


class TimedEvents:
    """Makes :class:`TimedEvent` s, each recorded at the next of ``times`` (milliseconds)."""

    def __init__(self, times: list[float]) -> None:
        self.times = iter(times)

    def __call__(self) -> TimedEvent:
        return TimedEvent(next(self.times))
