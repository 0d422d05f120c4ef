# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one executor of every module: exactly the planned changes, in order, each recorded only after its side effect
returned.

On a failure the walk stops. What this run changed for the resource of the change that failed is put back where it can
be, in reverse order (a compute mode, a file's previous content, a directory or mount this run made); the error keeps
its own message and says what was done, what was undone and what was not done. Check mode never gets here: it returns
the plan.
"""

from __future__ import annotations

import typing as t

from ._errors import MpsError
from ._outcome import Change


def execute(out: t.Any) -> None:
    """Walk ``out.steps``; ``out.executed`` receives each change once it is done."""
    steps, out.steps = out.steps, []
    for index, (change, run) in enumerate(steps):
        try:
            run()
        except MpsError as exc:
            not_done = [item for item, _run in steps[index:] if item is not None]
            failed = change or (not_done[0] if not_done else None)
            undone = _undo(out.executed, failed)
            # The same kind of error (InvalidParameterError keeps its param), its message completed with the account; made
            # without its constructor, whose arguments differ from class to class.
            error = exc.__class__.__new__(exc.__class__)
            error.__dict__.update(exc.__dict__)
            error.msg = '%s [%s]' % (exc.msg, _account(out.executed, undone, not_done))
            error.args = (error.msg,)
            error.details = dict(exc.details, executed=[item.as_dict() for item in out.executed],
                                 undone=[item.as_dict() for item in undone], not_done=[item.as_dict() for item in not_done])
            raise error from exc
        if change is not None:
            out.executed.append(change)


def _undo(executed: t.List[Change], failed: t.Optional[Change]) -> t.List[Change]:
    """Put back what this run changed for the resource whose change failed; the changes undone, in undo order."""
    if failed is None:
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
