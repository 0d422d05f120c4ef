# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where what one daemon reports differs from the persisted limits, as mps_info's facts say it."""

from __future__ import annotations

import typing as t

from .._limits.model import Limits, percentage_matches, readback_matches
from .._protocol.commands import PRIORITY_NAMES
from .._protocol.readback import parse_readback


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
