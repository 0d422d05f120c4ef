# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host plan's own decisions, as pure functions: the ready mark, and the order of the changes. No I/O.

The resources' changes come from their managers; these functions decide what a whole host adds to them and in
which order they run, so that the invariants hold by construction: waits come first (a wait that times out has
changed nothing), the ready mark is withdrawn before anything goes down and written last, only when every listed
resource is up. Tested as tables in ``tests/unit/plugins/module_utils/test_host_decide.py``.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

T = t.TypeVar('T')


@dataclass(frozen=True)
class ReadyDecision:
    """``withdraw``: why the mark goes first (None: it stays); ``mark``: whether it is (re)written last."""

    withdraw: t.Optional[str]
    mark: bool


def decide_ready(*, absent: bool, listed: t.Sequence[str], down: t.Sequence[str], enabled: bool, exists: bool) -> ReadyDecision:
    """The ready mark of a run: ``listed`` resources, the ``down`` ones (restarted, started, or removed) among them.

    An empty list is not ready; a teardown withdraws it; a run that brings any resource down withdraws it before the
    first change and writes it again as its last, after every listed daemon answered. ``enabled``: ready=true.
    """
    if not enabled:
        return ReadyDecision(withdraw=None, mark=False)
    why = None
    if absent:
        why = 'state=absent'
    elif not listed:
        why = 'no resource is listed'
    elif down:
        why = 'down during this run: %s' % ', '.join(sorted(set(down)))
    withdraw = why if exists else None
    return ReadyDecision(withdraw, not absent and bool(listed) and (withdraw is not None or not exists))


def order_steps(body: t.Sequence[T], head: t.Sequence[T], tail: t.Sequence[T], is_wait: t.Callable[[T], bool]) -> t.List[T]:
    """The run's steps in the order that always works: the body's waits, the head (the ready mark withdrawn, the
    health timer stopped), the rest of the body in its own order (removals, stops, then starts), the tail (the files
    around the daemons, the ready mark last)."""
    waits = [step for step in body if is_wait(step)]
    rest = [step for step in body if not is_wait(step)]
    return waits + list(head) + rest + list(tail)


def pending_warning(pending: t.Sequence[t.Tuple[str, t.Sequence[t.Mapping[str, t.Any]]]]) -> t.List[str]:
    """One warning for every resource whose running servers keep their old limits: ``pending`` is (name, its servers that
    keep them) for each resource not restarting (a restarting one has none left)."""
    pending = [(name, servers) for name, servers in pending if servers]
    if not pending:
        return []
    return ['running MPS servers keep the limits they started with, and so do the clients they get from now on - %s; '
            'running_servers=update sets their limits too' % '; '.join(
                '%s: %d server(s) (pid %s)' % (name, len(servers), ', '.join(str(server['pid']) for server in servers))
                for name, servers in pending)]
