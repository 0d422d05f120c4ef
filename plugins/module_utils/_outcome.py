# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decide, then execute: the typed changes a decision found to do, each with its reason, and their side effects.

A decision plans every change into an :class:`Outcome` from the run's view of the host, check mode or not: the plan is
the same, so ``changed``, ``actions``, ``changes`` and ``diff`` are the same. Check mode stops there; otherwise the
one executor (:func:`._execute.execute`) runs exactly the planned side effects in the planned order, records each change
only after its side effect has returned, and on a failure puts back what can be put back.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

Step = t.Callable[[], None]

# A change's kind, by the first word of its action where the caller names none.
KINDS = {
    'apply': 'limits', 'chmod': 'mode', 'disable': 'unit', 'enable': 'unit', 'label': 'selinux', 'mount': 'mount',
    'remount': 'mount', 'remove': 'remove', 'restart': 'restart', 'set': 'compute_mode', 'start': 'start',
    'stop': 'stop', 'systemctl': 'reload', 'unmount': 'mount', 'wait': 'wait', 'write': 'write',
}


def _noop() -> None:
    return None


@dataclass
class Change:
    """One change of the host: what (``kind``, ``action``), to which resource, why, and whether it ends clients."""

    kind: str
    action: str
    reason: str = ''
    resource: str = ''
    ends_clients: bool = False
    # Puts back what the side effect changed, where that can be done (a compute mode, a file's previous content).
    undo: t.Optional[Step] = field(default=None, repr=False, compare=False)

    @property
    def text(self) -> str:
        """As ``actions`` lists it."""
        return '%s: %s' % (self.action, self.reason) if self.reason else self.action

    def as_dict(self) -> t.Dict[str, t.Any]:
        return {'kind': self.kind, 'resource': self.resource, 'action': self.action, 'reason': self.reason,
                'ends_clients': self.ends_clients}


@dataclass
class Outcome:
    """The planned (then applied) change of one module run."""

    changed: bool = False
    actions: t.List[str] = field(default_factory=list)
    warnings: t.List[str] = field(default_factory=list)
    before: t.Dict[str, t.Any] = field(default_factory=dict)
    after: t.Dict[str, t.Any] = field(default_factory=dict)
    changes: t.List[Change] = field(default_factory=list)
    # The side effects in order; one that completes a change names it (bookkeeping steps name none).
    steps: t.List[t.Tuple[t.Optional[Change], Step]] = field(default_factory=list, repr=False, compare=False)
    # The changes the executor ran, each recorded after its side effect returned (check mode: none).
    executed: t.List[Change] = field(default_factory=list)

    def act(self, action: str, run: t.Optional[Step] = None, reason: t.Optional[str] = None, kind: t.Optional[str] = None,
            *, ends_clients: bool = False) -> Change:
        """Plan one change a user would want to know about; ``run`` makes it happen when applied."""
        change = Change(kind or KINDS.get(action.split(' ', 1)[0].rstrip(':'), 'other'), action, reason or '', ends_clients=ends_clients)
        self.changed = True
        self.actions.append(change.text)
        self.changes.append(change)
        self.steps.append((change, run or _noop))
        return change

    def step(self, run: Step) -> None:
        """Plan a side effect that is part of a change already listed (bookkeeping, a directory it needs)."""
        self.steps.append((None, run))

    def diff(self) -> t.Dict[str, t.Any]:
        return {'before': self.before, 'after': self.after}
