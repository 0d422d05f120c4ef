# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one daemon reports, as mps_info's facts: its servers, and where its limits differ from the persisted ones."""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .._limits.model import Limits, percentage_matches, readback_matches
from .._limits.partitions import parse_lspart
from .._protocol.commands import PRIORITY_NAMES
from .._protocol.framing import Reply
from .._protocol.readback import parse_readback
from .._protocol.state import parse_state


# --- what one daemon is asked: one read of its state, as facts -----------------------------------
@dataclass
class Readout:
    """What one daemon reported, as facts: servers with their uid and limits by GPU UUID."""

    default_percentage: float
    default_mem: t.List[t.Optional[str]]
    servers: t.List[t.Dict[str, t.Any]] = field(default_factory=list)
    # 0 normal, 1 below normal; None where the binary has no client priority
    default_priority: t.Optional[int] = None
    # A -S daemon's SM partitions by device UUID (_limits.partitions.parse_lspart); None: not asked, or no table
    partitions: t.Optional[t.Dict[str, t.Any]] = None


def parse_daemon_replies(replies: t.Sequence[Reply], ordinals: int, candidates: t.Sequence[int],
                         uuids: t.Sequence[str], uid_of: t.Callable[[int], t.Optional[int]], partitions: bool = False) -> Readout:
    """Turn the replies to :func:`state_commands` into facts; only listed servers are reported."""
    state = parse_state(replies, ordinals, candidates, partitions)
    servers = [{
        'pid': server.pid,
        'status': server.status,
        'uid': uid_of(server.pid),
        'clients': server.clients,
        'limits': {
            'active_thread_percentage': server.active_thread_percentage,
            'pinned_device_mem_limit': dict(zip(uuids, server.pinned_device_mem_limit)),
        },
    } for server in state.servers]
    return Readout(state.default_percentage, state.default_mem, servers, state.default_priority,
                   parse_lspart(state.lspart_text, uuids) if state.lspart_text is not None else None)


# --- limits -------------------------------------------------------------------------------------
def limit_differences(persisted: t.Optional[Limits], percentage: t.Optional[float],
                      mem: t.Mapping[str, t.Optional[str]], uuids: t.Sequence[str], priority: t.Optional[int] = None) -> t.List[str]:
    """Where the daemon's defaults disagree with the persisted limits, read-back loss allowed for.

    Only what is persisted is compared: an unmanaged (None) limit never differs.
    """
    if persisted is None:
        return []
    found = []
    wanted_pct = persisted.active_thread_percentage
    if wanted_pct is not None and not percentage_matches(percentage, wanted_pct):
        found.append('active thread percentage %s persisted, %s reported' % (wanted_pct, percentage))
    if persisted.client_priority is not None and priority != persisted.client_priority:
        found.append('client priority %s persisted, %s reported' % (
            PRIORITY_NAMES[persisted.client_priority], 'none' if priority is None else PRIORITY_NAMES.get(priority, priority)))
    for ordinal, uuid in enumerate(uuids):
        wanted_mib = persisted.mem_for(uuid)
        if wanted_mib is None:
            continue
        text = mem.get(uuid)
        if not readback_matches(parse_readback(text) if text else None, wanted_mib):
            found.append('pinned memory limit of device %d (%s) %dM persisted, %s reported' % (
                ordinal, uuid, wanted_mib, text or 'none'))
    return found


def partition_differences(persisted: t.Optional[Limits], seen: t.Optional[t.Mapping[str, t.Any]],
                          uuids: t.Sequence[str]) -> t.List[str]:
    """Where a -S daemon's SM partitions (chunk counts per GPU) disagree with the persisted ones."""
    wanted = sorted(persisted.sm_partitions if persisted is not None else ())
    if seen is None:
        return ['the daemon was started with -S and did not answer lspart with a partition table'] if wanted else []
    found = []
    for uuid in uuids:
        chunks = sorted(part.chunks or 0 for part in seen[uuid].partitions) if uuid in seen else []
        if persisted is not None and chunks != wanted:
            found.append('SM partitions of %s: %s chunks persisted, %s reported' % (uuid, wanted, chunks))
    return found
