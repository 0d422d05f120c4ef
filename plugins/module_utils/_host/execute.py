# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Execute a host's plan: exactly its changes, in order, each recorded only after its side effect returned.

On a failure the walk stops. A start that failed has its resource's compute modes and persisted limits put back
as they were before this run (what can be undone is, in reverse order); the error keeps its own message and says
what was done, what was undone and what was not done.
"""

from __future__ import annotations

import typing as t

from .._errors import MpsError
from .._outcome import Change

UNDONE_ON = ('start', 'restart')


def execute(out: t.Any, listed: t.Sequence[t.Any], ready_path: str) -> None:
    """Walk ``out.steps``; ``out.executed`` receives each change once it is done."""
    steps, out.steps = out.steps, []
    for index, (change, run) in enumerate(steps):
        try:
            run()
        except MpsError as exc:
            not_done = [item for item, _run in steps[index:] if item is not None]
            failed = change or (not_done[0] if not_done else None)
            undone = _undo(out.executed, failed)
            raise MpsError('%s [%s]' % (exc.msg, _account(out.executed, undone, not_done)), **dict(
                exc.details, executed=[item.as_dict() for item in out.executed], undone=[item.as_dict() for item in undone],
                not_done=[item.as_dict() for item in not_done])) from exc
        if change is not None:
            out.executed.append(change)


def _undo(executed: t.List[Change], failed: t.Optional[Change]) -> t.List[Change]:
    """Put back what this run changed for the resource whose start failed; the changes undone, in undo order."""
    if failed is None or failed.kind not in UNDONE_ON:
        return []
    undone = []
    for change in reversed(executed):
        if change.resource == failed.resource and change.undo is not None:
            try:
                change.undo()
            except MpsError:
                continue  # the error reported is the start's; what could not be put back stays listed as done
            undone.append(change)
    return undone


def _account(executed: t.Sequence[Change], undone: t.Sequence[Change], not_done: t.Sequence[Change]) -> str:
    def names(changes: t.Sequence[Change]) -> str:
        return '; '.join('%s: %s' % (change.resource, change.action) for change in changes) or 'nothing'
    return 'this run did %d change(s) before the failure: %s; undone: %s; not done: %s' % (
        len(executed), names(executed), names(undone), names(not_done))
