"""Stack config: storage (`ml-cluster:storage`).

STUB by the lead; owned and completed by the storage work (issue 4).
"""

from __future__ import annotations

from infra.config.base import StrictModel


class StorageConfig(StrictModel):
    pass
