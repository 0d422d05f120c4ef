# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The static SM partitions of a resource planned with its other limits (:func:`plan_partitions`).

What a run read (the start record says whether the daemon runs with -S; ``lspart`` in the same control batch as the
rest) is decided by :func:`.partitions.decide_partitions`; refusals come before anything changes: a binary without
static partitioning (its help text, asked once, only when partitions are wanted and no static daemon answered), a
partition no longer wanted that has clients (MPS refuses to remove it too, and no job is ended for it), and more
chunks than a GPU has.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .._errors import InvalidParameterError, MpsError
from .._protocol.commands import SM_PARTITION
from .decide import LimitsDecision
from .model import Limits
from .partitions import DeviceChunks, decide_partitions, parse_lspart
from .priority import offers


@dataclass(frozen=True)
class PartitionsPlan:
    """What the partitions add to a resource's decision, and the partitions its daemon listed (None: none read)."""

    seen: t.Optional[t.Dict[str, DeviceChunks]] = None
    before: t.Dict[str, t.Any] = field(default_factory=dict)  # {'sm_partitions': ...} where managed
    after: t.Dict[str, t.Any] = field(default_factory=dict)
    restart_reasons: t.List[str] = field(default_factory=list)
    commands: t.List[str] = field(default_factory=list)

    def add_to(self, decision: LimitsDecision) -> None:
        """The partition commands, the restart they need and their before/after, after the decision's own."""
        decision.after.update(self.after)
        decision.before.update(self.before)
        decision.restart_reasons.extend(self.restart_reasons)
        decision.commands.extend(self.commands)


def plan_partitions(view: t.Any, name: str, wanted: Limits, persisted: t.Optional[Limits], uuids: t.Sequence[str],
                    readout: t.Any, *, running: bool, static: bool, exact: bool, prober: t.Any) -> PartitionsPlan:
    """The partitions of the resource ``name`` planned: ``readout`` is its running daemon's control batch (None: it is not
    running), ``static`` whether that daemon runs with -S, ``exact`` mps_host's exact mode, ``prober`` the daemon whose
    binary's help says whether it has static partitioning."""
    had = persisted.sm_partitions if persisted is not None else ()
    seen = None
    if running and static:
        seen = parse_lspart(readout.lspart_text or '', uuids)
        if seen is None:
            raise MpsError('the MPS control daemon of %s was started with -S and answered %r to lspart, which is not a '
                           'partition table' % (name, readout.lspart_text))
    by_hand = bool(seen and any(device.partitions for device in seen.values()))
    if not (wanted.sm_partitions or had or (exact and by_hand)):
        return PartitionsPlan(seen)  # not managed: none wanted or persisted (partitions made by hand are left to mps_host's exact mode)
    _check_partitions_offered(view, name, prober, wanted, seen)
    after = {'sm_partitions': {uuid: list(wanted.sm_partitions) for uuid in uuids}}
    if seen is not None:
        before = {'sm_partitions': {uuid: sorted((p.chunks or 0 for p in seen[uuid].partitions), reverse=True) for uuid in uuids}}
    elif running:
        before = {'sm_partitions': {uuid: [] for uuid in uuids}}  # a daemon without -S has none
    else:
        before = {'sm_partitions': {uuid: list(had) for uuid in uuids}}
    if not running:
        return PartitionsPlan(seen, before, after)
    if not wanted.sm_partitions:
        if seen is not None:
            # Nothing is removed from a daemon that leaves static partitioning anyway: its restart (under the busy policy)
            # ends them with it.
            return PartitionsPlan(seen, before, after, ['no SM partitions are wanted and %s runs with static partitioning '
                                                        '(-S), which only a restart ends' % name])
        return PartitionsPlan(seen, before, after)
    if seen is None:
        return PartitionsPlan(seen, before, after, ['static SM partitions need a daemon started with -S, and %s was started '
                                                    'without it: the mode is fixed at the start' % name])
    partitions = decide_partitions(wanted.sm_partitions, seen, uuids)
    if partitions.busy:
        raise MpsError('sm_partitions: %s of %s %s clients, so it cannot be removed (MPS refuses it, and no job is ended '
                       'for it); nothing was changed - keep a partition of that size listed until its clients end' % (
                           ', '.join('%s (%s chunks)' % (part.value, part.chunks) for part in partitions.busy),
                           name, 'has' if len(partitions.busy) == 1 else 'have'))
    if partitions.too_big:
        raise InvalidParameterError('sm_partitions', 'more chunks than the GPU has: %s' % '; '.join(partitions.too_big))
    return PartitionsPlan(seen, before, after, [], list(partitions.commands))


def _check_partitions_offered(view: t.Any, name: str, prober: t.Any, wanted: Limits,
                              seen: t.Optional[t.Dict[str, DeviceChunks]]) -> None:
    """Partitions wanted from a binary without static partitioning are refused before anything changes."""
    if not wanted.sm_partitions or seen is not None:
        return  # none wanted, or a static daemon answered lspart
    offered, binary = offers(view, prober, SM_PARTITION)
    if offered is False:
        raise InvalidParameterError('sm_partitions', 'the control binary of %s has no static SM partitioning (the help text '
                                    'of %s lists no %s): it needs the control binary of CUDA 13.1 (13010) or later, or '
                                    'leave sm_partitions unset' % (name, binary, SM_PARTITION))
