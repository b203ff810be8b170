#!/usr/bin/env bash
# One command for the whole benchmark: bench/run.sh [--quick] [--only W1,W3] [...]
# Creates bench/.venv (the benchmark's own environment: perdure editable from this
# repository plus DBOS Transact and the tools pinned in requirements.txt) if it is
# missing or stale, then runs bench/run.py with the arguments given.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
stamp="$venv/.requirements.sha"
want="$(cat "$here/requirements.txt" "$here/../pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    -r "$here/requirements.txt" -e "$here/..[postgres]"
  echo "$want" > "$stamp"
fi
exec "$venv/bin/python" "$here/run.py" "$@"
