#!/usr/bin/python
# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: mps_host
short_description: The whole MPS state of one host - every resource's daemon and limits, the shared tmpfs, the ready mark - in one run
version_added: 0.2.0
description:
  - Declarative - O(resources) is the whole list. A resource not listed is removed (O(prune)) - its daemon stopped and
    its unit disabled and removed, its record and persisted limits deleted (its logs kept), so a resource added back
    later starts clean. A listed resource without limits has none - the thread percentage back to 100, no pinned memory
    limit.
  - All or nothing. Every entry and option is checked against the host's GPUs before anything is read from a daemon or
    changed - an unknown key, a bad limit (V(20 GB), V(150)), a size larger than a GPU, a GPU in two resources, a GPU in
    MIG mode - and a bad one changes nothing, C(<root>/.ready) included. What needs no GPU facts (the entries' keys,
    names and values, O(unit_before) and O(unit_after)) is refused on the controller, by the module's action plugin,
    before the module is sent to the host.
  - Observe, decide, execute. Under a host-wide lock (one run at a time; another run waits, bounded, then plans from
    what the first one left), the run plans every change of the host into one ordered list, RV(changes) - the same list
    in check mode and in a real run, by construction - check mode returns it, a real run executes exactly it and reports
    each change only after its side effect returned. Refusals - a busy daemon that must stop under O(busy=refuse), a
    GPU that an MPS daemon of another root or tool serves - come before any change.
  - The order always works - waits for busy clients (O(busy=wait) - a wait that times out changes nothing); the ready mark
    C(<root>/.ready) withdrawn when the plan brings any resource down (or lists none); the shared tmpfs; removed
    resources; daemons that restart (their GPUs, C(multiuser), a pinned memory limit to drop - MPS has no command to
    unset one) stopped, a GPU that stays in use keeping its compute mode; then, per listed resource, its limits persisted
    and sent and its daemon started (the start replays the limits) - so GPUs move between resources, and resources are
    renamed or swap GPUs, in one run; the health timer, log rotation, local facts; and last the ready mark, written only
    when every listed daemon answers. A run killed at any point never leaves the mark over a down resource.
  - A change that fails stops the run; a failed start gives its GPUs their compute mode back and its persisted limits
    their previous content, and the error lists what was done, undone and not done.
  - Every listed daemon must answer after the run; the module fails naming one that does not, and removes the mark.
    Where systemd supervises the daemons it installs a health timer that keeps the mark current between runs, a
    logrotate drop-in where the host has O(logrotate_dir), and local facts for schedulers in O(local_facts_dir).
  - One NVML session, and on a run that changes nothing one control UI process per running daemon. M(gpufleet.mps.mps_daemon)
    and M(gpufleet.mps.mps_limits) are the per-resource building blocks on the same code.
  - A host without a usable NVIDIA GPU (no driver, or NVML reports none) is left alone with RV(managed=false) and a
    warning that says why, unless O(require_gpu). An interpreter without nvidia-ml-py always fails.
  - The collection's code is compiled once per host, not on every run - AnsiballZ sends it as source each time. The
    compiled code is kept in C(<root>/.bytecode/) (a directory of root, mode 0700; entries keyed by the SHA-256 of their
    source and the interpreter's magic number, each holding the hash of its code), written by a run that is neither in
    check mode nor O(state=absent) once the root exists, and removed by O(state=absent). A directory of another owner or
    mode, or a link, is not used (a warning says why); an altered or stale entry is compiled again from the source. It
    changes nothing of what the module does, and writing it is not a change (C(changed)). Only a run as root makes or
    reads it.
attributes:
  check_mode:
    description: Plans every resource, reports the actions and the diff, changes nothing.
    support: full
  diff_mode:
    description: Per resource, the daemon and its limits before and after.
    support: full
  idempotent:
    description: A second run with the same options changes nothing.
    support: full
extends_documentation_fragment:
  - gpufleet.mps._common
  - gpufleet.mps._common.root
  - gpufleet.mps._common.daemon
  - gpufleet.mps._common.container_root
  - gpufleet.mps._common.selinux
  - gpufleet.mps._common.running_servers
options:
  state:
    description:
      - V(present) brings the host to O(resources). V(absent) tears down everything of the collection under O(root) -
        every resource's daemon, unit, record and persisted limits (logs stay unless O(remove_logs)), the shared tmpfs,
        the health check, the logrotate drop-in, the local facts and the ready mark.
    type: str
    choices: [present, absent]
    default: present
  resources:
    description:
      - The host's resources, each a named group of GPUs with its own MPS control daemon. Unknown keys are refused.
      - Resource names must be unique and no GPU may be in two resources.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description:
          - One or two segments separated by C(/), each of letters, digits, C(.), C(_) and C(-), for example
            V(nvidia.com/gpu) or V(train). Its directories are C(<root>/<name>/pipe) and C(<root>/<name>/log).
        type: str
        required: true
      devices:
        description:
          - As O(gpufleet.mps.mps_daemon#module:devices) - the resource's GPUs, or its one MIG device.
          - V(all) takes every GPU of the host not in MIG mode; a warning names the GPUs in MIG mode it leaves out.
        type: raw
        default: all
      multiuser:
        description: As O(gpufleet.mps.mps_daemon#module:multiuser).
        type: bool
        default: false
      replicas:
        description:
          - As O(gpufleet.mps.mps_limits#module:replicas), or a mapping from GPU model as NVML names it (glob patterns
            allowed, matched in order) to a number, with a V(default) entry, so one list serves a mixed fleet.
          - A MIG device matches a key by its MIG profile (C(1g.10gb), C(3g.40gb), a glob) or its full NVML name.
        type: raw
      active_thread_percentage:
        description: As O(gpufleet.mps.mps_limits#module:active_thread_percentage). Not given - 100.
        type: raw
      pinned_device_mem_limit:
        description: As O(gpufleet.mps.mps_limits#module:pinned_device_mem_limit). Not given - none.
        type: raw
      oversubscribe:
        description: As O(gpufleet.mps.mps_limits#module:oversubscribe).
        type: bool
        default: false
        version_added: 0.2.0
      client_priority:
        description: As O(gpufleet.mps.mps_limits#module:client_priority). Not given - normal.
        type: str
        version_added: 0.2.0
      sm_partitions:
        description:
          - As O(gpufleet.mps.mps_limits#module:sm_partitions). Not given - none.
          - A partition of a listed size is kept, others are created and removed in place - one with clients is refused,
            before anything changes.
        type: list
        elements: int
        version_added: 0.2.0
      protocol:
        description:
          - As O(gpufleet.mps.mps_host#module:protocol), for this resource. Not given - O(protocol).
        type: str
        choices: [legacy, '3']
        version_added: 0.2.0
      server:
        description:
          - With O(resources[].protocol=3), the name of the resource's MPS v3 server - lowercase letters, digits and
            underscores, at most 64 characters, not C(uid_<n>), and not another resource's.
          - Not given - the resource name lowercased, every other character an underscore (C(nvidia.com/gpu) gives
            C(nvidia_com_gpu)).
        type: str
        version_added: 0.2.0
      uid:
        description:
          - With O(resources[].protocol=3), the user that owns the server; a v3 server without O(resources[].multiuser)
            serves only its owner. Required unless O(resources[].multiuser=true), which makes the server root's and lets
            any user attach.
        type: int
        version_added: 0.2.0
      namespaces:
        description:
          - With O(resources[].protocol=3), the server's namespaces - groups of its clients with limits of their own,
            each reached through its own socket directory, C(<pipe>/<server>/<name>) (C(v3) of RV(resources)).
          - A namespace's limits are its own - neither inherited from the server nor capped by it, and a namespace without
            limits would get the whole GPU - so each is written with the resource's limits where it gives none.
          - Changes go live without a restart (C(namespace create), C(namespace set), C(namespace delete)); a namespace
            with attached clients is changed only as O(busy) says (C(namespace set) fails while a client is attached). A
            namespace removed from the list is deleted. The rendered file always holds the current namespaces, so a
            restart brings the same ones back.
        type: list
        elements: dict
        version_added: 0.2.0
        suboptions:
          name:
            description: The namespace's name, by the v3 rule (as O(resources[].server)); not C(default), the server's own.
            type: str
            required: true
          active_thread_percentage:
            description: Its thread percentage (0 < x <= 100). Not given - the resource's.
            type: raw
          pinned_device_mem_limit:
            description: Its pinned device memory limit, one size for every GPU of the resource (V(4G), V(512M)). Not
              given - the resource's.
            type: raw
          client_priority:
            description: V(normal) or V(below_normal). Not given - the resource's.
            type: str
  protocol:
    description:
      - The MPS protocol of every resource of O(resources) that gives none of its own (O(resources[].protocol)); not
        given - V(legacy).
      - V(legacy) manages the resource's daemon with the legacy control protocol, as always.
      - V(3) runs it with MPS v3 (driver r615, CUDA 13.4, and later) - C(-d -p 3 -a <config_dir>/<name>.mps.toml), the
        file rendered from this entry - with one named server (O(resources[].server)) on the resource's GPUs and
        the namespaces of O(resources[].namespaces). Clients are given C(<pipe>/<server>) (C(env) of RV(resources)),
        never C(<pipe>) itself, whose main socket routes a client to an automatic C(uid_<uid>) server outside the
        resource's limits.
      - The resource's C(active_thread_percentage), C(pinned_device_mem_limit) (one size for all its GPUs) and
        C(client_priority) (or C(replicas)) are the limits of the server's C(default) namespace and of every
        namespace that gives none of its own.
      - Under systemd the unit starts it from its environment file (C(MPS_DAEMON_ARGS)) and stops it with C(-q); the
        health check (and O(metrics_dir)'s metrics) ask whether the daemon lists the server, and read its default
        namespace's limits and its clients; O(slurm_hook)'s TaskProlog points jobs at the server.
      - Refused where the binary has no MPS v3 (the help of C(-p 3 -h) lists no C(server) module), with MIG devices
        and with C(sm_partitions).
      - Everything v3 is inferred from NVIDIA's documentation; no r615 binary has run it (see the troubleshooting guide).
    type: str
    choices: [legacy, '3']
    version_added: 0.2.0
  prune:
    description: Remove the resources under O(root) (or with files in O(config_dir)) that O(resources) does not list.
    type: bool
    default: true
  ready:
    description: Manage C(<root>/.ready) (and the health timer that keeps it current between runs).
    type: bool
    default: true
  require_gpu:
    description:
      - Fail a host without a usable NVIDIA GPU instead of leaving it alone with RV(managed=false).
      - A host whose driver upgrade is pending (NVML answers "Driver/library version mismatch") is a GPU host to act on,
        not one without a GPU - it fails whatever this says, and nothing is changed on it.
    type: bool
    default: false
  shm_size:
    description: The tmpfs size - a percentage of RAM (V(50%)) or a size (V(16G)).
    type: str
    default: 50%
  shm_persist:
    description: How the tmpfs comes back at boot - V(auto) (a mount unit under systemd, else an fstab line), V(systemd), V(fstab), V(none).
    type: str
    choices: [auto, systemd, fstab, none]
    default: auto
  orphans:
    description:
      - An orphaned daemon is an MPS control daemon of O(root) that its pipe directory no longer leads to - the directory
        deleted under the running daemon (a C(/run) cleaner, a hand-made C(rm -rf)), or a second daemon started there.
        C(quit) cannot reach it and it still serves its GPUs; a second daemon on them would break both.
      - V(refuse) fails the run while the root has an orphan - whether or not a listed resource needs its GPUs, check mode
        too - naming every orphan with its pid and pipe directory; nothing is changed, but the ready mark is withdrawn
        when a listed resource no longer answers. V(stop) stops every orphan of the root first, as any resource is
        stopped - SIGTERM, SIGKILL after O(stop_timeout) (one with MPS servers only with O(busy=terminate), since their
        clients cannot be listed), then compute mode DEFAULT for its GPUs that no other daemon serves and no listed
        resource keeps - then provisions as asked.
    type: str
    choices: [refuse, stop]
    default: refuse
  health_check:
    description: Where systemd supervises the daemons, a timer that re-checks every daemon and writes or removes C(<root>/.ready).
    type: bool
    default: true
  health_interval:
    description: Seconds between two health checks (at least 5).
    type: int
    default: 30
  health_timeout:
    description: Seconds one daemon may take to answer the health check.
    type: int
    default: 10
  logrotate:
    description: Write a logrotate drop-in (C(copytruncate)) for the daemons' logs where O(logrotate_dir) exists.
    type: bool
    default: true
  logrotate_dir:
    description: The logrotate drop-in directory, an absolute path.
    type: path
    default: /etc/logrotate.d
  logrotate_size:
    description: Rotate a log past this size (logrotate's form, V(50M)).
    type: str
    default: 50M
  logrotate_rotate:
    description: Old logs kept.
    type: int
    default: 7
  local_facts:
    description: Write C(gpufleet_mps.fact) into O(local_facts_dir) (C(ansible_local.gpufleet_mps) of later plays).
    type: bool
    default: true
  local_facts_dir:
    description: Directory of the local facts; an absolute path (a relative one is refused).
    type: path
    default: /etc/ansible/facts.d
  metrics_dir:
    description:
      - Where the health check (O(health_check), under systemd) also writes C(gpufleet_mps.prom) for node_exporter's
        textfile collector (C(--collector.textfile.directory)) on every check - per resource whether its daemon runs and
        answers, its servers and clients, its limits, and when the check ran, how long it took and why a daemon failed
        it. Debian's prometheus-node-exporter reads C(/var/lib/prometheus/node-exporter).
      - Empty - no metrics; a file an earlier run's health check wrote there is removed.
      - An absolute path. Refused where no health check would write it - O(supervisor=none), O(health_check=false),
        O(ready=false), or O(supervisor=auto) on a host without systemd.
    type: path
    default: ''
    version_added: 0.2.0
  slurm_hook:
    description:
      - Write Slurm's side of MPS from the resource list - a C(TaskProlog) script (O(slurm_task_prolog)) and a
        C(gres.conf) (O(slurm_gres_conf)) - so that a C(--gres=mps:N) job is pointed at the daemon of the GPU Slurm gave
        it. Point C(TaskProlog=) in C(slurm.conf) at the script; C(slurm.conf) also needs C(GresTypes=gpu,mps) and the
        node's C(Gres=), which the C(gres.conf) header gives. Slurm reads both when its daemons start or reconfigure.
      - The prolog, run as the job's user before each task of an MPS job (C(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) set by
        Slurm), finds the job's GPU in C(SLURM_STEP_GPUS) (or C(SLURM_JOB_GPUS)) and exports the pipe and log directories
        of the daemon serving it and C(CUDA_VISIBLE_DEVICES) as that daemon numbers its GPUs; Slurm's thread percentage
        stays. A job on a GPU no daemon serves, or whose daemon is not running, fails with a line naming the GPU.
      - Resources on MIG devices are left out (Slurm describes MIG devices itself).
      - V(false), and O(state=absent), remove the two files - only where this collection wrote them (their header says
        so); an administrator's own C(gres.conf) is never touched.
      - See the schedulers guide for what a real Slurm 22.05 did with it.
    type: bool
    default: false
    version_added: 0.2.0
  slurm_task_prolog:
    description: Where O(slurm_hook) writes the TaskProlog script (mode 0755), an absolute path; empty - none.
    type: path
    default: /etc/slurm/gpufleet-mps-task-prolog.sh
    version_added: 0.2.0
  slurm_gres_conf:
    description:
      - Where O(slurm_hook) writes C(gres.conf) (mode 0644); empty - none (for a site that writes its own, from the local
        facts).
    type: path
    default: /etc/slurm/gres.conf
    version_added: 0.2.0
  slurm_device_dir:
    description: The directory of the GPUs' device files in C(gres.conf) (C(File=<dir>/nvidia<index>)).
    type: path
    default: /dev
    version_added: 0.2.0
  slurm_memory_share:
    description:
      - The prolog also exports C(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), the job's share of its GPU's memory in the same
        proportion as its thread share (C(--gres=mps:25) - a quarter), rounded down to whole MiB.
    type: bool
    default: false
    version_added: 0.2.0
requirements:
  - nvidia-ml-py >= 12 (C(import pynvml)) on the managed node
  - the NVIDIA driver (C(libnvidia-ml.so.1) and C(nvidia-cuda-mps-control))
seealso:
  - module: gpufleet.mps.mps_daemon
  - module: gpufleet.mps.mps_limits
  - module: gpufleet.mps.mps_info
author:
  - gpufleet.mps developers (@gpufleet)
'''

EXAMPLES = r'''
- name: Two resources on an 8-GPU host, inference shared between 4 clients per GPU
  gpufleet.mps.mps_host:
    resources:
      - name: train
        devices: [0, 1, 2, 3]
      - name: infer
        devices: [4, 5, 6, 7]
        replicas: {"NVIDIA H100*": 4, default: 2}

- name: What a change would do, without doing it
  gpufleet.mps.mps_host:
    resources:
      - name: train
        devices: [0, 1]
  check_mode: true
  diff: true
  register: plan

- name: Tear everything down, ending connected clients
  gpufleet.mps.mps_host:
    state: absent
    busy: terminate
'''

RETURN = r'''
managed:
  description: Whether the host has a usable NVIDIA GPU and its MPS was managed; false leaves the host alone (see RV(msg)).
  returned: always
  type: bool
  sample: true
msg:
  description: What the run did, in one line.
  returned: always
  type: str
  sample: "2 resource(s), nothing to change"
resources:
  description:
    - Every listed resource after the run - C(name), C(pid), C(running), C(healthy), C(devices) (index, uuid, name,
      ordinal; a MIG device also C(mig) and C(profile), its index being its GPU's), C(multiuser), C(replicas), C(env)
      (what a client sets), C(container) (the container view), C(limits) (C(persisted), the control C(commands) sent
      and the C(pending) servers that keep older limits), C(restarted),
      C(changed), C(actions), C(started_at), C(diff), C(notes) (what was not done as asked and why - a compute mode on
      a MIG device) and C(gone) (recorded devices NVML no longer reports - a MIG instance destroyed or re-created -
      each with what to do), C(protocol) (V(legacy) or V(3)) and C(v3) (null for a legacy resource; else C(server),
      C(uid), C(pipe_directory), C(default) and C(namespaces), each namespace with its limits and its C(pipe_directory)).
  returned: always
  type: list
  elements: dict
  sample: [{name: train, pid: 4182, running: true, healthy: true, restarted: false, changed: false}]
removed:
  description: The resources removed (or, in check mode, to be removed).
  returned: always
  type: list
  elements: str
  sample: [tune]
ready:
  description: Whether every listed daemon answers (C(<root>/.ready)); null with O(state=absent) or on an unmanaged host.
  returned: always
  type: bool
  sample: true
gpus:
  description: The host's GPUs, as M(gpufleet.mps.mps_info) returns them.
  returned: always
  type: list
  elements: dict
nvml:
  description: NVML's availability, error, driver and CUDA versions, and whether nvidia-ml-py imports.
  returned: always
  type: dict
local_facts:
  description: The local facts written (C(ansible_local.gpufleet_mps)); null when none are written.
  returned: always
  type: dict
ui_processes:
  description: Control UI processes this run started (one per running daemon on a run that changes nothing).
  returned: always
  type: int
  sample: 2
actions:
  description: What the run did, or in check mode would do, in order, each prefixed by its resource (or C(shm), C(host)).
  returned: always
  type: list
  elements: str
  sample: ['tune: stop the MPS control daemon', 'train: start the MPS control daemon']
changes:
  description:
    - The plan as typed changes, in order - in check mode what a real run would do, in a real run what it did (each
      change listed once its side effect returned). The same request on the same host gives the same list either way.
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: What changes - C(stop), C(start), C(restart), C(limits), C(compute_mode), C(write), C(remove), C(unit),
        C(wait), C(ready), C(mount), C(mode), C(selinux), C(reload) or C(other).
      type: str
    resource:
      description: The resource it belongs to, or C(host), or C(shm).
      type: str
    action:
      description: The change, as RV(actions) names it.
      type: str
    reason:
      description: Why, where the action alone does not say.
      type: str
    ends_clients:
      description: Whether it ends connected clients (a stop under O(busy=terminate)).
      type: bool
  sample: [{kind: stop, resource: tune, action: stop the MPS control daemon (pid 4242), reason: '', ends_clients: false}]
'''

import sys

# First of the module_utils: importing it installs the host's bytecode cache, so that the others' code is not compiled
# from the payload on every run.
from ansible_collections.gpufleet.mps.plugins.module_utils._bytecode import STATUS as BYTECODE
from ansible_collections.gpufleet.mps.plugins.module_utils._errors import DriverUpgradePendingError, MpsError, NvmlError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import ENUMERATION_WARNING, Nvml
from ansible_collections.gpufleet.mps.plugins.module_utils._host.manager import HostManager
from ansible_collections.gpufleet.mps.plugins.module_utils._module import control_binary, run_module
from ansible_collections.gpufleet.mps.plugins.module_utils._options import DAEMON_OPTIONS, resources_option, spec


def argument_spec():
    return spec(
        'root', 'config_dir', 'control_binary', 'running_servers', 'protocol', *DAEMON_OPTIONS,
        state=dict(type='str', choices=['present', 'absent'], default='present'),
        resources=resources_option(),
        prune=dict(type='bool', default=True),
        orphans=dict(type='str', choices=['refuse', 'stop'], default='refuse'),
        ready=dict(type='bool', default=True),
        require_gpu=dict(type='bool', default=False),
        shm_size=dict(type='str', default='50%'),
        shm_persist=dict(type='str', choices=['auto', 'systemd', 'fstab', 'none'], default='auto'),
        health_check=dict(type='bool', default=True),
        health_interval=dict(type='int', default=30),
        health_timeout=dict(type='int', default=10),
        logrotate=dict(type='bool', default=True),
        logrotate_dir=dict(type='path', default='/etc/logrotate.d'),
        logrotate_size=dict(type='str', default='50M'),
        logrotate_rotate=dict(type='int', default=7),
        local_facts=dict(type='bool', default=True),
        local_facts_dir=dict(type='path', default='/etc/ansible/facts.d'),
        metrics_dir=dict(type='path', default=''),
        slurm_hook=dict(type='bool', default=False),
        slurm_task_prolog=dict(type='path', default='/etc/slurm/gpufleet-mps-task-prolog.sh'),
        slurm_gres_conf=dict(type='path', default='/etc/slurm/gres.conf'),
        slurm_device_dir=dict(type='path', default='/dev'),
        slurm_memory_share=dict(type='bool', default=False),
    )


def run(module):
    params = module.params
    nvml = Nvml()
    info = {'available': False, 'error': None, 'driver_version': None, 'cuda_driver_version': None,
            'python_binding': nvml.has_binding}
    result = dict(changed=False, managed=False, resources=[], removed=[], ready=None, gpus=[], nvml=info, local_facts=None,
                  ui_processes=0, actions=[], changes=[])
    if not nvml.has_binding:
        raise MpsError('%s cannot import nvidia-ml-py (pynvml): that is a broken interpreter, not a host without a GPU; run '
                       'the module with an interpreter that has nvidia-ml-py (the fleet role\'s mps_python, or its venv)' %
                       sys.executable, nvml=info)
    # One NVML session for the whole run: the facts, the plan and every compute mode change.
    try:
        nvml.__enter__()
        info.update(driver_version=nvml.driver_version(), cuda_driver_version=nvml.cuda_driver_version())
        gpus = nvml.gpus()
        info['available'] = True
    except NvmlError as exc:
        nvml.__exit__(None, None, None)
        info['error'] = exc.msg
        if isinstance(exc, DriverUpgradePendingError):
            # a GPU host whose driver is half upgraded, not a host without a GPU: failed, whatever require_gpu says
            info['driver_upgrade_pending'] = True
            raise MpsError(exc.msg, nvml=info) from exc
        gpus = []
    try:
        if nvml.enumeration_var_was_set:
            module.warn(ENUMERATION_WARNING)
        result['gpus'] = [gpu.facts() for gpu in gpus]
        if not gpus:
            why = 'this host has no usable NVIDIA GPU (%s)' % (info['error'] or 'NVML reports no GPUs')
            if params['require_gpu']:
                raise MpsError('%s and require_gpu is true' % why, nvml=info)
            result['msg'] = why + ': MPS is not managed here (require_gpu=true fails such a host instead)'
            module.warn(result['msg'])  # said where a person looks, without a task of the role's own for it
            return result
        outcome = HostManager(params, nvml, control_binary, check_mode=module.check_mode).ensure(gpus)
    finally:
        nvml.__exit__(None, None, None)
    for warning in outcome.warnings:
        module.warn(warning)
    if BYTECODE['refused']:
        module.warn('the bytecode cache was not used: %s; the module compiled its source as it does without one (remove '
                    'the directory, and the next run makes it anew)' % BYTECODE['refused'])
    changed = [res['name'] for res in outcome.resources if res['changed']]
    result.update(
        changed=outcome.changed, managed=True, resources=outcome.resources, removed=outcome.removed, ready=outcome.ready,
        local_facts=outcome.facts, ui_processes=outcome.ui_processes, actions=list(outcome.actions),
        changes=[change.as_dict() for change in (outcome.changes if module.check_mode else outcome.executed)],
        msg='%d resource(s)%s%s%s' % (
            len(outcome.resources),
            ', changed: %s' % ', '.join(changed) if changed else '',
            ', removed: %s' % ', '.join(outcome.removed) if outcome.removed else '',
            '' if outcome.changed else ', nothing to change'))
    if module._diff:
        result['diff'] = {'before': {res['name']: res['diff']['before'] for res in outcome.resources},
                          'after': {res['name']: res['diff']['after'] for res in outcome.resources}}
        for name in outcome.removed:
            result['diff']['before'].setdefault(name, {'state': 'present'})
            result['diff']['after'][name] = {'state': 'absent'}
    return result


def main():
    run_module(argument_spec(), run)


if __name__ == '__main__':
    main()
