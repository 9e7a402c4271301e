"""Document boundaries of packed token sequences: stored per sequence, read in a batch, turned into a mask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from workloads.data.api import PackedData, Placement
from workloads.data.format.documents import block_diagonal_mask, document_ids, sequence_offsets
from workloads.data.writing.records_pack import RecordPackOptions
from workloads.data.writing.tokens import pack_tokens


def test_offsets_of_a_sequence() -> None:
    ends = np.array([5, 5, 12, 20])  # documents of 5, 0, 7 and 8 tokens
    assert sequence_offsets(ends, 0, 8).tolist() == [0, 5]
    assert sequence_offsets(ends, 5, 13).tolist() == [0, 7]  # starts on a boundary: 0 is the new document
    assert sequence_offsets(ends, 12, 20).tolist() == [0]
    assert sequence_offsets(ends, 6, 10).tolist() == [0]


def test_mask_is_block_diagonal() -> None:
    ids = document_ids([np.array([0, 2], dtype=np.uint32), np.array([0], dtype=np.uint32)], 4)
    assert ids.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]
    mask = block_diagonal_mask([np.array([0, 2])], 4)[0]
    assert mask.tolist() == [[True, True, False, False], [True, True, False, False],
                             [False, False, True, True], [False, False, True, True]]


def test_packed_sequences_carry_their_document_starts(tmp_path: Path) -> None:
    source = tmp_path / "docs"
    source.mkdir()
    lengths = [7, 3, 11, 1, 9, 6]
    documents, next_id = [], 1
    for number, length in enumerate(lengths):
        ids = np.arange(next_id, next_id + length, dtype=np.uint16)
        next_id += length
        documents.append(ids)
        np.save(source / f"{number:02d}.npy", ids)
    out = tmp_path / "tokens"
    pack_tokens(source, out, RecordPackOptions(shard_bytes=1 << 20, progress=False, shuffle_seed=3), seq_len=8,
                eos=0, doc_offsets=True)
    with PackedData.open(out, batch_size=64, placement=Placement(), shuffle=False) as data:
        batch = next(iter(data.batches(0)))
    assert set(batch) == {"tokens", "doc_offsets"}
    tokens = batch["tokens"]
    for row, offsets in zip(tokens, batch["doc_offsets"], strict=True):
        # A document starts right after each eos (0) inside the sequence, and nowhere else.
        after_eos = [i + 1 for i, t in enumerate(row.tolist()[:-1]) if t == 0]
        assert offsets.tolist() == [0, *after_eos]
    mask = block_diagonal_mask(batch["doc_offsets"], tokens.shape[1])
    assert mask.shape == (len(tokens), 8, 8) and bool(mask[:, 0, 0].all())
    assert torch.equal(mask, mask.transpose(1, 2))
