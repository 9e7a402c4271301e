#!/usr/bin/env bash
# The lent GPU machine's one run (scripts/gpu_evidence.py says what each step measures):
#   bash scripts/gpu_evidence.sh           run from the repository root there; everything lands in $OUT
# The packages the image lacks (pydantic, boto3 and their needs) travel as wheels in .whl/ (carry: [".whl"]),
# installed into /tmp/site first. GPU_EVIDENCE_DRY=1 runs the tiny CPU rehearsal (here too).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-evidence-out}"
mkdir -p "$OUT"
PY="${GPU_EVIDENCE_PYTHON:-python3}"
WHEELS="${GPU_EVIDENCE_WHEELS:-.whl}"  # another folder of wheels: the rehearsal here (another Python's wheels)
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE="${GPU_EVIDENCE_SITE:-/tmp/site}"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    || { echo "[gpu-evidence] wheels: install failed" | tee -a "$OUT/run.log"; exit 3; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OUT
# the whole run is bounded: each step has its own deadline inside, and this one is the backstop
timeout -k 10 "${GPU_EVIDENCE_TIMEOUT_S:-390}" "$PY" scripts/gpu_evidence.py --out "$OUT" 2>&1 | tee -a "$OUT/run.log"
code=${PIPESTATUS[0]}
[ -f "$OUT/summary.json" ] && "$PY" -c "
import json, sys
s = json.load(open(sys.argv[1]))
for name, step in s['steps'].items():
    print(f'{name:<13} {str(step.get(\"status\"))[:100]}')
print(f'elapsed {s.get(\"elapsed_s\")} s')" "$OUT/summary.json"
exit "$code"
