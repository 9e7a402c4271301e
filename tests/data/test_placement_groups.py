"""Placement's data-parallel group: tensor/context-parallel peers read identical batches, the epoch is split over
data-parallel replicas only, and a device mesh gives the group."""

from __future__ import annotations

import pytest

from workloads.data.api import Placement, make_sampler

SHARDS = [13, 17, 11, 19]  # 60 samples


def _epoch(placement: Placement, batch_size: int = 3, epoch: int = 1) -> list[list[int]]:
    sampler = make_sampler(SHARDS, batch_size, placement, seed=4, shuffle_shards=2)
    sampler.set_epoch(epoch)
    return [list(map(int, batch)) for batch in sampler]


def test_tensor_parallel_peers_get_identical_batches_and_replicas_split_the_epoch() -> None:
    # 8 ranks on 2 nodes, tensor parallel 2 inside a node: replicas are rank // 2
    placements = [Placement(rank, 8, rank % 4, 4, dp_rank=rank // 2, dp_size=4) for rank in range(8)]
    batches = [_epoch(placement) for placement in placements]
    for replica in range(4):
        assert batches[2 * replica] == batches[2 * replica + 1]  # the peers of one replica
    seen = [sample for replica in range(4) for batch in batches[2 * replica] for sample in batch]
    assert sorted(seen) == list(range(sum(SHARDS)))  # every sample once over the replicas
    # the same order as 4 plain data-parallel ranks on 2 nodes: the group changes who reads, not what is read
    plain = [_epoch(Placement(rank, 4, rank % 2, 2)) for rank in range(4)]
    assert [batches[2 * replica] for replica in range(4)] == plain


def test_without_a_group_every_rank_is_a_replica() -> None:
    placement = Placement(3, 4, 1, 2)
    assert (placement.data_rank, placement.data_world_size, placement.data_local_world_size) == (3, 4, 2)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"dp_rank": 0}, "dp_rank, dp_size"),
    ({"dp_rank": 0, "dp_size": 3}, "dp_size"),
    ({"dp_rank": 2, "dp_size": 2}, "dp_rank"),
])
def test_a_bad_group_is_refused_naming_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        Placement(0, 4, 0, 4, **kwargs)


def test_a_device_mesh_gives_the_data_parallel_group() -> None:
    """A 2x2 ("dp", "tp") mesh as torch lays it out (rank = dp * 2 + tp), read through the mesh API the placement
    uses; the real mesh on 4 gloo ranks is exercised in tests/train/test_sharded_checkpoint.py."""

    class Group:
        def __init__(self, rank: int, size: int) -> None:
            self.rank, self.count = rank, size

        def get_local_rank(self) -> int:
            return self.rank

        def size(self) -> int:
            return self.count

    class Mesh:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def __getitem__(self, dim: str) -> Group:
            return Group(self.rank // 2, 2) if dim == "dp" else Group(self.rank % 2, 2)

    placements = [Placement(rank, 4, rank, 4).with_mesh(Mesh(rank)) for rank in range(4)]
    assert [(p.data_rank, p.data_world_size) for p in placements] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert _epoch(placements[0]) == _epoch(placements[1]) != _epoch(placements[2]) == _epoch(placements[3])
