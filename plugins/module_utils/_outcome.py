# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan, then apply: what a manager found to do, each action with its reason, and its side effects.

A manager reads the state and plans every action into an :class:`Outcome`, check mode or not: the
plan is the same, so ``changed``, ``actions`` and ``diff`` are the same. Check mode stops there;
otherwise :meth:`Outcome.apply` runs the side effects in the planned order.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

Step = t.Callable[[], None]


@dataclass
class Outcome:
    """The planned (then applied) change of one module run."""

    changed: bool = False
    actions: t.List[str] = field(default_factory=list)
    warnings: t.List[str] = field(default_factory=list)
    before: t.Dict[str, t.Any] = field(default_factory=dict)
    after: t.Dict[str, t.Any] = field(default_factory=dict)
    steps: t.List[Step] = field(default_factory=list, repr=False, compare=False)

    def act(self, action: str, run: t.Optional[Step] = None, reason: t.Optional[str] = None) -> None:
        """Plan one action a user would want to know about; ``run`` makes it happen when applied."""
        self.changed = True
        self.actions.append('%s: %s' % (action, reason) if reason else action)
        if run is not None:
            self.steps.append(run)

    def step(self, run: Step) -> None:
        """Plan a side effect that is part of an action already listed (bookkeeping, a directory it needs)."""
        self.steps.append(run)

    def apply(self) -> None:
        """Run the planned side effects in order; the first that fails stops the rest (its error says why)."""
        steps, self.steps = self.steps, []
        for run in steps:
            run()

    def diff(self) -> t.Dict[str, t.Any]:
        return {'before': self.before, 'after': self.after}
