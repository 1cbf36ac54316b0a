"""The streaming dataflow machine's parameters, with documented defaults.

The defaults describe a SAM/FuseFlow-style machine: every primitive handles one token per cycle
(initiation interval 1), a channel delivers a token one cycle after it is sent, FIFOs between
primitives hold ``fifo_depth`` tokens, and memory is ``channels`` channels of
``bytes_per_cycle_per_channel`` bytes with ``latency_cycles`` of access latency. A token that
crosses memory (a coordinate, a segment bound or a value read by a scanner or an array, or
written by a level writer) is one ``word_bytes`` word.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusekit.errors import expected


@dataclass(frozen=True, slots=True)
class MemoryModel:
    """Off-chip memory: parallel channels with a bandwidth and an access latency.

    Attributes:
        channels: independent channels (HBM pseudo-channels).
        bytes_per_cycle_per_channel: bandwidth of one channel.
        latency_cycles: cycles from a request to its data.
    """

    channels: int = 2
    bytes_per_cycle_per_channel: float = 16.0
    latency_cycles: int = 100

    def __post_init__(self) -> None:
        for name in ("channels", "bytes_per_cycle_per_channel"):
            if getattr(self, name) <= 0:
                raise ValueError(expected("MemoryModel", name, "positive", getattr(self, name)))
        if self.latency_cycles < 0:
            raise ValueError(expected("MemoryModel", "latency_cycles", ">= 0", self.latency_cycles))

    @property
    def bytes_per_cycle(self) -> float:
        """Total bandwidth."""
        return self.channels * self.bytes_per_cycle_per_channel


@dataclass(frozen=True, slots=True)
class Machine:
    """A streaming sparse dataflow machine.

    Attributes:
        fifo_depth: tokens a channel's FIFO holds (the per-cycle reference engine stalls a
            primitive whose output FIFO is full).
        channel_latency_cycles: cycles for a token to cross a channel.
        word_bytes: bytes of one coordinate, reference or value in memory.
        memory: the memory model, or ``None`` for an ideal memory (no bandwidth or latency cost).
    """

    fifo_depth: int = 4096
    channel_latency_cycles: int = 1
    word_bytes: int = 4
    memory: MemoryModel | None = MemoryModel()

    def __post_init__(self) -> None:
        if self.fifo_depth < 1:
            raise ValueError(expected("Machine", "fifo_depth", ">= 1", self.fifo_depth))
        if self.channel_latency_cycles < 1:
            raise ValueError(
                expected("Machine", "channel_latency_cycles", ">= 1", self.channel_latency_cycles)
            )
