"""A plan's kernels rendered for a target, each by its family."""
from __future__ import annotations

from ..plan.family import family
from ..plan.planner import plan
from ..plan.specs import Rendered


def render(spec, schedule, target) -> Rendered:
    """A kernel spec's source for a target."""
    return family(spec).render(spec, schedule, target)


def render_all(schedule, target, keep: bool = False) -> list[Rendered]:
    """Every kernel of the schedule's plan for the target (a keep plan's where keep), rendered."""
    return [render(k, schedule, target) for k in plan(schedule, target, keep).kernels]
