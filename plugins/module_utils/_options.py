# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every option that more than one module takes, declared once: its type, default and choices.

The modules build their argument specs from here (:func:`spec`); their DOCUMENTATION must agree (ansible-test's
validate-modules compares each with its spec), and the fleet role's ``meta/argument_specs.yml`` must too (a unit test,
``tests/unit/plugins/module_utils/test_options.py``, holds every ``mps_<option>`` the role passes to ``mps_host``
against this table). Choices live here, and the code that acts on them imports them from here.
"""

from __future__ import annotations

import typing as t

from ._resource.layout import DEFAULT_CONFIG_DIR, DEFAULT_CONTAINER_ROOT, DEFAULT_LOG_MODE, DEFAULT_ROOT
from ._selinux import CONTAINER_TYPE

COMPUTE_MODE_CHOICES = ('exclusive_process', 'default', 'unchanged')
BUSY_CHOICES = ('refuse', 'wait', 'terminate')
DEFAULT_BUSY_TIMEOUT = 600
RUNNING_SERVERS_CHOICES = ('ignore', 'update')
SUPERVISOR_CHOICES = ('auto', 'systemd', 'none')

OPTIONS: t.Dict[str, t.Dict[str, t.Any]] = {
    'root': dict(type='path', default=DEFAULT_ROOT),
    'config_dir': dict(type='path', default=DEFAULT_CONFIG_DIR),
    'control_binary': dict(type='path'),
    'compute_mode': dict(type='str', choices=list(COMPUTE_MODE_CHOICES), default='exclusive_process'),
    'supervisor': dict(type='str', choices=list(SUPERVISOR_CHOICES), default='auto'),
    'start_timeout': dict(type='int', default=30),
    'stop_timeout': dict(type='int', default=30),
    'busy': dict(type='str', choices=list(BUSY_CHOICES), default='refuse'),
    'busy_timeout': dict(type='int', default=DEFAULT_BUSY_TIMEOUT),
    'running_servers': dict(type='str', choices=list(RUNNING_SERVERS_CHOICES), default='ignore'),
    'log_mode': dict(type='raw', default=format(DEFAULT_LOG_MODE, '04o')),
    'shm': dict(type='bool', default=False),
    'foreground': dict(type='bool', default=False),
    'unit_before': dict(type='list', elements='str', default=[]),
    'unit_after': dict(type='list', elements='str', default=[]),
    'container_root': dict(type='path', default=DEFAULT_CONTAINER_ROOT),
    'selinux_type': dict(type='str', default=CONTAINER_TYPE),
    'remove_logs': dict(type='bool', default=False),
    'devices': dict(type='raw', default='all'),
    'multiuser': dict(type='bool', default=False),
    # raw, parsed by _limits.model with its own messages: "50" from a template is 50, "4" replicas are 4, and "20 GB" is
    # refused naming the forms - the same in mps_limits and in mps_host's resources (and the role's preflight).
    'active_thread_percentage': dict(type='raw'),
    'pinned_device_mem_limit': dict(type='raw'),
    'replicas': dict(type='raw'),
    'oversubscribe': dict(type='bool', default=False),
    'client_priority': dict(type='str'),
    'sm_partitions': dict(type='list', elements='int'),
    # MPS v3 (protocol 3, r615+): an entry's protocol, its server's name and owner, its namespaces (_v3.spec)
    # an entry's own, or mps_host's for every entry that gives none; neither given: legacy
    'protocol': dict(type='str', choices=['legacy', '3']),
    'server': dict(type='str'),
    'uid': dict(type='int'),
    'namespaces': dict(type='list', elements='dict', options=dict(
        name=dict(type='str', required=True), active_thread_percentage=dict(type='raw'), pinned_device_mem_limit=dict(type='raw'),
        client_priority=dict(type='str'))),
}
# The keys of one entry of mps_host's resources (and of the fleet role's mps_resources): the entry's own name, then the
# options mps_daemon and mps_limits take for one resource, declared above.
RESOURCE_KEYS = ('name', 'devices', 'multiuser', 'replicas', 'active_thread_percentage', 'pinned_device_mem_limit', 'oversubscribe',
                 'client_priority', 'sm_partitions', 'protocol', 'server', 'uid', 'namespaces')
# How mps_host and the fleet role pass a daemon's options to every resource: the options mps_daemon and mps_host share.
DAEMON_OPTIONS = ('compute_mode', 'supervisor', 'start_timeout', 'stop_timeout', 'busy', 'busy_timeout', 'log_mode', 'shm',
                  'foreground', 'unit_before', 'unit_after', 'remove_logs', 'container_root', 'selinux_type')


def resource_spec() -> t.Dict[str, t.Dict[str, t.Any]]:
    """The argument spec of one entry of mps_host's ``resources``: its name, and the per-resource options above."""
    return spec(*RESOURCE_KEYS[1:], name=dict(type='str', required=True))


def resources_option() -> t.Dict[str, t.Any]:
    """mps_host's ``resources`` option: a list of entries of :func:`resource_spec` (its action plugin converts a list
    with it on the controller as the module does on the host)."""
    return dict(type='list', elements='dict', default=[], options=resource_spec())


def spec(*names: str, **own: t.Dict[str, t.Any]) -> t.Dict[str, t.Dict[str, t.Any]]:
    """An argument spec: the shared options ``names`` (copies), then the module's own ``own``."""
    result = {name: dict(OPTIONS[name], **({'choices': list(OPTIONS[name]['choices'])} if 'choices' in OPTIONS[name] else {}))
              for name in names}
    for name, value in own.items():
        if name in OPTIONS:
            raise ValueError('%s is a shared option: name it, do not declare it again' % name)
        result[name] = value
    return result
