# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A v3 resource's one record - its server, owner, GPUs and namespaces with their limits - and what is derived from it:
the TOML file the daemon applies at start (``-a``), the server's pipe directory clients are given, the CLI flags that
change a namespace live. Pure: no I/O.

Everything here follows ``shared/mps-v3-reference.md`` (NVIDIA's v3 pages); the section each rule comes from is named
beside it. No r615 binary has run it [I].
"""

from __future__ import annotations

import os
import re
import typing as t
from dataclasses import dataclass

from .._errors import InvalidParameterError

# "lowercase letters, digits, and underscores only, up to 64 characters" [ref 1.2]
NAME_FORM = 'lowercase letters, digits and underscores only, at most 64 characters (the MPS v3 rule for names)'
_NAME = re.compile(r'[a-z0-9_]{1,64}\Z')
# The built-in namespace of every server: set through the server's own limits (``server set``) [ref 1.3, 1.8].
DEFAULT_NAMESPACE = 'default'
# A name the daemon gives itself: each connecting uid's automatic server [ref 1.3].
_AUTOMATIC = re.compile(r'uid_[0-9]+\Z')
NAMESPACE_KEYS = ('name', 'active_thread_percentage', 'pinned_device_mem_limit', 'client_priority')
# The flags of ``server set`` / ``namespace set`` and the keys of the TOML file, by limit [ref 1.3, 1.4, 1.8].
_FLAGS = (('active_thread_percentage', 'active-thread-percentage'), ('pinned_mib', 'pinned-memory-limit'),
          ('client_priority', 'client-priority'))


def check_name(value: t.Any, param: str, what: str) -> str:
    """A server or namespace name the binary takes, or a refusal naming ``param``."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidParameterError(param, '%s %r is not a name MPS v3 takes: %s' % (what, value, NAME_FORM))
    return value


def server_name_for(resource: str) -> str:
    """The server name a resource gets unless its entry gives one: its name lowercased, every other character an
    underscore (``nvidia.com/gpu`` -> ``nvidia_com_gpu``)."""
    return re.sub(r'[^a-z0-9_]', '_', resource.lower())


def mem_text(mib: int) -> str:
    """A size as the v3 CLI and TOML take it: ``4G``, ``512M`` (binary units) [ref 1.2]."""
    return '%dG' % (mib // 1024) if mib % 1024 == 0 else '%dM' % mib


def pct_text(value: float) -> str:
    return '%g' % value


@dataclass(frozen=True)
class NamespaceLimits:
    """The limits of one namespace: a ceiling of its own, neither inherited from the server nor capped by it; None: no
    limit (the whole GPU) [ref 1.9, DYN]."""

    active_thread_percentage: t.Optional[float] = None
    pinned_mib: t.Optional[int] = None
    client_priority: t.Optional[int] = None

    @property
    def empty(self) -> bool:
        return self.active_thread_percentage is None and self.pinned_mib is None and self.client_priority is None

    def values(self) -> t.List[t.Tuple[str, str]]:
        """(CLI flag, value) of each limit that is set, in a fixed order."""
        found = []
        for attr, flag in _FLAGS:
            value = getattr(self, attr)
            if value is None:
                continue
            found.append((flag, pct_text(value) if attr == 'active_thread_percentage' else mem_text(value) if attr == 'pinned_mib'
                          else str(value)))
        return found

    def flags(self) -> t.List[str]:
        return ['--%s=%s' % item for item in self.values()]

    def toml_lines(self) -> t.List[str]:
        # Every value a string, as the 615 schema documents them [ref 1.8].
        return ['%s = "%s"' % (flag.replace('-', '_'), value) for flag, value in self.values()]

    def describe(self) -> str:
        return ', '.join('%s=%s' % item for item in self.values()) or 'no limits (the whole GPU)'

    def as_dict(self) -> t.Dict[str, t.Any]:
        return {'active_thread_percentage': self.active_thread_percentage, 'pinned_device_mem_limit_mib': self.pinned_mib,
                'client_priority': self.client_priority}


@dataclass(frozen=True)
class V3Spec:
    """A v3 resource: its one named server, owned by ``uid`` (or root with ``multiuser``), on ``devices`` (NVML's UUIDs,
    in the resource's order), its ``default`` namespace's limits and its own namespaces."""

    server: str
    devices: t.Tuple[str, ...]
    uid: t.Optional[int]
    multiuser: bool
    default: NamespaceLimits
    namespaces: t.Tuple[t.Tuple[str, NamespaceLimits], ...] = ()

    @property
    def owner(self) -> int:
        """The server's owner: root under ``-m`` ("In multiuser mode, only --uid=0 is allowed" [ref 1.3])."""
        return 0 if self.multiuser else int(self.uid or 0)

    def namespace(self, name: str) -> NamespaceLimits:
        return self.default if name == DEFAULT_NAMESPACE else dict(self.namespaces)[name]

    def identity(self) -> t.Dict[str, t.Any]:
        """What only a new start changes (the start record keeps it): the server's name and owner."""
        return {'server': self.server, 'uid': self.owner}

    def toml(self) -> str:
        """The file ``-a`` applies once at start: the 615 keys only, with their documented types [ref 1.8]."""
        section = 'servers.%s' % self.server
        lines = ['# Written by gpufleet.mps from the resource\'s entry; a change here is overwritten by the next run.',
                 'schema_version = "1.0"', '', '[%s]' % section, 'allowed_devices = "%s"' % ','.join(self.devices),
                 'uid = %d' % self.owner]
        lines += self.default.toml_lines()
        for name, limits in self.namespaces:
            lines += ['', '[%s.namespaces.%s]' % (section, name)] + limits.toml_lines()
        return '\n'.join(lines) + '\n'

    def pipe_dir(self, pipe_dir: str, namespace: str = '') -> str:
        """Where clients of the server (or of one of its namespaces) point CUDA_MPS_PIPE_DIRECTORY: never ``<pipe>`` itself,
        whose main socket routes a client to an automatic ``uid_<uid>`` server outside the resource's limits [ref 1.9]."""
        return os.path.join(pipe_dir, self.server, namespace) if namespace else os.path.join(pipe_dir, self.server)

    def client_env(self, env: t.Mapping[str, str]) -> t.Dict[str, str]:
        """A resource's client environment (``env``, the legacy one) pointed at the server."""
        return dict(env, CUDA_MPS_PIPE_DIRECTORY=self.pipe_dir(env['CUDA_MPS_PIPE_DIRECTORY']))

    def container(self, view: t.Mapping[str, t.Any], host_pipe: str) -> t.Dict[str, t.Any]:
        """A resource's container view (_resource.layout.container_view) for the server: its directory mounted at the same
        place under the container's pipe directory, and per namespace the one directory a container held to it mounts
        (a client that can reach only its namespace's socket is held to that namespace [ref 1.9, DYN])."""
        inner = self.pipe_dir(view['pipe_dir'])
        mounts = [{'source': self.pipe_dir(host_pipe), 'target': inner}] + [m for m in view['mounts'] if m['source'] != host_pipe]
        others = [m for m in view['mounts'] if m['source'] != host_pipe]
        return dict(view, pipe_dir=inner, env=dict(view['env'], CUDA_MPS_PIPE_DIRECTORY=inner), mounts=mounts, namespaces={
            name: {'pipe_dir': self.pipe_dir(view['pipe_dir'], name),
                   'env': dict(view['env'], CUDA_MPS_PIPE_DIRECTORY=self.pipe_dir(view['pipe_dir'], name)),
                   'mounts': [{'source': self.pipe_dir(host_pipe, name), 'target': self.pipe_dir(view['pipe_dir'], name)}] + others}
            for name, _limits in self.namespaces})

    def as_dict(self, pipe_dir: str) -> t.Dict[str, t.Any]:
        return {'server': self.server, 'uid': self.owner, 'pipe_directory': self.pipe_dir(pipe_dir),
                'default': self.default.as_dict(),
                'namespaces': [dict(limits.as_dict(), name=name, pipe_directory=self.pipe_dir(pipe_dir, name))
                               for name, limits in self.namespaces]}


def namespace_entries(value: t.Any, param: str, parse: t.Callable[[t.Mapping[str, t.Any], str], NamespaceLimits],
                      defaults: NamespaceLimits) -> t.Tuple[t.Tuple[str, NamespaceLimits], ...]:
    """``namespaces`` of an entry: unique valid names, known keys; each namespace written with explicit limits - the
    resource's where it gives none (a namespace without limits would get the whole GPU [ref 1.9, DYN])."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidParameterError(param, 'must be a list of namespaces (mappings with a name)')
    found: t.List[t.Tuple[str, NamespaceLimits]] = []
    for number, item in enumerate(value):
        where = '%s[%d]' % (param, number)
        if not isinstance(item, dict) or 'name' not in item:
            raise InvalidParameterError(where, 'must be a mapping with a name')
        unknown = sorted(str(key) for key in item if key not in NAMESPACE_KEYS)
        if unknown:
            raise InvalidParameterError(where, 'unknown key(s) %s; the keys are %s' % (', '.join(unknown), ', '.join(NAMESPACE_KEYS)))
        name = check_name(item['name'], where + '.name', 'the namespace name')
        if name == DEFAULT_NAMESPACE:
            raise InvalidParameterError(where + '.name', '"default" is the server\'s own namespace: give its limits as the '
                                        'resource\'s (active_thread_percentage, pinned_device_mem_limit, client_priority)')
        if name in dict(found):
            raise InvalidParameterError(param, 'namespace names must be unique; %r is listed twice' % name)
        own = parse(item, '%s[%s]' % (param, name))
        found.append((name, NamespaceLimits(
            own.active_thread_percentage if own.active_thread_percentage is not None else defaults.active_thread_percentage,
            own.pinned_mib if own.pinned_mib is not None else defaults.pinned_mib,
            own.client_priority if own.client_priority is not None else defaults.client_priority)))
    return tuple(found)


def check_server_name(server: str, resource: str, param: str, taken: t.Mapping[str, str]) -> None:
    """Refuse a server name the daemon would make itself, or one another resource of the list has."""
    if _AUTOMATIC.match(server):
        raise InvalidParameterError(param, '%r is the name MPS v3 gives the automatic server of a uid (uid_<uid>): choose '
                                    'another' % server)
    if server in taken:
        raise InvalidParameterError(param, 'the server name %r of %s is %s\'s too%s: give one of them another "server"' % (
            server, resource, taken[server], '' if server != server_name_for(resource) else
            ' (both resource names map to it)'))
