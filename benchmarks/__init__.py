"""Test and benchmark machinery (network emulation, peer contenders): used by scripts/ and tests/, never shipped."""
