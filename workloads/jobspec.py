"""TrainingJobSpec -> Kubernetes manifests. STUB by the lead; owned and completed by the Jobs work (issue 5)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class TrainingJobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
