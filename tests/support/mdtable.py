"""Markdown tables as tests compare them: tabulate pads cells to the column width; `squash` rewrites every
table line with single spaces around the pipes, so an expected row reads `| a | b |`."""

from __future__ import annotations


def squash(md: str) -> str:
    out = []
    for line in md.splitlines():
        if line.startswith("|") and line.rstrip().endswith("|"):
            cells = [c.strip() for c in line.strip()[1:-1].split(" | ")]
            line = "| " + " | ".join(cells) + " |"
        out.append(line)
    return "\n".join(out) + ("\n" if md.endswith("\n") else "")
