"""The split rule: when a head's split of a query's weight among referents is flagged.

A small torch-free value of its own, so that :mod:`inspector.analysis.question` (whose :class:`Question` carries
the rule) and :mod:`inspector.analysis.split` (which applies it) both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inspector.store.specs import check_thresholds

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SplitRule:
    """Flag a head when it gives at least 10% to each of two referents (split_score >= 0.2), at
    least a quarter of its weight to the referents together (referent_mass >= 0.25), and at least
    twice what uniform attention over the visible keys would give them (lift >= 2).

    All three must hold. min_split and min_mass alone pass a uniform head whenever the referents
    cover a quarter of the text (4 of 14 tokens, say); lift is 1 for a uniform head at every length,
    so min_lift 2 asks the head to favour the referents clearly over chance. A head with 45% on each of
    two one-token referents among n visible keys has lift 0.9 n / 2, flagged from n = 5 on. Referents
    covering more than half the visible keys can never reach lift 2: such a query cannot be told
    apart from chance by weights alone."""

    min_split: float = 0.2
    min_mass: float = 0.25
    min_lift: float = 2.0

    def __post_init__(self) -> None:
        check_thresholds(min_split=self.min_split, min_mass=self.min_mass, min_lift=self.min_lift)

    def describe(self) -> str:
        """The rule in words, printed from the thresholds :meth:`passes` applies (the CLI, the report and
        the app's Corpus page all print this): ``split_score >= 0.2, referent_mass >= 0.25 and lift >= 2
        (referent_mass ÷ chance_mass, what uniform attention over the visible keys gives the referents)``."""
        return (f"split_score >= {self.min_split:g}, referent_mass >= {self.min_mass:g} and lift >= {self.min_lift:g} "
                "(referent_mass ÷ chance_mass, what uniform attention over the visible keys gives the referents)")

    def passes(self, split_score: float, referent_mass: float, lift: float) -> bool:
        """Whether one row passes the rule: ``split_score >= min_split``, ``referent_mass >= min_mass`` and
        ``lift >= min_lift`` (all dimensionless; lift is referent_mass ÷ chance_mass)."""
        return bool(split_score >= self.min_split and referent_mass >= self.min_mass and lift >= self.min_lift)

    def passes_all(self, split_score: torch.Tensor, referent_mass: torch.Tensor, lift: torch.Tensor) -> torch.Tensor:
        """:meth:`passes` elementwise over tensors of one shape (NaN fails, as there)."""
        return (split_score >= self.min_split) & (referent_mass >= self.min_mass) & (lift >= self.min_lift)
