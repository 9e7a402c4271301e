"""Document boundaries of packed token sequences, and the attention masks they give.

`pack-tokens --doc-offsets` stores, beside each fixed-length sequence ("tokens"), the offsets inside it where a
segment of one document begins ("doc_offsets", uint32, variable length): always 0 (the sequence's first token, which
may continue a document begun in an earlier sequence), then each position where a new document starts. A batch of
such a dataset gives the offsets as a list of N arrays; `document_ids` and `block_diagonal_mask` turn them into
what a model needs to keep attention inside a document:

    for batch in data.batches(epoch):
        tokens = batch["tokens"]                                     # (N, L)
        mask = block_diagonal_mask(batch["doc_offsets"], tokens.shape[1])   # (N, L, L) bool, True: may attend
        causal = mask & torch.ones(L, L, dtype=torch.bool).tril()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

DOC_OFFSETS_FIELD = "doc_offsets"


def sequence_offsets(document_ends: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The segment starts inside the stream's sequence [start, stop), relative to start: 0, then every document
    boundary strictly inside it (`document_ends`: cumulative end of each document in the stream, increasing)."""
    first = int(np.searchsorted(document_ends, start, side="right"))
    last = int(np.searchsorted(document_ends, stop, side="left"))
    inside = np.unique(document_ends[first:last]) - start  # empty documents end where the one before did
    return np.concatenate([[0], inside]).astype(np.uint32)


def document_ids(offsets: Sequence[Any], length: int) -> torch.Tensor:
    """int64 (N, L): the segment number of each position of each sequence (0 for the first segment)."""
    ids = torch.zeros((len(offsets), length), dtype=torch.int64)
    for row, starts in enumerate(offsets):
        marks = torch.zeros(length + 1, dtype=torch.int64)
        cuts = torch.as_tensor(np.asarray(starts, dtype=np.int64))
        cuts = cuts[(cuts > 0) & (cuts < length)]
        marks[cuts] = 1
        ids[row] = torch.cumsum(marks[:length], dim=0)
    return ids


def block_diagonal_mask(offsets: Sequence[Any], length: int) -> torch.Tensor:
    """bool (N, L, L): True where query position i and key position j lie in the same document segment."""
    ids = document_ids(offsets, length)
    return ids.unsqueeze(2) == ids.unsqueeze(1)
