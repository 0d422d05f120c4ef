# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one run observes of each resource, once, before it decides anything.

A host plan asks the same questions of a resource from several places - its limits, its daemon, the stop half of a
restart, the result - and each used to read the host again: a no-op of two resources inspected the daemons a dozen
times. :func:`observe` reads each resource once, under the host lock; the plan's parts take their answers from it,
and only a run that changed something observes again for its result.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from .._resource.layout import ResourcePaths
from .._resource.record import StartRecord, read_record
from .._supervisor.liveness import DaemonState, inspect


@dataclass(frozen=True)
class ResourceSeen:
    """One resource as the run found it: its daemon's state (pipe directory, lock, pid file, socket) and start record."""

    state: DaemonState
    record: t.Optional[StartRecord]


def observe(paths: t.Iterable[ResourcePaths]) -> t.Dict[str, ResourceSeen]:
    """Each resource of ``paths``, read once: name -> what was found."""
    return {item.name: ResourceSeen(inspect(item), read_record(item)) for item in paths}
