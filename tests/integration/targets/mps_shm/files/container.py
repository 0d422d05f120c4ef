# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A container without a container engine: run a program in a root that has only what a view mounts.

    python3 container.py VIEW.json UID PROGRAM [ARG ...]

In a private mount namespace (unshare), builds a new root on a tmpfs with /usr and /etc bound
read-only, /proc, /dev/null, and exactly the bind mounts listed in the view's ``mounts`` (``source``
on the host -> ``target`` in the container); copies PROGRAM to /opt; then chroots there and runs it
with /usr/bin/python3 as UID (real, not user-namespaced, so SO_PEERCRED shows that uid), with the
view's ``env`` as its environment. Nothing else of the host is visible: no /run, no /tmp, no host
/dev/shm unless the view binds it. The namespace, and every mount in it, goes when the program exits.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run(argv):
    subprocess.run(argv, check=True)


def inside(view_path, uid, program, args):
    with open(view_path, encoding='utf-8') as handle:
        view = json.load(handle)
    root = tempfile.mkdtemp(prefix='ctr.', dir='/tmp')
    run(['mount', '-t', 'tmpfs', '-o', 'mode=0755', 'ctr', root])
    for name in ('usr', 'etc', 'proc', 'dev', 'opt', 'tmp'):
        os.mkdir(os.path.join(root, name), 0o755)
    os.chmod(os.path.join(root, 'tmp'), 0o1777)
    for name in ('usr', 'etc'):
        run(['mount', '--bind', '/' + name, os.path.join(root, name)])
        run(['mount', '-o', 'remount,bind,ro', os.path.join(root, name)])
    for name in ('bin', 'lib', 'lib64', 'sbin'):
        if os.path.isdir('/usr/' + name):
            os.symlink('usr/' + name, os.path.join(root, name))
    run(['mount', '-t', 'proc', 'proc', os.path.join(root, 'proc')])
    open(os.path.join(root, 'dev', 'null'), 'w', encoding='utf-8').close()
    run(['mount', '--bind', '/dev/null', os.path.join(root, 'dev', 'null')])
    for mount in view['mounts']:
        target = os.path.join(root, mount['target'].lstrip('/'))
        os.makedirs(target, 0o755, exist_ok=True)
        run(['mount', '--bind', mount['source'], target])
    shutil.copy(program, os.path.join(root, 'opt', os.path.basename(program)))
    env = {'PATH': '/usr/bin:/bin', 'HOME': '/tmp'}
    env.update(view.get('env') or {})
    env.update({key[len('CTR_'):]: value for key, value in os.environ.items() if key.startswith('CTR_')})
    argv = [shutil.which('chroot') or '/usr/sbin/chroot', '--userspec=%d:%d' % (uid, uid), root, '/usr/bin/python3', '/opt/' + os.path.basename(program)] + args
    return subprocess.run(argv, env=env, check=False).returncode


def main():
    if len(sys.argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    if os.environ.get('_CONTAINER_PY_INSIDE') != '1':
        env = dict(os.environ, _CONTAINER_PY_INSIDE='1')
        return subprocess.run(['unshare', '--mount', '--propagation', 'private', '--', sys.executable] + sys.argv,
                              env=env, check=False).returncode
    return inside(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:])


if __name__ == '__main__':
    sys.exit(main())
