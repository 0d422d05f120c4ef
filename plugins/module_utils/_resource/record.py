# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The start record, ``<root>/<name>/.started``: what the running daemon was started with.

Idempotence compares the wanted daemon with it, never guesses from processes. One typed home for it
and its defaults: a record written by an older version, or edited by hand, reads the same everywhere.
"""

from __future__ import annotations

import json
import typing as t
from dataclasses import asdict, dataclass, field

from .._io import atomic_write
from .layout import ResourcePaths

# A record without the key was written before compute modes were recorded: the default was set then.
DEFAULT_COMPUTE_MODE = 'exclusive_process'


def _optional_str(value: t.Any) -> t.Optional[str]:
    return value if isinstance(value, str) else None


@dataclass
class StartRecord:
    """The record of one daemon start; devices by UUID in the daemon's ordinal order."""

    devices: t.List[str] = field(default_factory=list)
    multiuser: bool = False
    supervisor: t.Optional[str] = None
    shm: bool = False
    pid: t.Optional[int] = None
    started_at: t.Optional[str] = None
    compute_mode: str = DEFAULT_COMPUTE_MODE
    control_binary: t.Optional[str] = None
    # The driver NVML reported when the daemon was started (None: a record of an older version, or unknown). After a
    # driver upgrade the daemon and its servers run the old driver's user-space: a run restarts it (busy decides).
    driver_version: t.Optional[str] = None
    # Started with -S (static SM partitions, fixed for the daemon's life); only written when true.
    static_partitioning: bool = False
    # MPS v3 (started with -p 3 -a <file>): the protocol, the resource's server and its owner; only written for v3.
    protocol: int = 2
    server: t.Optional[str] = None
    uid: t.Optional[int] = None

    @classmethod
    def from_data(cls, data: t.Any) -> t.Optional['StartRecord']:
        """The record in ``data`` (parsed JSON); None when it is not a record at all."""
        if not isinstance(data, dict):
            return None
        devices = data.get('devices')
        pid = data.get('pid')
        uid = data.get('uid')
        return cls(
            devices=[str(uuid) for uuid in devices] if isinstance(devices, list) else [],
            multiuser=bool(data.get('multiuser', False)),
            supervisor=_optional_str(data.get('supervisor')),
            shm=bool(data.get('shm', False)),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            started_at=_optional_str(data.get('started_at')),
            compute_mode=_optional_str(data.get('compute_mode')) or DEFAULT_COMPUTE_MODE,
            control_binary=_optional_str(data.get('control_binary')),
            driver_version=_optional_str(data.get('driver_version')),
            static_partitioning=data.get('static_partitioning') is True,
            protocol=3 if data.get('protocol') == 3 else 2,
            server=_optional_str(data.get('server')),
            uid=uid if isinstance(uid, int) and not isinstance(uid, bool) else None,
        )

    def to_json(self) -> str:
        data = asdict(self)
        if not self.static_partitioning:
            del data['static_partitioning']  # the records of daemons without it stay as they were
        if self.protocol != 3:
            for key in ('protocol', 'server', 'uid'):
                del data[key]
        return json.dumps(data, indent=2, sort_keys=True) + '\n'

    def daemon_view(self) -> t.Dict[str, t.Any]:
        """What the daemon was started with, as the diff and the restart decision compare it."""
        view = {'devices': list(self.devices), 'multiuser': self.multiuser, 'supervisor': self.supervisor, 'shm': self.shm}
        if self.protocol == 3:
            view.update(protocol=3, server=self.server, uid=self.uid)
        return view


def write_record(paths: ResourcePaths, record: StartRecord) -> None:
    atomic_write(paths.started_file, record.to_json(), 0o644)
