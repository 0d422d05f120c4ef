# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """The one description of each option more than one module takes (their types, defaults and choices are
    ``plugins/module_utils/_options.py``'s; tests/unit/plugins/module_utils/test_options.py holds the two together and
    fails when a module describes a shared option itself). A module takes a group with
    ``extends_documentation_fragment: gpufleet.mps._common.<group>``."""

    # root, config_dir, control_binary: every module that talks to daemons (mps_daemon, mps_limits, mps_host, mps_info).
    DOCUMENTATION = r'''
options:
  config_dir:
    description:
      - Absolute directory for what must survive a reboot (C(/run) does not) - the daemon's systemd environment
        file and the persisted limits, one set of files per resource, named after the systemd-escaped resource name.
    type: path
    default: /etc/gpufleet-mps
  control_binary:
    description:
      - Absolute path of C(nvidia-cuda-mps-control). Found on E(PATH) when not given.
    type: path
requirements:
  - nvidia-ml-py >= 12 (C(import pynvml)) on the managed node
  - the NVIDIA driver (C(libnvidia-ml.so.1) and C(nvidia-cuda-mps-control))
'''

    ROOT = r'''
options:
  root:
    description:
      - Absolute directory under which every resource has its directories, laid out like NVIDIA's Kubernetes
        device plugin, so tools written for it find the daemons - C(<root>/<name>/pipe), C(<root>/<name>/log),
        C(<root>/<name>/.started), and the shared tmpfs at C(<root>/shm).
      - C(<root>/<name>/pipe) must be at most 87 bytes long; a longer one is refused before anything is done, because
        NVIDIA's control daemon fails silently there (no log line, no socket; observed on driver 535).
    type: path
    default: /run/nvidia/mps
'''

    NAME = r'''
options:
  name:
    description:
      - The resource, a named group of GPUs with its own MPS control daemon.
      - One or two segments separated by C(/), each of letters, digits, C(.), C(_) and C(-), never C(.) or C(..),
        for example V(nvidia.com/gpu) (the device plugin's default) or V(train).
      - Its pipe directory is C(<root>/<name>/pipe) and its log directory C(<root>/<name>/log).
    type: str
    required: true
'''

    # How a resource's daemon runs: mps_daemon for one resource, mps_host for every resource of the host.
    DAEMON = r'''
options:
  compute_mode:
    description:
      - Compute mode set on a resource's GPUs before its daemon starts. NVIDIA recommends V(exclusive_process) under
        MPS, so that only the MPS server holds the GPU. V(unchanged) leaves the mode alone, also on stop.
      - The compute mode resets to DEFAULT at reboot; a run finds and repairs that without restarting the daemon.
      - NVML has no compute mode for a MIG device (nor for a GPU in MIG mode); on a MIG device it is not applied, which
        the result and the diff say - the task does not fail.
    type: str
    choices: [exclusive_process, default, unchanged]
    default: exclusive_process
  supervisor:
    description:
      - Who keeps a daemon running. V(systemd) runs it as C(gpufleet-mps@<instance>.service), which sets the compute
        mode before start, replays the persisted limits after every start, stops it with C(quit -t) and restarts it on
        failure. V(none) starts it directly (containers, CI, hosts without systemd).
      - V(auto) is V(systemd) when systemd is PID 1, else V(none).
    type: str
    choices: [auto, systemd, none]
    default: auto
  start_timeout:
    description:
      - Seconds a daemon may take to answer after its start, and any control UI answer.
    type: int
    default: 30
  stop_timeout:
    description:
      - Seconds passed to C(quit -t) at a stop - after them the daemon forcibly ends the servers and clients still
        running.
    type: int
    default: 30
  busy:
    description:
      - What to do when a daemon must stop - a restart for a change (its GPUs, C(multiuser), C(shm), the supervisor,
        the values its systemd environment file starts it with, a restart asked for), a stop or a removal - while clients
        are connected to its servers. The clients are read from the daemon (C(get_server_list), C(get_client_list)), in
        the same run, before anything is changed.
      - V(refuse) fails the task before anything is done, naming each client's pid, uid and server, and leaves the
        daemon and its clients alone. Check mode fails the same way, so a preview shows which jobs a change would end.
      - V(wait) waits up to O(busy_timeout) seconds for the clients to leave, then goes on; if they have not left, the
        task fails and nothing is stopped.
      - V(terminate) goes on at once; C(quit -t) O(stop_timeout) then ends the servers of the clients still connected,
        so their GPU work is gone while their processes live on (as a real r580 driver did on an H200). The clients are
        named in a warning and in the result.
      - A daemon with no client is stopped or restarted at once, whatever this option says.
    type: str
    choices: [refuse, wait, terminate]
    default: refuse
    version_added: 0.2.0
  busy_timeout:
    description:
      - With O(busy=wait), how many seconds to wait for the connected clients to leave.
    type: int
    default: 600
    version_added: 0.2.0
  log_mode:
    description:
      - Mode of a resource's log directory C(<root>/<name>/log). C(control.log) records every client's pid and user and
        every control command, so by default only root can read it.
      - An octal string with all owner bits and no write bit for group and others - V(0700), V(0750) (root and the
        directory's group) or V(0755) (every user, as NVIDIA's device plugin has it). An existing directory is changed
        in place, without a restart.
    type: raw
    default: '0700'
    version_added: 0.2.0
  shm:
    description:
      - Run a daemon - and so every MPS server it starts - with C(<root>/shm) as its C(/dev/shm), in a private mount
        namespace (under systemd through a per-instance drop-in with C(BindPaths=), else with C(unshare --mount)). An MPS
        client and its server share memory through C(/dev/shm), so container clients then mount C(<root>/shm) as their
        C(/dev/shm), as with NVIDIA's device plugin. M(gpufleet.mps.mps_host) mounts the tmpfs itself
        (O(gpufleet.mps.mps_host#module:shm_size)); with M(gpufleet.mps.mps_daemon) mount it first with
        M(gpufleet.mps.mps_shm).
      - With V(false) a daemon uses the host's C(/dev/shm); a container client then needs the host's too (C(--ipc=host)
        or a bind mount of C(/dev/shm)).
      - Changing it restarts the daemon; so does finding C(<root>/shm) mounted anew (unmounted and mounted again, not
        resized) under a running daemon that uses it.
    type: bool
    default: false
    version_added: 0.2.0
  foreground:
    description:
      - Under systemd, run a control daemon in the foreground (C(nvidia-cuda-mps-control -f), C(Type=exec) through a
        per-instance drop-in) instead of detached (C(-d), C(Type=forking)). What it logs then goes to its stdout, which
        systemd sends to the journal (C(journalctl -u gpufleet-mps@<instance>)); systemd watches the daemon process
        itself, without a pid file. The limits are replayed once the daemon answers, as with C(-d).
      - Refused when the daemons run without systemd (a daemon the module starts itself must detach). Changing it
        restarts the daemon.
    type: bool
    default: false
    version_added: 0.2.0
  unit_before:
    description:
      - Under systemd, units a daemon's unit is ordered before, for example C(slurmd.service), C(kubelet.service) or
        C(ecs.service). A per-instance drop-in (C(gpufleet-order.conf)) gets C(Before=) with them, so that when both
        start (at boot), they start once the daemon answers (C(Type=forking) returns then).
      - Ordering only - it pulls none of them in, does not stop them when the daemon fails, and a unit that is not
        installed is ignored. Whole names with their type; each once; not this collection's own units. Changing it
        rewrites the drop-in and reloads systemd, without a restart of the daemon.
      - Refused when the daemons run without systemd, since nothing orders a daemon the module starts itself.
    type: list
    elements: str
    default: []
    version_added: 0.2.0
  unit_after:
    description:
      - Under systemd, units a daemon's unit is ordered after (C(After=) in the same drop-in), for example a driver or
        storage unit it needs first. The unit already starts after C(nvidia-persistenced.service).
      - As with O(unit_before) - ordering only, whole names, refused without systemd; a unit may not be in both.
    type: list
    elements: str
    default: []
    version_added: 0.2.0
  remove_logs:
    description:
      - At a removal (C(state=absent)), also remove a daemon's C(control.log) and C(server.log), and its log directory
        when it is empty then (and, with M(gpufleet.mps.mps_host), the root when nothing else is left in it).
    type: bool
    default: false
    version_added: 0.2.0
'''

    CONTAINER_ROOT = r'''
options:
  container_root:
    description:
      - The directory under which containers see the resources' pipe directories (the device plugin's
        C(ContainerRoot)), used only to compute the C(container) view in the result.
    type: path
    default: /mps
    version_added: 0.2.0
'''

    SELINUX = r'''
options:
  selinux_type:
    description:
      - Where SELinux is enabled, the SELinux type the pipe directories and the shared tmpfs at C(<root>/shm) get (only
        the type of their context changes), so that MPS clients in containers may connect on an enforcing host -
        NVIDIA's device plugin labels them the same. Sockets a daemon creates there inherit it. Repaired when it drifted
        (a C(restorecon)), without a restart. Under systemd the unit sets it too (C(chcon -t)) each time it creates the
        directory, and labels the tmpfs again at boot, which comes back unlabelled.
      - An empty string leaves SELinux labels alone. A host without SELinux is never touched.
    type: str
    default: container_file_t
    version_added: 0.2.0
'''

    RUNNING_SERVERS = r'''
options:
  running_servers:
    description:
      - MPS servers already running keep the limits they started with, and the clients that connect to them later get
        those, not new defaults - even an idle server that has outlived its clients.
      - V(ignore) lists such servers in the result (C(pending)) and warns. V(update) sets their own limits too, which
        reaches the clients they get from then on; a running client's limits never change.
    type: str
    choices: [ignore, update]
    default: ignore
'''
