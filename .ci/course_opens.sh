#!/usr/bin/env bash
# The README's course opener, as a newcomer runs it, checked without a person at the screen:
#   refbraid lessons build --small && jupyter lab lesson_notebooks/
# Usage: .ci/course_opens.sh OUTDIR [EXECUTED_NOTEBOOKS_DIR]
# Builds lesson 00 with `refbraid lessons build --small` (the command itself); the other
# lessons come from EXECUTED_NOTEBOOKS_DIR when given (CI's notebook tests executed each one
# already), else they are built too. Then starts JupyterLab on the folder (no browser, local
# port, no token), asks its server for every notebook and for the Lab page, and stops it.
set -euo pipefail
out=$1
executed=${2:-}
mkdir -p "$out"
if [ -n "$executed" ]; then
    refbraid lessons build --small --out "$out" 00
    cp -n "$executed"/*.ipynb "$out"/
else
    refbraid lessons build --small --out "$out"
fi

port=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
log=$out/jupyter.log
root_flag=; [ "$(id -u)" = 0 ] && root_flag=--allow-root  # CI runs as root; a newcomer does not
jupyter lab "$out" $root_flag --no-browser --ip=127.0.0.1 --port="$port" --ServerApp.token= \
    --ServerApp.password= --ServerApp.disable_check_xsrf=True >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT

python - "$port" "$out" <<'EOF'
import json
import sys
import time
import urllib.request
from pathlib import Path

port, folder = sys.argv[1], Path(sys.argv[2])
base = f"http://127.0.0.1:{port}"
lessons = sorted(p.name for p in Path("lessons").glob("[0-9][0-9]_*.py"))
deadline = time.monotonic() + 120
while True:
    try:
        listing = json.load(urllib.request.urlopen(f"{base}/api/contents/", timeout=5))
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"JupyterLab did not answer on port {port} within 120 s; see {folder}/jupyter.log")
        time.sleep(1)
served = sorted(item["name"] for item in listing["content"] if item["type"] == "notebook")
wanted = [name[:-3] + ".ipynb" for name in lessons]
missing = sorted(set(wanted) - set(served))
if missing:
    sys.exit(f"JupyterLab serves {len(served)} notebooks; missing: {missing}")
for name in wanted:
    nb = json.load(urllib.request.urlopen(f"{base}/api/contents/{name}", timeout=30))
    cells = nb["content"]["cells"]
    outputs = sum(len(c.get("outputs", [])) for c in cells if c["cell_type"] == "code")
    if not cells or not outputs:
        sys.exit(f"{name}: {len(cells)} cells, {outputs} outputs: not an executed lesson")
page = urllib.request.urlopen(f"{base}/lab", timeout=30)
if page.status != 200 or b"JupyterLab" not in page.read():
    sys.exit(f"/lab answered {page.status} without the JupyterLab page")
print(f"course opens: JupyterLab serves all {len(wanted)} lessons, executed, and its Lab page")
EOF
