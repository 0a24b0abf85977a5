"""The audit's verdict in one line, as the terminal prints it (`python -m analysis.report`, `make bench`): passed,
passed with its warnings each in a few words, or FAILED with the checks that failed. report.md holds the details."""

from __future__ import annotations

import re

from analysis.audit import Audit
from analysis.check import WARN, Check
from analysis.code import CHECK_NAME as CODE_CHECK
from analysis.seals import NAME as SEALS_CHECK

# a few words per check that can warn (the check's own name for any other)
SHORT = {
    "Runs taken on a quiet machine": "foreign load",
    CODE_CHECK: "dirty checkout",
    "Seeds honoured by the server": "seeds ignored by the server",
    "Commands and environments differ only as declared": "commands vary between runs",
    "Correct-drafts histograms add up": "histograms do not add up",
    "hit_cap agrees with finish_reason and max_new_tokens": "hit_cap recomputed",
    "Checked metadata match (GPU, model, dataset SHA256, harness version)": "metadata differ (--allow-mismatch)",
    "Answers scored (scores.jsonl)": "answers not scored",
    "Chunk timings consistent (chunk_us, chunk_tokens)": "chunk timings inconsistent",
}


COUNTED = ("Runs taken on a quiet machine", CODE_CHECK, SEALS_CHECK)  # their summaries count the runs concerned


def warning_words(check: Check) -> str:
    """A warned check in a few words, with how many runs it concerns where its summary says ("6 of 6 runs")."""
    if check.name == SEALS_CHECK:
        words = "edited records (--allow-edited)" if "--allow-edited" in check.summary else "unsealed records"
    elif check.name == CODE_CHECK and "already running" in check.summary:
        words = "code unknown (servers not launched by the campaign)"
    else:
        words = SHORT.get(check.name, check.name)
    count = re.search(r"\d+ of \d+ runs|\d+ run\(s\)", check.summary) if check.name in COUNTED else None
    return f"{words} ({count.group(0)})" if count else words


def verdict(audit: Audit) -> str:
    """`passed (N checks)`, `passed with K warning(s): ...`, or `FAILED: ...` (the failed checks by name)."""
    if not audit.passed:
        return "FAILED: " + "; ".join(c.name for c in audit.failed)
    warned = [c for c in audit.checks if c.status == WARN]
    if not warned:
        return f"passed ({len(audit.checks)} checks)"
    noun = "warning" if len(warned) == 1 else "warnings"
    return f"passed with {len(warned)} {noun}: " + "; ".join(warning_words(c) for c in warned)
