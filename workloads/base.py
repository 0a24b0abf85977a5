"""The workload interface the runner drives: items, their scoring, and the dataset's identity."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from workloads.errors import WorkloadError
from workloads.hashing import rows_sha256
from workloads.scoring import Score, Scorer

__all__ = ["Item", "Score", "Scorer", "Workload", "WorkloadError"]


@dataclass(frozen=True)
class Item:
    """One request's worth of input.

    `seed_offset` is the item's numeric id: a seeded request uses `base seed + seed_offset`
    (for AIME the problem_idx). `prompt` is plain text for the native /generate route and
    `messages` the same content as chat messages for the chat route.
    """

    item_id: str
    seed_offset: int
    prompt: str
    messages: list[dict[str, str]]
    answer: str | None = None
    category: str | None = None


@dataclass
class Workload:
    """A materialised workload: the selected items plus what identifies the data they came from.

    `sha256` hashes the canonical serialisation of every row the source held (before category
    filter, placeholder skipping and subsample); `items_sha256` hashes what is actually sent.
    """

    name: str
    dataset_id: str
    revision: str | None
    sha256: str
    items: list[Item]
    skipped_placeholders: int = 0
    scorer: Scorer = field(default_factory=Scorer)
    origin: str = ""  # where the rows were read from: "hub", "file:<path>", "generated"

    def score(self, item: Item, output_text: str) -> Score:
        """Score one response against the item's reference answer (see `workloads.scoring`)."""
        return self.scorer.score(output_text, item.answer)

    @property
    def items_sha256(self) -> str:
        """SHA256 of the selected items (ids, seed offsets, prompts, messages, answers, categories),
        in the same canonical serialisation as the dataset hash."""
        return rows_sha256(asdict(i) for i in self.items)
