"""How long a sharded checkpoint takes to save on a stop signal, from the per-rank share and the tiers' rates.

Every rank writes its share (the state over the ranks) to its node's local tier; each node then copies its ranks'
shares to the remote tier, in parallel with the other nodes. The grace period must cover both."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.1f} GiB"


@dataclass(frozen=True)
class SaveShares:
    size: int  # the whole state, bytes
    nodes: int
    ranks_per_node: int
    local_rate: int  # bytes/s of one node's local tier
    remote_rate: int  # bytes/s of one node's copy to the remote tier
    mirrored: bool  # a remote tier is configured

    @property
    def per_rank(self) -> int:
        return -(-self.size // (self.nodes * self.ranks_per_node))

    @property
    def per_node(self) -> int:
        return self.per_rank * self.ranks_per_node

    @property
    def seconds(self) -> float:
        return self.per_node / self.local_rate + (self.per_node / self.remote_rate if self.mirrored else 0.0)

    def reason(self) -> str:
        """The numbers behind `seconds`, for an error line."""
        text = (f"{_gib(self.per_rank)} per rank x {self.ranks_per_node} ranks per node = {_gib(self.per_node)} at "
                f"{_gib(self.local_rate)}/s local ({self.per_node / self.local_rate:.0f} s)")
        if self.mirrored:
            text += (f" then at {_gib(self.remote_rate)}/s to the remote tier "
                     f"({self.per_node / self.remote_rate:.0f} s)")
        return text


def file_system_share(bytes_per_second: int, writers: int) -> int:
    """What each of `writers` clients writing at once gets of a file system's baseline throughput (bytes/s): an
    even share, the model for FSx for Lustre, whose throughput is the file system's, not the client's."""
    return bytes_per_second // max(1, writers)
