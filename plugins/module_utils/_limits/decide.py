# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The limits of one resource decided: (wanted, what was observed) -> the commands a running daemon gets. No I/O.

:class:`LimitsSeen` is what one run read - the persisted limits, and for a running daemon its defaults and its
servers' own limits as it reported them (one UI process) - and :func:`decide_limits` is a pure function of it,
tested as tables (``tests/unit/plugins/module_utils/test_limits_decide.py``): values are compared as the daemon reports
them (``10240M`` set reads back ``10G``: no change), a limit persisted with another value is sent again even when the
lossy read-back happens to match, and a pinned limit no longer wanted is a restart (MPS cannot remove one).
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .._protocol.commands import PRIORITY_NAMES, set_default_mem, set_default_percentage, set_default_priority, set_server_mem, set_server_percentage
from .._protocol.readback import parse_readback, readback_readable
from .model import Limits, format_percentage, percentage_matches, readback_matches


@dataclass(frozen=True)
class ServerLimits:
    """One running MPS server's own limits, as the daemon reported them (memory by the daemon's device ordinal)."""

    pid: int
    active_thread_percentage: t.Optional[float]
    pinned_device_mem_limit: t.Mapping[int, t.Optional[str]]

    def as_dict(self) -> t.Dict[str, t.Any]:
        return {'pid': self.pid, 'active_thread_percentage': self.active_thread_percentage,
                'pinned_device_mem_limit': {str(k): v for k, v in self.pinned_device_mem_limit.items()}}


@dataclass(frozen=True)
class LimitsSeen:
    """What a run observed of one resource's limits; ``percentage``, ``mem`` and ``servers`` only of a running daemon."""

    persisted: t.Optional[Limits] = None
    running: bool = False
    percentage: t.Optional[float] = None
    mem: t.Mapping[int, t.Optional[str]] = field(default_factory=dict)
    servers: t.Sequence[ServerLimits] = ()
    # get_default_client_priority: 0, 1, or None (the binary has no client priority: priority_text is its answer)
    priority: t.Optional[int] = None
    priority_text: str = ''


@dataclass
class LimitsDecision:
    """The decided commands, in the order they are sent, and what the diff and the result say of them."""

    commands: t.List[str] = field(default_factory=list)
    pending: t.List[ServerLimits] = field(default_factory=list)
    restart_reasons: t.List[str] = field(default_factory=list)
    warnings: t.List[str] = field(default_factory=list)
    before: t.Dict[str, t.Any] = field(default_factory=dict)
    after: t.Dict[str, t.Any] = field(default_factory=dict)


def decide_limits(wanted: Limits, uuids: t.Sequence[str], seen: LimitsSeen, *, exact: bool, running_servers: str,
                  name: str) -> LimitsDecision:
    """The commands that bring the daemon of ``name`` (on ``uuids``, in its ordinal order) to ``wanted``.

    ``exact``: ``wanted`` is the whole truth (mps_host) - a limit it leaves out is reset (100% threads) or, for a
    pinned memory limit, needs a restart; otherwise (mps_limits) what is not given is not managed.
    ``running_servers``: ``update`` sends running servers their own limits, ``ignore`` lists them as pending.
    """
    out = LimitsDecision()
    out.after = {'active_thread_percentage': wanted.active_thread_percentage,
                 'pinned_device_mem_limit': {str(o): _mib_text(wanted.mem_for(uuid)) for o, uuid in enumerate(uuids)}}
    persisted = seen.persisted
    priority_managed = (wanted.client_priority is not None or (persisted is not None and persisted.client_priority is not None)
                        or (exact and seen.running and seen.priority == 1))
    if priority_managed:
        out.after['client_priority'] = _priority_name(wanted.client_priority if wanted.client_priority is not None
                                                      else 0 if exact else None)
    if not seen.running:
        out.before = {'active_thread_percentage': persisted.active_thread_percentage if persisted else None,
                      'pinned_device_mem_limit': {str(o): _mib_text(persisted.mem_for(uuid)) if persisted else None
                                                  for o, uuid in enumerate(uuids)}}
        if priority_managed:
            out.before['client_priority'] = _priority_name(persisted.client_priority if persisted else None)
        return out
    out.before = {'active_thread_percentage': seen.percentage,
                  'pinned_device_mem_limit': {str(o): seen.mem.get(o) or None for o in range(len(uuids))}}  # '': unset
    if priority_managed:
        out.before['client_priority'] = _priority_name(seen.priority)
    # Compared as the daemon reports them: 10240M set reads back 10G, and is no change.
    target = 100.0 if wanted.active_thread_percentage is None and exact else wanted.active_thread_percentage
    if seen.percentage is not None and target is not None and percentage_matches(seen.percentage, target):
        out.after['active_thread_percentage'] = seen.percentage
    for ordinal, uuid in enumerate(uuids):
        mib = wanted.mem_for(uuid)
        if mib is not None and readback_matches(parse_readback(seen.mem.get(ordinal) or ''), mib):
            out.after['pinned_device_mem_limit'][str(ordinal)] = seen.mem[ordinal]
    out.commands = _default_commands(wanted, uuids, seen, exact=exact, name=name, out=out)
    priority = _priority_command(wanted, seen, exact=exact)
    if priority:
        out.commands.append(priority)
        if seen.servers:
            # MPS has no command for a running server's priority: it keeps the one it started with
            out.warnings.append('%d running MPS server(s) of %s keep the client priority they started with; the new default '
                                '(%s) applies to servers started from now on' % (
                                    len(seen.servers), name, _priority_name(wanted.client_priority or 0)))
    updates, out.pending = _server_commands(wanted, uuids, seen.servers, running_servers)
    out.commands += updates
    return out


def _priority_command(wanted: Limits, seen: LimitsSeen, *, exact: bool) -> t.Optional[str]:
    """``set_default_client_priority`` when the daemon's default differs from the one wanted (exact: normal unless given)."""
    target = wanted.client_priority
    persisted = seen.persisted.client_priority if seen.persisted else None
    if target is None:
        # not given: exact mode takes the daemon back to normal (as a percentage not given is 100); else not managed
        if not exact or seen.priority in (None, 0):
            return None
        target = 0
    if seen.priority == target and (persisted is None or persisted == target):
        return None
    return set_default_priority(target)


def _priority_name(value: t.Optional[int]) -> t.Optional[str]:
    return None if value is None else PRIORITY_NAMES.get(value, str(value))


def _default_commands(wanted: Limits, uuids: t.Sequence[str], seen: LimitsSeen, *, exact: bool, name: str,
                      out: LimitsDecision) -> t.List[str]:
    persisted = seen.persisted
    cmds = []
    for ordinal, uuid in enumerate(uuids):
        mib = wanted.mem_for(uuid)
        had = persisted.mem_for(uuid) if persisted else None
        if mib is None:
            if exact and had is not None:
                # MPS has a command to set a default pinned memory limit and none to remove one.
                out.restart_reasons.append('the pinned memory limit %dM of device %d (%s) is no longer wanted and MPS can '
                                           'only drop it with a restart' % (had, ordinal, uuid))
            continue
        reported = seen.mem.get(ordinal)
        if not readback_readable(reported):
            out.warnings.append('the MPS control daemon of %s answered %r to get_default_device_pinned_mem_limit %d, which '
                                'is not a size: the limit is treated as unknown and set again' % (name, reported, ordinal))
        if (had is not None and had != mib) or not readback_matches(parse_readback(reported or ''), mib):
            cmds.append(set_default_mem(ordinal, mib))
    if wanted.active_thread_percentage is None and exact:
        if not percentage_matches(seen.percentage, 100.0):
            cmds.append(set_default_percentage(format_percentage(100.0)))
    elif wanted.active_thread_percentage is not None:
        was_pct = persisted.active_thread_percentage if persisted else None
        if (was_pct is not None and was_pct != wanted.active_thread_percentage) or not percentage_matches(
                seen.percentage, wanted.active_thread_percentage):
            cmds.append(set_default_percentage(format_percentage(wanted.active_thread_percentage)))
    return cmds


def _server_commands(wanted: Limits, uuids: t.Sequence[str], servers: t.Sequence[ServerLimits],
                     running_servers: str) -> t.Tuple[t.List[str], t.List[ServerLimits]]:
    cmds: t.List[str] = []
    pending = []
    for server in servers:
        server_cmds = []
        for ordinal, uuid in enumerate(uuids):
            mib = wanted.mem_for(uuid)
            if mib is not None and not readback_matches(parse_readback(server.pinned_device_mem_limit.get(ordinal) or ''), mib):
                server_cmds.append(set_server_mem(server.pid, ordinal, mib))
        if wanted.active_thread_percentage is not None and not percentage_matches(server.active_thread_percentage,
                                                                                  wanted.active_thread_percentage):
            server_cmds.append(set_server_percentage(server.pid, format_percentage(wanted.active_thread_percentage)))
        if not server_cmds:
            continue
        if running_servers == 'update':
            cmds.extend(server_cmds)
        else:
            pending.append(server)
    return cmds, pending


def _mib_text(mib: t.Optional[int]) -> t.Optional[str]:
    return None if mib is None else '%dM' % mib
