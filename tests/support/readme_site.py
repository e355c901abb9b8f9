"""The README's "Add it to your site" blocks, applied to a ``django-admin startproject
mysite`` site as a reader would: each ``<!-- site: PATH MODE -->`` block is written to PATH
(``write``) or added at its end (``append``). Used by the packaging test and by
``bench/site_throughput.py``, so both run the site the README describes."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.procs import ROOT

SNIPPET = re.compile(
    r"<!-- site: (?P<path>\S+) (?P<mode>append|write) -->\s*```python\n(?P<body>.*?)```", re.S
)
BLOCKS = [
    ("mysite/settings.py", "append"),
    ("mysite/celery.py", "write"),
    ("mysite/__init__.py", "append"),
    ("mysite/urls.py", "write"),
    ("mysite/urls.py", "append"),  # the inbound webhook
    ("myapp/agents.py", "write"),  # "An agent"
]


def snippets() -> list[re.Match[str]]:
    text = (ROOT / "README.md").read_text()
    found = list(SNIPPET.finditer(text))
    assert [(m["path"], m["mode"]) for m in found] == BLOCKS, (
        "README.md lost one of its 'Add it to your site' blocks"
    )
    return found


def apply_readme(site: Path, *, skip: tuple[str, ...] = ()) -> None:
    """Apply the README's blocks to the ``startproject mysite .`` site in ``site`` (but
    the ones writing a path in ``skip``: a benchmark's agents of its own)."""
    for snippet in snippets():
        if snippet["path"] in skip:
            continue
        target = site / snippet["path"]
        if snippet["mode"] == "write":
            target.write_text(snippet["body"])
        else:
            target.write_text(target.read_text() + "\n" + snippet["body"])
