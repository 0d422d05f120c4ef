# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Of :class:`.manager.LimitsManager`: the static SM partitions of a resource planned with its other limits.

What a run read (the start record says whether the daemon runs with -S; ``lspart`` in the same control batch as the
rest) is decided by :func:`.partitions.decide_partitions`; refusals come before anything changes: a binary without
static partitioning (its help text, asked once, only when partitions are wanted and no static daemon answered), a
partition no longer wanted that has clients (MPS refuses to remove it too, and no job is ended for it), and more
chunks than a GPU has.
"""

from __future__ import annotations

import typing as t

from .._errors import InvalidParameterError, MpsError
from .._protocol.commands import SM_PARTITION
from .decide import LimitsDecision
from .model import Limits
from .partitions import DeviceChunks, decide_partitions, parse_lspart


class PartitionPlan:
    """Needs the manager's ``paths``, ``exact``, ``record``, ``state``, ``view`` and the priority mixin's ``_offers``."""

    paths: t.Any
    exact: bool
    record: t.Any

    _offers: t.Callable[[str], t.Tuple[t.Optional[bool], str]]

    state: t.Any
    view: t.Any

    @property
    def static_running(self) -> bool:
        """The daemon was started with -S: its start record says so - or, without one (``/run`` is empty after a boot, and
        systemd started it again with -S from the limits environment file), its arguments. Its partitions are then read
        with its limits. A host plan keeps what its observe stage read of the arguments."""
        if self.record is not None:
            return self.record.static_partitioning
        state = self.state
        if state is None or not state.running or not state.pid:
            return False
        return bool(self.view.answered(self.view.static_args, state.pid, 'the arguments of pid %s' % state.pid))

    def _plan_partitions(self, wanted: Limits, persisted: t.Optional[Limits], uuids: t.Sequence[str], running: bool,
                         readout: t.Any, decision: LimitsDecision) -> t.Optional[t.Dict[str, DeviceChunks]]:
        """Add the partition commands (and the before/after of the diff) to ``decision``; the partitions read, if any."""
        had = persisted.sm_partitions if persisted is not None else ()
        seen = None
        if running and self.static_running:
            seen = parse_lspart(readout.lspart_text or '', uuids)
            if seen is None:
                raise MpsError('the MPS control daemon of %s was started with -S and answered %r to lspart, which is not a '
                               'partition table' % (self.paths.name, readout.lspart_text))
        by_hand = bool(seen and any(device.partitions for device in seen.values()))
        if not (wanted.sm_partitions or had or (self.exact and by_hand)):
            return seen  # not managed: none wanted or persisted (partitions made by hand are left to mps_host's exact mode)
        self._check_partitions_offered(wanted, seen)
        decision.after['sm_partitions'] = {uuid: list(wanted.sm_partitions) for uuid in uuids}
        if seen is not None:
            decision.before['sm_partitions'] = {uuid: sorted((p.chunks or 0 for p in seen[uuid].partitions), reverse=True)
                                                for uuid in uuids}
        elif running:
            decision.before['sm_partitions'] = {uuid: [] for uuid in uuids}  # a daemon without -S has none
        else:
            decision.before['sm_partitions'] = {uuid: list(had) for uuid in uuids}
        if not running:
            return seen
        if not wanted.sm_partitions:
            if seen is not None:
                # Nothing is removed from a daemon that leaves static partitioning anyway: its restart (under the busy policy)
                # ends them with it.
                decision.restart_reasons.append('no SM partitions are wanted and %s runs with static partitioning (-S), which '
                                                'only a restart ends' % self.paths.name)
            return seen
        if seen is None:
            decision.restart_reasons.append('static SM partitions need a daemon started with -S, and %s was started '
                                            'without it: the mode is fixed at the start' % self.paths.name)
            return seen
        partitions = decide_partitions(wanted.sm_partitions, seen, uuids)
        if partitions.busy:
            raise MpsError('sm_partitions: %s of %s %s clients, so it cannot be removed (MPS refuses it, and no job is ended '
                           'for it); nothing was changed - keep a partition of that size listed until its clients end' % (
                               ', '.join('%s (%s chunks)' % (part.value, part.chunks) for part in partitions.busy),
                               self.paths.name, 'has' if len(partitions.busy) == 1 else 'have'))
        if partitions.too_big:
            raise InvalidParameterError('sm_partitions', 'more chunks than the GPU has: %s' % '; '.join(partitions.too_big))
        decision.commands += partitions.commands
        return seen

    def _check_partitions_offered(self, wanted: Limits, seen: t.Optional[t.Dict[str, DeviceChunks]]) -> None:
        """Partitions wanted from a binary without static partitioning are refused before anything changes."""
        if not wanted.sm_partitions or seen is not None:
            return  # none wanted, or a static daemon answered lspart
        offered, binary = self._offers(SM_PARTITION)
        if offered is False:
            raise InvalidParameterError('sm_partitions', 'the control binary of %s has no static SM partitioning (the help text '
                                        'of %s lists no %s): it needs the control binary of CUDA 13.1 (13010) or later, or '
                                        'leave sm_partitions unset' % (self.paths.name, binary, SM_PARTITION))
