"""What asks a real AWS account: the read-only preflight checks (preflight.py) and a new stack file from the
account's facts (newstack.py)."""
