"""The README is a door, not a manual: short, with a table of contents whose links work, links
to files that exist, and no internal work-item numbers anywhere in the product.

(The documentation site checks its own links: ``python -m sphinx -W`` fails on a broken one.)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300
#: Folders of the product that must not cite internal work items by number.
PRODUCT = ["README.md", "docs", "refbraid", "lessons", "tests", "benchmarks"]
WORK_ITEM = r"issue [0-9]+|issue #[0-9]+"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, '-' for ' '."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_short_and_opens_with_a_table_of_contents():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"
    assert any(line.strip("* ") == "Contents" for line in lines[:10]), "no table of contents"


def test_readme_links_point_at_files_and_headings_that_exist():
    text = README.read_text(encoding="utf-8")
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        if target.startswith("#"):
            if target[1:] not in anchors:
                broken.append(target)
        elif not (ROOT / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"README.md links to nothing: {broken}"


def test_no_internal_work_item_numbers_in_the_product():
    found = subprocess.run(["grep", "-rniE", WORK_ITEM, *PRODUCT, "--include=*.py",
                            "--include=*.md", "--exclude-dir=_build", "--exclude-dir=course",
                            "--exclude-dir=generated"],
                           cwd=ROOT, capture_output=True, text=True, check=False)
    if found.returncode == 2:
        pytest.fail(f"grep failed: {found.stderr}")
    hits = found.stdout.splitlines()
    assert not hits, "internal work-item numbers in the product:\n" + "\n".join(hits[:20])
