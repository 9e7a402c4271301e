"""Plan a stack offline: the real program under the Pulumi SDK mock engine, data sources from fixtures.

    python scripts/plan.py --stack NAME [--config FILE] [--json] [--manifests DIR] [--diff OLD.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.plan_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
