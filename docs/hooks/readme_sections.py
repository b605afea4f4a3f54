"""An mkdocs hook: pages take their guides from README.md's sections, so the prose lives once.

A page line `<!-- readme: HEADING -->` is replaced by the body of README.md's section whose
heading is HEADING (without its `#`s): the text from below that heading to the next heading of
any level, outside code blocks. Links into `docs/` (the screenshots) are made relative to the
documentation folder. A heading that README.md no longer has stops the build.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["on_page_markdown", "readme_sections"]

_INCLUDE = re.compile(r"^<!-- readme: (?P<heading>.+?) -->$", re.MULTILINE)
_HEADING = re.compile(r"^#{1,6} (?P<title>.+)$")


def readme_sections(text: str) -> dict[str, str]:
    """Map each heading of the markdown `text` to its body (up to the next heading)."""
    sections: dict[str, list[str]] = {}
    body: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match:
            body = sections.setdefault(match["title"].strip(), [])
        elif body is not None:
            body.append(line)
    return {title: "\n".join(lines).strip("\n") + "\n" for title, lines in sections.items()}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each `<!-- readme: HEADING -->` line of a page with that README.md section."""
    root = os.path.dirname(os.path.abspath(config["config_file_path"]))
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        sections = readme_sections(f.read())
    depth = page.file.src_uri.count("/")

    def include(match: re.Match[str]) -> str:
        heading = match["heading"]
        if heading not in sections:
            raise ValueError(
                f"{page.file.src_uri}: README.md has no section {heading!r}; "
                f"its sections: {', '.join(sections)}"
            )
        return sections[heading].replace("](docs/", "](" + "../" * depth)

    return _INCLUDE.sub(include, markdown)
